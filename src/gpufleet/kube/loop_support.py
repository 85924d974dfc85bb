"""Small types and helpers shared by the scheduler loop and its parts (cache, binder, volume
binding, preemption), and ``ClusterView``, the cache as the other parts read it.

Why a module of its own: the parts live in their own modules and ``loop.py`` imports them, so
what they all use sits here, below both, with no import cycle.  ``loop.py`` re-exports the
names other modules import from it (``Stats``, ``slim_pod``, ``reason_text``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from ..engine import annotations as ann
from ..engine.framework import Profile
from ..engine.model import Taint
from ..engine.podspec import pod_key
from .api import (
    SchedulerApi,
)

if TYPE_CHECKING:
    from ..engine.disruption import Budgets
    from ..engine.framework import Scheduler
    from ..engine.queues import QueueTree
    from ..engine.state import ClusterState
    from .policy_objects import PolicyObjects

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split

NOT_READY_TAINT = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")


@dataclass
class Stats:
    attempts: dict[str, int] = field(default_factory=lambda: {"scheduled": 0, "unschedulable": 0, "error": 0, "invalid": 0})
    e2e_s: list[float] = field(default_factory=list)
    binds: int = 0
    double_book_refused: int = 0  # bound pods whose devices the snapshot already had taken
    events_dropped: int = 0
    preempted: int = 0  # pods deleted to make room for higher priority
    reclaimed: int = 0  # borrowed pods deleted to give a queue its quota back
    already_gone: int = 0  # victims whose eviction found them gone (404): not evictions of ours
    eviction_refused: int = 0  # evictions the API server refused (429): a PodDisruptionBudget said no
    held_room: int = 0  # pods placed in room the policy held for pods not yet here, rather than evict anyone
    interrupted: int = 0  # pods moved off nodes with an interruption notice (or gone), kube/interruption.py


class ClusterView(Protocol):
    """What the cache shows the loop's other parts: the snapshot (rebuilt on a relist: read it
    through this view each time, never keep it) and the objects it was built from; and the two
    writes a bind result makes (the pod held as bound, its resources reserved)."""

    @property
    def state(self) -> ClusterState: ...
    @property
    def sched(self) -> Scheduler: ...
    @property
    def tree(self) -> QueueTree | None: ...
    @property
    def objects(self) -> PolicyObjects: ...
    @property
    def bound_pods(self) -> Mapping[str, dict]: ...

    def add_bound(self, key: str, pod: dict) -> dict:
        """Hold a pod seen bound (unless the watch already showed it); returns what is held."""
        ...

    def reserve_bound(self, key: str, pod: dict) -> None:
        """Hold a bound pod's resources in the snapshot (unless they clash with what it holds)."""
        ...

    def budgets(self) -> Budgets:
        """The PodDisruptionBudgets with the facts about the bound pods they may cover."""
        ...

    def age_rank(self) -> dict[str, int]:
        """Larger = younger (started later, see ``pod_age_key``), so the youngest go first."""
        ...


def slim_pod(pod: dict) -> dict:
    """What a bound pod's resources are computed from; the rest is dropped (clusters have many pods)."""
    m = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def ctr(c: dict) -> dict:
        out = {"name": c.get("name"), "resources": c.get("resources") or {}}
        if "restartPolicy" in c:
            out["restartPolicy"] = c["restartPolicy"]
        ports = [p for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
        if ports:
            out["ports"] = ports
        return out

    ann_ = {k: v for k, v in (m.get("annotations") or {}).items() if k.startswith(ann.PREFIX)}
    s = {k: spec[k] for k in ("nodeName", "schedulerName", "priority", "overhead", "hostNetwork", "resources", "schedulingGroup",
                              "resourceClaims") if k in spec}
    # what other pods' constraints see: inter-pod (anti-)affinity terms (symmetry) and claimed volumes
    aff = {k: v for k, v in (spec.get("affinity") or {}).items() if k in ("podAffinity", "podAntiAffinity")}
    if aff:
        s["affinity"] = aff
    vols = [v for v in spec.get("volumes") or [] if isinstance(v, dict) and ("persistentVolumeClaim" in v or "ephemeral" in v)]
    if vols:
        s["volumes"] = [{"name": v.get("name"), **({"persistentVolumeClaim": v["persistentVolumeClaim"]} if "persistentVolumeClaim" in v else {"ephemeral": {}})} for v in vols]
    s["containers"] = [ctr(c) for c in spec.get("containers") or [] if isinstance(c, dict)]
    if spec.get("initContainers"):
        s["initContainers"] = [ctr(c) for c in spec["initContainers"] if isinstance(c, dict)]
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp",
                              "creationTimestamp") if k in m}
    meta["annotations"] = ann_
    status = _resize_status(pod.get("status") or {})
    for k in ("resourceClaimStatuses", "extendedResourceClaimStatus"):  # the ResourceClaims it uses (DRA)
        if (pod.get("status") or {}).get(k):
            status[k] = pod["status"][k]
    return {"metadata": meta, "spec": s, "status": status}


