"""DynamicResources: kube-scheduler's DRA plugin in the engine (preFilter, filter, reserve).

* preFilter: every claim exists (a claim from a template waits until the resourceclaim controller has
  created it), none is being deleted, an allocated claim still has room in ``reservedFor``, every
  class exists and every selector compiles; otherwise the pod is unresolvable with a reason naming the
  claim, the request and the field.
* filter: an allocated claim keeps the pod to the nodes its allocation names; unallocated claims must
  be allocatable on the node.  The common claim (one request for N devices, no constraint) is decided
  for all nodes at once from the GPU columns and the device table; any other runs the allocator
  (``allocator.py``) on each node that could have room.
* reserve: the allocator runs on the chosen node with the devices the placement policy picked first
  (``prefer``), so the allocation is the fragmentation-aware one; the claims then hold their devices
  in the snapshot (in-flight: no other pod gets them) and ``cycle.read(DRA_ALLOCATIONS)`` tells the
  adapter what to write (the allocation and ``reservedFor``, before the bind).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..framework import DRA_CHOICE, Cycle, FilterResult, StateKey
from ..model import GPU_MILLI
from ..state import ClusterState
from ..status import Status
from .allocator import AllocationError, Allocator, NoAllocation, consumed_capacity, taint_blocks
from .extended import dra_way
from .objects import RESERVED_FOR_MAX, Allocation, DeviceRef, ExactRequest, ResourceClaim
from .usage import MIB, GPU_MILLI_CAPACITY, DeviceTable

# per-cycle state under typed keys (engine.framework.StateKey), as the default policy's plugins keep theirs
# what to write before the bind: [(claim, its new allocation, or None where it was allocated already)]
DRA_ALLOCATIONS: StateKey[list[tuple[ResourceClaim, Allocation | None]]] = StateKey("DynamicResources/allocations")
# the object and field a CEL or class error names (for the caller's event), when the attempt stopped on one
DRA_ERROR_OBJECT: StateKey[tuple[str, str]] = StateKey("DynamicResources/error-object")


@dataclass
class _Data:
    allocated: list[tuple[ResourceClaim, Allocation]] = field(default_factory=list)
    to_allocate: list[ResourceClaim] = field(default_factory=list)
    results: dict[int, list[Allocation]] = field(default_factory=dict)  # node -> allocations found by the filter
    held: list[str] = field(default_factory=list)
    simple: tuple | None = None  # the fast path's candidates key (one claim, one request): reserve looks devices up by it
    extended: ResourceClaim | None = None  # the claim DRA-backed extended resources need where no device plugin serves them
    by_dra: np.ndarray | None = None  # nodes where it applies (extended.dra_way)

    def claims_on(self, node: int) -> list[ResourceClaim]:
        """What to allocate on a node: the pod's unallocated claims, and its extended-resource claim where DRA serves it."""
        ext = [self.extended] if self.extended is not None and self.by_dra is not None and self.by_dra[node] else []
        return self.to_allocate + ext


_DATA: StateKey[_Data] = StateKey("DynamicResources/cycle")  # preFilter's findings, for filter and reserve


