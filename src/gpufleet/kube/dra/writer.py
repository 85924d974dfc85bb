"""Writing a pod's claims before its Binding, as kube-scheduler 1.37's DynamicResources PreBind does.

Why before the bind: kubelet prepares a pod's claims from their ``status.allocation`` and refuses to run
a pod that is not in a claim's ``status.reservedFor``; the resourceclaim controller deallocates a claim
(clears the allocation, removes the finalizer) when its last consumer goes.  So for every claim of the
pod, on the bind worker, before the Binding:

1. a claim we allocated gets the finalizer ``resource.kubernetes.io/delete-protection`` (an update of
   the object: a status write cannot change metadata), then ``status.allocation`` (devices.results with
   request / driver / pool / device, ``shareID`` and ``consumedCapacity`` for shares, the config, the
   node selector, ``allocationTimestamp``) and ``status.reservedFor`` gaining the pod, in one write of
   the status subresource (RBAC: ``resourceclaims`` update/patch, ``resourceclaims/status`` and, with
   DRAResourceClaimGranularStatusAuthorization, ``resourceclaims/binding``);
2. a claim already allocated (shared with a pod placed before) only gains the pod in ``reservedFor``.

Every write carries the resourceVersion it was based on; on a conflict the claim is read again and the
step retried (five times): a claim that meanwhile got *the same* devices (another pod of ours sharing it
wrote first) only gains the reservation; one allocated elsewhere, deleted or being deleted fails the
pod's bind (it goes back to the queue; the watch brings the claim as it is).

When the bind fails after a reservation was written, the pod is taken out of ``reservedFor`` again
(kube-scheduler's Unreserve); the allocation stays, and the pod is tried again on its node (a claim
that cannot be used there is deallocated by ``DraLoop.deallocate_stale``, kube-scheduler's PostFilter).
"""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...engine.dra.objects import FINALIZER, Allocation, InvalidDraObject, parse_claim
from ..api import Conflict, NotFound
from .cache import same_devices

if TYPE_CHECKING:
    from ..api import SchedulerApi

log = logging.getLogger("gpufleet.kube.dra")
KIND = "resourceclaim"
RETRIES = 5


class ClaimWriteError(Exception):
    """A claim could not be written; the message names the claim and why."""


@dataclass
class ClaimStep:
    key: str
    namespace: str
    name: str
    raw: dict  # the claim as last listed (its resourceVersion is the first write's precondition)
    allocation: Allocation | None  # ours to write; None: the claim is allocated already, reserve only
    create: dict | None = None  # the claim to create first (extended resources backed by DRA)
    written: bool = False  # the pod is in the claim's reservedFor (by this plan)
    result: dict | None = None  # the claim as the API returned it after the last write (the watch may show it later)
    allocated: bool = False  # this plan wrote the allocation
    created: bool = False  # this plan created the claim


