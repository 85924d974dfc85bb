"""What the paper's plugins share: the simulator's normalisers, a base keyed by the pod's shape, which GPUs a pod takes."""

from __future__ import annotations

import numpy as np

from ...engine.framework import Cycle
from ...engine.state import ClusterState
from .workload import shape_of

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


TAKE_PY_MAX = 4  # rows (node states) up to which take_packed runs in Python: the one to four a cached score recomputes


def take_packed(left: np.ndarray, milli: int, count: int) -> np.ndarray:
    """``NodeResource.Sub``: take ``count`` GPUs of ``milli``, least sufficient first (the first such GPU on ties)."""
    if 0 < left.shape[0] <= TAKE_PY_MAX and left.shape[1] and left.dtype.kind in "iu":
        return _take_packed_py(left, milli, count)
    out = left.copy()
    if left.shape[1] == 0:
        return out
    if count == 1:  # one GPU: the least sufficient, the first of equals (what the stable sort below picks)
        fit = left >= milli
        big = np.iinfo(left.dtype).max if left.dtype.kind in "iu" else np.inf
        j = np.where(fit, left, big).argmin(axis=1)
        rows = np.logical_or.reduce(fit, axis=1).nonzero()[0]
        out[rows, j[rows]] -= milli
        return out
    order = left.argsort(axis=1, kind="stable")
    at = np.arange(left.shape[0])[:, None]
    srt = left[at, order]
    ok = srt >= milli
    take = ok & (ok.cumsum(axis=1) <= count)
    out[at, order] = srt - take * milli
    return out


def _take_packed_py(left: np.ndarray, milli: int, count: int) -> np.ndarray:
    """``take_packed`` of a few rows of whole numbers, row by row in Python (numpy's per-call cost is most of the work
    on one to four rows): in ascending order of free milli (a stable sort: the first of equals first), the first
    ``count`` GPUs that hold ``milli`` give it up.  The same GPUs as the sort below (property-tested)."""
    rows = left.tolist()
    for row in rows:
        taken = 0
        for j in sorted(range(len(row)), key=row.__getitem__):  # sorted() is stable, as argsort(kind="stable")
            if taken >= count:
                break
            if row[j] >= milli:
                row[j] -= milli
                taken += 1
    return np.array(rows, dtype=left.dtype)


FEW_NODES = 8  # up to this many nodes to score (usually the one to four whose version moved), node by node in Python


def left_rows(state: ClusterState, nodes: np.ndarray) -> list[list[int]]:
    """Per node of ``nodes``: its per-GPU milli left (0 for absent or unusable GPUs), ``node_view``'s ``left`` as
    Python ints: for the few nodes a cached score recomputes, where numpy's per-call cost is most of the work."""
    usable, free = state.gpu_usable, state.gpu_free_milli
    return [[f if u else 0 for f, u in zip(free[i].tolist(), usable[i].tolist())] for i in nodes.tolist()]


class PaperPlugin:
    """What every paper policy shares: raw scores as they are, and a score cache keyed by the pod's shape."""

    name = ""

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw

    def cache_key(self, cycle: Cycle):
        return shape_of(cycle.request)
