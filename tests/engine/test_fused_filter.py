"""The one-pass filter phase (``Scheduler._fused_filter``, ``gpufleet._native.fit``) against the filters run one by one.

A trace pod's filters are NodeResourcesFit then GpuFit; where the extension is built the framework computes both
verdicts, the feasible mask, the candidates and each node's first rejection in one C pass.  On random clusters (nodes
without pod slots, whole and shared GPUs taken) and random plain pods (whole GPUs, shares, none, some nothing can
take), placed and removed in between, two schedulers, one fusing and one not, must give the same decisions,
statuses, feasible masks, candidates, per-node first failures and diagnoses (reason counts in order, plugins, per-node
reasons), also when the diagnosis is asked after later cycles changed the state.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet import native
from gpufleet.engine.framework import Scheduler, feasible_reason_counts
from gpufleet.engine.model import PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from tests.engine.builders import gpu_node

pytestmark = pytest.mark.skipif(native.fit is None, reason=f"gpufleet._native.fit not in use ({native.describe()})")


@st.composite
def clusters(draw):
    return [gpu_node(f"n{i}", gpus=draw(st.integers(0, 4)), cpu_milli=draw(st.sampled_from([2_000, 8_000, 32_000])),
                     mem_mib=draw(st.sampled_from([4_000, 64_000])), max_pods=draw(st.sampled_from([1, 2, 110])))
            for i in range(draw(st.integers(1, 9)))]


@st.composite
def plain_pods(draw, i):
    kind = draw(st.sampled_from(["none", "whole", "share", "share-mem", "two-shares"]))
    kw: dict = {}
    if kind == "whole":
        kw = {"gpu_count": draw(st.integers(1, 5)), "gpu_milli": 1_000}
    elif kind == "share":
        kw = {"gpu_count": 1, "gpu_milli": draw(st.sampled_from([100, 500, 999]))}
    elif kind == "share-mem":  # GpuFit's per-shape path: not fused, still compared
        kw = {"gpu_count": 1, "gpu_milli": 300, "gpu_memory_mib": 4_000}
    elif kind == "two-shares":
        kw = {"gpu_count": 2, "gpu_milli": 400}
    return PodRequest(f"p{i}", cpu_milli=draw(st.sampled_from([0, 500, 4_000, 40_000])),
                      memory_mib=draw(st.sampled_from([0, 1_000, 30_000, 100_000])), **kw)


def _same(a, b):
    assert (a.ok, a.status.code, a.status.reasons, a.status.plugin) == (b.ok, b.status.code, b.status.reasons, b.status.plugin)
    assert (a.assignment, a.score, a.feasible_nodes) == (b.assignment, b.score, b.feasible_nodes)
    if a.diagnosis is None or b.diagnosis is None:
        assert a.diagnosis is b.diagnosis is None
    else:
        assert (list(a.diagnosis.counts.items()), a.diagnosis.plugins, a.diagnosis.by_node, a.diagnosis.total_nodes) == \
            (list(b.diagnosis.counts.items()), b.diagnosis.plugins, b.diagnosis.by_node, b.diagnosis.total_nodes)


def _same_cycle(on: Scheduler, off: Scheduler, r: PodRequest, fused: list[int]) -> tuple:
    """Decide ``r`` on both; the cycles' masks, candidates, reasons and first failures agree.  Returns the cycles."""
    c1, c2 = on.new_cycle(r), off.new_cycle(r)
    d1, d2 = on.decide(c1), off.decide(c2)
    assert c2._fused is None
    fused[0] += c1._fused is not None
    _same(d1, d2)
    assert c1.feasible is not None and c2.feasible is not None
    assert c1.feasible.dtype == c2.feasible.dtype and (c1.feasible == c2.feasible).all()
    assert c1.candidates is not None and c2.candidates is not None
    assert c1.candidates.dtype == c2.candidates.dtype and c1.candidates.tolist() == c2.candidates.tolist()
    assert (c1.fail_reasons, c1.rejected_by) == (c2.fail_reasons, c2.rejected_by)
    assert list(on.diagnosis(c1).counts.items()) == list(off.diagnosis(c2).counts.items())
    return c1, c2


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fused_filter_phase_changes_nothing(data):
    ns = data.draw(clusters())
    policy = data.draw(st.sampled_from(["bestfit", "default", "fgd"]))
    on = Scheduler(build_profile(policy), ClusterState(ns), seed=3)
    off = Scheduler(build_profile(policy), ClusterState(ns), seed=3)
    off.fuse_filters = False
    placed: list[str] = []
    fused = [0]
    kept: list[tuple] = []  # cycles whose diagnosis is asked again after later changes
    for i in range(data.draw(st.integers(1, 16))):
        if data.draw(st.integers(0, 5)) == 0 and placed:
            k = placed.pop(data.draw(st.integers(0, len(placed) - 1)))
            on.forget(k)
            off.forget(k)
            continue
        r = data.draw(plain_pods(i))
        c1, c2 = _same_cycle(on, off, r, fused)
        kept.append((c1, c2))
        _same(on.explain(r), off.explain(r))
        a, b = on.schedule(r), off.schedule(r)
        _same(a, b)
        if a.ok:
            placed.append(r.key)
    for c1, c2 in kept:  # made from the pass's own bytes: later changes to the state do not move them
        assert list(on.diagnosis(c1).counts.items()) == list(off.diagnosis(c2).counts.items())
        assert on.diagnosis(c1, by_node=True).by_node == off.diagnosis(c2, by_node=True).by_node
        assert (c1.first_fail == c2.first_fail).all()
        assert feasible_reason_counts(c1) == feasible_reason_counts(c2)


