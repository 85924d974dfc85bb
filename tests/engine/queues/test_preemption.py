"""Preemption: the fewest lower-priority victims, whole gangs, PodDisruptionBudgets, dry-run explanation."""

from __future__ import annotations

import pytest

from gpufleet.engine.disruption import IntOrPercent, PdbStatus, PodDisruptionBudget, budgets_from
from gpufleet.engine.errors import ConfigError
from gpufleet.engine.preemption import explain_preemption, find_gang_victims, find_victims, preempt
from gpufleet.engine.selector import LabelSelector

from .helpers import cluster, gpu_pod


def budget(name, ns, match, allowed):
    return PodDisruptionBudget(name, ns, LabelSelector(match), status=PdbStatus(disruptions_allowed=allowed))


def one_node_full():
    """n0: two 1-GPU pods of priority 1 and one 2-GPU pod of priority 2 -- all 4 GPUs used."""
    state, s, _ = cluster(n_nodes=1, gpus=4)
    for p in (gpu_pod("small-a", prio=1, labels=[("app", "small")]), gpu_pod("small-b", prio=1, labels=[("app", "small")]),
              gpu_pod("pair", n=2, prio=2, labels=[("app", "pair")])):
        assert s.schedule(p).ok
    labels = {"default/small-a": {"app": "small"}, "default/small-b": {"app": "small"}, "default/pair": {"app": "pair"}}
    return state, s, labels


def test_fewest_victims_beats_greedy_lowest_priority_first():
    state, s, _ = one_node_full()
    hi = gpu_pod("urgent", n=2, prio=100)
    assert not s.schedule(hi).ok
    snap = (dict(state.assignments), state.gpu_free_milli.copy())
    plan = find_victims(s, hi)
    # greedy (lowest priority first) would evict both priority-1 pods; one pod is enough
    assert plan is not None and [v.pod_key for v in plan.victims] == ["default/pair"]
    assert state.assignments == snap[0] and (state.gpu_free_milli == snap[1]).all()  # a dry run
    assert preempt(s, hi) and s.schedule(hi).ok


def test_equal_counts_prefer_lower_priority_and_other_nodes_compete():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    s.schedule(gpu_pod("n0-big", n=3, prio=5))
    s.schedule(gpu_pod("n0-small", n=1, prio=5))
    for i in range(4):
        s.schedule(gpu_pod(f"n1-{i}", n=1, prio=1))
    assert {state.assignments["default/n0-big"].node} != {state.assignments["default/n1-0"].node}
    plan = find_victims(s, gpu_pod("one", n=1, prio=100))  # one victim anywhere: the priority-1 one
    assert len(plan.victims) == 1 and plan.victims[0].priority == 1
    plan = find_victims(s, gpu_pod("three", n=3, prio=100))  # 1 victim (priority 5) beats 3 of priority 1
    assert [v.pod_key for v in plan.victims] == ["default/n0-big"]
    assert find_victims(s, gpu_pod("low", n=1, prio=1)) is None  # only strictly lower priority may go


def test_pod_disruption_budgets_are_respected():
    state, s, labels = one_node_full()
    hi = gpu_pod("urgent", n=2, prio=100)
    pair_pdb = budget("pair", "default", (("app", "pair"),), 0)
    plan = find_victims(s, hi, budgets=budgets_from([pair_pdb], labels))
    assert sorted(v.pod_key for v in plan.victims) == ["default/small-a", "default/small-b"]
    # the small pods' budget allows one disruption: two would break it, so nothing works
    small_pdb = budget("small", "default", (("app", "small"),), 1)
    assert find_victims(s, hi, budgets=budgets_from([pair_pdb, small_pdb], labels)) is None
    lines = explain_preemption(s, hi, budgets=budgets_from([pair_pdb, small_pdb], labels))
    assert lines[0] == "preemption (dry run): no set of lower-priority pods would make room for default/urgent (priority 100)"
    assert any("default/pair is protected" in x for x in lines)
    # a budget in another namespace covers nothing here
    other = budget("pair", "prod", (("app", "pair"),), 0)
    assert [v.pod_key for v in find_victims(s, hi, budgets=budgets_from([other], labels)).victims] == ["default/pair"]
    # a veto callable works too
    assert find_victims(s, hi, pdb_allows=lambda a: a.pod_key != "default/pair").victims[0].pod_key.startswith("default/small")
    pdb = PodDisruptionBudget.from_json({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                         "metadata": {"name": "web", "namespace": "prod"},
                                         "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
                                         "status": {"disruptionsAllowed": 1}})
    assert pdb == PodDisruptionBudget("web", "prod", LabelSelector((("app", "web"),)), IntOrPercent(2),
                                      status=PdbStatus(disruptions_allowed=1))
    with pytest.raises(ConfigError, match="PodDisruptionBudget prod/x: field status.disruptionsAllowed"):
        PodDisruptionBudget.from_json({"metadata": {"name": "x", "namespace": "prod"}, "status": {"disruptionsAllowed": -1}})


