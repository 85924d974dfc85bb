# mypy: disable-error-code="misc"
# (methods take ``self: SchedulerLoop``, the class that mixes them in; mypy wants a supertype there)
"""Reclaim and preemption in the live loop: when a pod (or a gang) does not fit, reclaim quota
its queue lent out, else preempt lower-priority pods within PodDisruptionBudgets; victims are
deleted through the API (``evictor.Evictions``) and the pod is nominated until they are gone.

Why a module of its own: making room is kube-scheduler's PostFilter, a step apart from the
cycle that finds no node.  A mixin of ``SchedulerLoop`` because it plans on the loop's snapshot
and its nominations feed the loop's queue order.  Planning time is capped (``PLAN_SHARE``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..engine import annotations as ann
from ..engine.gang import group_key
from ..engine.model import Assignment, PodRequest
from ..engine.preemption import find_gang_victims
from ..engine.schedqueue import plan_room
from .loop_support import _names_any

if TYPE_CHECKING:
    from .loop import SchedulerLoop

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


class PreemptionMixin:
    """Methods of ``SchedulerLoop``; see the module docstring."""

    # --- reclaim and preemption -----------------------------------------------------------
    def _planning_allowed(self: SchedulerLoop) -> bool:
        """Preemption planning may take ``PLAN_SHARE`` of the loop's time on average (1 s bursts):
        a flood of pods nothing can make room for must not stall the binds of pods that fit.
        A pod skipped here plans again at its next retry."""
        now = time.monotonic()
        self._plan_debt_s = max(0.0, self._plan_debt_s - (now - self._plan_last) * self.PLAN_SHARE)
        self._plan_last = now
        return self._plan_debt_s < 1.0

    def _planned(self: SchedulerLoop, t0: float) -> None:
        self._plan_debt_s += time.monotonic() - t0

    def _make_room(self: SchedulerLoop, key: str, pod: dict, req: PodRequest) -> None:
        """Reclaim lent quota, else preempt lower-priority pods; delete the victims through the API."""
        now = self.clock()
        nom = self._nominated.get(key)
        if nom is not None and self._still_leaving(nom, now):
            return  # victims already on their way out
        if not self._planning_allowed():
            return
        t0 = time.monotonic()
        try:
            self._plan_and_evict(key, pod, req, now)
        finally:
            self._planned(t0)

    def _still_leaving(self: SchedulerLoop, nom: tuple[set[str], float], now: float) -> bool:
        """Is room already on its way for a nominated pod?  While its victims are still there and either
        the nomination is fresh or they are still leaving (in flight, terminating), it plans nothing more."""
        there = [v for v in nom[0] if v in self.state.assignments]
        return bool(there) and (now < nom[1] or bool(set(there) & self._leaving()))

    def _leaving(self: SchedulerLoop) -> set[str]:
        """Pods on their way out (evictions in flight, terminating): never chosen as victims again."""
        return self.evictions.leaving(self.bound_pods)

    def _plan_and_evict(self: SchedulerLoop, key: str, pod: dict, req: PodRequest, now: float) -> None:
        leaving = self._leaving() | set(self.gangs.held)  # held pods are not running: nothing to evict
        rp = plan_room(self.sched, self.tree, req, lambda: dict(
            pdbs=self.objects.budgets, pod_labels=self._pod_labels(), age_rank=self._age_rank(), **self._candidate_bound()),
            exclude=leaving)
        if rp is None or not rp.victims:
            return
        reason, kind, lines, node = rp.reason, rp.kind, rp.explanation, rp.node or ""
        done = self._evict(rp.victims, reason, kind, key)
        if done is None:
            return
        evicted, gone = done
        if not evicted and not gone:
            return  # nothing happened (every DELETE failed): plan again at the next retry
        self._nominated[key] = (evicted | gone, now + self.nominated_timeout_s)
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

    def _make_room_for_gang(self: SchedulerLoop, group: str) -> None:
        """A complete gang that does not fit: preempt lower-priority pods for all of it at once."""
        g = self.gangs.gangs.get(group)
        if g is None:
            return
        need = max(g.group.min_member - len(g.running), 1)
        if len(g.members) < need:
            return  # not all there yet: nothing to make room for
        held = set(self.gangs.held) if self.gangs.holder == group else set()
        members = [r for r in g.members.values() if r.key not in held]  # held ones already have their room
        if any(r.preempt_never for r in members):
            return  # preemptionPolicy: Never on a member: the gang waits
        need -= len(held)
        if need <= 0 or not members:
            return
        now = self.clock()
        noms = [self._nominated.get(r.key) for r in members]
        if any(n is not None and self._still_leaving(n, now) for n in noms):
            return
        prio = min(r.priority for r in members)
        if not any(a.priority < prio for a in self.state.assignments.values()) or not self._planning_allowed():
            return
        t0 = time.monotonic()
        try:
            plan = find_gang_victims(self.sched, group, members, need, pdbs=self.objects.budgets, pod_labels=self._pod_labels(),
                                     age_rank=self._age_rank(), exclude=self._leaving() | set(self.gangs.held),
                                     **self._candidate_bound())
        finally:
            self._planned(t0)
        if plan is None:
            return
        done = self._evict(plan.victims, f"preempted by pod group {group} (priority {prio})", "preempted", group)
        if done is None or not (done[0] or done[1]):
            return
        evicted, gone = done
        for r in members:
            self._nominated[r.key] = (evicted | gone, now + self.nominated_timeout_s)
            if evicted and r.key in self.pending:
                self.events.send(self.pending[r.key], "Normal", "Preempting",
                                 "; ".join([ln for ln in plan.explanation if not _names_any(ln, gone)]
                                           + ([f"already gone: {', '.join(sorted(gone))}"] if gone else [])))

    def _evict(self: SchedulerLoop, victims: list[Assignment], reason: str, kind: str, for_: str) -> tuple[set[str], set[str]] | None:
        """(evicted, already gone), or None if a victim is not bound yet (see ``Evictions.evict``)."""
        return self.evictions.evict(victims, self.bound_pods, reason, kind, for_)

    def _gang_line(self: SchedulerLoop, req: PodRequest) -> str:
        """Where a gang member's pod group stands: members waiting and running against its minimum."""
        k = group_key(req)
        if k is None:
            return ""

        def in_group(p: dict) -> bool:
            m = p.get("metadata") or {}
            return (m.get("namespace") or "default") == req.namespace and (m.get("annotations") or {}).get(ann.POD_GROUP) == req.pod_group
        waiting = sum(1 for p in self.pending.values() if in_group(p))
        running = sum(1 for p in self.bound_pods.values() if in_group(p))
        need = max(req.pod_group_min, 1)
        what = "places all-or-nothing" if running < need else "is running; extra members go one by one"
        return f"pod group {k}: {waiting} member(s) waiting, {running} running, minMember {need} -- the gang {what}"

    def _candidate_bound(self: SchedulerLoop) -> dict:
        """Like kube-scheduler: look for preemption candidates on max(100, 10% of nodes), from a random node on."""
        n = len(self.state)
        return {"max_candidates": max(100, n // 10), "start": int(self.sched.rng.integers(n)) if n else 0}

    def _pod_labels(self: SchedulerLoop) -> dict[str, dict[str, str]]:
        return {k: dict(((p.get("metadata") or {}).get("labels") or {})) for k, p in self.bound_pods.items()}

    def _age_rank(self: SchedulerLoop) -> dict[str, int]:
        """Older pods (smaller resourceVersion when first seen bound) rank lower, so the youngest go first."""
        return {k: self._pod_rv.get(k, 0) for k in self.state.assignments}