@dataclass
class DynamicResources:
    name: str = "DynamicResources"
    max_steps: int = 200_000

    # --- preFilter ---------------------------------------------------------------------
    def pre_filter(self, cycle: Cycle, state: ClusterState) -> Status:
        r = cycle.request
        if r.dra is None or (not r.dra.claims and r.dra.extended is None):
            return Status.success()
        if state.dra is None:
            return Status.unresolvable("pod has ResourceClaims but the cluster has no DRA devices", plugin=self.name)
        data = _Data()
        for pc in r.dra.claims:
            c = pc.claim
            if c is None:
                return Status.unresolvable(pc.problem or f"resourceclaim for {pc.name!r} not found", plugin=self.name)
            if c.deleting:
                return Status.unresolvable(f"resourceclaim {c.key} is being deleted", plugin=self.name)
            alloc = c.allocation
            hold = state.claim_holds.get(c.key)
            if alloc is None and hold is not None:
                alloc = hold.allocation  # allocated in flight (a pod sharing it was placed a moment ago)
            if alloc is not None:
                if len(c.reserved_for) >= RESERVED_FOR_MAX and not c.reserved_by(r.dra.pod_uid):
                    return Status.unresolvable(f"resourceclaim {c.key} is in use by {RESERVED_FOR_MAX} pods", plugin=self.name)
                data.allocated.append((c, alloc))
            else:
                data.to_allocate.append(c)
        ext = r.dra.extended
        if ext is not None:
            if ext.stale:
                return Status.unresolvable(f"extended-resource claim {ext.key} from an earlier attempt is deleted first; "
                                           f"then the pod is tried again", plugin=self.name)
            data.extended = ext.claim
        if data.to_allocate or data.extended is not None:
            ok = state.dra.catalog.compiled_ok
            try:
                for c in data.to_allocate + ([data.extended] if data.extended is not None else []):
                    if ok.get(id(c.spec)) is not c.spec:
                        self._allocator(state).compile_check(c)
                        if len(ok) > 10_000:
                            ok.clear()
                        ok[id(c.spec)] = c.spec
            except AllocationError as exc:
                cycle.write(DRA_ERROR_OBJECT, (exc.obj, exc.field))
                return Status.unresolvable(str(exc), plugin=self.name)
        cycle.write(_DATA, data)
        return Status.success()

    def _allocator(self, state: ClusterState, prefer=None) -> Allocator:
        assert state.dra is not None
        cat = state.dra.catalog
        return Allocator(cat.inventory, cat.classes, state.dra.allocated, cat.selectors, prefer=prefer, max_steps=self.max_steps)

    # --- filter ------------------------------------------------------------------------
    REASONS = ("resourceclaim not available on the node",)
    MIXED = "node has some of the pod's DRA-backed extended resources from a device plugin and lacks others"
    WITH_CLAIMS = ("extended resources backed by DRA together with ResourceClaims: only on nodes whose device plugins "
                   "do not serve them")

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        data = cycle.read(_DATA)
        n = len(state)
        if data is None:
            return FilterResult(np.ones(n, dtype=bool), passes_all=True)
        ok = np.ones(n, dtype=bool)
        all_ok = not data.allocated and data.extended is None  # ``ok`` stays all true (most pods)
        reasons: list[str] = [self.REASONS[0]]
        codes = np.zeros(n, dtype=np.int64)
        for _, alloc in data.allocated:
            ok &= _allocation_nodes(alloc, state)
        claims = list(data.to_allocate)
        dp_pass: np.ndarray | None = None  # nodes whose device plugin serves the pod's extended resources
        if data.extended is not None:
            assert cycle.request.dra is not None and cycle.request.dra.extended is not None
            by_dra, mixed = dra_way(state, cycle.request.dra.extended)
            data.by_dra = by_dra
            out = ok & mixed
            if out.any():
                reasons.append(self.MIXED)
                codes[out] = len(reasons) - 1
            ok &= ~mixed
            if data.to_allocate:  # with ResourceClaims: on nodes where DRA serves the extended resources too
                out = ok & ~by_dra
                if out.any():
                    reasons.append(self.WITH_CLAIMS)
                    codes[out] = len(reasons) - 1
            else:
                dp_pass = ok & ~by_dra
            ok &= by_dra
            claims.append(data.extended)
        if not claims:
            return FilterResult(ok, tuple(reasons), codes)
        assert state.dra is not None
        table = state.dra.catalog.table(state)
        fast = self._fast(claims, table, state, cycle)
        if isinstance(fast, Status):  # a CEL runtime error: the pod's attempt stops here, with it as the reason
            return FilterResult(np.zeros(n, dtype=bool), fast.reasons)
        if fast is not None:
            room, why = fast
            newly = ~room if all_ok else ok & ~room
            turned_away = bool(newly.any())
            if turned_away:
                reasons.append(why)
                codes[newly] = len(reasons) - 1
            fits = room if all_ok else ok & room
            if all_ok and dp_pass is None and not turned_away:  # every node has room: nothing to say
                return FilterResult(fits, tuple(reasons), codes, passes_all=True)
            return FilterResult(fits if dp_pass is None else fits | dp_pass, tuple(reasons), codes)
        # the general case: the allocator on every node that is still in the running
        a = self._allocator(state)
        seen: dict[str, int] = {}
        for i in np.flatnonzero(ok):
            node = state.nodes[int(i)]
            try:
                data.results[int(i)] = a.allocate(node.name, node.labels, claims)
            except NoAllocation as exc:
                ok[i] = False
                codes[i] = seen.setdefault(exc.reason, len(reasons))
                if codes[i] == len(reasons):
                    reasons.append(exc.reason)
            except AllocationError as exc:
                cycle.write(DRA_ERROR_OBJECT, (exc.obj, exc.field))
                return FilterResult(np.zeros(n, dtype=bool), (str(exc),))
        return FilterResult(ok if dp_pass is None else ok | dp_pass, tuple(reasons), codes)

    def _fast(self, claims: list[ResourceClaim], table: DeviceTable, state: ClusterState,
              cycle: Cycle) -> tuple[np.ndarray, str] | Status | None:
        """One claim, one ExactCount request, no constraint, node-local devices: count free matching devices per node."""
        if len(claims) != 1:
            return None
        c = claims[0]
        if len(c.spec.requests) != 1 or c.spec.constraints or c.spec.requests[0].exactly is None:
            return None
        spec = c.spec.requests[0].exactly
        if spec.allocation_mode != "ExactCount" or spec.admin_access:
            return None
        memo = table.need_cache.get(("fast-of", id(spec)))  # requests are interned: one lookup by identity per pod
        if memo is None or memo[0] is not spec:
            cls = state.dra.catalog.classes.get(spec.device_class_name)  # type: ignore[union-attr]
            assert cls is not None
            mkey = ("candidates", cls.name, cls.selectors, spec.selectors)
            got = table.need_cache.get(mkey)  # the candidates of a class + selectors: once per device table
            if got is None:
                mask, err = state.dra.catalog.match_mask(table, cls, spec, c, self._allocator(state))  # type: ignore[union-attr]
                k = np.flatnonzero(mask)
                simple = bool(k.size) and not ((table.node[k] < 0).any() or table.counters[k].any() or table.is_mig[k].any())
                got = table.need_cache[mkey] = (k, err, simple, mkey)
            memo = table.need_cache[("fast-of", id(spec))] = (spec, got)
        k, err, simple, mkey = memo[1]
        if err is not None:
            cycle.write(DRA_ERROR_OBJECT, (err.obj, err.field))
            return Status.unresolvable(str(err))
        if k.size == 0:
            return np.zeros(len(state), dtype=bool), _none_match(c, spec)
        if not simple:
            return None
        per_node = self._per_node(k, table, state, spec, mkey)
        if per_node is None:
            return None
        data = cycle.read(_DATA)
        if data is not None:
            data.simple = (c.key, spec, mkey)
        return per_node >= spec.count, (f"claim {c.key}, request {spec.name}: fewer than {spec.count} free device(s) "
                                        f"of class {spec.device_class_name}" + (" matching its selectors" if spec.selectors else ""))

    def _per_node(self, k: np.ndarray, table: DeviceTable, state: ClusterState, spec: ExactRequest,
                  kkey: tuple) -> np.ndarray | None:
        """Per node, how many of the candidate devices ``k`` can take the request now (None: not decidable here).

        GPU devices are judged on the GPU columns, as [node, GPU] grids built once per request shape, so a
        decision over 40,000 GPUs is a few whole-array operations."""
        assert state.dra is not None
        n = len(state)
        memo = table.need_cache.get(("per-node-of", id(spec)))  # what follows from the request alone, by identity
        if memo is None or memo[0] is not spec:
            memo = table.need_cache[("per-node-of", id(spec))] = (spec, self._plan(k, table, state, spec, kkey))
        plan = memo[1]
        if plan is None:
            return None
        others, grid, blocked, holder = plan
        if grid is not None and not others:  # GPUs only (the common case): the counts as they are (callers only read)
            self._gpu_counts_now(grid, blocked, holder, state)
            return holder[1]
        count = np.zeros(n, dtype=np.int64)
        if grid is not None:
            self._gpu_counts_now(grid, blocked, holder, state)
            count += holder[1]
        alloc = state.dra.allocated
        for dk in others:  # other devices: few; checked one by one
            ref = table.refs[dk]
            if ref.device.allow_multiple_allocations:
                return None
            if not alloc.in_use(ref.device_id) and not taint_blocks(ref.device, spec):
                count[table.node[dk]] += 1
        return count

    @staticmethod
    def _gpu_counts_now(grid: tuple, blocked: np.ndarray | None, holder: list, state: ClusterState) -> None:
        """Per node, what the GPU columns give, into ``holder``: all nodes once per snapshot and device table, then
        only the nodes whose free amounts changed since (their version moved), as GpuFit keeps its verdicts."""
        if holder[0] != state.token:
            holder[:] = [state.token, _gpu_counts(grid, blocked, state, slice(None)), state.version.copy()]
            return
        _, gcount, vers = holder
        stale = np.flatnonzero(vers != state.version)
        if stale.size:
            gcount[stale] = _gpu_counts(grid, blocked, state, stale)
            vers[stale] = state.version[stale]

    def _plan(self, k: np.ndarray, table: DeviceTable, state: ClusterState, spec: ExactRequest,
              kkey: tuple) -> tuple | None:
        """For ``_per_node``, once per request and device table: (other devices, the GPU grid or None, the GPU cells
        its taints block or None, the per-node counts' holder); None when the request is not decidable there."""
        split = table.need_cache.get(("split", kkey))
        if split is None:  # which candidates are GPUs of the snapshot, which other devices: once per device table
            gpu = table.gpu[k]
            on_gpu = gpu >= 0
            split = table.need_cache[("split", kkey)] = (gpu, on_gpu, bool(on_gpu.any()), k[~on_gpu].tolist())
        gpu, on_gpu, any_gpu, others = split
        if any_gpu:
            req_key = tuple(sorted((spec.capacity_requests or {}).items()))
            gk = ("grid", kkey, req_key)
            grid = table.need_cache.get(gk)
            if grid is None:
                kk = k[on_gpu]
                kinds = table.cap_kind[kk]
                per_kind = np.zeros((len(table.cap_kinds), 2), dtype=np.int64)
                for kid in np.unique(kinds).tolist():
                    got = _gpu_need(table.cap_kinds[kid], spec)
                    if got is None:
                        table.need_cache[gk] = False
                        return None
                    per_kind[kid] = got
                need = per_kind[kinds]
                cand = np.zeros(state.gpu_free_milli.shape, dtype=bool)
                m2 = np.zeros(cand.shape, dtype=np.int64)
                b2 = np.zeros(cand.shape, dtype=np.int64)
                rows, cols = table.node[kk], gpu[on_gpu]
                cand[rows, cols] = True
                m2[rows, cols] = need[:, 0]
                b2[rows, cols] = need[:, 1]
                whole = m2 >= GPU_MILLI
                grid = table.need_cache[gk] = (cand, m2, b2, whole, bool(whole[cand].all()), bool((~whole[cand]).all()))
            if grid is False:
                return None
            blocked = None
            if table.any_taints:
                bk = ("blocked", kkey, spec.tolerations)
                blocked = table.need_cache.get(bk)
                if blocked is None:  # taints change only with the slices: once per device table and tolerations
                    blocked = np.zeros(grid[0].shape, dtype=bool)
                    for dk in k[on_gpu].tolist():
                        if table.refs[dk].device.taints and taint_blocks(table.refs[dk].device, spec):
                            blocked[table.node[dk], table.gpu[dk]] = True
                    table.need_cache[bk] = blocked
            # requests alike share the counts (a holder: [snapshot token, counts, the node versions they are for])
            ck = ("gpu-count", gk, spec.tolerations if blocked is not None else None)
            holder = table.need_cache.get(ck)
            if holder is None:
                holder = table.need_cache[ck] = [None, None, None]
            return others, grid, blocked, holder
        return others, None, None, None

    # --- reserve -----------------------------------------------------------------------
    def reserve(self, cycle: Cycle, state: ClusterState) -> Status:
        data = cycle.read(_DATA)
        if data is None or cycle.assignment is None:
            return Status.success()
        out: list[tuple[ResourceClaim, Allocation | None]] = [(c, None) for c, _ in data.allocated]
        node = state.index[cycle.assignment.node]
        claims = data.claims_on(node)
        if claims:
            allocs = data.results.get(node) if cycle.read(DRA_CHOICE) is None else None
            if allocs is None:
                try:
                    order = _prefer(cycle, state, node)
                    a = self._allocator(state, prefer=order)
                    if data.simple is not None and len(claims) == 1 and claims[0].key == data.simple[0]:
                        allocs = [a.allocate_simple(state.nodes[node].name, state.nodes[node].labels, claims[0],
                                                    _picked_first(cycle, state, node, data.simple, order))]
                    else:
                        allocs = a.allocate(state.nodes[node].name, state.nodes[node].labels, claims)
                except (NoAllocation, AllocationError) as exc:
                    return Status.unschedulable(f"node {state.nodes[node].name}: {exc}", plugin=self.name)
            table = state.dra.catalog.table(state)  # type: ignore[union-attr]
            for c, alloc in zip(claims, allocs):
                state.hold_claim(table.hold_for(c.key, alloc.node_name or state.nodes[node].name, alloc, state))
                data.held.append(c.key)
                out.append((c, alloc))
        cycle.write(DRA_ALLOCATIONS, out)
        return Status.success()

    def unreserve(self, cycle: Cycle, state: ClusterState) -> None:
        data = cycle.read(_DATA)
        if data is None:
            return
        for key in data.held:
            state.release_claim(key)
        data.held.clear()
        cycle.data.pop(DRA_ALLOCATIONS, None)


