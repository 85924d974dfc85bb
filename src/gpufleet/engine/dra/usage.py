"""DRA in the cluster snapshot: the catalog (slices, classes, selectors), what is allocated, and GPUs.

Why the GPU projection: the placement policies (the default, FGD, best fit) judge a placement by the
GPU columns of ``ClusterState`` (free milli and memory per GPU, MIG instances); for DRA pods to be
placed as well as device-plugin pods, a GPU that a driver publishes as a device must be the same GPU
in those columns.  A device is a GPU when its driver says so as NVIDIA's driver and gpufleet's do
(attribute ``type`` = ``gpu`` or ``mig``); it is matched to the node's GPU by ``uuid`` (a MIG device
by ``parentUUID`` and profile).  An allocated claim holds its devices on the columns
(``ClusterState.hold_claim``): a whole GPU takes all of it, a share (consumable capacity) its
``gpuMilli`` and ``memory``, a MIG device its instance.  Devices of other kinds (NICs, ...) are
allocated the same way but no policy scores them.

``DeviceTable`` is the catalog as arrays over every device, per snapshot epoch, so that which nodes
have enough free devices matching a request is a ``bincount``, not a loop over 40,000 devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from ..model import GPU_MILLI
from .allocator import AllocatedState, AllocationError, Inventory, taint_blocks
from .cel import SelectorCache
from .objects import Allocation, DeviceClass, DeviceRef, ExactRequest, ResourceClaim, ResourceSlice, split_qualified

if TYPE_CHECKING:
    from ..state import ClusterState

MIB = 2**20
DeviceID = tuple[str, str, str]
GPU_MILLI_CAPACITY = "gpuMilli"  # gpufleet's driver: the compute share of a GPU (1000 = whole)


@dataclass(frozen=True)
class ClaimHold:
    """What one allocated claim takes: on ``node``, per GPU (index, milli, MiB), MIG instances, and the allocation."""

    key: str
    node: str | None
    gpus: tuple[tuple[int, int, int], ...] = ()
    mig: tuple[tuple[str, tuple[int, int]], ...] = ()
    allocation: Allocation | None = None


class DraCatalog:
    """Slices, classes and the compiled selectors: shared by every copy of a snapshot."""

    def __init__(self, slices: Iterable[ResourceSlice] = (), classes: Iterable[DeviceClass] = ()):
        self.inventory = Inventory(slices)
        self.classes: dict[str, DeviceClass] = {c.name: c for c in classes}
        self.selectors = SelectorCache()
        self.version = 0
        self._tables: dict[tuple[int, int], DeviceTable] = {}
        self._masks: dict[tuple, tuple[np.ndarray, AllocationError | None]] = {}
        # claim specs whose classes exist and whose selectors compile (by identity; specs are interned): PreFilter's
        # check once per spec until the classes change
        self.compiled_ok: dict[int, object] = {}

    def update_slice(self, s: ResourceSlice) -> None:
        self.inventory.update(s)
        self._changed()

    def remove_slice(self, name: str) -> None:
        self.inventory.remove(name)
        self._changed()

    def set_class(self, c: DeviceClass) -> None:
        self.classes[c.name] = c
        self._changed()

    def remove_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._tables.clear()
        self._masks.clear()
        self.compiled_ok.clear()

    def table(self, state: "ClusterState") -> "DeviceTable":
        key = (self.version, state.epoch)
        t = self._tables.get(key)
        if t is None:
            if len(self._tables) > 4:
                self._tables.clear()
                self._masks.clear()
            t = self._tables[key] = DeviceTable(self, state)
        return t

    def extended_resource_classes(self) -> dict[str, DeviceClass]:
        """Extended resource name -> DeviceClass (the newest class wins a name, then the first name)."""
        out: dict[str, DeviceClass] = {}
        for c in sorted(self.classes.values(), key=lambda c: (c.created, c.name)):
            names = [f"deviceclass.resource.kubernetes.io/{c.name}"] + ([c.extended_resource_name] if c.extended_resource_name else [])
            for n in names:
                cur = out.get(n)
                if cur is None or c.created > cur.created:
                    out[n] = c
        return out

    def match_mask(self, table: "DeviceTable", cls: DeviceClass, spec: ExactRequest, claim: ResourceClaim | None,
                   allocator) -> tuple[np.ndarray, AllocationError | None]:
        """Devices (table order) matching the class's and the request's selectors; the first CEL error, if any."""
        key = (self.version, table.epoch, cls.name, cls.selectors, spec.selectors)
        got = self._masks.get(key)
        if got is None:
            mask = np.zeros(len(table.refs), dtype=bool)
            err: AllocationError | None = None
            for k, ref in enumerate(table.refs):
                if ref.device.problem:
                    continue
                try:
                    mask[k] = allocator.matches(ref, claim, cls, spec)
                except AllocationError as exc:
                    err = err or exc
            got = self._masks[key] = (mask, err)
        return got


class DeviceTable:
    """Every device as arrays: its node (snapshot index, -1 when not node-local) and the GPU it is."""

    def __init__(self, catalog: DraCatalog, state: "ClusterState"):
        self.epoch = state.epoch
        inv = catalog.inventory
        self.refs: list[DeviceRef] = []
        for p in inv.pools.values():
            if not p.complete or p.invalid:
                continue
            for s in p.slices:
                self.refs.extend(inv.refs(s))
        n = len(self.refs)
        self.index: dict[DeviceID, int] = {r.device_id: k for k, r in enumerate(self.refs)}
        self.node = np.full(n, -1, dtype=np.int64)
        self.gpu = np.full(n, -1, dtype=np.int64)
        self.multi = np.zeros(n, dtype=bool)
        self.counters = np.zeros(n, dtype=bool)
        self.mig: dict[int, tuple[str, tuple[int, int]]] = {}
        uuids: dict[str, tuple[int, int]] = {}
        for i, node in enumerate(state.nodes):
            for g in node.gpus:
                uuids[g.uuid] = (i, g.index)
        mig_seen: dict[tuple[int, int, str], int] = {}
        for k, r in enumerate(self.refs):
            s = r.slice
            if s.node_name is not None:
                self.node[k] = state.index.get(s.node_name, -1)
            elif s.per_device_node_selection and r.device.node_name is not None:
                self.node[k] = state.index.get(r.device.node_name, -1)
            self.multi[k] = r.device.allow_multiple_allocations
            self.counters[k] = bool(r.device.consumes_counters) or bool(r.device.binding_conditions)
            kind = _attr(r, "type")
            if kind == "gpu":
                where = uuids.get(str(_attr(r, "uuid")))
                if where is not None and where[0] == self.node[k]:
                    self.gpu[k] = where[1]
            elif kind == "mig":
                where = uuids.get(str(_attr(r, "parentUUID")))
                prof = str(_attr(r, "profile"))
                if where is not None and where[0] == self.node[k]:
                    i, j = where
                    g = state.nodes[i].gpus[j]
                    ids = sorted(m.instance_id for m in g.mig_instances if m.profile == prof)
                    nth = mig_seen.get((i, j, prof), 0)
                    mig_seen[(i, j, prof)] = nth + 1
                    if nth < len(ids):
                        self.gpu[k] = j
                        self.mig[k] = (prof, (j, ids[nth]))
        # devices alike in what a request can take of them share a capacity kind (a few per cluster)
        kinds: dict[tuple, int] = {}
        self.cap_kind = np.zeros(n, dtype=np.int64)
        self.cap_kinds: list[DeviceRef] = []
        for k, r in enumerate(self.refs):
            key = (r.device.allow_multiple_allocations, r.capacity_key)  # the allocator's key too: made here, once
            kid = kinds.get(key)
            if kid is None:
                kid = kinds[key] = len(self.cap_kinds)
                self.cap_kinds.append(r)
            self.cap_kind[k] = kid
        self.any_taints = any(r.device.taints for r in self.refs)
        self.is_mig = np.zeros(n, dtype=bool)
        self.is_mig[list(self.mig)] = True
        self.need_cache: dict[tuple, Any] = {}  # per request shape: the candidate grid and what each device would take
        self.mem_cap: dict[int, int] = {}  # device -> its memory capacity in bytes (GPU devices)
        self._gpu_l: list[int] = self.gpu.tolist()  # the same as lists: hold_for reads them per allocation result
        self._node_l: list[int] = self.node.tolist()
        for k in np.flatnonzero(self.gpu >= 0).tolist():
            mem = self.refs[k].device.capacity.get("memory")
            if mem is not None:
                self.mem_cap[k] = int(mem.value)

    def hold_for(self, key: str, node: str | None, allocation: Allocation, state: "ClusterState") -> ClaimHold:
        """The GPU columns an allocation takes (whole GPUs, shares, MIG instances)."""
        per_gpu: dict[int, list[int]] = {}
        migs = []
        for r in allocation.results:
            if r.admin_access:
                continue
            k = self.index.get(r.device_id)
            if k is None or self._gpu_l[k] < 0:
                continue
            j = self._gpu_l[k]
            if k in self.mig:
                migs.append(self.mig[k])
                continue
            i = self._node_l[k]
            cap_mib = int(state.gpu_mem_cap[i, j])
            if r.share_id is None or r.consumed_capacity is None:
                milli, mem = GPU_MILLI, cap_mib
            else:
                mem_b = _consumed(r.consumed_capacity, r.driver, "memory")
                milli = int(_consumed(r.consumed_capacity, r.driver, GPU_MILLI_CAPACITY))
                full = self.mem_cap.get(k)
                mem = cap_mib if full is not None and mem_b >= full else -(-int(mem_b) // MIB)
                if mem >= cap_mib:
                    milli = GPU_MILLI
            cur = per_gpu.setdefault(j, [0, 0])
            cur[0] += milli
            cur[1] += mem
        return ClaimHold(key, node, tuple((j, m, b) for j, (m, b) in sorted(per_gpu.items())), tuple(migs), allocation)


def _consumed(c: Mapping[str, Fraction], driver: str, name: str) -> Fraction:
    v = c.get(f"{driver}/{name}")
    if v is None:
        v = c.get(name)
    return _ZERO if v is None else v


_ZERO = Fraction(0)


def _attr(r: DeviceRef, name: str):
    a = r.device.attributes.get(name)
    if a is None:
        a = r.device.attributes.get(f"{r.driver}/{name}")
    return None if a is None else a.value


@dataclass
class DraState:
    """Per snapshot: the shared catalog and what is allocated (copied with the snapshot)."""

    catalog: DraCatalog
    allocated: AllocatedState = field(default_factory=AllocatedState)

    def copy(self) -> "DraState":
        return DraState(self.catalog, self.allocated.copy())


def request_blocked_by_taints(table: DeviceTable, spec: ExactRequest) -> np.ndarray:
    return np.array([taint_blocks(r.device, spec) for r in table.refs], dtype=bool) if any(
        r.device.taints for r in table.refs) else np.zeros(len(table.refs), dtype=bool)


__all__ = ["ClaimHold", "DeviceTable", "DraCatalog", "DraState", "GPU_MILLI_CAPACITY", "request_blocked_by_taints",
           "split_qualified"]
