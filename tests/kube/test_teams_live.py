"""Queues, reclaim, preemption and gangs in the live loop, against the in-process fake API.

Each test drives ``SchedulerLoop`` as ``gpufleet scheduler`` does: objects
arrive by list and watch, decisions go out as Bindings, deletions and events.
"""

from __future__ import annotations

from tests.kube.fake_api import FakeApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile

from tests.kube.test_loop import Clock, node


def pod(name, ns="team-a", gpus=1, priority=0, annotations=None, labels=None, node_name=None):
    spec = {"schedulerName": "gpufleet", "priority": priority, "containers": [{"name": "c", "resources": {
        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})}, "spec": spec, "status": {"phase": "Pending"}}


def queue(name, gpus, borrowing=None, **spec):
    s = {"quota": {"nvidia.com/gpu": str(gpus)}, **spec}
    if borrowing is not None:
        s["borrowingLimit"] = {"nvidia.com/gpu": str(borrowing)}
    return {"apiVersion": "gpufleet.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": s}


def namespace(name, queue_name=None):
    return {"metadata": {"name": name, "labels": {"gpufleet.io/queue": queue_name} if queue_name else {}}}


def sync(api, loop):
    """Apply every watch event since the loop's resourceVersions (what the runner's reflectors do)."""
    for kind in loop.cache.watch_kinds:
        for t, obj in api.watch(kind, loop.cache.rv[kind]):
            loop.handle(kind, t, obj)


def run(api, loop, clock, rounds=6):
    for _ in range(rounds):
        sync(api, loop)
        loop.schedule_due()
        clock.t += 61  # past any backoff
    sync(api, loop)


def cluster(gpus_per_node=4, nodes=1):
    api = FakeApi()
    for i in range(nodes):
        api.add_node(node(f"n{i}", gpus=gpus_per_node, cpu="64"))
    return api


def team_a(quota_gpus, pods=2):
    """One 4-GPU node; namespace team-a maps to queue qa (no borrowing); ``pods`` 1-GPU pods waiting."""
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", quota_gpus, borrowing=0))
    api.put_object("namespace", namespace("team-a", "qa"))
    for i in range(pods):
        api.add_pod(pod(f"p{i}"))
    return api


def make(api, clock, **kw):
    loop = SchedulerLoop(api, build_profile("bestfit"), clock=clock, **kw)
    loop.resync()
    return loop


def bound(api, ns=None):
    return sorted(k for k, p in api.pods.items() if p["spec"].get("nodeName") and (ns is None or k.startswith(ns + "/")))


def messages(api, key, reason):
    return [e["message"] for e in api.events if e["pod"] == key and e["reason"] == reason]


def test_namespace_label_maps_pods_to_a_queue_and_quota_holds_the_rest_with_a_reason():
    api = team_a(2, pods=3)
    clock = Clock()
    loop = make(api, clock)
    run(api, loop, clock)
    assert len(bound(api)) == 2
    waiting = next(k for k in api.pods if k not in bound(api))
    assert any("queue qa: GPU quota 2 exhausted" in m for m in messages(api, waiting, "FailedScheduling"))
    # the admitted queue is written on the pod, so a restart counts it again
    assert all(api.pods[k]["metadata"]["annotations"]["gpufleet.io/queue"] == "qa" for k in bound(api))


def test_restart_rebuilds_queue_usage_from_bound_pods():
    api = team_a(2)
    clock = Clock()
    run(api, make(api, clock), clock)
    assert len(bound(api)) == 2
    api.add_pod(pod("p2"))
    fresh = make(api, Clock())  # a restarted scheduler: nothing but the API
    assert fresh.cache.tree is not None and fresh.cache.tree.used("qa", "gpu_milli") == 2000
    run(api, fresh, Clock())
    assert "team-a/p2" not in bound(api)


