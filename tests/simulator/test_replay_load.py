"""Replay under load: load scaling, busy-window metrics, the shared queue order, preemption,
team queues from a file, what-ifs, the capacity search and the 2025 DLRM trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpufleet.cli.main import main
from gpufleet.engine import schedqueue
from gpufleet.engine.model import PodRequest
from gpufleet.simulator.traces import trace
from gpufleet.simulator.traces import trace2025
from gpufleet.simulator.experiments import whatif
from gpufleet.simulator.experiments.replay import request_class, run_replay
from gpufleet.simulator.traces.workload import workload_from_trace

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i:02d},32000,131072,{g},{m}\n" for i, (g, m) in enumerate([(8, "V100M32")] * 2 + [(2, "T4")] * 4))
SHAPES = [(4000, 1, 500), (8000, 1, 1000), (2000, 1, 250), (16000, 2, 1000), (6000, 0, 0), (8000, 4, 1000)]


def pods_csv(n: int = 200, run_s: int = 1800, qos=("LS", "BE")) -> str:
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"]
    for i in range(n):
        cpu, g, m = SHAPES[i % len(SHAPES)]
        spec = "T4" if i % 13 == 0 and g == 1 else ""
        rows.append(f"p{i:04d},{cpu},8192,{g},{m},{spec},{qos[i % len(qos)]},Running,{i * 60},{i * 60 + run_s + 30 * (i % 7)},{i * 60}")
    return "\n".join(rows) + "\n"


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    return tmp_path


def _load(tiny):
    return trace.load_nodes(tiny / "nodes.csv"), trace.load_pods(tiny / "pods.csv").pods


def test_load_scaling_hits_the_target_and_keeps_run_times(tiny):
    nodes, pods = _load(tiny)
    wl = workload_from_trace(pods)
    gpus = sum(len(n.gpus) for n in nodes)
    for x in (0.5, 1.0, 1.5):
        scaled, _ = wl.at_load(x, gpus)
        assert scaled.offered_load(gpus) == pytest.approx(x, rel=1e-3)
        assert np.array_equal(scaled.run_s[: len(pods)], wl.run_s)  # run times kept
        assert np.array_equal(scaled.gpu, [r.total_gpu_milli / 1000 for r in scaled.requests])  # carried, not recomputed
    k = wl.scaled(2.0)
    assert k.requests is wl.requests and k.arrival_s is not wl.arrival_s and np.isnan(wl.arrival_s).sum() == np.isnan(k.arrival_s).sum()
    lo, _ = wl.at_load(0.5, gpus, copies=3)
    hi, _ = wl.at_load(1.0, gpus, copies=3)
    assert np.nanmax(lo.arrival_s) > np.nanmax(hi.arrival_s)  # higher load: arrivals closer together


def test_pacing_is_the_bisection_over_scaled_workloads(tiny):
    """``at_load`` and ``copies_for`` compute their offered loads without sorting the arrivals again or making every
    pass's pods: the same numbers, to the bit, as scaling and tiling the workload itself."""
    from dataclasses import replace

    nodes, pods = _load(tiny)
    wl = workload_from_trace(pods)
    gpus = sum(len(n.gpus) for n in nodes)
    for x in (0.3, 1.0, 2.5):
        n = next(n for n in range(1, 33) if wl.tiled(n).max_load(gpus) >= 1.2 * x)
        assert wl.copies_for(x, gpus) == n
    for copies in (1, 3):
        base = wl.tiled(copies)
        assert base.requests == [*wl.requests, *(replace(wl.requests[i], name=f"{wl.requests[i].name}~{j}")
                                                 for j in range(1, copies) for i in range(len(wl.requests)))]
        lo, hi = -30.0, 30.0
        for _ in range(80):
            mid = (lo + hi) / 2
            if base.scaled(float(np.exp(mid))).offered_load(gpus) > 0.9:
                lo = mid
            else:
                hi = mid
        paced, k = wl.at_load(0.9, gpus, copies=copies)
        assert k == float(np.exp((lo + hi) / 2))
        assert paced.arrival_s.tobytes() == base.scaled(k).arrival_s.tobytes() and paced.requests == base.requests


