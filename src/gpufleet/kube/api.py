"""The few API-server calls the scheduler makes, behind one small protocol.

``KubernetesApi`` implements it with the official ``kubernetes`` client;
the tests' ``tests/kube/fake_api.FakeApi`` is an in-process stand-in for the
loop's fast tests and the benchmark.  Objects cross this boundary as plain JSON dicts, exactly as the
API server sends them: the client's model classes are skipped
(``_preload_content=False``, ``deserialize=False``) because turning every pod
into Python objects and back costs more than scheduling it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterator, Protocol


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class Conflict(Exception):
    """The object changed or is already bound (HTTP 409)."""


class NotFound(Exception):
    """The object does not exist (HTTP 404)."""


class ApiError(Exception):
    """Any other API failure, with the status and the server's message (not the whole response)."""

    def __init__(self, status: int | None, message: str):
        super().__init__(f"{status} {message}" if status else message)
        self.status = status


class EvictionRefused(ApiError):
    """The eviction subresource said no (429): a PodDisruptionBudget allows no disruption now, or its
    status is older than its spec.  Nothing was deleted."""

    def __init__(self, message: str):
        super().__init__(429, message)


class SchedulerApi(Protocol):
    def list_nodes(self) -> tuple[list[dict], str]: ...
    def list_pods(self) -> tuple[list[dict], str]: ...
    def watch(self, kind: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]:
        """(type, object) with type ADDED/MODIFIED/DELETED/BOOKMARK; raises ``Gone`` on 410."""
        ...
    def list_kind(self, kind: str) -> tuple[list[dict], str]:
        """List one of ``POLICY_KINDS``; raises ``NotFound`` when the API does not serve it (CRD not installed)."""
        ...
    def get_pod(self, namespace: str, name: str) -> dict | None: ...
    def node_exists(self, name: str) -> bool:
        """Whether the API server has this Node now (read from it, not the watch cache; a list by name, so the
        scheduler's RBAC stays nodes: list + watch).  Raises on an API failure."""
        ...
    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None: ...
    def evict_pod(self, namespace: str, name: str, uid: str | None = None, grace_period_s: int | None = None) -> None:
        """Evict a pod through the Eviction API (preemption, reclaim), so the API server itself keeps every
        PodDisruptionBudget: ``EvictionRefused`` (429) when one allows no disruption now.  ``uid`` guards
        against evicting a newer pod of the same name."""
        ...
    def nominate(self, namespace: str, name: str, node: str) -> None:
        """Set ``status.nominatedNodeName`` (where a preemptor will go once its victims are gone)."""
        ...
    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str], uid: str | None = None) -> None:
        """Merge ``annotations`` into the pod's (``uid``: only that pod, not a newer one of the same name)."""
        ...
    def event(self, pod: dict, type_: str, reason: str, message: str) -> None: ...
    def patch_object(self, kind: str, namespace: str, name: str, patch: dict, subresource: str = "") -> dict:
        """JSON merge patch of one of ``POLICY_KINDS`` or ``DRA_KINDS`` (volume binding: a PV's claimRef, a claim's
        selected node; ``subresource="status"``: a PodGroup's scheduling condition, a ResourceClaim's allocation).
        A ``metadata.resourceVersion`` in the patch is a precondition (``Conflict`` when the object changed).
        Returns the object as written."""
        ...
    # DRA (kube/dra): ResourceClaims read back after a conflict, created for extended resources, deleted when stale
    def get_object(self, kind: str, namespace: str, name: str) -> dict | None: ...
    def create_object(self, kind: str, namespace: str, obj: dict) -> dict: ...
    def create_pod(self, namespace: str, obj: dict) -> dict:
        """A bare pod kubelet refused, re-created (kube/plugin_down); ``Conflict`` when its name exists."""
        ...
    def delete_namespaced(self, kind: str, namespace: str, name: str) -> None: ...
    def patch_pod_status(self, namespace: str, name: str, patch: dict) -> None:
        """Merge patch of pods/status (``status.extendedResourceClaimStatus``)."""
        ...


