"""Reclaim's Kubernetes side, through the official client: read pods and PDBs, warn, clear, evict.

Warning = a ``Warning`` event on the pod plus the ``gpufleet.io/idle-warning``
annotation (RFC 3339 time of the warning; the eviction grace period counts
from it).  Eviction goes through the Eviction API (``policy/v1``), so the API
server enforces PodDisruptionBudgets even if our own PDB check raced: a 429
is reported as "blocked by a PodDisruptionBudget", a 404 as "already gone".
The API objects are injectable so the adapter is tested without a cluster.
"""

from __future__ import annotations

import datetime as _dt
import logging
import uuid
from typing import Any, Protocol

from ..engine import annotations as ann

log = logging.getLogger(__name__)


def load_client_config(kubeconfig: str | None, context: str | None = None) -> None:
    """The official client's default configuration: ``kubeconfig``, else in-cluster, else ~/.kube/config."""
    from ..kube.api import load_credentials

    load_credentials(kubeconfig, context)


class ReclaimKube(Protocol):
    def list_running_pods(self) -> list[dict]: ...
    def list_pdbs(self) -> list[dict]: ...
    def warn(self, namespace: str, name: str, warned_at: str, message: str) -> str: ...
    def clear(self, namespace: str, name: str, message: str) -> str: ...
    def evict(self, namespace: str, name: str, message: str) -> str: ...


def rfc3339(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeReclaimClient:
    """``ReclaimKube`` over ``kubernetes.client`` (CoreV1Api + PolicyV1Api)."""

    component = "gpufleet-reclaim"

    def __init__(self, kubeconfig: str | None = None, core: Any = None, policy: Any = None) -> None:
        from kubernetes import client

        self._client = client
        if core is None or policy is None:
            load_client_config(kubeconfig)
        self.core = core or client.CoreV1Api()
        self.policy = policy or client.PolicyV1Api()
        self._ser = client.ApiClient().sanitize_for_serialization

    def list_running_pods(self) -> list[dict]:
        items = self.core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items
        return [x if isinstance(x, dict) else self._ser(x) for x in items]

    def list_pdbs(self) -> list[dict]:
        items = self.policy.list_pod_disruption_budget_for_all_namespaces().items
        return [x if isinstance(x, dict) else self._ser(x) for x in items]

    def _event(self, namespace: str, name: str, type_: str, reason: str, message: str) -> None:
        c = self._client
        now = _dt.datetime.now(_dt.timezone.utc)
        ev = c.CoreV1Event(
            metadata=c.V1ObjectMeta(name=f"{name}.{uuid.uuid4().hex[:12]}", namespace=namespace),
            involved_object=c.V1ObjectReference(kind="Pod", namespace=namespace, name=name, api_version="v1"),
            reason=reason, message=message[:1024], type=type_, first_timestamp=now, last_timestamp=now, count=1,
            source=c.V1EventSource(component=self.component), reporting_component=f"gpufleet.io/{self.component}",
            reporting_instance=self.component)
        try:
            self.core.create_namespaced_event(namespace, ev)
        except Exception as exc:  # the action stands without its event
            log.warning("event on %s/%s failed: %s", namespace, name, exc)

    def _status(self, exc: Exception) -> int | None:
        return getattr(exc, "status", None)

    def warn(self, namespace: str, name: str, warned_at: str, message: str) -> str:
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {ann.IDLE_WARNING: warned_at}}})
        except Exception as exc:
            if self._status(exc) == 404:
                return "gone"
            raise
        self._event(namespace, name, "Warning", "GpuIdle", message)
        return "warned"

    def clear(self, namespace: str, name: str, message: str) -> str:
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {ann.IDLE_WARNING: None}}})
        except Exception as exc:
            if self._status(exc) == 404:
                return "gone"
            raise
        self._event(namespace, name, "Normal", "GpuBusyAgain", message)
        return "cleared"

    def evict(self, namespace: str, name: str, message: str) -> str:
        c = self._client
        body = c.V1Eviction(metadata=c.V1ObjectMeta(name=name, namespace=namespace))
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except Exception as exc:
            st = self._status(exc)
            if st == 429:
                return "blocked"  # a PodDisruptionBudget says no, right now
            if st == 404:
                return "gone"
            raise
        self._event(namespace, name, "Warning", "GpuIdleEvicted", message)
        return "evicted"