def test_a_sweep_prepares_what_its_runs_share(tiny):
    """``replay.prepare`` (the sweep's parent, before its workers fork) paces each load once, over passes tiled once:
    a run finds the very workload made, and it is ``at_load``'s, to the bit."""
    from gpufleet.simulator.experiments.replay import paced, prepare

    nodes, pods = _load(tiny)
    wl = workload_from_trace(pods)
    gpus = float(sum(len(n.gpus) for n in nodes))
    prepare(wl, [0.5, 1.0], gpus, 0.1, 3)
    (lo, k_lo), (hi, _) = paced(wl, 0.5, gpus, 0.1, 3), paced(wl, 1.0, gpus, 0.1, 3)
    assert paced(wl, 0.5, gpus, 0.1, 3)[0] is lo and lo.requests is hi.requests  # made once, shared by the loads
    ref, k = wl.at_load(0.5, gpus, 0.1, 3)
    assert k_lo == k and lo.arrival_s.tobytes() == ref.arrival_s.tobytes() and lo.requests == ref.requests
    assert lo.copies == ref.copies == 3
    assert run_replay(nodes, wl, "bestfit", load=0.5, copies=3).to_json() | {"wall_s": 0} == \
        run_replay(nodes, pods, "bestfit", load=0.5, copies=3).to_json() | {"wall_s": 0}


def test_a_replay_refuses_pods_of_one_name(tiny):
    """Names key the pods (their decision groups, counted once per workload, say so): a trace naming two pods alike
    is refused, as the trace's error."""
    nodes, pods = _load(tiny)
    twice = [*pods[:5], pods[0]]
    with pytest.raises(trace.TraceError, match="unique"):
        run_replay(nodes, twice, "bestfit")


def test_fragment_samples_are_all_nodes_worked_out_at_once(tiny, monkeypatch):
    """A sample works out again only the nodes whose version moved since the last one; the curve is, to the bit,
    the one that works out every node at every sample."""
    from gpufleet.policies.paper.workload import frag_amount, node_view
    from gpufleet.simulator.experiments import replay_metrics

    nodes, pods = _load(tiny)
    kept = run_replay(nodes, pods, "fgd", load=1.2, copies=2)

    def every_node(rp):
        return frag_amount(*node_view(rp.state, rp.all_nodes), rp.tw, rp.acc)

    monkeypatch.setattr(replay_metrics, "fragment_by_node", every_node)
    full = run_replay(nodes, pods, "fgd", load=1.2, copies=2)
    assert kept.frag_pct == full.frag_pct and len(set(kept.frag_pct)) > 10
    assert kept.mean_frag_pct == full.mean_frag_pct


def test_delay_rises_with_load_and_window_excludes_warmup(tiny):
    nodes, pods = _load(tiny)
    runs = [run_replay(nodes, pods, "bestfit", load=x, copies=3) for x in (0.4, 1.3)]
    low, high = runs
    assert high.queue_delay_s["p99"] > low.queue_delay_s["p99"]
    assert high.mean_gpu_alloc_pct > low.mean_gpu_alloc_pct
    assert low.pods_measured < low.pods_arrived  # warm-up left out
    assert low.busy_window_h[0] > 0
    assert {"shares", "1", "2", "4", "cpu"} <= set(high.delay_by_class) and "1@T4" in high.delay_by_class
    assert high.bounded_slowdown["p99"] >= 1.0 and len(high.frag_pct) == len(high.t_h)
    assert 0 <= high.mean_gpu_alloc_pct <= 100


def test_request_classes():
    assert request_class(PodRequest("a", gpu_count=1, gpu_milli=300)) == "shares"
    assert request_class(PodRequest("a", gpu_count=2, gpu_milli=1000)) == "2"
    assert request_class(PodRequest("a")) == "cpu"


