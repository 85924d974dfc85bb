"""Inputs for the C extension's bit-for-bit property tests (``test_native_frag``, ``default/test_native_measure``).

Why one module: both compare a C path with its numpy reference over the same kinds of target workloads and node
states (shapes that straddle numpy's pairwise-sum sizes, -0.0 frequencies, GPUs at 0 and GPU_MILLI)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from gpufleet.engine.model import GPU_MILLI
from gpufleet.policies.paper.workload import TargetWorkload

# shape counts about numpy's pairwise sum: under 8, 8-accumulator blocks, the 128-item block and above it
SHAPE_COUNTS = (1, 2, 5, 7, 8, 9, 15, 16, 17, 31, 64, 127, 128, 129, 200, 255, 256, 257, 300)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)  # -0.0 and 0.0 differ here


@st.composite
def workloads(draw, signs: Sequence[str] = ("positive", "some", "all")) -> TargetWorkload:
    """A target workload of 1 to 300 shapes; ``signs``: which frequency signs may be drawn ("some": zeros and -0.0
    among them, a product of -0.0 in the sum over shapes; "all": every one -0.0, so each state's amount is 0.0)."""
    t = draw(st.sampled_from(SHAPE_COUNTS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    milli = rng.choice([0, 100, 120, 250, 300, 500, 1000], size=t)
    count = np.where(milli > 0, rng.choice([1, 1, 2, 4, 8], size=t), 0)
    cpu = rng.integers(0, 32_000, size=t)
    freq = rng.random(t) / t
    sign = draw(st.sampled_from(list(signs)))
    if sign == "some":
        freq[rng.random(t) < 0.3] = -0.0
        freq[rng.random(t) < 0.1] = -1e-3
    elif sign == "all":
        freq[:] = -0.0
    models = tuple(rng.choice([None, frozenset({"A100"}), frozenset({"T4", "A100"})], size=t))
    return TargetWorkload(cpu_milli=cpu.astype(np.float64) if draw(st.booleans()) else cpu.astype(np.int64),
                          gpu_milli=milli.astype(np.int64), gpu_count=count.astype(np.int64), freq=freq, models=models)


def free_milli(draw, rng: np.random.Generator, s: int, g: int) -> np.ndarray:
    """[s, g] free milli per GPU, int64: on common steps, anywhere in 0..GPU_MILLI, or every GPU full or empty."""
    kind = draw(st.sampled_from(["steps", "any", "edges"]))
    if kind == "steps":
        gpu = rng.choice([0, 10, 120, 250, 300, 500, 700, 750, 880, 1000], size=(s, g))
    elif kind == "edges":
        gpu = rng.choice([0, GPU_MILLI], size=(s, g))
    else:
        gpu = rng.integers(0, GPU_MILLI + 1, size=(s, g))
    return gpu.astype(np.int64)