def test_a_queue_change_is_seen_without_restart():
    api = team_a(1)
    clock = Clock()
    loop = make(api, clock)
    run(api, loop, clock)
    assert len(bound(api)) == 1
    api.put_object("queue", queue("qa", 2, borrowing=0))
    run(api, loop, clock)
    assert len(bound(api)) == 2


def test_borrowed_pods_are_reclaimed_youngest_first_when_the_owner_needs_its_quota():
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 2))
    api.put_object("queue", queue("qb", 2))
    api.put_object("namespace", namespace("team-a", "qa"))
    api.put_object("namespace", namespace("team-b", "qb"))
    clock = Clock()
    loop = make(api, clock)
    for i in range(4):  # team-a borrows team-b's idle quota
        api.add_pod(pod(f"a{i}"))
        run(api, loop, clock, rounds=1)
    assert len(bound(api, "team-a")) == 4
    api.add_pod(pod("b0", ns="team-b"))
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["team-a/a3"]  # youngest borrowed pod
    assert bound(api, "team-b") == ["team-b/b0"]
    assert any("queue qb needs its quota back" in m for m in messages(api, "team-a/a3", "Preempted"))
    assert messages(api, "team-b/b0", "Reclaiming")
    assert loop.stats.reclaimed == 1


def test_preemption_takes_the_fewest_lower_priority_pods_and_respects_a_budget():
    api = cluster(gpus_per_node=2, nodes=2)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("guarded", ns="ml", labels={"app": "db"}))
    api.add_pod(pod("pair", ns="ml", gpus=2))
    api.add_pod(pod("single", ns="ml"))
    run(api, loop, clock)
    assert len(bound(api)) == 3
    for k in ("ml/guarded", "ml/single"):  # kubelet started them (a budget counts only running pods)
        api.update_pod({**api.pods[k], "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    api.put_object("pdb", {"metadata": {"name": "db", "namespace": "ml"}, "spec": {"selector": {"matchLabels": {"app": "db"}}},
                           "status": {"disruptionsAllowed": 0}})
    api.add_pod(pod("urgent", ns="ml", gpus=1, priority=100))
    run(api, loop, clock)
    # the node with guarded+single: guarded is protected, single alone frees one GPU
    assert [k for k, _ in api.evicted] == ["ml/single"]
    assert "ml/urgent" in bound(api) and "ml/guarded" in bound(api)
    assert messages(api, "ml/urgent", "Preempting")
    urgent = api.pods["ml/urgent"]
    assert urgent["status"]["nominatedNodeName"] == urgent["spec"]["nodeName"]  # where it was promised room


def test_no_preemption_for_equal_priority_and_explain_says_why():
    api = cluster(gpus_per_node=1)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("first", ns="ml", priority=5))
    run(api, loop, clock)
    api.add_pod(pod("second", ns="ml", priority=5))
    run(api, loop, clock)
    assert not api.evicted and "ml/second" not in bound(api)
    api.add_pod(pod("third", ns="ml", priority=9))
    sync(api, loop)
    summary, _ = loop.explain(api.pods["ml/third"])
    assert "preemption (dry run)" in summary and "evict ml/first" in summary
    assert not api.evicted  # explain changes nothing


def test_a_gang_binds_all_together_or_not_at_all():
    api = cluster(gpus_per_node=2, nodes=2)
    clock = Clock()
    loop = make(api, clock)
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "3"}
    api.add_pod(pod("w0", ns="ml", annotations=g))
    api.add_pod(pod("w1", ns="ml", annotations=g))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []  # 2 of 3 members: nothing binds
    summary, _ = loop.explain(api.pods["ml/w0"])
    assert "pod group ml/train: 2 member(s) waiting, 0 running, minMember 3" in summary
    api.add_pod(pod("w2", ns="ml", annotations=g))
    run(api, loop, clock)
    assert bound(api) == ["ml/w0", "ml/w1", "ml/w2"]


