"""The few API-server calls the scheduler makes, behind one small protocol.

``KubernetesApi`` implements it with the official ``kubernetes`` client;
``FakeApi`` is an in-process stand-in for the loop's fast tests.  Objects
cross this boundary as plain JSON dicts, as the API server sends them.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Iterator, Protocol


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class Conflict(Exception):
    """The object changed or is already bound (HTTP 409)."""


class SchedulerApi(Protocol):
    def list_nodes(self) -> tuple[list[dict], str]: ...
    def list_pods(self) -> tuple[list[dict], str]: ...
    def watch(self, kind: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]: ...
    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None: ...
    def event(self, pod: dict, type_: str, reason: str, message: str) -> None: ...


class FakeApi:
    """An in-memory API server: enough of list/watch/bind/events for the loop's tests."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.events: list[dict] = []
        self.binds: list[tuple[str, str]] = []
        self.fail_binds: int = 0  # next N binds raise
        self._rv = itertools.count(1)
        self._log: list[tuple[int, str, str, dict]] = []

    def _touch(self, kind: str, type_: str, obj: dict) -> None:
        rv = next(self._rv)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        self._log.append((rv, kind, type_, copy.deepcopy(obj)))

    def add_node(self, obj: dict) -> None:
        self.nodes[obj["metadata"]["name"]] = obj
        self._touch("node", "ADDED", obj)

    def add_pod(self, obj: dict) -> None:
        m = obj["metadata"]
        self.pods[f"{m.get('namespace', 'default')}/{m['name']}"] = obj
        self._touch("pod", "ADDED", obj)

    def delete_pod(self, key: str) -> None:
        obj = self.pods.pop(key)
        self._touch("pod", "DELETED", obj)

    def list_nodes(self) -> tuple[list[dict], str]:
        return [copy.deepcopy(n) for n in self.nodes.values()], str(next(self._rv))

    def list_pods(self) -> tuple[list[dict], str]:
        return [copy.deepcopy(p) for p in self.pods.values()], str(next(self._rv))

    def watch(self, kind: str, resource_version: str, timeout_s: int = 0) -> Iterator[tuple[str, dict]]:
        rv = int(resource_version or 0)
        for r, k, t, obj in list(self._log):
            if k == kind and r > rv:
                yield t, copy.deepcopy(obj)

    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None:
        key = f"{namespace}/{name}"
        if self.fail_binds > 0:
            self.fail_binds -= 1
            raise ConnectionError("injected API failure")
        pod = self.pods.get(key)
        if pod is None:
            raise Conflict(f"pod {key} not found")
        if pod["spec"].get("nodeName"):
            raise Conflict(f"pod {key} is already bound to {pod['spec']['nodeName']}")
        pod["spec"]["nodeName"] = node
        pod["metadata"].setdefault("annotations", {}).update(annotations)  # the apiserver copies a Binding's annotations
        self.binds.append((key, node))
        self._touch("pod", "MODIFIED", pod)

    def event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        m = pod.get("metadata") or {}
        self.events.append({"pod": f"{m.get('namespace', 'default')}/{m.get('name')}", "type": type_, "reason": reason, "message": message})


class KubernetesApi:
    """The real thing, through the official ``kubernetes`` client."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None, component: str = "gpufleet-scheduler") -> None:
        from kubernetes import client, config

        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(context=context)
        self._client = client
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.events_api = client.EventsV1Api(self.api)
        self.component = component

    def _json(self, obj: Any) -> dict:
        return self.api.sanitize_for_serialization(obj)

    def list_nodes(self) -> tuple[list[dict], str]:
        r = self.core.list_node()
        return [self._json(x) for x in r.items], r.metadata.resource_version

    def list_pods(self) -> tuple[list[dict], str]:
        r = self.core.list_pod_for_all_namespaces()
        return [self._json(x) for x in r.items], r.metadata.resource_version

    def watch(self, kind: str, resource_version: str, timeout_s: int = 60) -> Iterator[tuple[str, dict]]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        fn = self.core.list_node if kind == "node" else self.core.list_pod_for_all_namespaces
        w = watch.Watch()
        try:
            for ev in w.stream(fn, resource_version=resource_version, timeout_seconds=timeout_s, allow_watch_bookmarks=True):
                if ev["type"] == "ERROR":
                    if (ev.get("raw_object") or {}).get("code") == 410:
                        raise Gone(kind)
                    continue
                yield ev["type"], self._json(ev["object"])
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(kind) from None
            raise
        finally:
            w.stop()

    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, annotations=annotations),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            # _preload_content=False: the client cannot deserialize the Status the server returns
            self.core.create_namespaced_binding(namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from None
            raise

    def event(self, pod: dict, type_: str, reason: str, message: str) -> None:
        import datetime
        import uuid

        c = self._client
        m = pod.get("metadata") or {}
        ns = m.get("namespace", "default")
        now = datetime.datetime.now(datetime.timezone.utc)
        ev = c.EventsV1Event(
            metadata=c.V1ObjectMeta(name=f"{m.get('name')}.{uuid.uuid4().hex[:10]}", namespace=ns),
            event_time=now, action="Scheduling", reason=reason, note=message[:1024], type=type_,
            reporting_controller=f"gpufleet.io/{self.component}", reporting_instance=self.component,
            regarding=c.V1ObjectReference(kind="Pod", namespace=ns, name=m.get("name"), uid=m.get("uid"), api_version="v1"),
        )
        self.events_api.create_namespaced_event(ns, ev)
