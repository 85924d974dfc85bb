"""The loop's view of the cluster, as kube-scheduler's scheduler cache: relist and rebuild of the
snapshot, and watch events for nodes, pods and policy / constraint objects (namespaces, Queues,
PodGroups, PDBs, volumes) applied to it.

Why a module of its own: keeping state in step with the API server is one responsibility,
separate from queueing, the cycle and binding (see ``loop.py``).  ``SchedulerCache`` owns the
objects as last seen (nodes, bound pods, policy objects), their resourceVersions, the nodes left
out and the snapshot built from them (``state``, the engine's ``sched``, the queue tree); the
other parts read it through ``ClusterView``.  It puts pods waiting for us into the
``SchedulingQueue``; what it needs from the loop's other parts (binds in flight, a pod gone from
every part, a full rebuild, volume-binding state) comes through ``CacheHooks``.  All of it runs
on the loop's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Callable, Protocol

from ..engine import annotations as ann
from ..engine.disruption import NO_BUDGETS, Budgets, PodFacts
from ..engine.errors import ConfigError, GpufleetError
from ..engine.framework import Scheduler
from ..engine.framework import Profile
from ..engine.gang import SCHEDULING_API, resolve_scheduling_group
from ..engine.model import Assignment, Node, PodRequest
from ..engine.podspec import parse_pod, pod_key
from ..engine.plugins.queuequota import QueueQuota
from ..engine.queues import Queue, QueueTree
from ..engine.state import ClusterState
from ..engine.volumes import (
    VolumeCatalog,
    claim_from_json,
    csidriver_required,
    csinode_drivers,
    csinode_limits,
    pv_from_json,
    storageclass_from_json,
)
from .api import (
    CONSTRAINT_KINDS,
    DRA_KINDS,
    POLICY_KINDS,
    ApiError,
    NotFound,
    SchedulerApi,
)
from .dra.live import LiveDra
from .convert import NOT_READY_TAINT, bound_assignment, held_amounts, is_terminal, node_from_json, node_ready
from .pods import pod_age_key, slim_pod
from .pods import resource_version as _rv
from .stats import Stats
from .policy_objects import PolicyObjects
from .scheduling_queue import SchedulingQueue

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split
NATIVE_GROUPS = "schedpodgroup"  # scheduling.k8s.io PodGroups (see api.POLICY_KINDS)


class CacheHooks(Protocol):
    """What the cache asks of the loop."""

    def in_flight(self) -> Mapping[str, tuple[dict, Assignment, float]]:
        """Our binds in flight (the binder's): assumed, not bound yet."""
        ...

    def rebuild(self) -> None:
        """Rebuild the snapshot (``SchedulerCache.rebuild``) and what the loop keeps on it."""
        ...

    def drop_pod(self, key: str) -> None:
        """A pod is gone (deleted, terminal): every part forgets it."""
        ...

    def assumed_pvs(self) -> dict[str, str]:
        """PV -> claim the volume binder set the claimRef for, not completed yet."""
        ...

    def volumes_changed(self) -> None:
        """Claims or PVs changed: pods waiting for their volumes may go on."""
        ...

    def on_pod_listed(self, pod: dict) -> None:
        """A pod seen in a relist, before the cache files it (the extender tracks pods here)."""
        ...

    def on_pod_event(self, type_: str, pod: dict) -> None:
        """A pod watch event (or a relist's difference), before the cache applies it."""
        ...


class SchedulerCache:
    """The loop's view of the cluster; see the module docstring."""

    def __init__(self, api: SchedulerApi, profile: Profile, queue_: SchedulingQueue, stats: Stats, hooks: CacheHooks,
                 scheduler_name: str = "gpufleet", seed: int = 0, policy_kinds: list[str] | None = None,
                 quota: QueueQuota | None = None, dra: LiveDra | None = None) -> None:
        self.api = api
        self.dra = dra  # DRA objects and what they mean for the snapshot (kube/dra); None: no DRA
        self.profile = profile
        self.queue = queue_
        self.stats = stats
        self.hooks = hooks
        self.scheduler_name = scheduler_name
        self.seed = seed
        self.policy_kinds: list[str] = list(policy_kinds or [])
        self._native_groups = NATIVE_GROUPS in self.policy_kinds
        self.quota = quota
        self.objects = PolicyObjects()
        self.state = ClusterState()
        self.sched = Scheduler(profile, self.state, seed=seed)
        self.tree: QueueTree | None = None
        self.node_objs: dict[str, dict] = {}
        self.bad_nodes: dict[str, str] = {}  # name -> why it is left out
        self.gpu_plugin_down: Callable[[str], bool] = lambda name: False  # kube/plugin_down: no GPU pod placed there
        self.bound_pods: dict[str, dict] = {}  # key -> pod JSON, bound and running (any scheduler)
        self.rv: dict[str, str] = {"node": "", "pod": "", **{k: "" for k in self.policy_kinds}}
        if dra is not None:
            self.rv.update({k: "" for k in DRA_KINDS})
        self._pod_rv: dict[str, int] = {}
        self._first_rv: dict[str, int] = {}  # pod -> its resourceVersion when first seen (ages within one second)
        self._node_rv: dict[str, int] = {}
        self._req_cache: dict[str, tuple[int | None, PodRequest]] = {}

    @property
    def bound(self) -> set[str]:
        return set(self.bound_pods)

    @property
    def watch_kinds(self) -> list[str]:
        """Kinds to watch: nodes, pods, and the policy kinds the API serves."""
        dra = self.dra.kinds if self.dra is not None else []
        return ["node", "pod"] + [k for k in self.policy_kinds if k not in self.objects.unserved] + dra

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
        if self.dra is not None:  # before nodes: a DRA node's GPUs are its slices'
            self.dra.resync(self.rv)
        self._req_cache.clear()
        nodes, node_rv = self.api.list_nodes()
        pods, pod_rv = self.api.list_pods()
        self.rv.update({"node": node_rv, "pod": pod_rv})
        self.node_objs = {(n.get("metadata") or {}).get("name", ""): n for n in nodes}
        self._node_rv = {k: v for k, v in ((k, _rv(n)) for k, n in self.node_objs.items()) if v is not None}
        old_pending = self.queue.clear()
        self.bound_pods.clear()
        self._pod_rv.clear()
        for p in pods:
            self._classify(p)
        self._first_rv = {k: v for k, v in self._first_rv.items() if k in self._pod_rv}
        for k in old_pending - set(self.queue.pending):
            self.queue.forget(k)
        self.hooks.rebuild()
        self.queue.wake_all()

    def rebuild(self) -> None:
        """A fresh ClusterState from the cached node and pod objects, our binds in flight still assumed in it."""
        good = []
        self.bad_nodes.clear()
        for name, obj in self.node_objs.items():
            n = self._node_model(name, obj)
            if n is not None:
                good.append(n)
        self.state = ClusterState(good)
        if self.dra is not None:  # every allocated claim holds its devices, ours in flight too
            self.dra.attach(self.state)
        self._sync_constraint_objects()
        self.sched = Scheduler(self.profile, self.state, seed=self.seed)
        self._rebuild_tree()
        # pods with an exact assignment first: modelled ones take whatever GPUs are left
        keys = sorted(self.bound_pods, key=lambda k: ann.ASSIGNMENT not in ((self.bound_pods[k].get("metadata") or {}).get("annotations") or {}))
        for k in keys:
            self.reserve_bound(k, self.bound_pods[k])
        for k, (_, a, _) in list(self.hooks.in_flight().items()):
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

    def request(self, key: str, pod: dict) -> PodRequest:
        """The pod as the engine sees it, with its queue and pod group resolved (cached per resourceVersion)."""
        rv = self._pod_rv.get(key)
        c = self._req_cache.get(key)
        if c is not None and rv is not None and c[0] == rv:
            return self._with_claims(pod, c[1])
        r = parse_pod(pod)
        if r.scheduling_group and NATIVE_GROUPS in self.policy_kinds:  # a scheduling.k8s.io gang or basic group
            r = resolve_scheduling_group(r, self.objects.groups, served=NATIVE_GROUPS not in self.objects.unserved)
        if r.pod_group:
            g = self.objects.groups.get(f"{r.namespace}/{r.pod_group}")
            if g is not None:
                r = replace(r, pod_group_min=max(r.pod_group_min, g.min_member), queue=r.queue or g.queue)
        if self.tree is not None:
            r = self.objects.namespace_queues.apply(r)
        self._req_cache[key] = (rv, r)
        return self._with_claims(pod, r)

    def _with_claims(self, pod: dict, r: PodRequest) -> PodRequest:
        """DRA: the pod's claims as they are now (not cached with the pod: claims change on their own)."""
        return self.dra.resolve(pod, r, self.state) if self.dra is not None else r

    def group_of(self, pod: dict) -> str | None:
        """The gang a pod belongs to: its ``gpufleet.io/pod-group`` annotation, or the scheduling.k8s.io PodGroup
        its ``spec.schedulingGroup`` names when that group is a gang gpufleet honours (None: a single pod)."""
        m = pod.get("metadata") or {}
        group = (m.get("annotations") or {}).get(ann.POD_GROUP)
        if group is not None or not self._native_groups:
            return group
        sg = (pod.get("spec") or {}).get("schedulingGroup")
        if sg is None:  # most pods: asked for every due pod in every scheduling slice, so the quick answer first
            return None
        name = sg.get("podGroupName") if isinstance(sg, Mapping) else None
        g = self.objects.groups.get(f"{m.get('namespace') or 'default'}/{name}") if isinstance(name, str) else None
        return name if g is not None and g.api == SCHEDULING_API and g.gang and g.unsupported is None else None

    def budgets(self) -> Budgets:
        """The PodDisruptionBudgets with the facts (labels, phase, Ready) about the bound pods they may cover."""
        pdbs = self.objects.pdbs
        if not pdbs:
            return NO_BUDGETS
        return Budgets(tuple(pdbs), {k: PodFacts.from_pod(p) for k, p in self.bound_pods.items()})

    def age_rank(self) -> dict[str, int]:
        """Larger = younger (``pod_age_key``: started later), so the youngest go first."""
        out = {}
        for k in self.state.assignments:
            p = self.bound_pods.get(k)
            out[k] = pod_age_key(p, self._first_rv.get(k, 0)) if p is not None else 1 << 126  # in flight: youngest
        return out

    def _queue_of_bound(self, pod: dict) -> str | None:
        m = pod.get("metadata") or {}
        q = (m.get("annotations") or {}).get(ann.QUEUE)
        if q or self.tree is None:
            return q
        return self.objects.namespace_queues.queue_for_namespace(m.get("namespace") or "default")

    def _node_model(self, name: str, obj: dict) -> Node | None:
        try:
            n = node_from_json(obj)
            if self.dra is not None:  # a DRA node: the GPUs its ResourceSlices publish
                n = self.dra.cache.node_model(n, ann.INVENTORY in ((obj.get("metadata") or {}).get("annotations") or {}))
        except GpufleetError as exc:
            if self.bad_nodes.get(name) != str(exc):
                log.warning("leaving node out: %s", exc)
            self.bad_nodes[name] = str(exc)
            return None
        if not node_ready(obj) and NOT_READY_TAINT not in n.taints:
            n = replace(n, taints=n.taints + (NOT_READY_TAINT,))  # what the node lifecycle controller does
        if self.gpu_plugin_down(name):
            n = replace(n, gpu_plugin_down=True)
        return n

    def refresh_node(self, name: str) -> None:
        """The node's model again from its object (its GPU device plugin went down or came back)."""
        if name in self.node_objs:
            self._node_event("MODIFIED", self.node_objs[name])

    def reserve_bound(self, key: str, pod: dict) -> None:
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
        if self.dra is not None:  # the claims it uses hold its devices (ClusterState.hold_claim)
            a = self.dra.bound_claims(pod, a, self.state)
        group = self.group_of(pod)
        queue_ = self._queue_of_bound(pod)
        if (queue_, group) != (a.queue, a.pod_group):
            a = replace(a, queue=queue_, pod_group=group)
        # devices are exclusive; cpu, memory and scalars a running pod holds count even past the node's free
        # amount (an in-place resize not finished, another scheduler's pods), as kube-scheduler's NodeInfo counts
        problem = self.state.check(a, counts=False)
        if problem:
            self.stats.double_book_refused += 1
            log.error("bound pod %s holds resources the snapshot already has taken: %s", key, problem)
            return
        self.state.reserve(a, overcommit=True)

    def resized(self, key: str, pod: dict) -> bool:
        """A held pod's cpu, memory or scalars changed (in-place resize): hold the new amounts; True if they did."""
        a = self.state.assignments.get(key)
        if a is None:
            return False
        try:
            cpu, mem, scalars = held_amounts(pod, self.state, a.node)
        except GpufleetError as exc:
            log.warning("bound pod %s: %s; keeping what it held", key, exc)
            return False
        if (cpu, mem, scalars) == (a.cpu_milli, a.memory_mib, a.scalars):
            return False
        log.info("pod %s resized in place: holds cpu %dm memory %dMi (was %dm, %dMi)", key, cpu, mem, a.cpu_milli, a.memory_mib)
        return self.state.resize(key, cpu, mem, scalars)

    def _classify(self, pod: dict) -> None:
        """Put a live pod object where it belongs (no snapshot changes)."""
        self.hooks.on_pod_listed(pod)
        key = pod_key(pod)
        rv = _rv(pod)
        if rv is not None:
            self._pod_rv[key] = rv
            self._first_rv.setdefault(key, rv)
        if is_terminal(pod):
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            self.bound_pods[key] = slim_pod(pod)
        elif self._ours(spec) and key not in self.hooks.in_flight():
            self.queue.add(key, pod)

    def _ours(self, spec: dict) -> bool:
        """Pending for us: our scheduler name and no scheduling gates (pods wait until every gate is removed)."""
        return spec.get("schedulerName", "default-scheduler") == self.scheduler_name and not spec.get("schedulingGates")

    def add_bound(self, key: str, pod: dict) -> dict:
        """A pod seen bound (our bind's result, or another's bind read back): held as bound unless the watch
        already showed it; returns what is held.  Its resources are reserved separately (``reserve_bound``)."""
        held = self.bound_pods.get(key)
        if held is None:
            held = self.bound_pods[key] = slim_pod(pod)
        return held

    def forget_pod(self, key: str) -> bool:
        """A pod gone: drop it as bound (and its resources from the snapshot); True if that freed room."""
        self._req_cache.pop(key, None)
        if self.bound_pods.pop(key, None) is not None:
            return self.sched.forget(key) is not None
        return False

    def _pod_event(self, type_: str, pod: dict) -> None:
        self.hooks.on_pod_event(type_, pod)
        key = pod_key(pod)
        in_flight = self.hooks.in_flight()
        rv, seen = _rv(pod), self._pod_rv.get(key)
        if rv is not None and seen is not None and rv < seen:
            return  # older than what we hold (a relist already had it)
        if type_ == "DELETED":
            self._pod_rv.pop(key, None)
            self._first_rv.pop(key, None)
            self.hooks.drop_pod(key)
            return
        if rv is not None:
            self._pod_rv[key] = rv
            self._first_rv.setdefault(key, rv)
        if is_terminal(pod):
            self.hooks.drop_pod(key)
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            self.queue.remove(key)
            if key not in in_flight:  # the bind result still needs the pod's first-seen time
                self.queue.forget(key)
            seen_bound = self.bound_pods.get(key)
            self.bound_pods[key] = pod = slim_pod(pod)
            if key not in in_flight:  # our own in-flight binds are already reserved
                now_a = pod["metadata"]["annotations"].get(ann.ASSIGNMENT)
                old = None
                if (seen_bound is not None and now_a and key in self.state.assignments
                        and now_a != seen_bound["metadata"]["annotations"].get(ann.ASSIGNMENT)):
                    # the node agent recorded which GPUs kubelet gave a pod another scheduler bound: hold those
                    old = self.sched.forget(key)
                self.reserve_bound(key, pod)
                if old is not None:
                    if key not in self.state.assignments:
                        self.state.reserve(old, overcommit=True)  # the recorded GPUs clash with the snapshot: keep the model
                    self.queue.wake_all()
                if self.resized(key, pod):
                    self.queue.wake_all()
            return
        if key in in_flight or key in self.bound_pods:
            return  # a stale unbound view of a pod we are binding or saw bound
        if self._ours(spec):
            self.queue.add(key, pod)
        elif key in self.queue.pending:  # e.g. a scheduling gate was added back
            self.queue.remove(key)

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
                    self.reserve_bound(k, p)
        self.queue.wake_all()

    def handle(self, kind: str, type_: str, obj: dict) -> None:
        """A watch event of one kind."""
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.rv[kind] = rv
        if type_ == "BOOKMARK":
            return
        if kind in DRA_KINDS and self.dra is not None:
            self._dra_event(kind, type_, obj)
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
        if kind in (None, "pvc", "pv", "storageclass", "csinode", "csidriver"):
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
            cat.assumed = self.hooks.assumed_pvs()
            for o in raw["csinode"].values():
                name, limits = csinode_limits(o)
                if limits:
                    cat.attach_limits[name] = limits
                cat.node_drivers[name] = csinode_drivers(o)[1]
            cat.required_drivers = frozenset(d for d, need in map(csidriver_required, raw["csidriver"].values()) if need)
            self.state.volumes = cat

    def _policy_changed(self, kind: str) -> None:
        if kind in CONSTRAINT_KINDS:
            self._sync_constraint_objects(kind)
            if kind in ("pvc", "pv"):
                self.hooks.volumes_changed()
        if kind == "queue":
            self._rebuild_tree()
        if kind != "pdb":
            self._req_cache.clear()
        self.queue.wake_all()

    def _dra_event(self, kind: str, type_: str, obj: dict) -> None:
        """A DRA object changed (``REPLACE``: a relist): nodes whose slices changed are modelled again, claim holds
        follow their claims' allocations, waiting pods are tried again."""
        def refresh(name: str) -> None:
            if name in self.node_objs:
                self._node_event("MODIFIED", self.node_objs[name])
        assert self.dra is not None
        if self.dra.event(self.state, kind, type_, obj, refresh):
            self.queue.wake_all()

    def replace(self, kind: str, items: list[dict], resource_version: str) -> None:
        """A relist of one kind (after 410 Gone): apply the differences as events."""
        self.rv[kind] = resource_version
        if kind in DRA_KINDS and self.dra is not None:
            self._dra_event(kind, "REPLACE", {"items": items})
            return
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
            for k in set(self.queue.pending) | set(self.bound_pods) | set(self.hooks.in_flight()):
                if k not in keys:
                    self._pod_rv.pop(k, None)
                    self._first_rv.pop(k, None)
                    self.hooks.drop_pod(k)
            for p in items:
                self._pod_event("MODIFIED", p)
        self.queue.wake_all()