def test_a_gang_that_cannot_fit_binds_nothing_and_says_so():
    api = cluster(gpus_per_node=2, nodes=1)
    clock = Clock()
    loop = make(api, clock)
    g = {"gpufleet.io/pod-group": "big", "gpufleet.io/pod-group-min-member": "3"}
    for i in range(3):
        api.add_pod(pod(f"w{i}", ns="ml", annotations=g))
    api.add_pod(pod("solo", ns="ml"))
    run(api, loop, clock)
    assert bound(api) == ["ml/solo"]
    assert any("pod group" in m or "gang" in m for m in messages(api, "ml/w0", "FailedScheduling"))
    assert not loop.round.gangs.held and loop.cache.state.gpu_free_milli.sum() == 1000  # nothing left reserved


def test_podgroup_object_sets_min_member_and_queue():
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 4, borrowing=0))
    api.put_object("podgroup", {"apiVersion": "gpufleet.io/v1alpha1", "kind": "PodGroup",
                                "metadata": {"name": "job", "namespace": "ml"}, "spec": {"minMember": 2, "queue": "qa"}})
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("m0", ns="ml", annotations={"gpufleet.io/pod-group": "job"}))
    run(api, loop, clock, rounds=2)
    assert bound(api) == []
    api.add_pod(pod("m1", ns="ml", annotations={"gpufleet.io/pod-group": "job"}))
    run(api, loop, clock)
    assert bound(api) == ["ml/m0", "ml/m1"]
    assert loop.cache.tree.used("qa", "gpu_milli") == 2000


def test_without_the_crds_the_scheduler_works_as_before():
    api = cluster()
    api.unserved |= {"queue", "podgroup"}
    api.add_pod(pod("p", ns="ml"))
    clock = Clock()
    loop = make(api, clock)
    assert "queue" not in loop.cache.watch_kinds and "namespace" in loop.cache.watch_kinds
    run(api, loop, clock)
    assert bound(api) == ["ml/p"]


def test_a_broken_queue_is_reported_and_the_others_still_apply():
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 1, borrowing=0))
    api.put_object("queue", {"metadata": {"name": "broken"}, "spec": {"weight": -1}})
    api.put_object("queue", queue("orphan", 1, parent="nowhere"))
    api.put_object("namespace", namespace("team-a", "qa"))
    api.add_pod(pod("p0"))
    api.add_pod(pod("p1"))
    clock = Clock()
    loop = make(api, clock)
    run(api, loop, clock)
    assert len(bound(api)) == 1
    assert "spec.weight" in loop.cache.objects.errors["Queue broken"]
    assert "spec.parent" in loop.cache.objects.errors["Queue orphan"]


def test_an_engine_error_in_a_gang_round_or_the_fair_share_order_does_not_stop_the_loop(monkeypatch):
    from gpufleet.engine import gang, queues

    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 4))
    api.put_object("namespace", namespace("team-a", "qa"))
    g = {"gpufleet.io/pod-group": "job", "gpufleet.io/pod-group-min-member": "2"}
    api.add_pod(pod("m0", annotations=g))
    api.add_pod(pod("m1", annotations=g))
    api.add_pod(pod("solo0"))
    api.add_pod(pod("solo1"))
    clock = Clock()
    loop = make(api, clock)

    def boom(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(gang.GangScheduler, "step", boom)
    monkeypatch.setattr(queues.QueueTree, "order", boom)
    run(api, loop, clock, rounds=2)
    assert bound(api) == ["team-a/solo0", "team-a/solo1"]  # single pods still scheduled, in priority order
    assert any("internal error placing its pod group" in m for m in messages(api, "team-a/m0", "FailedScheduling"))
    assert loop.cache.state.gpu_free_milli.sum() == 2000  # nothing half-reserved
    monkeypatch.undo()
    run(api, loop, clock)
    assert bound(api) == ["team-a/m0", "team-a/m1", "team-a/solo0", "team-a/solo1"]


def test_a_high_priority_gang_preempts_room_for_all_its_members_at_once():
    api = cluster(gpus_per_node=2, nodes=2)
    clock = Clock()
    loop = make(api, clock)
    for i in range(3):
        api.add_pod(pod(f"low{i}", ns="ml", priority=1))
    api.add_pod(pod("keep", ns="ml", priority=500))  # higher than the gang: never a victim
    run(api, loop, clock)
    assert len(bound(api)) == 4
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "2"}
    api.add_pod(pod("w0", ns="ml", priority=100, annotations=g))
    api.add_pod(pod("w1", ns="ml", priority=100, annotations=g))
    run(api, loop, clock)
    assert {"ml/w0", "ml/w1", "ml/keep"} <= set(bound(api))
    assert len(api.evicted) == 2 and all(k.startswith("ml/low") for k, _ in api.evicted)  # only what the gang needs
    assert messages(api, "ml/w0", "Preempting")


