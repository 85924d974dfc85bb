"""The default policy's terms learned online: GPU-model pressure from pinned pods, stranding over ratio quantiles."""

from __future__ import annotations

import numpy as np

from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies.default import StrandAwareFragScore
from tests.builders import A100, T4, make_node


def req(name: str, cpu: int = 4000, milli: int = 1000, count: int = 1, allow: tuple[str, ...] = ()) -> PodRequest:
    return PodRequest(name=name, cpu_milli=cpu, memory_mib=4096, gpu_count=count, gpu_milli=milli,
                      gpu_models_allow=frozenset(allow) if allow else None)


def cluster() -> ClusterState:
    # 6 A100 nodes (48 GPUs) and 2 T4 nodes (8 GPUs), same CPU/memory per GPU
    nodes = [make_node(f"a{i}", 8, A100, cpu_milli=64_000, memory_mib=262_144) for i in range(6)]
    nodes += [make_node(f"t{i}", 4, T4, cpu_milli=32_000, memory_mib=131_072) for i in range(2)]
    return ClusterState(nodes)


def scores(p: StrandAwareFragScore, state: ClusterState, r: PodRequest) -> np.ndarray:
    return p.score(Cycle(request=r, rng=np.random.default_rng(0)), state, np.arange(len(state)))


def seen(pinned_share: float) -> list[PodRequest]:
    out = []
    for i in range(200):
        allow = (T4,) if i < pinned_share * 200 else ()
        out.append(req(f"w{i}", allow=allow))
    return out


def test_pods_with_a_choice_avoid_the_model_pinned_pods_need():
    state = cluster()
    p = StrandAwareFragScore(learn_online=False)
    p.prime(seen(0.2))  # a fifth of the demand pins T4, which is 1/7 of the GPUs: pressure > 1
    pressure = p._model_pressure(state)
    t4 = state.model_names.index(T4)
    a100 = state.model_names.index(A100)
    assert pressure[t4] > 1.0 and pressure[a100] == 0.0 and pressure[-1] == 0.0
    s = scores(p, state, req("free"))
    assert s[:6].min() > s[6:].max()  # an unpinned pod goes to an A100 node
    # a pod pinned to T4 still scores its only nodes alike (the term is the same on all of them)
    s_pin = scores(p, state, req("pin", allow=(T4,)))
    assert s_pin[6] == s_pin[7]


def test_no_pinned_pods_no_model_term():
    state = cluster()
    a = StrandAwareFragScore(learn_online=False)
    b = StrandAwareFragScore(learn_online=False, model_weight=0.0)
    for p in (a, b):
        p.prime(seen(0.0))
    np.testing.assert_array_equal(scores(a, state, req("x")), scores(b, state, req("x")))


def test_stranding_over_ratio_quantiles_is_smooth_where_the_mean_ratio_is_a_hinge():
    # GPU pods: half want 1 core per GPU, half 15; the mean ratio (8 cores per GPU) strands nothing on a
    # node with 8 cores per free GPU, while the CPU-heavy half could not run there: the quantiles see it
    p = StrandAwareFragScore(learn_online=False, strand_quantiles=4)
    mean_only = StrandAwareFragScore(learn_online=False, strand_quantiles=0)
    workload = [req(f"l{i}", cpu=1000) for i in range(50)] + [req(f"h{i}", cpu=15000) for i in range(50)]
    for x in (p, mean_only):
        x.prime(workload)
    cpu = np.array([32_000.0])
    gpu = np.full((1, 4), 1000)
    mem = np.array([1e9])
    assert mean_only._penalty(cpu, gpu, mem)[0] == 0.0
    assert p._penalty(cpu, gpu, mem)[0] > 0.0
    np.testing.assert_allclose(p._rho_quantiles(), [1.0, 1.0, 15.0, 15.0])
