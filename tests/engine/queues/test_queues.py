"""Team queues: quotas, borrowing, reclaim, hierarchy, DRF order, parsing, namespace mapping."""

from __future__ import annotations

import re

import pytest

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.queues import NamespaceQueues, Queue, QueueTree, apply_reclaim, load_queues, namespace_queue
from gpufleet.engine.status import Code
from gpufleet.engine.selector import LabelSelector

from .helpers import brute_usage, cluster, gpu_pod


def nz(use):
    return {q: {k: v for k, v in u.items() if v} for q, u in use.items()}


def test_two_teams_quota_borrowing_and_reclaim():
    """team-a borrows team-b's idle GPUs; team-b gets them back, lowest priority then youngest first."""
    qa, qb = Queue("team-a", {"gpu_milli": 4000}), Queue("team-b", {"gpu_milli": 4000})
    state, s, tree = cluster(queues=[qa, qb])
    for i in range(8):  # 4 of its own + 4 borrowed
        assert s.schedule(gpu_pod(f"a{i}", queue="team-a", prio=0 if i == 1 else 10)).ok, i
    assert tree.used("team-a", "gpu_milli") == 8000
    # a pod of team-a beyond the pool waits for quota, with a reason
    d = s.schedule(gpu_pod("a8", queue="team-a"))
    assert d.status.code is Code.WAIT and d.status.plugin == "QueueQuota"
    assert "queue team-a: over its GPU quota 4 (8 used, pod needs 1) and no idle GPU quota to borrow (8 of 8 used" in d.status.message
    assert [a.pod_key for a in tree.borrowed()] == ["default/a1", "default/a7", "default/a6", "default/a5"]
    # team-b is within its quota but there is no room: reclaim
    b0 = gpu_pod("b0", queue="team-b")
    d = s.schedule(b0)
    assert d.status.reasons == ("queue team-b: within its GPU quota 4 (0 used, pod needs 1) but that quota is lent to "
                                "other queues (8 of 8 used by all queues); reclaim needed",)
    before = dict(state.assignments)
    plan = tree.plan_reclaim(s, b0)
    assert plan is not None and [a.pod_key for a in plan.victims] == ["default/a1"]  # lowest priority, though older
    assert state.assignments == before  # planning is a dry run
    apply_reclaim(s, plan)
    assert s.schedule(b0).ok
    for name, victim in (("b1", "default/a7"), ("b2", "default/a6"), ("b3", "default/a5")):  # then the youngest
        r = gpu_pod(name, queue="team-b")
        plan = tree.plan_reclaim(s, r)
        assert [a.pod_key for a in plan.victims] == [victim]
        apply_reclaim(s, plan)
        assert s.schedule(r).ok
    assert nz(tree.usage()) == nz(brute_usage(state, tree))
    assert tree.used("team-a", "gpu_milli") == 4000 and tree.used("team-b", "gpu_milli") == 4000
    # nothing is borrowed any more: team-b's 5th pod is beyond its own quota, no reclaim for it
    r = gpu_pod("b4", queue="team-b")
    assert tree.plan_reclaim(s, r) is None and not tree.borrowed()
    assert "queue team-b: over its GPU quota 4" in s.schedule(r).status.message


def test_borrowing_limit_and_reason_text():
    qa = Queue("team-a", {"gpu_milli": 4000}, borrowing_limit={"gpu_milli": 2000})
    qb = Queue("team-b", {"gpu_milli": 4000})
    qc = Queue("team-c", {"gpu_milli": 0}, borrowing_limit={"gpu_milli": 0})
    state, s, tree = cluster(queues=[qa, qb, qc])
    for i in range(6):
        assert s.schedule(gpu_pod(f"a{i}", queue="team-a")).ok, i
    d = s.schedule(gpu_pod("a6", queue="team-a"))
    assert d.status.reasons == ("queue team-a: GPU quota 4 + borrowing limit 2 exhausted (6 used, pod needs 1)",)
    d = s.schedule(gpu_pod("c0", queue="team-c"))
    assert d.status.reasons == ("queue team-c: GPU quota 0 exhausted (0 used, pod needs 1, borrowing limit 0)",)
    d = s.schedule(gpu_pod("x", queue="nope"))
    assert d.status.code is Code.UNRESOLVABLE and "queue 'nope' does not exist" in d.status.message
    assert s.schedule(gpu_pod("free")).ok  # pods without a queue are not limited


