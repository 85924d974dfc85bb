"""Helpers several plugins share: node-selector matching, per-epoch metadata masks, all-pass results, min-max.

Label- and taint-based masks depend only on node metadata, so they are cached per (pod constraint, state
epoch); NodeAffinity, the pod-to-pod plugins and VolumeBinding's node affinity all match terms the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..framework import FilterResult
from ..model import PodRequest, Requirement, SelectorTerm
from ..state import ClusterState


def _req_matches(req: Requirement, labels: dict[str, str], node_name: str) -> bool:
    return req.matches(node_name if req.key == "metadata.name" else labels.get(req.key))


def term_matches(term: SelectorTerm, labels: dict[str, str], node_name: str) -> bool:
    # an empty term matches nothing (Kubernetes semantics)
    return bool(term.requirements) and all(_req_matches(r, labels, node_name) for r in term.requirements)


class MetaCache:
    """Masks built from node metadata, kept per (state, epoch, key): labels and taints change only with the epoch."""

    def __init__(self) -> None:
        self._cache: dict[tuple, Any] = {}

    def get(self, key: tuple, state: ClusterState, build) -> Any:
        k = (state.epoch, id(state)) + key
        m = self._cache.get(k)
        if m is None:
            if len(self._cache) > 1024:
                self._cache.clear()
            m = build()
            self._cache[k] = m
        return m

    def any(self, key: tuple, state: ClusterState, mask) -> bool:
        """``mask(state).any()``, kept with the masks (``mask`` is the cached getter of the mask itself)."""
        k = (state.epoch, id(state), "any") + key
        v = self._cache.get(k)
        if v is None:
            if len(self._cache) > 1024:
                self._cache.clear()
            v = self._cache[k] = bool(mask(state).any())
        return v


def node_affinity_rows(state: ClusterState, r: PodRequest) -> np.ndarray:
    """Per node: does it match the pod's nodeSelector and required node affinity (uncached)."""
    out = np.empty(len(state), dtype=bool)
    for i, n in enumerate(state.nodes):
        ok = all(n.labels.get(k) == v for k, v in r.node_selector)
        if ok and r.required_terms:
            ok = any(term_matches(t, n.labels, n.name) for t in r.required_terms)
        out[i] = ok
    return out


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


_PASSING: dict[int, FilterResult] = {}


def passing(n: int) -> FilterResult:
    """A shared verdict of a filter with nothing to check for this pod (``passes_all``): the framework skips it
    without reading it, so one object per cluster size serves every cycle (no allocation per plugin per pod)."""
    f = _PASSING.get(n)
    if f is None:
        if len(_PASSING) > 64:
            _PASSING.clear()
        f = _PASSING[n] = FilterResult(all_pass(n), passes_all=True)
    return f


_CACHE = MetaCache()


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