def test_a_gang_that_could_only_fit_by_evicting_higher_priority_pods_preempts_nothing():
    api = cluster(gpus_per_node=2, nodes=1)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("low", ns="ml", priority=1))
    api.add_pod(pod("high", ns="ml", priority=900))
    run(api, loop, clock)
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "2"}
    api.add_pod(pod("w0", ns="ml", priority=100, annotations=g))
    api.add_pod(pod("w1", ns="ml", priority=100, annotations=g))
    run(api, loop, clock)
    assert not api.evicted and bound(api) == ["ml/high", "ml/low"]


def test_preemption_planning_has_a_time_budget():
    api = cluster(gpus_per_node=1)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("low", ns="ml", priority=1))
    run(api, loop, clock)
    loop.preemptor.plan_debt_s = 50.0  # as if planning had just used a lot of time
    api.add_pod(pod("urgent", ns="ml", priority=100))
    run(api, loop, clock, rounds=2)
    assert not api.evicted  # skipped, retried later
    loop.preemptor.plan_debt_s = 0.0
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["ml/low"] and "ml/urgent" in bound(api)


def test_a_gang_holding_part_of_its_members_still_preempts_for_the_rest():
    api = cluster(gpus_per_node=2, nodes=2)
    clock = Clock()
    loop = make(api, clock)
    for i in range(4):
        api.add_pod(pod(f"low{i}", ns="ml", priority=1))
    run(api, loop, clock)
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "2"}
    api.add_pod(pod("w0", ns="ml", gpus=2, priority=100, annotations=g))
    run(api, loop, clock, rounds=1)  # one member: the gang starts holding what it can (nothing fits)
    assert loop.round.gangs.holder == "ml/train"
    api.add_pod(pod("w1", ns="ml", gpus=2, priority=100, annotations=g))
    run(api, loop, clock)
    assert {"ml/w0", "ml/w1"} <= set(bound(api)) and len(api.evicted) == 4


# --- issue 17: one reclaim is one eviction; a hold is named and ends with its reason ---------------


def two_teams(a_pods=4):
    """One 4-GPU node, queues qa and qb of 2 GPUs each; team-a runs ``a_pods`` 1-GPU pods (borrowing)."""
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 2))
    api.put_object("queue", queue("qb", 2))
    api.put_object("namespace", namespace("team-a", "qa"))
    api.put_object("namespace", namespace("team-b", "qb"))
    clock = Clock()
    loop = make(api, clock)
    for i in range(a_pods):
        api.add_pod(pod(f"a{i}"))
        run(api, loop, clock, rounds=1)
    assert len(bound(api, "team-a")) == a_pods
    return api, loop, clock


