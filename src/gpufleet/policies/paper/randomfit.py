"""Random-fit: a random feasible node and a random GPU that fits (the paper's weakest baseline)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.framework import MAX_NODE_SCORE, Cycle, GpuChoice
from ...engine.plugins.gpuselect import select_with
from ...engine.state import ClusterState
from ._common import PaperPlugin


@dataclass
class RandomScore(PaperPlugin):
    """Random-fit (``random_score.go``): one random feasible node gets the top score."""

    name: str = "RandomScore"

    def cache_key(self, cycle: Cycle):
        return None

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        out = np.zeros(nodes.size)
        out[int(cycle.rng.integers(nodes.size))] = MAX_NODE_SCORE
        return out


@dataclass
class RandomGpu:
    """Random GPU among those that fit (``allocateGpuIdBasedOnRandomFit``)."""

    name: str = "RandomGpu"

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        return select_with(cycle, state, node, lambda idx, n: [idx[int(i)] for i in np.atleast_1d(cycle.rng.choice(len(idx), size=n, replace=False))])
