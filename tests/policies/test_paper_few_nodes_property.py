"""Property: the paper policies' scores of a few nodes, computed node by node in Python, are bit for bit what the
vectorised computation gives for the same nodes (the framework rescores the one to four nodes whose version moved
that way, and the whole cluster, or many nodes, with numpy): a decision must not depend on which path ran."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import GPU_MILLI, Assignment, Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.paper import BestFitScore, DotProductScore, GpuClusteringScore, GpuPackingScore
from gpufleet.policies.paper._common import FEW_NODES

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = [(4000, 1000, 1), (2000, 500, 1), (1000, 250, 1), (8000, 1000, 2), (6000, 300, 1), (96000, 1000, 8),
          (500, 0, 0), (3000, 810, 1)]


@st.composite
def cluster(draw) -> ClusterState:
    """20-40 nodes with 0 to 8 GPUs (some unhealthy), partly used by random pods."""
    n = draw(st.integers(FEW_NODES + 12, 40))
    nodes = [Node(f"n{i}", draw(st.sampled_from([32_000, 64_000, 96_000, 128_000])), 262_144,
                  tuple(Gpu(j, f"g{i}-{j}", "A100" if i % 2 else "T4", 16_000, healthy=draw(st.integers(0, 9)) > 0)
                        for j in range(draw(st.sampled_from([0, 1, 2, 4, 8])))))
             for i in range(n)]
    state = ClusterState(nodes)
    for k in range(draw(st.integers(0, 80))):
        i = draw(st.integers(0, n - 1))
        c, m, cnt = draw(st.sampled_from(SHAPES[:-2]))
        free = np.flatnonzero(state.gpu_usable[i] & (state.gpu_free_milli[i] >= m))
        if free.size < cnt or state.cpu_free[i] < c:
            continue
        gpus = tuple(int(g) for g in draw(st.permutations(free.tolist()))[:cnt])
        state.reserve(Assignment(pod_key=f"x{k}", node=nodes[i].name, cpu_milli=c, memory_mib=4096, gpu_indices=gpus,
                                 gpu_milli=m, gpu_memory_mib=(0,) * cnt if m < GPU_MILLI else tuple(int(state.gpu_mem_cap[i, g]) for g in gpus)))
    return state


@SETTINGS
@given(state=cluster(), shape=st.sampled_from(SHAPES), data=st.data())
def test_few_nodes_score_as_the_vectorised_path(state: ClusterState, shape: tuple[int, int, int], data) -> None:
    c, m, cnt = shape
    cyc = Cycle(request=PodRequest(name="p", cpu_milli=c, memory_mib=4096, gpu_count=cnt, gpu_milli=m), rng=np.random.default_rng(0))
    everyone = np.arange(len(state))
    few = np.array(sorted(data.draw(st.sets(st.integers(0, len(state) - 1), min_size=1, max_size=FEW_NODES))))
    for plugin in (BestFitScore(), DotProductScore(), GpuPackingScore(), GpuClusteringScore()):
        whole = plugin.score(cyc, state, everyone)  # more than FEW_NODES nodes: numpy
        got = plugin.score(cyc, state, few)
        assert got.dtype == np.float64 and got.shape == few.shape
        want = whole[few]
        assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), plugin.name


@SETTINGS
@given(raw=st.lists(st.integers(-50, 120), min_size=1, max_size=30))
def test_bestfit_normalize(raw: list[int]) -> None:
    """Best-fit's min-max onto 0..100, floored: the formula as written, for float and integer raw scores."""
    for a in (np.array(raw, dtype=np.float64), np.array(raw, dtype=np.int64)):
        lo, hi = a.min(), a.max()
        want = np.zeros(a.size) if hi == lo else np.floor((a - lo) * 100 / (hi - lo))
        got = BestFitScore().normalize(a)
        assert got.dtype == np.float64 and np.array_equal(got, want)


@SETTINGS
@given(state=cluster(), shape=st.sampled_from(SHAPES), cpu=st.integers(0, 40_000), memory=st.integers(0, 100_000))
def test_scores_read_only_what_their_cache_key_holds(state: ClusterState, shape: tuple[int, int, int], cpu: int,
                                                     memory: int) -> None:
    """The framework caches a plugin's scores per cache key: two pods with one key must score every node alike."""
    c, m, cnt = shape
    everyone = np.arange(len(state))
    a = Cycle(request=PodRequest(name="a", cpu_milli=c, memory_mib=4096, gpu_count=cnt, gpu_milli=m), rng=np.random.default_rng(0))
    for plugin in (BestFitScore(), DotProductScore(), GpuPackingScore(), GpuClusteringScore()):
        variants = [PodRequest(name="b", cpu_milli=cpu, memory_mib=memory, gpu_count=cnt, gpu_milli=m),  # another CPU
                    PodRequest(name="c", cpu_milli=c, memory_mib=memory, gpu_count=1 if cnt else 0, gpu_milli=m * cnt),
                    PodRequest(name="d", cpu_milli=c, memory_mib=memory, gpu_count=cnt, gpu_milli=m,
                               gpu_models_allow=frozenset({"A100"})),
                    PodRequest(name="e", cpu_milli=c, memory_mib=4096, gpu_count=cnt + 1 if cnt else 0, gpu_milli=m)]
        for r in variants:
            b = Cycle(request=r, rng=np.random.default_rng(0))
            if plugin.cache_key(b) == plugin.cache_key(a):
                assert np.array_equal(plugin.score(b, state, everyone), plugin.score(a, state, everyone)), (plugin.name, r)
