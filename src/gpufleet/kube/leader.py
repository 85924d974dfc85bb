"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two replicas can run safely.

The decision logic (``LeaseElector.step``) is pure: it reads the lease record
through a small store protocol, so it is tested without a cluster; the
``KubernetesLeaseStore`` talks to the API server.  A leader renews every
``renew_s``; a lease not renewed for ``lease_s`` may be taken over.  Updates
carry the resourceVersion read, so two candidates cannot both win.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass
class LeaseRecord:
    holder: str
    renew_time: float  # seconds since epoch
    lease_s: int
    transitions: int = 0
    resource_version: str = ""


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None: ...
    def create(self, rec: LeaseRecord) -> bool: ...
    def update(self, rec: LeaseRecord) -> bool: ...  # False on conflict


class LeaseElector:
    def __init__(self, store: LeaseStore, identity: str, lease_s: int = 15, clock: Callable[[], float] | None = None):
        import time

        self.store = store
        self.identity = identity
        self.lease_s = lease_s
        self.clock = clock or time.time
        self.is_leader = False

    def step(self) -> bool:
        """Try to acquire or renew; returns whether we lead now."""
        now = self.clock()
        rec = self.store.get()
        if rec is None:
            self.is_leader = self.store.create(LeaseRecord(self.identity, now, self.lease_s))
            return self.is_leader
        if rec.holder == self.identity or rec.holder == "" or now - rec.renew_time > rec.lease_s:
            taken_over = rec.holder != self.identity
            new = LeaseRecord(self.identity, now, self.lease_s, rec.transitions + (1 if taken_over else 0), rec.resource_version)
            self.is_leader = self.store.update(new)
            return self.is_leader
        self.is_leader = False
        return False

    def release(self) -> None:
        if not self.is_leader:
            return
        rec = self.store.get()
        if rec and rec.holder == self.identity:
            self.store.update(LeaseRecord("", 0.0, rec.lease_s, rec.transitions, rec.resource_version))
        self.is_leader = False


class MemoryLeaseStore:
    """One shared lease in memory (tests, single-process runs)."""

    def __init__(self) -> None:
        self.rec: LeaseRecord | None = None
        self._v = 0

    def get(self) -> LeaseRecord | None:
        return None if self.rec is None else LeaseRecord(**self.rec.__dict__)

    def create(self, rec: LeaseRecord) -> bool:
        if self.rec is not None:
            return False
        self._v += 1
        self.rec = LeaseRecord(**{**rec.__dict__, "resource_version": str(self._v)})
        return True

    def update(self, rec: LeaseRecord) -> bool:
        if self.rec is None or rec.resource_version != self.rec.resource_version:
            return False
        self._v += 1
        self.rec = LeaseRecord(**{**rec.__dict__, "resource_version": str(self._v)})
        return True


class KubernetesLeaseStore:
    def __init__(self, api_client, name: str, namespace: str) -> None:
        from kubernetes import client

        self.c = client
        self.api = client.CoordinationV1Api(api_client)
        self.name, self.namespace = name, namespace

    def get(self) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        s = lease.spec
        renew = s.renew_time.timestamp() if s.renew_time else 0.0
        return LeaseRecord(s.holder_identity or "", renew, s.lease_duration_seconds or 15, s.lease_transitions or 0,
                           lease.metadata.resource_version)

    def _body(self, rec: LeaseRecord):
        t = dt.datetime.fromtimestamp(rec.renew_time, dt.timezone.utc)
        return self.c.V1Lease(
            metadata=self.c.V1ObjectMeta(name=self.name, namespace=self.namespace, resource_version=rec.resource_version or None),
            spec=self.c.V1LeaseSpec(holder_identity=rec.holder, lease_duration_seconds=rec.lease_s, renew_time=t,
                                    acquire_time=t, lease_transitions=rec.transitions),
        )

    def create(self, rec: LeaseRecord) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_lease(self.namespace, self._body(rec))
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def update(self, rec: LeaseRecord) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, self._body(rec))
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
