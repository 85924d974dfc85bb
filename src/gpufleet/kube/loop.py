"""The secondary scheduler's loop: snapshot from list+watch, one engine cycle per pod, bind.

State is rebuilt from the API server alone: every bound pod's exact GPUs come
from its ``gpufleet.io/assignment`` annotation, so a restarted scheduler sees
the same devices taken and never double-books.  A pod that does not fit gets a
``FailedScheduling`` event with the engine's aggregated reasons and waits with
exponential backoff; all waiting pods are retried at once when the cluster
changes (a node added or updated, a pod deleted).  A pod whose spec is invalid
gets a warning event naming the field.  Nothing one pod does stops the loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from ..engine import annotations as ann
from ..engine.errors import GpufleetError
from ..engine.framework import Profile, Scheduler
from ..engine.inventory import assignment_to_json
from ..engine.podspec import parse_pod, pod_key
from ..engine.state import ClusterState
from .api import Conflict, SchedulerApi
from .convert import bound_assignment, is_terminal, node_from_json, node_ready

log = logging.getLogger(__name__)


@dataclass
class Stats:
    attempts: dict[str, int] = field(default_factory=lambda: {"scheduled": 0, "unschedulable": 0, "error": 0, "invalid": 0})
    e2e_s: list[float] = field(default_factory=list)
    binds: int = 0


class SchedulerLoop:
    def __init__(self, api: SchedulerApi, profile: Profile, scheduler_name: str = "gpufleet", seed: int = 0,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 on_attempt: Callable[[str, float], None] | None = None):
        self.api = api
        self.profile = profile
        self.scheduler_name = scheduler_name
        self.seed = seed
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.on_attempt = on_attempt
        self.stats = Stats()
        self.state = ClusterState()
        self.sched = Scheduler(profile, self.state, seed=seed)
        self.node_objs: dict[str, dict] = {}
        self.pending: dict[str, dict] = {}  # key -> pod JSON
        self.bound: set[str] = set()
        self._backoff: dict[str, float] = {}  # key -> current backoff
        self._not_before: dict[str, float] = {}
        self._first_seen: dict[str, float] = {}
        self.rv = {"node": "", "pod": ""}

    # --- snapshot -------------------------------------------------------------------
    def resync(self) -> None:
        """Full relist: rebuild the snapshot from scratch (start-up, 410 Gone)."""
        nodes, self.rv["node"] = self.api.list_nodes()
        pods, self.rv["pod"] = self.api.list_pods()
        self.node_objs = {}
        good = []
        for n in nodes:
            try:
                if node_ready(n):
                    good.append(node_from_json(n))
                    self.node_objs[n["metadata"]["name"]] = n
            except GpufleetError as exc:
                log.warning("ignoring node: %s", exc)
        self.state = ClusterState(good)
        self.sched = Scheduler(self.profile, self.state, seed=self.seed)
        self.pending.clear()
        self.bound.clear()
        for p in pods:
            self._pod_event("ADDED", p, wake=False)

    def _pod_event(self, type_: str, pod: dict, wake: bool = True) -> None:
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        if type_ == "DELETED" or is_terminal(pod):
            self.pending.pop(key, None)
            if key in self.bound:
                self.bound.discard(key)
                self.sched.forget(key)
                if wake:
                    self.wake_all()
            return
        if spec.get("nodeName"):
            self.pending.pop(key, None)
            if key not in self.bound and key not in self.state.assignments:
                try:
                    a = bound_assignment(pod, self.state)
                    if a.node in self.state.index:
                        problem = self.state.check(a)
                        if problem:
                            log.error("pod %s holds resources the snapshot says are taken: %s", key, problem)
                        else:
                            self.state.reserve(a)
                except GpufleetError as exc:
                    log.warning("bound pod %s: %s", key, exc)
            self.bound.add(key)
            return
        if spec.get("schedulerName", "default-scheduler") == self.scheduler_name:
            self.pending[key] = pod
            self._first_seen.setdefault(key, self.clock())

    def _node_event(self, type_: str, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        if type_ == "DELETED" or not node_ready(node):
            if name in self.state.index:
                self.state.remove_node(name)
            self.node_objs.pop(name, None)
            return
        try:
            n = node_from_json(node)
        except GpufleetError as exc:
            log.warning("ignoring node update: %s", exc)
            return
        if name in self.state.index:
            self.state.update_node(n)
        else:
            self.state.add_node(n)
        self.node_objs[name] = node
        self.wake_all()

    def handle(self, kind: str, type_: str, obj: dict) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.rv[kind] = rv
        (self._node_event if kind == "node" else self._pod_event)(type_, obj)

    def wake_all(self) -> None:
        """The cluster changed: every waiting pod may fit now."""
        self._not_before.clear()

    # --- scheduling ---------------------------------------------------------------------
    def due(self) -> list[str]:
        now = self.clock()
        keys = [k for k in self.pending if self._not_before.get(k, 0.0) <= now]
        # higher priority first, then first seen
        return sorted(keys, key=lambda k: (-int((self.pending[k].get("spec") or {}).get("priority") or 0), self._first_seen.get(k, 0.0), k))

    def next_wakeup(self) -> float | None:
        times = [self._not_before.get(k, 0.0) for k in self.pending]
        return min(times) if times else None

    def _defer(self, key: str) -> None:
        b = min(self.backoff_max_s, self._backoff.get(key, self.backoff_initial_s / 2) * 2)
        self._backoff[key] = b
        self._not_before[key] = self.clock() + b

    def schedule_due(self) -> int:
        n = 0
        for key in self.due():
            pod = self.pending.get(key)
            if pod is not None:
                self.schedule_one(pod)
                n += 1
        return n

    def schedule_one(self, pod: dict) -> str:
        key = pod_key(pod)
        t0 = self.clock()
        try:
            req = parse_pod(pod)
        except GpufleetError as exc:
            self._count("invalid", t0)
            self._event(pod, "Warning", "FailedScheduling", f"invalid pod spec: {exc}")
            self._defer(key)
            return "invalid"
        try:
            dec = self.sched.schedule(req)
        except Exception as exc:  # an engine bug must not stop the loop
            log.exception("engine error on %s", key)
            self._count("error", t0)
            self._event(pod, "Warning", "FailedScheduling", f"internal error: {exc}")
            self._defer(key)
            return "error"
        if not dec.ok:
            self._count("unschedulable", t0)
            self._event(pod, "Warning", "FailedScheduling", dec.status.message)
            self._defer(key)
            return "unschedulable"
        a = dec.assignment
        assert a is not None
        idx = self.state.index[a.node]
        uuids = {g.index: g.uuid for g in self.state.nodes[idx].gpus}
        try:
            m = pod["metadata"]
            self.api.bind(m.get("namespace", "default"), m["name"], a.node, {ann.ASSIGNMENT: assignment_to_json(a, uuids)})
        except Conflict as exc:
            self.sched.forget(key)  # someone else bound or deleted it; the watch will tell us which
            self.pending.pop(key, None)
            log.info("bind conflict for %s: %s", key, exc)
            self._count("error", t0)
            return "conflict"
        except Exception as exc:  # timeouts, lost connection: unreserve and retry later
            self.sched.forget(key)
            self._count("error", t0)
            self._event(pod, "Warning", "FailedScheduling", f"binding to {a.node} failed: {exc}")
            self._defer(key)
            return "error"
        self.pending.pop(key, None)
        self.bound.add(key)
        self._backoff.pop(key, None)
        self._not_before.pop(key, None)
        self.stats.binds += 1
        self._count("scheduled", t0)
        self.stats.e2e_s.append(self.clock() - self._first_seen.pop(key, t0))
        gpus = f" GPUs {list(a.gpu_indices)}" if a.gpu_indices else ""
        share = f" ({a.gpu_milli} milli each)" if a.gpu_indices and a.gpu_milli < 1000 else ""
        mig = f" MIG {a.mig_profile} {list(a.mig)}" if a.mig else ""
        self._event(pod, "Normal", "Scheduled", f"Successfully assigned {key} to {a.node}{gpus}{share}{mig}")
        return "scheduled"

    def _count(self, result: str, t0: float) -> None:
        self.stats.attempts[result] = self.stats.attempts.get(result, 0) + 1
        if self.on_attempt:
            self.on_attempt(result, self.clock() - t0)

    def _event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        try:
            self.api.event(pod, type_, reason, message)
        except Exception as exc:  # events are best effort
            log.warning("could not record event for %s: %s", pod_key(pod), exc)

    def explain(self, pod: dict) -> tuple[str, dict[str, str]]:
        """(summary, node -> reason) for ``gpufleet explain``; changes nothing."""
        req = parse_pod(pod)
        dec = self.sched.explain(req)
        by_node = dict(dec.diagnosis.by_node) if dec.diagnosis else {}
        if dec.ok:
            return f"fits: best node {dec.assignment.node} (score {dec.score:.1f}, {dec.feasible_nodes} feasible)", by_node  # type: ignore[union-attr]
        msg = dec.status.message
        if req.priority > 0:  # dry-run preemption: what would make room
            from ..engine.preemption import find_victims

            plan = find_victims(self.sched, req)
            msg += "\n  preemption (dry run): " + ("; ".join(plan.explanation) if plan else "no set of lower-priority pods would make room")
        return msg, by_node


__all__ = ["SchedulerLoop", "Stats"]