def test_several_pending_pods_of_a_reclaiming_queue_evict_each_victim_once():
    api, loop, clock = two_teams()
    for i in range(2):  # both pending at once: both plan before the watch shows the first victim gone
        api.add_pod(pod(f"b{i}", ns="team-b"))
    run(api, loop, clock)
    assert sorted(k for k, _ in api.evicted) == ["team-a/a2", "team-a/a3"]
    assert bound(api, "team-b") == ["team-b/b0", "team-b/b1"]
    preempted = [e for e in api.events if e["reason"] == "Preempted"]
    assert sorted(e["pod"] for e in preempted) == ["team-a/a2", "team-a/a3"]  # one event per victim
    assert {m for e in preempted for m in [e["message"]]} == {
        "reclaimed: queue qb needs its quota back for team-b/b0", "reclaimed: queue qb needs its quota back for team-b/b1"}
    reclaiming = [e for e in api.events if e["reason"] == "Reclaiming"]
    assert sorted(e["pod"] for e in reclaiming) == ["team-b/b0", "team-b/b1"]
    assert loop.stats.reclaimed == 2 and loop.stats.already_gone == 0
    assert api.calls.get("evict_pod", 0) == 2 and not loop.evictions.in_flight  # forgotten once the watch showed them gone


def test_a_victim_already_gone_is_counted_as_such_not_as_an_eviction():
    api, loop, clock = two_teams()  # qa borrows 2
    api.add_pod(pod("b0", ns="team-b"))
    api.add_pod(pod("b1", ns="team-b"))
    sync(api, loop)
    api.delete_pod("team-a/a3")  # its owner deletes it; the loop has not seen that yet
    loop.schedule_due()  # b0 picks a3 (youngest): 404; b1 picks a2
    assert loop.stats.already_gone == 1 and loop.stats.reclaimed == 1 and [k for k, _ in api.evicted] == ["team-a/a2"]
    assert [(e["pod"], e["reason"]) for e in api.events if e["reason"] in ("Preempted", "Reclaiming")] == [
        ("team-a/a2", "Preempted"), ("team-b/b1", "Reclaiming")]
    run(api, loop, clock)
    assert len(bound(api, "team-b")) == 2 and loop.stats.reclaimed == 1 and loop.stats.already_gone == 1


def test_a_terminating_victim_is_never_chosen_again():
    """With a grace period the victim stays (terminating) for a while: other pods plan around it."""
    api, loop, clock = two_teams()

    def graceful(namespace, name, uid=None, grace_period_s=None):
        with api._cv:
            key, p = api._pod("evict_pod", namespace, name)
            api.evicted.append((key, grace_period_s))
            p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            api._touch("pod", "MODIFIED", p)

    api.evict_pod = graceful
    for i in range(2):
        api.add_pod(pod(f"b{i}", ns="team-b"))
    run(api, loop, clock, rounds=3)  # 183 s of the loop's clock: past nominations and the eviction timeout
    assert sorted(k for k, _ in api.evicted) == ["team-a/a2", "team-a/a3"]
    assert loop.stats.reclaimed == 2 and bound(api, "team-b") == []
    for k in ("team-a/a2", "team-a/a3"):  # the kubelet finishes
        api.delete_pod(k)
    run(api, loop, clock)
    assert bound(api, "team-b") == ["team-b/b0", "team-b/b1"] and len(api.evicted) == 2