def test_hierarchy_children_borrow_within_parent_limit():
    qs = [Queue("research", {"gpu_milli": 6000}, {"gpu_milli": 0}),
          Queue("vision", {"gpu_milli": 4000}, parent="research"),
          Queue("nlp", {"gpu_milli": 2000}, parent="research"),
          Queue("infra", {"gpu_milli": 2000})]
    state, s, tree = cluster(queues=qs)
    assert tree.path("vision") == ["vision", "research"]
    for i in range(6):  # 4 own + 2 from idle nlp, within research
        assert s.schedule(gpu_pod(f"v{i}", queue="vision")).ok, i
    d = s.schedule(gpu_pod("v6", queue="vision"))  # infra is idle, but research may not borrow
    assert "queue research: GPU quota 6 exhausted (6 used, pod needs 1, borrowing limit 0)" in d.status.message
    assert tree.used("research", "gpu_milli") == 6000
    # nlp wants its quota back: vision's borrowed pods are reclaimed
    r = gpu_pod("n0", queue="nlp")
    assert "GPU quota 6 exhausted" in s.schedule(r).status.message
    plan = tree.plan_reclaim(s, r)
    assert plan and [a.pod_key for a in plan.victims] == ["default/v5"]
    apply_reclaim(s, plan)
    assert s.schedule(r).ok
    # a parent without its own quota has its children's together
    t2 = QueueTree([Queue("p"), Queue("c1", {"gpu_milli": 1000}, parent="p"), Queue("c2", {"gpu_milli": 2000}, parent="p")], state)
    assert t2.nominal("p", "gpu_milli") == 3000 and t2.nominal("p", "cpu_milli") is None and t2.pool("gpu_milli") == 3000
    with pytest.raises(ConfigError, match="Queue a: field spec.parent: queue .ghost. does not exist"):
        QueueTree([Queue("a", parent="ghost")], state)
    with pytest.raises(ConfigError, match="loops back"):
        QueueTree([Queue("a", parent="b"), Queue("b", parent="a")], state)


def test_drf_order_by_weight_and_dominant_resource():
    qa = Queue("a", {"gpu_milli": 4000, "cpu_milli": 8000})
    qb = Queue("b", {"gpu_milli": 4000, "cpu_milli": 8000}, weight=2)
    state, s, tree = cluster(queues=[qa, qb])
    pend = [gpu_pod(f"a{i}", queue="a") for i in range(4)] + [gpu_pod(f"b{i}", queue="b") for i in range(4)]
    order = [r.name for r in tree.order(pend)]
    # weight 2: b is served until its share is twice a's
    assert order[:6] == ["a0", "b0", "b1", "a1", "b2", "b3"]
    # CPU is a's dominant resource: a queue using 1/2 of the CPU pool counts as a 1/2 share
    from gpufleet.engine.model import PodRequest

    assert s.schedule(PodRequest(name="cpu-hog", cpu_milli=8000, memory_mib=1, queue="a")).ok
    assert tree.dominant_share("a") == pytest.approx(0.5) and tree.dominant_share("b") == 0.0
    order = [r.name for r in tree.order(pend)]
    assert order[:4] == ["b0", "b1", "b2", "b3"]
    # priority first within a queue; pods without a queue keep their place in front
    pend2 = [gpu_pod("lo", queue="b"), gpu_pod("hi", queue="b", prio=9), gpu_pod("none")]
    assert [r.name for r in tree.order(pend2)] == ["none", "hi", "lo"]