def test_replay_orders_through_the_shared_scheduling_queue(tiny, monkeypatch):
    """With queues the replay's retries (engine.pending) ask engine.schedqueue.order_pending for the order, as the
    live loop does; both run each pod through the one scheduling round (engine.round)."""
    from gpufleet.engine import pending
    from gpufleet.engine import round as round_
    from gpufleet.kube import loop
    from gpufleet.simulator.experiments import replay

    assert loop.order_pending is schedqueue.order_pending and pending.order_pending is schedqueue.order_pending
    assert loop.SchedulingRound is round_.SchedulingRound and replay.SchedulingRound is round_.SchedulingRound
    calls = []
    real = schedqueue.order_pending

    def spy(pods, tree=None, nominated=()):
        calls.append(len(pods))
        return real(pods, tree, nominated)

    monkeypatch.setattr(pending, "order_pending", spy)
    nodes, pods = _load(tiny)
    qf = tiny / "q.yaml"
    qf.write_text(QUEUES)
    from gpufleet.cli.replay_cli import load_queue_file

    wl = workload_from_trace(pods, namespace_of=lambda p: p.qos.lower())
    run_replay(nodes, wl, "bestfit", load=1.3, queues=load_queue_file(str(qf)), copies=2)
    assert calls and max(calls) > 1


def test_order_pending_priority_then_first_come_nominated_first():
    ps = [schedqueue.QueuedPod("a", 0, 1.0), schedqueue.QueuedPod("b", 5, 2.0), schedqueue.QueuedPod("c", 0, 0.5)]
    assert schedqueue.order_pending(ps) == ["b", "c", "a"]
    assert schedqueue.order_pending(ps, nominated={"a"}) == ["a", "b", "c"]
    assert schedqueue.next_backoff_s(None, 1, 60) == 1 and schedqueue.next_backoff_s(40, 1, 60) == 60


def test_high_priority_pods_preempt_in_the_replay(tmp_path):
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,V100M32\n")
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"]
    rows += [f"be{i},1000,1024,1,1000,,BE,Running,{i},{i + 10000},{i}" for i in range(4)]
    rows += [f"ls{i},1000,1024,1,1000,,LS,Running,{100 + i},{200 + i},{100 + i}" for i in range(2)]
    (tmp_path / "pods.csv").write_text("\n".join(rows) + "\n")
    nodes = trace.load_nodes(tmp_path / "nodes.csv")
    pods = trace.load_pods(tmp_path / "pods.csv").pods
    wl = workload_from_trace(pods, priority_of=lambda p: 100 if p.qos == "LS" else 0)
    r = run_replay(nodes, wl, "bestfit", warmup=0.0)
    assert r.preemptions == 2 and r.queue_delay_s["max"] == 0  # the LS pods did not wait
    r2 = run_replay(nodes, wl, "bestfit", warmup=0.0, preemption=False)
    assert r2.preemptions == 0 and r2.queue_delay_s["max"] > 9000  # without preemption they wait for the BE pods


QUEUES = """
apiVersion: gpufleet.io/v1alpha1
kind: Queue
metadata: {name: org}
spec: {}
---
apiVersion: gpufleet.io/v1alpha1
kind: Queue
metadata: {name: online}
spec: {parent: org, namespaces: [ls], quota: {nvidia.com/gpu: "16"}, weight: 2}
---
apiVersion: gpufleet.io/v1alpha1
kind: Queue
metadata: {name: batch}
spec: {parent: org, namespaces: [be], quota: {nvidia.com/gpu: "8"}, borrowingLimit: {nvidia.com/gpu: "4"}}
"""


def test_cli_queues_file_teams_and_reclaims(tiny):
    qf = tiny / "q.yaml"
    qf.write_text(QUEUES)
    out = tiny / "q.json"
    rep = tiny / "q.html"
    assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                 "--policy", "bestfit", "--load", "1.2", "--queues", str(qf), "--jobs", "1", "--json", str(out),
                 "--report", str(rep), "--no-progress"]) == 0
    r = json.loads(out.read_text())["runs"][0]
    assert {"org", "online", "batch"} <= set(r["teams"])
    assert r["teams"]["online"]["quota_gpus"] == 16 and r["teams"]["org"]["quota_gpus"] == 24  # a parent sums its children
    assert r["teams"]["batch"]["delay_s"]["n"] > 0 and len(r["teams"]["online"]["share_pct"]) == len(r["t_h"])
    assert max(r["teams"]["batch"]["borrowed_pct"]) <= 4 / 24 * 100 + 0.01  # its borrowing limit holds
    assert "Team queues" in rep.read_text()


