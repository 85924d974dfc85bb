"""One scheduling round, written once for the live loop and for the trace replay.

Why: what a pending pod goes through around the engine's cycle -- past a gang's hold, into room a
plugin holds for pods not yet here rather than evict anyone, reclaim of quota its queue lent out,
preemption of lower-priority pods, and for pod groups the gang round with its own room-making --
used to be written twice (``kube/loop.py`` with ``kube/preemption.py``, and ``simulator/experiments/replay.py``),
kept equal by hand, so the replay could drift from what it predicts.  Here it is one object that
decides and a port that acts on its decisions:

* the *shell* (``kube.loop.SchedulerLoop``: watches and API calls; ``simulator.experiments.replay``: the trace's
  clock) chooses which pods to try and in which order (``schedqueue.order_pending``), says how long
  each has waited and whether victims were deleted for it, and implements ``RoundPort``;
* the round runs the engine (``Scheduler.schedule``, ``GangScheduler.step``), plans room
  (``schedqueue.plan_room``, ``preemption.find_gang_victims``) and hands every decision to the port:
  ``bind`` (an assignment, perhaps taken in held room), ``wait`` (with the reasons, and a time to try
  again by when only a gang's hold keeps the pod out), ``evict`` (a plan's victims).

A decision carries what must be written before its bind: ``Attempt.room`` holds the victims to delete
(the pod binds once they are gone; a shell whose deletions take effect at once, the replay, says so and
the round tries the pod again straight away).  Further writes that must precede a bind (e.g. resource
claims allocated for the pod) belong on ``Attempt`` beside ``room``, carried out by the port's ``bind``
before the Binding, so both shells get them.

Room made for a pod is kept for it (kube-scheduler's ``nominatedNodeName``): once a plan's victims are
being deleted, the pod is *nominated* to the plan's node, and until it binds (or is gone, or plans again) a
pod of lower or equal priority is not placed where it would leave the nominated pod no room once the
victims are gone; a pod of higher priority may still take it.  As in kube-scheduler, this is counted during
filtering: the framework asks the round (``Scheduler.nominated``) which nodes the pod would take such room on.  A shell whose victims leave at once (the
replay) tries the pod again straight away, so the room is never open to anyone else there; the live loop
tries it once the watch shows the victims gone, and other pods are tried meanwhile.

Rationing is the port's: the live loop caps planning time (``kube.preemption.Preemptor``), the replay
plans again only once something it could take came or a pod left (``simulator.experiments.replay``); both answer
``may_plan``.  That both shells decide alike is tested, not assumed: ``tests/engine/test_round_parity.py``.
What changed since a pod last failed decides whether it is worth trying again: ``schedqueue.Change``
and ``schedqueue.may_fit_after``, kube-scheduler's queueing hints, used by both shells.

No I/O here: the port does the writing; the clock is passed in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .framework import Cycle, Decision, Scheduler
from .gang import GangResult, GangScheduler
from .model import Assignment, PodRequest, quick_frozen_init
from .preemption import Plan, find_gang_victims
from .schedqueue import COULD_FIT, RoomPlan, plan_room
from .status import Status

if TYPE_CHECKING:
    from .queues import QueueTree

log = logging.getLogger(__name__)

# the replay's cheap pre-check found no node with the room the pod asks for (no engine cycle was run)
NO_ROOM = Status.unschedulable("no node has the CPU, memory and GPUs the pod asks for", plugin=COULD_FIT)


@dataclass(frozen=True)
class RoomFor:
    """Who room would be made for: one pod (``request``) or a gang's members; ``key`` is the pod's key or
    the gang's group key, ``priority`` the lowest priority among them (what a victim must be below)."""

    key: str
    priority: int
    request: PodRequest | None = None
    members: tuple[PodRequest, ...] = ()
    need: int = 1

    @property
    def gang(self) -> bool:
        return self.request is None


