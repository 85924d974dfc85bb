"""Best-fit: least weighted CPU + GPU left on the node after placing (the best of the paper's simple baselines)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle
from ...engine.state import ClusterState
from ._common import FEW_NODES, MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, PaperPlugin, left_rows
from .workload import node_view


@dataclass
class BestFitScore(PaperPlugin):
    """Best-fit (``best_fit_score.go``): least weighted free CPU + GPU left after placing."""

    name: str = "BestFitScore"

    def cache_key(self, cycle: Cycle):
        """The score reads the pod's CPU and total GPU milli only: pods alike in those share cached scores."""
        r = cycle.request
        return (r.cpu_milli, r.total_gpu_milli)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if nodes.size <= FEW_NODES:  # the same arithmetic on Python floats (IEEE doubles, in the same order)
            g = r.total_gpu_milli
            return np.array([float(math.floor((1.0 - (0.5 * (c - r.cpu_milli) / MAX_SPEC_CPU_MILLI
                                                        + 0.5 * (sum(left) - g) / MAX_SPEC_GPU_MILLI)) * MAX_NODE_SCORE))
                             for c, left in zip(state.cpu_free.take(nodes).tolist(), left_rows(state, nodes))])
        cpu, left, _ = node_view(state, nodes)
        rest = 0.5 * (cpu - r.cpu_milli) / MAX_SPEC_CPU_MILLI + 0.5 * (left.sum(axis=1) - r.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        return np.floor((1.0 - rest) * MAX_NODE_SCORE)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        lo, hi = np.minimum.reduce(raw), np.maximum.reduce(raw)  # raw.min(), raw.max(), without their wrappers
        if hi == lo:
            return np.zeros(raw.size)
        out = np.subtract(raw, lo, dtype=np.float64)  # (raw - lo) * MAX_NODE_SCORE / (hi - lo), in place
        out *= MAX_NODE_SCORE
        out /= hi - lo
        return np.floor(out, out=out)