def test_the_fused_pass_is_taken_and_names_both_filters():
    ns = [gpu_node("a", gpus=1), gpu_node("b", gpus=2, cpu_milli=1_000), gpu_node("c", gpus=0)]
    s = Scheduler(build_profile("bestfit"), ClusterState(ns), seed=3)
    cycle = s.new_cycle(PodRequest("big", cpu_milli=2_000, gpu_count=2, gpu_milli=1_000))
    d = s.decide(cycle)
    assert cycle._fused is not None  # the C pass ran
    assert not d.ok and d.diagnosis is not None
    assert d.diagnosis.plugins == ("NodeResourcesFit", "GpuFit")
    assert list(d.diagnosis.counts.items()) == [("Insufficient cpu", 1), ("Insufficient nvidia.com/gpu", 2)]
    assert cycle.first_fail is not None and cycle.first_fail.tolist() == [3, 1, 3]


def test_a_declined_input_takes_the_filters(monkeypatch):
    calls = []

    def declines(*args):
        calls.append(args)
        return None

    monkeypatch.setattr(native, "fit", declines)
    s = Scheduler(build_profile("bestfit"), ClusterState([gpu_node("a", gpus=1), gpu_node("b")]), seed=3)
    cycle = s.new_cycle(PodRequest("p", cpu_milli=100, gpu_count=1, gpu_milli=1_000))
    d = s.decide(cycle)
    assert calls and cycle._fused is None
    assert d.ok and d.assignment is not None and d.assignment.node == "a"
    assert cycle.candidates is not None and cycle.candidates.tolist() == [0]
    assert list(s.diagnosis(cycle).counts.items()) == [("Insufficient nvidia.com/gpu", 1)]
    assert np.array_equal(cycle.first_fail, [-1, 0])


@pytest.mark.skipif(native.top is None, reason="gpufleet._native.top not in use")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1.0 - 5e-10, 1.0 - 2e-9, 100.0, float("inf"), float("-inf")]),
                          st.floats(allow_nan=True, width=64)), min_size=0, max_size=40))
def test_top_is_pick_s_numpy_compare(values):
    """``native.top``: the count and first position of ``scores >= scores.max() - 1e-9``; None for NaN or empty."""
    assert native.top is not None
    scores = np.array(values, dtype=np.float64)
    got = native.top(scores)
    if scores.size == 0 or np.isnan(scores).any():
        assert got is None
        return
    ties = (scores >= np.maximum.reduce(scores) - 1e-9).nonzero()[0]
    assert got == (ties.size, int(ties[0]))
    assert native.top(scores.view(np.int64)) is None  # not float64: declined
    if scores.size > 2:
        assert native.top(scores[::2]) is None  # not contiguous: declined
