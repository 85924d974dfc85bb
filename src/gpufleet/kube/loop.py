"""The secondary scheduler's loop: snapshot from list+watch, one engine cycle per pod, bind.

State is rebuilt from the API server alone: every bound pod's exact GPUs come
from its ``gpufleet.io/assignment`` annotation, so a restarted scheduler sees
the same devices taken and never double-books.  A pod that does not fit gets a
``FailedScheduling`` event with the engine's aggregated reasons and waits with
exponential backoff; all waiting pods are retried at once when the cluster
changes (a node added or changed, a pod gone).  A pod whose spec is invalid
gets a warning event naming the field.  Nothing one pod does stops the loop.

Like kube-scheduler, a decision is *assumed* at once (its devices reserved in
the snapshot, so the next pod sees them taken) and the Binding may go out on a
worker thread (``bind_workers``); the result comes back through ``drain()`` on
the loop's own thread, which alone touches the snapshot.  A bind whose reply
was lost (timeout, connection reset) is checked with a GET before the
assumption is dropped: the pod may well be bound.

Watch events can arrive after a relist that already contains them; an event
older than the object we hold (by resourceVersion) is ignored.

Teams, gangs and priority (``policy_objects``): namespaces, Queues, PodGroups
and PodDisruptionBudgets are watched too.  Pods get their queue from their own
annotation, their PodGroup, or their namespace; the ``QueueQuota`` plugin
admits by quota; pending pods are tried in weighted-DRF order.  Pods of a pod
group go through ``GangScheduler`` (all or nothing).  A pod that does not fit
first tries to *reclaim* quota its queue lent out (borrowed pods of other
queues), then to *preempt* lower-priority pods (whole gangs, within
PodDisruptionBudgets); victims are deleted through the API and the pod is
tried first once they are gone.  The queue a pod was admitted to is written
next to its assignment, so a restart counts usage exactly as before.

A victim stays in the snapshot until the watch shows it gone (its room is not
free before), so every plan made meanwhile must not choose it again: evictions
in flight (and pods terminating anyway) are excluded from all candidate sets
until then, or until ``eviction_timeout_s`` (``evictor.Evictions``).  Only a DELETE that succeeded is
an eviction (event, counter, nomination); a 404 counts as ``already_gone``.
A gang's hold (see ``engine.gang``) is named in the reason of every pod it
alone keeps out.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..engine import annotations as ann
from ..engine.errors import ConfigError, GpufleetError
from ..engine.framework import Decision, Profile, Scheduler
from ..engine.gang import GangScheduler, group_key
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment, Node, PodRequest, Taint
from ..engine.podspec import parse_pod, pod_key
from ..engine.preemption import explain_preemption, find_gang_victims
from ..engine.queues import Queue, QueueQuota, QueueTree
from ..engine.schedqueue import QueuedPod, next_backoff_s, order_pending, plan_room
from ..engine.state import ClusterState
from ..engine.volumes import (
    SELECTED_NODE,
    VolumeCatalog,
    claim_from_json,
    csinode_limits,
    matches_node,
    plan_bindings,
    pv_from_json,
    storageclass_from_json,
)
from .api import (
    CONSTRAINT_KINDS,
    POLICY_KINDS,
    ApiError,
    Conflict,
    NotFound,
    SchedulerApi,
)
from .convert import bound_assignment, is_terminal, node_from_json, node_ready
from .evictor import Evictions
from .policy_objects import PolicyObjects

log = logging.getLogger(__name__)

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
    already_gone: int = 0  # victims whose DELETE found them gone (404): not evictions of ours


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
    s = {k: spec[k] for k in ("nodeName", "schedulerName", "priority", "overhead", "hostNetwork") if k in spec}
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
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp")
            if k in m}
    meta["annotations"] = ann_
    return {"metadata": meta, "spec": s, "status": {"phase": (pod.get("status") or {}).get("phase")}}


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


def bind_job(api: SchedulerApi, namespace: str, name: str, node: str, annotations: dict[str, str]) -> tuple[str, str, dict | None]:
    """Bind one pod; runs on a worker thread.  Returns (outcome, detail, pod as read back or None).

    Outcomes: ``bound`` (ours, on ``node``), ``taken`` (bound by someone
    else; detail is that node), ``gone`` (deleted), ``failed``.
    """
    try:
        api.bind(namespace, name, node, annotations)
        return "bound", "", None
    except NotFound:
        return "gone", "", None
    except Exception as exc:  # Conflict, timeout, reset: find out what happened
        err = f"{type(exc).__name__}: {exc}" if not isinstance(exc, Conflict) else f"conflict: {exc}"
        try:
            p = api.get_pod(namespace, name)
        except Exception as exc2:
            return "failed", f"{err}; and reading the pod back failed: {exc2}", None
        if p is None:
            return "gone", "", None
        bound_to = (p.get("spec") or {}).get("nodeName")
        if not bound_to:
            return "failed", err, p
        mine = ((p.get("metadata") or {}).get("annotations") or {}).get(ann.ASSIGNMENT) == annotations.get(ann.ASSIGNMENT)
        return ("bound", "", p) if bound_to == node and mine else ("taken", bound_to, p)


# pod-to-pod and volume plugins: in extender mode kube-scheduler runs its own, so gpufleet leaves them out
KUBE_SCHEDULER_HANDLES = ("NodePorts", "VolumeBinding", "NodeVolumeLimits", "InterPodAffinity", "PodTopologySpread")


def without_plugins(profile: Profile, names: tuple[str, ...]) -> Profile:
    return replace(profile, filters=[p for p in profile.filters if p.name not in names],
                   scores=[(p, w) for p, w in profile.scores if p.name not in names])


class SchedulerLoop:
    PLAN_SHARE = 0.25  # of the loop's time that preemption planning may use on average
    def __init__(self, api: SchedulerApi, profile: Profile, scheduler_name: str = "gpufleet", seed: int = 0,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 on_attempt: Callable[[str, float], None] | None = None, bind_workers: int = 0, event_thread: bool = False,
                 max_in_flight: int = 512, policy_kinds: bool = True, preemption: bool = True,
                 eviction_grace_s: int | None = None, nominated_timeout_s: float = 120.0, constraint_kinds: bool = True,
                 volume_bind_timeout_s: float = 600.0, eviction_timeout_s: float | None = None):
        self.api = api
        if not constraint_kinds:  # extender mode: kube-scheduler already judged these with its own informers
            profile = without_plugins(profile, KUBE_SCHEDULER_HANDLES)
        # queue quotas need the QueueQuota plugin; add it when the profile does not name it
        self.quota = next((p for p in profile.pre_filters if isinstance(p, QueueQuota)), None)
        if self.quota is None and policy_kinds:
            self.quota = QueueQuota()
            profile = replace(profile, pre_filters=[self.quota, *profile.pre_filters], reserves=[self.quota, *profile.reserves])
        self.profile = profile
        self.objects = PolicyObjects()
        self.policy_kinds = [k for k in POLICY_KINDS] if policy_kinds else list(CONSTRAINT_KINDS) if constraint_kinds else []
        self.preemption = preemption
        self.eviction_grace_s = eviction_grace_s
        self.nominated_timeout_s = nominated_timeout_s
        self.tree: QueueTree | None = None
        self._nominated: dict[str, tuple[set[str], float]] = {}  # pod -> victims being deleted for it, until
        self._req_cache: dict[str, tuple[int | None, PodRequest]] = {}
        self._plan_debt_s = 0.0  # preemption planning time not yet paid back (see _planning_allowed)
        self._plan_last = time.monotonic()
        self.scheduler_name = scheduler_name
        self.seed = seed
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.on_attempt = on_attempt
        self.stats = Stats()
        self.events = EventSink(api, self.stats, event_thread)
        self.evictions = Evictions(api, self.events, self.stats, clock, eviction_grace_s, eviction_timeout_s)
        self.state = ClusterState()
        self.sched = Scheduler(profile, self.state, seed=seed)
        self.node_objs: dict[str, dict] = {}
        self.bad_nodes: dict[str, str] = {}  # name -> why it is left out
        self.pending: dict[str, dict] = {}  # key -> pod JSON, waiting for us
        self.bound_pods: dict[str, dict] = {}  # key -> pod JSON, bound and running (any scheduler)
        self.binding: dict[str, tuple[dict, Assignment, float]] = {}  # our binds in flight
        self._pod_rv: dict[str, int] = {}
        self._node_rv: dict[str, int] = {}
        self._backoff: dict[str, float] = {}
        self._not_before: dict[str, float] = {}
        self._first_seen: dict[str, float] = {}
        self._last_failure: dict[str, tuple[str, float]] = {}
        self.rv = {"node": "", "pod": "", **{k: "" for k in self.policy_kinds}}
        self.max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(bind_workers, thread_name_prefix="bind") if bind_workers > 0 else None
        self._results: queue.Queue = queue.Queue()
        self.gangs = self._new_gangs()
        self.volume_bind_timeout_s = volume_bind_timeout_s
        self._volume_wait: dict[str, tuple[list[str], float, dict[str, str]]] = {}  # pod -> claims, deadline, annotations
        self._assumed_pvs: dict[str, str] = {}  # PV -> claim we set its claimRef for, until the claim is bound
        self._volume_plans: dict[str, list[tuple[str, str]]] = {}  # pod -> (claim, PV or "" = provision) it asked for

    def _new_gangs(self) -> GangScheduler:
        gs = GangScheduler(self.sched)
        gs.when = self._wall_clock
        return gs

    def _wall_clock(self, t: float, now: float) -> str:
        """A time on the loop's clock as people read it (UTC, to the second)."""
        return time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + (t - now)))

    @property
    def bound(self) -> set[str]:
        return set(self.bound_pods)

    @property
    def watch_kinds(self) -> list[str]:
        """Kinds to watch: nodes, pods, and the policy kinds the API serves."""
        return ["node", "pod"] + [k for k in self.policy_kinds if k not in self.objects.unserved]

    def list_kind(self, kind: str) -> tuple[list[dict], str]:
        if kind == "node":
            return self.api.list_nodes()
        if kind == "pod":
            return self.api.list_pods()
        return self.api.list_kind(kind)

    # --- snapshot ---------------------------------------------------------------------
    def resync(self) -> None:
        """Full relist of both kinds and a rebuilt snapshot (start-up, becoming leader)."""
        for kind in self.policy_kinds:  # first: bound pods' queues come from namespaces
            try:
                items, rv = self.api.list_kind(kind)
            except (NotFound, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status != 403:
                    raise
                if kind not in self.objects.unserved:
                    log.warning("cannot list %s (%s; CRD not installed or RBAC): working without it", kind, exc)
                self.objects.unserved.add(kind)
                items, rv = [], ""
            else:
                self.objects.unserved.discard(kind)
            self.objects.replace(kind, items)
            self.rv[kind] = rv
        self._req_cache.clear()
        nodes, node_rv = self.api.list_nodes()
        pods, pod_rv = self.api.list_pods()
        self.rv.update({"node": node_rv, "pod": pod_rv})
        self.node_objs = {(n.get("metadata") or {}).get("name", ""): n for n in nodes}
        self._node_rv = {k: v for k, v in ((k, _rv(n)) for k, n in self.node_objs.items()) if v is not None}
        old_pending = set(self.pending)
        self.pending.clear()
        self.bound_pods.clear()
        self._pod_rv.clear()
        for p in pods:
            self._classify(p)
        for k in old_pending - set(self.pending):
            self._forget_timers(k)
        self.rebuild()
        self.wake_all()

    def rebuild(self) -> None:
        """A fresh ClusterState from the cached node and pod objects."""
        good = []
        self.bad_nodes.clear()
        for name, obj in self.node_objs.items():
            n = self._node_model(name, obj)
            if n is not None:
                good.append(n)
        self.state = ClusterState(good)
        self._sync_constraint_objects()
        self.sched = Scheduler(self.profile, self.state, seed=self.seed)
        self.gangs = self._new_gangs()
        self._rebuild_tree()
        # pods with an exact assignment first: modelled ones take whatever GPUs are left
        keys = sorted(self.bound_pods, key=lambda k: ann.ASSIGNMENT not in ((self.bound_pods[k].get("metadata") or {}).get("annotations") or {}))
        for k in keys:
            self._reserve_bound(k, self.bound_pods[k])
        for k, (_, a, _) in list(self.binding.items()):
            if k not in self.state.assignments and a.node in self.state.index and not self.state.check(a):
                self.state.reserve(a)

    def _rebuild_tree(self) -> None:
        """The queue tree over the current snapshot; queues with a missing parent are left out (reported)."""
        qs: list[Queue] = list(self.objects.queues)
        while True:
            names = {q.name for q in qs}
            bad = [q for q in qs if q.parent and q.parent not in names]
            if not bad:
                break
            for q in bad:
                self.objects.report(f"Queue {q.name}", f"Queue {q.name}: field spec.parent: queue {q.parent!r} does not exist")
            qs = [q for q in qs if q not in bad]
        try:
            self.tree = QueueTree(qs, self.state) if qs else None
        except ConfigError as exc:  # e.g. a parent loop: no quotas rather than no scheduler
            log.error("queues left out: %s", exc)
            self.tree = None
        if self.quota is not None:
            self.quota.tree = self.tree

    def _request(self, key: str, pod: dict) -> PodRequest:
        """The pod as the engine sees it, with its queue and pod group resolved (cached per resourceVersion)."""
        rv = self._pod_rv.get(key)
        c = self._req_cache.get(key)
        if c is not None and rv is not None and c[0] == rv:
            return c[1]
        r = parse_pod(pod)
        if r.pod_group:
            g = self.objects.groups.get(f"{r.namespace}/{r.pod_group}")
            if g is not None:
                r = replace(r, pod_group_min=max(r.pod_group_min, g.min_member), queue=r.queue or g.queue)
        if self.tree is not None:
            r = self.objects.namespace_queues.apply(r)
        self._req_cache[key] = (rv, r)
        return r

    def _queue_of_bound(self, pod: dict) -> str | None:
        m = pod.get("metadata") or {}
        q = (m.get("annotations") or {}).get(ann.QUEUE)
        if q or self.tree is None:
            return q
        return self.objects.namespace_queues.queue_for_namespace(m.get("namespace") or "default")

    def _node_model(self, name: str, obj: dict) -> Node | None:
        try:
            n = node_from_json(obj)
        except GpufleetError as exc:
            if self.bad_nodes.get(name) != str(exc):
                log.warning("leaving node out: %s", exc)
            self.bad_nodes[name] = str(exc)
            return None
        if not node_ready(obj) and NOT_READY_TAINT not in n.taints:
            n = replace(n, taints=n.taints + (NOT_READY_TAINT,))  # what the node lifecycle controller does
        return n

    def _reserve_bound(self, key: str, pod: dict) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if key in self.state.assignments or node not in self.state.index:
            return
        try:
            a = bound_assignment(pod, self.state)
        except GpufleetError as exc:
            # a broken or contradicting assignment annotation: the pod still holds what it requests
            log.warning("bound pod %s: %s; modelling it from its requests", key, exc)
            m = pod.get("metadata") or {}
            bare = {**pod, "metadata": {**m, "annotations": {k: v for k, v in (m.get("annotations") or {}).items() if k != ann.ASSIGNMENT}}}
            try:
                a = bound_assignment(bare, self.state)
            except GpufleetError as exc2:
                log.warning("bound pod %s: %s", key, exc2)
                return
        group = ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.POD_GROUP)
        queue_ = self._queue_of_bound(pod)
        if (queue_, group) != (a.queue, a.pod_group):
            a = replace(a, queue=queue_, pod_group=group)
        problem = self.state.check(a)
        if problem:
            self.stats.double_book_refused += 1
            log.error("bound pod %s holds resources the snapshot already has taken: %s", key, problem)
            return
        self.state.reserve(a)

    def _classify(self, pod: dict) -> None:
        """Put a live pod object where it belongs (no snapshot changes)."""
        key = pod_key(pod)
        rv = _rv(pod)
        if rv is not None:
            self._pod_rv[key] = rv
        if is_terminal(pod):
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            self.bound_pods[key] = slim_pod(pod)
        elif self._ours(spec) and key not in self.binding:
            self.pending[key] = pod
            self._first_seen.setdefault(key, self.clock())

    def _ours(self, spec: dict) -> bool:
        """Pending for us: our scheduler name and no scheduling gates (pods wait until every gate is removed)."""
        return spec.get("schedulerName", "default-scheduler") == self.scheduler_name and not spec.get("schedulingGates")

    def _forget_timers(self, key: str) -> None:
        self._last_failure.pop(key, None)
        self._backoff.pop(key, None)
        self._not_before.pop(key, None)
        self._first_seen.pop(key, None)

    def _drop_pod(self, key: str) -> None:
        self.pending.pop(key, None)
        w = self._volume_wait.pop(key, None)
        if w is not None:  # deleted while its volumes were being bound
            self._release_assumed(w[0])
            self._revert_volume_plan(key)
        self._forget_timers(key)
        self._req_cache.pop(key, None)
        self._nominated.pop(key, None)
        self.evictions.forget(key)
        freed = False
        if self.gangs.gangs:
            freed = self.gangs.remove(key)  # a held member's room, or a whole hold, given back
        if self.bound_pods.pop(key, None) is not None:
            freed = self.sched.forget(key) is not None or freed
        if self.binding.pop(key, None) is not None:
            freed = self.sched.forget(key) is not None or freed
        if freed:
            self.wake_all()

    def _pod_event(self, type_: str, pod: dict) -> None:
        key = pod_key(pod)
        rv, seen = _rv(pod), self._pod_rv.get(key)
        if rv is not None and seen is not None and rv < seen:
            return  # older than what we hold (a relist already had it)
        if type_ == "DELETED":
            self._pod_rv.pop(key, None)
            self._drop_pod(key)
            return
        if rv is not None:
            self._pod_rv[key] = rv
        if is_terminal(pod):
            self._drop_pod(key)
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            self.pending.pop(key, None)
            if key not in self.binding:  # the bind result still needs the pod's first-seen time
                self._forget_timers(key)
            seen_bound = self.bound_pods.get(key)
            self.bound_pods[key] = pod = slim_pod(pod)
            if key not in self.binding:  # our own in-flight binds are already reserved
                now_a = pod["metadata"]["annotations"].get(ann.ASSIGNMENT)
                old = None
                if (seen_bound is not None and now_a and key in self.state.assignments
                        and now_a != seen_bound["metadata"]["annotations"].get(ann.ASSIGNMENT)):
                    # the node agent recorded which GPUs kubelet gave a pod another scheduler bound: hold those
                    old = self.sched.forget(key)
                self._reserve_bound(key, pod)
                if old is not None:
                    if key not in self.state.assignments:
                        self.state.reserve(old)  # the recorded GPUs clash with the snapshot: keep the model
                    self.wake_all()
            return
        if key in self.binding or key in self.bound_pods:
            return  # a stale unbound view of a pod we are binding or saw bound
        if self._ours(spec):
            self.pending[key] = pod
            self._first_seen.setdefault(key, self.clock())
        elif key in self.pending:  # e.g. a scheduling gate was added back
            self.pending.pop(key, None)

    def _node_event(self, type_: str, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        rv, seen = _rv(node), self._node_rv.get(name)
        if rv is not None and seen is not None and rv < seen:
            return
        if type_ == "DELETED":
            self._node_rv.pop(name, None)
            self.node_objs.pop(name, None)
            self.bad_nodes.pop(name, None)
            if name in self.state.index:
                self.state.remove_node(name)
            return
        if rv is not None:
            self._node_rv[name] = rv
        self.node_objs[name] = node
        n = self._node_model(name, node)
        if n is None:
            if name in self.state.index:
                self.state.remove_node(name)
            return
        self.bad_nodes.pop(name, None)
        if name in self.state.index:
            if self.state.nodes[self.state.index[name]] == n:
                return  # a heartbeat or status change the engine does not see
            lost = self.state.update_node(n)
            for a in lost:
                log.warning("pod %s no longer fits node %s after its update (GPU gone?)", a.pod_key, name)
        else:
            self.state.add_node(n)
            for k, p in self.bound_pods.items():  # a node that comes back brings its pods back
                if (p.get("spec") or {}).get("nodeName") == name:
                    self._reserve_bound(k, p)
        self.wake_all()

    def handle(self, kind: str, type_: str, obj: dict) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.rv[kind] = rv
        if type_ == "BOOKMARK":
            return
        if kind in POLICY_KINDS:
            self.objects.handle(kind, type_, obj)
            self._policy_changed(kind)
            return
        (self._node_event if kind == "node" else self._pod_event)(type_, obj)

    def _sync_constraint_objects(self, kind: str | None = None) -> None:
        """Namespace labels and the volume catalog into the snapshot (namespaceSelector, VolumeBinding)."""
        raw = self.objects.raw
        if kind in (None, "namespace"):
            self.state.set_namespace_labels({(o.get("metadata") or {}).get("name", ""): dict((o.get("metadata") or {}).get("labels") or {})
                                             for o in raw["namespace"].values()})
        if kind in (None, "pvc", "pv", "storageclass", "csinode"):
            if "pvc" in self.objects.unserved or "pvc" not in self.policy_kinds:
                self.state.volumes = None
                return
            cat = VolumeCatalog()
            for o in raw["pvc"].values():
                c = claim_from_json(o)
                cat.claims[f"{c.namespace}/{c.name}"] = c
            for o in raw["pv"].values():
                pv = pv_from_json(o)
                cat.volumes[pv.name] = pv
            for o in raw["storageclass"].values():
                sc = storageclass_from_json(o)
                cat.classes[sc.name] = sc
            cat.assumed = dict(self._assumed_pvs)
            for o in raw["csinode"].values():
                name, limits = csinode_limits(o)
                if limits:
                    cat.attach_limits[name] = limits
            self.state.volumes = cat

    def _policy_changed(self, kind: str) -> None:
        if kind in CONSTRAINT_KINDS:
            self._sync_constraint_objects(kind)
            if kind in ("pvc", "pv"):
                self._check_volume_waits()
        if kind == "queue":
            self._rebuild_tree()
        if kind != "pdb":
            self._req_cache.clear()
        self.wake_all()

    def replace(self, kind: str, items: list[dict], resource_version: str) -> None:
        """A relist of one kind (after 410 Gone): apply the differences as events."""
        self.rv[kind] = resource_version
        if kind in POLICY_KINDS:
            self.objects.replace(kind, items)
            self._policy_changed(kind)
            return
        if kind == "node":
            names = {(n.get("metadata") or {}).get("name", "") for n in items}
            for name in list(self.node_objs):
                if name not in names:
                    self._node_event("DELETED", self.node_objs[name])
            for n in items:
                self._node_event("MODIFIED", n)
        else:
            keys = {pod_key(p) for p in items}
            for k in set(self.pending) | set(self.bound_pods) | set(self.binding):
                if k not in keys:
                    self._pod_rv.pop(k, None)
                    self._drop_pod(k)
            for p in items:
                self._pod_event("MODIFIED", p)
        self.wake_all()

    def wake_all(self) -> None:
        """The cluster changed: every waiting pod may fit now."""
        self._not_before.clear()

    # --- scheduling -------------------------------------------------------------------
    def _in_gang(self, pod: dict) -> bool:
        return ann.POD_GROUP in ((pod.get("metadata") or {}).get("annotations") or {})

    def due(self) -> list[str]:
        """Pods to try now, one by one (gang members go through ``due_gang_members``).

        Pods that had victims deleted for them first; then, with queues, weighted
        DRF order; else higher priority first, then first seen.
        """
        now = self.clock()
        pods = []
        for k, p in self.pending.items():
            if self._not_before.get(k, 0.0) > now or self._in_gang(p):
                continue
            req = None
            if self.tree is not None:
                try:
                    req = self._request(k, p)
                except GpufleetError:
                    pass  # invalid: tried first, schedule_one reports it
            pods.append(QueuedPod(k, int((p.get("spec") or {}).get("priority") or 0), self._first_seen.get(k, 0.0), req))
        return order_pending(pods, self.tree, self._nominated)

    def due_gang_members(self) -> list[str]:
        now = self.clock()
        return [k for k in self.pending if self._not_before.get(k, 0.0) <= now and self._in_gang(self.pending[k])]

    def has_due(self) -> bool:
        now = self.clock()
        nb = self._not_before
        return any(nb.get(k, 0.0) <= now for k in self.pending)

    def next_wakeup(self) -> float | None:
        times = [self._not_before.get(k, 0.0) for k in self.pending] + [w[1] for w in self._volume_wait.values()]
        return min(times) if times else None

    def _defer(self, key: str, until: float | None = None) -> None:
        """Back off exponentially; ``until``: retry no later than this (e.g. when a hold times out)."""
        b = next_backoff_s(self._backoff.get(key), self.backoff_initial_s, self.backoff_max_s)
        self._backoff[key] = b
        t = self.clock() + b
        self._not_before[key] = t if until is None else min(t, max(until, self.clock()))

    def schedule_due(self, budget_s: float | None = None, should_continue: Callable[[], bool] | None = None) -> int:
        """Run one cycle for each pod that is due; returns how many were tried.

        Gang members go in one gang round, after the single pods -- or before them
        when a gang had victims deleted for it, so the room it made is its own.
        """
        self._check_volume_waits()
        n = 0
        gang_keys = self.due_gang_members()
        gangs_first = any(k in self._nominated for k in gang_keys)
        if gangs_first:
            n += self._safe_gang_round(gang_keys)
        end = None if budget_s is None else time.monotonic() + budget_s
        for key in self.due():
            if should_continue is not None and not should_continue():
                break
            if end is not None and time.monotonic() > end:
                break
            if len(self.binding) >= self.max_in_flight:
                self.drain(block_s=1.0)
                if len(self.binding) >= self.max_in_flight:
                    break
            pod = self.pending.get(key)
            if pod is not None:
                self.schedule_one(pod)
                n += 1
        if gang_keys and not gangs_first and (should_continue is None or should_continue()):
            n += self._safe_gang_round(gang_keys)
        return n

    def _safe_gang_round(self, keys: list[str]) -> int:
        try:
            return self._gang_round(keys)
        except Exception as exc:  # an engine bug must not stop the loop
            log.exception("gang round failed")
            for k in keys:
                if k in self.pending:
                    self._failed_event(k, self.pending[k], f"internal error placing its pod group: {exc}")
                    self._defer(k)
            self.rebuild()  # drop half-done holds: the snapshot again holds only what is bound
            return len(keys)

    def _gang_round(self, keys: list[str]) -> int:
        """Hand arrived gang members to the GangScheduler, step it, bind what it placed."""
        now = self.clock()
        for k in keys:
            pod = self.pending.get(k)
            if pod is None:
                continue
            try:
                r = self._request(k, pod)
            except GpufleetError:
                self.schedule_one(pod)  # reports the invalid spec
                continue
            g = self.objects.groups.get(group_key(r) or "")
            if g is not None:
                self.gangs.add_group(g, now)
            self.gangs.add(r, now)
        had_hold = bool(self.gangs.held)
        results = self.gangs.step(now)
        if had_hold and not self.gangs.held:
            self.wake_all()  # a hold ended: what it kept out may fit now
        for res in results:
            for d in res.placed:
                pod = self.pending.get(d.pod_key)
                if pod is None or d.assignment is None:  # gone meanwhile: give its reservation back
                    self.gangs.remove(d.pod_key)
                    continue
                self._start_bind(d.pod_key, pod, d.assignment, self._first_seen.get(d.pod_key, now))
            if not res.ok:
                gang = self.gangs.gangs.get(res.group)
                # held members wait too (not retried in a spin), and are looked at again when the hold times out
                until = self.gangs.hold_deadline() if self.gangs.holder == res.group else None
                for k in list(gang.members) if gang else []:
                    if k in self.pending:
                        self._failed_event(k, self.pending[k], reason_text(res.status))
                        self._defer(k, until)
                if self.preemption:
                    self._make_room_for_gang(res.group)
        return len(keys)

    def schedule_one(self, pod: dict) -> str:
        key = pod_key(pod)
        t0 = self.clock()
        try:
            req = self._request(key, pod)
        except GpufleetError as exc:
            self._count("invalid", t0)
            self._failed_event(key, pod, f"invalid pod spec: {exc}")
            self._defer(key)
            return "invalid"
        try:
            dec = self.sched.schedule(req)
        except Exception as exc:  # an engine bug must not stop the loop
            log.exception("engine error on %s", key)
            self._count("error", t0)
            self.events.send(pod, "Warning", "FailedScheduling", f"internal error: {exc}")
            self._defer(key)
            return "error"
        if not dec.ok and self.gangs.held:
            dec, why = self._past_a_hold(req, dec)
        else:
            why = ""
        if not dec.ok:
            self._count("unschedulable", t0)
            self._failed_event(key, pod, f"{why}; {reason_text(dec.status)}" if why else reason_text(dec.status))
            self._defer(key, self.gangs.hold_deadline() if why else None)
            if self.preemption:
                try:
                    self._make_room(key, pod, req)
                except Exception:  # a planning bug must not stop the loop
                    log.exception("making room for %s failed", key)
            return "unschedulable"
        assert dec.assignment is not None
        self._nominated.pop(key, None)
        self._start_bind(key, pod, dec.assignment, t0)
        return "binding"

    def _past_a_hold(self, req: PodRequest, dec: Decision) -> tuple[Decision, str]:
        """A pod that only a gang's hold keeps out: a pod of higher priority than the gang ends the hold
        and is placed; any other is told which gang holds what, and until when."""
        now = self.clock()
        why = self.gangs.blocked_by_hold(req, now)
        holder = self.gangs.gangs.get(self.gangs.holder or "")
        if not why or holder is None:
            return dec, why
        if req.priority > holder.group.priority:
            log.info("%s (priority %d) ends the hold of pod group %s (priority %d)", req.key, req.priority,
                     holder.group.key, holder.group.priority)
            self.gangs.release_hold("preempted")
            return self.sched.schedule(req), ""
        return dec, why

    def _start_bind(self, key: str, pod: dict, a: Assignment, t0: float) -> None:
        gpus = self.state.nodes[self.state.index[a.node]].gpus
        annotations = {ann.ASSIGNMENT: assignment_to_json(a, {g.index: g.uuid for g in gpus})}
        if a.queue and ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.QUEUE) != a.queue:
            annotations[ann.QUEUE] = a.queue  # the queue it was admitted to: a restart counts it there again
        self.pending.pop(key, None)
        self.binding[key] = (pod, a, t0)
        if self._bind_volumes(key, pod, a, annotations):
            return  # the Binding goes out once its claims are bound (_check_volume_waits)
        self._send_bind(key, pod, a, annotations)

    def _send_bind(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> None:
        m = pod["metadata"]
        ns, name = m.get("namespace") or "default", m["name"]
        if self._pool is None:
            self._bind_done(key, *bind_job(self.api, ns, name, a.node, annotations), annotations)
        else:
            fut = self._pool.submit(bind_job, self.api, ns, name, a.node, annotations)

            def done(f: Any, key: str = key, annotations: dict = annotations) -> None:
                self._results.put((key, *(f.result() if f.exception() is None else ("failed", str(f.exception()), None)), annotations))

            fut.add_done_callback(done)

    # --- volume binding (WaitForFirstConsumer) -----------------------------------------------
    def _bind_volumes(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> bool:
        """Start binding the pod's unbound WaitForFirstConsumer claims for its node, as kube-scheduler's
        VolumeBinding PreBind does: a chosen PV gets the claim as ``claimRef`` (the PV controller completes
        the bind), a claim to provision gets ``volume.kubernetes.io/selected-node``.  True when the pod
        must wait (or has failed) instead of being bound now."""
        t = a.terms
        cat = self.state.volumes
        if t is None or not t.claims or cat is None:
            return False
        node = self.state.nodes[self.state.index[a.node]]
        plan = plan_bindings(cat, t.namespace, t.claims, node)
        if plan is not None and not plan:
            return False
        if plan is None:
            self._bind_done(key, "failed", f"no volume can be bound for its claims on {a.node} any more", None, annotations)
            return True
        try:
            for claim, pv in plan:
                ck = f"{claim.namespace}/{claim.name}"
                if pv:
                    ref = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": claim.namespace, "name": claim.name}
                    if claim.uid:
                        ref["uid"] = claim.uid
                    self.api.patch_object("pv", "", pv, {"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
                                                          "spec": {"claimRef": ref}})
                    self._assumed_pvs[pv] = ck
                    cat.assumed[pv] = ck
                else:
                    self.api.patch_object("pvc", claim.namespace, claim.name,
                                          {"metadata": {"annotations": {SELECTED_NODE: a.node}}})
        except Exception as exc:  # noqa: BLE001 - any API failure sends the pod back to the queue
            self._bind_done(key, "failed", f"binding its volumes failed: {exc}", None, annotations)
            return True
        claims = [f"{c.namespace}/{c.name}" for c, _ in plan]
        self._volume_plans[key] = [(f"{c.namespace}/{c.name}", pv) for c, pv in plan]
        self._volume_wait[key] = (claims, self.clock() + self.volume_bind_timeout_s, annotations)
        log.info("pod %s waits for volume binding on %s: %s", key, a.node,
                 ", ".join(f"{c.name} -> {pv or 'provisioned'}" for c, pv in plan))
        return True

    def _release_assumed(self, claims: list[str]) -> None:
        for pv, ck in list(self._assumed_pvs.items()):
            if ck in claims:
                del self._assumed_pvs[pv]
        if self.state.volumes is not None:
            self.state.volumes.assumed = dict(self._assumed_pvs)

    def _revert_volume_plan(self, key: str) -> None:
        """A volume bind that failed or timed out: take back the claimRef / selected-node of claims still unbound."""
        cat = self.state.volumes
        for ck, pv in self._volume_plans.pop(key, []):
            claim = cat.claims.get(ck) if cat is not None else None
            if claim is None or claim.volume_name:
                continue
            try:
                if pv:
                    self.api.patch_object("pv", "", pv, {"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": None}},
                                                          "spec": {"claimRef": None}})
                else:
                    self.api.patch_object("pvc", claim.namespace, claim.name, {"metadata": {"annotations": {SELECTED_NODE: None}}})
            except Exception as exc:  # noqa: BLE001 - best effort, as kube-scheduler's revert
                log.info("could not revert volume binding of %s for %s: %s", ck, key, exc)

    def _check_volume_waits(self) -> None:
        """Bind pods whose claims are now bound (to volumes usable on their node); fail those past the timeout."""
        if not self._volume_wait:
            return
        cat = self.state.volumes
        now = self.clock()
        for key, (claims, deadline, bind_ann) in list(self._volume_wait.items()):
            entry = self.binding.get(key)
            if entry is None or cat is None:
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._volume_plans.pop(key, None)
                continue
            pod, a, _ = entry
            infos = [cat.claims.get(c) for c in claims]
            pvs = [cat.volumes.get(i.volume_name) if i is not None and i.volume_name else None for i in infos]
            if all(pv is not None for pv in pvs):
                node = self.state.nodes[self.state.index[a.node]]
                bad = next((pv for pv in pvs if pv is not None and not matches_node(pv.node_affinity, node)), None)
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._volume_plans.pop(key, None)
                if bad is not None:
                    self._bind_done(key, "failed", f"volume {bad.name} was bound but cannot be used on {a.node}", None, bind_ann)
                else:
                    self._send_bind(key, pod, a, bind_ann)
            elif now >= deadline:
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._revert_volume_plan(key)
                self._bind_done(key, "failed", f"timed out after {self.volume_bind_timeout_s:.0f} s waiting for "
                                f"PersistentVolumeClaims {', '.join(claims)} to be bound", None, bind_ann)

    # --- reclaim and preemption -----------------------------------------------------------
    def _planning_allowed(self) -> bool:
        """Preemption planning may take ``PLAN_SHARE`` of the loop's time on average (1 s bursts):
        a flood of pods nothing can make room for must not stall the binds of pods that fit.
        A pod skipped here plans again at its next retry."""
        now = time.monotonic()
        self._plan_debt_s = max(0.0, self._plan_debt_s - (now - self._plan_last) * self.PLAN_SHARE)
        self._plan_last = now
        return self._plan_debt_s < 1.0

    def _planned(self, t0: float) -> None:
        self._plan_debt_s += time.monotonic() - t0

    def _make_room(self, key: str, pod: dict, req: PodRequest) -> None:
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

    def _still_leaving(self, nom: tuple[set[str], float], now: float) -> bool:
        """Is room already on its way for a nominated pod?  While its victims are still there and either
        the nomination is fresh or they are still leaving (in flight, terminating), it plans nothing more."""
        there = [v for v in nom[0] if v in self.state.assignments]
        return bool(there) and (now < nom[1] or bool(set(there) & self._leaving()))

    def _leaving(self) -> set[str]:
        """Pods on their way out (evictions in flight, terminating): never chosen as victims again."""
        return self.evictions.leaving(self.bound_pods)

    def _plan_and_evict(self, key: str, pod: dict, req: PodRequest, now: float) -> None:
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

    def _make_room_for_gang(self, group: str) -> None:
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

    def _evict(self, victims: list[Assignment], reason: str, kind: str, for_: str) -> tuple[set[str], set[str]] | None:
        """(evicted, already gone), or None if a victim is not bound yet (see ``Evictions.evict``)."""
        return self.evictions.evict(victims, self.bound_pods, reason, kind, for_)

    def _gang_line(self, req: PodRequest) -> str:
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

    def _candidate_bound(self) -> dict:
        """Like kube-scheduler: look for preemption candidates on max(100, 10% of nodes), from a random node on."""
        n = len(self.state)
        return {"max_candidates": max(100, n // 10), "start": int(self.sched.rng.integers(n)) if n else 0}

    def _pod_labels(self) -> dict[str, dict[str, str]]:
        return {k: dict(((p.get("metadata") or {}).get("labels") or {})) for k, p in self.bound_pods.items()}

    def _age_rank(self) -> dict[str, int]:
        """Older pods (smaller resourceVersion when first seen bound) rank lower, so the youngest go first."""
        return {k: self._pod_rv.get(k, 0) for k in self.state.assignments}

    def _failed_event(self, key: str, pod: dict, message: str) -> None:
        """FailedScheduling, but not the same words again within ``backoff_max_s`` (a pod retried every minute)."""
        now = self.clock()
        last = self._last_failure.get(key)
        if last is not None and last[0] == message and now - last[1] < self.backoff_max_s:
            return
        self._last_failure[key] = (message, now)
        self.events.send(pod, "Warning", "FailedScheduling", message)

    def next_result(self, timeout_s: float) -> tuple | None:
        """Wait for a finished bind without touching the snapshot (call ``apply_result`` with it)."""
        try:
            return self._results.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def apply_result(self, item: tuple) -> None:
        self._bind_done(*item)

    def drain(self, block_s: float = 0.0) -> int:
        """Apply finished binds (async mode); returns how many."""
        n = 0
        try:
            item = self._results.get(timeout=block_s) if block_s > 0 else self._results.get_nowait()
            while True:
                self._bind_done(*item)
                n += 1
                item = self._results.get_nowait()
        except queue.Empty:
            return n

    def _bind_done(self, key: str, outcome: str, detail: str, seen: dict | None, annotations: dict[str, str]) -> None:
        entry = self.binding.pop(key, None)
        if entry is None:
            return  # deleted meanwhile; its reservation is already gone
        pod, a, t0 = entry
        if outcome == "bound":
            if key not in self.bound_pods:
                p = dict(pod)
                p["spec"] = {**(pod.get("spec") or {}), "nodeName": a.node}
                p["metadata"] = {**pod["metadata"], "annotations": {**(pod["metadata"].get("annotations") or {}), **annotations}}
                self.bound_pods[key] = slim_pod(p)
            self._backoff.pop(key, None)
            self._not_before.pop(key, None)
            self._last_failure.pop(key, None)
            self.stats.binds += 1
            self._count("scheduled", t0)
            self.stats.e2e_s.append(self.clock() - self._first_seen.pop(key, t0))
            gpus = f" GPUs {list(a.gpu_indices)}" if a.gpu_indices else ""
            share = f" ({a.gpu_milli} milli each)" if a.gpu_indices and a.gpu_milli < 1000 else ""
            mig = f" MIG {a.mig_profile} {list(a.mig)}" if a.mig else ""
            self.events.send(pod, "Normal", "Scheduled", f"Successfully assigned {key} to {a.node}{gpus}{share}{mig}")
            return
        if self.gangs.gangs:
            self.gangs.remove(key)
        self.sched.forget(key)  # our assumption was wrong
        self._count("error", t0)
        if outcome == "taken":
            log.info("pod %s was bound to %s by someone else", key, detail)
            if key not in self.bound_pods and seen is not None:
                self.bound_pods[key] = slim_pod(seen)
            if key in self.bound_pods:
                self._reserve_bound(key, self.bound_pods[key])
            self._forget_timers(key)
        elif outcome == "gone":
            self._forget_timers(key)
        else:
            log.warning("binding %s to %s failed: %s", key, a.node, detail)
            if key not in self.bound_pods:
                self.pending[key] = pod
                self._defer(key)
                self.events.send(pod, "Warning", "FailedScheduling", f"binding to {a.node} failed: {detail}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for binds in flight and flush events."""
        end = time.monotonic() + timeout_s
        while self.binding and time.monotonic() < end:
            self.drain(block_s=0.1)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.events.flush(max(0.0, end - time.monotonic()))

    def _count(self, result: str, t0: float) -> None:
        self.stats.attempts[result] = self.stats.attempts.get(result, 0) + 1
        if self.on_attempt:
            self.on_attempt(result, self.clock() - t0)

    def replay_gangs(self) -> None:
        """For a fresh snapshot (``gpufleet explain``): hold and place the pending gang members as the
        scheduler's gang round does, binding nothing, so that a pod only a hold keeps out is told so.
        A hold is taken to have started when its gang's first member was created."""
        now, wall = self.clock(), time.time()
        first: list[float] = []
        for k, p in list(self.pending.items()):
            if not self._in_gang(p):
                continue
            try:
                r = self._request(k, p)
            except GpufleetError:
                continue
            created = _created_s(p)
            t = now - max(0.0, wall - created) if created is not None else now
            first.append(t)
            g = self.objects.groups.get(group_key(r) or "")
            if g is not None:
                self.gangs.add_group(g, t)
            self.gangs.add(r, t)
        if first:
            self.gangs.step(min(first))
            self.gangs.step(now)

    def explain(self, pod: dict) -> tuple[str, dict[str, str]]:
        """(summary, node -> reason) for ``gpufleet explain``; changes nothing."""
        req = self._request(pod_key(pod), pod)
        dec = self.sched.explain(req)
        by_node = dict(dec.diagnosis.by_node) if dec.diagnosis else {}
        for name, why in self.bad_nodes.items():
            by_node[name] = f"left out: {why}"
        gang = self._gang_line(req)
        why = self.gangs.blocked_by_hold(req, self.clock()) if not dec.ok and self.gangs.held else ""
        if why:
            gang = why + (f"\n  {gang}" if gang else "")
        if dec.ok:
            fits = f"fits: best node {dec.assignment.node} (score {dec.score:.1f}, {dec.feasible_nodes} feasible)"  # type: ignore[union-attr]
            return fits + (f"\n  {gang}" if gang else ""), by_node
        msg = reason_text(dec.status) + (f"\n  {gang}" if gang else "")
        if self.tree is not None:
            rp = self.tree.plan_reclaim(self.sched, req, exclude=self._leaving())
            if rp is not None:
                msg += "\n  reclaim (dry run): " + "; ".join(rp.explanation)
        if req.preempt_never:
            msg += "\n  preemption: none (spec.preemptionPolicy: Never)"
        elif any(a.priority < req.priority for a in self.state.assignments.values()):
            lines = explain_preemption(self.sched, req, pdbs=self.objects.budgets, pod_labels=self._pod_labels(),
                                       age_rank=self._age_rank(), exclude=self._leaving())
            msg += "\n  " + "\n  ".join(lines)
        return msg, by_node


__all__ = ["SchedulerLoop", "Stats", "bind_job"]
