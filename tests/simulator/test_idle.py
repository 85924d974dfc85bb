"""Where the idle GPUs are (``simulator/bounds/idle.py``): holes by GPU content, saturation, the repack yardstick, and that
``gpufleet simulate`` puts them in its JSON and report.  Expected values are worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli.main import main
from gpufleet.engine.model import Assignment
from gpufleet.engine.state import ClusterState
from gpufleet.simulator.experiments import packing
from gpufleet.simulator.bounds.idle import best_fit_decreasing, bins_lower_bound, share_holes, summarize_idle
from gpufleet.simulator.report.idle import repack_sentence

from .test_bound import node, pod
from .test_packing_and_cli import NODES, pods_csv

# --- holes by GPU content, on hand-placed shares --------------------------------------------------

# (placements: (node, GPU indices, per-GPU milli), expected holes, share GPUs, BFD repack, LP bound)
HOLES = [
    pytest.param([("a", (0,), 810)], {(810,): (1, 190)}, 1, 1, 1, id="810-alone-leaves-190"),
    pytest.param([("a", (0,), 470), ("a", (0,), 470), ("a", (1,), 470)], {(470, 470): (1, 60), (470,): (1, 530)}, 2, 2, 2,
                 id="470-pair-and-single"),
    pytest.param([("a", (0,), 500), ("b", (0,), 500)], {(500,): (2, 1000)}, 2, 1, 1, id="two-halves-repack-into-one"),
    pytest.param([("a", (0,), 300), ("a", (0,), 600), ("b", (1,), 300)], {(600, 300): (1, 100), (300,): (1, 700)}, 2, 2, 2,
                 id="content-sorted-largest-first"),
    # whole GPUs and multi-GPU pods are not shares: no holes, nothing to repack
    pytest.param([("a", (0,), 1000), ("b", (0, 1), 1000)], {}, 0, 0, 0, id="whole-gpus-are-not-shares"),
]


@pytest.mark.parametrize("placed, holes, share_gpus, bfd, lower", HOLES)
def test_share_holes(placed, holes, share_gpus, bfd, lower):
    state = ClusterState([node("a", 64_000, 2), node("b", 64_000, 2)])
    for k, (n, gpus, milli) in enumerate(placed):
        state.reserve(Assignment(pod_key=f"p{k}", node=n, cpu_milli=1000, memory_mib=1024, gpu_indices=gpus, gpu_milli=milli))
    got, items = share_holes(state)
    assert got == holes
    assert sum(n for n, _ in got.values()) == share_gpus
    assert best_fit_decreasing(items) == bfd and bins_lower_bound(items) == lower


# (shares, best-fit decreasing, arc-flow LP bound)
REPACK = [
    ([810, 190], 1, 1),
    ([810, 200], 2, 2),
    # BFD: 400+400 | 300+300+300 | 300 = 3 bins; 400+300+300 twice = 2
    ([400, 400, 300, 300, 300, 300], 3, 2),
]


@pytest.mark.parametrize("items, bfd, lower", REPACK)
def test_repack_yardsticks(items, bfd, lower):
    assert best_fit_decreasing(items) == bfd
    assert bins_lower_bound(items) == lower


# --- the breakdown a packing run records at the 100%-arrived point -------------------------------

# (nodes, pods, expected fields of run.idle.to_json()); every pod of a case is alike, so the seeded order does not matter.
# bound_placing_first_pct: each run here is the best placement that keeps the pods it placed before its first refusal
RUNS = [
    # capacity 2000: two 810s take one GPU each; a third would bring arrived to 2430 > 2000, so the snapshot is before it
    # (1620 arrived, 380 idle on two 810-alone GPUs); the third is turned away at 2430 / 2000 = 1.215
    pytest.param([node("a", 64_000, 1), node("b", 64_000, 1)], [pod(i, 1000, milli=810) for i in range(3)],
                 {"arrived_fraction": 0.81, "saturation": 1.215, "idle_gpus": 0.38, "whole_idle_gpus": 0.0, "sliver_gpus": 0.38,
                  "holes": {"810": {"gpus": 2, "idle_gpus": 0.38}}, "share_gpus": 2, "repack_bfd_gpus": 2, "repack_lower_gpus": 2,
                  "failed_gpus": {}, "unallocated_gpu_pct": 19.0, "bound_placing_first_pct": 19.0}, id="810s-before-capacity"),
    # capacity 3000: 600s go one per GPU; the 4th finds 400 free everywhere and fails at 2400 / 3000 = 0.8, the 5th
    # (3000, not over capacity) fails too; 1800 allocated, 1200 idle as three 400 holes
    pytest.param([node("a", 64_000, 3)], [pod(i, 1000, milli=600) for i in range(5)],
                 {"arrived_fraction": 1.0, "saturation": 0.8, "idle_gpus": 1.2, "whole_idle_gpus": 0.0,
                  "holes": {"600": {"gpus": 3, "idle_gpus": 1.2}}, "share_gpus": 3, "repack_bfd_gpus": 3, "repack_lower_gpus": 3,
                  "failed_gpus": {"unpinned": 1.2}, "unallocated_gpu_pct": 40.0, "cpu_stranded_gpus": 0.0,
                  "bound_placing_first_pct": 40.0}, id="600s-saturate-at-0.8"),
    # a 2-GPU node with one core: the first whole-GPU pod takes the core, the second is turned away at 2000 / 2000;
    # the other GPU is whole, idle and stranded by CPU
    pytest.param([node("a", 1000, 2)], [pod(i, 1000) for i in range(2)],
                 {"saturation": 1.0, "idle_gpus": 1.0, "whole_idle_gpus": 1.0, "cpu_stranded_gpus": 1.0, "unfillable_gpus": 0.0,
                  "holes": {}, "share_gpus": 0, "failed_gpus": {"unpinned": 1.0}, "bound_placing_first_pct": 50.0}, id="cpu-stranded-whole-gpu"),
    # pods pinned to P100: the T4 stays idle and no arrived shape may use it (unfillable, not CPU-stranded)
    pytest.param([node("t", 64_000, 1, "T4"), node("p", 64_000, 1, "P100")], [pod(i, 1000, spec=("P100",)) for i in range(2)],
                 {"saturation": 1.0, "whole_idle_gpus": 1.0, "unfillable_gpus": 1.0, "cpu_stranded_gpus": 0.0,
                  "failed_gpus": {"pinned:P100": 1.0}, "bound_placing_first_pct": 50.0}, id="pinned-leaves-other-model-unfillable"),
    # what the GPUs' gain costs where CPU binds: 4 cores for a 1-core GPU pod and two 3-core CPU-only pods; in any
    # order one CPU-only pod is turned away and every core is used (the GPU pod never brings arrived over capacity)
    pytest.param([node("a", 4000, 2)], [pod(0, 1000), pod(1, 3000, ngpu=0, milli=0), pod(2, 3000, ngpu=0, milli=0)],
                 {"cpu_used_pct": 100.0, "cpu_only_pods_failed": 1, "cpu_only_cores_failed": 3.0, "unallocated_gpu_pct": 50.0},
                 id="cpu-only-pod-turned-away"),
]


@pytest.mark.parametrize("policy", ["default", "fgd"])
@pytest.mark.parametrize("nodes, pods, expected", RUNS)
def test_packing_run_records_the_breakdown(nodes, pods, expected, policy):
    run = packing.run_packing(nodes, pods, policy, seed=1, tune=0)
    assert run.idle is not None
    got = run.to_json()["idle"]
    assert {k: got[k] for k in expected} == expected


def test_per_model_rows_and_used_by():
    nodes = [node("t", 64_000, 1, "T4"), node("p", 64_000, 2, "P100")]
    pods = [pod(0, 1000, spec=("P100",)), pod(1, 1000, milli=500)]  # 1000 pinned to P100, 500 free to go anywhere
    got = packing.run_packing(nodes, pods, "default", seed=1, tune=0).to_json()["idle"]["per_model"]
    assert got["P100"]["gpus"] == 2 and got["T4"]["gpus"] == 1
    assert got["P100"]["used_pinned"] == 1.0
    assert got["P100"]["used_unpinned"] + got["T4"]["used_unpinned"] == 0.5
    assert sum(r["idle"] for r in got.values()) == pytest.approx(1.5)


def test_summarize_idle_means_over_seeds():
    a = {"saturation": 0.9, "idle_gpus": 10.0, "whole_idle_gpus": 2.0, "holes": {"810": {"gpus": 10, "idle_gpus": 1.9}}}
    b = {"saturation": None, "idle_gpus": 20.0, "whole_idle_gpus": 4.0,
         "holes": {"810": {"gpus": 5, "idle_gpus": 0.95}, "470+470": {"gpus": 10, "idle_gpus": 0.6}}}
    s = summarize_idle([a, b])
    assert s["saturation_mean"] == 0.9 and s["saturation_runs"] == 1  # the seed that turned nothing away has no saturation
    assert s["idle_gpus_mean"] == 15.0 and s["idle_gpus_std"] == 5.0 and s["whole_idle_gpus_mean"] == 3.0
    assert s["share_gpus_mean"] is None
    assert s["holes_mean"] == {"810": 1.425, "470+470": 0.3}  # absent in a seed counts as 0
    assert list(s["holes_mean"]) == ["810", "470+470"]


# --- gpufleet simulate: JSON and report ----------------------------------------------------------


def test_simulate_reports_where_the_idle_gpus_are(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(pods_csv())
    out, rep = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--policy", "fgd,bestfit",
                 "--seeds", "1-2", "--jobs", "1", "--no-bound", "--no-progress", "--json", str(out), "--report", str(rep)]) == 0
    doc = json.loads(out.read_text())
    table = capsys.readouterr().out
    assert "CPU in use %" in table
    for pol in ("fgd", "bestfit"):
        per_seed = [r["idle"] for r in doc["runs"] if r["policy"] == pol]
        assert len(per_seed) == 2
        s = doc["summary"][pol]["idle"]
        assert s["idle_gpus_mean"] == pytest.approx(sum(d["idle_gpus"] for d in per_seed) / 2, abs=1e-3)
        cpu = s["cpu_used_pct_mean"]  # the table's CPU column is the mean over seeds of each run's snapshot
        assert 0 < cpu <= 100 and cpu == pytest.approx(sum(d["cpu_used_pct"] for d in per_seed) / 2, abs=1e-3)
        row = next(line for line in table.splitlines() if line.startswith(pol)).replace(" *", "").split()
        assert row[5] == f"{cpu:.1f}", row  # policy, runs, unallocated, std, keep-first bound, CPU in use
        sats = [d["saturation"] for d in per_seed if d["saturation"] is not None]
        assert s["saturation_runs"] == len(sats) and (not sats or s["saturation_mean"] == pytest.approx(sum(sats) / len(sats), abs=1e-4))
        for d in per_seed:  # idle GPUs are whole + slivers, and the snapshot is at (not past) the 100% point
            assert d["idle_gpus"] == pytest.approx(d["whole_idle_gpus"] + d["sliver_gpus"], abs=2e-3)
            assert d["arrived_fraction"] <= 1.0
            assert d["repack_lower_gpus"] <= d["repack_bfd_gpus"] <= d["share_gpus"]
    page = rep.read_text()
    section = page[page.index("<h2>Where the idle GPUs are</h2>"):]
    section = section[: section.index("<h2>", 4)]
    assert section.count("<svg") == 2  # saturation vs unallocated; idle by hole kind
    assert "<th>CPU in use %</th>" in page
    assert "whole idle GPUs" in section and "first pod turned away" in section
    for pol in ("fgd", "bestfit"):
        assert f"<li>{pol}: of the " in section and "best-fit decreasing of the same shares would save" in section
    assert "no packing of them saves more than" in section


@pytest.mark.parametrize("saves, phrase", [
    (39.0, "best-fit decreasing of the same shares would save 39 GPUs"),
    (-7.0, "best-fit decreasing of the same shares would need 7 more GPUs than this placement"),
])
def test_repack_sentence_says_which_way_the_repack_goes(saves, phrase):
    d = {"share_gpus_mean": 1943.0, "repack_bfd_saves_gpus_mean": saves, "repack_saves_at_most_gpus_mean": 4.0}
    s = repack_sentence("default", d, several=False)
    assert phrase in s and "no packing of them saves more than 4 (arc-flow LP bound)" in s