@dataclass
class WritePlan:
    pod_key: str
    pod_name: str
    pod_uid: str
    node: str
    pod_status: dict | None = None  # pods/status patch after the claims (status.extendedResourceClaimStatus)
    steps: list[ClaimStep] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)  # claim keys registered as in flight (DraCache.begin)
    error: str = ""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClaimWriter:
    """Runs ``WritePlan`` s on the bind workers; see the module docstring."""

    def __init__(self, api: "SchedulerApi") -> None:
        self.api = api
        self.writes = 0  # API writes made (finalizers, statuses), for tests and benchmarks
        self._lock = threading.Lock()

    def run(self, plan: WritePlan) -> None:
        """Write every claim of the plan (worker thread); raises ``ClaimWriteError`` at the first that fails."""
        ref = {"resource": "pods", "name": plan.pod_name, "uid": plan.pod_uid}
        for step in plan.steps:
            try:
                self._one(step, ref)
            except ClaimWriteError as exc:
                plan.error = str(exc)
                raise
            except Exception as exc:  # timeouts, resets, apiserver errors
                plan.error = f"claim {step.key}: {type(exc).__name__}: {exc}"
                raise ClaimWriteError(plan.error) from exc
        if plan.pod_status is not None:
            ns = plan.pod_key.split("/", 1)[0]
            try:
                self.api.patch_pod_status(ns, plan.pod_name, plan.pod_status)
            except Exception as exc:
                plan.error = f"pod {plan.pod_key}: writing status.extendedResourceClaimStatus: {type(exc).__name__}: {exc}"
                raise ClaimWriteError(plan.error) from exc
            self._count()

    def _create(self, step: ClaimStep, ref: dict) -> dict:
        """Create the claim (with the finalizer); one left by an earlier try of the same pod is taken as it is."""
        assert step.create is not None
        try:
            claim = self.api.create_object(KIND, step.namespace, step.create)
        except Conflict:
            claim = self.api.get_object(KIND, step.namespace, step.name)  # type: ignore[assignment]
            owners = [o.get("uid") for o in ((claim or {}).get("metadata") or {}).get("ownerReferences") or []]
            if claim is None or ref["uid"] not in owners:
                raise ClaimWriteError(f"claim {step.key} exists and was not made for pod {ref['name']}") from None
            return claim
        self._count()
        step.created = True
        return claim

    def _count(self) -> None:
        with self._lock:
            self.writes += 1

    def _one(self, step: ClaimStep, ref: dict) -> None:
        claim = step.raw if step.create is None else self._create(step, ref)
        for attempt in range(RETRIES):
            if attempt:
                claim = self.api.get_object(KIND, step.namespace, step.name)  # type: ignore[assignment]
                if claim is None:
                    raise ClaimWriteError(f"claim {step.key} was deleted in the meantime")
            meta = claim.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                raise ClaimWriteError(f"claim {step.key} is being deleted")
            status = claim.get("status") or {}
            reserved = list(status.get("reservedFor") or [])
            try:
                current = parse_claim(claim).allocation
            except InvalidDraObject as exc:
                raise ClaimWriteError(f"claim {step.key} cannot be read: {exc}") from None
            patch_status: dict = {}
            if step.allocation is not None and current is None:
                fins = list(meta.get("finalizers") or [])
                if FINALIZER not in fins:  # a normal update: status writes cannot change metadata
                    try:
                        claim = self.api.patch_object(KIND, step.namespace, step.name, {"metadata": {
                            "finalizers": fins + [FINALIZER], "resourceVersion": meta.get("resourceVersion")}})
                    except Conflict:
                        continue
                    self._count()
                alloc = step.allocation.to_api()
                alloc["allocationTimestamp"] = _now()  # DRADeviceBindingConditions (beta, on in 1.37) has kube-scheduler write it
                patch_status["allocation"] = alloc
            elif step.allocation is not None and current is not None and not same_devices(current, step.allocation):
                raise ClaimWriteError(f"claim {step.key} got allocated elsewhere in the meantime")
            elif current is None:
                raise ClaimWriteError(f"claim {step.key} got deallocated in the meantime")
            if any(r.get("uid") == ref["uid"] for r in reserved if isinstance(r, dict)):
                if not patch_status:
                    step.written = True
                    return
            else:
                reserved.append(ref)
            patch_status["reservedFor"] = reserved
            rv = (claim.get("metadata") or {}).get("resourceVersion")
            try:
                step.result = self.api.patch_object(KIND, step.namespace, step.name,
                                                    {"metadata": {"resourceVersion": rv}, "status": patch_status}, "status")
            except Conflict:
                continue
            except NotFound:
                raise ClaimWriteError(f"claim {step.key} was deleted in the meantime") from None
            self._count()
            step.written = True
            step.allocated = "allocation" in patch_status
            return
        raise ClaimWriteError(f"claim {step.key}: still conflicting after {RETRIES} attempts")

    def unreserve(self, step: ClaimStep, pod_uid: str) -> None:
        """Take the pod out of the claim's ``reservedFor`` again (its bind failed); best effort."""
        for _ in range(RETRIES):
            claim = self.api.get_object(KIND, step.namespace, step.name)
            if claim is None:
                return
            reserved = [r for r in (claim.get("status") or {}).get("reservedFor") or [] if not (isinstance(r, dict) and r.get("uid") == pod_uid)]
            if len(reserved) == len((claim.get("status") or {}).get("reservedFor") or []):
                return
            try:
                self.api.patch_object(KIND, step.namespace, step.name, {
                    "metadata": {"resourceVersion": claim["metadata"].get("resourceVersion")},
                    "status": {"reservedFor": reserved or None}}, "status")
                return
            except Conflict:
                continue
            except Exception as exc:  # the pod is tried again; a stale reservation goes with the pod (controller)
                log.warning("taking pod %s out of claim %s's reservedFor failed: %s", pod_uid, step.key, exc)
                return

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a claim a pod no longer needs (its extended-resource claim after a failed attempt): the finalizer
        first, then the object (kube-scheduler's deleteClaim)."""
        for _ in range(RETRIES):
            claim = self.api.get_object(KIND, namespace, name)
            if claim is None:
                return
            fins = [f for f in (claim.get("metadata") or {}).get("finalizers") or [] if f != FINALIZER]
            try:
                self.api.patch_object(KIND, namespace, name, {"metadata": {
                    "finalizers": fins or None, "resourceVersion": claim["metadata"].get("resourceVersion")}})
                break
            except Conflict:
                continue
            except NotFound:
                return
        try:
            self.api.delete_namespaced(KIND, namespace, name)
        except NotFound:
            pass

    def deallocate(self, namespace: str, name: str, pod_uid: str) -> bool:
        """kube-scheduler's PostFilter: a claim allocated for a pod that cannot run there, reserved by nobody else,
        loses its allocation (the finalizer goes with it).  True if it was deallocated."""
        claim = self.api.get_object(KIND, namespace, name)
        if claim is None:
            return False
        st = claim.get("status") or {}
        others = [r for r in st.get("reservedFor") or [] if not (isinstance(r, dict) and r.get("uid") == pod_uid)]
        if st.get("allocation") is None or others:
            return False
        rv = claim["metadata"].get("resourceVersion")
        try:
            claim = self.api.patch_object(KIND, namespace, name, {"metadata": {"resourceVersion": rv},
                                                                  "status": {"allocation": None, "reservedFor": None}}, "status")
        except (Conflict, NotFound):
            return False
        fins = [f for f in (claim.get("metadata") or {}).get("finalizers") or [] if f != FINALIZER]
        try:
            self.api.patch_object(KIND, namespace, name, {"metadata": {"finalizers": fins or None,
                                                                       "resourceVersion": claim["metadata"].get("resourceVersion")}})
        except (Conflict, NotFound):
            pass  # the resourceclaim controller removes it too
        return True


__all__ = ["ClaimStep", "ClaimWriteError", "ClaimWriter", "WritePlan"]
