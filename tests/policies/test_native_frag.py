"""Property: FGD's ``frag_amount`` in C (``gpufleet._native.frag_amount``, taken by ``workload.frag_amount``'s table
path) has the same bits as the numpy path (``_frag_amount_numpy``, the reference it stands for): one to 2,048 states,
one to 300 shapes (numpy's pairwise sum over shapes: under 8, 8 to 128, halved above), free milli at 0 and GPU_MILLI,
frequencies of -0.0, CPU per shape as int64 or float64, models as int32 or int64 (negative: from the end).  Inputs the
C does not take (another dtype or layout, milli out of 0..GPU_MILLI, no GPUs, a model out of range, more states than
the table path takes) must leave it (False, nothing written) and take the numpy path, whose answer (or error) the
caller then gets.  ``GPUFLEET_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet import native
from gpufleet.engine.model import GPU_MILLI
from gpufleet.policies.paper import workload
from tests.policies.native_inputs import bits, free_milli, workloads
from gpufleet.policies.paper.workload import (TABLE_MAX_ROWS, TargetWorkload, _direct_consts, _frag_amount_direct,
                                              _frag_amount_numpy, _gpu_table, frag_amount)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

needs_native = pytest.mark.skipif(native.frag_amount is None, reason=f"the C frag_amount is not in use ({native.describe()})")


@st.composite
def states(draw):
    s = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 5, 8, 17, 70, 300, TABLE_MAX_ROWS]))
    g = draw(st.sampled_from([1, 2, 4, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gpu = free_milli(draw, rng, s, g)
    cpu = rng.integers(-2000, 96_000, size=s)
    if draw(st.booleans()):
        cpu[rng.random(s) < 0.3] = 0
    model = rng.integers(-3, 3, size=s).astype(draw(st.sampled_from([np.int32, np.int64])))  # [-3, 3): every row
    return cpu.astype(np.int64), gpu, model


def c_frag(out, cpu, gpu, model, acc, tw, table=None):
    assert native.frag_amount is not None
    return native.frag_amount(out, cpu, gpu, model, acc, _direct_consts(tw)[1], _gpu_table(tw) if table is None else table,
                              tw.gpu_count, tw.cpu_milli, tw.freq)


@needs_native
@SETTINGS
@given(st_=states(), tw=workloads())
def test_c_frag_amount_equals_numpy(st_, tw):
    cpu, gpu, model = st_
    acc = tw.access(["A100", "T4"])  # 3 rows: models 0, 1 and none (-1)
    want = _frag_amount_numpy(cpu, gpu, model, tw, acc)
    out = np.full(cpu.shape[0], np.nan)
    assert c_frag(out, cpu, gpu, model, acc, tw) is True
    np.testing.assert_array_equal(bits(out), bits(want))
    np.testing.assert_array_equal(bits(frag_amount(cpu, gpu, model, tw, acc)), bits(want))
    if cpu.shape[0] <= 8:  # and the direct [S, T, G] form, which the numpy table path stands for
        np.testing.assert_array_equal(bits(_frag_amount_direct(cpu, gpu, model, tw, acc)), bits(want))


@needs_native
def test_inputs_the_c_does_not_take_go_to_numpy():
    rng = np.random.default_rng(7)
    tw = TargetWorkload(cpu_milli=np.array([4000, 2000, 0], dtype=np.int64), gpu_milli=np.array([1000, 250, 0]),
                        gpu_count=np.array([2, 1, 0]), freq=np.array([0.5, 0.3, 0.2]),
                        models=(frozenset({"A100"}), None, None))
    acc = tw.access(["A100"])
    gpu = rng.integers(0, GPU_MILLI + 1, size=(4, 8))
    cpu, model = rng.integers(0, 64_000, 4), np.zeros(4, dtype=np.int64)

    def c(gpu=gpu, cpu=cpu, model=model, acc=acc, tw=tw, table=None, out=None):
        out = np.full(4, 7.0) if out is None else out
        took = c_frag(out, cpu, gpu, model, acc, tw, table)
        assert took or (out == 7.0).all()  # nothing written where it declines
        return took

    assert c()
    for bad in (gpu.astype(np.int32), gpu.astype(np.float64), np.asfortranarray(gpu), gpu[:, ::2],
                np.where(gpu == gpu.max(), -1, gpu), np.where(gpu == gpu.max(), GPU_MILLI + 1, gpu), gpu[:, :0],
                gpu[:3]):
        assert not c(gpu=bad)
    assert not c(cpu=cpu.astype(np.float64))
    assert not c(cpu=cpu.astype(np.int32))
    assert not c(model=np.full(4, acc.shape[0]))  # out of range: numpy raises, below
    assert not c(model=np.full(4, -acc.shape[0] - 1))
    assert not c(model=model.astype(np.int16))
    assert c(model=np.full(4, -acc.shape[0]))  # the first row, counted from the end
    assert not c(acc=acc.astype(np.int8))
    assert not c(acc=acc[:, :2])
    assert not c(table=_gpu_table(tw)[:, :-1])
    assert not c(table=_gpu_table(tw).astype(np.int32))
    assert not c(out=np.full(4, 7.0, dtype=np.float32))
    assert not c(out=np.full(3, 7.0))
    for field, value in (("freq", tw.freq.astype(np.float32)), ("gpu_count", tw.gpu_count.astype(np.int32)),
                         ("cpu_milli", tw.cpu_milli.astype(np.int32))):
        other = TargetWorkload(**{**{k: getattr(tw, k) for k in ("cpu_milli", "gpu_milli", "gpu_count", "freq", "models")},
                                  field: value})
        assert not c(tw=other)
        np.testing.assert_array_equal(bits(frag_amount(cpu, gpu, model, other, acc)),
                                      bits(_frag_amount_numpy(cpu, gpu, model, other, acc)))
    with pytest.raises(IndexError):
        frag_amount(cpu, gpu, np.full(4, acc.shape[0]), tw, acc)
    for bad_gpu in (np.where(gpu == gpu.max(), -1, gpu), np.where(gpu == gpu.max(), GPU_MILLI + 1, gpu),
                    gpu.astype(np.int32), np.asfortranarray(gpu), gpu[:, :0]):
        np.testing.assert_array_equal(bits(frag_amount(cpu, bad_gpu, model, tw, acc)),
                                      bits(_frag_amount_numpy(cpu, bad_gpu, model, tw, acc)))
    assert frag_amount(cpu[:0], gpu[:0], model[:0], tw, acc).shape == (0,)


@needs_native
def test_more_states_than_the_table_path_take_numpy(monkeypatch):
    """Above TABLE_MAX_ROWS (the yardstick's thousands of states) the binned numpy path runs; the C is not asked."""
    asked = []
    real = native.frag_amount
    monkeypatch.setattr(native, "frag_amount", lambda out, *a: asked.append(out.size) or real(out, *a))
    rng = np.random.default_rng(3)
    tw = TargetWorkload(cpu_milli=np.array([1000, 0]), gpu_milli=np.array([500, 0]), gpu_count=np.array([1, 0]),
                        freq=np.array([0.75, 0.25]), models=(None, None))
    acc = tw.access([])
    for s in (TABLE_MAX_ROWS, TABLE_MAX_ROWS + 1):
        gpu = rng.integers(0, GPU_MILLI + 1, size=(s, 8))
        cpu, model = rng.integers(0, 9000, s), np.full(s, -1)
        np.testing.assert_array_equal(bits(workload.frag_amount(cpu, gpu, model, tw, acc)),
                                      bits(_frag_amount_numpy(cpu, gpu, model, tw, acc)))
    assert asked == [TABLE_MAX_ROWS]


def test_required_extension_has_frag_amount():
    """An in-place build older than ``frag_amount`` imports (numpy path) but fails CI's GPUFLEET_REQUIRE_NATIVE=1."""
    if os.environ.get("GPUFLEET_REQUIRE_NATIVE") == "1":
        assert native.frag_amount is not None, f"GPUFLEET_REQUIRE_NATIVE=1 but {native.describe()}"
    if native.ACTIVE and native.frag_amount is None:
        assert "older" in native.describe()


def test_native_off_by_environment():
    """GPUFLEET_NATIVE=0 takes both C functions out, and says so where the extension is built (where it is not,
    ``describe`` says that instead: an install without a C compiler passes this test too)."""
    import importlib.util

    env = {**os.environ, "GPUFLEET_NATIVE": "0"}
    code = ("from gpufleet import native; assert native.frag_amount is None and native.measure is None; "
            "print(native.describe())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    built = importlib.util.find_spec("gpufleet._native") is not None
    assert ("GPUFLEET_NATIVE=0" if built else "not built") in out, out
