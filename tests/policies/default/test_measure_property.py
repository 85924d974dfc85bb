"""Property: the descent's measure from its per-free-milli table (``DescentScore._measure``) has the same bits as
``frag_amount + _penalty``, the two functions it stands for, on every kind of node state: few and many states (the
direct and the binned fragment), mean ratio and ratio quantiles, memory stranding on and off, and free milli out of
0..GPU_MILLI (where it falls back to the two functions)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.model import GPU_MILLI, PodRequest
from gpufleet.policies.default import DescentArgs, DescentScore, WorkloadArgs, WorkloadModel
from gpufleet.policies.paper.workload import frag_amount

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = [(4000, 1000, 1, 16384), (2000, 500, 1, 8192), (1000, 250, 1, 4096), (8000, 1000, 2, 65536), (6000, 300, 1, 2048),
          (500, 0, 0, 1024), (3000, 120, 1, 4096), (16000, 1000, 4, 131072)]


def plugin(args: DescentArgs, shapes: list[int]) -> DescentScore:
    p = DescentScore(args, model=WorkloadModel(WorkloadArgs(learn_online=False)))
    p.prime([PodRequest(name=f"w{i}", cpu_milli=c, memory_mib=m, gpu_count=n, gpu_milli=g)
             for i, k in enumerate(shapes) for c, g, n, m in [SHAPES[k]]])
    return p


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)  # -0.0 and 0.0 differ here


@st.composite
def states(draw):
    s = draw(st.integers(1, 70))
    g = draw(st.sampled_from([1, 4, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = np.array([0, 10, 120, 250, 300, 500, 700, 750, 880, 1000])
    gpu = rng.choice(steps, size=(s, g)) if draw(st.booleans()) else rng.integers(0, GPU_MILLI + 1, size=(s, g))
    odd = draw(st.sampled_from(["none", "negative", "above"]))
    if odd != "none":
        gpu[rng.integers(s), rng.integers(g)] = -30 if odd == "negative" else GPU_MILLI + 5
    cpu = rng.integers(-2000, 96_000, size=s)
    mem = rng.integers(-4096, 400_000, size=s)
    model = rng.integers(-1, 2, size=s)
    return cpu, gpu.astype(np.int64), mem, model


@SETTINGS
@given(st_=states(), shapes=st.lists(st.integers(0, len(SHAPES) - 1), min_size=1, max_size=24),
       quantiles=st.booleans(), memory=st.booleans())
def test_table_measure_equals_fragment_plus_penalty(st_, shapes, quantiles, memory):
    cpu, gpu, mem, model = st_
    p = plugin(DescentArgs(memory_strand=memory), shapes)
    tw = p.model.workload
    assert tw is not None
    acc = tw.access(["A100", "T4"])
    p._q_rhos = np.array([0.5, 2.0, 8.0, 30.0]) if quantiles else None
    want = frag_amount(cpu, gpu, model, tw, acc) + p._penalty(cpu, gpu, mem)
    got = p._measure(cpu, gpu, mem, model, tw, acc)
    np.testing.assert_array_equal(bits(got), bits(want))


def test_weights_off_take_the_two_functions():
    rng = np.random.default_rng(3)
    gpu = rng.integers(0, GPU_MILLI + 1, size=(6, 8))
    cpu, mem, model = rng.integers(0, 64_000, 6), rng.integers(0, 262_144, 6), np.zeros(6, dtype=np.int64)
    for args in (DescentArgs(strand_weight=0.0), DescentArgs(sliver_weight=0.0), DescentArgs(strand_weight=-2.0)):
        p = plugin(args, [0, 1, 2, 5])
        tw = p.model.workload
        assert tw is not None
        acc = tw.access(["A100"])
        want = frag_amount(cpu, gpu, model, tw, acc) + p._penalty(cpu, gpu, mem)
        np.testing.assert_array_equal(bits(p._measure(cpu, gpu, mem, model, tw, acc)), bits(want))
