"""Gangs: all-or-nothing transactions, topology preference, no deadlock, timeouts."""

from __future__ import annotations

import pytest

from gpufleet.engine.errors import ConfigError
from gpufleet.engine.gang import GangScheduler, PodGroup, groups_from_pods, place_gang, schedule_gangs
from gpufleet.engine.queues import Queue

from ..builders import gpu_node
from .helpers import cluster, gpu_pod


def test_gang_all_or_nothing_and_rollback():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    before = (state.gpu_free_milli.copy(), state.cpu_free.copy(), state.version.sum())
    r = place_gang(s, "big", [gpu_pod(f"w{i}", n=4, group="big") for i in range(3)])  # 12 GPUs, 8 exist
    assert not r.ok and "only 2 of the 3 required members fit" in r.status.message and not r.placed
    assert (state.gpu_free_milli == before[0]).all() and (state.cpu_free == before[1]).all() and not state.assignments
    # min member 2 of 3: the two that fit are enough
    r = place_gang(s, "elastic", [gpu_pod(f"e{i}", n=4, group="elastic") for i in range(3)], min_member=2)
    assert r.ok and len(r.placed) == 2 and len(state.assignments) == 2


def test_gang_prefers_one_node():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    assert s.schedule(gpu_pod("resident", n=2)).ok  # n0 keeps 2 free: best fit for one 2-GPU member
    r = place_gang(s, "pair", [gpu_pod(f"v{i}", n=2, group="pair") for i in range(2)])
    assert r.ok and {d.assignment.node for d in r.placed} == {"n1"}  # both on the empty node
    # without a node that holds all, members stay as close as they can
    state, s, _ = cluster(n_nodes=3, gpus=4)
    r = place_gang(s, "wide", [gpu_pod(f"w{i}", n=2, group="wide") for i in range(4)])
    assert r.ok and len({d.assignment.node for d in r.placed}) == 2


def test_gang_prefers_one_nvlink_domain():
    key = "nvidia.com/gpu.clique"
    nodes = [gpu_node(f"n{i}", 4, cpu_milli=64_000, mem_mib=512_000, labels={key: "A" if i < 2 else "B"}) for i in range(4)]
    state, s, _ = cluster(nodes=nodes)
    assert s.schedule(gpu_pod("resident", n=1)).ok
    occupied = state.assignments["default/resident"].node
    r = place_gang(s, "ring", [gpu_pod(f"r{i}", n=4, group="ring") for i in range(2)])
    assert r.ok
    doms = {state.nodes[state.index[d.assignment.node]].labels[key] for d in r.placed}
    other = "B" if state.nodes[state.index[occupied]].labels[key] == "A" else "A"
    assert doms == {other}  # the one domain with 8 free GPUs


def test_gang_respects_queue_quota_as_a_whole():
    state, s, tree = cluster(queues=[Queue("t", {"gpu_milli": 3000}, {"gpu_milli": 0})])
    r = place_gang(s, "g", [gpu_pod(f"g{i}", queue="t", group="g") for i in range(4)])
    assert not r.ok and "GPU quota 3 exhausted" in r.status.message
    assert not state.assignments and tree.used("t", "gpu_milli") == 0


def test_two_gangs_arriving_member_by_member_do_not_deadlock():
    """Each gang needs 6 of the 8 GPUs.  Without the one-hold rule both would hold 4 and wait forever."""
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gs = GangScheduler(s, timeout_s=100)
    g1 = [gpu_pod(f"g1-{i}", n=2, group="g1", group_min=3) for i in range(3)]
    g2 = [gpu_pod(f"g2-{i}", n=2, group="g2", group_min=3) for i in range(3)]
    t = 0.0
    for a, b in zip(g1[:2], g2[:2]):  # interleaved arrivals
        gs.add(a, t)
        gs.add(b, t + 0.5)
        gs.step(t + 1)
        held = {state.assignments[k].pod_group for k in gs.held}
        assert held <= {"g1"}  # only one gang ever holds tentative reservations
        t += 1
    assert gs.holder == "default/g1" and len(gs.held) == 2
    assert not any(a.pod_group == "g2" for a in state.assignments.values())
    gs.add(g1[2], t)
    out = {r.group: r for r in gs.step(t)}
    assert out["default/g1"].ok and len(out["default/g1"].placed) == 3
    # g1 runs; g2 may now hold what is left (2 GPUs) while its members arrive
    assert gs.holder == "default/g2" and len(gs.held) == 1
    gs.add(g2[2], t)  # complete, but 6 GPUs do not fit in 2: one transaction or nothing -- no hold left
    out = {r.group: r for r in gs.step(t + 1)}
    assert not out["default/g2"].ok and "only 1 of the 3 required members fit" in out["default/g2"].status.message
    assert gs.holder is None and gs.held == [] and not any(a.pod_group == "g2" for a in state.assignments.values())
    for p in g1:  # g1 finishes
        gs.remove(p.key)
    out = {r.group: r for r in gs.step(t + 2)}
    assert out["default/g2"].ok and sum(a.pod_group == "g2" for a in state.assignments.values()) == 3


