"""Helpers the pod-to-pod plugins share: all-pass results and node-metadata masks."""

from __future__ import annotations

import numpy as np

from ..model import PodRequest
from ..state import ClusterState
from .filters import _MetaCache, node_affinity_rows

_ONES: dict[int, np.ndarray] = {}


def all_pass(n: int) -> np.ndarray:
    """A shared read-only all-true mask (filters with nothing to check pay no allocation)."""
    a = _ONES.get(n)
    if a is None:
        a = np.ones(n, dtype=bool)
        a.setflags(write=False)
        if len(_ONES) > 64:
            _ONES.clear()
        _ONES[n] = a
    return a


_CACHE = _MetaCache()


def node_affinity_mask(state: ClusterState, r: PodRequest) -> np.ndarray:
    """Nodes matching the pod's nodeSelector and required node affinity."""
    if not r.node_selector and not r.required_terms:
        return all_pass(len(state))

    return _CACHE.get(("aff", r.node_selector, r.required_terms), state, lambda: node_affinity_rows(state, r))


def taints_mask(state: ClusterState, r: PodRequest) -> np.ndarray:
    """Nodes whose NoSchedule/NoExecute taints the pod tolerates."""
    tols = r.tolerations

    def build() -> np.ndarray:
        return np.array([all(any(x.tolerates(t) for x in tols) for t in n.taints if t.effect in ("NoSchedule", "NoExecute"))
                         for n in state.nodes], dtype=bool)

    return _CACHE.get(("taints", tols), state, build)


def minmax(raw: np.ndarray) -> np.ndarray:
    """Map raw scores onto 0..100 over [min(raw, 0), max(raw, 0)], as kube-scheduler's InterPodAffinity does
    (its running min and max start at 0); all equal: 0."""
    if raw.size == 0:
        return raw
    lo, hi = min(raw.min(), 0.0), max(raw.max(), 0.0)
    if hi == lo:
        return np.zeros(raw.size)
    return 100.0 * (raw - lo) / (hi - lo)