def _picked_first(cycle: Cycle, state: ClusterState, node: int, simple: tuple, order) -> Iterator[DeviceRef]:
    """The node's candidates in the allocator's preference order, the GPUs the policy picked first: the rest are
    ordered only if those do not take the request (they nearly always do: the policy judged the same columns)."""
    refs, by_gpu = _node_candidates(state, node, simple)
    choice = cycle.read(DRA_CHOICE)
    picked = list(choice.gpu_indices) if choice is not None and not choice.mig else []
    first: list[DeviceRef] = [by_gpu[j] for j in picked if j in by_gpu] if picked else []
    yield from first
    rest = [r for r in refs if not any(r is f for f in first)]
    yield from (order(0, simple[1], rest) if len(rest) > 1 else rest)


def _node_candidates(state: ClusterState, node: int, simple: tuple) -> tuple[list[DeviceRef], dict[int, DeviceRef]]:
    """The chosen node's devices that match the one request, and which of them is which GPU (the fast path's
    candidates, grouped by node once per device table), for the allocator instead of matching every device of the
    node again."""
    mkey = simple[2]
    table = state.dra.catalog.table(state)  # type: ignore[union-attr]
    per = table.need_cache.get(("by-node", mkey))
    if per is None:  # the candidates sorted by node (in table order within one), once per device table
        k = table.need_cache[mkey][0]
        order = np.argsort(table.node[k], kind="stable")
        memo0: dict[int, tuple[list[DeviceRef], dict[int, DeviceRef]]] = {}
        per = table.need_cache[("by-node", mkey)] = (k[order], table.node[k][order], memo0)
    ks, ns, memo = per
    got = memo.get(node)
    if got is None:  # each node's when it is first chosen
        mine = ks[np.searchsorted(ns, node, "left"):np.searchsorted(ns, node, "right")].tolist()
        got = memo[node] = ([table.refs[dk] for dk in mine], {int(table.gpu[dk]): table.refs[dk] for dk in mine})
    return list(got[0]), got[1]