def test_a_pod_kept_out_by_a_gang_hold_is_told_which_gang_and_until_when_and_the_hold_ends_at_completion():
    api = cluster(gpus_per_node=4, nodes=2)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("filler", ns="ml", gpus=4))
    run(api, loop, clock, rounds=1)
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "3"}
    for i in range(2):
        api.add_pod(pod(f"w{i}", ns="ml", gpus=2, annotations=g))
        run(api, loop, clock, rounds=1)
    assert sorted(loop.round.gangs.held) == ["ml/w0", "ml/w1"]
    api.add_pod(pod("solo", ns="ml"))
    run(api, loop, clock, rounds=1)
    msg = messages(api, "ml/solo", "FailedScheduling")[-1]
    assert msg.startswith("pod group ml/train holds 4 GPU(s) on n") and "(2 of 3 arrived)" in msg
    assert "until the gang is complete or " in msg and " UTC at the latest" in msg
    summary, _ = loop.explain(api.pods["ml/solo"])
    assert "pod group ml/train holds 4 GPU(s)" in summary
    # gpufleet explain runs on a fresh snapshot: it replays the gang round to see the same hold
    fresh = make(api, Clock())
    fresh.replay_gangs()
    assert "pod group ml/train holds 4 GPU(s)" in fresh.explain(api.pods["ml/solo"])[0]
    held_msgs = messages(api, "ml/w0", "FailedScheduling")
    assert held_msgs and "holding 2 of 3 members" in held_msgs[-1]
    loop.schedule_due()
    assert loop.round.gangs.held and not loop.due_gang_members()  # held members wait, not retried in a spin
    api.add_pod(pod("w2", ns="ml", gpus=2, annotations=g))  # complete, but 6 GPUs do not fit in 4
    run(api, loop, clock, rounds=2)
    assert loop.round.gangs.held == [] and loop.round.gangs.holder is None
    assert bound(api, "ml") == ["ml/filler", "ml/solo"]
    assert "of the 3 required members fit" in messages(api, "ml/w2", "FailedScheduling")[-1]


def test_a_pod_of_higher_priority_than_the_holding_gang_ends_the_hold():
    api = cluster(gpus_per_node=2, nodes=1)
    clock = Clock()
    loop = make(api, clock)
    g = {"gpufleet.io/pod-group": "train", "gpufleet.io/pod-group-min-member": "3"}
    api.add_pod(pod("w0", ns="ml", gpus=2, annotations=g))
    run(api, loop, clock, rounds=1)
    assert loop.round.gangs.held == ["ml/w0"]
    api.add_pod(pod("urgent", ns="ml", priority=10))
    run(api, loop, clock, rounds=1)
    assert "ml/urgent" in bound(api) and loop.round.gangs.releases.get("preempted") == 1 and not api.evicted


# --- issue 35: victims by age from the pods' timestamps; budgets with matchExpressions -------------------


def _created(p, second):
    """Created at that second, started and Ready (a budget counts only running pods; the eviction API lets
    pods that have not started go without asking it)."""
    p["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{second:02d}Z"
    p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return p


def test_reclaim_takes_the_youngest_by_creation_time_even_after_a_restart_relisted_them_in_name_order():
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 2))
    api.put_object("queue", queue("qb", 2))
    api.put_object("namespace", namespace("team-a", "qa"))
    api.put_object("namespace", namespace("team-b", "qb"))
    # bound before this scheduler started (a failover): a-1 created last, a-3 first
    for name, second in (("a-1", 40), ("a-10", 30), ("a-2", 20), ("a-3", 10)):
        api.add_pod(_created(pod(name, node_name="n0"), second))
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("b0", ns="team-b"))
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["team-a/a-1"]  # the youngest borrowed pod by creationTimestamp


def test_a_budget_with_match_expressions_protects_its_pods_from_preemption_and_reclaim():
    api = cluster(gpus_per_node=4)
    api.put_object("queue", queue("qa", 2))
    api.put_object("queue", queue("qb", 2))
    api.put_object("namespace", namespace("team-a", "qa"))
    api.put_object("namespace", namespace("team-b", "qb"))
    for name, second, app in (("a0", 10, "batch"), ("a1", 20, "batch"), ("a2", 30, "db"), ("a3", 40, "db")):
        api.add_pod(_created(pod(name, node_name="n0", labels={"app": app}), second))
    api.put_object("pdb", {"metadata": {"name": "db", "namespace": "team-a", "generation": 1}, "spec": {
        "minAvailable": 2, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}})
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("b0", ns="team-b"))
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["team-a/a1"]  # a3, a2 (younger) are protected: the youngest batch pod goes
    api.add_pod(pod("urgent", ns="team-a", priority=100))  # preemption: the other batch pod, never a db pod
    api.put_object("queue", queue("qa", 3))
    run(api, loop, clock)
    assert [k for k, _ in api.evicted] == ["team-a/a1", "team-a/a0"]
    assert {"team-a/a2", "team-a/a3"} <= set(bound(api))


