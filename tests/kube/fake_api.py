"""An in-process API server for the scheduler's fast tests and ``bench/bench_kube_loop.py``.

Why here and not in ``src``: it is a test double of ``gpufleet.kube.api.SchedulerApi``; nothing the project ships
runs it.  It speaks the protocol with plain JSON dicts, as ``KubernetesApi`` does, and follows the API server's
rules where the scheduler depends on them (resourceVersions, watch compaction, the eviction API's disruption
budgets via ``engine.disruption``).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from typing import Iterator

from gpufleet.engine.disruption import PodDisruptionBudget, PodFacts
from gpufleet.engine.errors import ConfigError
from gpufleet.kube.api import (
    DRA_KINDS,
    KIND_PATHS,
    ApiError,
    Conflict,
    EvictionRefused,
    Gone,
    NotFound,
    object_key,
    pod_key_of,
)

def _merge(dst: dict, patch: dict) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


class FakeApi:
    """An in-memory API server: enough of list/watch/bind/events for the loop's tests.

    Thread-safe; ``watch`` blocks up to ``timeout_s`` for new events like a
    real watch.  Failure injection: ``fail_binds`` (the next N binds raise
    before doing anything), ``lost_bind_replies`` (the next N binds succeed
    but raise a timeout, as when the reply is lost), ``compact()`` (older
    resourceVersions answer 410 Gone), ``call_latency_s`` (a network round trip
    for bind/event/get, to model a real apiserver in benchmarks).
    """

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.objects: dict[str, dict[str, dict]] = {k: {} for k in KIND_PATHS}
        self.unserved: set[str] = set()  # kinds answered 404 (a CRD not installed)
        self.evicted: list[tuple[str, int | None]] = []  # (pod key, grace period) by evict_pod
        self.events: list[dict] = []
        self.binds: list[tuple[str, str]] = []
        self.object_events: list[dict] = []  # events regarding objects other than pods (DRA's bad input)
        self.fail_binds = 0
        self.fail_patches: dict[str, int] = {}  # kind -> the next N patches of it raise (an API failure)
        self.lost_bind_replies = 0
        self.forbid_pod_create = False
        self.call_latency_s = 0.0
        self.calls: dict[str, int] = {}
        self._rv = itertools.count(1)
        self._log: list[tuple[int, str, str, dict]] = []
        self._compacted = 0
        self._cv = threading.Condition()

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def _touch(self, kind: str, type_: str, obj: dict) -> None:
        rv = next(self._rv)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        self._log.append((rv, kind, type_, copy.deepcopy(obj)))
        self._cv.notify_all()

    # --- test helpers (what kubectl/kubelet would do) ---------------------------------
    def add_node(self, obj: dict) -> None:
        with self._cv:
            new = obj["metadata"]["name"] not in self.nodes
            self.nodes[obj["metadata"]["name"]] = obj
            self._touch("node", "ADDED" if new else "MODIFIED", obj)

    update_node = add_node

    def delete_node(self, name: str) -> None:
        with self._cv:
            self._touch("node", "DELETED", self.nodes.pop(name))

    def add_pod(self, obj: dict) -> None:
        with self._cv:
            obj.setdefault("metadata", {}).setdefault("namespace", "default")
            key = pod_key_of(obj)
            new = key not in self.pods
            self.pods[key] = obj
            self._touch("pod", "ADDED" if new else "MODIFIED", obj)

    update_pod = add_pod

    def delete_pod(self, key: str) -> None:
        with self._cv:
            self._touch("pod", "DELETED", self.pods.pop(key))

    def put_object(self, kind: str, obj: dict) -> None:
        """Create or replace a namespace, Queue, PodGroup or PodDisruptionBudget."""
        with self._cv:
            key = object_key(obj)
            new = key not in self.objects[kind]
            self.objects[kind][key] = obj
            self._touch(kind, "ADDED" if new else "MODIFIED", obj)

    def delete_object(self, kind: str, key: str) -> None:
        with self._cv:
            self._touch(kind, "DELETED", self.objects[kind].pop(key))

    def patch_object(self, kind: str, namespace: str, name: str, patch: dict, subresource: str = "") -> dict:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        with self._cv:
            self._count(f"patch_{kind}" + (f"_{subresource}" if subresource else ""))
            if self.fail_patches.get(kind, 0) > 0:
                self.fail_patches[kind] -= 1
                raise ConnectionError("injected API failure")
            key = f"{namespace}/{name}" if namespace else name
            obj = self.objects[kind].get(key)
            if obj is None:
                raise NotFound(f"{kind} {key} not found")
            patch = copy.deepcopy(patch)
            want = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if want is not None and want != (obj.get("metadata") or {}).get("resourceVersion"):
                raise Conflict(f"{kind} {key}: the object has been modified; please apply your changes to the latest version")
            if kind in DRA_KINDS:  # a status subresource writes status only, the object itself everything but status
                patch = {"status": patch.get("status")} if subresource == "status" else {k: v for k, v in patch.items() if k != "status"}
            _merge(obj, patch)
            if (obj.get("metadata") or {}).get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
                self._touch(kind, "DELETED", self.objects[kind].pop(key))
            else:
                self._touch(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def get_object(self, kind: str, namespace: str, name: str) -> dict | None:
        with self._cv:
            self._count(f"get_{kind}")
            o = self.objects[kind].get(f"{namespace}/{name}" if namespace else name)
            return copy.deepcopy(o) if o is not None else None

    def create_object(self, kind: str, namespace: str, obj: dict) -> dict:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        with self._cv:
            self._count(f"create_{kind}")
            obj = copy.deepcopy(obj)
            m = obj.setdefault("metadata", {})
            m["namespace"] = namespace
            if not m.get("name"):
                m["name"] = f"{m.get('generateName', '')}{next(self._rv):05x}"[-63:]
            m.setdefault("uid", f"uid-{m['name']}")
            obj.pop("status", None)
            key = object_key(obj)
            if key in self.objects[kind]:
                raise Conflict(f"{kind} {key} already exists")
            self.objects[kind][key] = obj
            self._touch(kind, "ADDED", obj)
            return copy.deepcopy(obj)

    def create_pod(self, namespace: str, obj: dict) -> dict:
        """POST a pod (kube/plugin_down's copies); ``forbid_pod_create``: 403, as without the RBAC to do it."""
        with self._cv:
            self._count("create_pod")
            if self.forbid_pod_create:
                raise ApiError(403, f'pods is forbidden: User "gpufleet-scheduler" cannot create resource "pods" in {namespace}')
            obj = copy.deepcopy(obj)
            m = obj.setdefault("metadata", {})
            m["namespace"] = namespace
            m.setdefault("uid", f"uid-{m['name']}-{next(self._rv)}")
            obj.pop("status", None)
            key = pod_key_of(obj)
            if key in self.pods:
                raise Conflict(f"pods {m['name']!r} already exists")
            self.pods[key] = obj
            self._touch("pod", "ADDED", obj)
            return copy.deepcopy(obj)

    def delete_namespaced(self, kind: str, namespace: str, name: str) -> None:
        with self._cv:
            self._count(f"delete_{kind}")
            key = f"{namespace}/{name}"
            obj = self.objects[kind].get(key)
            if obj is None:
                raise NotFound(f"{kind} {key} not found")
            if (obj.get("metadata") or {}).get("finalizers"):
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                self._touch(kind, "MODIFIED", obj)
            else:
                self._touch(kind, "DELETED", self.objects[kind].pop(key))

    def patch_pod_status(self, namespace: str, name: str, patch: dict) -> None:
        with self._cv:
            _, pod = self._pod("patch_pod_status", namespace, name)
            _merge(pod.setdefault("status", {}), copy.deepcopy(patch.get("status") or {}))
            self._touch("pod", "MODIFIED", pod)

    def compact(self) -> None:
        """Forget the event log: watches from an older resourceVersion get 410 Gone."""
        with self._cv:
            self._compacted = next(self._rv)
            self._log.clear()

    # --- the protocol ------------------------------------------------------------------
    def list_nodes(self) -> tuple[list[dict], str]:
        with self._cv:
            self._count("list_nodes")
            return [copy.deepcopy(n) for n in self.nodes.values()], str(next(self._rv))

    def list_pods(self) -> tuple[list[dict], str]:
        with self._cv:
            self._count("list_pods")
            return [copy.deepcopy(p) for p in self.pods.values()], str(next(self._rv))

    def list_failed_pods(self) -> tuple[list[dict], str]:
        with self._cv:
            self._count("list_failed_pods")
            return ([copy.deepcopy(p) for p in self.pods.values() if (p.get("status") or {}).get("phase") == "Failed"],
                    str(next(self._rv)))

    def list_kind(self, kind: str) -> tuple[list[dict], str]:
        with self._cv:
            self._count(f"list_{kind}")
            if kind in self.unserved:
                raise NotFound(f"the server could not find the requested resource ({kind})")
            return [copy.deepcopy(o) for o in self.objects[kind].values()], str(next(self._rv))

    def _pod(self, what: str, namespace: str, name: str) -> tuple[str, dict]:
        """Count the call; the pod or NotFound (call with the lock held)."""
        self._count(what)
        key = f"{namespace}/{name}"
        if key not in self.pods:
            raise NotFound(f"pod {key} not found")
        return key, self.pods[key]

    def evict_pod(self, namespace: str, name: str, uid: str | None = None, grace_period_s: int | None = None) -> None:
        """The eviction subresource: PodDisruptionBudgets decide (``engine.disruption``'s rules, the API server's)."""
        with self._cv:
            key, pod = self._pod("evict_pod", namespace, name)
            if uid and (pod.get("metadata") or {}).get("uid") not in (None, uid):
                raise Conflict(f"pod {key}: precondition failed: uid {uid}")
            facts = PodFacts.from_pod(pod)
            if not facts.exempt:
                covering = []
                for o in self.objects["pdb"].values():
                    try:
                        b = PodDisruptionBudget.from_json(o)
                    except ConfigError:
                        continue  # the API server never admits a budget it cannot read
                    if b.covers_pod(facts):
                        covering.append((b, o))
                if len(covering) > 1:
                    raise ApiError(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.")
                if covering:
                    b, o = covering[0]
                    if b.eviction_cost(facts):
                        if b.allowed_now <= 0:
                            raise EvictionRefused("Cannot evict pod as it would violate the pod's disruption budget.")
                        st = o.setdefault("status", {})
                        st["disruptionsAllowed"] = st.get("disruptionsAllowed", 0) - 1
                        st.setdefault("disruptedPods", {})[name] = "now"
                        self._touch("pdb", "MODIFIED", o)
            self.evicted.append((key, grace_period_s))
            self._touch("pod", "DELETED", self.pods.pop(key))

    def nominate(self, namespace: str, name: str, node: str) -> None:
        with self._cv:
            _, pod = self._pod("nominate", namespace, name)
            pod.setdefault("status", {})["nominatedNodeName"] = node
            self._touch("pod", "MODIFIED", pod)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str], uid: str | None = None) -> None:
        with self._cv:
            key, pod = self._pod("annotate_pod", namespace, name)
            if uid and (pod.get("metadata") or {}).get("uid") not in (None, uid):
                raise Conflict(f"pod {key}: precondition failed: uid {uid}")
            pod.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
            self._touch("pod", "MODIFIED", pod)

    def watch(self, kind: str, resource_version: str, timeout_s: int = 0) -> Iterator[tuple[str, dict]]:
        rv = int(resource_version or 0)
        end = time.monotonic() + timeout_s
        while True:
            with self._cv:
                self._count("watch")
                if rv < self._compacted:
                    raise Gone(f"{kind} resourceVersion {rv} is too old")
                batch = [(r, t, copy.deepcopy(o)) for r, k, t, o in self._log if k == kind and r > rv]
                if not batch:
                    left = end - time.monotonic()
                    if left <= 0:
                        return
                    self._cv.wait(min(left, 0.2))
                    continue
            for r, t, o in batch:
                rv = r
                yield t, o
            if time.monotonic() >= end:
                return

    def get_pod(self, namespace: str, name: str) -> dict | None:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        with self._cv:
            self._count("get_pod")
            p = self.pods.get(f"{namespace}/{name}")
            return copy.deepcopy(p) if p is not None else None

    def node_exists(self, name: str) -> bool:
        with self._cv:
            self._count("node_exists")
            return name in self.nodes

    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        key = f"{namespace}/{name}"
        with self._cv:
            self._count("bind")
            if self.fail_binds > 0:
                self.fail_binds -= 1
                raise ConnectionError("injected API failure")
            pod = self.pods.get(key)
            if pod is None:
                raise NotFound(f"pod {key} not found")
            if pod["spec"].get("nodeName"):
                raise Conflict(f"pod {key} is already bound to {pod['spec']['nodeName']}")
            if node not in self.nodes:
                # the real apiserver accepts a Binding to any name; keep that behaviour
                pass
            pod["spec"]["nodeName"] = node
            pod["metadata"].setdefault("annotations", {}).update(annotations)  # the apiserver copies a Binding's annotations
            self.binds.append((key, node))
            self._touch("pod", "MODIFIED", pod)
            if self.lost_bind_replies > 0:
                self.lost_bind_replies -= 1
                raise TimeoutError("injected lost reply")

    def event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        with self._cv:
            self._count("event")
            if pod.get("kind", "Pod") != "Pod":
                self.object_events.append({"kind": pod["kind"], "name": object_key(pod), "type": type_, "reason": reason,
                                           "message": message})
                return
            self.events.append({"pod": pod_key_of(pod), "type": type_, "reason": reason, "message": message})
