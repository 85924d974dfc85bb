"""GPU packing: fill partly used GPUs, then partly used nodes, and open an idle node last."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.model import GPU_MILLI
from ...engine.state import ClusterState
from ._common import FEW_NODES, PaperPlugin, left_rows
from .workload import node_view


@dataclass
class GpuPackingScore(PaperPlugin):
    """GPU packing (``gpu_packing_score.go``): fill partly used GPUs, then partly
    used nodes, and open an idle node last."""

    name: str = "GpuPackingScore"

    def cache_key(self, cycle: Cycle):
        """The score reads the pod's per-GPU milli and GPU count only (not its CPU): pods alike in those share cached
        scores."""
        r = cycle.request
        return (r.gpu_milli, r.gpu_count) if r.gpu_count else (0, 0)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if r.gpu_count == 0:
            return np.zeros(nodes.size)
        if nodes.size <= FEW_NODES:
            return np.array([_packing_score(left, n, exists, r.gpu_milli, r.gpu_count) for left, n, exists in
                             zip(left_rows(state, nodes), state.gpu_n.take(nodes).tolist(),
                                 state.gpu_exists.take(nodes, axis=0).tolist())], dtype=np.float64)
        _, left, _ = node_view(state, nodes)
        n_gpus = state.gpu_n[nodes]
        full = (left == GPU_MILLI).sum(axis=1)
        out = np.zeros(nodes.size)
        idle = full == n_gpus
        out[idle] = np.maximum(MAX_NODE_SCORE // 3 - full[idle], full[idle])
        srt = np.sort(np.where(state.gpu_exists[nodes], left, -1), axis=1)  # ascending; absent GPUs first (never fit)
        ok = srt >= r.gpu_milli
        use = ok & (np.cumsum(ok, axis=1) <= r.gpu_count)
        full_used = (use & (srt == GPU_MILLI)).sum(axis=1)
        pct = np.where(use, srt * 100 // GPU_MILLI, 0).sum(axis=1)
        partial = ~idle
        a = partial & (full_used > 0)
        out[a] = np.maximum(MAX_NODE_SCORE // 2 - full_used[a], MAX_NODE_SCORE // 3)
        b = partial & (full_used == 0)
        out[b] = np.maximum(MAX_NODE_SCORE - pct[b] // 10, MAX_NODE_SCORE // 2)
        return out


def _packing_score(left: list[int], n_gpus: int, exists: list[bool], milli: int, count: int) -> int:
    """``GpuPackingScore.score`` of one node, in Python (its per-GPU milli left, GPUs, which GPUs exist)."""
    full = sum(1 for x in left if x == GPU_MILLI)
    if full == n_gpus:  # an idle node
        return max(MAX_NODE_SCORE // 3 - full, full)
    take = [x for x in sorted(x if e else -1 for x, e in zip(left, exists)) if x >= milli][:count]  # least sufficient first
    full_used = sum(1 for x in take if x == GPU_MILLI)
    if full_used > 0:
        return max(MAX_NODE_SCORE // 2 - full_used, MAX_NODE_SCORE // 3)
    return max(MAX_NODE_SCORE - sum(x * 100 // GPU_MILLI for x in take) // 10, MAX_NODE_SCORE // 2)