def test_room_a_preemption_made_is_kept_for_the_preemptor_while_its_victim_goes():
    """In one pass: urgent evicts low; late, of lower priority, would fit in the half of the node already free
    but the room is urgent's (kube-scheduler's nominatedNodeName); once low is gone urgent binds there."""
    api = cluster(gpus_per_node=4)
    clock = Clock()
    loop = make(api, clock)
    api.add_pod(pod("low", ns="ml", gpus=2))
    run(api, loop, clock, rounds=1)
    api.add_pod(pod("urgent", ns="ml", gpus=4, priority=100))
    api.add_pod(pod("late", ns="ml", gpus=2))
    sync(api, loop)
    loop.schedule_due()  # urgent first: low evicted (the watch has not shown it gone yet); then late
    assert [k for k, _ in api.evicted] == ["ml/low"] and bound(api) == []
    assert api.pods["ml/urgent"]["status"]["nominatedNodeName"] == "n0"
    assert any("nominated pod" in m for m in messages(api, "ml/late", "FailedScheduling"))
    run(api, loop, clock, rounds=3)
    assert bound(api) == ["ml/urgent"]


def test_a_restarted_scheduler_keeps_the_room_of_a_pod_nominated_before():
    """The nomination is read back from status.nominatedNodeName: peer (same priority, first in line) is kept off
    the node whose room urgent's victims freed, though it would fit there."""
    api = cluster(gpus_per_node=4)
    clock = Clock()
    api.add_pod(pod("peer", ns="ml", gpus=2, priority=100))
    def urgent():
        u = pod("urgent", ns="ml", gpus=4, priority=100)
        u["status"]["nominatedNodeName"] = "n0"
        return u
    api.add_pod(urgent())
    loop = make(api, clock)
    sync(api, loop)
    loop.schedule_due()
    assert bound(api) == ["ml/urgent"]  # tried first, as before the restart (peer, first in line otherwise, waits)
    assert not any("nominated pod" in m for m in messages(api, "ml/peer", "FailedScheduling"))
    # had peer been tried first (its backoff over, urgent's not), it would still have been kept off n0
    api2 = cluster(gpus_per_node=4)
    api2.add_pod(pod("peer", ns="ml", gpus=2, priority=100))
    api2.add_pod(urgent())
    loop2 = make(api2, clock)
    sync(api2, loop2)
    loop2.learn_waiting()
    loop2.schedule_one(api2.pods["ml/peer"])
    assert bound(api2) == [] and any("nominated pod" in m for m in messages(api2, "ml/peer", "FailedScheduling"))


def test_explain_names_the_room_kept_for_a_nominated_pod():
    """``gpufleet explain`` (a fresh process) reads the nomination back as the scheduler does and says why peer is
    kept off n0: the node keeps its room for urgent; without the nomination, peer fits there."""
    from gpufleet.kube.explain_cli import explain

    def setup(nominated: bool) -> FakeApi:
        api = cluster(gpus_per_node=4)
        api.add_pod(pod("peer", ns="ml", gpus=2, priority=100))
        u = pod("urgent", ns="ml", gpus=4, priority=100)
        if nominated:
            u["status"]["nominatedNodeName"] = "n0"
        api.add_pod(u)
        return api

    code, text = explain(setup(True), build_profile("bestfit"), "ml/peer")
    assert code == 0 and "n0" in text, text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("n0"))
    assert "keep their room for a nominated pod" in line, text
    code, text = explain(setup(False), build_profile("bestfit"), "ml/peer")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("n0"))
    assert code == 0 and "keep their room" not in text and "fits" in line, text
