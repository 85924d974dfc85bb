"""DRA in the live scheduler: what the loop, its cache and its binder call (a few narrow hooks).

``LiveDra`` owns the DRA objects (``DraCache``) and the claim writer (``ClaimWriter``) and answers:

* the cache: which DRA kinds to list and watch (the API may not serve ``resource.k8s.io/v1``, or RBAC may
  not allow it: then the scheduler works without DRA, as without queues), what a watch event changes in
  the snapshot (nodes whose slices changed, claims whose allocation came or went), a node's GPUs, a pod's
  claims, a bound pod's claims;
* the binder: the claim writes to run on the bind worker before the Binding (``plan_job``) and what to do
  when the bind ends (``finish``: holds of allocations never written are given back, a reservation
  written for a bind that failed is taken back);
* the cycle: a pod that cannot be placed while one of its claims is allocated for nobody (an earlier
  attempt's) gets that claim deallocated (``deallocate_stale``), as kube-scheduler's PostFilter does.

All of it runs on the loop's thread except ``ClaimWriter.run`` (bind workers), which only reads the
plan it was given.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Callable, Mapping

from ...engine.dra.objects import FINALIZER
from ...engine.dra.plugin import ensure_dra
from ...engine.framework import Profile
from ...engine.model import Assignment, PodRequest
from ...engine.state import ClusterState
from ..api import ApiError, NotFound, SchedulerApi
from .cache import KINDS, DraCache, Emit
from .extended import claim_body, status_patch
from .writer import ClaimStep, ClaimWriter, WritePlan

log = logging.getLogger("gpufleet.kube.dra")


def with_dra(profile: Profile) -> Profile:
    """The profile with DynamicResources (preFilter, last filter, reserve) when it has none; the caller's is
    not changed."""
    p = replace(profile, pre_filters=list(profile.pre_filters), filters=list(profile.filters), reserves=list(profile.reserves))
    ensure_dra(p)
    return p


class LiveDra:
    def __init__(self, api: SchedulerApi, emit: Emit | None = None) -> None:
        self.api = api
        self.cache = DraCache(emit)
        self.writer = ClaimWriter(api)
        self.plans: dict[str, WritePlan] = {}  # pod -> its claim writes, until the bind's result is applied
        self._lock = threading.Lock()

    # --- list / watch ---------------------------------------------------------------------------
    @property
    def kinds(self) -> list[str]:
        return [k for k in KINDS if k not in self.cache.unserved]

    def resync(self, rv: dict[str, str]) -> None:
        for kind in KINDS:
            try:
                items, v = self.api.list_kind(kind)
            except (NotFound, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status != 403:
                    raise
                if kind not in self.cache.unserved:
                    log.warning("cannot list %s (%s: resource.k8s.io/v1 not served, or RBAC): working without DRA objects "
                                "of that kind", kind, exc)
                self.cache.unserved.add(kind)
                items, v = [], ""
            else:
                self.cache.unserved.discard(kind)
            self.cache.replace(kind, items)
            rv[kind] = v

    def event(self, state: ClusterState, kind: str, type_: str, obj: dict, refresh_node: Callable[[str], None]) -> bool:
        """A watch event (or ``replace`` with ``obj`` the list); True if waiting pods may fit now."""
        if type_ == "REPLACE":
            before = dict(self.cache.claims)
            nodes = self.cache.replace(kind, obj["items"])
            keys = set(before) | set(self.cache.claims)
        else:
            key = _key(obj)
            nodes = self.cache.handle(kind, type_, obj)
            keys = {key} if kind == "resourceclaim" else set()
        if kind == "resourceslice":
            for n in sorted(nodes):
                refresh_node(n)
            self._rehold(state, nodes)
            self.cache.recheck_claims()
        elif kind == "resourceclaim":
            for k in keys:
                self.cache.claim_changed(state, k, None)
        return True

    def _rehold(self, state: ClusterState, nodes: set[str] | None = None) -> None:
        """Holds computed against an older device table (a node's devices or GPUs changed): again."""
        if state.dra is None:
            return
        state.dra.catalog = self.cache.catalog  # a relisted kind may have replaced the catalog
        table = self.cache.catalog.table(state)
        for key, h in list(state.claim_holds.items()):
            if h.allocation is not None and (nodes is None or h.node in nodes or h.node is None):
                state.hold_claim(table.hold_for(key, h.node, h.allocation, state))

    # --- the cache's questions --------------------------------------------------------------------
    def attach(self, state: ClusterState) -> None:
        self.cache.attach(state)

    def resolve(self, pod: Mapping, r: PodRequest, state: ClusterState) -> PodRequest:
        return self.cache.resolve(pod, r, state)

    def bound_claims(self, pod: Mapping, a: Assignment, state: ClusterState) -> Assignment:
        """A bound pod's assignment with the claims it uses and what they hold for its queue (a claim shared by several
        pods split between them); one whose extended resources came from DRA holds no device-plugin GPUs."""
        keys = self.cache.pod_claim_keys(pod)
        if (pod.get("status") or {}).get("extendedResourceClaimStatus"):
            a = replace(a, gpu_indices=(), gpu_milli=0, gpu_memory_mib=())
        if not keys:
            return a
        use: dict[str, int] = {}
        for k in keys:
            h = state.claim_holds.get(k)
            c = self.cache.claims.get(k)
            if h is None:
                continue
            users = max(1, len(c.reserved_for) if c is not None else 1)
            for _, milli, mib in h.gpus:
                use["gpu_milli"] = use.get("gpu_milli", 0) + milli // users
                use["gpu_memory_mib"] = use.get("gpu_memory_mib", 0) + mib // users
            for prof, _ in h.mig:
                use[f"mig:{prof}"] = use.get(f"mig:{prof}", 0) + 1
        return replace(a, claims=keys, dra_usage=tuple(sorted(use.items())))

    # --- binding ----------------------------------------------------------------------------------
    def plan_job(self, state: ClusterState, key: str, pod: dict, a: Assignment) -> Callable[[], None] | None:
        """The claim writes for a pod about to be bound (None: nothing to write); runs on the bind worker."""
        if not a.claims:
            return None
        m = pod.get("metadata") or {}
        plan = WritePlan(key, str(m.get("name")), str(m.get("uid") or ""), a.node)
        ext = self.cache.extended_for(pod)
        for ck in a.claims:
            c = self.cache.claims.get(ck)
            raw = self.cache.raw["resourceclaim"].get(ck)
            if ext is not None and ck == ext.key and c is None:  # extended resources backed by DRA: create the claim
                h = state.claim_holds.get(ck)
                if h is None or h.allocation is None:
                    continue
                ns, name = ck.split("/", 1)
                plan.steps.append(ClaimStep(ck, ns, name, {}, h.allocation, create=claim_body(ext, pod, FINALIZER)))
                plan.pod_status = status_patch(ext)
                continue
            if c is None or raw is None:
                continue
            if c.allocation is not None and c.reserved_by(plan.pod_uid):
                continue  # written before (a retried bind)
            h = state.claim_holds.get(ck)
            ns, name = ck.split("/", 1)
            plan.steps.append(ClaimStep(ck, ns, name, raw, h.allocation if c.allocation is None and h is not None else None))
        if not plan.steps:
            return None
        plan.in_flight = self.cache.begin(state, key, [s.key for s in plan.steps if s.allocation is not None])
        self.plans[key] = plan
        return lambda: self.writer.run(plan)

    def finish(self, state: ClusterState, key: str, bound: bool) -> bool:
        """A pod's bind ended (or the pod went); True if that gave devices back."""
        plan = self.plans.pop(key, None)
        if plan is None:
            return False
        for s in plan.steps:  # what the writes returned is known from now on, whatever the watch still delivers
            if s.result is not None:
                self.cache.claim_changed(state, self.cache.assume(s.result), None)
        done = self.cache.end(key, plan.in_flight)
        freed = False
        if not bound:
            for s in plan.steps:
                if s.create is not None and (s.created or s.written):
                    self._quietly(self.writer.delete_claim, s.namespace, s.name)  # made for this attempt: deleted
                elif s.written:
                    self._quietly(self.writer.unreserve, s, plan.pod_uid)
            for ck in done:
                c = self.cache.claims.get(ck)
                if (c is None or c.allocation is None) and not state.claim_users.get(ck) and ck in state.claim_holds:
                    state.release_claim(ck)  # never written: the devices are free again
                    freed = True
        return freed

    def orphans(self, state: ClusterState, bound_pods: Mapping[str, dict]) -> list[str]:
        """Allocated claims every pod in whose ``reservedFor`` is gone: the resourceclaim controller deallocates them
        (not yet seen), so their devices are coming back."""
        out = []
        for key in state.claim_holds:
            c = self.cache.claims.get(key)
            if c is None or c.allocation is None or not c.reserved_for or key in self.cache.in_flight:
                continue
            if all(r.resource == "pods" and (bound_pods.get(f"{c.namespace}/{r.name}") or {}).get("metadata", {}).get("uid")
                   not in (r.uid,) for r in c.reserved_for) and not state.claim_users.get(key):
                out.append(key)
        return out

    def waiting_for_deallocation(self, sched, r: PodRequest, bound_pods: Mapping[str, dict]) -> str:
        """Why the pod waits instead of preempting: it fits once claims of pods that are gone are deallocated
        (kube-controller-manager's resourceclaim controller); "" when it does not.  Evicting more pods meanwhile
        would take room that is coming back anyway."""
        state = sched.state
        keys = self.orphans(state, bound_pods)
        if not keys:
            return ""
        released = [h for h in (state.release_claim(k) for k in keys) if h is not None]
        try:
            fits = sched.decide(sched.new_cycle(r)).ok
        finally:
            for h in released:
                state.hold_claim(h)
        if not fits:
            return ""
        shown = ", ".join(sorted(keys)[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        return (f"waiting for ResourceClaim(s) {shown} of pods that are gone to be deallocated "
                f"(kube-controller-manager's resourceclaim controller); no pod is preempted for it meanwhile")

    @staticmethod
    def _quietly(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the pod is tried again; the controller removes what is left
            log.warning("cleaning up after a failed bind: %s", exc)

    def deallocate_stale(self, pod: Mapping, r: PodRequest) -> bool:
        """The pod does not fit while one of its claims is allocated (an earlier attempt) and reserved for no other
        pod: deallocate that claim so the next attempt may allocate it anywhere; an extended-resource claim of an
        earlier attempt is deleted.  True if one was."""
        if r.dra is None:
            return False
        ext = r.dra.extended
        if ext is not None and ext.stale:
            try:
                self.writer.delete_claim(ext.claim.namespace, ext.claim.name)
                log.info("deleted extended-resource claim %s of an earlier attempt of pod %s", ext.key, r.key)
                return True
            except Exception as exc:
                log.warning("deleting claim %s failed: %s", ext.key, exc)
                return False
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        for pc in r.dra.claims:
            c = pc.claim
            if c is None or c.allocation is None or c.key in self.cache.in_flight:
                continue
            if any(ref.uid != uid for ref in c.reserved_for):
                continue
            try:
                if self.writer.deallocate(c.namespace, c.name, uid):
                    log.info("deallocated claim %s: pod %s cannot run where it was allocated", c.key, r.key)
                    return True
            except Exception as exc:
                log.warning("deallocating claim %s failed: %s", c.key, exc)
        return False


def _key(obj: dict) -> str:
    m = obj.get("metadata") or {}
    return f"{m['namespace']}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))


__all__ = ["LiveDra", "with_dra"]
