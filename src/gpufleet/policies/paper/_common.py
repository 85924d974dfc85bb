"""What the paper's plugins share: the simulator's normalisers, a base keyed by the pod's shape, which GPUs a pod takes."""

from __future__ import annotations

import numpy as np

from ...engine.framework import Cycle
from .workload import shape_of

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


def take_packed(left: np.ndarray, milli: int, count: int) -> np.ndarray:
    """``NodeResource.Sub``: take ``count`` GPUs of ``milli``, least sufficient first."""
    out = left.copy()
    order = np.argsort(out, axis=1, kind="stable")
    srt = np.take_along_axis(out, order, axis=1)
    ok = srt >= milli
    take = ok & (np.cumsum(ok, axis=1) <= count)
    srt = srt - take * milli
    np.put_along_axis(out, order, srt, axis=1)
    return out


class PaperPlugin:
    """What every paper policy shares: raw scores as they are, and a score cache keyed by the pod's shape."""

    name = ""

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw

    def cache_key(self, cycle: Cycle):
        return shape_of(cycle.request)
