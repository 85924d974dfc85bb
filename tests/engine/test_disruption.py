"""The one Kubernetes object layer: label selectors and PodDisruptionBudgets as Kubernetes reads them.

Expected values are Kubernetes' own: ``k8s.io/apimachinery/pkg/labels`` for selectors, the disruption
controller (``pkg/controller/disruption``) for a budget's status, the eviction subresource
(``pkg/registry/core/pod/storage/eviction.go``) for which evictions a budget admits.
"""

from __future__ import annotations

import pytest

from gpufleet.engine.disruption import (
    Budgets,
    IntOrPercent,
    PdbStatus,
    PodDisruptionBudget,
    PodFacts,
    budgets_from,
    compute_status,
)
from gpufleet.engine.errors import ConfigError, InvalidPodSpec
from gpufleet.engine.model import Requirement
from gpufleet.engine.podterms import parse_selector
from gpufleet.engine.selector import EVERYTHING, LabelSelector, parse_label_selector, selects


def sel(raw):
    return parse_label_selector(raw, "spec.selector", lambda f, m: ConfigError(f"{f}: {m}"))


def pdb_json(spec, status=None, name="db", ns="prod", generation=1):
    obj = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": name, "namespace": ns, "generation": generation}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


# --- selectors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("expr,labels,want", [
    ({"key": "app", "operator": "In", "values": ["db", "cache"]}, {"app": "db"}, True),
    ({"key": "app", "operator": "In", "values": ["db"]}, {"app": "web"}, False),
    ({"key": "app", "operator": "In", "values": ["db"]}, {}, False),
    ({"key": "app", "operator": "NotIn", "values": ["db"]}, {"app": "web"}, True),
    ({"key": "app", "operator": "NotIn", "values": ["db"]}, {"app": "db"}, False),
    ({"key": "app", "operator": "NotIn", "values": ["db"]}, {}, True),  # absent key: NotIn holds
    ({"key": "app", "operator": "Exists"}, {"app": ""}, True),
    ({"key": "app", "operator": "Exists"}, {"other": "x"}, False),
    ({"key": "app", "operator": "DoesNotExist"}, {"other": "x"}, True),
    ({"key": "app", "operator": "DoesNotExist"}, {"app": "db"}, False),
])
def test_every_label_operator(expr, labels, want):
    assert sel({"matchExpressions": [expr]}).matches(labels) is want


def test_match_labels_and_expressions_are_anded_and_empty_is_everything_null_is_nothing():
    s = sel({"matchLabels": {"tier": "data"}, "matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]})
    assert s.matches({"tier": "data", "app": "db"})
    assert not s.matches({"tier": "data", "app": "web"}) and not s.matches({"app": "db"})
    assert sel({}) == EVERYTHING and sel({}).matches({}) and sel({}).empty
    assert sel(None) is None and not selects(None, {}) and selects(EVERYTHING, {"a": "b"})
    assert str(s) == "tier=data,app in (db)"
    assert str(sel({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "DoesNotExist"},
                                         {"key": "c", "operator": "NotIn", "values": ["x", "y"]}]})) == "a,!b,c notin (x,y)"


@pytest.mark.parametrize("raw,field", [
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "matchExpressions[0].operator"),
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "matchExpressions[0].values"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}, "matchExpressions[0].values"),
    ({"matchExpressions": {"key": "a"}}, "matchExpressions"),
    ({"matchLabels": {"a": 1}}, "matchLabels[a]"),
    ({"matchLabels": ["a"]}, "matchLabels"),
    ({"matchLabel": {"a": "b"}}, "matchLabel"),
    ("app=db", "spec.selector"),
])
def test_bad_selectors_name_the_field(raw, field):
    with pytest.raises(ConfigError, match=r"spec\.selector" + ("" if field == "spec.selector" else r"\." + field.replace("[", r"\[").replace("]", r"\]"))):
        sel(raw)


