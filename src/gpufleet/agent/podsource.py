"""Which pod is kubelet admitting? The scheduler's assignment for it, from the API server.

kubelet's ``Allocate`` names devices, not the pod.  The pod being admitted on
this node is the earliest bound (resourceVersion order, the order kubelet receives them) pod here that carries a ``gpufleet.io/assignment``
for this resource (whole/shared GPUs for ``nvidia.com/gpu``, instances of the
same profile for ``nvidia.com/mig-<profile>``) with as many devices as kubelet
asks for, is not running yet, and was not served before (the checkpoint's
keys).  A malformed annotation is logged with the pod and the field, that pod
is skipped, and Allocate falls back to kubelet's choice.

When the API server cannot be reached (a restart, a lost connection), the
lookup waits for it, up to ``api_wait_s``, rather than let kubelet's choice
stand: kubelet took the pod from the API server a moment ago, already bound
and annotated, so it is usually back within seconds, and a pod started on
GPUs the scheduler did not choose may share them with another (seen on the
real node: a pod admitted during a kube-apiserver restart ran on GPU 2, its
assignment said GPU 3).  kubelet calls Allocate with no deadline, so waiting
holds only its admissions meanwhile.  An HTTP error other than a server-side
one is not waited for.  Past the wait the lookup raises ``PodsUnknown``
(cannot tell, as opposed to no assignment): the device plugin's preference
waits once more before it steers kubelet blind, because kubelet keeps the
preferred devices for the pod's lifetime (seen on the real node: a restart of
~35 s, the preference gave up at 30 s, Allocate found the assignment for
GPU 5 while kubelet held a device of GPU 6).

The agent also keeps its own watch of the pods bound to its node (``NodePodCache``).  kubelet can admit only a pod
it received from the API server, and the agent's watch receives the same binding from the same server at the same
moment; so when the API server cannot be read while kubelet admits a pod, the pod is almost always already in the
agent's copy.  The lookup then answers from it at once (when kubelet's PodResources names the pods it is admitting,
so the copy is asked only about those), instead of waiting for the API server and, past both waits, letting kubelet's
device choice stand apart from the assignment (an outage longer than 2 x ``api_wait_s``: kubelet's record and the
container's GPUs differed).  The watch resumes from its last resourceVersion after a break (the API server replays
what it missed, or says 410 Gone and the copy is listed afresh), so the copy lags at worst; it never skips a change.
(A HAMi-style node lock -- one pod bound and allocated at a time per node -- would not help here: it orders the
admissions but still needs the API server to read the pod's assignment while kubelet waits.)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..engine import annotations as ann
from ..engine.errors import GpufleetError
from ..engine.inventory import assignment_from_json, gpu_uuids_of
from ..engine.podspec import pod_key
from .plugin import GpuUse, InvalidAssignment, PodAssignment, PodsUnknown

log = logging.getLogger(__name__)


def served_key(key: str, uid: str) -> str:
    return f"{key}#{uid}" if uid else key


def pick(pods: list[dict], node: str, resource: str, count: int, exclude: set[str],
         admitting: set[tuple[str, str]] | None = None) -> PodAssignment | InvalidAssignment | None:
    """The pod kubelet is admitting: the first-bound matching valid assignment; failing that, the first-bound pod
    here whose assignment cannot be used (kubelet must refuse it rather than start it on GPUs nobody chose).

    ``admitting``: the pods kubelet knows but has not given devices of ``resource`` yet (PodResources); kubelet
    adds a pod to its pod list before admitting it, one pod at a time, so this names the pod being admitted.
    Only those are candidates then (a pod another scheduler bound matches none: kubelet's choice stands), served
    ones (``exclude``) included: kubelet lists a pod it has given no device as waiting, so a served pod there is
    being admitted again -- its first Allocate was cancelled by a kubelet that stopped, or lost in a restart -- and
    must get its own GPUs again, not the next pod's (seen on the real node: a kubelet restart mid-burst gave a pod
    the GPU of another)."""
    cands = []
    invalid = []
    for p in pods:
        spec, meta, status = p.get("spec") or {}, p.get("metadata") or {}, p.get("status") or {}
        a = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if not a or spec.get("nodeName") != node or status.get("phase") not in (None, "Pending"):
            continue
        key = pod_key(p)
        uid = str(meta.get("uid") or "")
        if admitting is not None and (meta.get("namespace") or "default", meta.get("name") or "") not in admitting:
            continue
        again = served_key(key, uid) in exclude
        if again and admitting is None:
            continue
        ts = _arrival(meta)
        asks = _asks(spec, resource, count)
        try:
            asg = assignment_from_json(key, a)
            uuids = gpu_uuids_of(a)
        except (GpufleetError, ValueError, TypeError, AttributeError) as exc:
            log.warning("pod %s: %s", key, exc)
            if asks:
                invalid.append((ts, key, InvalidAssignment(key, uid, f"malformed gpufleet.io/assignment: {exc}")))
            continue
        if asg.node != node:
            log.warning("pod %s: its assignment is for node %r, the pod is bound to %r", key, asg.node, node)
            if asks:
                invalid.append((ts, key, InvalidAssignment(
                    key, uid, f"gpufleet.io/assignment is for node {asg.node!r}, but the pod is bound to {node!r} (stale)")))
            continue
        is_mig = bool(asg.mig)
        if resource.startswith("nvidia.com/mig-") != is_mig:
            continue
        if is_mig and asg.mig_profile and resource != f"nvidia.com/mig-{asg.mig_profile}":
            continue
        if (len(asg.mig) if is_mig else len(asg.gpu_indices)) != count:
            log.debug("%s: assignment holds a different number of %s than requested (%d)", key, resource, count)
            continue
        cands.append((ts, key, PodAssignment(key, asg, [str(u or "") for u in uuids], uid, again=again)))
    cands.sort(key=lambda c: (c[0], c[1]))
    if cands:
        return cands[0][2]
    invalid.sort(key=lambda c: (c[0], c[1]))
    return invalid[0][2] if invalid else None


def _arrival(meta: dict) -> tuple:
    """The order kubelet admits pods bound to it: the order their binding reached it, which is the pods'
    resourceVersion (the Binding, which also writes the assignment, is their last write until kubelet admits
    them); pods created in the same second are told apart by it.  creationTimestamp when it is not a number."""
    rv = str(meta.get("resourceVersion") or "")
    return (0, int(rv), "") if rv.isdigit() else (1, 0, meta.get("creationTimestamp") or "")


def _asks(spec: dict, resource: str, count: int) -> bool:
    """Does one of the pod's containers ask kubelet for ``count`` devices of ``resource`` (requests default to limits)?"""
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = (c or {}).get("resources") or {}
        v = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        try:
            if v is not None and int(str(v)) == count:
                return True
        except ValueError:
            continue
    return False