@quick_frozen_init  # one per try (arrival or retry): the generated __init__'s seven object.__setattr__ calls were
@dataclass(frozen=True)  # about 1.5% of a cheap policy's replay
class Attempt:
    """The round's decision for one pod.

    ``decision`` is the engine's (ok: bind ``decision.assignment``); ``held_room``: it took room a plugin
    holds for pods not yet here instead of evicting anyone; ``note``: what the pod is told before the engine's
    reasons -- that only a gang's hold keeps it out, or that room is on its way without an eviction (it waits
    at most until ``until``, the hold's deadline); ``room``: victims whose deletion lets it fit -- written
    before it can bind; ``made_room``: placed only after room was made (held room, or victims gone at once)."""

    request: PodRequest
    decision: Decision
    held_room: bool = False
    note: str = ""
    until: float | None = None
    room: RoomPlan | None = None
    made_room: bool = False

    @property
    def ok(self) -> bool:
        return self.decision.ok


@dataclass
class Nomination:
    """Room being made for a pod: ``victims`` (pod keys) are being deleted so that ``request`` fits on ``node``.
    While it lasts, pods of lower or equal priority may not take the room (``SchedulingRound._kept_off``)."""

    request: PodRequest
    node: str
    victims: set[str] = field(default_factory=set)  # still to go (a shell says when one is gone: ``forget``)


class Snapshot(Protocol):
    """Where the round finds the scheduler (with its cluster state) and the queue tree (None: no queues)."""

    @property
    def sched(self) -> Scheduler: ...

    @property
    def tree(self) -> QueueTree | None: ...


class RoomPort(Protocol):
    """How a shell makes room: a few questions about its world, and the deletions a plan asks for."""

    def lower_priority_running(self, priority: int) -> bool:
        """Could any running pod of lower priority be preempted?  (A cheap screen; True when unsure.)"""
        ...

    def may_plan(self, room: RoomFor, now: float) -> bool:
        """May room be planned for this pod or gang now (rationing; victims already on their way)?"""
        ...

    def planned(self, room: RoomFor, now: float, spent_s: float, outcome: str) -> None:
        """A planning step ran: ``outcome`` is ``held`` (placed in held room), ``held-miss`` (held room was
        not enough; victims come next), ``victims`` (a plan) or ``none`` (nothing would make room)."""
        ...

    def victim_options(self) -> Mapping[str, Any]:
        """``preemption.find_victims``' keyword arguments: disruption budgets, labels, ages, candidate bounds."""
        ...

    def room_coming(self, request: PodRequest) -> str:
        """Room the pod would fit in is on its way without an eviction (why, in words), or ''.  The pod then
        waits for it and no room is planned (live: devices of DRA claims whose pods are gone, not yet deallocated)."""
        ...

    def leaving(self) -> AbstractSet[str]:
        """Pods on their way out already: never chosen as victims again."""
        ...

    def evict(self, attempt: Attempt) -> bool | None:
        """Delete ``attempt.room``'s victims for the pod.  True when they are gone already (the pod is
        tried again at once, with held room); False when it binds after they are gone (a later round: the
        pod is nominated to ``attempt.room.node`` meanwhile); None when nothing was deleted (it plans again later)."""
        ...

    def evict_for_gang(self, room: RoomFor, plan: Plan) -> bool:
        """Delete the victims of a gang's plan.  True when they are gone already (the gang is tried again)."""
        ...


class RoundPort(Protocol):
    """What a shell does with the round's decisions (the effects port)."""

    def could_fit(self, request: PodRequest) -> bool:
        """A cheap necessary condition (some node has the room); True when unsure.  False skips the cycle."""
        ...

    def bind(self, attempt: Attempt) -> None:
        """The pod is placed (its devices reserved in the snapshot): write it (a Binding, the replay's books)."""
        ...

    def wait(self, attempt: Attempt) -> None:
        """The pod does not fit now: tell it why, back it off (no later than ``attempt.until``)."""
        ...

    def gang_result(self, result: GangResult) -> None:
        """What the gang round decided for a gang (placed, or why not), once per gang and round, after held room."""
        ...

    def gang_placed(self, result: GangResult, held_room: bool) -> None:
        """Members of a gang are placed (reserved in the snapshot): write them."""
        ...

    def gang_waits(self, result: GangResult, until: float | None) -> None:
        """A gang (or its late members) does not fit: tell its members why; retry no later than ``until``."""
        ...

    def hold_ended(self) -> None:
        """A gang's hold ended this round: the room it held is free again."""
        ...


