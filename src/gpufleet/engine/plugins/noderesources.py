"""NodeResources: the fit filter and the least-/most-allocated scores, as kube-scheduler's noderesources plugins.

The fit covers CPU, memory, pod count and every other scalar resource the pod requests (GPUs: ``gpufit``);
the scores weigh CPU, memory and GPU milli, the dimensions the pod asks for, after placing it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framework import Cycle, FilterResult
from ..state import ClusterState


_REASONS = ("Too many pods", "Insufficient cpu", "Insufficient memory")


@dataclass
class NodeResourcesFit:
    """CPU, memory, pod count and every other scalar resource the pod requests (GPUs: GpuFit)."""

    name: str = "NodeResourcesFit"
    requeue_on = "room"  # judges each node by itself: a pod leaving helps only where the pod then has room (schedqueue.may_fit_after)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        cpu = state.cpu_free >= r.cpu_milli
        mem = state.mem_free >= r.memory_mib
        if not r.scalars:
            # the reason codes (0 no pod slot, 1 too little cpu, 2 too little memory), made only for a diagnosis
            # from this cycle's masks: pods * (cpu + 1) is np.where(~pods, 0, np.where(~cpu, 1, 2)) in two calls
            if not state.pods_short:  # every node has a pod slot left (ClusterState.pods_short): pods is all true
                ok = cpu & mem
                if np.logical_and.reduce(ok):  # ok.all(), without the method's Python wrapper
                    return FilterResult(ok, passes_all=True)
                return FilterResult(ok, _REASONS, codes_of=lambda: np.add(cpu, 1))
            pods = state.pods_free >= 1
            ok = cpu & mem & pods
            if np.logical_and.reduce(ok):
                return FilterResult(ok, passes_all=True)
            return FilterResult(ok, _REASONS, codes_of=lambda: np.multiply(pods, np.add(cpu, 1)))
        pods = state.pods_free >= 1
        ok = cpu & mem & pods
        codes = np.where(~pods, 0, np.where(~cpu, 1, 2))
        reasons = list(_REASONS)
        for name, amount in r.scalars:
            free = state.scalar_free.get(name)
            fits = free >= amount if free is not None else np.zeros(len(state), dtype=bool)
            codes = np.where(ok & ~fits, len(reasons), codes)
            reasons.append(f"Insufficient {name}")
            ok &= fits
        return FilterResult(ok, tuple(reasons), codes)

    def fused_fit(self, cycle: Cycle, state: ClusterState) -> tuple[int, int, np.ndarray | None, tuple[str, ...]] | None:
        """What the framework's one-pass filter phase (``gpufleet._native.fit``) needs to give ``filter``'s verdict
        and codes: the pod's cpu and memory, the pod-slot column (None: every node has a slot) and the reasons; None
        for a pod with other scalar resources (``filter`` then runs)."""
        r = cycle.request
        if r.scalars:
            return None
        return r.cpu_milli, r.memory_mib, state.pods_free if state.pods_short else None, _REASONS


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