def test_hold_times_out_and_releases_its_reservations():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gs = GangScheduler(s, timeout_s=30)
    stuck = [gpu_pod(f"s{i}", n=2, group="stuck", group_min=4) for i in range(3)]  # its 4th member never comes
    for p in stuck:
        gs.add(p, 0)
    gs.step(0)
    assert gs.holder == "default/stuck" and len(gs.held) == 3 and state.allocated_gpu_milli() == 6000
    big = [gpu_pod(f"b{i}", n=2, group="big", group_min=3) for i in range(3)]
    for p in big:
        gs.add(p, 5)
    out = {r.group: r for r in gs.step(10)}
    assert not out["default/big"].ok and out["default/stuck"].status.code.value == "wait"
    res = gs.step(31)  # past the timeout: released, and big runs in the same round
    assert "timed out after 30 s with 3 of 4 members reserved; released" in res[0].status.message
    assert gs.timeouts == 1 and next(r for r in res if r.group == "default/big").ok
    assert sum(a.pod_group == "big" for a in state.assignments.values()) == 3
    # the stuck gang does not hold again at once (that would outlive its timeout) ...
    assert gs.holder is None and gs.held == []
    out = {r.group: r for r in gs.step(40)}
    assert gs.holder is None and "holds nothing until another member arrives" in out["default/stuck"].status.message
    gs.add(gpu_pod("s3", n=2, group="stuck", group_min=5), 41)  # ... but when another member arrives
    gs.step(41)
    assert gs.holder == "default/stuck" and len(gs.held) == 1  # what is left after big
    for i in range(4):
        gs.remove(f"default/s{i}")
    assert gs.held == [] and gs.holder is None and state.allocated_gpu_milli() == 6000


def test_late_members_join_a_running_gang_and_schedule_gangs():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gs = GangScheduler(s)
    for i in range(2):
        gs.add(gpu_pod(f"w{i}", group="job", group_min=2), 0)
    assert gs.step(0)[0].ok
    gs.add(gpu_pod("w2", group="job", group_min=2), 1)
    r = gs.step(1)[0]
    assert r.ok and r.placed[0].assignment.node == state.assignments["default/w0"].node
    # one-shot helper: the higher-priority gang first, never both partly
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gangs = {"lo": ([gpu_pod(f"lo{i}", n=2, group="lo") for i in range(3)], 3),
             "hi": ([gpu_pod(f"hi{i}", n=2, group="hi", prio=5) for i in range(3)], 3)}
    out = schedule_gangs(s, gangs)
    assert out["hi"].ok and not out["lo"].ok and {a.pod_group for a in state.assignments.values()} == {"hi"}


def test_pod_group_objects_and_annotations():
    g = PodGroup.from_json({"apiVersion": "gpufleet.io/v1alpha1", "kind": "PodGroup",
                            "metadata": {"name": "llama", "namespace": "nlp"},
                            "spec": {"minMember": 4, "queue": "nlp", "scheduleTimeoutSeconds": 300}})
    assert (g.key, g.min_member, g.queue, g.timeout_s) == ("nlp/llama", 4, "nlp", 300.0)
    for spec, field in (({}, "spec.minMember"), ({"minMember": 0}, "spec.minMember"),
                        ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "spec.scheduleTimeoutSeconds"),
                        ({"minMember": 2, "queue": 3}, "spec.queue")):
        with pytest.raises(ConfigError, match=f"PodGroup nlp/x: field {field}"):
            PodGroup.from_json({"metadata": {"name": "x", "namespace": "nlp"}, "spec": spec})
    groups = groups_from_pods([gpu_pod("a", group="g", group_min=3), gpu_pod("b", group="g", prio=7), gpu_pod("c", group="h"),
                               gpu_pod("d", group="h"), gpu_pod("e")])
    assert groups["default/g"].min_member == 3 and groups["default/g"].priority == 7
    assert groups["default/h"].min_member == 2 and "default/e" not in groups