def kubelet_waiting(socket: str, resource: str, timeout_s: float = 2.0) -> set[tuple[str, str]] | None:
    """(namespace, pod) of the pods in kubelet's pod list holding no device of ``resource`` yet (PodResources List);
    None when kubelet's PodResources API cannot be asked."""
    import grpc

    from .podresources import podresources_pb2 as pb
    from .podresources import podresources_pb2_grpc as pbg

    try:
        with grpc.insecure_channel(f"unix://{socket}") as ch:
            resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - not reachable: the caller falls back to binding order
        log.debug("PodResources List failed: %s", exc)
        return None
    out = set()
    for p in resp.pod_resources:
        if not any(d.resource_name == resource and d.device_ids for c in p.containers for d in c.devices):
            out.add((p.namespace, p.name))
    return out


def kubelet_devices(socket: str, timeout_s: float = 2.0) -> dict[tuple[str, str], dict[str, list[str]]] | None:
    """(namespace, pod) -> resource -> kubelet device IDs, for every pod in kubelet's list (PodResources List);
    None when kubelet's PodResources API cannot be asked."""
    import grpc

    from .podresources import podresources_pb2 as pb
    from .podresources import podresources_pb2_grpc as pbg

    try:
        with grpc.insecure_channel(f"unix://{socket}") as ch:
            resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the caller decides what not knowing means
        log.warning("PodResources List failed: %s", exc)
        return None
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for p in resp.pod_resources:
        res = out.setdefault((p.namespace, p.name), {})
        for c in p.containers:
            for d in c.devices:
                res.setdefault(d.resource_name, []).extend(d.device_ids)
    return out


