"""Property tests for the object layer: label selectors and PodDisruptionBudgets.

The safety property: any set of evictions ``Budgets.check`` accepts leaves every budget with at
least the healthy pods it wants (its ``desiredHealthy``), whatever the selectors (every operator),
the minimum (integer or percentage, minAvailable or maxUnavailable), the unhealthy-pod policy and
the pods' readiness and phase.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.engine.disruption import Budgets, IntOrPercent, PodDisruptionBudget, PodFacts, compute_status
from gpufleet.engine.errors import ConfigError
from gpufleet.engine.selector import LABEL_OPERATORS, parse_label_selector

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)
KEYS = ["app", "tier", "team"]
VALUES = ["a", "b", "c"]

labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)


@st.composite
def expr_st(draw):
    op = draw(st.sampled_from(LABEL_OPERATORS))
    e = {"key": draw(st.sampled_from(KEYS)), "operator": op}
    if op in ("In", "NotIn"):
        e["values"] = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True))
    return e


selector_raw_st = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    "matchExpressions": st.lists(expr_st(), max_size=3)})


def parse(raw):
    return parse_label_selector(raw, "s", lambda f, m: ConfigError(m))


def reference(raw, labels):
    """The selector semantics written out from the Kubernetes API reference, one requirement at a time."""
    for k, v in (raw.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in raw.get("matchExpressions") or []:
        has, v = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and v in e.get("values", []), "NotIn": not has or v not in e.get("values", []),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


@SETTINGS
@given(raw=selector_raw_st, labels=labels_st)
def test_selector_matches_the_reference_semantics(raw, labels):
    assert parse(raw).matches(labels) == reference(raw, labels)


@SETTINGS
@given(k=st.sampled_from(KEYS), v=st.sampled_from(VALUES), labels=labels_st)
def test_match_labels_is_an_in_requirement_with_one_value(k, v, labels):
    assert parse({"matchLabels": {k: v}}).matches(labels) == parse(
        {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}).matches(labels)


@SETTINGS
@given(k=st.sampled_from(KEYS), vals=st.lists(st.sampled_from(VALUES), min_size=1, unique=True), labels=labels_st)
def test_notin_and_doesnotexist_are_the_complements(k, vals, labels):
    def m(op, values=None):
        e = {"key": k, "operator": op, **({"values": values} if values else {})}
        return parse({"matchExpressions": [e]}).matches(labels)
    assert m("NotIn", vals) == (not m("In", vals))
    assert m("DoesNotExist") == (not m("Exists"))


@SETTINGS
@given(pct=st.integers(0, 100), total=st.integers(0, 10_000))
def test_percent_scaling_is_kubernetes_float_ceil_and_floor(pct, total):
    v = IntOrPercent(pct, True)
    assert v.scaled(total, True) == math.ceil(total * pct / 100)
    assert v.scaled(total, False) == math.floor(total * pct / 100)
    assert 0 <= v.scaled(total, True) - v.scaled(total, False) <= 1


@st.composite
def cluster_st(draw):
    n_owners = draw(st.integers(1, 3))
    pods = []
    for i in range(draw(st.integers(0, 10))):
        phase = draw(st.sampled_from(["Running", "Running", "Running", "Pending", "Succeeded"]))
        pods.append(PodFacts("ns", f"p{i}", draw(labels_st), phase,  # type: ignore[arg-type]
                             ready=phase == "Running" and draw(st.booleans() | st.just(True)),
                             terminating=draw(st.booleans()) and draw(st.booleans()),
                             owner_uid=draw(st.sampled_from([""] + [f"o{j}" for j in range(n_owners)]))))
    scale = {f"o{j}": draw(st.integers(0, 6)) for j in range(n_owners)}
    pdbs = []
    for i in range(draw(st.integers(1, 3))):
        spec = {"selector": draw(selector_raw_st),
                "unhealthyPodEvictionPolicy": draw(st.sampled_from(["IfHealthyBudget", "AlwaysAllow"]))}
        field = draw(st.sampled_from(["minAvailable", "maxUnavailable"]))
        spec[field] = draw(st.integers(0, 6) | st.integers(0, 100).map(lambda p: f"{p}%"))
        b = PodDisruptionBudget.from_json({"metadata": {"name": f"b{i}", "namespace": "ns", "generation": 1}, "spec": spec})
        st_ = compute_status(b, pods, scale.get)
        pdbs.append(PodDisruptionBudget(b.name, b.namespace, b.selector, b.min_available, b.max_unavailable,
                                        b.unhealthy_pod_eviction_policy, b.generation, st_))
    victims = draw(st.lists(st.sampled_from([p.key for p in pods]), unique=True) if pods else st.just([]))
    return pods, pdbs, victims


@SETTINGS
@given(c=cluster_st())
def test_accepted_evictions_never_take_a_budget_below_its_desired_healthy_pods(c):
    pods, pdbs, victims = c
    budgets = Budgets(tuple(pdbs), {p.key: p for p in pods})
    if budgets.check(victims) is not None:
        return
    gone = set(victims)
    for b in pdbs:
        assert b.status is not None
        covered = [p for p in pods if b.covers_pod(p)]
        healthy_after = sum(1 for p in covered if p.ready and not p.terminating and p.key not in gone)
        ready_victims = [p for p in covered if p.key in gone and p.ready and not p.exempt]
        if ready_victims:  # a healthy pod went: the budget had room for it
            assert healthy_after >= b.status.desired_healthy
        assert b.status.disruptions_allowed >= 0
        assert b.status.disruptions_allowed <= max(0, b.status.current_healthy - b.status.desired_healthy)


@SETTINGS
@given(c=cluster_st())
def test_a_superset_of_a_refused_set_is_refused(c):
    pods, pdbs, victims = c
    budgets = Budgets(tuple(pdbs), {p.key: p for p in pods})
    if victims and budgets.check(victims[:-1]) is not None:
        assert budgets.check(victims) is not None
