"""Property: the C descent measure (``gpufleet._native.measure``, taken by ``DescentScore._measure``) has the same
bits as the numpy path (``_measure_numpy``), the reference it stands for: few and many states, one to hundreds of
shapes (numpy's pairwise sum over shapes: under 8, 8 to 128, halved above), ratio quantiles 1 to 12 (one state: a
pairwise sum too) or the mean ratio, memory stranding on and off, no stranded term, free milli at 0 and GPU_MILLI,
fractions of -0.0, CPU per shape as int64 or float64, models as int32 or int64.  Inputs the C does not take (another
dtype or layout, milli out of 0..GPU_MILLI, a model out of range, weights that are ints) must leave it (False) and
take the numpy path, whose answer (or error) the caller then gets.

With ``GPUFLEET_REQUIRE_NATIVE=1`` (CI, after ``pip install``) a missing extension fails here instead of every figure
silently measuring the numpy path.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet import native
from gpufleet.engine.model import GPU_MILLI, PodRequest
from gpufleet.policies.default import DescentArgs, DescentScore, WorkloadArgs, WorkloadModel
from tests.policies.native_inputs import bits, free_milli, workloads

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

needs_native = pytest.mark.skipif(not native.ACTIVE, reason=f"the C extension is not in use ({native.REASON})")


def test_required_extension_is_active():
    if os.environ.get("GPUFLEET_REQUIRE_NATIVE") == "1":
        assert native.ACTIVE, f"GPUFLEET_REQUIRE_NATIVE=1 but gpufleet._native is not in use: {native.REASON}"
    assert native.describe().startswith("native: ")


def plugin(args: DescentArgs) -> DescentScore:
    p = DescentScore(args, model=WorkloadModel(WorkloadArgs(learn_online=False)))
    p.prime([PodRequest(name=f"w{i}", cpu_milli=c, memory_mib=m, gpu_count=n, gpu_milli=g)
             for i, (c, g, n, m) in enumerate([(4000, 1000, 1, 16384), (2000, 500, 1, 8192), (1000, 250, 1, 4096),
                                               (6000, 300, 1, 2048), (3000, 120, 1, 4096)] * 3)])
    return p


@st.composite
def states(draw):
    s = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 5, 8, 17, 70]))  # one state: the quantiles' sum is pairwise
    g = draw(st.sampled_from([1, 2, 4, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gpu = free_milli(draw, rng, s, g)
    # small CPU against the GPU milli: stranded terms with fractions, where the order of the quantiles' sum shows
    cpu = rng.integers(-50, 700, size=s) if draw(st.booleans()) else rng.integers(-2000, 96_000, size=s)
    if draw(st.booleans()):
        cpu[rng.random(s) < 0.3] = 0
    mem = rng.integers(-4096, 400_000, size=s)
    model = rng.integers(-1, 2, size=s).astype(draw(st.sampled_from([np.int32, np.int64])))
    return cpu, gpu.astype(np.int64), mem, model


def rates(draw_kind: str, p: DescentScore) -> None:
    """The workload's GPU milli, CPU milli and memory sums _measure reads (``_rates``), including a zero GPU sum
    (no stranded term) and no memory (no memory stranding)."""
    g, c, m = {"usual": (1_783_150.0, 16_610_644.0, 55_574_420.0), "no_gpu": (0.0, 1_000.0, 5_000.0),
               "no_mem": (298_750.0, 1_024_000.0, 0.0), "tiny_cpu": (5_000.0, 0.5, 1.0)}[draw_kind]
    p._rates = (p.model.version, g, c, m)


@needs_native
@pytest.mark.parametrize("q", [0, 1, 4, 7, 8, 9, 12])
@SETTINGS
@given(st_=states(), tw=workloads(signs=("positive", "some")), memory=st.booleans(),
       rate=st.sampled_from(["usual", "no_gpu", "no_mem", "tiny_cpu"]),
       weights=st.sampled_from([(16.0, 8.0), (1e-3, 3.7), (0.3, 1e6)]))
def test_c_measure_equals_numpy_measure(st_, tw, q, memory, rate, weights):
    cpu, gpu, mem, model = st_
    p = plugin(DescentArgs(memory_strand=memory, strand_weight=weights[0], sliver_weight=weights[1]))
    acc = tw.access(["A100", "T4"])
    rates(rate, p)
    p._q_rhos = np.random.default_rng(q).uniform(1e-3, 3.0, q) if q else None
    want = p._measure_numpy(cpu, gpu, mem, model, tw, acc)
    table, count, cpu_t = p._gpu_table(tw)
    out = np.full(cpu.shape[0], np.nan)
    _, g_milli, c_milli, m_mib = p._rates
    took = native.measure(out, cpu, gpu, mem, model, (tw.gpu_milli > 0) & acc, table, count, cpu_t, tw.freq, p._q_rhos,
                          g_milli / max(c_milli, 1.0), g_milli / m_mib if m_mib > 0 else 0.0, g_milli > 0,
                          memory and m_mib > 0, weights[0], weights[1])
    assert took is True
    np.testing.assert_array_equal(bits(out), bits(want))
    np.testing.assert_array_equal(bits(p._measure(cpu, gpu, mem, model, tw, acc)), bits(want))


@needs_native
def test_inputs_the_c_does_not_take_go_to_numpy():
    rng = np.random.default_rng(5)
    p = plugin(DescentArgs())
    tw = p.model.workload
    assert tw is not None
    acc = tw.access(["A100"])
    gpu = rng.integers(0, GPU_MILLI + 1, size=(4, 8))
    cpu, mem, model = rng.integers(0, 64_000, 4), rng.integers(0, 262_144, 4), np.zeros(4, dtype=np.int64)
    table, count, cpu_t = p._gpu_table(tw)
    ok = (tw.gpu_milli > 0) & acc

    def c(gpu=gpu, cpu=cpu, model=model, ok=ok, table=table):
        out = np.full(4, 7.0)
        took = native.measure(out, cpu, gpu, mem, model, ok, table, count, cpu_t, tw.freq, None, 0.1, 0.01, True, True,
                              16.0, 8.0)
        assert took or (out == 7.0).all()  # nothing written where it declines
        return took

    assert c()
    for bad in (gpu.astype(np.int32), np.asfortranarray(gpu), np.where(gpu == gpu.max(), -1, gpu),
                np.where(gpu == gpu.max(), GPU_MILLI + 1, gpu), gpu[:, :0]):
        assert not c(gpu=bad)
    assert not c(cpu=cpu.astype(np.float64))
    assert not c(model=np.full(4, acc.shape[0]))  # out of range: numpy raises, below
    assert not c(model=np.full(4, -acc.shape[0] - 1))
    assert c(model=np.full(4, -acc.shape[0]))  # the first row, counted from the end
    assert not c(ok=ok.astype(np.int8))
    with pytest.raises(IndexError):
        p._measure(cpu, gpu, mem, np.full(4, acc.shape[0]), tw, acc)
    for bad_gpu in (np.where(gpu == gpu.max(), -1, gpu), np.where(gpu == gpu.max(), GPU_MILLI + 1, gpu), gpu.astype(np.int32)):
        np.testing.assert_array_equal(bits(p._measure(cpu, bad_gpu, mem, model, tw, acc)),
                                      bits(p._measure_numpy(cpu, bad_gpu, mem, model, tw, acc)))
    # int weights: numpy multiplies the sliver sum as int64; the C is not asked
    q = plugin(DescentArgs(strand_weight=16, sliver_weight=8))
    np.testing.assert_array_equal(bits(q._measure(cpu, gpu, mem, model, tw, acc)), bits(q._measure_numpy(cpu, gpu, mem, model, tw, acc)))