@pytest.mark.parametrize("parse,api", [(PodGroup.from_json, ""), (PodGroup.from_scheduling_json, " (scheduling.k8s.io/v1beta1)")])
@pytest.mark.parametrize("obj,message", [
    ({}, "PodGroup: field metadata.name is required"),
    ({"metadata": {"name": ""}}, "PodGroup: field metadata.name is required"),
    ({"metadata": {"name": 3}, "spec": {}}, "PodGroup: field metadata.name is required"),
    ({"metadata": {"name": "x"}}, "PodGroup default/x{api}: field spec: required object"),
    ({"metadata": {"name": "x", "namespace": "nlp"}, "spec": []}, "PodGroup nlp/x{api}: field spec: required object"),
])
def test_both_pod_group_kinds_name_a_missing_name_or_spec(parse, api, obj, message):
    with pytest.raises(ConfigError) as exc:
        parse(obj)
    assert str(exc.value) == message.format(api=api)

# --- the hold's life cycle (issue 17) ----------------------------------------------------------


def _arrive(gs, pods, t):
    for p in pods:
        gs.add(p, t)
    return {r.group: r for r in gs.step(t)}


def test_a_hold_grows_while_members_arrive_and_completion_is_one_transaction_counted_once():
    state, s, tree = cluster(n_nodes=2, gpus=4, queues=[Queue("t", {"gpu_milli": 8000})])
    gs = GangScheduler(s, timeout_s=600)
    m = [gpu_pod(f"m{i}", n=2, queue="t", group="g", group_min=3) for i in range(3)]
    out = _arrive(gs, m[:1], 0)
    assert gs.holder == "default/g" and gs.held == ["default/m0"]
    assert out["default/g"].status.code.value == "wait" and "holding 1 of 3 members, 1 arrived" in out["default/g"].status.message
    _arrive(gs, m[1:2], 1)
    assert sorted(gs.held) == ["default/m0", "default/m1"] and state.allocated_gpu_milli() == 4000
    assert tree.used("t", "gpu_milli") == 0  # a hold takes capacity, not quota
    out = _arrive(gs, m[2:], 2)
    assert out["default/g"].ok and sorted(d.pod_key for d in out["default/g"].placed) == [p.key for p in m]
    assert gs.holder is None and gs.held == [] and gs.releases == {"complete": 1}
    assert state.allocated_gpu_milli() == 6000 and tree.used("t", "gpu_milli") == 6000  # placed: counted, once


def test_a_complete_gang_that_does_not_fit_releases_its_hold_at_once_and_blocked_pods_are_told_why():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    assert s.schedule(gpu_pod("filler", n=4)).ok
    gs = GangScheduler(s, timeout_s=600)
    m = [gpu_pod(f"m{i}", n=2, group="g", group_min=3) for i in range(3)]
    _arrive(gs, m[:2], 0)
    assert len(gs.held) == 2 and state.allocated_gpu_milli() == 8000
    solo = gpu_pod("solo")
    assert not s.decide(s.new_cycle(solo)).ok  # only the hold keeps it out
    why = gs.blocked_by_hold(solo, 100)
    free_node = state.assignments["default/m0"].node
    assert why == (f"pod group default/g holds 4 GPU(s) on {free_node} for its members still arriving (2 of 3 arrived), "
                   "until the gang is complete or in 500 s at the latest")
    assert gs.blocked_by_hold(gpu_pod("huge", n=8), 100) == ""  # would not fit without the hold either
    assert gs.hold_deadline() == 600
    out = _arrive(gs, m[2:], 101)  # complete: 6 GPUs needed, 4 free -> nothing held, nothing placed
    assert not out["default/g"].ok and "only 2 of the 3 required members fit" in out["default/g"].status.message
    assert gs.holder is None and gs.held == [] and state.allocated_gpu_milli() == 4000
    assert gs.blocked_by_hold(solo, 102) == "" and s.schedule(solo).ok
    out = {r.group: r for r in gs.step(103)}  # and it stays that way: complete gangs never hold
    assert not out["default/g"].ok and gs.holder is None and gs.held == []


