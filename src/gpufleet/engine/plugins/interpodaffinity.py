"""InterPodAffinity: required and preferred pod affinity and anti-affinity, with symmetry.

kube-scheduler's semantics (pkg/scheduler/framework/plugins/interpodaffinity):

* filter: (1) an existing pod's required anti-affinity term that matches the
  incoming pod keeps it out of that pod's topology domain; (2) each of the
  incoming pod's required affinity terms needs a matching pod (one matching
  *all* its affinity terms) in the node's domain -- unless no pod in the
  cluster matches and the pod matches its own terms, so the first replica of
  a group may start it anywhere the topology keys exist; (3) each required
  anti-affinity term keeps it out of domains holding a matching pod (a node
  without the topology key passes).
* score: the incoming pod's preferred terms (+/- weight per matching pod in the
  domain), and existing pods' terms that match the incoming pod: their
  preferred affinity/anti-affinity by weight, their required affinity by
  ``hardPodAffinityWeight`` (1); min-max normalized.

The counts come from the state's ``PodIndex`` (kept current on reserve and
unreserve), folded into domains with one bincount per term: no pod is
rescanned in a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constraints import PodTerms
from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..podindex import domain_counts, per_node
from ..state import ClusterState
from ._common import minmax, passing

EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"


def _terms(cycle: Cycle) -> PodTerms:
    t = cycle.request.terms
    return t if t is not None else PodTerms(namespace=cycle.request.namespace, labels=dict(cycle.request.labels))


def _in_domain(state: ClusterState, key: str, counts: np.ndarray) -> np.ndarray:
    """Per node: matching pods in the node's domain of ``key`` (0 where the node lacks the key)."""
    dom, vals = state.topology(key)
    return per_node(dom, domain_counts(dom, len(vals), counts))


@dataclass
class InterPodAffinity:
    name: str = "InterPodAffinity"
    REASONS = (EXISTING_ANTI, AFFINITY, ANTI_AFFINITY)

    skip_fields = ("terms",)

    def skip_stamp(self, state: ClusterState) -> bool:
        """Whether any placed pod carries required anti-affinity (which may keep this pod away: symmetry)."""
        return bool(state.pod_index.anti)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No required (anti-)affinity of its own, and none on placed pods."""
        t = r.terms
        return not state.pod_index.anti and (t is None or not (t.affinity or t.anti_affinity))

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        n = len(state)
        idx = state.pod_index
        t = cycle.request.terms
        if not idx.anti and (t is None or not (t.affinity or t.anti_affinity)):
            return passing(n)
        t = _terms(cycle)
        nsl = idx.namespace_labels
        existing = np.ones(n, dtype=bool)
        for term, owners in idx.anti.items():  # symmetry: existing pods' required anti-affinity
            if term.matches(t.namespace, t.labels, nsl):
                existing &= _in_domain(state, term.topology_key, owners) == 0
        aff = np.ones(n, dtype=bool)
        if t.affinity:
            counts = idx.all_terms_counts(t.affinity)
            if counts.any():
                for term in t.affinity:
                    aff &= _in_domain(state, term.topology_key, counts) > 0
            elif all(term.matches(t.namespace, t.labels, nsl) for term in t.affinity):
                for term in t.affinity:  # the first pod of a group: anywhere the topology keys exist
                    aff &= state.topology(term.topology_key)[0] >= 0
            else:
                aff[:] = False
        anti = np.ones(n, dtype=bool)
        for term in t.anti_affinity:
            counts = idx.term_counts(term)
            if counts.any():
                anti &= _in_domain(state, term.topology_key, counts) == 0
        ok = existing & aff & anti
        # the reason kube-scheduler reports first: own affinity, own anti-affinity, then existing pods'
        codes = np.where(~aff, 1, np.where(~anti, 2, 0))
        return FilterResult(ok, self.REASONS, codes)

    def applies(self, cycle: Cycle, state: ClusterState) -> bool:
        t = cycle.request.terms
        return bool(state.pod_index.sym) or (t is not None and bool(t.preferred_affinity or t.preferred_anti_affinity))

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        idx = state.pod_index
        t = cycle.request.terms
        if not idx.sym and (t is None or not (t.preferred_affinity or t.preferred_anti_affinity)):
            return np.zeros(nodes.size)
        t = _terms(cycle)
        raw = np.zeros(len(state), dtype=np.float64)
        for term in t.preferred_affinity:
            raw += term.weight * _in_domain(state, term.topology_key, idx.term_counts(term))
        for term in t.preferred_anti_affinity:
            raw -= term.weight * _in_domain(state, term.topology_key, idx.term_counts(term))
        nsl = idx.namespace_labels
        for (term, w), owners in idx.sym.items():  # existing pods' terms that match the incoming pod
            if term.matches(t.namespace, t.labels, nsl):
                raw += w * _in_domain(state, term.topology_key, owners)
        return raw[nodes]

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return minmax(raw)

    def cache_key(self, cycle: Cycle) -> None:
        return None
