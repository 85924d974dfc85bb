"""Kubernetes-like node scores: least-allocated, most-allocated (binpack), spread.

Each scores over CPU, memory and GPU milli (the dimensions the pod asks for)
after placing the pod, like kube-scheduler's NodeResourcesFit strategies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framework import Cycle
from ..state import ClusterState


def _fractions_after(cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> list[np.ndarray]:
    """Used fraction of each requested resource on ``nodes`` after placing the pod."""
    r = cycle.request
    out = []
    for cap, free, req in (
        (state.cpu_cap, state.cpu_free, r.cpu_milli),
        (state.mem_cap, state.mem_free, r.memory_mib),
    ):
        c = cap[nodes].astype(np.float64)
        used = c - free[nodes] + req
        out.append(np.divide(used, c, out=np.ones_like(c), where=c > 0))
    if r.gpu_count:
        cap = state.gpu_milli_cap[nodes].astype(np.float64)
        used = cap - state.gpu_free_milli[nodes].sum(axis=1) + r.total_gpu_milli
        out.append(np.divide(used, cap, out=np.ones_like(cap), where=cap > 0))
    return out


class _Normalized:
    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw

    def cache_key(self, cycle: Cycle):
        return None


@dataclass
class LeastAllocated(_Normalized):
    """Prefer the emptiest node (kube-scheduler's default)."""

    name: str = "LeastAllocated"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        f = _fractions_after(cycle, state, nodes)
        return 100.0 * (1.0 - np.clip(np.mean(f, axis=0), 0, 1))


@dataclass
class MostAllocated(_Normalized):
    """Binpack: prefer the fullest node that still fits."""

    name: str = "MostAllocated"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        f = _fractions_after(cycle, state, nodes)
        return 100.0 * np.clip(np.mean(f, axis=0), 0, 1)


@dataclass
class Spread:
    """Spread pods over nodes: fewer pods already on the node scores higher."""

    name: str = "Spread"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        return (state.pods_free[nodes] - state.pods_cap[nodes]).astype(np.float64)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        lo, hi = raw.min(), raw.max()
        if hi == lo:
            return np.full(raw.size, 100.0)
        return 100.0 * (raw - lo) / (hi - lo)

    def cache_key(self, cycle: Cycle):
        return None
