"""Queues with quotas and borrowing, gangs, and preemption -- scenario and property tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.gang import place_gang, schedule_gangs
from gpufleet.engine.model import PodRequest
from gpufleet.engine.preemption import find_victims, preempt
from gpufleet.engine.queues import Queue, QueueQuota, QueueTree
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile

from ..engine.builders import gpu_node


def cluster(n_nodes=2, gpus=4, queues=None):
    state = ClusterState([gpu_node(f"n{i}", gpus, cpu_milli=64_000, mem_mib=512_000) for i in range(n_nodes)])
    prof = build_profile("bestfit")
    tree = None
    if queues is not None:
        tree = QueueTree(queues, state)
        prof.pre_filters = [QueueQuota(tree)]
    return state, Scheduler(prof, state, seed=0), tree


def gpu_pod(name, n=1, queue=None, prio=0, group=None):
    return PodRequest(name=name, cpu_milli=1000, memory_mib=1024, gpu_count=n, gpu_milli=1000, queue=queue, priority=prio, pod_group=group)


def test_queue_quota_borrowing_and_reason():
    qa = Queue("team-a", {"gpu_milli": 4000}, borrowing_limit={"gpu_milli": 2000})
    qb = Queue("team-b", {"gpu_milli": 4000})
    state, s, tree = cluster(queues=[qa, qb])
    for i in range(6):  # 4 nominal + 2 borrowed from idle team-b
        assert s.schedule(gpu_pod(f"a{i}", queue="team-a")).ok, i
    d = s.schedule(gpu_pod("a6", queue="team-a"))
    assert not d.ok and "queue team-a: gpu_milli quota 4000 + borrowing limit 2000 exhausted (6000 used" in d.status.message
    # team-b wants its quota back: the borrowed pods are the reclaim candidates, youngest first
    assert [a.pod_key for a in tree.borrowed()][:2] == ["default/a5", "default/a4"]


def test_no_borrowing_when_nothing_idle():
    qa = Queue("a", {"gpu_milli": 2000})
    qb = Queue("b", {"gpu_milli": 2000})
    state, s, tree = cluster(n_nodes=1, queues=[qa, qb])
    for i in range(2):
        assert s.schedule(gpu_pod(f"b{i}", queue="b")).ok
    for i in range(2):
        assert s.schedule(gpu_pod(f"a{i}", queue="a")).ok
    d = s.schedule(gpu_pod("a2", queue="a"))
    assert not d.ok and "nothing idle to borrow" in d.status.message
    assert not s.schedule(gpu_pod("x", queue="nope")).ok


def test_drf_orders_the_poorer_queue_first():
    qa = Queue("a", {"gpu_milli": 4000, "cpu_milli": 8000})
    qb = Queue("b", {"gpu_milli": 4000, "cpu_milli": 8000}, weight=2)
    state, s, tree = cluster(queues=[qa, qb])
    s.schedule(gpu_pod("a0", n=2, queue="a"))
    s.schedule(gpu_pod("b0", n=2, queue="b"))
    order = tree.order([gpu_pod("pa", queue="a"), gpu_pod("pb", queue="b")])
    assert order[0].queue == "b"  # same usage, but b weighs twice


def test_queue_from_custom_resource_and_errors():
    q = Queue.from_json({"metadata": {"name": "ml"}, "spec": {"quota": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "256Gi",
                                                                         "nvidia.com/mig-1g.10gb": 7}, "weight": 3}})
    assert q.quota == {"gpu_milli": 8000, "cpu_milli": 64000, "memory_mib": 262144, "mig:1g.10gb": 7} and q.weight == 3
    with pytest.raises(ConfigError, match="spec.quota.bananas"):
        Queue.from_json({"metadata": {"name": "x"}, "spec": {"quota": {"bananas": 1}}})
    with pytest.raises(ConfigError, match="spec.weight"):
        Queue.from_json({"metadata": {"name": "x"}, "spec": {"weight": 0}})


def test_gang_all_or_nothing_and_rollback():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    before = state.gpu_free_milli.copy()
    r = place_gang(s, "big", [gpu_pod(f"w{i}", n=4, group="big") for i in range(3)])  # needs 12 GPUs, 8 exist
    assert not r.ok and "only 2 of the 3 required members fit" in r.status.message
    assert (state.gpu_free_milli == before).all() and not state.assignments
    r = place_gang(s, "fits", [gpu_pod(f"v{i}", n=2, group="fits") for i in range(2)])
    assert r.ok and len({d.assignment.node for d in r.placed}) == 1  # kept together on one node


def test_two_gangs_do_not_deadlock_and_both_run_eventually():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gangs = {"g1": ([gpu_pod(f"g1-{i}", n=2, group="g1") for i in range(3)], 3),
             "g2": ([gpu_pod(f"g2-{i}", n=2, group="g2") for i in range(3)], 3)}
    first = schedule_gangs(s, gangs)
    assert sum(r.ok for r in first.values()) == 1  # one runs whole, the other holds nothing
    done = next(g for g, r in first.items() if r.ok)
    waiting = next(g for g in gangs if g != done)
    assert all(a.pod_group == done for a in state.assignments.values())
    for d in first[done].placed:  # the first gang finishes
        s.forget(d.assignment.pod_key)
    second = schedule_gangs(s, {waiting: gangs[waiting]})
    assert second[waiting].ok


def test_preemption_picks_fewest_lowest_victims_and_respects_pdb():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    s.schedule(gpu_pod("n0-big", n=3, prio=5))  # bestfit packs: both land on one node
    s.schedule(gpu_pod("n0-small", n=1, prio=1))
    for i in range(4):
        s.schedule(gpu_pod(f"other{i}", n=1, prio=1))
    hi = gpu_pod("urgent", n=2, prio=100)
    assert not s.schedule(hi).ok
    snapshot = dict(state.assignments)
    plan = find_victims(s, hi)
    assert plan is not None and len(plan.victims) == 2 and all(v.priority == 1 for v in plan.victims)
    assert state.assignments == snapshot  # a dry run changes nothing
    protected = {v.pod_key for v in plan.victims}
    plan2 = find_victims(s, hi, pdb_allows=lambda a: a.pod_key not in protected)
    assert plan2 is None or not ({v.pod_key for v in plan2.victims} & protected)
    done = preempt(s, hi)
    assert done and s.schedule(hi).ok
    assert not find_victims(s, gpu_pod("low", n=8, prio=0))  # nothing of lower priority than 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([1, 2, 4])), min_size=1, max_size=40),
       st.integers(0, 3000))
def test_no_queue_exceeds_quota_plus_borrowing(stream, borrow):
    qs = [Queue("a", {"gpu_milli": 3000}, {"gpu_milli": borrow}), Queue("b", {"gpu_milli": 2000}, {"gpu_milli": 0}), Queue("c", {"gpu_milli": 1000})]
    state, s, tree = cluster(n_nodes=2, gpus=4, queues=qs)
    for i, (q, n) in enumerate(stream):
        s.schedule(gpu_pod(f"p{i}", n=n, queue=q))
        use = tree.usage()
        for qq in qs:
            if "gpu_milli" in qq.borrowing_limit:
                assert use[qq.name].get("gpu_milli", 0) <= qq.quota["gpu_milli"] + qq.borrowing_limit["gpu_milli"]
        assert sum(u.get("gpu_milli", 0) for u in use.values()) <= 8000


def test_crd_manifests_are_valid_and_parse_into_queues():
    from pathlib import Path

    import yaml

    root = Path(__file__).parents[2] / "deploy" / "crds"
    for f in ("queue.yaml", "podgroup.yaml"):
        crd = yaml.safe_load((root / f).read_text())
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["kind"] == "CustomResourceDefinition"
        assert crd["spec"]["group"] == "gpufleet.io" and crd["spec"]["versions"][0]["name"] == "v1alpha1"
        assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.gpufleet.io"
    q = Queue.from_json({"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": "vision"},
                         "spec": {"quota": {"nvidia.com/gpu": 16}, "borrowingLimit": {"nvidia.com/gpu": 8}, "parent": None}})
    assert q.borrowing_limit == {"gpu_milli": 8000}