def test_cli_queues_file_errors(tiny, capsys):
    bad = tiny / "bad.yaml"
    bad.write_text("apiVersion: gpufleet.io/v1alpha1\nkind: Queue\nmetadata: {name: a}\nspec: {weight: 0}\n")
    assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                 "--queues", str(bad), "--report", "", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "spec.weight" in err and "Traceback" not in err


def test_cli_load_sweep_what_if_and_report(tiny, capsys):
    out = tiny / "s.json"
    rep = tiny / "s.html"
    assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                 "--policy", "bestfit,fgd", "--load", "0.5,1.2", "--what-if", "+2xV100M32", "--jobs", "1", "--json", str(out),
                 "--report", str(rep), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    keys = {(r["policy"], r["load"], r["what_if"]) for r in doc["runs"]}
    assert keys == {(p, x, w) for p in ("bestfit", "fgd") for x in (0.5, 1.2) for w in ("", "+2xV100M32")}
    more = {r["load"]: r for r in doc["runs"] if r["what_if"] and r["policy"] == "bestfit"}
    less = {r["load"]: r for r in doc["runs"] if not r["what_if"] and r["policy"] == "bestfit"}
    assert more[1.2]["gpus"] == less[1.2]["gpus"] + 16 and more[1.2]["offered_load"] == less[1.2]["offered_load"]
    assert more[1.2]["queue_delay_s"]["p99"] <= less[1.2]["queue_delay_s"]["p99"]
    html = rep.read_text()
    assert "Delay versus load" in html and html.count("<svg") >= 6 and "busy window" in html


def test_sweep_runs_go_out_costliest_first():
    """The sweep of docs/replay.md: every default run (about 7 CPU s each), then fgd (about 5.7), then bestfit (about
    3.2), each policy's highest load first; dealt in that order to two workers that take the next when done, the
    runs' measured costs leave the workers within one short run of each other."""
    from gpufleet.cli.replay_cli import longest_first

    tasks = [{"policy": p, "load": x} for p in ("default", "fgd", "bestfit") for x in (0.6, 0.8, 1.0, 1.2)]
    order = [(tasks[i]["policy"], tasks[i]["load"]) for i in longest_first(tasks)]
    assert order == [(p, x) for p in ("default", "fgd", "bestfit") for x in (1.2, 1.0, 0.8, 0.6)]
    cpu = {"default": 6.9, "fgd": 5.6, "bestfit": 3.2}  # about, per run
    busy = [0.0, 0.0]
    for p, _x in order:
        busy[busy.index(min(busy))] += cpu[p]
    assert abs(busy[0] - busy[1]) <= cpu["bestfit"]
    assert longest_first([{"policy": "random", "load": None}, {"policy": "default", "load": None}]) == [1, 0]


def test_cli_sweep_with_workers_gives_what_one_process_gives(tiny, capsys):
    """--jobs 2 hands the runs out costliest first (``longest_first``): the table and the runs, in their order,
    are what --jobs 1 gives."""
    docs, tables = [], []
    for jobs in ("1", "2"):
        out = tiny / f"w{jobs}.json"
        assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                     "--policy", "bestfit,fgd", "--load", "0.5,1.2", "--jobs", jobs, "--json", str(out), "--report", "",
                     "--no-progress"]) == 0
        tables.append(capsys.readouterr().out)
        doc = json.loads(out.read_text())
        docs.append([{k: v for k, v in r.items() if k != "wall_s"} for r in doc["runs"]])
    assert [(r["policy"], r["load"]) for r in docs[0]] == [("bestfit", 0.5), ("bestfit", 1.2), ("fgd", 0.5), ("fgd", 1.2)]
    assert docs[0] == docs[1]
    strip = [[ln.rsplit(None, 1)[0] if ln[:1].isalpha() else ln for ln in t.splitlines()] for t in tables]  # less wall s
    assert strip[0] == strip[1]


def test_cli_capacity_search(tiny, capsys):
    out = tiny / "c.json"
    assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                 "--policy", "bestfit", "--load", "1.3", "--search-shape", "V100M32", "--target-p99", "60", "--jobs", "1",
                 "--json", str(out), "--report", "", "--no-progress"]) == 0
    s = json.loads(out.read_text())["search"]
    assert "recommendation" in capsys.readouterr().out
    curve = {p["added"]: p["p99_s"] for p in s["curve"]}
    if s["added"]:
        assert curve[s["added"]] <= 60 and curve[s["added"] - 1] > 60 if s["added"] - 1 in curve else True
        assert curve[0] > 60