def _gpu_need(ref: DeviceRef, spec: ExactRequest) -> tuple[int, int] | None:
    """(milli, MiB) a request takes of a GPU device; (1000, all) for a whole one; None if it takes none of it."""
    d = ref.device
    consumed = consumed_capacity(spec.capacity_requests, d.capacity, ref.driver)
    if consumed is None:
        return (1 << 40, 1 << 40)  # lacks a requested capacity: never fits
    if not d.allow_multiple_allocations:
        return (GPU_MILLI, 0)
    mem = consumed.get(f"{ref.driver}/memory")
    full = d.capacity.get("memory")
    if mem is None or full is None:
        return None
    if mem >= full.value:
        return (GPU_MILLI, 0)
    milli = int(consumed.get(f"{ref.driver}/{GPU_MILLI_CAPACITY}", 0))
    return (milli, -(-int(mem) // MIB))


def _gpu_counts(grid: tuple, blocked: np.ndarray | None, state: ClusterState, rows: np.ndarray | slice) -> np.ndarray:
    """Per node of ``rows``: its candidate GPUs that can take the request now (the grid of ``_per_node``)."""
    cand, m2, b2, whole, all_whole, no_whole = grid
    fm, mf = state.gpu_free_milli[rows], state.gpu_mem_free[rows]
    if all_whole:
        fit = (fm >= GPU_MILLI) & (mf == state.gpu_mem_cap[rows])
    elif no_whole:
        fit = (fm >= m2[rows]) & (mf >= b2[rows])
    else:
        fit = np.where(whole[rows], (fm >= GPU_MILLI) & (mf == state.gpu_mem_cap[rows]), (fm >= m2[rows]) & (mf >= b2[rows]))
    fit &= cand[rows] & state.gpu_usable[rows]
    if blocked is not None:
        fit &= ~blocked[rows]
    return row_counts(fit)


_BITWISE_COUNT = getattr(np, "bitwise_count", None)  # numpy >= 2.0


def row_counts(m: np.ndarray) -> np.ndarray:
    """Per row of a bool [node, GPU] grid, how many are True.  ``m.sum(axis=1)`` is slow along a short last axis (about
    0.3 ms on 5,000 x 8, most of what a DRA pod's filter cost beyond the device-plugin path's); a row of 8 bools is one
    64-bit word whose set bits are its True cells, any other width a small float matrix product (exact)."""
    n, g = m.shape
    if g == 8 and _BITWISE_COUNT is not None and m.flags.c_contiguous:
        return _BITWISE_COUNT(m.view(np.uint64).reshape(n)).astype(np.int64)
    return (m.astype(np.float32) @ np.ones(g, dtype=np.float32)).astype(np.int64)


def _none_match(c: ResourceClaim, spec: ExactRequest) -> str:
    return f"claim {c.key}, request {spec.name}: no device of class {spec.device_class_name}" + (
        " matches its selectors" if spec.selectors else "")


def _allocation_nodes(alloc: Allocation, state: ClusterState) -> np.ndarray:
    n = len(state)
    if alloc.node_name is not None:
        m = np.zeros(n, dtype=bool)
        i = state.index.get(alloc.node_name)
        if i is not None:
            m[i] = True
        return m
    if alloc.node_selector is None:
        return np.ones(n, dtype=bool)
    from .objects import _P

    sel = _P("ResourceClaim", "?").node_selector("status.allocation.nodeSelector", alloc.node_selector)
    return np.array([sel is None or sel.matches(x.name, x.labels) for x in state.nodes], dtype=bool)


def _prefer(cycle: Cycle, state: ClusterState, node: int):
    """Device order for the allocator on the chosen node: the GPUs the policy picked first, then by how they fit.

    Whole GPUs: as the node lists them.  Shares: the fullest GPU that still fits first (best fit), so
    GPUs stay whole for whole-GPU pods.  MIG: instances on the GPU with the fewest free instances first.
    """
    choice = cycle.read(DRA_CHOICE)
    picked = list(choice.gpu_indices) if choice is not None else []
    picked_mig = list(choice.mig) if choice is not None else []
    table = state.dra.catalog.table(state)  # type: ignore[union-attr]

    def order(_claim: int, _spec: ExactRequest, cands: list[DeviceRef]) -> list[DeviceRef]:
        def key(ref: DeviceRef):
            k = table.index.get(ref.device_id)
            if k is None or table.gpu[k] < 0:
                return (2, 0, 0)
            j = int(table.gpu[k])
            if k in table.mig:
                inst = table.mig[k][1]
                if inst in picked_mig:
                    return (0, picked_mig.index(inst), 0)
                prof = table.mig[k][0]
                per_gpu = sum(1 for g, _ in state.mig_free[node].get(prof, []) if g == j)
                return (1, per_gpu, j)
            if j in picked:
                return (0, picked.index(j), 0)
            return (1, int(state.gpu_free_milli[node, j]), j)
        return sorted(cands, key=key)
    return order


def ensure_dra(profile) -> "DynamicResources":
    """The profile's DynamicResources plugin, added (preFilter, last filter, reserve) where it has none:
    adapters that see DRA objects call this, as the live loop adds QueueQuota."""
    for p in profile.pre_filters:
        if isinstance(p, DynamicResources):
            return p
    p = DynamicResources()
    profile.pre_filters.append(p)
    profile.filters.append(p)
    profile.reserves.append(p)
    return p


def register(r) -> None:
    r.register("DynamicResources", DynamicResources)