class SchedulingRound:
    """Tries pods and gangs and hands the decisions to a ``RoundPort``, room-making to a ``RoomPort``
    (see the module docstring).

    ``snapshot`` gives the scheduler and the queue tree each time they are needed (a shell that rebuilds its
    snapshot on a relist replaces them); ``gangs`` is the round's gang scheduler, made afresh on such a
    rebuild (``reset_gangs``).  ``preemption`` off: no room is ever made (held room neither)."""

    def __init__(self, snapshot: Snapshot, port: RoundPort, rooms: RoomPort, preemption: bool = True,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.snapshot = snapshot
        self.port = port
        self.rooms = rooms
        self.preemption = preemption
        self.timer = timer  # measures planning time (the live loop rations it)
        self.gangs = GangScheduler(snapshot.sched)
        self.nominations: dict[str, Nomination] = {}  # pod -> the room being made for it

    @property
    def sched(self) -> Scheduler:
        return self.snapshot.sched

    @property
    def tree(self) -> QueueTree | None:
        return self.snapshot.tree

    def reset_gangs(self, when: Callable[[float, float], str] | None = None) -> GangScheduler:
        """A fresh gang scheduler on the current snapshot (after a rebuild: the old one's holds are gone);
        ``when`` says how a hold's deadline reads (``GangScheduler.when``)."""
        self.gangs = GangScheduler(self.sched)
        if when is not None:
            self.gangs.when = when
        return self.gangs

    def nominate(self, req: PodRequest, node: str, victims: AbstractSet[str] = frozenset()) -> None:
        """Keep room on ``node`` for ``req`` (a shell that learns of a nomination made before, e.g. after a restart)."""
        self.nominations[req.key] = Nomination(req, node, set(victims))

    def forget(self, key: str) -> bool:
        """A pod is gone (placed elsewhere and deleted, evicted, finished): it is no victim any more, and a
        nomination of its own ends.  True when that ended a nomination (pods it kept out may fit now)."""
        for nom in self.nominations.values():
            nom.victims.discard(key)
        return self.nominations.pop(key, None) is not None

    # --- single pods -----------------------------------------------------------------------
    def try_pod(self, req: PodRequest, now: float, waited_s: float, nominated: bool = False,
                fits: bool | None = None, plan: bool = True) -> Attempt:
        """One pod's trip: the cycle, past a gang's hold, room planned when it does not fit; the decision goes
        to the port (bind, or wait and perhaps evict), and is returned.  ``nominated``: victims were deleted
        for it, so held room is its too.  ``fits``: what the shell knows already -- True: it could fit (no
        ``could_fit`` screen), False: it cannot (no cycle, straight to making room), None: ask ``could_fit``.
        ``plan`` False: make no room for it this time (the shell tried for its kind already)."""
        a = self._decide(req, now, waited_s, nominated, fits, plan)
        if a.ok:
            self._bind(a)
            return a
        self.port.wait(a)
        nom = self.nominations.get(req.key)
        if nom is not None and not nom.victims:
            del self.nominations[req.key]  # its victims are gone and it still does not fit: the room was not enough
        if a.room is not None and a.room.victims:
            gone = self.rooms.evict(a)
            if gone is None:
                return a
            if a.room.node is not None:
                self.nominate(req, a.room.node, set() if gone else {v.pod_key for v in a.room.victims})
            if gone:
                again = Attempt(req, self._cycle(req, waited_s, True, None), made_room=True)  # victims gone: the room is its own
                if again.ok:
                    self._bind(again)
                else:
                    self.port.wait(again)
                return again
        return a

    def only_waits(self, req: PodRequest, now: float) -> bool:
        """Would ``try_pod(req, fits=False)`` -- no node has room for it -- only tell the pod to wait?  True
        when no gang's hold could be ended for it and no room may be planned for it now (nothing lower to
        take, or the port's rationing says no) and the pod has no nomination a try would end (its room spent).
        A shell may then pass over a pod that waits already."""
        if self.gangs.held or req.key in self.nominations:
            return False
        if not self.preemption or (self.tree is None and not self.rooms.lower_priority_running(req.priority)):
            return True
        return not self.rooms.may_plan(RoomFor(req.key, req.priority, req), now)

    def waits_by_priority(self, priority: int) -> bool:
        """True when ``only_waits`` says True for every pod of ``priority`` with no nomination: no gang holds, and
        no room may be planned for that priority at all (no preemption, or nothing lower runs and no team queues).
        False: ask ``only_waits`` per pod.  A shell passing over many waiting pods asks this once per priority."""
        if self.gangs.held:
            return False
        return not self.preemption or (self.tree is None and not self.rooms.lower_priority_running(priority))

    def fails_quietly(self, req: PodRequest) -> bool:
        """Would a try of ``req`` whose cycle finds no node only tell the pod to wait, and change nothing else?  True
        when nobody is nominated (no room kept to count, no nomination a try would end), no room may be planned for
        its priority and no gang holds (``waits_by_priority``), and no plugin would learn from it (``Scheduler.
        learns_from``: it was seen).  A shell whose queueing hints show that no node passes such a pod may leave it
        asleep (``pending.PendingGroups.asleep``)."""
        return not self.nominations and self.waits_by_priority(req.priority) and not self.sched.learns_from(req)

    def _bind(self, a: Attempt) -> None:
        if self.nominations:
            self.nominations.pop(a.request.key, None)
        self.port.bind(a)

    def _cycle(self, req: PodRequest, waited_s: float, take_held: bool, fits: bool | None) -> Decision:
        if fits is False or (fits is None and not self.port.could_fit(req)):
            return Decision(req.key, NO_ROOM)
        return self._schedule(req, waited_s, take_held)

    # --- room kept for nominated pods --------------------------------------------------------
    def _holds(self, req: PodRequest) -> list[Nomination]:
        """Nominations that keep their room from ``req``: other pods' of at least its priority."""
        return [n for k, n in self.nominations.items() if k != req.key and n.request.priority >= req.priority]

    def _schedule(self, req: PodRequest, waited_s: float, take_held: bool) -> Decision:
        """The engine's cycle; while nominations of pods of at least the pod's priority last, the framework counts
        them during filtering (``Scheduler.nominated``: ``_kept_off``)."""
        if not self.nominations:  # nothing held (``_with_holds`` would run the cycle as it is)
            return self.sched.schedule(req, waited_s=waited_s, take_held=take_held)
        return self._with_holds(req, lambda: self.sched.schedule(req, waited_s=waited_s, take_held=take_held))

    def explain(self, req: PodRequest, waited_s: float = 0.0) -> Decision:
        """The cycle a try of ``req`` would run, with its per-node reasons (a node whose room is kept for a
        nominated pod says so); reserves nothing."""
        return self._with_holds(req, lambda: self.sched.explain(req, waited_s=waited_s))

    def _with_holds(self, req: PodRequest, cycle: Callable[[], Decision]) -> Decision:
        if not self._holds(req):
            return cycle()
        self.sched.nominated = self._kept_off
        try:
            return cycle()
        finally:
            self.sched.nominated = None

    def _kept_off(self, cycle: Cycle, feasible: np.ndarray) -> np.ndarray | None:
        """Nodes the cycle's pod is kept off, as kube-scheduler's RunFilterPluginsWithNominatedPods adds the pods
        nominated to a node, of at least the pod's priority, before filtering it: on each feasible node with such
        nominations, their victims there are gone and the nominated pods placed (a dry run); where the pod then no
        longer fits, it would take their room.  (A nominated pod that would not fit there anyway holds nothing.)"""
        sched = self.sched
        st = sched.state
        by_node: dict[int, list[Nomination]] = {}
        for nom in self._holds(cycle.request):
            i = st.index.get(nom.node)
            if i is not None and feasible[i]:
                by_node.setdefault(i, []).append(nom)
        if not by_node:
            return None
        off = np.zeros(len(st), dtype=bool)
        sched.nominated = None  # the dry runs are plain cycles
        try:
            for i, noms in by_node.items():
                with st.transaction() as tx:  # rolls back
                    added = False
                    for nom in noms:
                        self._gone_on(tx, nom)
                    for nom in noms:
                        d = self._fits_on(nom.request, i)
                        if d.ok and d.assignment is not None:
                            tx.reserve(d.assignment)
                            added = True
                    off[i] = added and not self._fits_on(cycle.request, i, cycle.take_held, cycle.waited_s).ok
        finally:
            sched.nominated = self._kept_off
        return off

    def _fits_on(self, req: PodRequest, node: int, take_held: bool = True, waited_s: float = 0.0) -> Decision:
        """Would ``req`` fit on ``node`` now (a dry run that draws nothing from the scheduler's generator)?"""
        sched = self.sched
        c = Cycle(request=req, rng=np.random.default_rng(0), take_held=take_held, waited_s=waited_s)
        mask = np.zeros(len(sched.state), dtype=bool)
        mask[node] = True
        c.only_nodes = mask
        return sched.decide(c)

    def _gone_on(self, tx: Any, nom: Nomination) -> None:
        """In a dry run: the nominated pod's victims still on its node are gone."""
        st = self.sched.state
        for v in nom.victims:
            if (va := st.assignments.get(v)) is not None and va.node == nom.node:
                tx.evict(v)

    def _kept_from(self, req: PodRequest, node: str, victims: list[Assignment]) -> Nomination | None:
        """The nomination whose room ``req`` would take if placed on ``node`` after ``victims`` go, or None."""
        st = self.sched.state
        i = st.index.get(node)
        holds = [n for n in self._holds(req) if n.node == node]
        if i is None or not holds:
            return None
        for nom in holds:
            with st.transaction() as tx:  # rolls back
                for v in victims:
                    tx.evict(v.pod_key)
                self._gone_on(tx, nom)
                d = self._fits_on(nom.request, i)
                if not d.ok or d.assignment is None:
                    continue  # it no longer fits there anyway: it holds nothing
                tx.reserve(d.assignment)
                if not self._fits_on(req, i).ok:
                    return nom
        return None

    def _decide(self, req: PodRequest, now: float, waited_s: float, nominated: bool, fits: bool | None,
                plan: bool) -> Attempt:
        dec = self._cycle(req, waited_s, nominated, fits)  # victims went for it: held room too
        if dec.ok:  # (most tries: what the rest gives a placed pod, without asking dec.ok thrice)
            return Attempt(req, dec)
        why = ""
        gangs = self.gangs
        if not dec.ok and gangs.held:
            dec, why = self._past_a_hold(req, dec, now, waited_s)
        coming = self.rooms.room_coming(req) if not dec.ok else ""
        if coming:  # room comes back without an eviction: nothing to plan
            why = f"{why}; {coming}" if why else coming
        until = gangs.hold_deadline() if why else None
        room = None
        held = False
        if not dec.ok and self.preemption and plan and not coming:
            room = self._plan(req, now)
            if room is not None and room.kind == "held":  # room held for pods not yet here, not a running pod
                log.info("%s", room.explanation[0])
                dec = self._cycle(req, waited_s, True, None)
                held = dec.ok
        return Attempt(req, dec, held, why, until, None if held else room, made_room=held)

    def _past_a_hold(self, req: PodRequest, dec: Decision, now: float, waited_s: float) -> tuple[Decision, str]:
        """A pod that only a gang's hold keeps out: a pod of higher priority than the gang ends the hold
        and is placed; any other is told which gang holds what, and until when."""
        gangs = self.gangs
        why = gangs.blocked_by_hold(req, now)
        holder = gangs.gangs.get(gangs.holder or "")
        if not why or holder is None:
            return dec, why
        if req.priority > holder.group.priority:
            log.info("%s (priority %d) ends the hold of pod group %s (priority %d)", req.key, req.priority,
                     holder.group.key, holder.group.priority)
            gangs.release_hold("preempted")
            return self._schedule(req, waited_s, False), ""
        return dec, why

    def _plan(self, req: PodRequest, now: float) -> RoomPlan | None:
        """Held room, reclaim or preemption for one pod (a dry run), within the port's rationing."""
        if self.tree is None and not self.rooms.lower_priority_running(req.priority):
            return None  # nobody it could take from: not worth a plan
        room = RoomFor(req.key, req.priority, req)
        if not self.rooms.may_plan(room, now):
            return None
        t0 = self.timer()
        plan: RoomPlan | None = None
        try:
            exclude = set(self.rooms.leaving()) | set(self.gangs.held)  # held pods are not running: nothing to evict
            plan = plan_room(self.sched, self.tree, req, self.rooms.victim_options, exclude=exclude)
        except Exception:  # a planning bug must not stop scheduling: the pod waits with no plan
            log.exception("making room for %s failed", req.key)
        if plan is not None and plan.victims:
            if plan.node is None and len(nodes := {v.node for v in plan.victims}) == 1:
                plan.node = nodes.pop()  # reclaim on one node: the pod is nominated there too
            if plan.node is not None and (nom := self._kept_from(req, plan.node, plan.victims)) is not None:
                log.info("no room made for %s on %s: its room is kept for %s (priority %d, nominated there)",
                         req.key, plan.node, nom.request.key, nom.request.priority)
                plan = None
        outcome = "none" if plan is None or (plan.kind != "held" and not plan.victims) else \
            "held" if plan.kind == "held" else "victims"
        self.rooms.planned(room, now, self.timer() - t0, outcome)
        return plan

    # --- pod groups --------------------------------------------------------------------------
    def gang_round(self, now: float) -> list[GangResult]:
        """Step the gang scheduler; what it placed goes to the port.  A gang that does not fit first takes room
        held for pods not yet here, else has lower-priority pods preempted for all its members at once; when
        the port says those victims are gone already, the gangs are stepped once more.  Returns the results."""
        gangs = self.gangs
        had_hold = bool(gangs.held)
        results = gangs.step(now)
        if had_hold and not gangs.held:
            self.port.hold_ended()
        again = False
        out = []
        for res in results:
            if res.placed:  # late members placed one by one (the gang itself failing for others)
                self.port.gang_placed(res, False)
            held = None
            if not res.ok and self.preemption:
                held = self._gang_held_room(res.group, now)
                if held is not None:
                    res = held
            self.port.gang_result(res)
            if held is not None:
                self.port.gang_placed(held, True)
            out.append(res)
            if not res.ok:
                self.port.gang_waits(res, gangs.hold_deadline() if gangs.holder == res.group else None)
                if self.preemption and self._gang_victims(res.group, now):
                    again = True
        if again:  # its victims are gone: the gang goes now, before anyone takes the room
            for res in gangs.step(now):
                self.port.gang_result(res)
                if res.placed:
                    self.port.gang_placed(res, False)
                out.append(res)
        return out

    def _gang_room(self, group: str, now: float) -> RoomFor | None:
        """The gang as a ``RoomFor`` when it may have room made now: complete, may preempt
        (``GangScheduler.room_wanted``), lower-priority pods run, and the port's rationing allows."""
        want = self.gangs.room_wanted(group)
        if want is None:
            return None
        members, need, prio = want
        room = RoomFor(group, prio, None, tuple(members), need)
        if not self.rooms.lower_priority_running(prio) or not self.rooms.may_plan(room, now):
            return None
        return room

    def _gang_held_room(self, group: str, now: float) -> GangResult | None:
        """Held room before running pods: the gang placed in room plugins hold for pods not yet here, or None."""
        room = self._gang_room(group, now)
        if room is None:
            return None
        t0 = self.timer()
        placed = self.gangs.place_in_held_room(group, now)
        self.rooms.planned(room, now, self.timer() - t0, "held" if placed is not None else "held-miss")
        return placed

    def _gang_victims(self, group: str, now: float) -> bool:
        """Preempt lower-priority pods for a whole gang at once; True when the port says they are gone already."""
        room = self._gang_room(group, now)
        if room is None:
            return False
        t0 = self.timer()
        plan = None
        try:
            exclude = set(self.rooms.leaving()) | set(self.gangs.held)
            plan = find_gang_victims(self.sched, group, list(room.members), room.need, exclude=exclude,
                                     **self.rooms.victim_options())
        except Exception:  # a planning bug must not stop scheduling
            log.exception("making room for pod group %s failed", group)
        self.rooms.planned(room, now, self.timer() - t0, "victims" if plan is not None else "none")
        return plan is not None and self.rooms.evict_for_gang(room, plan)


__all__ = ["Attempt", "NO_ROOM", "Nomination", "RoomFor", "RoomPort", "RoundPort", "SchedulingRound", "Snapshot"]
