"""The few API calls the DRA driver makes, behind a small protocol (tests use an in-memory one).

Objects cross as plain JSON dicts, exactly as the API server sends them: the
``kubernetes`` client's generated models for ``resource.k8s.io/v1`` lag the
API (a model drops fields it does not know, such as a device's
``allowMultipleAllocations`` or capacity ``requestPolicy`` in older clients),
so calls go straight through the client's connection pool and credentials.
"""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Iterator, Protocol
from urllib.parse import quote

RESOURCE_API = "/apis/resource.k8s.io/v1"


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class Gone(Exception):
    pass


class ApiError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(f"{status} {message}" if status else message)
        self.status = status


class DraApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict: ...
    def list_slices(self, node: str, driver: str) -> tuple[list[dict], str]: ...
    def create_slice(self, obj: dict) -> dict: ...
    def probe_slice(self, obj: dict) -> dict:
        """A dry-run create: the object as the API server would store it (gated fields it does not serve dropped)."""
        ...
    def update_slice(self, obj: dict) -> dict: ...
    def delete_slice(self, name: str) -> None: ...
    def watch_slices(self, node: str, driver: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]:
        """(type, object); raises ``Gone`` when the resourceVersion is too old."""
        ...
    def get_node(self, name: str) -> dict: ...
    def event(self, regarding: dict, type_: str, reason: str, note: str, action: str = "PrepareResources") -> None:
        """An events.k8s.io/v1 Event about ``regarding`` ({apiVersion, kind, namespace?, name, uid})."""
        ...


def _error(status: int, body: bytes, reason: str) -> Exception:
    try:
        msg = json.loads(body).get("message") or reason
    except (ValueError, AttributeError):
        msg = reason
    kinds = {404: NotFound, 409: Conflict, 410: Gone}
    return kinds[status](msg) if status in kinds else ApiError(status, msg)


def slice_selector(node: str, driver: str) -> str:
    return quote(f"spec.nodeName={node},spec.driver={driver}")


class KubeDraApi:
    """The real API server, through the official client's pool and auth (``api_client``: a ``kubernetes.client.ApiClient``)."""

    def __init__(self, api_client, component: str = "gpufleet-agent", instance: str = "", timeout_s: float = 30.0) -> None:
        self.api = api_client
        self.component = component
        self.instance = instance
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import urllib3

        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": self.component}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
        r = self.api.rest_client.pool_manager.request(
            method, self.api.configuration.host + path, body=None if body is None else json.dumps(body).encode(),
            headers=headers, timeout=urllib3.Timeout(total=self.timeout_s), retries=False)
        if 200 <= r.status < 300:
            return json.loads(r.data) if r.data else {}
        raise _error(r.status, r.data, r.reason or "")

    def get_claim(self, namespace: str, name: str) -> dict:
        return self._request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    def list_slices(self, node: str, driver: str) -> tuple[list[dict], str]:
        body = self._request("GET", f"{RESOURCE_API}/resourceslices?fieldSelector={slice_selector(node, driver)}")
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def create_slice(self, obj: dict) -> dict:
        return self._request("POST", f"{RESOURCE_API}/resourceslices", obj)

    def probe_slice(self, obj: dict) -> dict:
        return self._request("POST", f"{RESOURCE_API}/resourceslices?dryRun=All", obj)

    def update_slice(self, obj: dict) -> dict:
        return self._request("PUT", f"{RESOURCE_API}/resourceslices/{obj['metadata']['name']}", obj)

    def delete_slice(self, name: str) -> None:
        self._request("DELETE", f"{RESOURCE_API}/resourceslices/{name}")

    def get_node(self, name: str) -> dict:
        return self._request("GET", f"/api/v1/nodes/{name}")

    def watch_slices(self, node: str, driver: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]:
        import urllib3

        url = (f"{RESOURCE_API}/resourceslices?fieldSelector={slice_selector(node, driver)}&watch=1"
               f"&timeoutSeconds={timeout_s}&resourceVersion={resource_version}")
        headers = {"Accept": "application/json", "User-Agent": self.component}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], url, "GET", None)
        r = self.api.rest_client.pool_manager.request("GET", self.api.configuration.host + url, headers=headers,
                                                      preload_content=False, retries=False,
                                                      timeout=urllib3.Timeout(connect=10, read=timeout_s + 30))
        try:
            if r.status != 200:
                raise _error(r.status, r.read(), r.reason or "")
            buf = b""
            for chunk in r.stream(65536):
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    t, obj = ev.get("type"), ev.get("object") or {}
                    if t == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone("resourceslices")
                        raise ApiError(obj.get("code"), str(obj.get("message") or obj))
                    yield t, obj
        finally:
            r.release_conn()

    def event(self, regarding: dict, type_: str, reason: str, note: str, action: str = "PrepareResources") -> None:
        ns = regarding.get("namespace") or "default"
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": f"{regarding.get('name')}.{uuid.uuid4().hex[:12]}", "namespace": ns},
                "eventTime": now, "action": action, "reason": reason, "note": note[:1024], "type": type_,
                "reportingController": "gpufleet.io/gpufleet-agent", "reportingInstance": self.instance or self.component,
                "regarding": {k: v for k, v in regarding.items() if v}}
        self._request("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body)


__all__ = ["ApiError", "Conflict", "DraApi", "Gone", "KubeDraApi", "NotFound", "RESOURCE_API"]
