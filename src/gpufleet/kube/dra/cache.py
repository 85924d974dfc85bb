"""The live scheduler's DRA objects: ResourceSlices, DeviceClasses, ResourceClaims and their templates from
list+watch, parsed once at the edge into the engine's typed objects, and what they mean for the snapshot.

Why here and not in ``kube/cache.py``: the scheduler cache only needs a few answers from DRA (a node's GPUs
when its ResourceSlices are its inventory, which claims a pod uses, which devices claims hold), and those
answers depend on four kinds of objects with their own rules; ``SchedulerCache`` asks through a few
narrow calls (``node_model``, ``attach``, ``resolve``, ``pod_claim_keys``, ``handle``).

* **Nodes**: a node whose agent runs in DRA mode carries no ``gpufleet.io/gpu-inventory`` annotation and
  kubelet advertises no ``nvidia.com/gpu``; its GPUs are the devices its slices publish as NVIDIA's and
  gpufleet's drivers do (``type`` gpu / mig, ``uuid``, ``parentUUID``, ``profile``, ``productName``,
  capacity ``memory``), from any driver, so the placement policies see its GPUs as on any other node.
* **Claims** (any scheduler's): every allocated claim holds its devices in the snapshot
  (``ClusterState.hold_claim``); a restarted scheduler rebuilds that from the claims alone.  Our own
  allocations between Reserve and the claim's status write are *in flight*: kept here, held again
  after a rebuild, and never released by a watch event that predates the write.
* **Pods**: ``resolve`` finds each of ``spec.resourceClaims`` (a named claim, or the one the
  resourceclaim controller created from a template, named in ``status.resourceClaimStatuses`` and owned by
  the pod) and writes what they ask for into the GPU fields (``engine/dra/shape.py``).

Bad input never stops the rest: a slice, class, claim or template that cannot be parsed is left out
with a Warning event naming the object and the field (once per distinct reason); a device with a
malformed attribute is left out of allocation (its slice serves); a claim allocated (by anyone) to a
device its pool no longer has gets an event naming the claim, the result and the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from collections.abc import Callable, Iterable, Mapping  # collections.abc: isinstance checks without typing's detour

from ...engine.dra.objects import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    Allocation,
    DeviceClass,
    InvalidDraObject,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    parse_claim,
    parse_claim_template,
    parse_device_class,
    parse_slice,
)
from ...engine.dra.extended import ExtendedClaim
from ...engine.dra.pods import PodClaim, PodClaims, request_with
from ...engine.dra.shape import claims_gpu_shape
from ...engine.dra.usage import ClaimHold, DraCatalog, DraState
from ...engine.gpu_models import lookup
from ...engine.model import Gpu, MigInstance, Node, PodRequest
from ...engine.state import ClusterState
from ..api import DRA_KINDS, object_key
from .extended import extended_claim, is_extended_name

log = logging.getLogger("gpufleet.kube.dra")
API_VERSION = "resource.k8s.io/v1"
MIB = 2**20
KINDS = tuple(DRA_KINDS)  # resourceslice, deviceclass, resourceclaim, resourceclaimtemplate
_KIND_NAMES = {"resourceslice": "ResourceSlice", "deviceclass": "DeviceClass", "resourceclaim": "ResourceClaim",
               "resourceclaimtemplate": "ResourceClaimTemplate"}

Emit = Callable[[dict, str, str, str], None]  # (object reference, type, reason, message): an Event


def object_ref(kind: str, obj: Mapping) -> dict:
    """What an Event names as ``regarding``: kind, apiVersion, name, namespace, uid."""
    m = obj.get("metadata") or {}
    meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if m.get(k)}
    return {"kind": _KIND_NAMES.get(kind, kind), "apiVersion": API_VERSION, "metadata": meta}


@dataclass
class InFlight:
    """An allocation we made, not yet written to its claim (Reserve .. PreBind): the pods writing it, its hold."""

    hold: ClaimHold
    pods: set[str]


class DraCache:
    """DRA objects as listed and watched, and the snapshot's view of them; see the module docstring."""

    def __init__(self, emit: Emit | None = None) -> None:
        self.emit = emit or (lambda ref, t, r, m: None)
        self.raw: dict[str, dict[str, dict]] = {k: {} for k in KINDS}  # kind -> key -> object as read
        self.claims: dict[str, ResourceClaim] = {}
        self.templates: dict[str, ResourceClaimTemplate] = {}
        self.invalid: dict[str, str] = {}  # "Kind key" -> why it is left out (claims, templates, classes)
        self.unserved: set[str] = set()
        self.catalog = DraCatalog()
        self.in_flight: dict[str, InFlight] = {}
        # claims we wrote, as the API returned them, until the watch shows that version: an older event (the finalizer's
        # update, before the allocation) must not undo what we know (kube-scheduler's assume cache)
        self.assumed: dict[str, int] = {}
        self._node_gpus: dict[str, tuple[Gpu, ...]] = {}
        self._reported: dict[str, str] = {}
        self._missing_devices: dict[str, str] = {}  # claim key -> the device problem reported
        self._mapped: tuple[object, dict[str, DeviceClass]] = (None, {})  # (catalog version, extended name -> class)
        self._ext: dict[str, tuple[tuple, ExtendedClaim | None]] = {}  # pod uid -> ((rv, mapping version), its claim)

    # --- events ---------------------------------------------------------------------------------
    def report(self, kind: str, obj: Mapping, reason: str, message: str) -> None:
        """A Warning event about a DRA object, once per distinct message."""
        what = f"{_KIND_NAMES[kind]} {object_key(dict(obj))}"
        if self._reported.get(what) == message:
            return
        self._reported[what] = message
        log.warning("%s: %s", what, message)
        self.emit(object_ref(kind, obj), "Warning", reason, message)

    # --- list and watch -------------------------------------------------------------------------
    def replace(self, kind: str, items: Iterable[dict]) -> set[str]:
        """A full list of one kind; returns the nodes whose GPUs may have changed."""
        new = {object_key(o): o for o in items}
        if kind == "resourceclaim":  # a list older than a claim we wrote keeps what the write returned
            for key, rv in list(self.assumed.items()):
                o = new.get(key)
                if o is not None and (_rv(o) or 0) < rv and key in self.raw[kind]:
                    new[key] = self.raw[kind][key]
                else:
                    del self.assumed[key]
        old = self.raw[kind]
        self.raw[kind] = new
        if kind == "resourceslice":
            slices = []
            for o in new.values():
                s = self._parse_slice(o)
                if s is not None:
                    slices.append(s)
            classes = list(self.catalog.classes.values())
            self.catalog = DraCatalog(slices, classes)
            self._node_gpus.clear()
            return {n for n in self._slice_nodes(old.values())} | {n for n in self._slice_nodes(new.values())}
        if kind == "deviceclass":
            for name in list(self.catalog.classes):
                if name not in new:
                    self.catalog.remove_class(name)
            for o in new.values():
                self._apply_class(o)
            return set()
        for key in set(old) - set(new):
            self._forget(kind, key)
        for o in new.values():
            self._apply(kind, o)
        return set()

    def handle(self, kind: str, type_: str, obj: dict) -> set[str]:
        """A watch event; returns the nodes whose GPUs may have changed (slices)."""
        key = object_key(obj)
        if type_ == "DELETED":
            if kind == "resourceclaim":
                self.assumed.pop(key, None)
            old = self.raw[kind].pop(key, None)
            if kind == "resourceslice":
                self.catalog.remove_slice(key)
                return self._slice_nodes([old or obj])
            if kind == "deviceclass":
                self.catalog.remove_class(key)
                return set()
            self._forget(kind, key)
            return set()
        if kind == "resourceclaim" and key in self.assumed:
            rv = _rv(obj)
            if rv is not None and rv < self.assumed[key]:
                return set()  # older than what our write returned
            del self.assumed[key]
        old = self.raw[kind].get(key)
        self.raw[kind][key] = obj
        if kind == "resourceslice":
            s = self._parse_slice(obj)
            if s is None:
                self.catalog.remove_slice(key)
            else:
                self.catalog.update_slice(s)
            return self._slice_nodes([obj] + ([old] if old else []))
        if kind == "deviceclass":
            self._apply_class(obj)
            return set()
        self._apply(kind, obj)
        return set()

    def _slice_nodes(self, objs: Iterable[dict | None]) -> set[str]:
        out = set()
        for o in objs:
            n = ((o or {}).get("spec") or {}).get("nodeName")
            if isinstance(n, str) and n:
                out.add(n)
                self._node_gpus.pop(n, None)
        return out

    def _parse_slice(self, o: dict) -> ResourceSlice | None:
        try:
            s = parse_slice(o)
        except InvalidDraObject as exc:
            self.report("resourceslice", o, "InvalidResourceSlice", f"{exc}; the slice is left out")
            return None
        if s.problems:
            self.report("resourceslice", o, "InvalidDevice", "; ".join(str(p) for p in s.problems)
                        + f" ({len(s.problems)} device(s) left out of allocation, the rest of the slice serves)")
        return s

    def _apply_class(self, o: dict) -> None:
        key = object_key(o)
        try:
            c = parse_device_class(o)
        except InvalidDraObject as exc:
            self.invalid[f"DeviceClass {key}"] = str(exc)
            self.catalog.remove_class(key)
            self.report("deviceclass", o, "InvalidDeviceClass", f"{exc}; claims using it cannot be allocated")
            return
        self.invalid.pop(f"DeviceClass {key}", None)
        if self.catalog.classes.get(key) != c or self.catalog.classes[key].config != c.config:
            self.catalog.set_class(c)

    def _apply(self, kind: str, o: dict) -> None:
        key = object_key(o)
        if kind == "resourceclaimtemplate":
            try:
                self.templates[key] = parse_claim_template(o)
                self.invalid.pop(f"ResourceClaimTemplate {key}", None)
            except InvalidDraObject as exc:
                self.templates.pop(key, None)
                self.invalid[f"ResourceClaimTemplate {key}"] = str(exc)
                self.report(kind, o, "InvalidResourceClaimTemplate", str(exc))
            return
        try:
            c = parse_claim(o)
        except InvalidDraObject as exc:
            self.invalid[f"ResourceClaim {key}"] = str(exc)
            self.report(kind, o, "InvalidResourceClaim", f"{exc}; pods using it wait")
            self.claims.pop(key, None)
            return
        self.invalid.pop(f"ResourceClaim {key}", None)
        self.claims[key] = c

    def assume(self, obj: dict) -> str:
        """A claim as our write returned it: known now, before the watch shows it (older events are then ignored)."""
        key = object_key(obj)
        rv = _rv(obj)
        if rv is None:
            return key
        cur = _rv(self.raw["resourceclaim"].get(key) or {})
        if cur is not None and cur >= rv:
            return key  # the watch was first
        self.assumed[key] = rv
        self.raw["resourceclaim"][key] = obj
        self._apply("resourceclaim", obj)
        return key

    def _forget(self, kind: str, key: str) -> None:
        if kind == "resourceclaimtemplate":
            self.templates.pop(key, None)
        else:
            self.claims.pop(key, None)
        self.invalid.pop(f"{_KIND_NAMES[kind]} {key}", None)

    # --- nodes ------------------------------------------------------------------------------------
    def node_gpus(self, node: str) -> tuple[Gpu, ...]:
        """The GPUs a node's slices publish (whole GPUs and MIG-mode GPUs with their instances), by index."""
        got = self._node_gpus.get(node)
        if got is not None:
            return got
        inv = self.catalog.inventory
        whole: dict[str, tuple[int, str, int]] = {}  # uuid -> (index, model, MiB)
        migs: dict[str, list[tuple[int, str, str, int, str]]] = {}  # parent uuid -> [(index, model, profile, MiB, name)]
        for pid in inv.by_node.get(node, []):
            p = inv.pools[pid]
            for s in p.slices:
                if s.node_name != node:
                    continue
                for d in s.devices:
                    if d.problem:
                        continue
                    kind = _attr(d, s.driver, "type")
                    mem = d.capacity.get("memory")
                    mib = int(mem.value) // MIB if mem is not None else 0
                    idx = _attr(d, s.driver, "index")
                    index = int(idx) if isinstance(idx, int) else 1 << 30
                    model = str(_attr(d, s.driver, "productName") or "unknown-gpu")
                    if kind == "gpu" and _attr(d, s.driver, "uuid"):
                        whole.setdefault(str(_attr(d, s.driver, "uuid")), (index, model, mib))
                    elif kind == "mig" and _attr(d, s.driver, "parentUUID") and _attr(d, s.driver, "profile"):
                        migs.setdefault(str(_attr(d, s.driver, "parentUUID")), []).append(
                            (index, model, str(_attr(d, s.driver, "profile")), mib, d.name))
        order = sorted([(v[0], u) for u, v in whole.items()] + [(v[0][0], u) for u, v in migs.items() if u not in whole])
        gpus = []
        for j, (_, u) in enumerate(order):
            if u in whole:
                _, model, mib = whole[u]
                gpus.append(Gpu(j, u, model, mib))
                continue
            insts = sorted(migs[u], key=lambda x: (x[2], x[4]))
            seen: dict[str, int] = {}
            mig_list = []
            for _, _, prof, mib, _ in insts:
                seen[prof] = seen.get(prof, 0) + 1
                mig_list.append(MigInstance(prof, mib, seen[prof]))
            model = insts[0][1]
            m = lookup(model)
            total = m.memory_mib if m is not None else sum(x.memory_mib for x in mig_list)
            gpus.append(Gpu(j, u, model, total, mig_enabled=True, mig_instances=tuple(mig_list)))
        got = self._node_gpus[node] = tuple(gpus)
        return got

    def node_model(self, n: Node, has_inventory: bool) -> Node:
        """A node without GPUs from an inventory annotation or a device plugin gets those its slices publish."""
        if n.gpus or has_inventory:
            return n
        gpus = self.node_gpus(n.name)
        return replace(n, gpus=gpus, gpu_slots=0) if gpus else n

    # --- the snapshot -------------------------------------------------------------------------------
    def attach(self, state: ClusterState) -> None:
        """DRA into a fresh snapshot: the catalog, every allocated claim's hold, our allocations in flight."""
        state.dra = DraState(self.catalog)
        for c in self.claims.values():
            if c.allocation is not None:
                self._hold(state, c, c.allocation)
        for key, f in self.in_flight.items():
            if key not in state.claim_holds:
                state.hold_claim(f.hold)

    def _hold(self, state: ClusterState, c: ResourceClaim, alloc: Allocation) -> None:
        if state.dra is None:
            return
        table = state.dra.catalog.table(state)
        node = alloc.node_name
        if node is None:
            for r in alloc.results:
                k = table.index.get(r.device_id)
                if k is not None and table.node[k] >= 0:
                    node = state.nodes[int(table.node[k])].name
                    break
        state.hold_claim(table.hold_for(c.key, node, alloc, state))
        self._check_devices(c, alloc)

    def _check_devices(self, c: ResourceClaim, alloc: Allocation) -> None:
        """A claim allocated to a device its (published, complete) pool no longer has: an event on the claim."""
        inv = self.catalog.inventory
        for i, r in enumerate(alloc.results):
            p = inv.pools.get((r.driver, r.pool))
            if p is None or not p.complete or r.device_id in inv.devices:
                continue
            msg = (f"field status.allocation.devices.results[{i}].device: device {r.device} of pool {r.pool} (driver "
                   f"{r.driver}) is not published by the pool's ResourceSlices any more; the claim is counted as holding "
                   f"nothing there")
            if self._missing_devices.get(c.key) != msg:
                self._missing_devices[c.key] = msg
                self.report("resourceclaim", self.raw["resourceclaim"].get(c.key) or {"metadata": {"name": c.name, "namespace": c.namespace}},
                            "AllocatedDeviceMissing", msg)
            return
        self._missing_devices.pop(c.key, None)

    def claim_changed(self, state: ClusterState, key: str, before: ResourceClaim | None) -> bool:
        """Bring the snapshot's hold for claim ``key`` in step with the claim as now listed; True if room was freed."""
        c = self.claims.get(key)
        alloc = c.allocation if c is not None else None
        held = state.claim_holds.get(key)
        if alloc is not None:
            f = self.in_flight.get(key)
            if f is not None and f.hold.allocation is not None and not same_devices(f.hold.allocation, alloc):
                log.warning("claim %s was allocated by someone else while we were writing ours", key)
            if held is None or held.allocation is None or not same_devices(held.allocation, alloc):
                self._hold(state, c, alloc)  # type: ignore[arg-type]
            return False
        if held is not None and key not in self.in_flight:
            state.release_claim(key)
            return True
        return False

    def recheck_claims(self) -> None:
        """After slices changed: claims allocated to devices that are gone are reported."""
        for c in self.claims.values():
            if c.allocation is not None:
                self._check_devices(c, c.allocation)

    # --- pods ----------------------------------------------------------------------------------------
    def has_claims(self, pod: Mapping) -> bool:
        return bool((pod.get("spec") or {}).get("resourceClaims"))

    def pod_claims(self, pod: Mapping, extended: ExtendedClaim | None = None) -> PodClaims:
        """Each of the pod's ``spec.resourceClaims``, found (or why not yet)."""
        m = pod.get("metadata") or {}
        ns = m.get("namespace") or "default"
        uid = str(m.get("uid") or "")
        statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or [] if isinstance(s, Mapping)}
        out = []
        for i, pc in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
            if not isinstance(pc, Mapping):
                continue
            name = str(pc.get("name") or "")
            direct = pc.get("resourceClaimName")
            template = pc.get("resourceClaimTemplateName")
            if direct:
                out.append(self._found(ns, str(direct), name, None))
            elif template:
                st = statuses.get(name)
                if st is None:
                    why = self.invalid.get(f"ResourceClaimTemplate {ns}/{template}")
                    if why is None and f"{ns}/{template}" not in self.templates:
                        why = f"ResourceClaimTemplate {ns}/{template} not found"
                    out.append(PodClaim(name, None, f"waiting for the ResourceClaim of spec.resourceClaims[{i}] ({name!r}) "
                                                    f"from template {template} (kube-controller-manager's resourceclaim "
                                                    f"controller creates it)" + (f": {why}" if why else "")))
                elif st.get("resourceClaimName"):
                    out.append(self._found(ns, str(st["resourceClaimName"]), name, uid))
                # a status entry without a name: no claim needed for it
        return PodClaims(uid, tuple(out), extended)

    def _found(self, ns: str, claim_name: str, name: str, owner: str | None) -> PodClaim:
        key = f"{ns}/{claim_name}"
        c = self.claims.get(key)
        if c is None:
            why = self.invalid.get(f"ResourceClaim {key}")
            return PodClaim(name, None, f"resourceclaim {key}: {why}" if why else f"resourceclaim {key} not found")
        if owner is not None and c.owner_pod_uid != owner:
            return PodClaim(name, None, f"resourceclaim {key} was not created for this pod (its owner is not the pod)")
        for req in c.spec.requests:
            for alt in req.alternatives():
                why = self.invalid.get(f"DeviceClass {alt.device_class_name}")
                if why is not None:
                    return PodClaim(name, None, f"claim {key}, request {alt.name}: device class {alt.device_class_name} "
                                                f"cannot be used: {why}")
        return PodClaim(name, c)

    def mapped(self) -> dict[str, DeviceClass]:
        """Extended resource name -> the DeviceClass that backs it (explicit and implicit names)."""
        key = (id(self.catalog), self.catalog.version)
        if self._mapped[0] != key:
            self._mapped = (key, {n: c for n, c in self.catalog.extended_resource_classes().items() if is_extended_name(n)})
        return self._mapped[1]

    def extended_for(self, pod: Mapping) -> ExtendedClaim | None:
        """The claim the pod's DRA-backed extended resources need on a DRA node (None: it asks for none)."""
        mapped = self.mapped()
        if not mapped:
            return None
        m = pod.get("metadata") or {}
        uid = str(m.get("uid") or m.get("name"))
        ver = (m.get("resourceVersion"), self._mapped[0])
        got = self._ext.get(uid)
        if got is None or got[0] != ver:
            if len(self._ext) > 100_000:
                self._ext.clear()
            got = self._ext[uid] = (ver, extended_claim(pod, mapped))
        return got[1]

    def forget_pod(self, uid: str) -> None:
        self._ext.pop(uid, None)

    def resolve(self, pod: Mapping, r: PodRequest, state: ClusterState) -> PodRequest:
        """The pod's claims into its request, and the GPU fields describing what its unallocated claims ask."""
        ext = self.extended_for(pod)
        if not self.has_claims(pod) and ext is None:
            return r
        scalars = r.scalars
        if ext is not None:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            old = self.extended_claim_of(uid)
            if old is not None and old.key not in self.in_flight:  # an earlier attempt's, not bound: deleted first
                ext = replace(ext, claim=old, stale=True)
            mapped = self.mapped()  # resources no node has as allocatable: DRA's everywhere, not NodeResourcesFit's
            scalars = tuple((k, v) for k, v in r.scalars if k not in mapped or k in state.scalar_cap)
        pcs = self.pod_claims(pod, ext)
        todo = [pc.claim for pc in pcs.claims if pc.claim is not None and pc.claim.allocation is None
                and pc.claim.key not in state.claim_holds]
        if not pcs.claims:
            return request_with(r, dra=pcs, scalars=scalars)
        shape = claims_gpu_shape(todo, state)
        return request_with(r, dra=pcs, scalars=scalars, gpu_count=r.gpu_count + shape.gpu_count,
                            gpu_milli=shape.gpu_milli if shape.gpu_count else r.gpu_milli,
                            gpu_memory_mib=shape.gpu_memory_mib if shape.gpu_count else r.gpu_memory_mib,
                            mig_profile=shape.mig_profile or r.mig_profile,
                            gpu_models_allow=shape.gpu_models_allow if shape.gpu_count else r.gpu_models_allow)

    def pod_claim_keys(self, pod: Mapping) -> tuple[str, ...]:
        """The claims a bound pod uses (named, from templates, its extended-resource claim)."""
        m = pod.get("metadata") or {}
        ns = m.get("namespace") or "default"
        st = pod.get("status") or {}
        keys = [f"{ns}/{pc['resourceClaimName']}" for pc in (pod.get("spec") or {}).get("resourceClaims") or []
                if isinstance(pc, Mapping) and pc.get("resourceClaimName")]
        keys += [f"{ns}/{s['resourceClaimName']}" for s in st.get("resourceClaimStatuses") or []
                 if isinstance(s, Mapping) and s.get("resourceClaimName")]
        ext = (st.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if ext:
            keys.append(f"{ns}/{ext}")
        return tuple(dict.fromkeys(keys))

    def extended_claim_of(self, pod_uid: str) -> ResourceClaim | None:
        """The extended-resource claim a scheduler created for the pod (annotation + controller owner)."""
        for c in self.claims.values():
            if c.owner_pod_uid == pod_uid and c.annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true":
                return c
        return None

    # --- in-flight allocations ------------------------------------------------------------------------
    def begin(self, state: ClusterState, pod_key: str, claim_keys: Iterable[str]) -> list[str]:
        """A pod's bind starts: its claims that hold an allocation the API does not show yet are in flight."""
        out = []
        for key in claim_keys:
            h = state.claim_holds.get(key)
            c = self.claims.get(key)
            if h is None or h.allocation is None or (c is not None and c.allocation is not None):
                continue
            f = self.in_flight.get(key)
            if f is None:
                f = self.in_flight[key] = InFlight(h, set())
            f.pods.add(pod_key)
            out.append(key)
        return out

    def end(self, pod_key: str, claim_keys: Iterable[str]) -> list[str]:
        """A pod's bind ended; returns its claims nobody is writing any more."""
        done = []
        for key in claim_keys:
            f = self.in_flight.get(key)
            if f is None:
                continue
            f.pods.discard(pod_key)
            if not f.pods:
                del self.in_flight[key]
                done.append(key)
        return done


def same_devices(a: Allocation, b: Allocation) -> bool:
    """Two allocations give the same devices to the same requests (shares by their capacity)."""
    def key(x: Allocation):
        return sorted((r.request, r.driver, r.pool, r.device, r.share_id or "", tuple(sorted((r.consumed_capacity or {}).items())))
                      for r in x.results)
    return key(a) == key(b)


def _rv(obj: Mapping) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


def _attr(d, driver: str, name: str):
    a = d.attributes.get(name)
    if a is None:
        a = d.attributes.get(f"{driver}/{name}")
    return None if a is None else a.value


__all__ = ["DraCache", "InFlight", "KINDS", "object_ref", "same_devices"]
