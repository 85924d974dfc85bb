"""Property: a node's fragmentation score does not depend on how it was computed.

FGD and the default policy score stale nodes in batches, group identical nodes
(``state_groups``) and keep per-GPU scores for ``select_gpus``.  Each of those
shortcuts must give exactly what scoring the node on its own gives, or a
decision would depend on which other nodes happened to change (and a simulated
result on cache timing).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import GPU_MILLI, Assignment, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.default import DescentScore, WorkloadArgs, WorkloadModel
from gpufleet.policies.paper.fgd import DEDUPE_MIN_NODES, FGDScore, state_groups

from tests.builders import A100, T4, make_node

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = [(4000, 1000, 1), (2000, 500, 1), (1000, 250, 1), (8000, 1000, 2), (6000, 300, 1), (500, 0, 0)]
WORKLOAD = [PodRequest(name=f"w{i}", cpu_milli=c, memory_mib=4096, gpu_count=n, gpu_milli=m)
            for i, (c, m, n) in enumerate(SHAPES * 3)]


def plugin(kind: str):
    p = FGDScore() if kind == "fgd" else DescentScore(model=WorkloadModel(WorkloadArgs(learn_online=False)))
    p.prime(WORKLOAD)
    return p


@st.composite
def cluster(draw) -> ClusterState:
    """40-80 nodes of two kinds, many left idle (so groups form), some partly used."""
    n = draw(st.integers(DEDUPE_MIN_NODES + 8, 80))
    nodes = [make_node(f"n{i}", 8 if i % 3 else 4, A100 if i % 3 else T4, cpu_milli=64_000, memory_mib=262_144) for i in range(n)]
    state = ClusterState(nodes)
    for k in range(draw(st.integers(0, 60))):
        i = draw(st.integers(0, n - 1))
        c, m, cnt = draw(st.sampled_from(SHAPES[:-1]))
        free = np.flatnonzero(state.gpu_free_milli[i] >= m)
        if free.size < cnt or state.cpu_free[i] < c:
            continue
        gpus = tuple(int(g) for g in free[:cnt])
        state.reserve(Assignment(pod_key=f"x{k}", node=nodes[i].name, cpu_milli=c, memory_mib=4096, gpu_indices=gpus,
                                 gpu_milli=m, gpu_memory_mib=(0,) * cnt if m < GPU_MILLI else tuple(int(state.gpu_mem_cap[i, g]) for g in gpus)))
    return state


def cycle(shape) -> Cycle:
    c, m, n = shape
    return Cycle(request=PodRequest(name="p", cpu_milli=c, memory_mib=4096, gpu_count=n, gpu_milli=m), rng=np.random.default_rng(0))


@SETTINGS
@given(state=cluster(), shape=st.sampled_from(SHAPES), kind=st.sampled_from(["fgd", "default"]))
def test_batched_grouped_scores_equal_one_node_at_a_time(state, shape, kind):
    nodes = np.arange(len(state))
    batched = plugin(kind).score(cycle(shape), state, nodes)
    alone = np.array([plugin(kind).score(cycle(shape), state, np.array([i]))[0] for i in nodes])
    np.testing.assert_array_equal(batched, alone)


@SETTINGS
@given(state=cluster(), shape=st.sampled_from([s for s in SHAPES if 0 < s[1] < GPU_MILLI]), kind=st.sampled_from(["fgd", "default"]))
def test_gpu_choice_from_the_score_cache_equals_a_fresh_choice(state, shape, kind):
    warm = plugin(kind)
    warm.score(cycle(shape), state, np.arange(len(state)))  # fills the per-GPU cache
    for i in range(len(state)):
        a = warm.select_gpus(cycle(shape), state, i)
        b = plugin(kind).select_gpus(cycle(shape), state, i)
        assert a == b, f"node {i}"


def test_state_groups_put_identical_nodes_together_and_only_them():
    nodes = [make_node(f"n{i}", 8, A100) for i in range(6)]
    state = ClusterState(nodes)
    state.reserve(Assignment(pod_key="a", node="n2", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,)))
    state.reserve(Assignment(pod_key="b", node="n4", cpu_milli=1000, memory_mib=1024, gpu_indices=(3,), gpu_milli=500, gpu_memory_mib=(0,)))
    reps, inv = state_groups(state, np.arange(6))
    assert reps.size == 2
    groups = {int(i): int(inv[i]) for i in range(6)}
    assert groups[2] == groups[4] != groups[0]
    assert len({groups[i] for i in (0, 1, 3, 5)}) == 1
    for i in range(6):  # each node's representative is in the same state
        np.testing.assert_array_equal(state.gpu_free_milli[i], state.gpu_free_milli[reps[inv[i]]])
        assert state.cpu_free[i] == state.cpu_free[reps[inv[i]]]
