"""Property: the default's node and share scores in one C call (``gpufleet._native.descent``, taken by
``DescentScore._native_scores``) have the same bits as the Python path around the measure (``node_view``,
``take_packed``, the placements of ``FragDescent._gpu_scores``, ``_descent`` and ``_share_tables``' terms), and leave
the same before-cache: one to a dozen nodes of one to eight GPUs (some unusable, two models), each stale or not,
whole-GPU, share, MIG and CPU-only pods (GPU memory asked, models allowed or denied), ratio quantiles (1, 4, 9: one
state's sum is pairwise) or the mean ratio, memory stranding on and off, no quantising, share patterns and the
share-fit term on and off.  Inputs the C does not take (a GPU's free milli out of 0..GPU_MILLI, int weights) must
leave it (None) for the Python path.
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
from gpufleet.engine.state import ClusterState
from tests.builders import A100, T4, make_node
from tests.policies.default.test_policy import Parts
from tests.policies.native_inputs import bits

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

needs_native = pytest.mark.skipif(native.descent is None, reason=f"the C extension is not in use ({native.REASON})")

WORKLOAD = [(4000, 1000, 1, 16384), (2000, 500, 1, 8192), (1000, 250, 1, 4096), (6000, 300, 1, 2048),
            (3000, 120, 1, 4096), (16000, 1000, 4, 65536), (8000, 1000, 2, 32768), (2000, 0, 0, 4096),
            (3700, 330, 1, 1024), (5100, 700, 1, 3000), (900, 170, 1, 512), (7300, 1000, 3, 9000)]  # ratios of all sorts


@st.composite
def cases(draw, single: bool = False):
    """single: one node whose before-state is known, 9 ratio quantiles in use, CPU short: the measure's batch is
    one after-state where the pod has one placement (numpy's quantile mean is then a pairwise sum)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    g = draw(st.sampled_from([1, 2, 4, 8]))
    n = 1 if single else draw(st.integers(1, 12))
    nodes = [make_node(f"n{i}", g, A100 if rng.random() < 0.6 else T4, cpu_milli=int(rng.integers(8, 128)) * 1000,
                       memory_mib=int(rng.integers(16, 1024)) * 1024,
                       unhealthy=[j for j in range(1, g) if rng.random() < 0.1]) for i in range(n)]
    state = ClusterState(nodes)
    steps = np.array([0, 10, 120, 250, 300, 500, 700, 750, 880, 1000])
    free = steps[rng.integers(0, steps.size, size=(n, g))] if draw(st.booleans()) else rng.integers(0, GPU_MILLI + 1, size=(n, g))
    state.gpu_free_milli[:] = free
    state.gpu_mem_free[:] = np.where(rng.random((n, g)) < 0.5, state.gpu_mem_cap, state.gpu_mem_cap // 2)
    state.cpu_free[:] = (state.cpu_cap * rng.random(n)).astype(np.int64) - (rng.random(n) < 0.1) * 500
    small = (rng.random(n) < 0.5) | single  # CPU short of the GPUs: stranded terms with fractions (the quantiles' sum order shows)
    state.cpu_free[small] = rng.integers(-50, 3000, size=int(small.sum()))
    state.mem_free[:] = (state.mem_cap * rng.random(n)).astype(np.int64)
    kind = draw(st.sampled_from(["whole", "cpu"] if single else ["share", "share", "whole", "multi", "cpu", "mig"]))
    allow = draw(st.sampled_from([None, frozenset({A100}), frozenset({T4})]))
    deny = draw(st.sampled_from([frozenset(), frozenset({T4})]))
    cpu, mem = int(rng.integers(0, 40 if not single else 2)) * 500, int(rng.integers(0, 64)) * 1024
    if kind == "share":
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem, gpu_count=1, gpu_milli=int(rng.integers(1, GPU_MILLI)),
                       gpu_memory_mib=draw(st.sampled_from([0, 0, 4096, 30_000])), gpu_models_allow=allow,
                       gpu_models_deny=deny)
    elif kind in ("whole", "multi"):
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem, gpu_count=1 if kind == "whole" else int(rng.integers(1, 9)),
                       gpu_milli=GPU_MILLI if kind == "whole" else int(rng.integers(0, GPU_MILLI + 1)),
                       gpu_models_allow=allow)
    elif kind == "mig":
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem, gpu_count=1, mig_profile="1g.10gb")
    else:
        r = PodRequest(name="p", cpu_milli=cpu, memory_mib=mem)
    at = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)).astype(np.intp)
    fresh = (rng.random(n) < 0.5) | single  # nodes whose before-state is measured first (then possibly changed again)
    changed = rng.random(n) < (0.5 if single else 0.3)  # single: a stale node makes the batch two states
    kw = dict(strand_quantiles=9 if single else draw(st.sampled_from([0, 1, 4, 9])), memory_strand=draw(st.booleans()),
              quant_milli=draw(st.sampled_from([40.0, 0.0, 7.0])), share_fit=draw(st.sampled_from([0.5, 0.0])),
              pattern_weight=draw(st.sampled_from([50.0, 0.0])), pattern_penalty=draw(st.sampled_from([50.0, 0.0])))
    if single or draw(st.booleans()):  # quantiles wherever CPU is tight at all
        kw.update(quantile_tight=0.0, quantile_tight_max=1e9)
    # the workload's CPU per shape: the table's, or any (ratios of all sorts: quantiles that differ)
    cpus = [c for c, _, _, _ in WORKLOAD] if draw(st.booleans()) else rng.integers(100, 20_000, size=len(WORKLOAD)).tolist()
    return state, r, at, fresh, changed, dict(kw, cpus=cpus)


