"""Property: FGD's node and share scores with the fragment decreases from one C call (``gpufleet._native.fgd``, taken
by ``FGDScore._native_scores``) have the same bits as the Python path (``node_view``, ``take_packed``, the placements
of ``FragDescent._gpu_scores`` and ``_placement_scores``' two ``frag_amount`` calls, C or numpy): one to forty nodes
(past the few-node Python enumeration and ``distinct_placements``' plain-Python size) of one to eight GPUs (some
unusable, two models, free milli on common steps or anywhere), whole-GPU, multi-GPU (fewer than the node's GPUs: which ones are taken shows), share (eligible GPUs marked by the C where the pod asks
no memory or models) and CPU-only pods (GPU memory asked, models allowed or denied), nodes short of CPU, workloads of 1 to 40 shapes (some model-bound, some
CPU-only, frequencies with -0.0).  Inputs the C does not take (MIG pods, a GPU's free milli out of 0..GPU_MILLI, an
empty workload) must leave it (None) for the Python path.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet import native
from gpufleet.engine.framework import Cycle
from gpufleet.engine.model import GPU_MILLI, PodRequest
from gpufleet.engine.plugins.gpufit import eligible_gpus
from gpufleet.engine.state import ClusterState
from gpufleet.policies.paper import fgd
from gpufleet.policies.paper.fgd import FGDScore
from tests.builders import A100, T4, make_node
from tests.policies.native_inputs import bits

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

needs_native = pytest.mark.skipif(native.fgd is None, reason=f"the C extension is not in use ({native.REASON})")

STEPS = np.array([0, 10, 120, 250, 300, 500, 700, 750, 880, 1000])


@st.composite
def cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    g = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.sampled_from([1, 2, 3, 5, 12, 40]))
    nodes = [make_node(f"n{i}", g, A100 if rng.random() < 0.6 else T4, cpu_milli=int(rng.integers(8, 128)) * 1000,
                       memory_mib=int(rng.integers(16, 1024)) * 1024,
                       unhealthy=[j for j in range(1, g) if rng.random() < 0.1]) for i in range(n)]
    state = ClusterState(nodes)
    state.gpu_free_milli[:] = (STEPS[rng.integers(0, STEPS.size, size=(n, g))] if draw(st.booleans())
                               else rng.integers(0, GPU_MILLI + 1, size=(n, g)))
    state.gpu_mem_free[:] = np.where(rng.random((n, g)) < 0.5, state.gpu_mem_cap, state.gpu_mem_cap // 2)
    state.cpu_free[:] = (state.cpu_cap * rng.random(n)).astype(np.int64)
    small = rng.random(n) < 0.4  # CPU short of the workload's shapes (Q3 fails on CPU), some below zero after the pod
    state.cpu_free[small] = rng.integers(-50, 3000, size=int(small.sum()))
    kind = draw(st.sampled_from(["share", "share", "share", "whole", "multi", "multi", "cpu"]))
    allow = draw(st.sampled_from([None, frozenset({A100}), frozenset({T4})]))
    deny = draw(st.sampled_from([frozenset(), frozenset({T4})]))
    cpu, mem = int(rng.integers(0, 40)) * 500, int(rng.integers(0, 64)) * 1024
    if kind == "share":
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem, gpu_count=1,
                       gpu_milli=int(rng.integers(1, GPU_MILLI)) if rng.random() < 0.7 else int(rng.choice([120, 250, 500])),
                       gpu_memory_mib=draw(st.sampled_from([0, 0, 4096, 30_000, 50_000])), gpu_models_allow=allow,
                       gpu_models_deny=deny)
    elif kind in ("whole", "multi"):
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem, gpu_count=1 if kind == "whole" else int(rng.integers(2, max(g, 3))),
                       gpu_milli=GPU_MILLI if kind == "whole" else int(rng.integers(0, GPU_MILLI + 1)),
                       gpu_models_allow=allow)
    else:
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem)
    at = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)).astype(np.intp)
    t = draw(st.sampled_from([1, 3, 9, 17, 40]))
    shapes = []
    for i in range(t):  # the target workload: shares, whole and multi GPUs, CPU-only, some bound to a model
        gm = int(rng.choice([0, 100, 120, 250, 300, 500, 1000]))
        shapes.append(PodRequest(name=f"w{i}", cpu_milli=int(rng.integers(0, 32_000)), memory_mib=1024,
                                 gpu_count=int(rng.choice([1, 1, 2, 4])) if gm else 0, gpu_milli=gm,
                                 gpu_models_allow=frozenset({A100}) if gm and rng.random() < 0.3 else None))
    reps = rng.integers(1, 5, size=t).tolist()
    return state, r, at, [s for s, k in zip(shapes, reps) for _ in range(k)]


def plugin(workload: list[PodRequest]) -> FGDScore:
    p = FGDScore(learn_online=False)
    p.prime(workload)
    return p


def scores(p: FGDScore, state: ClusterState, r: PodRequest, at: np.ndarray) -> np.ndarray:
    c = Cycle(request=r, rng=np.random.default_rng(0))
    if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI:
        return p._gpu_scores(c, state, at)
    return p._node_scores(c, state, at)


@needs_native
@SETTINGS
@given(case=cases(), frag_c=st.booleans(), raw=st.booleans())
def test_c_deltas_give_the_python_scores(case, frag_c, raw):
    """frag_c: the Python side's frag_amount in C too (else numpy's path): both are the reference.  raw: both sides'
    sigmoid left out (the fragment decreases themselves compared: the sigmoid's whole points hide small slips)."""
    state, r, at, workload = case
    c_side = plugin(workload)
    py_side = copy.deepcopy(c_side)
    calls: list[int] = []
    real = native.fgd
    assert real is not None
    with pytest.MonkeyPatch.context() as monkeypatch:
        if raw:
            monkeypatch.setattr(fgd, "_sigmoid_score", lambda d: d + 0.0)
        monkeypatch.setattr(native, "fgd", lambda *a: calls.append(real(*a)) or calls[-1])
        got = scores(c_side, state, r, at)
        assert len(calls) == 1 and calls[0] >= 0  # the C path was taken
        monkeypatch.setattr(native, "fgd", None)
        if not frag_c:
            monkeypatch.setattr(native, "frag_amount", None)
        want = scores(py_side, state, r, at)
    assert got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


@needs_native
def test_inputs_the_c_does_not_take_go_to_python():
    state = ClusterState([make_node("a", 2, A100), make_node("b", 2, A100)])
    p = plugin([PodRequest(name="w", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=500)])
    at = np.arange(2, dtype=np.intp)
    whole = PodRequest(name="p", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=GPU_MILLI)
    share = PodRequest(name="s", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=300)
    elig = np.ones((2, 2), dtype=bool)
    assert p._native_scores(state, at, whole, None) is not None
    assert p._native_scores(state, at, share, elig) is not None
    state.gpu_free_milli[:] = [[300, 1000], [200, 0]]
    state.gpu_usable[1, 0] = False
    plain = p._native_scores(state, at, share, True)  # the C makes eligible_gpus' mask: usable, the milli free
    assert plain is not None
    np.testing.assert_array_equal(plain, p._native_scores(state, at, share, eligible_gpus(state, share, at)))
    assert np.isfinite(plain[0]).all() and np.isneginf(plain[1]).all()
    state.gpu_usable[1, 0] = True
    state.gpu_free_milli[:] = GPU_MILLI
    mig = PodRequest(name="m", cpu_milli=1000, memory_mib=1024, gpu_count=1, mig_profile="1g.10gb")
    assert p._native_scores(state, at, mig, None) is None
    state.gpu_free_milli[0, 1] = GPU_MILLI + 1  # out of the table: Python's path (which then takes numpy's)
    assert p._native_scores(state, at, whole, None) is None
    assert p._native_scores(state, at, share, elig) is None
    assert plugin([])._native_scores(state, at, whole, None) is None  # no workload: frag_amount's zeros


@needs_native
def test_no_eligible_gpu_scores_minus_infinity():
    state = ClusterState([make_node("a", 4, A100), make_node("b", 4, A100)])
    state.gpu_free_milli[0] = [100, 900, 900, 50]
    p = plugin([PodRequest(name="w", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=500)])
    share = PodRequest(name="s", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=300)
    elig = np.array([[False, True, True, False], [False, False, False, False]])
    got = p._native_scores(state, np.arange(2, dtype=np.intp), share, elig)
    assert got is not None
    assert np.isneginf(got[1]).all() and np.isneginf(got[0, [0, 3]]).all() and np.isfinite(got[0, 1:3]).all()
    assert got[0, 1] == got[0, 2]  # the same free milli: one placement