# Finished pods hold nothing; like kube-scheduler, never list or watch them.  A pod that
# finishes leaves the selector, which a watch reports as DELETED.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


# What queues, gangs and preemption read besides nodes and pods, and where the API serves it.
POLICY_KINDS = {
    "namespace": "/api/v1/namespaces",
    "queue": "/apis/gpufleet.io/v1alpha1/queues",
    "podgroup": "/apis/gpufleet.io/v1alpha1/podgroups",
    # Kubernetes' own gangs (GenericWorkload, beta in 1.37): pods name one in spec.schedulingGroup
    "schedpodgroup": "/apis/scheduling.k8s.io/v1beta1/podgroups",
    "pdb": "/apis/policy/v1/poddisruptionbudgets",
    # volumes: where a pod's PersistentVolume can be used, per-node attach limits (VolumeBinding, NodeVolumeLimits)
    "pvc": "/api/v1/persistentvolumeclaims",
    "pv": "/api/v1/persistentvolumes",
    "storageclass": "/apis/storage.k8s.io/v1/storageclasses",
    "csinode": "/apis/storage.k8s.io/v1/csinodes",
    "csidriver": "/apis/storage.k8s.io/v1/csidrivers",  # preventPodSchedulingIfMissing (VolumeLimitScaling)
}
# Dynamic Resource Allocation (resource.k8s.io/v1): what kube/dra reads and, for claims, writes
DRA_KINDS = {
    "resourceslice": "/apis/resource.k8s.io/v1/resourceslices",
    "deviceclass": "/apis/resource.k8s.io/v1/deviceclasses",
    "resourceclaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "resourceclaimtemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
}
KIND_PATHS = {**POLICY_KINDS, **DRA_KINDS}
# watched even without queues (--no-queues): pod constraints need them (namespaceSelector, volumes, native gangs)
CONSTRAINT_KINDS = ("namespace", "pvc", "pv", "storageclass", "csinode", "csidriver", "schedpodgroup")


def object_key(obj: dict) -> str:
    """namespace/name for namespaced objects, name for cluster-scoped ones."""
    m = obj.get("metadata") or {}
    return f"{m['namespace']}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))


def pod_key_of(obj: dict) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace') or 'default'}/{m.get('name')}"


def _status_error(status: int, body: bytes, reason: str) -> Exception:
    """The exception for an HTTP error reply, with the server's message (a Status object's) when there is one."""
    try:
        msg = json.loads(body).get("message") or reason
    except (ValueError, AttributeError):
        msg = reason
    kinds = {409: Conflict, 404: NotFound, 410: Gone, 429: EvictionRefused}
    return kinds[status](msg) if status in kinds else ApiError(status, msg)


def load_credentials(kubeconfig: str | None = None, context: str | None = None, client_configuration: object = None) -> None:
    """The official client's configuration: ``kubeconfig``, else in-cluster, else $KUBECONFIG or ~/.kube/config.

    Every command that talks to a cluster comes here, so the same problem is
    the same error everywhere: a file or context named on the command line that
    cannot be used is bad usage (exit 2); no cluster configured at all is a
    runtime failure (exit 1), like a cluster that does not answer.
    """
    import os

    from kubernetes import config

    from ..engine.errors import RuntimeFailure, UsageError

    kw = {"client_configuration": client_configuration} if client_configuration is not None else {}
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            why = ("is a directory" if os.path.isdir(kubeconfig) else "not a regular file" if os.path.exists(kubeconfig)
                   else "no such file")
            raise UsageError(f"--kubeconfig {kubeconfig}: {why}")
        source = f"--kubeconfig {kubeconfig}"
    else:
        try:
            config.load_incluster_config(**kw)
            return
        except config.ConfigException:
            pass
        env = os.environ.get("KUBECONFIG", "")
        paths = [os.path.expanduser(x) for x in env.split(os.pathsep) if x] or [os.path.expanduser("~/.kube/config")]
        if not any(os.path.isfile(x) for x in paths):
            raise RuntimeFailure("no Kubernetes cluster configured: not running in a pod and no kubeconfig at "
                                 f"{os.pathsep.join(paths)} (give --kubeconfig)")
        source = f"kubeconfig {os.pathsep.join(paths)}"
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, **kw)
    except Exception as exc:  # ConfigException, YAML errors, missing keys: all "this kubeconfig cannot be used"
        text = " ".join(str(exc).split()) or type(exc).__name__
        if context and "context" in text.lower():
            raise UsageError(f"--context {context}: not in {source}: {text}") from None
        raise UsageError(f"{source}: cannot be used: {text}") from None


