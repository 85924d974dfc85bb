"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two replicas can run safely.

The decision logic (``LeaseElector.step``) is pure: it reads the lease record
through a small store protocol, so it is tested without a cluster; the
``KubernetesLeaseStore`` talks to the API server.  As in client-go, expiry is
judged by *this* replica's clock: a lease is free once its record has not
changed for ``lease_s`` since we first saw it, so clock skew between machines
does not matter.  Writes carry the resourceVersion read, so two candidates
cannot both win.  A leader that cannot renew for ``renew_deadline_s`` (shorter
than the lease) steps down on its own, before anyone else may take over.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)


@dataclass
class LeaseRecord:
    holder: str
    renew_time: float  # seconds since epoch, as written by the holder
    lease_s: int
    transitions: int = 0
    resource_version: str = ""
    acquire_time: float = 0.0


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None: ...
    def create(self, rec: LeaseRecord) -> bool: ...  # False if it exists
    def update(self, rec: LeaseRecord) -> bool: ...  # False on conflict


class LeaseElector:
    def __init__(self, store: LeaseStore, identity: str, lease_s: int = 15, renew_deadline_s: float = 10.0,
                 retry_s: float = 2.0, clock: Callable[[], float] | None = None,
                 wall_clock: Callable[[], float] | None = None):
        if not retry_s < renew_deadline_s < lease_s:
            raise ValueError("need retry_s < renew_deadline_s < lease_s")
        self.store = store
        self.identity = identity
        self.lease_s = lease_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_s = retry_s
        self.clock = clock or time.monotonic
        self.wall = wall_clock or clock or time.time
        self.is_leader = False
        self.term = 0  # goes up each time we become leader
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    def _lead(self, ok: bool, now: float) -> bool:
        if ok:
            self._renewed_at = now
            if not self.is_leader:
                self.term += 1
                log.info("%s became leader (term %d)", self.identity, self.term)
            self.is_leader = True
        else:
            if self.is_leader:
                log.warning("%s lost the lease", self.identity)
            self.is_leader = False
        return self.is_leader

    def step(self) -> bool:
        """Try to acquire or renew once; returns whether we lead now."""
        now = self.clock()
        wall = self.wall()
        rec = self.store.get()
        if rec is None:
            return self._lead(self.store.create(LeaseRecord(self.identity, wall, self.lease_s, 0, "", wall)), now)
        seen = (rec.holder, rec.renew_time, rec.resource_version)
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        if rec.holder == self.identity:
            return self._lead(self.store.update(replace(rec, renew_time=wall, lease_s=self.lease_s)), now)
        if rec.holder == "" or now - self._observed_at > rec.lease_s:
            new = LeaseRecord(self.identity, wall, self.lease_s, rec.transitions + 1, rec.resource_version, wall)
            return self._lead(self.store.update(new), now)
        return self._lead(False, now)

    def leading_now(self) -> bool:
        """Leading, and the last renewal is younger than the renew deadline: the fence every bind checks.

        ``is_leader`` changes only when the election thread ticks; a tick stuck in a slow lease call, or a
        paused process, would leave it True past the deadline.  A replica that cannot show a renewal within
        ``renew_deadline_s`` binds nothing more, so it stops before any other replica may take over
        (``lease_s`` after the last renewal it saw)."""
        return self.is_leader and self.clock() - self._renewed_at < self.renew_deadline_s

    def tick(self) -> bool:
        """``step`` that survives API errors: a leader keeps leading until its renew deadline passes."""
        try:
            return self.step()
        except Exception as exc:
            log.warning("lease %s: %s", self.identity, exc)
            if self.is_leader and self.clock() - self._renewed_at > self.renew_deadline_s:
                self._lead(False, self.clock())
            return self.is_leader

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.tick()
            stop.wait(self.retry_s)

    def release(self) -> None:
        """Give the lease up (on shutdown) so a standby takes over at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            rec = self.store.get()
            if rec and rec.holder == self.identity:
                self.store.update(replace(rec, holder="", renew_time=self.wall(), lease_s=1))
        except Exception as exc:
            log.warning("could not release the lease: %s", exc)


class MemoryLeaseStore:
    """One shared lease in memory (tests, single-process runs)."""

    def __init__(self) -> None:
        self.rec: LeaseRecord | None = None
        self._v = 0
        self.fail = 0  # the next N calls raise, like an unreachable apiserver
        self._lock = threading.Lock()

    def _maybe_fail(self) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError("injected lease API failure")

    def get(self) -> LeaseRecord | None:
        with self._lock:
            self._maybe_fail()
            return None if self.rec is None else replace(self.rec)

    def create(self, rec: LeaseRecord) -> bool:
        with self._lock:
            self._maybe_fail()
            if self.rec is not None:
                return False
            self._v += 1
            self.rec = replace(rec, resource_version=str(self._v))
            return True

    def update(self, rec: LeaseRecord) -> bool:
        with self._lock:
            self._maybe_fail()
            if self.rec is None or rec.resource_version != self.rec.resource_version:
                return False
            self._v += 1
            self.rec = replace(rec, resource_version=str(self._v))
            return True


def _ts(s: str | None) -> float:
    if not s:
        return 0.0
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


class KubernetesLeaseStore:
    """The Lease object through the official client (raw JSON, MicroTime timestamps)."""

    def __init__(self, api_client, name: str, namespace: str) -> None:
        from kubernetes import client

        # Any: raw dict bodies and _preload_content=False replies, which the client's annotations do not describe
        self.api: Any = client.CoordinationV1Api(api_client)
        self.name, self.namespace = name, namespace

    def get(self) -> LeaseRecord | None:
        import json

        from kubernetes.client.exceptions import ApiException

        try:
            r = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False, _request_timeout=10)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        lease = json.loads(r.data)
        s = lease.get("spec") or {}
        return LeaseRecord(s.get("holderIdentity") or "", _ts(s.get("renewTime")), int(s.get("leaseDurationSeconds") or 15),
                           int(s.get("leaseTransitions") or 0), lease["metadata"]["resourceVersion"], _ts(s.get("acquireTime")))

    def _body(self, rec: LeaseRecord) -> dict:
        def mt(t: float) -> str:
            return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        meta = {"name": self.name, "namespace": self.namespace}
        if rec.resource_version:
            meta["resourceVersion"] = rec.resource_version
        spec = {"holderIdentity": rec.holder, "leaseDurationSeconds": rec.lease_s, "renewTime": mt(rec.renew_time),
                "acquireTime": mt(rec.acquire_time or rec.renew_time), "leaseTransitions": rec.transitions}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def create(self, rec: LeaseRecord) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_lease(self.namespace, self._body(rec), _preload_content=False, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def update(self, rec: LeaseRecord) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, self._body(rec), _preload_content=False, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