def plugin(kw: dict) -> Parts:
    kw = dict(kw)
    cpus = kw.pop("cpus", [c for c, _, _, _ in WORKLOAD])
    p = Parts(learn_online=False, **kw)
    p.prime([PodRequest(name=f"w{i}", cpu_milli=cpus[i % len(WORKLOAD)], memory_mib=m, gpu_count=n, gpu_milli=g)
             for i, (_, g, n, m) in enumerate(WORKLOAD * 3)])
    return p


def scores(d, state: ClusterState, r: PodRequest, at: np.ndarray) -> np.ndarray:
    c = Cycle(request=r, rng=np.random.default_rng(0))
    if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI and not r.mig_profile:
        return d._gpu_scores(c, state, at)
    return d._node_scores(c, state, at)


@needs_native
@SETTINGS
@given(case=cases())
def test_c_scores_equal_python_scores(case):
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(case, monkeypatch)


@needs_native
@SETTINGS
@given(case=cases(single=True))
def test_c_scores_of_a_single_state_batch_equal_python_scores(case):
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(case, monkeypatch)


def check(case, monkeypatch) -> None:
    state, r, at, fresh, changed, kw = case
    d = plugin(kw).descent
    warm = np.flatnonzero(fresh).astype(np.intp)
    if warm.size:  # some before-states known (by the Python path), some of those nodes changed since
        monkeypatch.setattr(native, "descent", None)
        scores(d, state, PodRequest(name="w", cpu_milli=1000, memory_mib=1024), warm)
        monkeypatch.undo()
    state.version[changed] += 1
    state.cpu_free[changed] -= 100
    c_side, py_side = d, copy.deepcopy(d)
    calls = []
    real = native.descent
    monkeypatch.setattr(native, "descent", lambda *a: calls.append(real(*a)) or calls[-1])
    got = scores(c_side, state, r, at)
    assert calls == [True]  # the C path was taken
    monkeypatch.setattr(native, "descent", None)
    want = scores(py_side, state, r, at)
    np.testing.assert_array_equal(bits(got), bits(want))
    for a, b in zip(c_side._before_cache(state), py_side._before_cache(state)):
        np.testing.assert_array_equal(bits(a) if a.dtype.kind == "f" else a, bits(b) if b.dtype.kind == "f" else b)


@needs_native
def test_inputs_the_c_does_not_take_go_to_python(monkeypatch):
    state = ClusterState([make_node("a", 2, A100), make_node("b", 2, A100)])
    d = plugin({}).descent
    at = np.arange(2, dtype=np.intp)
    r = PodRequest(name="p", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=GPU_MILLI)
    assert d._native_scores(state, at, r, None, 1, None, None) is not None
    state.gpu_free_milli[0, 1] = GPU_MILLI + 1  # out of the table: Python's path (which then takes frag_amount's)
    state.version[0] += 1
    assert d._native_scores(state, at, r, None, 1, None, None) is None
    state.gpu_free_milli[0, 1] = GPU_MILLI
    assert d._native_scores(state, at.astype(np.int32), r, None, 1, None, None) is None  # int32 node numbers
    assert d._native_scores(state, at[::-1][::2].copy(), r, None, 1, None, None) is not None
    d.args = type(d.args)(strand_weight=16)  # an int weight: Python's path, as the C measure's
    assert d._native_scores(state, at, r, None, 1, None, None) is None