def test_a_hold_goes_with_its_members():
    state, s, _ = cluster(n_nodes=2, gpus=4)
    gs = GangScheduler(s, timeout_s=600)
    m = [gpu_pod(f"m{i}", n=2, group="g", group_min=3) for i in range(2)]
    _arrive(gs, m, 0)
    assert len(gs.held) == 2
    assert gs.remove("default/m0") is True and gs.held == ["default/m1"] and gs.holder == "default/g"
    assert state.allocated_gpu_milli() == 2000
    assert gs.remove("default/m1") is True and gs.holder is None and gs.held == []
    assert state.allocated_gpu_milli() == 0 and gs.releases == {"members gone": 1} and not gs.gangs
    assert gs.remove("default/unknown") is False


def test_a_hold_needs_its_members_to_fit_their_queue_together_and_never_blocks_the_queue():
    # quota 4: two 2-GPU members may be held; a third would not fit the quota -> the hold goes
    state, s, tree = cluster(n_nodes=2, gpus=4, queues=[Queue("t", {"gpu_milli": 4000}, {"gpu_milli": 0})])
    gs = GangScheduler(s, timeout_s=600)
    m = [gpu_pod(f"m{i}", n=2, queue="t", group="g", group_min=4) for i in range(3)]
    _arrive(gs, m[:2], 0)
    assert len(gs.held) == 2 and tree.used("t", "gpu_milli") == 0
    solo = gpu_pod("solo", queue="t")  # the same queue: the held GPUs do not count against it
    assert s.schedule(solo).ok and tree.used("t", "gpu_milli") == 1000
    out = _arrive(gs, m[2:], 1)
    msg = out["default/g"].status.message
    assert "do not fit its queue's quota together" in msg and "queue t: GPU quota 4 exhausted" in msg
    assert gs.holder is None and gs.held == [] and gs.releases == {"quota": 1}
    assert state.allocated_gpu_milli() == 1000 and tree.used("t", "gpu_milli") == 1000


def test_a_complete_gang_is_checked_against_its_queue_as_a_whole():
    state, s, tree = cluster(n_nodes=2, gpus=4, queues=[Queue("t", {"gpu_milli": 4000}, {"gpu_milli": 0})])
    gs = GangScheduler(s, timeout_s=600)
    m = [gpu_pod(f"m{i}", n=2, queue="t", group="g", group_min=3) for i in range(3)]
    _arrive(gs, m[:2], 0)
    out = _arrive(gs, m[2:], 1)
    assert not out["default/g"].ok and "GPU quota 4 exhausted" in out["default/g"].status.message
    assert gs.held == [] and state.allocated_gpu_milli() == 0 and tree.used("t", "gpu_milli") == 0


@pytest.mark.parametrize("case, members, want", [
    ("complete", [("w0", False), ("w1", False)], (2, 100)),
    ("not all there", [("w0", False)], None),
    ("a member that never preempts", [("w0", False), ("w1", True)], None),
])
def test_room_wanted_is_what_the_live_loop_and_the_replay_make_room_for(case, members, want):
    from dataclasses import replace

    _, sched, _ = cluster()
    gangs = GangScheduler(sched)
    for name, never in members:
        gangs.add(replace(gpu_pod(name, prio=100, group="job", group_min=2), preempt_never=never), now=0.0)
    got = gangs.room_wanted("default/job")
    assert (None if got is None else (got[1], got[2])) == want, case
    assert gangs.room_wanted("default/nosuch") is None


def test_a_gang_evicted_whole_is_placed_again_all_or_nothing():
    """Every member of a running gang removed and added again (a whole-gang preemption or a spot drain): the gang is not
    "running" any more, so it waits for room for all of them rather than starting member by member."""
    state, s, _ = cluster(n_nodes=2, gpus=1)
    g = GangScheduler(s)
    members = [gpu_pod(f"w{i}", n=1, group="job", group_min=2) for i in range(2)]
    for m in members:
        g.add(m, 0.0)
    assert all(r.ok for r in g.step(0.0)) and len(state.assignments) == 2
    blocker = gpu_pod("other", n=1)
    for m in members:  # both evicted; one GPU goes to another pod meanwhile
        g.remove(m.key)
        g.add(m, 10.0)
    assert s.schedule(blocker).ok
    res = g.step(20.0)
    assert not any(r.ok and r.placed for r in res) and len(state.assignments) == 1  # not one member alone
    s.forget(blocker.key)
    assert any(r.ok and len(r.placed) == 2 for r in g.step(30.0))
