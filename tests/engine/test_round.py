"""The scheduling round (engine.round), against a recording port: what it decides and in which order the
port hears it, for a pod that fits, one that waits, one that preempts (victims gone at once, or later),
one kept out only by a gang's hold, and gangs."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.gang import GangResult
from gpufleet.engine.model import PodRequest
from gpufleet.engine.preemption import Plan
from gpufleet.engine.round import NO_ROOM, Attempt, RoomFor, SchedulingRound
from gpufleet.engine.schedqueue import COULD_FIT
from tests.builders import T4, make_node, scheduler


def gpu_pod(name: str, gpus: int = 1, priority: int = 0, group: str | None = None, need: int = 0) -> PodRequest:
    return PodRequest(name=name, cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=1000, priority=priority,
                      pod_group=group, pod_group_min=need)


@dataclass
class Port:
    """A shell that writes nothing: it records what the round tells it."""

    sched: Scheduler
    tree: object = None
    gone_at_once: bool = True  # the replay's deletions (True) or the live loop's (False)
    fits: bool = True
    allow: bool = True
    log: list[tuple] = field(default_factory=list)

    # RoundPort
    def could_fit(self, request: PodRequest) -> bool:
        return self.fits

    def bind(self, a: Attempt) -> None:
        self.log.append(("bind", a.request.name, a.decision.assignment.node, a.held_room, a.made_room))

    def wait(self, a: Attempt) -> None:
        self.log.append(("wait", a.request.name, a.note != "", a.room.kind if a.room else None))

    def gang_result(self, res: GangResult) -> None:
        pass

    def gang_placed(self, res: GangResult, held_room: bool) -> None:
        self.log.append(("gang_placed", res.group, sorted(d.pod_key for d in res.placed), held_room))

    def gang_waits(self, res: GangResult, until: float | None) -> None:
        self.log.append(("gang_waits", res.group))

    def hold_ended(self) -> None:
        self.log.append(("hold_ended",))

    # RoomPort
    def lower_priority_running(self, priority: int) -> bool:
        return any(a.priority < priority for a in self.sched.state.assignments.values())

    def may_plan(self, room: RoomFor, now: float) -> bool:
        return self.allow

    def planned(self, room: RoomFor, now: float, spent_s: float, outcome: str) -> None:
        self.log.append(("planned", room.key, outcome))

    def victim_options(self) -> dict:
        return {}

    def room_coming(self, request: PodRequest) -> str:
        return ""

    def leaving(self) -> frozenset[str]:
        return frozenset()

    def evict(self, a: Attempt) -> bool:
        assert a.room is not None
        self.log.append(("evict", a.request.name, sorted(v.pod_key for v in a.room.victims)))
        if self.gone_at_once:
            for v in a.room.victims:
                self.sched.forget(v.pod_key)
        return self.gone_at_once

    def evict_for_gang(self, room: RoomFor, plan: Plan) -> bool:
        self.log.append(("evict_for_gang", room.key, sorted(v.pod_key for v in plan.victims)))
        if self.gone_at_once:
            for v in plan.victims:
                self.sched.forget(v.pod_key)
        return self.gone_at_once


def setup(nodes: int = 1, gpus: int = 2, **kw) -> tuple[Scheduler, Port, SchedulingRound]:
    s = scheduler([make_node(f"n{i}", gpus, T4) for i in range(nodes)], "bestfit")
    port = Port(s, **kw)
    return s, port, SchedulingRound(port, port, port)


def test_a_pod_that_fits_is_bound_and_one_that_does_not_waits_with_the_engine_reasons():
    s, port, rnd = setup()
    assert rnd.try_pod(gpu_pod("a", 2), 0.0, 0.0).ok
    a = rnd.try_pod(gpu_pod("b"), 0.0, 0.0)
    assert not a.ok and "GpuFit" in a.decision.rejected_by
    assert port.log == [("bind", "a", "n0", False, False), ("wait", "b", False, None)]


def test_a_higher_priority_pod_preempts_and_is_placed_at_once_when_victims_go_at_once():
    s, port, rnd = setup()
    assert rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok
    port.log.clear()
    a = rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0)
    assert a.ok and a.made_room
    assert port.log == [("planned", "default/urgent", "victims"), ("wait", "urgent", False, "preempted"),
                        ("evict", "urgent", ["default/low"]), ("bind", "urgent", "n0", False, True)]


def test_live_victims_leave_later_so_the_pod_waits_with_its_plan():
    s, port, rnd = setup(gone_at_once=False)
    assert rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok
    a = rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0)
    assert not a.ok and a.room is not None and [v.pod_key for v in a.room.victims] == ["default/low"]
    assert port.log[-2:] == [("wait", "urgent", False, "preempted"), ("evict", "urgent", ["default/low"])]
    assert "default/low" in s.state.assignments  # the round deletes nothing itself


def test_no_plan_when_rationing_says_no_or_nobody_runs_below_it_or_the_shell_says_not_now():
    s, port, rnd = setup(allow=False)
    rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0)
    assert rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0).room is None
    port.allow = True
    assert rnd.try_pod(gpu_pod("same", 1, priority=0), 1.0, 0.0).room is None  # nobody of lower priority runs
    assert rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0, plan=False).room is None
    assert not any(e[0] == "planned" for e in port.log)
    rnd.preemption = False
    assert rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0).room is None


def test_a_failed_screen_skips_the_cycle_and_still_makes_room():
    s, port, rnd = setup()
    rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0)
    port.fits = False  # the shell's screen says no node has the room: no cycle, straight to making room
    a = rnd.try_pod(gpu_pod("urgent", 1, priority=10), 1.0, 0.0)
    assert port.log[-3:] == [("wait", "urgent", False, "preempted"), ("evict", "urgent", ["default/low"]),
                             ("wait", "urgent", False, None)]  # the retry asked the screen again, which still says no
    assert not a.ok and a.decision.status is NO_ROOM and a.decision.rejected_by == {COULD_FIT}


def test_a_pod_only_a_gangs_hold_keeps_out_is_told_so_and_a_higher_priority_one_ends_the_hold():
    s, port, rnd = setup(nodes=1, gpus=2)
    g = rnd.gangs
    for k in range(2):  # a gang of 3 one-GPU members, 2 arrived: it holds both GPUs while the third comes
        g.add(gpu_pod(f"w{k}", 1, priority=5, group="job", need=3), 0.0)
    rnd.gang_round(0.0)
    assert len(g.held) == 2
    a = rnd.try_pod(gpu_pod("same"), 1.0, 0.0)
    assert not a.ok and a.note.startswith("pod group default/job holds") and a.until == g.hold_deadline()
    b = rnd.try_pod(gpu_pod("urgent", 1, priority=10), 2.0, 0.0)
    assert b.ok and not g.held  # higher than the gang: the hold ends and the pod is placed


def test_gang_round_preempts_for_the_whole_gang_and_steps_again_when_victims_go_at_once():
    s, port, rnd = setup(nodes=2, gpus=2)
    for k in range(2):
        assert rnd.try_pod(gpu_pod(f"low{k}", 2), 0.0, 0.0).ok
    port.log.clear()
    for k in range(2):
        rnd.gangs.add(gpu_pod(f"w{k}", 2, priority=10, group="job", need=2), 1.0)
    out = rnd.gang_round(1.0)
    assert ("evict_for_gang", "default/job", ["default/low0", "default/low1"]) in port.log
    assert port.log[-1] == ("gang_placed", "default/job", ["default/w0", "default/w1"], False)
    assert out[-1].ok


def test_gang_round_live_waits_for_its_victims():
    s, port, rnd = setup(nodes=2, gpus=2, gone_at_once=False)
    for k in range(2):
        rnd.try_pod(gpu_pod(f"low{k}", 2), 0.0, 0.0)
    for k in range(2):
        rnd.gangs.add(gpu_pod(f"w{k}", 2, priority=10, group="job", need=2), 1.0)
    out = rnd.gang_round(1.0)
    assert [r.ok for r in out] == [False]
    assert ("gang_waits", "default/job") in port.log and port.log[-1][0] == "evict_for_gang"


# --- room kept for a nominated pod (kube-scheduler's nominatedNodeName) ----------------------------------

def _nominated(gpus: int = 2, nodes: int = 1):
    """``urgent`` (priority 10, all ``gpus`` GPUs) evicted ``low`` (priority 0) on n0, live: the victim is not gone yet."""
    s, port, rnd = setup(nodes=nodes, gpus=gpus, gone_at_once=False)
    assert rnd.try_pod(gpu_pod("low", gpus), 0.0, 0.0).ok
    assert not rnd.try_pod(gpu_pod("urgent", gpus, priority=10), 1.0, 0.0).ok
    assert rnd.nominations["default/urgent"].node == "n0"
    assert rnd.nominations["default/urgent"].victims == {"default/low"}
    return s, port, rnd


def _victims_gone(s, rnd, *keys: str) -> None:
    for k in keys:  # what the live loop does when the watch shows a victim deleted
        s.forget(k)
        rnd.forget(k)


def test_room_made_for_a_nominated_pod_is_not_taken_by_a_pod_of_lower_or_equal_priority():
    s, port, rnd = _nominated()
    _victims_gone(s, rnd, "default/low")
    for name, prio in (("late", 0), ("peer", 10)):
        a = rnd.try_pod(gpu_pod(name, 1, priority=prio), 2.0, 0.0)
        assert not a.ok and "NominatedRoom" in a.decision.rejected_by
        assert "keep their room for a nominated pod" in str(a.decision.status.reasons)
    assert rnd.try_pod(gpu_pod("urgent", 2, priority=10), 3.0, 0.0, nominated=True).ok
    assert "default/urgent" not in rnd.nominations  # placed: nothing is kept any more


def test_the_room_is_kept_while_the_victims_are_still_leaving_too():
    s, port, rnd = _nominated(gpus=4)  # urgent needs all 4; low holds all 4 until it is gone
    assert not rnd.try_pod(gpu_pod("late", 1), 2.0, 0.0).ok  # no room anyway (low still there)
    _victims_gone(s, rnd, "default/low")
    assert not rnd.try_pod(gpu_pod("late", 1), 2.0, 0.0).ok


def test_a_higher_priority_pod_may_still_take_the_room():
    s, port, rnd = _nominated()
    _victims_gone(s, rnd, "default/low")
    assert rnd.try_pod(gpu_pod("boss", 1, priority=20), 2.0, 0.0).ok


def test_a_lower_priority_pod_goes_elsewhere_or_beside_the_nominated_pod_when_there_is_room():
    s, port, rnd = setup(nodes=2, gone_at_once=False)
    assert rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok  # n0
    assert rnd.try_pod(gpu_pod("other", 1, priority=10), 0.0, 0.0).ok  # n1, half free
    assert not rnd.try_pod(gpu_pod("urgent", 2, priority=10), 1.0, 0.0).ok
    _victims_gone(s, rnd, "default/low")
    a = rnd.try_pod(gpu_pod("late", 1), 2.0, 0.0)
    assert a.ok and a.decision.assignment.node == "n1"
    assert not rnd.try_pod(gpu_pod("later", 1), 2.0, 0.0).ok  # n0 is urgent's
    # room beyond what the nominated pod needs stays open
    s2, port2, rnd2 = setup(gpus=4, gone_at_once=False)
    assert rnd2.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok and rnd2.try_pod(gpu_pod("other", 2), 0.0, 0.0).ok
    assert not rnd2.try_pod(gpu_pod("urgent", 2, priority=10), 1.0, 0.0).ok
    victims = rnd2.nominations["default/urgent"].victims
    _victims_gone(s2, rnd2, *victims)
    assert rnd2.try_pod(gpu_pod("small", 0), 2.0, 0.0).ok  # CPU only: leaves the GPUs to urgent


def test_a_nomination_ends_when_its_pod_is_gone_or_its_room_is_taken_anyway():
    s, port, rnd = _nominated()
    _victims_gone(s, rnd, "default/low")
    assert rnd.forget("default/urgent")  # the nominated pod was deleted: the loop wakes the waiting pods
    assert rnd.try_pod(gpu_pod("late", 1), 2.0, 0.0).ok
    s, port, rnd = _nominated()
    _victims_gone(s, rnd, "default/low")
    assert rnd.try_pod(gpu_pod("boss", 2, priority=20), 2.0, 0.0).ok  # took it all
    assert not rnd.try_pod(gpu_pod("urgent", 2, priority=10), 3.0, 0.0, nominated=True).ok
    assert "default/urgent" not in rnd.nominations  # its victims are gone and it does not fit: nothing kept


def test_no_room_is_made_for_a_lower_priority_pod_in_room_kept_for_a_nominated_pod():
    s, port, rnd = _nominated(gpus=4)  # low (priority 0) holds 4 GPUs; urgent (10) nominated for all 4
    port.log.clear()
    a = rnd.try_pod(gpu_pod("mid", 1, priority=5), 2.0, 0.0)  # could evict low, but that room is urgent's
    assert not a.ok and a.room is None
    assert ("planned", "default/mid", "none") in port.log and not any(e[0] == "evict" for e in port.log)


def test_nothing_nominated_when_no_victim_was_deleted():
    s, port, rnd = setup(gone_at_once=False)
    port.evict = lambda a: None  # type: ignore[method-assign]  # every DELETE failed
    assert rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok
    assert not rnd.try_pod(gpu_pod("urgent", 2, priority=10), 1.0, 0.0).ok
    assert rnd.nominations == {}


def test_nominated_pods_are_counted_during_filtering_only_in_the_rounds_own_cycles():
    """As kube-scheduler's RunFilterPluginsWithNominatedPods: the framework asks the round (``Scheduler.nominated``)
    which feasible nodes the pod would take a nominated pod's room on, and filters them out like a plugin would,
    in one cycle (no retry); other cycles (explain, dry runs) see every node."""
    s, port, rnd = setup(nodes=2, gone_at_once=False)
    assert rnd.try_pod(gpu_pod("low", 2), 0.0, 0.0).ok  # n0
    assert rnd.try_pod(gpu_pod("other", 1, priority=10), 0.0, 0.0).ok  # n1, half free
    assert not rnd.try_pod(gpu_pod("urgent", 2, priority=10), 1.0, 0.0).ok  # nominated to n0
    _victims_gone(s, rnd, "default/low")
    calls: list[list[int]] = []
    hook = rnd._kept_off

    def spy(cycle, feasible):
        calls.append(feasible.nonzero()[0].tolist())
        return hook(cycle, feasible)

    rnd._kept_off = spy  # type: ignore[method-assign]
    a = rnd.try_pod(gpu_pod("late", 1), 2.0, 0.0)
    assert a.ok and a.decision.assignment.node == "n1" and calls == [[0, 1]]
    assert s.nominated is None  # installed for the round's cycle only
    assert s.explain(gpu_pod("other2", 2)).ok  # a cycle outside the round: n0's room is not counted there


def test_the_filter_hook_rejects_like_a_plugin_and_names_the_nominated_room():
    from gpufleet.engine.framework import KEPT_OFF_REASON, NOMINATED_ROOM
    import numpy as np

    s = scheduler([make_node("n0", 2, T4), make_node("n1", 2, T4)], "bestfit")
    s.nominated = lambda cycle, feasible: np.array([True, True])
    d = s.schedule(gpu_pod("p", 1))
    assert not d.ok and d.rejected_by == {NOMINATED_ROOM} and KEPT_OFF_REASON in str(d.status.reasons)
    s.nominated = lambda cycle, feasible: None  # nothing nominated on a feasible node
    assert s.schedule(gpu_pod("p", 1)).ok
