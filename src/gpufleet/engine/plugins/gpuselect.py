"""Choosing the exact devices on the chosen node.

The default keeps big GPUs whole: a shared pod goes on the fullest GPU it fits
(best fit), whole-GPU pods take GPUs from the smallest NVLink island that
holds them all, so 8-GPU and NVLink jobs find islands intact.
"""

from __future__ import annotations

from dataclasses import dataclass


from ..framework import Cycle, GpuChoice
from ..model import GPU_MILLI
from ..state import ClusterState
from .gpufit import eligible_on, model_mask


def pick_mig(cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
    r = cycle.request
    free = state.mig_free[node].get(r.mig_profile or "", [])
    mm = model_mask(state, r)
    if mm is not None:
        free = [gi for gi in free if mm[state.gpu_model[node, gi[0]]]]
    if len(free) < r.gpu_count:
        return None
    # take instances from the GPU that already has the fewest free instances (pack MIG GPUs)
    per_gpu: dict[int, int] = {}
    for g, _ in free:
        per_gpu[g] = per_gpu.get(g, 0) + 1
    ordered = sorted(free, key=lambda gi: (per_gpu[gi[0]], gi))
    return GpuChoice(mig=tuple(ordered[: r.gpu_count]))


def islands(state: ClusterState, node: int, candidates: list[int]) -> list[list[int]]:
    """Connected groups of ``candidates`` over the node's NVLink peer graph."""
    gpus = state.nodes[node].gpus
    cand = set(candidates)
    seen: set[int] = set()
    out = []
    for g in candidates:
        if g in seen:
            continue
        comp, stack = [], [g]
        seen.add(g)
        while stack:
            x = stack.pop()
            comp.append(x)
            for p in gpus[x].nvlink_peers:
                if p in cand and p not in seen:
                    seen.add(p)
                    stack.append(p)
        out.append(sorted(comp))
    return out


def pick_whole(state: ClusterState, node: int, eligible: list[int], k: int) -> tuple[int, ...] | None:
    if len(eligible) < k:
        return None
    if k > 1 and any(state.nodes[node].gpus[g].nvlink_peers for g in eligible):
        groups = sorted(islands(state, node, eligible), key=lambda c: (len(c), c))
        for c in groups:
            if len(c) >= k:
                return tuple(c[:k])
    return tuple(eligible[:k])


def select_with(cycle: Cycle, state: ClusterState, node: int, pick_shared) -> GpuChoice | None:
    """MIG instance, whole GPUs (NVLink-aware), or ``pick_shared(eligible, count)`` for a GPU share."""
    r = cycle.request
    if r.mig_profile:
        return pick_mig(cycle, state, node)
    idx = eligible_on(state, r, node)
    if r.gpu_milli >= GPU_MILLI:
        got = pick_whole(state, node, idx, r.gpu_count)
        return GpuChoice(got) if got else None
    if len(idx) < r.gpu_count:
        return None
    return GpuChoice(tuple(sorted(pick_shared(idx, r.gpu_count))))


@dataclass
class BestFitGpu:
    name: str = "BestFitGpu"

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        free = state.gpu_free_milli[node].tolist()
        return select_with(cycle, state, node, lambda idx, n: sorted(idx, key=lambda g: (free[g], g))[:n])
