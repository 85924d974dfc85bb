"""NodeAffinity: nodeSelector and required node affinity filter; preferred terms score (kube-scheduler's plugin).

The reason strings are worded like kube-scheduler's so an aggregated message reads familiar.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ._common import MetaCache, node_affinity_rows, passing, term_matches


@dataclass
class NodeAffinity:
    """nodeSelector and required node affinity (filter); preferred affinity (score)."""

    name: str = "NodeAffinity"
    requeue_on = "nodes"  # judges what only node changes change: a pod leaving never helps (schedqueue.may_fit_after)
    _c: MetaCache = field(default_factory=MetaCache)

    skip_fields = ("node_selector", "required_terms")

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No nodeSelector and no required node affinity: every node matches."""
        return not r.node_selector and not r.required_terms

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        if not r.node_selector and not r.required_terms:
            return passing(len(state))

        ok = self._c.get((r.node_selector, r.required_terms), state, lambda: node_affinity_rows(state, r))
        return FilterResult(ok, ("node(s) didn't match Pod's node affinity/selector",))

    # score: preferred terms
    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if not r.preferred_terms:
            return np.zeros(nodes.size)
        out = np.zeros(nodes.size)
        for k, i in enumerate(nodes):
            n = state.nodes[int(i)]
            out[k] = sum(p.weight for p in r.preferred_terms if term_matches(p.term, n.labels, n.name))
        return out

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        m = raw.max() if raw.size else 0
        return raw * (100.0 / m) if m > 0 else raw

    def cache_key(self, cycle: Cycle):
        return None