def test_whole_gangs_are_victims_together():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    # gang of two 1-GPU members, one per node; the rest of the GPUs run pods we may not evict
    a = gpu_pod("g-0", prio=1, group="g")
    b = gpu_pod("g-1", prio=1, group="g")
    assert s.schedule(a).ok
    node_a = state.assignments[a.key].node
    s.schedule(gpu_pod("fill-a", n=3, prio=500))
    assert s.schedule(b).ok and state.assignments[b.key].node != node_a
    s.schedule(gpu_pod("fill-b", n=3, prio=500))
    assert state.allocated_gpu_milli() == 8000
    plan = find_victims(s, gpu_pod("urgent", n=1, prio=100))
    assert sorted(v.pod_key for v in plan.victims) == ["default/g-0", "default/g-1"]  # on both nodes
    assert "pod group g" in plan.explanation[1]
    # a gang with a member of higher priority is not a victim at all
    s.forget(b.key)
    assert s.schedule(gpu_pod("g-1", prio=200, group="g")).ok
    assert find_victims(s, gpu_pod("urgent", n=1, prio=100)) is None


def test_explanation_lines_for_explain():
    state, s, _ = one_node_full()
    lines = explain_preemption(s, gpu_pod("urgent", n=2, prio=100))
    assert lines == ["preemption (dry run): default/urgent (priority 100) fits on n0 after evicting 1 lower-priority pod(s)",
                     "evict default/pair on n0 (priority 2)"]
    lines = explain_preemption(s, gpu_pod("huge", n=8, prio=100))
    assert "1 node(s) would not fit default/huge even after evicting every lower-priority pod" in lines


def test_gang_victims_make_room_for_every_member_at_once_and_change_nothing():
    state, s, _ = cluster(n_nodes=2, gpus=2)
    for i in range(4):
        assert s.schedule(gpu_pod(f"low{i}", prio=1, labels=[("app", "low")])).ok
    members = [gpu_pod(f"w{i}", n=2, prio=100, group="train", group_min=2) for i in range(2)]
    snap = (dict(state.assignments), state.gpu_free_milli.copy())
    plan = find_gang_victims(s, "default/train", members, need=2)
    assert plan is not None and len(plan.victims) == 4  # two whole nodes
    assert state.assignments == snap[0] and (state.gpu_free_milli == snap[1]).all()  # a dry run
    assert find_gang_victims(s, "default/train", members[:1], need=1) is not None
    assert len(find_gang_victims(s, "default/train", members[:1], need=1).victims) == 2
    # a budget that allows 3 disruptions cannot cover both members
    labels = {f"default/low{i}": {"app": "low"} for i in range(4)}
    pdb = budget("low", "default", (("app", "low"),), 3)
    assert find_gang_victims(s, "default/train", members, need=2, budgets=budgets_from([pdb], labels)) is None
    # equal priority: no victims
    assert find_gang_victims(s, "default/train", [gpu_pod("w", n=2, prio=1, group="train")], need=1) is None


def test_bounded_candidate_search_takes_the_best_of_the_nodes_it_looked_at():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    for i in range(4):
        assert s.schedule(gpu_pod(f"n0-{i}", prio=1)).ok  # bestfit fills n0 first
    assert s.schedule(gpu_pod("n1-all", n=4, prio=1)).ok
    assert {state.assignments[f"default/n0-{i}"].node for i in range(4)} == {"n0"}
    hi = gpu_pod("hi", n=4, prio=100)
    assert len(find_victims(s, hi).victims) == 1  # exhaustive: n1's single pod
    assert len(find_victims(s, hi, max_candidates=1, start=0).victims) == 4  # stopped after n0
    assert [v.pod_key for v in find_victims(s, hi, max_candidates=1, start=1).victims] == ["default/n1-all"]
