"""Trace loading: the bundled trace parses, broken rows name file, line and field."""

import pytest

from gpufleet.simulator.traces import trace


def test_bundled_default_trace_loads():
    pods = trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods
    nodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    assert len(pods) == 8152
    assert len(nodes) == 1213
    assert sum(len(n.gpus) for n in nodes) == 6212


def test_broken_row_names_file_line_and_field(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nok,1000,1024,1,500\nbad,abc,1024,1,500\n")
    with pytest.raises(trace.TraceError) as exc:
        trace.load_pods(p)
    msg = str(exc.value)
    assert "pods.csv" in msg and ":3" in msg and "cpu_milli" in msg


def test_skip_bad_rows_counts(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nok,1000,1024,1,500\nbad,1000,1024,1,1500\n")
    t = trace.load_pods(p, skip_bad_rows=True)
    assert [x.name for x in t.pods] == ["ok"]
    assert len(t.skipped_rows) == 1 and "gpu_milli" in t.skipped_rows[0]


def test_total_gpu_milli_is_the_requests():
    pods = trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods
    assert {p.num_gpu for p in pods} >= {0, 1, 2, 8}
    for p in pods:
        assert p.total_gpu_milli == p.request().total_gpu_milli


def test_bound_shapes_are_the_requests():
    from collections import Counter

    from gpufleet.simulator.bounds.bound import _shapes

    pods = trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods
    for cpu_only in (False, True):
        want: Counter = Counter()
        for p in pods:
            r = p.request()
            if r.gpu_count or cpu_only:
                want[(r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_models_allow)] += 1
        got = _shapes(pods, cpu_only)
        assert list(got.items()) == list(want.items())


def test_a_renamed_request_is_the_rows_request_under_that_name():
    from gpufleet.simulator.experiments.packing import _named

    for p in trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods[:200]:
        r = _named(p.request(), p.name + "-tuned-7")
        want = p.request(p.name + "-tuned-7")
        assert r == want and r.__dict__ == want.__dict__ and hash(r) == hash(want) and r.key == want.key
        assert _named(p.request(), p.name) == p.request()