def gpu_use(node: str, resource: str, count: int, devices: dict[tuple[str, str], dict[str, list[str]]],
            pods: list[dict] | None) -> GpuUse:
    """Who holds which GPUs (pure): kubelet's devices of ``resource``, and the GPUs gpufleet's assignments name for
    pods bound here that have not finished; the pod being admitted, when exactly one of the pods kubelet has given
    no device yet asks for ``count`` of ``resource`` (its own assignment, if it has one, is not another's use)."""
    by_device = {dev: f"{ns}/{name}" for (ns, name), res in devices.items() for dev in res.get(resource, ())}
    by_gpu: dict[int, set[str]] = {}
    admitting: list[tuple[str, str]] = []
    foreign: set[str] = set()
    for p in pods or ():
        spec, meta, status = p.get("spec") or {}, p.get("metadata") or {}, p.get("status") or {}
        if spec.get("nodeName") != node or status.get("phase") in ("Succeeded", "Failed"):
            continue
        key = pod_key(p)
        ref = (meta.get("namespace") or "default", meta.get("name") or "")
        if ref in devices and not devices[ref].get(resource) and _asks(spec, resource, count):
            admitting.append((key, str(meta.get("uid") or "")))
        a = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if not a or _recorded_from_kubelet(a):
            foreign.add(key)
        if a:
            try:
                asg = assignment_from_json(key, a)
            except (GpufleetError, ValueError, TypeError, AttributeError):
                continue  # Allocate refuses that pod itself
            if asg.node == node and not asg.mig:
                for gi in asg.gpu_indices:
                    by_gpu.setdefault(gi, set()).add(key)
    return GpuUse(by_device, by_gpu, admitting[0] if len(admitting) == 1 else None, frozenset(foreign))


def _recorded_from_kubelet(text: str) -> bool:
    """An assignment the agent wrote for another scheduler's pod (``"source": "kubelet"``, agent/reconcile)."""
    try:
        return json.loads(text).get("source") == "kubelet"
    except (ValueError, AttributeError):
        return False


def api_unreachable(exc: Exception) -> bool:
    """Worth waiting for: no answer at all, or a server-side HTTP error (an ApiException's ``status``)."""
    status = getattr(exc, "status", None)
    return not isinstance(status, int) or status == 0 or status == 429 or status >= 500