def test_cli_bad_what_if_and_load(tiny, capsys):
    base = ["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"), "--report", ""]
    assert main(base + ["--what-if", "+8xNoSuchGPU"]) == 2
    assert "unknown GPU model" in capsys.readouterr().err
    assert main(base + ["--what-if", "lots"]) == 2
    assert "--what-if" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(base + ["--load", "abc"])
    assert e.value.code == 2


def test_what_if_apply():
    nodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    more = whatif.apply(nodes, [whatif.parse("+8xV100M32")])
    assert len(more) == len(nodes) + 8 and sum(len(n.gpus) for n in more[-8:]) == 64
    new = whatif.apply(nodes, [whatif.parse("+2x4xA100-80GB")])
    assert [len(n.gpus) for n in new[-2:]] == [4, 4] and new[-1].gpus[0].memory_mib == 81920
    fewer = whatif.apply(nodes, [whatif.parse("-10%")])
    assert len(fewer) == len(nodes) - round(0.1 * len(nodes))
    with pytest.raises(whatif.WhatIfError):
        whatif.apply(nodes, [whatif.parse("-5000xT4")])


def test_smallest_addition_bisects():
    calls = []

    def ev(n):
        calls.append(n)
        return whatif.SearchPoint(n, max(0.0, 1000 - 37 * n), 0.0, 50.0, 0)

    best, pts = whatif.smallest_addition(ev, 100.0)
    assert best == 25 and len(calls) < 15 and all(p.added != 24 or p.p99_s > 100 for p in pts)


DLRM_HEADER = ",".join(trace2025.COLUMNS)


def test_dlrm_reader_and_node_limits(tmp_path):
    rows = [DLRM_HEADER]
    # 6 HN pods of one app capped at 2 per node, 50% RDMA each; 2 GPU nodes of 200% RDMA
    rows += [f"i{i},HN,app_0,12,12,1,1,50,50,120.0,120.0,600.0,800.0,2,{10 + i},{10 + i},{5000 + i}" for i in range(6)]
    rows += [f"c{i},CN,app_1,8,8,0,0,1,1,40.0,40.0,10.0,10.0,-1,,,{3000 + i}" for i in range(2)]
    f = tmp_path / "d.csv"
    f.write_text("\n".join(rows) + "\n")
    assert trace2025.is_dlrm(f)
    tr = trace2025.load_dlrm(f)
    assert len(tr.pods) == 8 and tr.pods[0].extras["rdma"] == 50
    nodes = [n for n in trace2025.synth_cluster(tr.pods, 1.0)]
    hn = [n for n in nodes if n.gpus]
    r = run_replay(hn[:1] + [n for n in nodes if not n.gpus], workload_from_trace(tr.pods), "bestfit", warmup=0.0, frag=False)
    # one HN node: app cap 2 -> only 2 of the 6 run at once, the rest wait
    assert r.delay_by_class["1"]["p99"] > 0 and r.pods_never_placed == 0
    bad = tmp_path / "bad.csv"
    bad.write_text(DLRM_HEADER + "\n" + rows[1].replace(",50,50,", ",500,500,") + "\n")
    with pytest.raises(trace.TraceError, match="bad.csv:2"):
        trace2025.load_dlrm(bad)
    # the same row loop as the openb readers: unique names, a header named column by column, bad rows skippable
    dup = tmp_path / "dup.csv"
    dup.write_text("\n".join([DLRM_HEADER, rows[1], rows[1], rows[2]]) + "\n")
    with pytest.raises(trace.TraceError, match="dup.csv:3: field instance_sn: duplicate instance name 'i0'"):
        trace2025.load_dlrm(dup)
    kept = trace2025.load_dlrm(dup, skip_bad_rows=True)
    assert [p.name for p in kept.pods] == ["i0", "i1"] and len(kept.skipped_rows) == 1
    hdr = tmp_path / "hdr.csv"
    hdr.write_text(DLRM_HEADER.replace("role", "rol") + "\n" + rows[1] + "\n")
    with pytest.raises(trace.TraceError, match="hdr.csv:1: field header"):
        trace2025.load_dlrm(hdr)


