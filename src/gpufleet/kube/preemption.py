"""Reclaim and preemption in the live loop: the shared round (``engine.round``) plans room for a pod
(or a gang) that does not fit -- quota its queue lent out, else lower-priority pods within
PodDisruptionBudgets -- and this module carries the plans out: victims are deleted through the API
(``evictor.Evictions``) and the pod is nominated until they are gone.

Why a module of its own: making room is kube-scheduler's PostFilter, a step apart from the cycle
that finds no node.  ``Preemptor`` is the round's ``RoomPort`` for the live loop and owns what that
decides: the nominations (pod -> victims being deleted for it; the queue tries nominated pods first)
and its planning debt (planning time is capped at ``PLAN_SHARE`` of the loop's).  The room itself is
kept for the nominated pod by the round (``SchedulingRound.nominations``); this writes
``status.nominatedNodeName`` as kube-scheduler does.  It reads the
cache's snapshot (``ClusterView``) each time: a relist replaces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from ..engine.model import Assignment, PodRequest
from ..engine.preemption import Plan, candidate_bound
from ..engine.round import Attempt, RoomFor
from ..engine.schedqueue import RoomPlan
from .api import SchedulerApi
from .evictor import Evictions
from .events import EventSink, names_any
from .view import ClusterView
from .scheduling_queue import SchedulingQueue

if TYPE_CHECKING:
    from .dra import LiveDra

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


class Preemptor:
    """Makes room for pods that do not fit (``engine.round.RoomPort``); see the module docstring.
    Runs on the loop's thread."""

    PLAN_SHARE = 0.25  # of the loop's time that preemption planning may use on average

    def __init__(self, api: SchedulerApi, cache: ClusterView, queue: SchedulingQueue, events: EventSink,
                 evictions: Evictions, clock: Callable[[], float], nominated_timeout_s: float = 120.0,
                 dra: LiveDra | None = None) -> None:
        self.api = api
        self.dra = dra  # DRA claims the scheduler allocates (room coming back after a deallocation)
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

    # --- the round's RoomPort -----------------------------------------------------------------
    def lower_priority_running(self, priority: int) -> bool:
        return any(a.priority < priority for a in self.cache.state.assignments.values())

    def may_plan(self, room: RoomFor, now: float) -> bool:
        """Not while room is already on its way (victims deleted for it still leaving), and within the
        planning share."""
        keys = [room.key] if room.request is not None else [r.key for r in room.members]
        for k in keys:
            nom = self.nominated.get(k)
            if nom is not None and self._still_leaving(nom, self.clock()):
                return False  # victims already on their way out
        return self.planning_allowed()

    def planned(self, room: RoomFor, now: float, spent_s: float, outcome: str) -> None:
        self.plan_debt_s += spent_s

    def victim_options(self) -> Mapping[str, Any]:
        cache = self.cache
        return dict(budgets=cache.budgets(), age_rank=cache.age_rank(), **candidate_bound(cache.sched))

    def room_coming(self, request: PodRequest) -> str:
        """DRA: devices of claims whose pods are gone come back once the resourceclaim controller deallocates them."""
        if self.dra is None:
            return ""
        return self.dra.waiting_for_deallocation(self.cache.sched, request, self.cache.bound_pods)

    def leaving(self) -> set[str]:
        """Pods on their way out (evictions in flight, terminating): never chosen as victims again."""
        return self.evictions.leaving(self.cache.bound_pods)

    def evict(self, attempt: Attempt) -> bool | None:
        """Delete the plan's victims; the pod binds once the watch shows them gone (False: not yet; None:
        nothing was deleted, it plans again at its next retry)."""
        key = attempt.request.key
        pod = self.queue.pending.get(key)
        if pod is not None and attempt.room is not None:
            try:
                return False if self.carry_out(key, pod, attempt.room) else None
            except Exception:  # an eviction bug must not stop the loop
                log.exception("making room for %s failed", key)
        return None

    def evict_for_gang(self, room: RoomFor, plan: Plan) -> bool:
        """Delete a gang's victims and nominate every member until they are gone (False: not yet)."""
        done = self._evict(plan.victims, f"preempted by pod group {room.key} (priority {room.priority})", "preempted", room.key)
        if done is None or not (done[0] or done[1]):
            return False
        evicted, gone = done
        now = self.clock()
        for r in room.members:
            self.nominated[r.key] = (evicted | gone, now + self.nominated_timeout_s)
            if evicted and r.key in self.queue.pending:
                self.events.send(self.queue.pending[r.key], "Normal", "Preempting",
                                 "; ".join([ln for ln in plan.explanation if not names_any(ln, gone)]
                                           + ([f"already gone: {', '.join(sorted(gone))}"] if gone else [])))
        return False

    # --- carrying plans out -------------------------------------------------------------------
    def _still_leaving(self, nom: tuple[set[str], float], now: float) -> bool:
        """Is room already on its way for a nominated pod?  While its victims are still there and either
        the nomination is fresh or they are still leaving (in flight, terminating), it plans nothing more."""
        there = [v for v in nom[0] if v in self.cache.state.assignments]
        return bool(there) and (now < nom[1] or bool(set(there) & self.leaving()))

    def carry_out(self, key: str, pod: dict, rp: RoomPlan) -> bool:
        """Delete a plan's victims through the API and nominate the pod until they are gone.  False when
        nothing happened (no victims, a victim not bound yet, every DELETE failed)."""
        if not rp.victims:
            return False
        now = self.clock()
        reason, kind, lines, node = rp.reason, rp.kind, rp.explanation, rp.node or ""
        done = self._evict(rp.victims, reason, kind, key)
        if done is None:
            return False
        evicted, gone = done
        if not evicted and not gone:
            return False  # nothing happened (every DELETE failed): plan again at the next retry
        self.nominated[key] = (evicted | gone, now + self.nominated_timeout_s)
        if node:  # like kube-scheduler: `kubectl get pod -o wide` shows NOMINATED NODE (the round keeps the room)
            ns, name = key.split("/", 1)
            try:
                self.api.nominate(ns, name, node)
            except Exception as exc:  # best effort: the round keeps the room whether or not the status says so
                log.info("could not set nominatedNodeName on %s: %s", key, exc)
        if not evicted:
            return True  # the victims were gone already: their room frees without us
        what = [ln for ln in (lines or []) if not names_any(ln, gone)]
        if gone:
            what.append(f"already gone: {', '.join(sorted(gone))}")
        self.events.send(pod, "Normal", "Preempting" if kind == "preempted" else "Reclaiming", "; ".join(what or [reason]))
        return True

    def _evict(self, victims: list[Assignment], reason: str, kind: str, for_: str) -> tuple[set[str], set[str]] | None:
        """(evicted, already gone), or None if a victim is not bound yet (see ``Evictions.evict``)."""
        return self.evictions.evict(victims, self.cache.bound_pods, reason, kind, for_)


