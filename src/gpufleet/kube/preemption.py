"""Reclaim and preemption in the live loop: when a pod (or a gang) does not fit, reclaim quota
its queue lent out, else preempt lower-priority pods within PodDisruptionBudgets; victims are
deleted through the API (``evictor.Evictions``) and the pod is nominated until they are gone.

Why a module of its own: making room is kube-scheduler's PostFilter, a step apart from the
cycle that finds no node.  ``Preemptor`` owns what it decides: the nominations (pod -> victims
being deleted for it; the queue tries nominated pods first) and its planning debt (planning
time is capped at ``PLAN_SHARE`` of the loop's).  It plans on the cache's snapshot
(``ClusterView``) and is handed the loop's ``GangScheduler`` per call (a relist replaces it).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..engine.gang import GangResult, GangScheduler
from ..engine.model import Assignment, PodRequest
from ..engine.preemption import find_gang_victims
from ..engine.schedqueue import RoomPlan, plan_room
from .api import SchedulerApi
from .evictor import Evictions
from .loop_support import ClusterView, EventSink, _names_any
from .scheduling_queue import SchedulingQueue

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


class Preemptor:
    """Makes room for pods that do not fit; see the module docstring.  Runs on the loop's thread."""

    PLAN_SHARE = 0.25  # of the loop's time that preemption planning may use on average

    def __init__(self, api: SchedulerApi, cache: ClusterView, queue: SchedulingQueue, events: EventSink,
                 evictions: Evictions, clock: Callable[[], float], nominated_timeout_s: float = 120.0) -> None:
        self.api = api
        self.cache = cache
        self.queue = queue
        self.events = events
        self.evictions = evictions
        self.clock = clock
        self.nominated_timeout_s = nominated_timeout_s
        self.nominated: dict[str, tuple[set[str], float]] = {}  # pod -> victims being deleted for it, until
        self.plan_debt_s: float = 0.0  # planning time not yet paid back (see planning_allowed)
        self._plan_last: float = time.monotonic()

    def forget(self, key: str) -> None:
        """The pod is placed or gone: no room is being made for it any more."""
        self.nominated.pop(key, None)

    def planning_allowed(self) -> bool:
        """Preemption planning may take ``PLAN_SHARE`` of the loop's time on average (1 s bursts):
        a flood of pods nothing can make room for must not stall the binds of pods that fit.
        A pod skipped here plans again at its next retry."""
        now = time.monotonic()
        self.plan_debt_s = max(0.0, self.plan_debt_s - (now - self._plan_last) * self.PLAN_SHARE)
        self._plan_last = now
        return self.plan_debt_s < 1.0

    def _planned(self, t0: float) -> None:
        self.plan_debt_s += time.monotonic() - t0

    def plan(self, key: str, req: PodRequest, gangs: GangScheduler) -> RoomPlan | None:
        """Reclaim lent quota, else preempt lower-priority pods: the plan (a dry run), or None when
        room is already on its way, planning is over its share, or nothing would make room.
        A ``held`` plan evicts nobody: the caller places the pod with ``take_held``."""
        nom = self.nominated.get(key)
        if nom is not None and self._still_leaving(nom, self.clock()):
            return None  # victims already on their way out
        if not self.planning_allowed():
            return None
        t0 = time.monotonic()
        try:
            leaving = self.leaving() | set(gangs.held)  # held pods are not running: nothing to evict
            cache = self.cache
            return plan_room(cache.sched, cache.tree, req, lambda: dict(
                budgets=cache.budgets(), age_rank=cache.age_rank(),
                **self._candidate_bound()), exclude=leaving)
        finally:
            self._planned(t0)

    def _still_leaving(self, nom: tuple[set[str], float], now: float) -> bool:
        """Is room already on its way for a nominated pod?  While its victims are still there and either
        the nomination is fresh or they are still leaving (in flight, terminating), it plans nothing more."""
        there = [v for v in nom[0] if v in self.cache.state.assignments]
        return bool(there) and (now < nom[1] or bool(set(there) & self.leaving()))

    def leaving(self) -> set[str]:
        """Pods on their way out (evictions in flight, terminating): never chosen as victims again."""
        return self.evictions.leaving(self.cache.bound_pods)

    def carry_out(self, key: str, pod: dict, rp: RoomPlan) -> None:
        """Delete a plan's victims through the API and nominate the pod until they are gone."""
        if not rp.victims:
            return
        now = self.clock()
        reason, kind, lines, node = rp.reason, rp.kind, rp.explanation, rp.node or ""
        done = self._evict(rp.victims, reason, kind, key)
        if done is None:
            return
        evicted, gone = done
        if not evicted and not gone:
            return  # nothing happened (every DELETE failed): plan again at the next retry
        self.nominated[key] = (evicted | gone, now + self.nominated_timeout_s)
        if not evicted:
            return  # the victims were gone already: their room frees without us
        what = [ln for ln in (lines or []) if not _names_any(ln, gone)]
        if gone:
            what.append(f"already gone: {', '.join(sorted(gone))}")
        self.events.send(pod, "Normal", "Preempting" if kind == "preempted" else "Reclaiming", "; ".join(what or [reason]))
        if kind == "preempted":  # like kube-scheduler: `kubectl get pod -o wide` shows NOMINATED NODE
            ns, name = key.split("/", 1)
            try:
                self.api.nominate(ns, name, node)
            except Exception as exc:  # best effort: the loop keeps the room by trying the pod first
                log.info("could not set nominatedNodeName on %s: %s", key, exc)

    def _gang_wants_room(self, group: str, gangs: GangScheduler) -> tuple[list[PodRequest], int, int, float] | None:
        """(members to make room for, how many must fit, their lowest priority, now) for a complete gang
        that may preempt (``GangScheduler.room_wanted``) while lower-priority pods run; None when it may
        not, or room is already on its way."""
        want = gangs.room_wanted(group)
        if want is None:
            return None
        members, need, prio = want
        now = self.clock()
        noms = [self.nominated.get(r.key) for r in members]
        if any(n is not None and self._still_leaving(n, now) for n in noms):
            return None
        if not any(a.priority < prio for a in self.cache.state.assignments.values()):
            return None
        return members, need, prio, now

    def place_gang_in_held_room(self, group: str, gangs: GangScheduler) -> GangResult | None:
        """A gang that could preempt goes first into room held for pods not yet here: the gang
        placed there (the caller binds it), or None when that is not enough.  Rationed as planning is."""
        if self._gang_wants_room(group, gangs) is None or not self.planning_allowed():
            return None
        t0 = time.monotonic()
        try:
            return gangs.place_in_held_room(group, self.clock())
        finally:
            self._planned(t0)

    def make_room_for_gang(self, group: str, gangs: GangScheduler) -> None:
        """A complete gang that does not fit: preempt lower-priority pods for all of it at once."""
        want = self._gang_wants_room(group, gangs)
        if want is None or not self.planning_allowed():
            return
        members, need, prio, now = want
        t0 = time.monotonic()
        try:
            plan = find_gang_victims(self.cache.sched, group, members, need, budgets=self.cache.budgets(),
                                     age_rank=self.cache.age_rank(),
                                     exclude=self.leaving() | set(gangs.held), **self._candidate_bound())
        finally:
            self._planned(t0)
        if plan is None:
            return
        done = self._evict(plan.victims, f"preempted by pod group {group} (priority {prio})", "preempted", group)
        if done is None or not (done[0] or done[1]):
            return
        evicted, gone = done
        for r in members:
            self.nominated[r.key] = (evicted | gone, now + self.nominated_timeout_s)
            if evicted and r.key in self.queue.pending:
                self.events.send(self.queue.pending[r.key], "Normal", "Preempting",
                                 "; ".join([ln for ln in plan.explanation if not _names_any(ln, gone)]
                                           + ([f"already gone: {', '.join(sorted(gone))}"] if gone else [])))

    def _evict(self, victims: list[Assignment], reason: str, kind: str, for_: str) -> tuple[set[str], set[str]] | None:
        """(evicted, already gone), or None if a victim is not bound yet (see ``Evictions.evict``)."""
        return self.evictions.evict(victims, self.cache.bound_pods, reason, kind, for_)

    def _candidate_bound(self) -> dict:
        """Like kube-scheduler: look for preemption candidates on max(100, 10% of nodes), from a random node on."""
        n = len(self.cache.state)
        return {"max_candidates": max(100, n // 10), "start": int(self.cache.sched.rng.integers(n)) if n else 0}

