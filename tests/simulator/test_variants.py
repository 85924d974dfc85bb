"""The seeded trace variants of ``bench/variants.py`` (issue 14's held-out discipline) do what they say.

Every figure in the family table of docs/results.md rests on these generators: that a pinnedNN trace pins NN% of
the GPU pods to models a node of that model can hold, that a multigpuNN trace reaches NN% multi-GPU
demand, that each (variant, seed) is one fixed draw, and that the tuning and held-out splits do not
overlap.  The command line refuses a bad name, policy or file in one line, before any run starts.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpufleet.simulator.traces import trace as tracemod

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_variants", ROOT / "bench" / "variants.py")
assert _spec is not None and _spec.loader is not None
V = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(V)


@pytest.fixture(scope="module")
def nodes():
    return V._nodes()


@pytest.fixture(scope="module")
def base():
    return tracemod.load_pods(tracemod.bundled(tracemod.DEFAULT_PODS)).pods


def gpu_pods(pods):
    return [p for p in pods if p.num_gpu]


def test_the_split_is_fixed_disjoint_and_covers_every_family():
    every = [v for fam in V.FAMILIES.values() for v in fam]
    assert not set(V.TUNE) & set(V.HELDOUT)
    assert sorted(V.TUNE + V.HELDOUT) == sorted(every)
    for v in every:
        V.check_variant(v)
        assert V.family_of(v) in V.FAMILIES
    assert not any(v.startswith("gpuspec") for v in every)  # the FGD paper's own held-out lists are never used


@pytest.mark.parametrize("name, ok", [
    ("default", True), ("pinned05", True), ("pinskew40", True), ("multigpu50", True), ("pinned100", True),
    ("cpumore350", True), ("cpumore100", True), ("cpu250", True), ("gpushare40", True),
    ("", False), ("pinned", False), ("pinned0", False), ("pinned150", False), ("multigpu101", False),
    ("cpumore50", False), ("Pinned10", False), ("gpuspec10", False), ("multigpu20x", False), ("cpu", False),
])
def test_check_variant(name, ok):
    if ok:
        V.check_variant(name)
    else:
        with pytest.raises(ValueError, match="variant"):
            V.check_variant(name)


@pytest.mark.parametrize("share", [0.05, 0.4])
def test_pinned_pods_name_one_to_three_models_that_can_hold_them(nodes, base, share):
    pods = V.pin_models(base, nodes, share, np.random.default_rng(7))
    models = {n.gpus[0].model for n in nodes if n.gpus}
    assert len(pods) == len(base)
    pinned = [p for p in pods if p.gpu_spec]
    assert len(pinned) == round(share * len(gpu_pods(base)))  # every GPU pod here fits some model
    for p, b in zip(pods, base, strict=True):
        assert (p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) == (b.name, b.cpu_milli, b.memory_mib, b.num_gpu, b.gpu_milli)
        if not p.gpu_spec:
            continue
        assert p.num_gpu > 0
        assert 1 <= len(p.gpu_spec) <= 3 and len(set(p.gpu_spec)) == len(p.gpu_spec)
        assert list(p.gpu_spec) == sorted(p.gpu_spec) and set(p.gpu_spec) <= models
        assert any(V._fits(p, n) for n in nodes if n.gpus and n.gpus[0].model in p.gpu_spec), p.name


def _mix_distance(pods, nodes) -> float:
    """L1 distance between the pinned GPU demand's model mix and the cluster's GPU capacity mix."""
    cap, want = Counter(), Counter()
    for n in nodes:
        if n.gpus:
            cap[n.gpus[0].model] += len(n.gpus)
    for p in pods:
        for m in p.gpu_spec:
            want[m] += V._demand(p) / len(p.gpu_spec)
    return sum(abs(want[m] / sum(want.values()) - cap[m] / sum(cap.values())) for m in cap)


def test_pinskew_puts_pinned_demand_on_the_models_less_evenly_than_pinned(nodes, base):
    seeds = range(42, 52)
    even = statistics.median(_mix_distance(V.variant_pods("pinned40", s, nodes, base), nodes) for s in seeds)
    skew = statistics.median(_mix_distance(V.variant_pods("pinskew40", s, nodes, base), nodes) for s in seeds)
    assert skew > 1.5 * even, (skew, even)


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_multigpu_variants_reach_their_share_of_gpu_demand(base, share):
    pods = V.more_multigpu(base, share, np.random.default_rng(3))
    demand = [V._demand(p) for p in pods]
    multi = sum(d for p, d in zip(pods, demand, strict=True) if p.num_gpu > 1)
    biggest = max(V._demand(p) for p in base if p.num_gpu > 1)
    assert share * sum(demand) <= multi < share * sum(demand) + biggest  # stops at the first copy past the share
    assert len(pods) == len(base) and len({p.name for p in pods}) == len(pods)
    assert [p for p in pods if not p.num_gpu] == [p for p in base if not p.num_gpu]


@pytest.mark.parametrize("factor", [2.0, 3.5])
def test_cpumore_variants_add_cpu_only_pods_until_their_cpu_is_factor_times_the_traces(base, factor):
    pods = V.more_cpu_pods(base, factor, np.random.default_rng(5))
    cpu_only = [p for p in pods if not p.num_gpu]
    have = sum(p.cpu_milli for p in base if not p.num_gpu)
    assert factor * have <= sum(p.cpu_milli for p in cpu_only) < factor * have + max(p.cpu_milli for p in cpu_only)
    assert gpu_pods(pods) == gpu_pods(base)
    assert len({p.name for p in pods}) == len(pods)


@pytest.mark.parametrize("variant", ["pinned20", "pinskew20", "multigpu30", "cpumore200"])
def test_each_variant_and_seed_is_one_fixed_draw(nodes, base, variant):
    a = V.variant_pods(variant, 42, nodes, base)
    assert a == V.variant_pods(variant, 42, nodes, base)
    assert a != V.variant_pods(variant, 43, nodes, base)
    assert a != base


def test_written_variants_read_back_as_the_same_pods(tmp_path, nodes, base):
    for v in ("pinned40", "multigpu50"):
        pods = V.variant_pods(v, 42, nodes, base)
        path = tmp_path / f"openb_pod_list_{v}.csv"
        V.write_csv(path, pods)
        back = tracemod.load_pods(path).pods
        key = [(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in pods]
        assert [(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in back] == key


def _bad_sweep(tmp_path: Path) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"params": {"policies": "default"}, "results": [{"kind": "run", "variant": "default"}]}))
    return p


@pytest.mark.parametrize("argv, says", [
    (["sweep", "--variants", "nosuch"], "unknown variant 'nosuch'"),
    (["sweep", "--variants", "pinned150"], "variant 'pinned150'"),
    (["sweep", "--variants", "cpu999"], "openb_pod_list_cpu999.csv does not exist"),
    (["sweep", "--variants", "pinned20", "--policies", "nosuch"], "--policies: 'nosuch': unknown policy"),
    (["sweep", "--variants", "pinned20", "--policies", "default:model_weight"], "want NAME:ARG=VALUE"),
    (["sweep", "--variants", "pinned20", "--policies", "default:model_weight=-1"], "model_weight must be a number >= 0"),
    (["sweep", "--variants", "pinned20", "--jobs", "0"], "--jobs: must be an integer in [1, inf], got 0"),
    (["sweep", "--variants", "pinned20", "--policies", ""], "no policy named (and no --bound)"),  # --bound alone is fine
    (["sweep", "--variants", "pinned20", "--seeds", "4x"], "--seeds"),
    (["table", "/nonexistent/runs.json"], "/nonexistent/runs.json: No such file"),
    (["table", "{bad}"], "results[0]: missing seed, policy"),
    (["table", str(ROOT / "README.md")], "README.md:1: not JSON"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    argv = [str(_bad_sweep(tmp_path)) if a == "{bad}" else a for a in argv]
    try:
        rc = V.main(argv)
    except SystemExit as exc:  # argparse's own checks
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_the_committed_results_make_the_readme_default_row(capsys):
    rc = V.main(["table", str(ROOT / "bench/results/issue14-v12-default-10seeds.json"),  # v13 (after a6b39e5) wins where it has runs
                 str(ROOT / "bench/results/issue14-v13-default-10seeds.json"),
                 str(ROOT / "bench/results/issue14-v2-fgd-10seeds.json")])
    out = capsys.readouterr().out
    assert rc == 0
    row = next(line for line in out.splitlines() if line.startswith("| default |"))
    assert "3.65" in row and "4.72" in row, row
    row = next(line for line in out.splitlines() if line.startswith("| cpu300 |"))  # the reserve's held-out case
    assert "4.08" in row and "14.05" in row, row


def test_mig_variant_hosts_have_valid_layouts_and_its_pods_ask_covering_profiles(nodes, base):
    """migNN: 64 added A100/H100-80GB hosts whose MIG GPUs are carved into 7 compute slices each (instances known to
    the GPU model), the rest whole; NN% of the share pods ask the smallest profile that covers their share."""
    from gpufleet.engine.gpu_models import lookup

    hosts = V.variant_nodes("mig30", nodes)[len(nodes):]
    assert len(hosts) == V.MIG_HOSTS and V.variant_nodes("pinned20", nodes) == list(nodes)
    for h in hosts:
        model = lookup(h.gpus[0].model)
        assert model is not None and len(h.gpus) == 8
        for g in h.gpus:
            if g.mig_enabled:
                assert sum(int(m.profile.split("g.")[0]) for m in g.mig_instances) == 7
                assert all(dict(model.mig_profiles)[m.profile] == m.memory_mib for m in g.mig_instances)
                assert sorted(m.instance_id for m in g.mig_instances) == list(range(len(g.mig_instances)))
        assert sum(g.mig_enabled for g in h.gpus) == len(V.MIG_LAYOUTS)
    assert [V.mig_profile_for(m) for m in (100, 143, 200, 286, 400, 460, 571, 700, 999)] == [
        "1g.10gb", "2g.20gb", "2g.20gb", "3g.40gb", "3g.40gb", "4g.40gb", "4g.40gb", "7g.80gb", "7g.80gb"]
    pods = V.variant_pods("mig30", 42, nodes)
    shares = [i for i, p in enumerate(base) if p.num_gpu == 1 and p.gpu_milli < 1000]
    mig = [i for i in shares if pods[i].mig_profile]
    assert len(mig) == round(0.3 * len(shares))
    assert all(pods[i].mig_profile == V.mig_profile_for(base[i].gpu_milli) and pods[i].gpu_spec == () for i in mig)
    r = pods[mig[0]].request()
    assert (r.gpu_count, r.gpu_milli, r.mig_profile) == (1, 0, pods[mig[0]].mig_profile) and r.gpu_memory_mib > 0
    assert V.variant_pods("mig30", 42, nodes) == pods