SHARED_2025 = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "alibaba-gpu-v2025" / "disaggregated_DLRM_trace.csv"
SHARED_2025_ALT = Path("/work/shared/traces/alibaba-gpu-v2025/disaggregated_DLRM_trace.csv")


@pytest.mark.skipif(not (SHARED_2025.exists() or SHARED_2025_ALT.exists()), reason="../shared/traces/alibaba-gpu-v2025 absent")
def test_real_2025_trace_reads_and_bundled_copy_is_identical():
    src = SHARED_2025 if SHARED_2025.exists() else SHARED_2025_ALT
    tr = trace2025.load_dlrm(src)
    assert len(tr.pods) == 23871 and sum(1 for p in tr.pods if p.num_gpu) == 7386
    b = trace2025.bundled_path()
    assert b.read_bytes() == src.read_bytes()
    pk = trace2025.peak_demand(tr.pods, "HN")
    assert pk["gpus"] > 1000 and pk["rdma_pct"] > 0


def test_gangs_go_through_the_gang_scheduler_all_or_nothing(tmp_path):
    """Two 4-GPU members of one pod group, two 4-GPU nodes, one node busy until t=100: a gang waits for
    both nodes (all or nothing); the same pods without a group would start one at once."""
    from gpufleet.engine.model import Gpu, Node

    nodes = [Node(f"n{i}", 64000, 262144, tuple(Gpu(j, f"n{i}-g{j}", "V100M32", 32768) for j in range(4)),
                  labels={"kubernetes.io/hostname": f"n{i}"}, max_pods=100) for i in range(2)]
    from gpufleet.simulator.traces.workload import Workload

    def wl(group):
        reqs = [PodRequest("busy", "t", cpu_milli=1000, gpu_count=1, gpu_milli=1000)]
        reqs += [PodRequest(f"w{k}", "t", cpu_milli=1000, gpu_count=4, gpu_milli=1000,
                            pod_group=group, pod_group_min=2 if group else 0) for k in range(2)]
        return Workload(reqs, np.array([0.0, 10.0, 10.0]), np.array([100.0, 50.0, 50.0]), np.full(3, np.nan))

    g = run_replay(nodes, wl("job"), "bestfit", warmup=0.0, frag=False)
    s = run_replay(nodes, wl(None), "bestfit", warmup=0.0, frag=False)
    assert g.delay_by_class["4"]["p50"] == 90 and g.delay_by_class["4"]["max"] == 90  # both start at t=100
    assert s.delay_by_class["4"]["p50"] == 25 and s.delay_by_class["4"]["max"] == 50  # one at t=10, one when it ends
    assert g.pods_never_placed == 0


def test_a_high_priority_gang_preempts_for_all_its_members():
    from gpufleet.engine.model import Gpu, Node
    from gpufleet.simulator.traces.workload import Workload

    nodes = [Node(f"n{i}", 64000, 262144, tuple(Gpu(j, f"n{i}-g{j}", "V100M32", 32768) for j in range(4)),
                  labels={"kubernetes.io/hostname": f"n{i}"}, max_pods=100) for i in range(2)]
    reqs = [PodRequest(f"low{k}", "t", cpu_milli=1000, gpu_count=4, gpu_milli=1000) for k in range(2)]
    reqs += [PodRequest(f"w{k}", "t", cpu_milli=1000, gpu_count=4, gpu_milli=1000, priority=100,
                        pod_group="job", pod_group_min=2) for k in range(2)]
    wl = Workload(reqs, np.array([0.0, 0.0, 10.0, 10.0]), np.array([1000.0, 1000.0, 50.0, 50.0]), np.full(4, np.nan))
    r = run_replay(nodes, wl, "bestfit", warmup=0.0, frag=False)
    assert r.preemptions == 2 and r.pods_never_placed == 0
    off = run_replay(nodes, wl, "bestfit", warmup=0.0, frag=False, preemption=False)
    assert off.preemptions == 0 and off.queue_delay_s["max"] > r.queue_delay_s["max"]
