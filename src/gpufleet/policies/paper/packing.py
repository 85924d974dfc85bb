"""GPU packing: fill partly used GPUs, then partly used nodes, and open an idle node last."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.model import GPU_MILLI
from ...engine.state import ClusterState
from ._common import PaperPlugin
from .workload import node_view


@dataclass
class GpuPackingScore(PaperPlugin):
    """GPU packing (``gpu_packing_score.go``): fill partly used GPUs, then partly
    used nodes, and open an idle node last."""

    name: str = "GpuPackingScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if r.gpu_count == 0:
            return np.zeros(nodes.size)
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
