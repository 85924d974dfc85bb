"""Incremental per-node bookkeeping of placed pods for pod-to-pod constraints.

Why: inter-pod affinity and topology spread ask "how many pods matching this
selector run in each topology domain?".  kube-scheduler answers by walking
every pod in every cycle; at 5,000 nodes and thousands of pods that is the
slowest part of a cycle.  Here each distinct question (a selector with its
namespaces) is registered once, answered by one scan, and then kept current
as pods are reserved and unreserved: a per-node count array that the plugins
fold into topology domains with one ``bincount``.  Existing pods' own terms
(symmetry: their required anti-affinity keeps matching pods away, their
preferred terms count in scoring) are grouped by identical term, so a cycle
looks at each distinct term once however many pods carry it.

The index lives in ``ClusterState`` and changes only through its
``reserve``/``unreserve``, so transactions (gangs, preemption) and ``copy``
keep it exact.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import numpy as np

from .constraints import HostPort, LabelSelector, PodAffinityTerm, PodTerms

MAX_MATCHERS = 512  # distinct registered selectors kept current; the oldest is dropped beyond
HARD_AFFINITY_WEIGHT = 1  # kube-scheduler's hardPodAffinityWeight: existing pods' required affinity in scoring

Pred = Callable[[PodTerms], bool]
_EMPTY: Mapping[str, str] = {}


class PodIndex:
    def __init__(self, n: int, ns_labels: Mapping[str, Mapping[str, str]] | None = None):
        self.n = n
        self.ns_labels: dict[str, Mapping[str, str]] = dict(ns_labels or {})
        self.pods: dict[str, tuple[PodTerms, int]] = {}
        self._counts: dict[Hashable, tuple[Pred, np.ndarray]] = {}
        # existing pods' required anti-affinity terms -> per-node number of pods carrying it
        self.anti: dict[PodAffinityTerm, np.ndarray] = {}
        # existing pods' scoring terms (term, signed weight) -> per-node number of pods carrying it
        self.sym: dict[tuple[PodAffinityTerm, int], np.ndarray] = {}
        # (protocol, port) -> node -> host IPs in use (a list: two pods may each hold 0.0.0.0 only if bound by others)
        self.ports: dict[tuple[str, int], dict[int, list[str]]] = {}
        # namespace/claim -> node -> pods using it
        self.claims: dict[str, dict[int, int]] = {}
        self.scans = 0  # full scans done to register a matcher (tests check the bookkeeping is incremental)

    # --- namespaces ----------------------------------------------------------------------
    def namespace_labels(self, ns: str) -> Mapping[str, str]:
        return self.ns_labels.get(ns, _EMPTY)

    def set_namespace_labels(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        new: dict[str, Mapping[str, str]] = {k: dict(v) for k, v in labels.items()}
        if new != self.ns_labels:
            self.ns_labels = new
            self._counts.clear()  # namespaceSelector answers may have changed

    # --- counts ------------------------------------------------------------------------------
    def counts(self, key: Hashable, pred: Pred) -> np.ndarray:
        """Per-node number of placed pods for which ``pred`` holds; ``key`` names ``pred``. Do not modify."""
        ent = self._counts.get(key)
        if ent is None:
            arr = np.zeros(self.n, dtype=np.int64)
            self.scans += 1
            for terms, i in self.pods.values():
                if pred(terms):
                    arr[i] += 1
            if len(self._counts) >= MAX_MATCHERS:
                self._counts.pop(next(iter(self._counts)))
            ent = (pred, arr)
            self._counts[key] = ent
        return ent[1]

    def term_counts(self, term: PodAffinityTerm) -> np.ndarray:
        nsl = self.namespace_labels
        return self.counts(("term", term.selector, term.namespaces, term.namespace_selector),
                           lambda t: term.matches(t.namespace, t.labels, nsl))

    def all_terms_counts(self, terms: tuple[PodAffinityTerm, ...]) -> np.ndarray:
        """Pods matching every term at once (how required pod affinity counts, as kube-scheduler does)."""
        if len(terms) == 1:
            return self.term_counts(terms[0])
        nsl = self.namespace_labels
        key = ("all",) + tuple((t.selector, t.namespaces, t.namespace_selector) for t in terms)
        return self.counts(key, lambda p: all(t.matches(p.namespace, p.labels, nsl) for t in terms))

    def selector_counts(self, namespace: str, selector: LabelSelector | None, owner_uid: str = "") -> np.ndarray:
        """Pods of ``namespace`` matching ``selector`` (or, with ``owner_uid``, of that controller)."""
        if owner_uid:
            return self.counts(("owner", namespace, owner_uid), lambda t: t.namespace == namespace and t.owner_uid == owner_uid)
        if selector is None:
            return np.zeros(self.n, dtype=np.int64)
        return self.counts(("spread", namespace, selector), lambda t: t.namespace == namespace and selector.matches(t.labels))

    # --- reserve / unreserve ---------------------------------------------------------------
    def add(self, key: str, terms: PodTerms, i: int) -> None:
        self.pods[key] = (terms, i)
        for pred, arr in self._counts.values():
            if pred(terms):
                arr[i] += 1
        self._bump(terms, i, 1)

    def remove(self, key: str) -> None:
        ent = self.pods.pop(key, None)
        if ent is None:
            return
        terms, i = ent
        for pred, arr in self._counts.values():
            if pred(terms):
                arr[i] -= 1
        self._bump(terms, i, -1)

    def _bump(self, terms: PodTerms, i: int, d: int) -> None:
        if not terms.indexed:
            return
        for t in terms.anti_affinity:
            _bump_arr(self.anti, t, i, d, self.n)
        for t in terms.affinity:
            _bump_arr(self.sym, (t, HARD_AFFINITY_WEIGHT), i, d, self.n)
        for t in terms.preferred_affinity:
            _bump_arr(self.sym, (t, t.weight), i, d, self.n)
        for t in terms.preferred_anti_affinity:
            _bump_arr(self.sym, (t, -t.weight), i, d, self.n)
        for hp in terms.host_ports:
            by_node = self.ports.setdefault((hp.protocol, hp.port), {})
            ips = by_node.setdefault(i, [])
            if d > 0:
                ips.append(hp.host_ip)
            else:
                ips.remove(hp.host_ip)
                if not ips:
                    del by_node[i]
                    if not by_node:
                        del self.ports[(hp.protocol, hp.port)]
        for c in terms.claims:
            ck = f"{terms.namespace}/{c}"
            m = self.claims.setdefault(ck, {})
            m[i] = m.get(i, 0) + d
            if m[i] <= 0:
                del m[i]
                if not m:
                    del self.claims[ck]

    def port_conflicts(self, hp: HostPort) -> list[int]:
        """Nodes where ``hp`` clashes with a port already taken."""
        by_node = self.ports.get((hp.protocol, hp.port))
        if not by_node:
            return []
        return [i for i, ips in by_node.items() if any(hp.conflicts(HostPort(hp.port, hp.protocol, ip)) for ip in ips)]

    def copy(self) -> PodIndex:
        c = PodIndex(self.n)
        c.ns_labels = self.ns_labels
        c.pods = dict(self.pods)
        c._counts = {k: (p, a.copy()) for k, (p, a) in self._counts.items()}
        c.anti = {k: a.copy() for k, a in self.anti.items()}
        c.sym = {k: a.copy() for k, a in self.sym.items()}
        c.ports = {k: {i: list(ips) for i, ips in v.items()} for k, v in self.ports.items()}
        c.claims = {k: dict(v) for k, v in self.claims.items()}
        return c


def _bump_arr(d: dict, key: Hashable, i: int, delta: int, n: int) -> None:
    arr = d.get(key)
    if arr is None:
        if delta < 0:
            return
        arr = d[key] = np.zeros(n, dtype=np.int64)
    arr[i] += delta
    if delta < 0 and arr[i] <= 0 and not arr.any():
        del d[key]


def domain_counts(dom: np.ndarray, ndom: int, counts: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Sum of per-node ``counts`` per topology domain (``dom[i]`` = -1: node lacks the key)."""
    sel = dom >= 0
    if mask is not None:
        sel &= mask
    return np.bincount(dom[sel], weights=counts[sel], minlength=ndom).astype(np.int64)


def per_node(dom: np.ndarray, dc: np.ndarray) -> np.ndarray:
    """A per-domain value spread back onto the nodes (0 where the node lacks the key)."""
    out = np.zeros(dom.size, dtype=np.int64)
    has = dom >= 0
    out[has] = dc[dom[has]]
    return out
