"""Filters that skip a pod (kube-scheduler's PreFilter Skip, ``framework._FilterSkips``) change nothing.

Two checks on random clusters (labels, taints, cordoned and spot nodes, GPUs) and random pods (selectors, tolerations,
declared features, pod (anti-)affinity, spread, host ports, GPUs), with pods placed, removed and nodes changed
in between:

* every filter plugin whose ``skips`` says yes returns ``passes_all`` from ``filter`` (so the framework could not
  have missed a rejection);
* a refused pod's reason counts, taken from the filters' rejections, are those of the per-node first failures;
* two schedulers, one skipping and one running every filter, make the same decisions with the same statuses and
  diagnoses (reason counts, plugins, per-node reasons).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.engine.framework import Scheduler, feasible_reason_counts
from gpufleet.engine.model import Taint
from gpufleet.engine.podspec import parse_pod
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from tests.engine.builders import HOST, ZONE, gpu_node, kpod, spread_c, term

APPS = ("x", "y")
TOL = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
SPOT = "karpenter.sh/capacity-type"
TOL_CORDON = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}


@st.composite
def nodes(draw):
    out = []
    for i in range(draw(st.integers(2, 6))):
        labels = {}
        if z := draw(st.sampled_from(["a", "b", None])):
            labels[ZONE] = z
        if draw(st.booleans()):
            labels["tier"] = draw(st.sampled_from(["gold", "bronze"]))
        if draw(st.integers(0, 3)) == 0:  # SpotCapacity has something to check
            labels[SPOT] = "spot"
        taints = (Taint("dedicated", "gpu"),) if draw(st.integers(0, 3)) == 0 else ()
        out.append(gpu_node(f"n{i}", gpus=draw(st.integers(0, 2)), cpu_milli=draw(st.sampled_from([300, 2_000])),
                            labels=labels, taints=taints, unschedulable=draw(st.integers(0, 4)) == 0, max_pods=4))
    return out


@st.composite
def pods(draw, i):
    app = draw(st.sampled_from(APPS))
    kw: dict = {}
    spec: dict = {}
    if draw(st.integers(0, 3)) == 0:  # an empty selector keeps every pod of the namespace away, trace pods too
        match = draw(st.sampled_from([{"app": a} for a in APPS] + [{}]))
        kw["anti"] = (term(draw(st.sampled_from((HOST, ZONE))), **match),)
    if draw(st.integers(0, 4)) == 0:
        kw["aff"] = (term(ZONE, app=draw(st.sampled_from(APPS))),)
    if draw(st.integers(0, 3)) == 0:
        kw["spread"] = (spread_c(1, key=draw(st.sampled_from((HOST, ZONE))), hard=draw(st.booleans()), app=app),)
    if draw(st.integers(0, 3)) == 0:
        kw["host_ports"] = ((draw(st.sampled_from([80, 443])),),)
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = {"tier": draw(st.sampled_from(["gold", "bronze"]))}
    tols = [t for t in (TOL, TOL_CORDON) if draw(st.integers(0, 2)) == 0]
    if tols:
        spec["tolerations"] = tols
    p = kpod(f"p{i}", {"app": app}, cpu=draw(st.sampled_from(["100m", "1"])), **kw, **spec)
    if gpus := draw(st.integers(0, 2)):
        p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    r = parse_pod(p)
    if draw(st.integers(0, 5)) == 0:
        r = dataclasses.replace(r, node_features=frozenset({"f"}))
    if draw(st.integers(0, 2)) == 0:
        r = dataclasses.replace(r, spot=draw(st.sampled_from(["never", "allow", "prefer"])))
    if draw(st.booleans()):  # a trace pod: no labels, no terms
        r = dataclasses.replace(r, terms=None, labels=())
    return r


def _same(a, b):
    assert (a.ok, a.status.code, a.status.reasons, a.status.plugin) == (b.ok, b.status.code, b.status.reasons, b.status.plugin)
    assert (a.assignment, a.score, a.feasible_nodes) == (b.assignment, b.score, b.feasible_nodes)
    if a.diagnosis is None or b.diagnosis is None:
        assert a.diagnosis is b.diagnosis is None
    else:
        assert (a.diagnosis.counts, a.diagnosis.plugins, a.diagnosis.by_node, a.diagnosis.total_nodes) == \
            (b.diagnosis.counts, b.diagnosis.plugins, b.diagnosis.by_node, b.diagnosis.total_nodes)


def _skips_imply_passes(s: Scheduler, r) -> None:
    cycle = s.new_cycle(r)
    for p in s.profile.filters:
        skips = getattr(p, "skips", None)
        if callable(skips) and skips(r, s.state):
            assert p.filter(cycle, s.state).passes_all, (p.name, r)


def _counts_without_first_fail(s: Scheduler, r) -> None:
    """``diagnosis`` counts a refused pod's nodes from the filters' rejections; the per-node path gives the same."""
    cycle = s.new_cycle(r)
    d = s.decide(cycle)
    if d.diagnosis is not None:
        fast = s.diagnosis(cycle)
        slow = s.diagnosis(cycle, by_node=True)
        assert list(fast.counts.items()) == list(slow.counts.items()) == list(d.diagnosis.counts.items())
        assert fast.counts == feasible_reason_counts(cycle)
        assert fast.status() == slow.status()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_skipping_filters_changes_no_decision(data):
    ns = data.draw(nodes())
    policy = data.draw(st.sampled_from(["default", "bestfit", "fgd"]))
    on = Scheduler(build_profile(policy), ClusterState(ns), seed=3)
    off = Scheduler(build_profile(policy), ClusterState(ns), seed=3)
    off.skip_filters = False
    placed: list[str] = []
    for i in range(data.draw(st.integers(1, 14))):
        step = data.draw(st.integers(0, 9))
        if step == 0 and placed:  # a pod leaves (its anti-affinity with it)
            k = placed.pop(data.draw(st.integers(0, len(placed) - 1)))
            on.forget(k)
            off.forget(k)
            continue
        if step == 1:  # node metadata changes: cordon or uncordon, taint or untaint (a new epoch)
            n = ns[data.draw(st.integers(0, len(ns) - 1))]
            labels = {k: v for k, v in n.labels.items() if k != SPOT} if SPOT in n.labels else {**n.labels, SPOT: "spot"}
            n2 = dataclasses.replace(n, unschedulable=not n.unschedulable, labels=labels,
                                     taints=() if n.taints else (Taint("dedicated", "gpu"),))
            ns = [n2 if m.name == n.name else m for m in ns]
            for s in (on, off):
                for gone in s.state.update_node(n2):
                    if gone.pod_key in placed:
                        placed.remove(gone.pod_key)
            continue
        r = data.draw(pods(i))
        _skips_imply_passes(on, r)
        _counts_without_first_fail(on, r)
        _same(on.explain(r), off.explain(r))
        a, b = on.schedule(r), off.schedule(r)
        _same(a, b)
        if a.ok:
            placed.append(r.key)


def _trace(i: int):
    return dataclasses.replace(parse_pod(kpod(f"t{i}")), terms=None, labels=())


def test_a_placed_pods_anti_affinity_stops_the_skip_and_its_leaving_restores_it():
    s = Scheduler(build_profile("bestfit"), ClusterState([gpu_node("n0"), gpu_node("n1")]), seed=3)
    first = s.schedule(_trace(0)).assignment.node  # InterPodAffinity skipped: nothing placed carries anti-affinity
    assert "InterPodAffinity" not in [p.name for p in s._active_filters(_trace(9), s.state)]
    a = s.schedule(parse_pod(kpod("a", anti=(term(HOST),))))  # an empty selector: keeps every pod of its namespace away
    assert a.ok
    assert "InterPodAffinity" in [p.name for p in s._active_filters(_trace(9), s.state)]
    for i in range(1, 4):  # the same kind of pod as before, same epoch: the plan made before must not be reused
        d = s.schedule(_trace(i))
        assert d.ok and d.assignment.node != a.assignment.node, (first, a.assignment.node, d.assignment.node)
    s.forget(a.assignment.pod_key)
    assert "InterPodAffinity" not in [p.name for p in s._active_filters(_trace(9), s.state)]


def test_a_cordon_or_a_taint_stops_the_skip():
    ns = [gpu_node("n0"), gpu_node("n1")]
    s = Scheduler(build_profile("bestfit"), ClusterState(ns), seed=3)
    assert s.schedule(_trace(0)).ok
    s.state.update_node(dataclasses.replace(ns[0], unschedulable=True))
    s.state.update_node(dataclasses.replace(ns[1], taints=(Taint("dedicated", "gpu"),)))
    d = s.schedule(_trace(1))
    assert not d.ok
    assert d.diagnosis is not None and d.diagnosis.counts == {
        "node(s) were unschedulable": 1, "node(s) had untolerated taint {dedicated: gpu}": 1}
