"""Victims as docs/queues.md documents them, for preemption and for queue reclaim: lowest priority, then
youngest (by the adapter's age, not the order pods happened to be placed in), never a pod a
PodDisruptionBudget protects -- written with matchLabels or with matchExpressions alike.
The same scenarios run on a real apiserver in tests/kube/test_victims_apiserver.py."""

from __future__ import annotations

import pytest

from gpufleet.engine.disruption import PdbStatus, PodDisruptionBudget, budgets_from
from gpufleet.engine.queues import Queue, apply_reclaim
from gpufleet.engine.schedqueue import plan_room
from gpufleet.engine.selector import parse_label_selector

from .helpers import cluster, gpu_pod

SELECTORS = {
    "matchLabels": {"matchLabels": {"app": "db"}},
    "matchExpressions": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]},
    "NotIn+Exists": {"matchExpressions": [{"key": "app", "operator": "Exists"},
                                          {"key": "app", "operator": "NotIn", "values": ["batch", "web"]}]},
}


def db_budget(selector_raw, allowed=0):
    sel = parse_label_selector(selector_raw, "spec.selector", lambda f, m: ValueError(m))
    return PodDisruptionBudget("db", "default", sel, status=PdbStatus(disruptions_allowed=allowed))


def db_and_batch():
    """n0: four 2-GPU db pods; n1: eight 1-GPU batch pods, batch-7 the youngest.  All priority 0."""
    state, s, _ = cluster(n_nodes=2, gpus=8)
    labels = {}
    for i in range(4):
        assert s.schedule(gpu_pod(f"db-{i}", n=2, labels=[("app", "db")])).ok
        labels[f"default/db-{i}"] = {"app": "db"}
    for i in range(8):
        assert s.schedule(gpu_pod(f"batch-{i}", labels=[("app", "batch")])).ok
        labels[f"default/batch-{i}"] = {"app": "batch"}
    assert {state.assignments[f"default/db-{i}"].node for i in range(4)} == {"n0"}
    # ages from the adapter (creation order), on purpose not the order the snapshot placed them in
    age = {k: i for i, k in enumerate(sorted(labels, key=lambda k: (k.startswith("default/batch"), int(k.rsplit("-", 1)[1]))))}
    return state, s, labels, age


def test_preemption_without_a_budget_takes_the_single_db_pod():
    _, s, labels, age = db_and_batch()
    plan = plan_room(s, None, gpu_pod("urgent", n=2, prio=1000), lambda: dict(age_rank=age))
    assert plan is not None and [v.pod_key for v in plan.victims] == ["default/db-3"]  # one victim beats two, youngest db


@pytest.mark.parametrize("how", sorted(SELECTORS))
def test_a_budget_protects_db_whatever_its_selector_syntax(how):
    _, s, labels, age = db_and_batch()
    budgets = budgets_from([db_budget(SELECTORS[how])], labels)
    plan = plan_room(s, None, gpu_pod("urgent", n=2, prio=1000), lambda: dict(budgets=budgets, age_rank=age))
    assert plan is not None and plan.kind == "preempted"
    assert sorted(v.pod_key for v in plan.victims) == ["default/batch-6", "default/batch-7"]  # the two youngest batch pods
    # one disruption allowed: the single db pod is fine again
    budgets = budgets_from([db_budget(SELECTORS[how], allowed=1)], labels)
    plan = plan_room(s, None, gpu_pod("urgent", n=2, prio=1000), lambda: dict(budgets=budgets, age_rank=age))
    assert [v.pod_key for v in plan.victims] == ["default/db-3"]


def borrowed_cluster(placement_order):
    """3 nodes x 8 GPUs; team-a (quota 16) runs a-1..a-24, so 8 are borrowed from team-b (quota 8).

    ``placement_order``: the order the snapshot places team-a's pods in (a relist, concurrent binds);
    their age (creation order) is always a-1 oldest .. a-24 youngest."""
    qs = [Queue("team-a", {"gpu_milli": 16_000}), Queue("team-b", {"gpu_milli": 8_000})]
    state, s, tree = cluster(n_nodes=3, gpus=8, queues=qs)
    for i in placement_order:
        assert s.schedule(gpu_pod(f"a-{i}", queue="team-a", labels=[("app", f"a{i}")])).ok
    labels = {f"default/a-{i}": {"app": f"a{i}"} for i in range(1, 25)}
    age = {f"default/a-{i}": i for i in range(1, 25)}
    return state, s, tree, labels, age


ALPHABETICAL = sorted(range(1, 25), key=lambda i: f"a-{i}")  # a-1, a-10, a-11, ..., a-19, a-2, a-20, ...


@pytest.mark.parametrize("order", [list(range(1, 25)), ALPHABETICAL, list(range(24, 0, -1))], ids=["created", "alphabetical", "reversed"])
def test_reclaim_takes_the_youngest_borrowed_pods_whatever_order_they_were_placed_in(order):
    _, s, tree, labels, age = borrowed_cluster(order)
    taken = []
    for j in range(8):
        r = gpu_pod(f"b-{j}", queue="team-b")
        plan = plan_room(s, tree, r, lambda: dict(age_rank=age))
        assert plan is not None and plan.kind == "reclaimed"
        taken += [v.pod_key for v in plan.victims]
        for v in plan.victims:
            s.forget(v.pod_key)
        assert s.schedule(r).ok
    assert taken == [f"default/a-{i}" for i in range(24, 16, -1)]  # a-24 first, down to a-17; a-1..a-16 stay


def test_reclaim_passes_over_a_pod_a_budget_protects():
    _, s, tree, labels, age = borrowed_cluster(range(1, 25))
    pdb = db_budget({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a24", "a23"]}]})
    budgets = budgets_from([pdb], labels)
    r = gpu_pod("b-0", queue="team-b")
    plan = plan_room(s, tree, r, lambda: dict(budgets=budgets, age_rank=age))
    assert [v.pod_key for v in plan.victims] == ["default/a-22"]
    # the queue tree's own dry run says so too, for `gpufleet explain`
    plan2 = tree.plan_reclaim(s, r, victim_args=lambda: dict(budgets=budgets, age_rank=age))
    assert [v.pod_key for v in plan2.victims] == ["default/a-22"]
    apply_reclaim(s, plan2)
    assert s.schedule(r).ok


def test_reclaim_of_equal_pods_without_an_age_falls_back_to_placement_order():
    _, s, tree, _, _ = borrowed_cluster(range(1, 25))
    plan = tree.plan_reclaim(s, gpu_pod("b-0", queue="team-b"))
    assert [v.pod_key for v in plan.victims] == ["default/a-24"]
