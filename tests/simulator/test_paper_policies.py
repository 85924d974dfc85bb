"""Table-driven checks of the FGD-paper policies against hand-computed values."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from gpufleet.policies.paper.workload import TargetWorkload, frag_amount


def node(name: str, gpus: int, cpu_milli: int = 32_000, model: str = "T4") -> Node:
    return Node(name=name, cpu_milli=cpu_milli, memory_mib=256_000,
                gpus=tuple(Gpu(i, f"{name}-{i}", model, 16_384) for i in range(gpus)), max_pods=1000)


def req(name: str, cpu: int = 1000, count: int = 1, milli: int = 1000, models=None) -> PodRequest:
    return PodRequest(name=name, namespace="t", cpu_milli=cpu, memory_mib=1024, gpu_count=count,
                      gpu_milli=milli if count else 0, gpu_models_allow=models)


def tw_of(*shapes: tuple[int, int, int, float]) -> TargetWorkload:
    """(cpu, milli, count, freq) -> workload with exactly those shapes."""
    c = Counter({(cpu, milli, n, None): f for cpu, milli, n, f in shapes})
    return TargetWorkload.from_counts(c, threshold=1.0)


# frag_amount: (cpu_left, gpu_left, workload) -> expected fragment (milli)
FRAG_CASES = [
    # a 500-milli task fits: only GPUs with < 500 left are fragment
    (8000, [1000, 300], [(1000, 500, 1, 1.0)], 300.0),
    # nothing fits (all GPUs < 600): everything idle is fragment
    (8000, [500, 300], [(1000, 600, 1, 1.0)], 800.0),
    # fits on GPU but CPU is short (Q4): all idle is fragment
    (500, [1000, 1000], [(1000, 500, 1, 1.0)], 2000.0),
    # a 2-GPU task needs two GPUs with 1000 free
    (8000, [1000, 700], [(1000, 1000, 2, 1.0)], 1700.0),
    # CPU-only shapes count all idle GPU (classes XL/XR are never 'satisfied')
    (8000, [1000, 0], [(1000, 0, 0, 1.0)], 1000.0),
    # mixture weights by frequency
    (8000, [1000, 300], [(1000, 500, 1, 0.5), (1000, 0, 0, 0.5)], 0.5 * 300 + 0.5 * 1300),
]


@pytest.mark.parametrize("cpu,gpus,shapes,expected", FRAG_CASES)
def test_frag_amount(cpu, gpus, shapes, expected):
    tw = tw_of(*shapes)
    acc = tw.access(["T4"])
    got = frag_amount(np.array([cpu]), np.array([gpus]), np.array([0]), tw, acc)
    assert got[0] == pytest.approx(expected)


def test_model_restricted_shape_counts_all_idle_on_other_models():
    c = Counter({(1000, 500, 1, frozenset({"A100"})): 1})
    tw = TargetWorkload.from_counts(c, threshold=1.0)
    acc = tw.access(["T4", "A100"])
    got = frag_amount(np.array([8000, 8000]), np.array([[1000, 300], [1000, 300]]), np.array([0, 1]), tw, acc)
    assert list(got) == [1300.0, 300.0]


def test_target_workload_keeps_most_common_shapes_up_to_threshold():
    c = Counter({(1, 500, 1, None): 60, (2, 1000, 1, None): 30, (3, 250, 1, None): 10})
    tw = TargetWorkload.from_counts(c, threshold=0.9)
    assert list(tw.gpu_milli) == [500, 1000]
    assert tw.freq.sum() == pytest.approx(1.0)
    assert tw.freq[0] == pytest.approx(60 / 90)


def run(policy: str, nodes: list[Node], pods: list[PodRequest], seed: int = 0) -> tuple[Scheduler, list]:
    state = ClusterState(nodes)
    s = Scheduler(build_profile(policy), state, seed=seed)
    for p, _ in s.profile.scores:
        if hasattr(p, "prime") and not getattr(p, "learn_online", False):
            p.prime(pods)
    return s, [s.schedule(p) for p in pods]


def test_fgd_puts_a_share_pod_on_the_partly_used_gpu():
    # one node, GPU0 has 500 used; a 500 pod should complete GPU0, not break GPU1
    s, decs = run("fgd", [node("n1", 2)], [req("a", milli=500), req("b", milli=500)])
    assert all(d.ok for d in decs)
    assert decs[0].assignment.gpu_indices == decs[1].assignment.gpu_indices


def test_bestfit_prefers_the_fuller_node():
    nodes = [node("big", 4), node("small", 2)]
    s, decs = run("bestfit", nodes, [req("a")])
    assert decs[0].assignment.node == "small"


def test_packing_prefers_partly_used_gpu_over_idle_node():
    nodes = [node("a", 2), node("b", 2)]
    s, decs = run("packing", nodes, [req("x", milli=300), req("y", milli=300)])
    assert decs[0].assignment.node == decs[1].assignment.node
    assert decs[0].assignment.gpu_indices == decs[1].assignment.gpu_indices


def test_clustering_keeps_kinds_apart():
    nodes = [node("a", 4), node("b", 4)]
    s, decs = run("clustering", nodes, [req("share1", milli=300), req("whole1"), req("share2", milli=300)])
    assert decs[0].assignment.node == decs[2].assignment.node  # shared pods together
    assert decs[1].assignment.node != decs[0].assignment.node  # whole-GPU pod on the other node


def test_random_uses_all_nodes_over_many_pods():
    nodes = [node(f"n{i}", 8) for i in range(4)]
    s, decs = run("random", nodes, [req(f"p{i}", milli=100, cpu=10) for i in range(40)], seed=3)
    assert len({d.assignment.node for d in decs}) == 4


@pytest.mark.parametrize("policy", ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "default"])
def test_no_policy_overcommits(policy):
    nodes = [node("a", 2, cpu_milli=8000), node("b", 4, cpu_milli=16000, model="V100M16")]
    rng = np.random.default_rng(1)
    pods = []
    for i in range(60):
        k = int(rng.integers(3))
        pods.append(req(f"p{i}", cpu=int(rng.integers(100, 3000)), count=[0, 1, 2][k],
                        milli=int(rng.choice([200, 450, 700, 1000])) if k == 1 else 1000))
    s, decs = run(policy, nodes, pods)
    st = s.state
    assert (st.gpu_free_milli >= 0).all() and (st.cpu_free >= 0).all() and (st.mem_free >= 0).all()
    used = np.zeros_like(st.gpu_free_milli)
    for d in decs:
        if d.ok:
            a = d.assignment
            for g in a.gpu_indices:
                used[st.index[a.node], g] += a.gpu_milli
    assert (used <= 1000).all()
    assert (st.gpu_free_milli + used == np.where(st.gpu_exists, 1000, 0)).all()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 64_000), hst.sampled_from([0, 100, 250, 470, 500, 810, 1000]), hst.sampled_from([0, 1, 2, 4, 8]),
                            hst.floats(0.01, 1.0)), min_size=1, max_size=12),
       hst.lists(hst.lists(hst.integers(0, 1000), min_size=8, max_size=8), min_size=1, max_size=20),
       hst.integers(0, 64_000))
def test_binned_frag_equals_direct_definition(shapes, gpus, cpu):
    from gpufleet.policies.paper.workload import _frag_amount_reference

    c = Counter()
    for cpu_t, milli, n, f in shapes:
        c[(cpu_t, milli if n else 0, n if milli else 0, None)] += f
    tw = TargetWorkload.from_counts(c, threshold=1.0)
    acc = tw.access(["T4"])
    left = np.array(gpus)
    cpus = np.full(len(gpus), cpu)
    model = np.zeros(len(gpus), dtype=int)
    assert np.allclose(frag_amount(cpus, left, model, tw, acc), _frag_amount_reference(cpus, left, model, tw, acc))


@settings(max_examples=40, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 64_000), hst.sampled_from([0, 100, 250, 470, 500, 810, 1000]), hst.sampled_from([0, 1, 2, 4, 8]),
                            hst.floats(0.01, 1.0)), min_size=1, max_size=40),
       hst.lists(hst.tuples(hst.integers(0, 64_000), hst.lists(hst.integers(0, 1000), min_size=8, max_size=8)), min_size=1, max_size=30))
def test_frag_amount_of_a_node_is_the_same_in_any_batch(shapes, rows):
    """run_packing computes its yardstick for all placements in one batch after the run: each row must come out
    bit for bit as when computed alone (the sum runs row by row)."""
    c = Counter()
    for cpu_t, milli, n, f in shapes:
        c[(cpu_t, milli if n else 0, n if milli else 0, None)] += f
    tw = TargetWorkload.from_counts(c, threshold=1.0)
    acc = tw.access(["T4"])
    cpus = np.array([r[0] for r in rows])
    left = np.array([r[1] for r in rows])
    model = np.zeros(len(rows), dtype=int)
    batch = frag_amount(cpus, left, model, tw, acc)
    for i in range(len(rows)):
        assert batch[i] == frag_amount(cpus[i:i + 1], left[i:i + 1], model[i:i + 1], tw, acc)[0]


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 64_000), hst.sampled_from([0, 100, 250, 470, 500, 810, 1000]), hst.sampled_from([0, 1, 2, 4, 8]),
                            hst.floats(0.01, 1.0)), min_size=1, max_size=40),
       hst.lists(hst.tuples(hst.integers(0, 64_000), hst.lists(hst.integers(0, 1000), min_size=8, max_size=8),
                            hst.integers(-1, 1)), min_size=1, max_size=4))
def test_direct_frag_amount_is_the_binned_one_bit_for_bit(shapes, rows):
    """A few node states take the [S, T, G] path; it must give the binned path's bits (the scores and the yardstick
    of every run depend on it)."""
    from gpufleet.policies.paper import workload as wl

    c = Counter()
    for cpu_t, milli, n, f in shapes:
        c[(cpu_t, milli if n else 0, n if milli else 0, frozenset({"T4"}) if cpu_t % 3 == 0 and milli else None)] += f
    tw = TargetWorkload.from_counts(c, threshold=1.0)
    acc = tw.access(["T4", "V100"])
    cpus = np.array([r[0] for r in rows])
    left = np.array([r[1] for r in rows], dtype=np.int64)
    model = np.array([r[2] for r in rows])
    direct = wl._frag_amount_direct(cpus, left, model, tw, acc)
    saved = wl.DIRECT_MAX_ROWS, wl.TABLE_MAX_ROWS
    wl.DIRECT_MAX_ROWS = wl.TABLE_MAX_ROWS = 0
    try:
        binned = frag_amount(cpus, left, model, tw, acc)
    finally:
        wl.DIRECT_MAX_ROWS, wl.TABLE_MAX_ROWS = saved
    assert direct.tobytes() == binned.tobytes()
    # and the per-free-milli table's path (frag_amount's own for these rows)
    assert frag_amount(cpus, left, model, tw, acc).tobytes() == binned.tobytes()