def test_hierarchical_drf_splits_a_teams_share_among_its_sub_teams():
    # research (weight 1) has two sub-teams; ops (weight 1) is one team: flat DRF over the three
    # leaves would give ops a third of the turns, hierarchical DRF gives it half
    qs = [Queue("research", {"gpu_milli": 4000}), Queue("vision", parent="research"), Queue("nlp", parent="research"),
          Queue("ops", {"gpu_milli": 4000})]
    state, s, tree = cluster(queues=qs)
    pend = [gpu_pod(f"{q}{i}", queue=q) for q in ("vision", "nlp", "ops") for i in range(6)]
    first8 = [r.name for r in tree.order(pend)][:8]
    assert sum(n.startswith("ops") for n in first8) == 4
    assert sum(n.startswith("vision") for n in first8) == 2 and sum(n.startswith("nlp") for n in first8) == 2
    # a parent's own pods compete with its children as one more sibling
    pend = [gpu_pod(f"r{i}", queue="research") for i in range(4)] + [gpu_pod(f"v{i}", queue="vision") for i in range(4)]
    first4 = [r.name for r in tree.order(pend)][:4]
    assert sorted(n[0] for n in first4) == ["r", "r", "v", "v"]
    # running pods count: a sub-team already holding GPUs waits behind its sibling
    for i in range(2):
        assert s.schedule(gpu_pod(f"run{i}", queue="vision")).ok
    pend = [gpu_pod("v9", queue="vision"), gpu_pod("n9", queue="nlp")]
    assert [r.name for r in tree.order(pend)] == ["n9", "v9"]


def test_queue_custom_resource_parsing_and_errors():
    q = Queue.from_json({"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": "ml"},
                         "spec": {"quota": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "256Gi", "gpu-memory": "80Gi",
                                            "nvidia.com/mig-1g.10gb": 7},
                                  "borrowingLimit": {"nvidia.com/gpu": "500m"}, "weight": 3, "parent": "org",
                                  "namespaceSelector": {"matchLabels": {"team": "ml"}}}})
    assert q.quota == {"gpu_milli": 8000, "cpu_milli": 64000, "memory_mib": 262144, "gpu_memory_mib": 81920, "mig:1g.10gb": 7}
    assert q.borrowing_limit == {"gpu_milli": 500} and q.weight == 3 and q.parent == "org"
    assert q.namespace_selector == LabelSelector((("team", "ml"),))
    q = Queue.from_json({"metadata": {"name": "ml"}, "spec": {"namespaceSelector": {
        "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml", "nlp"]}, {"key": "frozen", "operator": "DoesNotExist"}]}}})
    m = NamespaceQueues([q], [{"metadata": {"name": n, "labels": lb}} for n, lb in
                              (("a", {"team": "nlp"}), ("b", {"team": "nlp", "frozen": "1"}), ("c", {"team": "web"}))])
    assert [m.queue_for_namespace(n) for n in "abc"] == ["ml", None, None]
    bad = [({"metadata": {"name": "x"}, "spec": {"namespaceSelector": {"matchExpressions": [{"key": "t", "operator": "Gt",
                                                                                               "values": ["1"]}]}}},
            "Queue x: field spec.namespaceSelector.matchExpressions[0].operator: unknown operator 'Gt'"),
           ({"metadata": {}}, "Queue: field metadata.name is required"),
           ({"metadata": {"name": "x"}, "spec": {"quota": {"bananas": 1}}}, "Queue x: field spec.quota.bananas: unknown resource"),
           ({"metadata": {"name": "x"}, "spec": {"quota": {"cpu": "lots"}}}, "Queue x: field spec.quota.cpu"),
           ({"metadata": {"name": "x"}, "spec": {"quota": {"nvidia.com/gpu": -1}}}, "spec.quota.nvidia.com/gpu: must be a non-negative"),
           ({"metadata": {"name": "x"}, "spec": {"weight": 0}}, "Queue x: field spec.weight"),
           ({"metadata": {"name": "x"}, "spec": {"parent": "x"}}, "cannot be its own parent"),
           ({"metadata": {"name": "x"}, "spec": {"quota": [1]}}, "field spec.quota: expected an object"),
           ({"metadata": {"name": "x"}, "spec": {"quotas": {}}}, "field spec.quotas: unknown field")]
    for obj, msg in bad:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            Queue.from_json(obj)
    good, errors = load_queues([{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}, "spec": {"weight": -2}},
                                {"metadata": {"name": "a"}}, "junk"])
    assert [q.name for q in good] == ["a"] and len(errors) == 3
    assert "Queue b: field spec.weight" in errors[0] and "defined twice" in errors[1] and "expected an object" in errors[2]


