"""The extender's snapshot: the secondary scheduler's loop with its own scheduling off, plus the reservations
filter makes (a node and devices held under the pod's key until its bind) and the GPU pods kube-scheduler
parked after failing to reach us.  See the package docstring for why decisions are made at filter time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...engine import annotations as ann
from ...engine.errors import GpufleetError
from ...engine.framework import Profile
from ...engine.model import Assignment
from ...engine.podspec import parse_pod, pod_key
from ..api import SchedulerApi
from ..convert import is_terminal
from ..loop import SchedulerLoop

log = logging.getLogger("gpufleet.kube.extender")
NO_SCHEDULER = "\x00gpufleet-extender-none"  # the loop queues no pod of its own: kube-scheduler drives it
RETRY_ANNOTATION = ann.EXTENDER_RETRY
RELEASE_REASONS = ("expired", "deleted", "bound_elsewhere", "refiltered", "other_node", "bind_failed", "lost")


@dataclass
class Reservation:
    """A node and devices chosen at filter and held in the snapshot until the pod's bind."""

    key: str
    uid: str | None
    pod: dict  # slim copy of the pod as kube-scheduler sent it
    assignment: Assignment
    made: float  # monotonic time of the filter that made it


class ExtenderLoop(SchedulerLoop):
    """The secondary scheduler's snapshot (list+watch, restart-safe), with filter-time reservations.

    Pods are never queued here (kube-scheduler does that); watch events release
    reservations whose pod was deleted or bound by someone else.  The HTTP
    threads and the watch thread share it under the extender's lock.
    """

    def __init__(self, api: SchedulerApi, profile: Profile, reservation_ttl_s: float = 30.0, **kw: Any) -> None:
        kw.setdefault("scheduler_name", NO_SCHEDULER)
        kw.setdefault("policy_kinds", False)
        kw.setdefault("preemption", False)
        kw.setdefault("constraint_kinds", False)  # kube-scheduler already judged pod-to-pod constraints and volumes
        super().__init__(api, profile, **kw)
        self.reservation_ttl_s = reservation_ttl_s
        self.reservations: dict[str, Reservation] = {}
        self.released: dict[str, int] = dict.fromkeys(RELEASE_REASONS, 0)
        self.on_release: Callable[[str, Reservation], None] | None = None
        self.first_filter: dict[str, float] = {}  # pod key -> monotonic time of its first filter (e2e latency)
        self.stuck: dict[str, tuple[str | None, str]] = {}  # GPU pods kube-scheduler parked on an error reaching us: uid, message
        self.retried: dict[str, tuple[float, float]] = {}  # pod key -> (next retry allowed at, backoff)
        self.last_heard = time.monotonic()  # last list or watch event applied (snapshot age)

    # --- reservations -----------------------------------------------------------------
    def hold(self, r: Reservation) -> None:
        self.reservations[r.key] = r

    def release(self, key: str, reason: str) -> Reservation | None:
        """Drop a reservation and give its devices back (only if the snapshot still holds exactly it)."""
        r = self.reservations.pop(key, None)
        if r is None:
            return None
        if self.cache.state.assignments.get(key) == r.assignment:
            self.cache.sched.forget(key)
            self.wake_all()
        self.released[reason] = self.released.get(reason, 0) + 1
        if self.on_release is not None:
            self.on_release(reason, r)
        return r

    def expire(self, now: float | None = None) -> int:
        """Release reservations no bind claimed within ``reservation_ttl_s``; returns how many."""
        now = time.monotonic() if now is None else now
        old = [k for k, r in self.reservations.items() if now - r.made > self.reservation_ttl_s]
        for k in old:
            self.release(k, "expired")
        return len(old)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush events only: binds in flight belong to HTTP threads that need the lock the caller holds."""
        self.events.flush(timeout_s)

    # --- snapshot hooks ---------------------------------------------------------------
    def handle(self, kind: str, type_: str, obj: dict) -> None:
        self.last_heard = time.monotonic()
        super().handle(kind, type_, obj)

    def resync(self) -> None:
        super().resync()
        self.last_heard = time.monotonic()
        gpus = sum(len(n.gpus) for n in self.cache.state.nodes)
        log.info("snapshot synced: %d node(s) with %d GPU(s), %d bound pod(s)%s", len(self.cache.state), gpus, len(self.cache.bound_pods),
                 f"; left out: {', '.join(sorted(self.cache.bad_nodes))}" if self.cache.bad_nodes else "")

    def rebuild(self) -> None:
        super().rebuild()
        for k, r in list(self.reservations.items()):  # a fresh snapshot keeps what filters chose
            a = r.assignment
            if k in self.cache.state.assignments or a.node not in self.cache.state.index or self.cache.state.check(a):
                self.reservations.pop(k)
                self.released["lost"] += 1
                if self.on_release is not None:
                    self.on_release("lost", r)
            else:
                self.cache.state.reserve(a)

    def _note_stuck(self, type_: str, pod: dict) -> None:
        """Track pending GPU pods whose last scheduling attempt failed on a call to this extender."""
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        msg = str((cond or {}).get("message") or "")
        if (type_ == "DELETED" or is_terminal(pod) or spec.get("nodeName") or cond is None or cond.get("status") != "False"
                or cond.get("reason") != "SchedulerError" or not extender_error(msg)):
            if self.stuck.pop(key, None) is not None:
                self.retried.pop(key, None)
            return
        try:
            gpus = parse_pod(pod).gpu_count
        except GpufleetError:
            gpus = 0
        if gpus:
            self.stuck[key] = ((pod.get("metadata") or {}).get("uid"), msg)

    def on_pod_listed(self, pod: dict) -> None:
        self._note_stuck("ADDED", pod)

    def on_pod_event(self, type_: str, pod: dict) -> None:
        self._note_stuck(type_, pod)
        key = pod_key(pod)
        meta = pod.get("metadata") or {}
        r = self.reservations.get(key)
        if r is not None:
            uid = meta.get("uid")
            if r.uid and uid and uid != r.uid:
                if type_ != "DELETED":  # a new pod of that name exists: ours is gone
                    self.release(key, "deleted")
            elif type_ == "DELETED" or is_terminal(pod):
                self.release(key, "deleted")
            elif (pod.get("spec") or {}).get("nodeName") and not self.binder.is_in_flight(key):
                self.release(key, "bound_elsewhere")  # then the loop takes the placement it has
        done = type_ == "DELETED" or is_terminal(pod) or (pod.get("spec") or {}).get("nodeName")
        if done and not self.binder.is_in_flight(key):
            self.first_filter.pop(key, None)


def extender_error(message: str) -> bool:
    """kube-scheduler's message for a failed call to this extender (transport error naming a verb, or not synced)."""
    return any(v in message for v in ('/filter"', '/prioritize"', '/bind"', "gpufleet has not synced"))
