"""Spread: fewer pods already on a node scores higher (the opposite of binpacking, for pods that want room)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framework import Cycle
from ..state import ClusterState


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