def test_pods_parse_their_selectors_with_the_same_parser():
    s = parse_selector("ns/p", "spec.affinity.x.labelSelector", {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]})
    assert s == LabelSelector((), (Requirement("a", "NotIn", ("b",)),))
    with pytest.raises(InvalidPodSpec, match=r"pod ns/p: field spec\.affinity\.x\.labelSelector\.matchExpressions\[0\]\.operator"):
        parse_selector("ns/p", "spec.affinity.x.labelSelector", {"matchExpressions": [{"key": "a", "operator": "Lt", "values": ["1"]}]})


def test_node_selector_requirements_share_the_operators_and_add_gt_lt():
    assert Requirement("gpus", "Gt", ("4",)).matches("8") and not Requirement("gpus", "Gt", ("4",)).matches("4")
    assert Requirement("gpus", "Lt", ("4",)).matches("2") and not Requirement("gpus", "Lt", ("4",)).matches("x")
    assert not Requirement("gpus", "Gt", ("4",)).matches(None)


# --- IntOrPercent --------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,total,up,down", [
    (3, 10, 3, 3), ("30%", 4, 2, 1), ("50%", 3, 2, 1), ("0%", 9, 0, 0), ("100%", 7, 7, 7), ("10%", 10, 1, 1),
    ("1%", 1, 1, 0), ("33%", 100, 33, 33),
])
def test_percentages_scale_as_kubernetes_rounds(raw, total, up, down):
    v = IntOrPercent.parse(raw, "spec.minAvailable", lambda f, m: ConfigError(m))
    assert v.scaled(total, round_up=True) == up and v.scaled(total, round_up=False) == down
    assert str(v) == str(raw)


@pytest.mark.parametrize("raw", ["50", "150%", "-1%", "x%", -1, 1.5, True, None])
def test_bad_int_or_percent(raw):
    with pytest.raises(ConfigError):
        IntOrPercent.parse(raw, "spec.minAvailable", lambda f, m: ConfigError(f"{f}: {m}"))


# --- PodDisruptionBudget parsing -------------------------------------------------------------------