class NodePodCache:
    """The pods bound to this node as the agent's own watch last saw them (list, then watch from its
    resourceVersion; after a break the watch resumes where it was, or lists afresh on 410 Gone)."""

    WATCH_S = 240  # one watch request's server-side timeout; the next resumes from the last resourceVersion

    def __init__(self, core_v1, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.core, self.node, self._clock = core_v1, node, clock
        self._lock = threading.Lock()
        self._pods: dict[str, dict] | None = None  # uid -> pod; None until the first list
        self.rv = ""

    def pods(self) -> list[dict] | None:
        """A copy of the pods; None before the first list."""
        with self._lock:
            return None if self._pods is None else list(self._pods.values())

    def replace(self, pods: list[dict], rv: str = "") -> None:
        with self._lock:
            self._pods = {str((p.get("metadata") or {}).get("uid") or pod_key(p)): p for p in pods}
            self.rv = rv

    def apply(self, kind: str, pod: dict) -> None:
        """A watch event (ADDED, MODIFIED, DELETED, BOOKMARK)."""
        meta = pod.get("metadata") or {}
        with self._lock:
            if meta.get("resourceVersion"):
                self.rv = str(meta["resourceVersion"])
            if self._pods is None or kind == "BOOKMARK":
                return
            uid = str(meta.get("uid") or pod_key(pod))
            if kind == "DELETED":
                self._pods.pop(uid, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._pods[uid] = pod

    def _list(self) -> None:
        resp = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
        self.replace([self.core.api_client.sanitize_for_serialization(x) for x in resp.items],
                     str(resp.metadata.resource_version or ""))

    def _watch(self) -> None:
        """One watch request, applied as it streams; returns when the server ends it, raises on an error (410: the
        caller lists afresh)."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", watch=True, resource_version=self.rv,
            allow_watch_bookmarks=True, timeout_seconds=self.WATCH_S, _preload_content=False,
            _request_timeout=(10, self.WATCH_S + 30))
        try:
            for line in iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise WatchExpired(f"{obj.get('code')}: {obj.get('message')}", int(obj.get("code") or 0))
                self.apply(str(event.get("type")), event.get("object") or {})
        finally:
            resp.close()
            resp.release_conn()

    def follow(self, stop) -> None:
        """Until ``stop`` (a threading.Event) is set: list, then watch; on an error wait (backoff) and go on."""
        delay = 0.5
        while not stop.is_set():
            try:
                if self._pods is None or not self.rv:
                    self._list()
                self._watch()
                delay = 0.5
            except WatchExpired as exc:
                log.info("the watch of pods on %s expired (%s): listing them afresh", self.node, exc)
                with self._lock:
                    self.rv = ""
            except Exception as exc:  # noqa: BLE001 - the API server away: the copy stays, the watch resumes
                log.debug("watching pods on %s: %s", self.node, exc)
                stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def start(self) -> None:
        self._stop_event = threading.Event()
        threading.Thread(target=self.follow, args=(self._stop_event,), name="pod-watch", daemon=True).start()


class WatchExpired(Exception):
    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class KubePodSource:
    def __init__(self, core_v1, node: str, pod_resources_socket: str | None = None, api_wait_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 cache: NodePodCache | None = None) -> None:
        self.core, self.node, self.pod_resources_socket = core_v1, node, pod_resources_socket
        self.api_wait_s, self._sleep, self._clock = api_wait_s, sleep, clock
        self.cache = cache  # the agent's own watch of this node's pods: read when the API server cannot be

    def _node_pods(self, early: Callable[[], list[dict] | None] | None = None) -> list[dict]:
        """The pods bound to this node, waiting up to ``api_wait_s`` for an API server that does not answer;
        ``early``: asked after each attempt that found the API server away, its pods (not None) end the wait."""
        end, delay = self._clock() + self.api_wait_s, 0.25
        while True:
            try:
                items = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
                return [self.core.api_client.sanitize_for_serialization(x) for x in items]
            except Exception as exc:
                left = end - self._clock()
                if not api_unreachable(exc):
                    raise
                if early is not None and (pods := early()) is not None:
                    log.warning("cannot list pods on %s: %s; answering from the agent's watch of them", self.node, exc)
                    return pods
                if left <= 0:
                    raise
                log.warning("cannot list pods on %s: %s; retrying for up to %.0f s more", self.node, exc, left)
                self._sleep(min(delay, left))
                delay = min(delay * 2, 4.0)

    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | InvalidAssignment | None:
        waiting = kubelet_waiting(self.pod_resources_socket, resource) if self.pod_resources_socket else None

        def known() -> list[dict] | None:
            # the watched copy, when it holds the pod kubelet names as being admitted (PodResources): answered at once
            cached = self.cache.pods() if self.cache is not None else None
            if cached is None or waiting is None:
                return None
            return cached if pick(cached, self.node, resource, count, exclude, waiting) is not None else None

        try:
            pods = self._node_pods(known)
        except Exception as exc:  # API away for longer than api_wait_s, or it refuses us: the caller decides
            cached = self.cache.pods() if self.cache is not None else None
            if cached is not None and api_unreachable(exc):
                found = pick(cached, self.node, resource, count, exclude, waiting)
                if found is not None:
                    log.warning("cannot list pods on %s: %s; %s from the agent's watch of them", self.node, exc, found.pod_key)
                    return found
            raise PodsUnknown(f"cannot list pods on {self.node}: {exc}", retry=api_unreachable(exc)) from exc
        return pick(pods, self.node, resource, count, exclude, waiting)

    def gpu_use(self, resource: str, count: int) -> GpuUse | None:
        """For the node guard: None when kubelet's PodResources cannot be read (then the guard refuses). Without the
        API server the guard still knows kubelet's devices, not the GPUs gpufleet assigned to pods not yet admitted."""
        if not self.pod_resources_socket:
            return None
        devices = kubelet_devices(self.pod_resources_socket)
        if devices is None:
            return None
        try:
            pods: list[dict] | None = self._node_pods(lambda: self.cache.pods() if self.cache is not None else None)
        except Exception as exc:  # noqa: BLE001 - kubelet's view alone
            log.error("cannot list pods on %s: %s; the node guard sees kubelet's devices only", self.node, exc)
            pods = None
        return gpu_use(self.node, resource, count, devices, pods)

    def report_refused(self, pod_key: str, uid: str, message: str, reason: str = "GpuAssignmentRefused") -> None:
        """A Warning event on the pod: why kubelet refused it (kubelet's own event says only that Allocate failed)."""
        import datetime

        ns, name = pod_key.split("/", 1)
        now = datetime.datetime.now(datetime.UTC)
        body = {"metadata": {"generateName": f"{name}.", "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid or None, "apiVersion": "v1"},
                "reason": reason, "message": message[:1000], "type": "Warning",
                "source": {"component": "gpufleet-agent", "host": self.node}, "reportingComponent": "gpufleet-agent",
                "reportingInstance": self.node, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.core.create_namespaced_event(ns, body)
        except Exception as exc:  # noqa: BLE001 - the refusal stands without the event
            log.warning("cannot post the event for %s: %s", pod_key, exc)

    def live_pods(self) -> set[str] | None:
        """Keys of the pods bound to this node, or None when the API cannot say (then nothing is pruned)."""
        try:
            items = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        except Exception as exc:
            log.warning("cannot list pods on %s: %s", self.node, exc)
            return None
        return {served_key(f"{p.metadata.namespace}/{p.metadata.name}", p.metadata.uid or "") for p in items}


class DeferredPods:
    """The pod source before the API client exists: the agent registers its device plugins with kubelet first (the
    client's import and set-up took seconds on a loaded node, and kubelet refuses every GPU pod it admits while no
    plugin is registered), and a call that needs the API waits here, up to ``wait_s``, for ``provide``.  kubelet waits
    for an Allocate without a deadline, so a pod admitted meanwhile is served late, not refused."""

    def __init__(self, wait_s: float = 30.0) -> None:
        self.wait_s = wait_s
        self._ready = threading.Event()
        self._source: object | None = None

    def provide(self, source: object | None) -> None:
        """The real source (None: no API access; then kubelet's device choice stands, as without --node-name)."""
        self._source = source
        self._ready.set()

    def _get(self, what: str) -> Callable[..., Any] | None:
        if not self._ready.wait(self.wait_s):
            log.error("no API client after %.0f s: %s without it", self.wait_s, what)
            return None
        return getattr(self._source, what, None) if self._source is not None else None

    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | InvalidAssignment | None:
        f = self._get("pending_assignment")
        return f(resource, count, exclude) if f is not None else None

    def gpu_use(self, resource: str, count: int) -> GpuUse | None:
        f = self._get("gpu_use")
        return f(resource, count) if f is not None else None

    def report_refused(self, pod_key: str, uid: str, message: str, reason: str = "GpuAssignmentRefused") -> None:
        f = self._get("report_refused")
        if f is not None:
            f(pod_key, uid, message, reason=reason)

    def live_pods(self) -> set[str] | None:
        if not self._ready.is_set():
            return None  # nothing pruned before the API is there
        f = self._get("live_pods")
        return f() if f is not None else None
