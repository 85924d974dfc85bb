"""Best-fit: least weighted CPU + GPU left on the node after placing (the best of the paper's simple baselines)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.state import ClusterState
from ._common import MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PaperPlugin
from .workload import node_view


@dataclass
class BestFitScore(PaperPlugin):
    """Best-fit (``best_fit_score.go``): least weighted free CPU + GPU left after placing."""

    name: str = "BestFitScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        cpu, left, _ = node_view(state, nodes)
        rest = 0.5 * (cpu - r.cpu_milli) / MAX_SPEC_CPU_MILLI + 0.5 * (left.sum(axis=1) - r.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        return np.floor((1.0 - rest) * MAX_NODE_SCORE)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        lo, hi = raw.min(), raw.max()
        if hi == lo:
            return np.zeros(raw.size)
        return np.floor((raw - lo) * MAX_NODE_SCORE / (hi - lo))