def test_budget_from_json_reads_every_field():
    b = PodDisruptionBudget.from_json(pdb_json(
        {"maxUnavailable": "25%", "unhealthyPodEvictionPolicy": "AlwaysAllow",
         "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}},
        {"observedGeneration": 1, "disruptionsAllowed": 1, "currentHealthy": 4, "desiredHealthy": 3, "expectedPods": 4,
         "disruptedPods": {"db-0": "2026-01-01T00:00:00Z"}}))
    assert b.key == "prod/db" and b.max_unavailable == IntOrPercent(25, True) and b.min_available is None
    assert b.unhealthy_pod_eviction_policy == "AlwaysAllow" and b.status_current and b.allowed_now == 1
    assert b.status == PdbStatus(1, 1, 4, 3, 4, {"db-0": "2026-01-01T00:00:00Z"})
    assert b.covers("prod", {"app": "db"}) and not b.covers("dev", {"app": "db"}) and not b.covers("prod", {"app": "web"})
    assert "maxUnavailable 25%" in b.describe()


def test_a_stale_or_missing_status_allows_nothing_as_the_eviction_api_says():
    spec = {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}
    assert PodDisruptionBudget.from_json(pdb_json(spec)).allowed_now == 0  # the controller has not written it
    stale = PodDisruptionBudget.from_json(pdb_json(spec, {"observedGeneration": 1, "disruptionsAllowed": 3}, generation=2))
    assert not stale.status_current and stale.allowed_now == 0
    facts = {"prod/db-0": PodFacts("prod", "db-0", {"app": "db"})}
    assert "not yet written for this spec" in Budgets((stale,), facts).check(["prod/db-0"])


@pytest.mark.parametrize("spec,status,field", [
    ({"minAvailable": 1, "maxUnavailable": 1}, None, "spec.maxUnavailable"),
    ({"minAvailable": "50"}, None, "spec.minAvailable"),
    ({"maxUnavailable": "120%"}, None, "spec.maxUnavailable"),
    ({"unhealthyPodEvictionPolicy": "Sometimes"}, None, "spec.unhealthyPodEvictionPolicy"),
    ({"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}, None, "spec.selector.matchExpressions[0].operator"),
    ({}, {"disruptionsAllowed": -1}, "status.disruptionsAllowed"),
    ({}, {"disruptionsAllowed": "1"}, "status.disruptionsAllowed"),
    ([], None, "spec"),
])
def test_bad_budgets_name_object_and_field(spec, status, field):
    with pytest.raises(ConfigError, match=r"PodDisruptionBudget prod/db: field " + field.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        PodDisruptionBudget.from_json(pdb_json(spec, status))
    with pytest.raises(ConfigError, match="metadata.name is required"):
        PodDisruptionBudget.from_json({"metadata": {}})


def test_an_unreadable_budget_fails_closed_over_its_namespace():
    b = PodDisruptionBudget.fail_closed(pdb_json({"selector": {"matchExpressions": "junk"}}), "why")
    assert b.covers("prod", {}) and b.covers("prod", {"any": "label"}) and not b.covers("dev", {})
    assert b.allowed_now == 0
    assert "could not be read" in budgets_from([b], {"prod/x": {}}).check(["prod/x"])
    assert budgets_from([b], {"dev/x": {}}).check(["dev/x"]) is None


# --- what the eviction API admits ------------------------------------------------------------------------


def _budget(policy="IfHealthyBudget", allowed=0, current=0, desired=0, match=(("app", "db"),)):
    return PodDisruptionBudget("db", "prod", LabelSelector(match), IntOrPercent(desired),
                               unhealthy_pod_eviction_policy=policy,  # type: ignore[arg-type]
                               status=PdbStatus(0, allowed, current, desired, current))


def test_eviction_cost_follows_phase_readiness_and_the_unhealthy_policy():
    ready = PodFacts("prod", "a", {"app": "db"})
    unready = PodFacts("prod", "b", {"app": "db"}, ready=False)
    pending = PodFacts("prod", "c", {"app": "db"}, phase="Pending", ready=False)
    going = PodFacts("prod", "d", {"app": "db"}, terminating=True)
    strict = _budget(current=2, desired=3)  # below its minimum
    assert [strict.eviction_cost(p) for p in (ready, unready, pending, going)] == [1, 1, 0, 0]
    healthy = _budget(current=3, desired=3)  # at its minimum: an unready pod may go for free
    assert [healthy.eviction_cost(p) for p in (ready, unready)] == [1, 0]
    assert _budget(current=0, desired=0).eviction_cost(unready) == 1  # desiredHealthy 0: the API decrements
    assert _budget("AlwaysAllow", current=0, desired=3).eviction_cost(unready) == 0


def test_budgets_check_counts_across_victims_and_refuses_pods_under_two_budgets():
    a, b = _budget(allowed=1), _budget(allowed=5, match=(("tier", "x"),))
    pods = {f"prod/p{i}": PodFacts("prod", f"p{i}", {"app": "db"}) for i in range(3)}
    pods["prod/both"] = PodFacts("prod", "both", {"app": "db", "tier": "x"})
    pods["prod/late"] = PodFacts("prod", "late", {"app": "db", "tier": "x"}, phase="Pending", ready=False)
    bs = Budgets((a, b), pods)
    assert bs.check(["prod/p0"]) is None
    assert bs.check(["prod/p0", "prod/p1"]) == "PodDisruptionBudget prod/db allows 1 disruption(s), 2 needed"
    assert "covered by 2 PodDisruptionBudgets" in bs.check(["prod/both"]) and bs.blocked("prod/both")
    assert bs.check(["prod/late", "prod/p0"]) is None  # not running yet: the API deletes it without a budget
    assert Budgets((), pods).check(["prod/both"]) is None and not Budgets()
    assert bs.check(["prod/unknown"]) is None  # no facts: no labels, so no budget covers it


# --- the disruption controller's status -----------------------------------------------------------------------


def _pods(n, ready=True, owner="rs-1", **kw):
    return [PodFacts("prod", f"db-{i}", {"app": "db"}, ready=ready, owner_uid=owner, **kw) for i in range(n)]


def test_status_with_integer_min_available_counts_the_pods():
    b = PodDisruptionBudget.from_json(pdb_json({"minAvailable": 4, "selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["db"]}]}}))
    st = compute_status(b, _pods(4) + [PodFacts("prod", "web", {"app": "web"})])
    assert st == PdbStatus(1, 0, 4, 4, 4, {})  # the db budget: no disruption allowed
    assert compute_status(b, _pods(6)).disruptions_allowed == 2
    assert compute_status(b, _pods(6)[:5] + _pods(1, ready=False)).disruptions_allowed == 1


def test_status_with_percentages_uses_the_controllers_scale_rounded_up():
    mu = PodDisruptionBudget.from_json(pdb_json({"maxUnavailable": "30%", "selector": {"matchLabels": {"app": "db"}}}))
    st = compute_status(mu, _pods(4), scale_of=lambda uid: 4)
    assert (st.expected_pods, st.desired_healthy, st.disruptions_allowed) == (4, 2, 2)  # 30% of 4 -> 2 may go
    ma = PodDisruptionBudget.from_json(pdb_json({"minAvailable": "30%", "selector": {"matchLabels": {"app": "db"}}}))
    st = compute_status(ma, _pods(4), scale_of=lambda uid: 4)
    assert (st.desired_healthy, st.disruptions_allowed) == (2, 2)  # 30% of 4 -> 2 must stay
    # the scale counts, not the pods seen: 2 of a 4-replica set running, 2 must stay
    assert compute_status(ma, _pods(2), scale_of=lambda uid: 4).disruptions_allowed == 0
    # a controller whose scale is unknown: fail safe, nothing allowed
    assert compute_status(ma, _pods(4), scale_of=lambda uid: None).disruptions_allowed == 0
    # unmanaged pods are left out of the expected count (the controller warns)
    st = compute_status(mu, _pods(2, owner="") + _pods(2), scale_of=lambda uid: 2)
    assert st.expected_pods == 2 and st.current_healthy == 4


def test_status_leaves_out_terminating_and_disrupted_pods_and_needs_expected_pods():
    b = PodDisruptionBudget.from_json(pdb_json({"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}))
    pods = _pods(3)
    going = PodFacts("prod", "db-9", {"app": "db"}, terminating=True)
    st = compute_status(b, pods + [going], disrupted=["db-0"])
    assert st.current_healthy == 2 and st.disruptions_allowed == 1
    empty = PodDisruptionBudget.from_json(pdb_json({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "none"}}}))
    assert compute_status(empty, pods).disruptions_allowed == 0  # expected 0: nothing allowed
    assert compute_status(PodDisruptionBudget.from_json(pdb_json({"selector": {"matchLabels": {"app": "db"}}})),
                          pods).disruptions_allowed == 0  # neither minimum given


def test_pod_facts_from_pod_json():
    f = PodFacts.from_pod({"metadata": {"name": "p", "namespace": "n", "labels": {"a": "b"}, "deletionTimestamp": "x",
                                        "ownerReferences": [{"uid": "u1", "controller": True}]},
                           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    assert (f.key, f.labels, f.phase, f.ready, f.terminating, f.owner_uid) == ("n/p", {"a": "b"}, "Running", True, True, "u1")
    assert f.exempt
    g = PodFacts.from_pod({"metadata": {"name": "q"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}})
    assert g.namespace == "default" and not g.ready and not g.exempt