class RateLimiter:
    """client-go's token bucket (``--kube-api-qps``, ``--kube-api-burst``; kube-scheduler's ``clientConnection``):
    ``burst`` calls at once, then ``qps`` per second; a call over the limit waits for its token."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._clock = clock
        self._sleep = sleep
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token, waiting for it if need be; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0  # may go negative: the calls queued behind wait their turn
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class KubernetesApi:
    """The real thing, through the official ``kubernetes`` client.

    ``pool_size`` is the number of connections kept open for calls (binds, events, reads); every watch holds
    one more of its own while it runs, so the pool has room for both (a pool smaller than its callers opens
    and closes a TLS connection for each call beyond it).  ``qps`` > 0 limits the calls as client-go's
    ``--kube-api-qps`` / ``--kube-api-burst`` do (watches are not counted: each is one long request)."""

    WATCH_SLOTS = 24  # connections kept for watches: node, pod and every policy, constraint and DRA kind
    AUTH_TTL_S = 5.0  # see _auth_headers

    def __init__(self, kubeconfig: str | None = None, context: str | None = None, component: str = "gpufleet-scheduler",
                 pool_size: int = 32, request_timeout_s: float = 30.0, qps: float = 0.0, burst: int = 0) -> None:
        import urllib3
        from kubernetes import client

        cfg = client.Configuration()
        load_credentials(kubeconfig, context, cfg)
        cfg.connection_pool_maxsize = pool_size + self.WATCH_SLOTS  # binds and events go out from a thread pool
        self._client = client
        self.api = client.ApiClient(cfg)
        self.component = component
        self.timeout = request_timeout_s
        self.limiter = RateLimiter(qps, burst or max(1, int(qps))) if qps > 0 else None
        self._host = cfg.host
        self._pool = self.api.rest_client.pool_manager
        self._auth: tuple[float, dict[str, str]] | None = None
        self._direct = None  # the API server's own connection pool, when nothing (a proxy) stands between
        self._prefix = ""
        if type(self._pool) is urllib3.PoolManager:
            u = urllib3.util.parse_url(cfg.host)
            self._direct = self._pool.connection_from_host(u.host, u.port, u.scheme)
            self._prefix = (u.path or "").rstrip("/")

    @property
    def core(self):
        """The generated CoreV1Api, built on first use: importing its models costs ~0.3 s of start-up
        that the scheduler itself (raw calls only) does not need."""
        if "_core" not in self.__dict__:
            self._core = self._client.CoreV1Api(self.api)
        return self._core

    def _list(self, path: str) -> tuple[list[dict], str]:
        from urllib.parse import quote

        items: list[dict] = []
        cont = ""
        rv = ""
        while True:
            body = self._request("GET", f"{path}limit=500" + (f"&continue={quote(cont)}" if cont else ""))
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue") or ""
            if not cont:
                return items, rv

    def list_nodes(self) -> tuple[list[dict], str]:
        return self._list("/api/v1/nodes?")

    def node_exists(self, name: str) -> bool:
        from urllib.parse import quote

        body = self._request("GET", f"/api/v1/nodes?fieldSelector={quote('metadata.name=' + name)}")
        return bool(body.get("items"))

    def list_pods(self) -> tuple[list[dict], str]:
        from urllib.parse import quote

        return self._list(f"/api/v1/pods?fieldSelector={quote(LIVE_PODS)}&")

    def list_failed_pods(self) -> tuple[list[dict], str]:
        """Pods in phase Failed (``gpufleet explain`` reads kubelet's refusals from them: kube/plugin_down)."""
        from urllib.parse import quote

        return self._list(f"/api/v1/pods?fieldSelector={quote('status.phase=Failed')}&")

    def list_kind(self, kind: str) -> tuple[list[dict], str]:
        return self._list(KIND_PATHS[kind] + "?")

    def _raw_watch(self, path: str, resource_version: str, timeout_s: int, query: str = "") -> Iterator[tuple[str, dict]]:
        """A watch of any path, read line by line through the client's pool and credentials."""
        import urllib3

        url = f"{path}?{query}watch=1&allowWatchBookmarks=true&timeoutSeconds={timeout_s}&resourceVersion={resource_version}"
        headers = {"Accept": "application/json", "User-Agent": "gpufleet", **self._auth_headers()}
        r = self._urlopen("GET", url, None, headers, urllib3.Timeout(connect=10, read=timeout_s + 30), preload_content=False)
        try:
            if r.status != 200:
                raise _status_error(r.status, r.read(), r.reason or "")
            buf = b""
            for chunk in r.stream(65536):
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()  # an incomplete last line waits for the next chunk
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    t, obj = ev.get("type"), ev.get("object") or {}
                    if t == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(path)
                        raise RuntimeError(f"watch error: {obj}")
                    yield t, obj
        finally:
            r.release_conn()

    def evict_pod(self, namespace: str, name: str, uid: str | None = None, grace_period_s: int | None = None) -> None:
        opts: dict = {}
        if uid:
            opts["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            opts["gracePeriodSeconds"] = grace_period_s
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        if opts:
            body["deleteOptions"] = opts
        self._request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)

    def _object_path(self, kind: str, namespace: str, name: str = "") -> str:
        base, resource = KIND_PATHS[kind].rsplit("/", 1)
        path = f"{base}/namespaces/{namespace}/{resource}" if namespace else f"{base}/{resource}"
        return f"{path}/{name}" if name else path

    def patch_object(self, kind: str, namespace: str, name: str, patch: dict, subresource: str = "") -> dict:
        path = self._object_path(kind, namespace, name)
        if subresource:
            path += f"/{subresource}"
        return self._request("PATCH", path, patch, content_type="application/merge-patch+json")

    def get_object(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self._request("GET", self._object_path(kind, namespace, name))
        except NotFound:
            return None

    def create_object(self, kind: str, namespace: str, obj: dict) -> dict:
        return self._request("POST", self._object_path(kind, namespace), obj)

    def create_pod(self, namespace: str, obj: dict) -> dict:
        return self._request("POST", f"/api/v1/namespaces/{namespace}/pods", obj)

    def delete_namespaced(self, kind: str, namespace: str, name: str) -> None:
        self._request("DELETE", self._object_path(kind, namespace, name))

    def patch_pod_status(self, namespace: str, name: str, patch: dict) -> None:
        self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", patch,
                      content_type="application/merge-patch+json")

    def nominate(self, namespace: str, name: str, node: str) -> None:
        self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                      {"status": {"nominatedNodeName": node}}, content_type="application/merge-patch+json")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str], uid: str | None = None) -> None:
        meta: dict = {"annotations": annotations}
        if uid:
            meta["uid"] = uid  # a precondition: 409 if the pod was replaced
        self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": meta},
                      content_type="application/merge-patch+json")

    def watch(self, kind: str, resource_version: str, timeout_s: int = 60) -> Iterator[tuple[str, dict]]:
        # the raw stream for every kind: the client's Watch with deserialize=False fails on the
        # ERROR event of an expired watch (KeyError 'raw_object') instead of reporting 410 Gone
        from urllib.parse import quote

        if kind == "node":
            return self._raw_watch("/api/v1/nodes", resource_version, timeout_s)
        if kind == "pod":
            return self._raw_watch("/api/v1/pods", resource_version, timeout_s, f"fieldSelector={quote(LIVE_PODS)}&")
        return self._raw_watch(KIND_PATHS[kind], resource_version, timeout_s)

    def _request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json",
                 reply: bool = True) -> dict:
        """One call straight through the client's connection pool and credentials.

        The generated client methods cost about 2 ms of CPU per call on top of
        the HTTP request itself (measured: 2.4 ms vs 0.45 ms per Binding),
        which would cap a 2-core box at a few hundred calls per second.  This
        path keeps the client's TLS set-up, pool and auth (tokens refreshed
        through ``auth_settings``, see ``_auth_headers``) and skips the model layer.
        ``reply=False``: the body of a successful reply is not decoded (a Binding's
        Status, an Event's echo: nobody reads them).
        """
        import urllib3

        if self.limiter is not None:
            self.limiter.take()
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": "gpufleet",
                       **self._auth_headers(fresh=attempt > 0)}
            r = self._urlopen(method, path, data, headers, urllib3.Timeout(total=self.timeout))
            if r.status != 401 or not self._auth_cached:
                break  # else a credential rotated within AUTH_TTL_S: ask for it again, once
        if 200 <= r.status < 300:
            return json.loads(r.data) if r.data and reply else {}
        raise _status_error(r.status, r.data, r.reason or "")

    @property
    def _auth_cached(self) -> bool:
        return self._auth is not None and bool(self._auth[1])

    def _auth_headers(self, fresh: bool = False) -> dict[str, str]:
        """The Authorization header, asked of the client's configuration at most every ``AUTH_TTL_S``.

        The client's configuration reloads the whole kubeconfig on every ask (its ``refresh_api_key_hook``),
        a tenth of a call's CPU; tokens rotate far more slowly than that (kubelet renews a projected token
        at 80% of its life, exec plugins before it expires), and a 401 asks again at once."""
        now = time.monotonic()
        cached = self._auth
        if cached is not None and not fresh and now - cached[0] < self.AUTH_TTL_S:
            return cached[1]
        headers: dict[str, str] = {}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
        self._auth = (now, headers)
        return headers

    def _urlopen(self, method: str, path: str, body: bytes | None, headers: dict, timeout: Any,
                 preload_content: bool = True) -> Any:
        """One request on the client's pool: straight to the API server's connection pool when no proxy stands
        between (``PoolManager.urlopen`` parses the URL and looks the pool up again on every call)."""
        if self._direct is not None:
            return self._direct.urlopen(method, self._prefix + path, body=body, headers=headers, timeout=timeout,
                                        retries=False, preload_content=preload_content, release_conn=preload_content)
        return self._pool.request(method, self._host + path, body=body, headers=headers, timeout=timeout, retries=False,
                                  preload_content=preload_content)

    def get_pod(self, namespace: str, name: str) -> dict | None:
        try:
            return self._request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None

    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # the pods/binding subresource, as kube-scheduler uses (RBAC: create pods/binding)
        self._request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body, reply=False)

    def event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        import datetime
        import uuid

        m = pod.get("metadata") or {}
        ns = m.get("namespace") or "default"  # an event about a cluster-scoped object (a ResourceSlice) goes to default
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        regarding = {"kind": pod.get("kind", "Pod"), "name": m.get("name"), "uid": m.get("uid"),
                     "apiVersion": pod.get("apiVersion", "v1"), "resourceVersion": m.get("resourceVersion")}
        if m.get("namespace") or regarding["kind"] == "Pod":
            regarding["namespace"] = ns
        body = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{m.get('name')}.{uuid.uuid4().hex[:12]}", "namespace": ns},
            "eventTime": now, "action": "Scheduling", "reason": reason, "note": message[:1024], "type": type_,
            "reportingController": f"gpufleet.io/{self.component}", "reportingInstance": self.component,
            "regarding": regarding,
        }
        self._request("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body, reply=False)  # the echo is not read