def test_namespace_to_queue_mapping():
    qs = [Queue("vision", namespace_selector=LabelSelector((("team", "vision"),))), Queue("nlp", namespaces=("nlp-train",))]
    nss = [{"metadata": {"name": "v1", "labels": {"team": "vision"}}},
           {"metadata": {"name": "v2", "labels": {"team": "vision"}, "annotations": {"gpufleet.io/queue": "nlp"}}},
           {"metadata": {"name": "lab", "labels": {"gpufleet.io/queue": "vision"}}},
           {"metadata": {"name": "nlp-train"}}, {"metadata": {"name": "other"}}]
    m = NamespaceQueues(qs, nss)
    assert namespace_queue(nss[1]) == "nlp" and namespace_queue(nss[2]) == "vision" and namespace_queue(nss[0]) is None
    assert [m.queue_for_namespace(n) for n in ("v1", "v2", "lab", "nlp-train", "other")] == ["vision", "nlp", "vision", "nlp", None]
    assert m.apply(gpu_pod("p", ns="v1")).queue == "vision"
    assert m.apply(gpu_pod("p", ns="v1", queue="nlp")).queue == "nlp"  # the pod's own annotation wins
    assert m.apply(gpu_pod("p", ns="other")).queue is None


def test_usage_follows_the_state_through_transactions_and_departures():
    qs = [Queue("a", {"gpu_milli": 8000}), Queue("b", {"gpu_milli": 8000})]
    state, s, tree = cluster(queues=qs)
    for i in range(3):
        s.schedule(gpu_pod(f"a{i}", queue="a"))
        s.schedule(gpu_pod(f"b{i}", n=2, queue="b", milli=1000))
    assert nz(tree.usage()) == nz(brute_usage(state, tree))
    with state.transaction() as tx:
        tx.evict("default/a0")
        tx.evict("default/b1")
        assert tree.used("a", "gpu_milli") == 2000 and tree.used("b", "gpu_milli") == 2000
    assert tree.used("a", "gpu_milli") == 3000 and tree.used("b", "gpu_milli") == 4000  # rolled back
    s.forget("default/b0")
    assert nz(tree.usage()) == nz(brute_usage(state, tree))


def test_reclaim_from_a_parent_that_borrowed_while_its_children_are_within_quota():
    # research guarantees 4 GPUs but its children's quotas add up to 6: the other 2 are borrowed from infra
    qs = [Queue("research", {"gpu_milli": 4000}), Queue("vision", {"gpu_milli": 4000}, parent="research"),
          Queue("nlp", {"gpu_milli": 2000}, parent="research"), Queue("infra", {"gpu_milli": 4000})]
    state, s, tree = cluster(n_nodes=2, gpus=4, queues=qs)
    for i in range(4):
        assert s.schedule(gpu_pod(f"v{i}", queue="vision")).ok
    for i in range(2):
        assert s.schedule(gpu_pod(f"n{i}", queue="nlp", prio=-1 if i == 0 else 0)).ok
    for i in range(2):
        assert s.schedule(gpu_pod(f"i{i}", queue="infra")).ok
    assert [a.pod_key for a in tree.borrowed()] == ["default/n0", "default/n1"]  # lowest priority, then youngest
    r = gpu_pod("i2", queue="infra")
    assert "lent to other queues" in s.schedule(r).status.message
    plan = tree.plan_reclaim(s, r)
    assert [a.pod_key for a in plan.victims] == ["default/n0"]
    apply_reclaim(s, plan)
    assert s.schedule(r).ok
