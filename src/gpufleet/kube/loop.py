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
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from ..engine import annotations as ann
from ..engine.errors import ConfigError, GpufleetError
from ..engine.framework import Profile, Scheduler
from ..engine.gang import GangScheduler, group_key
from ..engine.inventory import assignment_to_json
from ..engine.model import Assignment, Node, PodRequest, Taint
from ..engine.podspec import parse_pod, pod_key
from ..engine.preemption import explain_preemption, find_gang_victims
from ..engine.queues import Queue, QueueQuota, QueueTree
from ..engine.schedqueue import QueuedPod, next_backoff_s, order_pending, plan_room
from ..engine.state import ClusterState
from .api import POLICY_KINDS, ApiError, Conflict, NotFound, SchedulerApi
from .convert import bound_assignment, is_terminal, node_from_json, node_ready
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


def slim_pod(pod: dict) -> dict:
    """What a bound pod's resources are computed from; the rest is dropped (clusters have many pods)."""
    m = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def ctr(c: dict) -> dict:
        out = {"name": c.get("name"), "resources": c.get("resources") or {}}
        if "restartPolicy" in c:
            out["restartPolicy"] = c["restartPolicy"]
        return out

    ann_ = {k: v for k, v in (m.get("annotations") or {}).items() if k.startswith(ann.PREFIX)}
    s = {k: spec[k] for k in ("nodeName", "schedulerName", "priority", "overhead") if k in spec}
    s["containers"] = [ctr(c) for c in spec.get("containers") or [] if isinstance(c, dict)]
    if spec.get("initContainers"):
        s["initContainers"] = [ctr(c) for c in spec["initContainers"] if isinstance(c, dict)]
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels") if k in m}
    meta["annotations"] = ann_
    return {"metadata": meta, "spec": s, "status": {"phase": (pod.get("status") or {}).get("phase")}}


def reason_text(status) -> str:
    """The engine's reasons in kube-scheduler's words ("0/12 nodes are available: ..."), no status-code prefix."""
    return "; ".join(status.reasons) or status.message


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


