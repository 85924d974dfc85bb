"""Property: random clusters and pods with random affinity / anti-affinity / spread terms.

Every decision of the engine is checked against a naive recomputation written
independently from the plugins (pairwise over the pods placed so far): a pod
is placed iff some node satisfies every required term, and only on such a
node.  At the end, every required (anti-)affinity term holds in the final
state, recomputed pairwise.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import Node
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from tests.engine.builders import HOST, ZONE, kpod, spread_c, term

APPS = ("x", "y", "z")
KEYS = (HOST, ZONE)


@st.composite
def clusters(draw):
    n = draw(st.integers(2, 7))
    nodes = []
    for i in range(n):
        labels = {HOST: f"n{i}"}
        z = draw(st.sampled_from(["a", "b", "c", None]))
        if z:
            labels[ZONE] = z
        nodes.append(Node(f"n{i}", 64_000, 256_000, labels=labels, max_pods=110))
    return nodes


@st.composite
def pods(draw, i):
    app = draw(st.sampled_from(APPS))
    ns = draw(st.sampled_from(["default", "default", "other"]))
    kw = {}
    if draw(st.booleans()):
        kw["anti"] = (term(draw(st.sampled_from(KEYS)), app=draw(st.sampled_from(APPS))),)
    if draw(st.integers(0, 3)) == 0:
        kw["aff"] = (term(draw(st.sampled_from(KEYS)), app=draw(st.sampled_from(APPS))),)
    if draw(st.integers(0, 2)) == 0:
        extra = {"minDomains": draw(st.integers(1, 4))} if draw(st.booleans()) else {}
        kw["spread"] = (spread_c(draw(st.integers(1, 2)), key=draw(st.sampled_from(KEYS)), app=app, **extra),)
    return kpod(f"p{i}", {"app": app}, namespace=ns, **kw)


def _sel_match(sel, labels):
    return sel is not None and sel.matches(labels)


def _term_match(t, q):
    return t.selector is not None and q.namespace in t.namespaces and _sel_match(t.selector, q.labels)


def naive_ok(p, node, placed, nodes):
    """Whether pod terms ``p`` may go on ``node`` given ``placed`` [(terms, node)], pairwise."""
    lab = node.labels
    for t in p.anti_affinity:
        k = t.topology_key
        if k in lab and any(_term_match(t, q) and qn.labels.get(k) == lab[k] for q, qn in placed):
            return False
    for q, qn in placed:
        for t in q.anti_affinity:
            k = t.topology_key
            if _term_match(t, p) and k in lab and qn.labels.get(k) == lab[k]:
                return False
    if p.affinity:
        matching = [(q, qn) for q, qn in placed if all(_term_match(t, q) for t in p.affinity)]
        if matching:
            for t in p.affinity:
                k = t.topology_key
                if k not in lab or not any(qn.labels.get(k) == lab[k] for _, qn in matching):
                    return False
        elif not all(_term_match(t, p) for t in p.affinity) or not all(t.topology_key in lab for t in p.affinity):
            return False
    hard = [c for c in p.spread if c.hard]
    if hard:
        if not all(c.topology_key in lab for c in hard):
            return False
        eligible = [n for n in nodes if all(c.topology_key in n.labels for c in hard)]
        for c in hard:
            k = c.topology_key
            count = {n.labels[k]: 0 for n in eligible}
            for q, qn in placed:
                if q.namespace == p.namespace and _sel_match(c.selector, q.labels) and qn.labels.get(k) in count \
                        and all(cc.topology_key in qn.labels for cc in hard):
                    count[qn.labels[k]] += 1
            low = min(count.values()) if len(count) >= c.min_domains else 0
            if count[lab[k]] + (1 if _sel_match(c.selector, p.labels) else 0) - low > c.max_skew:
                return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_decision_matches_a_naive_recomputation(data):
    nodes = data.draw(clusters())
    policy = data.draw(st.sampled_from(["default", "bestfit", "random"]))
    s = Scheduler(build_profile(policy), ClusterState(nodes), seed=0)
    by_name = {n.name: n for n in nodes}
    placed = []
    for i in range(data.draw(st.integers(1, 12))):
        r = parse_pod(data.draw(pods(i)))
        feasible = {n.name for n in nodes if naive_ok(r.terms, n, placed, nodes)}
        d = s.schedule(r)
        assert d.ok == bool(feasible), (d.status, feasible)
        if d.ok:
            assert d.assignment.node in feasible
            placed.append((r.terms, by_name[d.assignment.node]))
    # the final state: every required (anti-)affinity term holds, recomputed pairwise
    for p, pn in placed:
        for t in p.anti_affinity:
            k = t.topology_key
            assert not any(q is not p and _term_match(t, q) and k in pn.labels and qn.labels.get(k) == pn.labels[k]
                           for q, qn in placed)
        if p.affinity:
            others = [(q, qn) for q, qn in placed if q is not p and all(_term_match(t, q) for t in p.affinity)]
            assert all(t.topology_key in pn.labels for t in p.affinity)
            if not all(_term_match(t, p) for t in p.affinity):
                assert all(any(qn.labels.get(t.topology_key) == pn.labels[t.topology_key] for _, qn in others) for t in p.affinity)
    # the state's incremental counts agree with a fresh rebuild
    fresh = ClusterState(nodes)
    for a in s.state.assignments.values():
        fresh.reserve(a)
    assert fresh.pod_index.pods.keys() == s.state.pod_index.pods.keys()
    for t, arr in s.state.pod_index.anti.items():
        assert (fresh.pod_index.anti[t] == arr).all()
    for key, (pred, arr) in s.state.pod_index._counts.items():  # every kept-current count equals a fresh scan
        assert (fresh.pod_index.counts(key, pred) == arr).all(), key


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_feasible_pod_is_placed_on_an_empty_cluster(data):
    nodes = data.draw(clusters())
    r = parse_pod(data.draw(pods(0)))
    s = Scheduler(build_profile("default"), ClusterState(nodes), seed=0)
    feasible = {n.name for n in nodes if naive_ok(r.terms, n, [], nodes)}
    d = s.schedule(r)
    assert d.ok == bool(feasible)
    assert not d.ok or d.assignment.node in feasible
