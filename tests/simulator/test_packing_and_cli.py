"""The packing and replay experiments and the ``gpufleet simulate`` command."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli.main import main
from gpufleet.simulator.experiments import packing
from gpufleet.simulator.experiments import replay
from gpufleet.simulator.experiments import shared
from gpufleet.simulator.traces import trace
from gpufleet.simulator.bounds.bound import offline_bound

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i:02d},32000,131072,{g},{m}\n" for i, (g, m) in enumerate([(8, "V100M32")] * 3 + [(2, "T4")] * 4 + [(4, "P100")] * 2)
)


def pods_csv(n: int = 120) -> str:
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"]
    shapes = [(4000, 1, 500), (8000, 1, 1000), (2000, 1, 250), (16000, 2, 1000), (6000, 0, 0), (3000, 1, 700)]
    for i in range(n):
        cpu, g, m = shapes[i % len(shapes)]
        spec = "T4" if i % 17 == 0 and g else ""
        rows.append(f"p{i:04d},{cpu},8192,{g},{m},{spec},LS,Running,{i * 60},{i * 60 + 3600},{i * 60}")
    return "\n".join(rows) + "\n"


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    return tmp_path


def test_workload_order_inflates_to_tune_and_is_seeded(tiny):
    pods = trace.load_pods(tiny / "pods.csv").pods
    cap = 40 * 1000
    a = packing.workload_order(pods, cap, 1.3, 7)
    b = packing.workload_order(pods, cap, 1.3, 7)
    c = packing.workload_order(pods, cap, 1.3, 8)
    assert [n for _, n in a] == [n for _, n in b] != [n for _, n in c]
    demand = sum(p.request().total_gpu_milli for p, _ in a)
    assert demand <= 1.3 * cap + 2000 and demand > 1.2 * cap
    assert len({n for _, n in a}) == len(a)  # resampled pods get unique names


@pytest.mark.parametrize("policy", ["fgd", "bestfit", "default"])
def test_packing_run_curves(tiny, policy):
    nodes = trace.load_nodes(tiny / "nodes.csv")
    pods = trace.load_pods(tiny / "pods.csv").pods
    r = packing.run_packing(nodes, pods, policy, seed=42, tune=1.3)
    assert len(r.allocation_pct) == 131 and r.arrived_pct[100] == 100.0
    alloc = [x for x in r.allocation_pct if x is not None]
    assert all(b >= a - 1e-9 for a, b in zip(alloc, alloc[1:]))  # pods never leave
    # never more allocated than arrived (bins are +-1 wide, one pod is up to 5% of this tiny cluster)
    assert all(a <= x + 6 for a, x in zip(r.allocation_pct, r.arrived_pct) if a is not None)
    assert r.unallocated_gpu_pct == pytest.approx(100 - r.allocation_pct[100])
    assert r.pods_failed > 0  # 130% demand cannot all fit


def test_a_run_after_others_in_one_process_gives_what_a_first_run_gives(tiny, monkeypatch):
    """The requests, the arrival order and the keep-first LP's program are kept for the next run of the same
    trace and seed in a process (packing.memo): reusing them must change nothing."""
    nodes = trace.load_nodes(tiny / "nodes.csv")
    pods = trace.load_pods(tiny / "pods.csv").pods

    def run(policy: str, seed: int = 42) -> dict:
        d = packing.run_packing(nodes, pods, policy, seed=seed, tune=1.3).to_json()
        d.pop("wall_s")
        return d

    monkeypatch.setattr(shared, "_MEMO", {})
    fresh = {pol: (monkeypatch.setattr(shared, "_MEMO", {}), run(pol))[1] for pol in ("fgd", "bestfit")}
    assert run("fgd") == fresh["fgd"] and run("bestfit") == fresh["bestfit"] and run("fgd", seed=7) != fresh["fgd"]
    assert len(shared._MEMO) == 11 and run("bestfit") == fresh["bestfit"]  # requests, target workload, the empty cluster;
    # per seed: order, arrivals, their idle-recorder facts, the keep-first LP's program and basis
    other = list(pods)  # an equal list, another object: computed again, not taken from the memo
    packing.run_packing(nodes, other, "bestfit", seed=42, tune=1.3)
    assert any(v[0][0] is other for v in shared._MEMO.values())


def test_prepared_inputs_are_what_a_run_builds_and_change_nothing(tiny, monkeypatch):
    """packing.prepare (gpufleet simulate's parent, before it forks the runs' workers) fills the memo with exactly the
    entries a run of that trace and seed looks up: a run after it builds none, and gives what a fresh run gives."""
    nodes = trace.load_nodes(tiny / "nodes.csv")
    pods = trace.load_pods(tiny / "pods.csv").pods

    def run(policy: str) -> dict:
        d = packing.run_packing(nodes, pods, policy, seed=42, tune=1.3).to_json()
        d.pop("wall_s")
        return d

    monkeypatch.setattr(shared, "_MEMO", {})
    fresh = run("fgd")
    keys = set(shared._MEMO)
    monkeypatch.setattr(shared, "_MEMO", {})
    packing.prepare(nodes, pods, seed=42, tune=1.3)
    prepared = dict(shared._MEMO)
    assert set(prepared) == keys  # the requests, the target workload, the order, the arrivals, the keep-first LP
    assert run("fgd") == fresh
    assert set(shared._MEMO) == keys and all(shared._MEMO[k][1] is v[1] for k, v in prepared.items())  # none made again


def test_replay_queues_and_releases(tiny):
    nodes = trace.load_nodes(tiny / "nodes.csv")[:2]
    pods = trace.load_pods(tiny / "pods.csv").pods
    r = replay.run_replay(nodes, pods, "bestfit")
    assert r.pods_arrived == len(pods)
    assert r.pods_placed + r.pods_never_placed <= len(pods)
    assert r.queue_delay_s["p99"] >= r.queue_delay_s["p50"] >= 0
    assert max(r.gpu_alloc_pct) <= 100.0


def test_offline_bound_is_below_every_policy(tiny):
    nodes = trace.load_nodes(tiny / "nodes.csv")
    pods = trace.load_pods(tiny / "pods.csv").pods
    b = offline_bound(nodes, pods, seed=42)
    for pol in ("fgd", "bestfit"):
        assert b.unallocated_gpu_pct <= packing.run_packing(nodes, pods, pol, seed=42).unallocated_gpu_pct + 1e-6


def test_cli_json_and_report(tiny, capsys):
    out = tiny / "out.json"
    rep = tiny / "report.html"
    rc = main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"), "--policy", "fgd,bestfit",
               "--seeds", "1-2", "--jobs", "1", "--json", str(out), "--report", str(rep), "--no-progress", "--bound"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert {(r["policy"], r["seed"]) for r in doc["runs"]} == {("fgd", 1), ("fgd", 2), ("bestfit", 1), ("bestfit", 2)}
    for r in doc["runs"]:
        assert len(r["arrived_pct"]) == len(r["allocation_pct"]) == len(r["frag_amount_pct"]) == len(r["frag_rate_pct"]) == 131
    assert set(doc["summary"]) == {"fgd", "bestfit"} and doc["summary"]["fgd"]["runs"] == 2
    html = rep.read_text()
    assert html.startswith("<!doctype html>") and html.count("<svg") >= 4 and "offline bound" in html
    assert "unallocated GPU %" in capsys.readouterr().out


def test_workers_give_what_one_process_gives(tiny, capsys):
    """--jobs 2 (workers forked after the parent imported what they use) prints the same table and JSON as one
    process, and the report has every plot."""
    import re

    def run(jobs: str) -> tuple[str, dict, str]:
        out, rep = tiny / f"out{jobs}.json", tiny / f"report{jobs}.html"
        assert main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"), "--policy", "fgd,bestfit",
                     "--seeds", "1-2", "--jobs", jobs, "--json", str(out), "--report", str(rep), "--no-progress"]) == 0
        doc = json.loads(out.read_text())
        for r in doc["runs"]:
            r.pop("wall_s"), r.pop("decision_ms_p50", None), r.pop("decision_ms_p99", None)
        for s in doc["summary"].values():
            s.pop("wall_s_mean")
        doc["bound"].pop("solve_s_max"), doc["bound"].pop("headline")
        for b in doc["bound"]["runs"]:
            b.pop("solve_s")
        doc.pop("params")
        table = "\n".join(line[:line.rfind(" ")] for line in capsys.readouterr().out.splitlines())  # less "wall s"
        return re.sub(r", \d+ s\)", "", table), doc, rep.read_text()

    t1, d1, r1 = run("1")
    t2, d2, r2 = run("2")
    assert t1 == t2 and d1 == d2
    assert r1.count("<svg") == r2.count("<svg") == 6
    for title in ("Allocated GPUs vs arrived demand", "Fragmentation amount", "Fragmentation rate"):
        assert title in r2


@pytest.mark.parametrize("left_out,tail", [
    ({}, "(mip, solver gap <= 0.005 points, 2 s)"),
    ({"810 milli": [238.0, 1104.0]}, "; the best placement found leaves out 238 of the 1,104 810-milli pods"),
    ({"810 milli": [238.0, 1104.0], "230 milli": [1.0, 145.0]}, "810-milli pods (and 1 other)"),
    ({"1 GPU": [3.0, 40.0], "810 milli": [0.2, 9.0], "100 milli": [2.0, 9.0]}, "3 of the 40 1-GPU pods (and 2 others)"),
])
def test_bound_headline_says_which_pods_the_bound_leaves_out(left_out, tail):
    from gpufleet.cli.simulate import _headline

    summary = {"fgd": {"unallocated_gpu_pct_mean": 4.67}, "default": {"unallocated_gpu_pct_mean": 3.88}, "bestfit": {"unallocated_gpu_pct_mean": 7.0}}
    line = _headline(summary, 3.11, {"method": "mip", "gap_pct_max": 0.005, "solve_s_max": 2.0, "left_out_mean": left_out})
    assert line.startswith("fgd leaves 4.67%, default leaves 3.88%; no placement can leave fewer than 3.11% (mip,")
    assert line.endswith(tail)


def test_cli_replay(tiny):
    out = tiny / "r.json"
    assert main(["simulate", "--experiment", "replay", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"),
                 "--policy", "bestfit", "--jobs", "1", "--json", str(out), "--report", "", "--no-progress"]) == 0
    r = json.loads(out.read_text())["runs"][0]
    assert r["experiment"] == "replay" and {"mean", "p50", "p99"} <= set(r["queue_delay_s"])


def test_cli_bad_rows_stop_or_skip(tiny, capsys):
    bad = tiny / "bad.csv"
    bad.write_text(pods_csv(30) + "pbad,abc,1,1,500,,LS,Running,1,2,1\n")
    rc = main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(bad), "--policy", "bestfit", "--report", "", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.csv:32" in err and "cpu_milli" in err
    rc = main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(bad), "--policy", "bestfit", "--report", "",
               "--no-progress", "--skip-bad-rows", "--jobs", "1"])
    assert rc == 0 and "skipped 1 bad pod row" in capsys.readouterr().err


def test_cli_unknown_policy(capsys):
    assert main(["simulate", "--policy", "nope", "--report", ""]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_replay_speedup_raises_load(tiny):
    import dataclasses

    nodes = trace.load_nodes(tiny / "nodes.csv")
    pods = [dataclasses.replace(p, deletion_time=p.creation_time + 30) for p in trace.load_pods(tiny / "pods.csv").pods]
    slow = replay.run_replay(nodes, pods, "bestfit")
    fast = replay.run_replay(nodes, pods, "bestfit", speedup=20)
    assert fast.mean_gpu_alloc_pct > slow.mean_gpu_alloc_pct
    assert fast.queue_delay_s["mean"] >= slow.queue_delay_s["mean"]


def test_cli_queues_experiment(tiny):
    out = tiny / "q.json"
    rep = tiny / "q.html"
    assert main(["simulate", "--experiment", "queues", "--teams", "2", "--speedup", "30", "--nodes", str(tiny / "nodes.csv"),
                 "--pods", str(tiny / "pods.csv"), "--policy", "bestfit", "--jobs", "1", "--json", str(out), "--report", str(rep),
                 "--no-progress"]) == 0
    r = json.loads(out.read_text())["runs"][0]
    assert r["experiment"] == "queues" and set(r["delay_s"]) == {"team-a", "team-b"}
    assert all(0 < j <= 1 for j in r["jain"])
    assert "Team queues" in rep.read_text()


def test_memo_forgets_the_least_recently_used_entry(monkeypatch):
    """shared.memo (packing.memo): an entry used again is kept over older ones (the shared requests over a run of seeds)."""
    monkeypatch.setattr(shared, "_MEMO", {})
    monkeypatch.setattr(shared, "_MEMO_MAX", 3)
    made: list[str] = []
    objs = (object(),)

    def get(name: str) -> object:
        return shared.memo(objs, (name,), lambda: made.append(name) or name)

    for name in ("shared", "a", "shared", "b", "shared", "c", "shared"):
        assert get(name) == name
    assert made == ["shared", "a", "b", "c"]  # "shared" was made once; "a" went when "c" came
    assert get("a") == "a" and made[-1] == "a"


def test_requests_made_once_a_shape_are_each_pods_own_request():
    # packing._requests builds one request per row shape and copies it under the other pods' names: field by field
    # what TracePod.request() gives each pod (MIG pods, model lists and CPU-only pods included)
    import dataclasses

    pods = [trace.TracePod(f"p{i}", cpu, 1024, g, m, spec, mig_profile=mig)
            for i, (cpu, g, m, spec, mig) in enumerate([(1000, 1, 500, (), ""), (1000, 1, 500, (), ""),
                                                        (1000, 1, 500, ("T4",), ""), (2000, 0, 0, (), ""),
                                                        (1000, 1, 0, (), "1g.10gb"), (1000, 1, 0, (), "1g.10gb"),
                                                        (1000, 2, 1000, ("T4", "P100"), ""), (1000, 1, 500, (), "")])]
    got = packing._requests(pods)
    want = [p.request() for p in pods]
    assert [dataclasses.asdict(r) for r in got] == [dataclasses.asdict(r) for r in want]
    assert [r.name for r in got] == [p.name for p in pods] and got == want


def test_the_first_bounds_process_starts_without_the_engine_and_policies():
    """gpufleet simulate forks the first offline bound's MIP right after reading the trace (cli/simulate.py
    _start_first_bound), before it imports the engine and the policies for the runs: the command's module, the trace
    reader and the bound must not import them (else the MIP's process starts no earlier, or imports them itself)."""
    import os
    import subprocess
    import sys

    code = ("import sys, gpufleet.cli.simulate, highspy, gpufleet.simulator.bounds.bound\n"
            "heavy = sorted(m for m in sys.modules if m.startswith(('gpufleet.engine.framework', 'gpufleet.engine.plugins',"
            " 'gpufleet.engine.state', 'gpufleet.policies.', 'gpufleet.simulator.experiments.packing')))\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_first_bound_gets_its_own_process(tiny, capsys):
    assert main(["simulate", "--nodes", str(tiny / "nodes.csv"), "--pods", str(tiny / "pods.csv"), "--policy", "bestfit,random",
                 "--seeds", "1-2", "--jobs", "2", "--report", "", "--no-progress"]) == 0
    import multiprocessing

    err = capsys.readouterr().err
    if multiprocessing.get_start_method(allow_none=False) == "fork":
        assert "2 worker(s), the first offline bound's started first" in err
    else:
        assert "2 worker(s)\n" in err