class SchedulerLoop:
    PLAN_SHARE = 0.25  # of the loop's time that preemption planning may use on average
    def __init__(self, api: SchedulerApi, profile: Profile, scheduler_name: str = "gpufleet", seed: int = 0,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 on_attempt: Callable[[str, float], None] | None = None, bind_workers: int = 0, event_thread: bool = False,
                 max_in_flight: int = 512, policy_kinds: bool = True, preemption: bool = True,
                 eviction_grace_s: int | None = None, nominated_timeout_s: float = 120.0):
        self.api = api
        # queue quotas need the QueueQuota plugin; add it when the profile does not name it
        self.quota = next((p for p in profile.pre_filters if isinstance(p, QueueQuota)), None)
        if self.quota is None and policy_kinds:
            self.quota = QueueQuota()
            profile = replace(profile, pre_filters=[self.quota, *profile.pre_filters], reserves=[self.quota, *profile.reserves])
        self.profile = profile
        self.objects = PolicyObjects()
        self.policy_kinds = [k for k in POLICY_KINDS] if policy_kinds else []
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
        self.gangs = GangScheduler(self.sched)

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
        self.sched = Scheduler(self.profile, self.state, seed=self.seed)
        self.gangs = GangScheduler(self.sched)
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
        self._forget_timers(key)
        self._req_cache.pop(key, None)
        self._nominated.pop(key, None)
        if self.gangs.gangs:
            self.gangs.remove(key)
        freed = False
        if self.bound_pods.pop(key, None) is not None:
            freed = self.sched.forget(key) is not None
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
            self.bound_pods[key] = pod = slim_pod(pod)
            if key not in self.binding:  # our own in-flight binds are already reserved
                self._reserve_bound(key, pod)
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

    def _policy_changed(self, kind: str) -> None:
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
        times = [self._not_before.get(k, 0.0) for k in self.pending]
        return min(times) if times else None

    def _defer(self, key: str) -> None:
        b = next_backoff_s(self._backoff.get(key), self.backoff_initial_s, self.backoff_max_s)
        self._backoff[key] = b
        self._not_before[key] = self.clock() + b

    def schedule_due(self, budget_s: float | None = None, should_continue: Callable[[], bool] | None = None) -> int:
        """Run one cycle for each pod that is due; returns how many were tried.

        Gang members go in one gang round, after the single pods -- or before them
        when a gang had victims deleted for it, so the room it made is its own.
        """
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
        for res in self.gangs.step(now):
            for d in res.placed:
                pod = self.pending.get(d.pod_key)
                if pod is None or d.assignment is None:  # gone meanwhile: give its reservation back
                    self.gangs.remove(d.pod_key)
                    continue
                self._start_bind(d.pod_key, pod, d.assignment, self._first_seen.get(d.pod_key, now))
            if not res.ok:
                g = self.gangs.gangs.get(res.group)
                for k in list(g.members) if g else []:
                    if k in self.pending and k not in self.gangs.held:
                        self._failed_event(k, self.pending[k], reason_text(res.status))
                        self._defer(k)
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
        if not dec.ok:
            self._count("unschedulable", t0)
            self._failed_event(key, pod, reason_text(dec.status))
            self._defer(key)
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

    def _start_bind(self, key: str, pod: dict, a: Assignment, t0: float) -> None:
        gpus = self.state.nodes[self.state.index[a.node]].gpus
        annotations = {ann.ASSIGNMENT: assignment_to_json(a, {g.index: g.uuid for g in gpus})}
        if a.queue and ((pod.get("metadata") or {}).get("annotations") or {}).get(ann.QUEUE) != a.queue:
            annotations[ann.QUEUE] = a.queue  # the queue it was admitted to: a restart counts it there again
        self.pending.pop(key, None)
        self.binding[key] = (pod, a, t0)
        m = pod["metadata"]
        ns, name = m.get("namespace") or "default", m["name"]
        if self._pool is None:
            self._bind_done(key, *bind_job(self.api, ns, name, a.node, annotations), annotations)
        else:
            fut = self._pool.submit(bind_job, self.api, ns, name, a.node, annotations)
            fut.add_done_callback(lambda f, key=key, annotations=annotations: self._results.put(
                (key, *(f.result() if f.exception() is None else ("failed", str(f.exception()), None)), annotations)))

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
        if nom is not None and now < nom[1] and any(v in self.state.assignments for v in nom[0]):
            return  # victims already on their way out
        if not self._planning_allowed():
            return
        t0 = time.monotonic()
        try:
            self._plan_and_evict(key, pod, req, now)
        finally:
            self._planned(t0)

    def _plan_and_evict(self, key: str, pod: dict, req: PodRequest, now: float) -> None:
        rp = plan_room(self.sched, self.tree, req, lambda: dict(
            pdbs=self.objects.budgets, pod_labels=self._pod_labels(), age_rank=self._age_rank(), **self._candidate_bound()))
        victims = rp.victims if rp is not None else []
        reason, kind, lines = (rp.reason, rp.kind, rp.explanation) if rp is not None else ("", "", None)
        if victims and self._evict(victims, reason, kind, key):
            self._nominated[key] = ({v.pod_key for v in victims}, now + self.nominated_timeout_s)
            self.events.send(pod, "Normal", "Preempting" if kind == "preempted" else "Reclaiming", "; ".join(lines or [reason]))
            if kind == "preempted":  # like kube-scheduler: `kubectl get pod -o wide` shows NOMINATED NODE
                ns, name = key.split("/", 1)
                try:
                    self.api.nominate(ns, name, rp.node)  # type: ignore[union-attr,arg-type]
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
        need -= len(held)
        if need <= 0 or not members:
            return
        now = self.clock()
        noms = [self._nominated.get(r.key) for r in members]
        if any(n is not None and now < n[1] and any(v in self.state.assignments for v in n[0]) for n in noms):
            return
        prio = min(r.priority for r in members)
        if not any(a.priority < prio for a in self.state.assignments.values()) or not self._planning_allowed():
            return
        t0 = time.monotonic()
        try:
            plan = find_gang_victims(self.sched, group, members, need, pdbs=self.objects.budgets,
                                     pod_labels=self._pod_labels(), age_rank=self._age_rank(), **self._candidate_bound())
        finally:
            self._planned(t0)
        if plan is None:
            return
        if self._evict(plan.victims, f"preempted by pod group {group} (priority {prio})", "preempted", group):
            for r in members:
                self._nominated[r.key] = ({v.pod_key for v in plan.victims}, now + self.nominated_timeout_s)
                if r.key in self.pending:
                    self.events.send(self.pending[r.key], "Normal", "Preempting", "; ".join(plan.explanation))

    def _evict(self, victims: list[Assignment], reason: str, kind: str, for_: str) -> bool:
        """Delete the victims through the API (each gets a ``Preempted`` event); False if any is not bound yet."""
        if any(v.pod_key not in self.bound_pods for v in victims):
            return False  # a victim is still being bound (or held by a gang): decide again next time
        for v in victims:
            p = self.bound_pods[v.pod_key]
            ns, name = v.pod_key.split("/", 1)
            try:
                self.api.evict_pod(ns, name, uid=(p.get("metadata") or {}).get("uid"), grace_period_s=self.eviction_grace_s)
            except NotFound:
                pass
            except Exception as exc:
                log.warning("could not delete %s to make room for %s: %s", v.pod_key, for_, exc)
                continue
            self.events.send(p, "Normal", "Preempted", reason)
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        return True

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

    def explain(self, pod: dict) -> tuple[str, dict[str, str]]:
        """(summary, node -> reason) for ``gpufleet explain``; changes nothing."""
        req = self._request(pod_key(pod), pod)
        dec = self.sched.explain(req)
        by_node = dict(dec.diagnosis.by_node) if dec.diagnosis else {}
        for name, why in self.bad_nodes.items():
            by_node[name] = f"left out: {why}"
        gang = self._gang_line(req)
        if dec.ok:
            fits = f"fits: best node {dec.assignment.node} (score {dec.score:.1f}, {dec.feasible_nodes} feasible)"  # type: ignore[union-attr]
            return fits + (f"\n  {gang}" if gang else ""), by_node
        msg = reason_text(dec.status) + (f"\n  {gang}" if gang else "")
        if self.tree is not None:
            rp = self.tree.plan_reclaim(self.sched, req)
            if rp is not None:
                msg += "\n  reclaim (dry run): " + "; ".join(rp.explanation)
        if any(a.priority < req.priority for a in self.state.assignments.values()):
            lines = explain_preemption(self.sched, req, pdbs=self.objects.budgets, pod_labels=self._pod_labels(),
                                       age_rank=self._age_rank())
            msg += "\n  " + "\n  ".join(lines)
        return msg, by_node


__all__ = ["SchedulerLoop", "Stats", "bind_job"]