def _resize_status(st: dict) -> dict:
    """The status a running pod's held resources are counted from (in-place resize): phase, the resize
    conditions, what kubelet allocated and actuated per container and for the pod; and what a
    PodDisruptionBudget and the victim order ask of it (Ready, startTime)."""
    out: dict = {"phase": st.get("phase")}
    if st.get("startTime"):
        out["startTime"] = st["startTime"]  # a victim's age (youngest first)
    # Ready: what a PodDisruptionBudget asks of a victim; the resize conditions: what it holds
    conds = [c for c in st.get("conditions") or [] if isinstance(c, dict)
             and c.get("type") in ("Ready", "PodResizePending", "PodResizeInProgress")]
    if conds:
        out["conditions"] = conds
    for kind in ("containerStatuses", "initContainerStatuses"):
        keep = []
        for c in st.get(kind) or []:
            if not isinstance(c, dict):
                continue
            k = {f: c[f] for f in ("name", "allocatedResources") if f in c}
            if isinstance(c.get("resources"), dict) and "requests" in c["resources"]:
                k["resources"] = {"requests": c["resources"]["requests"]}
            if len(k) > 1:
                keep.append(k)
        if keep:
            out[kind] = keep
    if "allocatedResources" in st:
        out["allocatedResources"] = st["allocatedResources"]
    if isinstance(st.get("resources"), dict):
        out["resources"] = {k: v for k, v in st["resources"].items() if k == "requests"}
    return out


def reason_text(status) -> str:
    """The engine's reasons in kube-scheduler's words ("0/12 nodes are available: ..."), no status-code prefix."""
    return "; ".join(status.reasons) or status.message


def _names_any(line: str, pod_keys: set[str]) -> bool:
    """Does an explanation line name one of these pods (as a whole word)?"""
    words = set(line.replace(",", " ").split())
    return any(k in words for k in pod_keys)


def _created_s(obj: dict) -> float | None:
    """metadata.creationTimestamp as seconds since the epoch, or None."""
    import datetime

    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.datetime.fromisoformat(ts).timestamp()  # "...Z": Python 3.11 reads it
    except ValueError:
        return None


def _time_s(ts: object) -> float | None:
    import datetime

    if not isinstance(ts, str):
        return None
    try:
        return datetime.datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def pod_age_key(pod: dict, first_seen_rv: int) -> int:
    """Larger = younger.  A pod's age is when it started (``status.startTime``, else its
    ``creationTimestamp``), the time kube-scheduler orders victims by; within one second (the
    timestamps' resolution), the pod the scheduler saw first (its resourceVersion then) is older."""
    t = _time_s((pod.get("status") or {}).get("startTime")) or _created_s(pod) or 0.0
    return (int(t) << 64) + max(0, first_seen_rv)


def _rv(obj: dict) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:  # resourceVersions are opaque; etcd's are integers
        return None


class EventSink:
    """Events are best effort and must not slow scheduling: a bounded queue and one sender thread."""

    def __init__(self, api: SchedulerApi, stats: Stats, threaded: bool, max_queue: int = 5000):
        self.api = api
        self.stats = stats
        self.q: queue.Queue | None = queue.Queue(max_queue) if threaded else None
        if self.q is not None:
            threading.Thread(target=self._run, daemon=True, name="events").start()

    def send(self, pod: dict, type_: str, reason: str, message: str) -> None:
        if self.q is None:
            self._one(pod, type_, reason, message)
            return
        try:
            self.q.put_nowait((pod, type_, reason, message))
        except queue.Full:
            self.stats.events_dropped += 1

    def _one(self, pod: dict, type_: str, reason: str, message: str) -> None:
        try:
            self.api.event(pod, type_, reason, message)
        except Exception as exc:  # events are best effort
            log.warning("could not record event for %s: %s", pod_key(pod), exc)

    def _run(self) -> None:
        assert self.q is not None
        while True:
            item = self.q.get()
            if item is None:
                return
            self._one(*item)
            self.q.task_done()

    def flush(self, timeout_s: float = 5.0) -> None:
        if self.q is None:
            return
        end = time.monotonic() + timeout_s
        while self.q.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)


# pod-to-pod and volume plugins: in extender mode kube-scheduler runs its own, so gpufleet leaves them out
KUBE_SCHEDULER_HANDLES = ("NodePorts", "VolumeBinding", "NodeVolumeLimits", "InterPodAffinity", "PodTopologySpread",
                          "NodeDeclaredFeatures")


def without_plugins(profile: Profile, names: tuple[str, ...]) -> Profile:
    return replace(profile, filters=[p for p in profile.filters if p.name not in names],
                   scores=[(p, w) for p, w in profile.scores if p.name not in names])
