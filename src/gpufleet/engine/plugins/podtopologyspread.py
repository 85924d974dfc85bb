"""PodTopologySpread: maxSkew over topology domains, as kube-scheduler computes it.

For each constraint, pods matching its selector in the pod's namespace are
counted per domain of ``topologyKey`` over the *eligible* nodes: nodes that
carry every constraint's key, that match the pod's node affinity when
``nodeAffinityPolicy`` is Honor (the default) and whose taints it tolerates
when ``nodeTaintsPolicy`` is Honor (default Ignore).  A node passes a
DoNotSchedule constraint when ``count(domain) + selfMatch - globalMin <=
maxSkew``, where ``globalMin`` is the least count over eligible domains, or 0
while fewer than ``minDomains`` domains exist.  ScheduleAnyway constraints
score: fewer matching pods in the node's domain is better, each constraint
weighted by log(domains + 2), as in kube-scheduler.

System default constraints (pods that bring none): kube-scheduler's own
defaults -- ``kubernetes.io/hostname`` maxSkew 3 and
``topology.kubernetes.io/zone`` maxSkew 5, both ScheduleAnyway -- applied to
the pods of the same controller (``ownerReferences`` with ``controller:
true``).  kube-scheduler takes the selector from the Services, ReplicaSets and
StatefulSets selecting the pod; the controlling owner names the same replica
set without watching those kinds.  ``defaultConstraints: none`` turns them off.
Pods without an owner (every simulator trace pod) are unaffected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..constraints import SpreadConstraint
from ..errors import ConfigError
from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..podindex import domain_counts, per_node
from ..state import ClusterState
from ._common import node_affinity_mask, passing, taints_mask

SPREAD = "node(s) didn't match pod topology spread constraints"
MISSING = "node(s) didn't match pod topology spread constraints (missing required label)"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def _eligible(state: ClusterState, r: PodRequest, c: SpreadConstraint, has_keys: np.ndarray) -> np.ndarray:
    elig = has_keys
    if c.node_affinity_policy == "Honor":
        elig = elig & node_affinity_mask(state, r)
    if c.node_taints_policy == "Honor":
        elig = elig & taints_mask(state, r)
    return elig


def _counts(state: ClusterState, r: PodRequest, c: SpreadConstraint) -> np.ndarray:
    ns = r.terms.namespace if r.terms is not None else r.namespace
    return state.pod_index.selector_counts(ns, c.selector, c.owner_uid)


def _self_match(r: PodRequest, c: SpreadConstraint) -> int:
    if c.owner_uid:
        return 1
    labels = r.terms.labels if r.terms is not None else dict(r.labels)
    return 1 if c.selector is not None and c.selector.matches(labels) else 0


@dataclass
class PodTopologySpread:
    name: str = "PodTopologySpread"
    defaultConstraints: str = "system"  # "system" (kube-scheduler's defaults, see module doc) or "none"

    def __post_init__(self) -> None:
        if self.defaultConstraints not in ("system", "none"):
            raise ConfigError(f"PodTopologySpread: defaultConstraints must be 'system' or 'none', got {self.defaultConstraints!r}")

    skip_fields = ("terms",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No hard (DoNotSchedule) spread constraint (system defaults are soft: scores only)."""
        return r.terms is None or not any(c.hard for c in r.terms.spread)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        n = len(state)
        hard = [c for c in r.terms.spread if c.hard] if r.terms is not None else []
        if not hard:
            return passing(n)
        has_keys = np.ones(n, dtype=bool)
        for c in hard:
            has_keys &= state.topology(c.topology_key)[0] >= 0
        ok = has_keys.copy()
        codes = np.zeros(n, dtype=np.int64)
        for c in hard:
            dom, vals = state.topology(c.topology_key)
            elig = _eligible(state, r, c, has_keys)
            dc = domain_counts(dom, len(vals), _counts(state, r, c), elig)
            present = np.zeros(len(vals), dtype=bool)
            present[dom[elig]] = True
            gmin = int(dc[present].min()) if present.sum() >= c.min_domains and present.any() else 0
            fits = has_keys & (per_node(dom, dc) + _self_match(r, c) - gmin <= c.max_skew)
            codes[ok & ~fits] = 1
            ok &= fits
        return FilterResult(ok, (MISSING, SPREAD), codes)

    def _soft(self, r: PodRequest) -> tuple[list[SpreadConstraint], bool]:
        t = r.terms
        if t is None:
            return [], False
        if t.spread:
            return [c for c in t.spread if not c.hard], True
        if self.defaultConstraints == "system" and t.owner_uid:
            return [SpreadConstraint(3, HOSTNAME, "ScheduleAnyway", None, owner_uid=t.owner_uid),
                    SpreadConstraint(5, ZONE, "ScheduleAnyway", None, owner_uid=t.owner_uid)], False
        return [], False

    def applies(self, cycle: Cycle, state: ClusterState) -> bool:
        return bool(self._soft(cycle.request)[0])

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        soft, require_all = self._soft(r)
        if not soft:
            return np.zeros(nodes.size)
        n = len(state)
        has_keys = np.ones(n, dtype=bool)
        if require_all:
            for c in soft:
                has_keys &= state.topology(c.topology_key)[0] >= 0
        raw = np.zeros(n, dtype=np.float64)
        for c in soft:
            dom, vals = state.topology(c.topology_key)
            elig = _eligible(state, r, c, has_keys)
            dc = domain_counts(dom, len(vals), _counts(state, r, c), elig)
            present = np.zeros(len(vals), dtype=bool)
            present[dom[elig & (dom >= 0)]] = True
            w = math.log(int(present.sum()) + 2)
            raw += w * (per_node(dom, dc) + c.max_skew - 1) * (dom >= 0)
        raw[~has_keys] = -1.0  # lacks a key: lowest score
        return raw[nodes]

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        valid = raw >= 0
        out = np.zeros(raw.size)
        if not valid.any():
            return out
        lo, hi = raw[valid].min(), raw[valid].max()
        if hi == 0:
            out[valid] = 100.0
        else:
            out[valid] = 100.0 * (hi + lo - raw[valid]) / hi
        return out

    def cache_key(self, cycle: Cycle) -> None:
        return None
