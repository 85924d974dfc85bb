"""The structured-parameters allocator: which devices of one node satisfy a pod's ResourceClaims.

Written after kube-scheduler 1.37's allocator (k8s.io/dynamic-resource-allocation/structured, the
"incubating" variant that 1.37's default features select), so that a claim gpufleet allocates is one
kube-scheduler would accept, and explain says what kube-scheduler would refuse:

* pools: the highest generation of each pool counts; a pool whose slices of that generation are not
  all there is incomplete (nothing is allocated from it, and ``All`` fails); duplicate device names
  or counters that name no counter set make it invalid;
* per claim and request (or the first subrequest of ``firstAvailable`` that can be met), devices that
  match the DeviceClass's selectors and the request's, are not in use (``adminAccess`` may share),
  whose taints are tolerated, whose capacity admits the request (consumable capacity with the
  ``requestPolicy`` rounding rules, several claims per ``allowMultipleAllocations`` device) and whose
  shared counters (partitionable devices) are not used up;
* ``matchAttribute`` / ``distinctAttribute`` constraints, checked as devices are added (monotonic), with
  backtracking over combinations (never permutations) in a fixed device order;
* the result: devices per request, class and claim config, the node selector (pinned to the node for
  node-local devices), share IDs and consumed capacity.

The one deliberate difference: kube-scheduler takes the first solution in pool/slice/device order;
here the caller may give a preference order per request (``prefer``), so the first solution found is
the one the placement policy likes best (whole GPUs kept whole, shares on GPUs already in use).  Any
order finds a solution when one exists; only which one differs.

Pure: no I/O; the match results of CEL selectors are cached on each device (``DeviceRef.matches``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Sequence

from ..errors import GpufleetError
from .cel import CelCompileError, CelRuntimeError, SelectorCache
from .objects import (
    ALLOCATION_RESULTS_MAX,
    Allocation,
    Capacity,
    ClaimSpec,
    Device,
    DeviceClass,
    DeviceRef,
    DeviceResult,
    ExactRequest,
    ResourceClaim,
    ResourceSlice,
)

DeviceID = tuple[str, str, str]
PoolID = tuple[str, str]


class AllocationError(GpufleetError):
    """A claim or class that cannot be allocated anywhere: a missing class, a CEL error.

    kube-scheduler aborts the pod's attempt on these (they are not the node's fault); so does gpufleet.
    ``obj`` names the object to put an event on (``ResourceClaim ns/name`` or ``DeviceClass name``).
    """

    def __init__(self, message: str, obj: str = "", field: str = ""):
        self.obj = obj
        self.field = field
        super().__init__(message)


# --- inventory ---------------------------------------------------------------------------------


@dataclass
class PoolInfo:
    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[ResourceSlice] = field(default_factory=list)
    invalid: str = ""  # why nothing may be allocated from it
    malformed: int = 0  # devices left out (a problem in their fields)

    @property
    def complete(self) -> bool:
        return len(self.slices) == self.slice_count

    @property
    def pool_id(self) -> PoolID:
        return (self.driver, self.name)


@dataclass
class NodePool:
    info: PoolInfo
    devices: list[DeviceRef]  # devices of the pool usable from the node, in pool order


class Inventory:
    """All ResourceSlices, by pool; what a node can use.  Built from slices, updated per slice."""

    def __init__(self, slices: Iterable[ResourceSlice] = ()):
        self.slices: dict[str, ResourceSlice] = {}
        self._refs: dict[str, list[DeviceRef]] = {}
        self.version = 0
        for s in slices:
            self.slices[s.name] = s
        self._reindex()

    def update(self, s: ResourceSlice) -> None:
        self.slices[s.name] = s
        self._refs.pop(s.name, None)
        self._reindex()

    def remove(self, name: str) -> None:
        if self.slices.pop(name, None) is not None:
            self._refs.pop(name, None)
            self._reindex()

    def _reindex(self) -> None:
        self.version += 1
        gens: dict[PoolID, int] = {}
        for s in self.slices.values():
            gens[s.pool_id] = max(gens.get(s.pool_id, s.pool.generation), s.pool.generation)
        pools: dict[PoolID, PoolInfo] = {}
        for s in sorted(self.slices.values(), key=lambda x: x.name):
            if s.pool.generation != gens[s.pool_id]:
                continue  # an older generation: the driver is replacing it
            p = pools.get(s.pool_id)
            if p is None:
                p = pools[s.pool_id] = PoolInfo(s.driver, s.pool.name, s.pool.generation, s.pool.slice_count)
            p.slices.append(s)
        for p in pools.values():
            names: set[str] = set()
            counter_sets = {cs.name: dict(cs.counters) for s in p.slices for cs in s.shared_counters}
            for s in p.slices:
                for d in s.devices:
                    if d.name in names:
                        p.invalid = p.invalid or f"duplicate device name {d.name}"
                    names.add(d.name)
                    if d.problem:
                        p.malformed += 1
                    for cc in d.consumes_counters:
                        cs = counter_sets.get(cc.counter_set)
                        if cs is None:
                            p.invalid = p.invalid or f"counter set {cc.counter_set} not found"
                        else:
                            for name, _ in cc.counters:
                                if name not in cs:
                                    p.invalid = p.invalid or f"counter {name} not found in counter set {cc.counter_set}"
        self.pools = dict(sorted(pools.items()))
        self.by_node: dict[str, list[PoolID]] = {}
        self.shared: list[PoolID] = []
        for pid, p in self.pools.items():
            local = {s.node_name for s in p.slices if s.node_name}
            for n in local:
                self.by_node.setdefault(n, []).append(pid)
            if any(not s.node_name for s in p.slices):
                self.shared.append(pid)
        self.devices: dict[DeviceID, DeviceRef] = {}
        for p in self.pools.values():
            for s in p.slices:
                for r in self.refs(s):
                    self.devices.setdefault(r.device_id, r)

    def refs(self, s: ResourceSlice) -> list[DeviceRef]:
        got = self._refs.get(s.name)
        if got is None or (got and got[0].slice is not s):
            got = self._refs[s.name] = [DeviceRef(s.driver, s.pool.name, d, s) for d in s.devices]
        return got

    def node_pools(self, node_name: str, labels: Mapping[str, str]) -> list[NodePool]:
        """GatherPools: pools with devices the node can use (node-local first by id, then shared by id)."""
        out: list[NodePool] = []
        ids = sorted(set(self.by_node.get(node_name, ())) | set(self.shared))
        with_binding: list[NodePool] = []
        for pid in ids:
            p = self.pools[pid]
            devs: list[DeviceRef] = []
            for s in p.slices:
                if s.node_name is not None:
                    ok = s.node_name == node_name
                elif s.all_nodes:
                    ok = True
                elif s.node_selector is not None:
                    ok = s.node_selector.matches(node_name, labels)
                else:  # per-device node selection
                    ok = True
                if not ok:
                    continue
                for r in self.refs(s):
                    if s.per_device_node_selection and not _device_on_node(r.device, node_name, labels):
                        continue
                    devs.append(r)
            if devs or (not p.complete and pid in self.by_node.get(node_name, ())):
                np_ = NodePool(p, devs)
                (with_binding if any(r.device.binding_conditions for r in devs) else out).append(np_)
        return out + with_binding


def _device_on_node(d: Device, node_name: str, labels: Mapping[str, str]) -> bool:
    if d.node_name is not None:
        return d.node_name == node_name
    if d.all_nodes:
        return True
    if d.node_selector is not None:
        return d.node_selector.matches(node_name, labels)
    return False


# --- what is allocated already -------------------------------------------------------------------


@dataclass
class AllocatedState:
    """Devices taken by allocated claims (any scheduler) and in-flight allocations.

    ``exclusive``: devices allocated without sharing; ``consumed``: capacity taken on
    ``allowMultipleAllocations`` devices (summed over their shares); ``shared``: such devices with at
    least one share.  Admin-access results take nothing.
    """

    exclusive: set[DeviceID] = field(default_factory=set)
    consumed: dict[DeviceID, dict[str, Fraction]] = field(default_factory=dict)
    shared: dict[DeviceID, int] = field(default_factory=dict)  # device -> number of shares

    def add(self, allocation: Allocation) -> None:
        for r in allocation.results:
            if r.admin_access:
                continue
            if r.share_id is not None:
                self.shared[r.device_id] = self.shared.get(r.device_id, 0) + 1
                if r.consumed_capacity:
                    c = self.consumed.setdefault(r.device_id, {})
                    for k, v in r.consumed_capacity.items():
                        prev = c.get(k)
                        c[k] = v if prev is None else prev + v
            else:
                self.exclusive.add(r.device_id)

    def remove(self, allocation: Allocation) -> None:
        for r in allocation.results:
            if r.admin_access:
                continue
            if r.share_id is not None:
                n = self.shared.get(r.device_id, 0) - 1
                if n <= 0:
                    self.shared.pop(r.device_id, None)
                else:
                    self.shared[r.device_id] = n
                if r.consumed_capacity:
                    c = self.consumed.get(r.device_id, {})
                    for k, v in r.consumed_capacity.items():
                        c[k] = c.get(k, Fraction(0)) - v
                        if c[k] == 0:
                            del c[k]
                    if not c:
                        self.consumed.pop(r.device_id, None)
            else:
                self.exclusive.discard(r.device_id)

    def in_use(self, d: DeviceID) -> bool:
        return d in self.exclusive or d in self.shared

    def copy(self) -> "AllocatedState":
        return AllocatedState(set(self.exclusive), {k: dict(v) for k, v in self.consumed.items()}, dict(self.shared))


# --- capacity (consumable capacity, KEP-5075) -------------------------------------------------------


class CapacityError(GpufleetError):
    pass


def consumed_capacity(requests: Mapping[str, Fraction] | None, capacity: Mapping[str, Capacity],
                      driver: str) -> dict[str, Fraction] | None:
    """What a request takes of each capacity of a device, or None when it names a capacity the device lacks."""
    req = _qualify(requests or {}, driver)
    caps = _qualify(capacity, driver)
    if any(k not in caps for k in req):
        return None
    out = {}
    for name, cap in caps.items():
        v = req.get(name)
        out[name] = _consume_one(v, cap)
        if out[name] < 0:
            raise CapacityError(f"capacity {name!r}: capacity value is negative")
    return out


def _qualify(m: Mapping[str, object], driver: str) -> dict:
    return {(k if "/" in k else f"{driver}/{k}"): v for k, v in m.items()}


def _consume_one(requested: Fraction | None, cap: Capacity) -> Fraction:
    pol = cap.request_policy
    if requested is None:
        return pol.default if pol is not None and pol.default is not None else cap.value
    if pol is None:
        return requested
    if pol.valid_range is not None:
        rng = pol.valid_range
        if requested < rng.min:
            return rng.min
        if rng.step is None:
            return requested
        n = -(-(requested - rng.min) // rng.step)
        return rng.min + rng.step * n
    if pol.valid_values:
        for v in pol.valid_values:
            if requested <= v:
                return v
    return requested


def _violates(v: Fraction, cap: Capacity) -> bool:
    pol = cap.request_policy
    if pol is None or (pol.default is not None and v == pol.default):
        return False
    if pol.valid_range is not None:
        r = pol.valid_range
        if r.max is not None and v > r.max:
            return True
        return r.step is not None and (v - r.min) % r.step != 0
    if pol.valid_values:
        return v not in pol.valid_values
    return False


_QUALIFIED: dict[int, tuple[Mapping[str, Capacity], dict[str, Capacity]]] = {}
# (request spec, device capacity) -> (what the request consumes of such a device, whether that breaks a request policy)
_CONSUMED: dict[tuple, tuple[ExactRequest, dict[str, Fraction] | None, bool, bool]] = {}


def _qualified(capacity: Mapping[str, Capacity], driver: str) -> dict[str, Capacity]:
    """``_qualify`` of a device's capacity, kept while that mapping lives (devices are immutable once parsed)."""
    got = _QUALIFIED.get(id(capacity))
    if got is None or got[0] is not capacity:
        if len(_QUALIFIED) > 200_000:
            _QUALIFIED.clear()
        got = _QUALIFIED[id(capacity)] = (capacity, _qualify(capacity, driver))
    return got[1]


def _fits_beside(consumed: Mapping[str, Fraction], caps: Mapping[str, Capacity], already: Mapping[str, Fraction] | None,
                 allocating: Mapping[str, Fraction] | None) -> bool:
    """The request's consumption fits beside what is taken and being taken (its policies checked already)."""
    for name, cap in caps.items():
        total = consumed[name]
        if already:
            x = already.get(name)
            if x:
                total = total + x
        if allocating:
            x = allocating.get(name)
            if x:
                total = total + x
        if total > cap.value:
            return False
    return True


def capacity_fits(consumed: Mapping[str, Fraction], capacity: Mapping[str, Capacity], driver: str,
                  already: Mapping[str, Fraction] | None, allocating: Mapping[str, Fraction] | None) -> bool:
    """CmpRequestOverCapacity: the request's consumption obeys each policy and fits beside what is taken."""
    caps = _qualified(capacity, driver)
    for name, cap in caps.items():
        v = consumed[name]
        if _violates(v, cap):
            return False
        total = v + (already or {}).get(name, 0) + (allocating or {}).get(name, 0)
        if total > cap.value:
            return False
    return True


# --- the search -----------------------------------------------------------------------------


@dataclass
class _Alt:
    """One request or subrequest of one claim, prepared for the search."""

    claim: int
    request_name: str  # the result's name: "req" or "req/sub"
    base: str
    sub: str
    spec: ExactRequest
    cls: DeviceClass
    count: int
    all_devices: list[DeviceRef] | None = None
    candidates: list[DeviceRef] | None = None


@dataclass
class _Pick:
    alt: _Alt
    ref: DeviceRef
    share: bool
    consumed: dict[str, Fraction] | None
    counted: bool = False  # took shared counters


class _MatchConstraint:
    def __init__(self, attr: str, requests: tuple[str, ...]):
        self.attr = attr
        self.requests = set(requests)
        self.value: object = None
        self.n = 0

    def applies(self, alt: _Alt) -> bool:
        return not self.requests or alt.base in self.requests or alt.request_name in self.requests

    def add(self, alt: _Alt, ref: DeviceRef) -> bool:
        if not self.applies(alt):
            return True
        a = ref.device.attribute(ref.driver, self.attr)
        if a is None:
            return False
        if self.n and (a.kind, a.value) != self.value:
            return False
        if not self.n:
            self.value = (a.kind, a.value)
        self.n += 1
        return True

    def remove(self, alt: _Alt, ref: DeviceRef) -> None:
        if self.applies(alt):
            self.n -= 1


class _DistinctConstraint(_MatchConstraint):
    def __init__(self, attr: str, requests: tuple[str, ...]):
        super().__init__(attr, requests)
        self.values: list[tuple] = []

    def add(self, alt: _Alt, ref: DeviceRef) -> bool:
        if not self.applies(alt):
            return True
        a = ref.device.attribute(ref.driver, self.attr)
        if a is None or (a.kind, a.value) in self.values:
            return False
        self.values.append((a.kind, a.value))
        return True

    def remove(self, alt: _Alt, ref: DeviceRef) -> None:
        if self.applies(alt):
            self.values.pop()


Prefer = Callable[[int, ExactRequest, list[DeviceRef]], list[DeviceRef]]


class NoAllocation(Exception):
    """This node cannot satisfy the claims (a node-local failure; ``reason`` says why)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class Allocator:
    """Allocates claims on one node at a time against one cluster state (kube-scheduler's Allocator).

    ``allocate`` returns one Allocation per claim, raises NoAllocation (this node cannot) or
    AllocationError (the claim or a class is wrong: abort the pod's attempt).  ``max_steps`` bounds
    the backtracking (kube-scheduler bounds it by time, 10 s per node); past it the node counts as
    not fitting, with a reason that says so.
    """

    def __init__(self, inventory: Inventory, classes: Mapping[str, DeviceClass], allocated: AllocatedState,
                 selectors: SelectorCache | None = None, prefer: Prefer | None = None, max_steps: int = 200_000,
                 share_id: Callable[[], str] | None = None):
        self.inventory = inventory
        self.classes = classes
        self.allocated = allocated
        self.selectors = selectors or SelectorCache()
        self.prefer = prefer
        self.max_steps = max_steps
        self.share_id = share_id or random_share_id

    # selectors ------------------------------------------------------------------------------
    def matches(self, ref: DeviceRef, claim: ResourceClaim | None, cls: DeviceClass, spec: ExactRequest) -> bool:
        """The class's selectors, then the request's; CEL errors raise AllocationError naming the object."""
        for i, expr in enumerate(cls.selectors):
            if not self._match(ref, expr, f"DeviceClass {cls.name}", f"spec.selectors[{i}]", f"class {cls.name}: selector #{i}"):
                return False
        who = f"ResourceClaim {claim.key}" if claim is not None else "request"
        for i, expr in enumerate(spec.selectors):
            if not self._match(ref, expr, who, f"request {spec.name}: selectors[{i}]",
                               f"claim {claim.key if claim else '?'}, request {spec.name}: selector #{i}"):
                return False
        return True

    def _match(self, ref: DeviceRef, expr: str, obj: str, fld: str, what: str) -> bool:
        got = ref.matches.get(expr)
        if got is None:
            sel = self.selectors.get(expr)
            try:
                got = sel.matches(ref.view)
            except CelCompileError as exc:
                got = AllocationError(f"{what}: CEL compile error: {exc.message}", obj, fld)
            except CelRuntimeError as exc:
                got = AllocationError(f"{what} on device {ref.driver}/{ref.pool}/{ref.device.name}: CEL runtime error: "
                                      f"{exc.message}", obj, fld)
            ref.matches[expr] = got
        if isinstance(got, AllocationError):
            raise got
        return bool(got)

    def compile_check(self, claim: ResourceClaim) -> None:
        """Missing classes and selectors that do not compile, before any node is tried (PreFilter)."""
        for alt in _alternatives(claim.spec):
            cls = self.classes.get(alt.device_class_name)
            if cls is None:
                raise AllocationError(f"claim {claim.key}, request {alt.name}: device class {alt.device_class_name} does not exist",
                                      f"ResourceClaim {claim.key}", f"request {alt.name}: deviceClassName")
            for i, expr in enumerate(cls.selectors):
                err = self.selectors.get(expr).error
                if err is not None:
                    raise AllocationError(f"class {cls.name}: selector #{i}: CEL compile error: {err.message}",
                                          f"DeviceClass {cls.name}", f"spec.selectors[{i}]")
            for i, expr in enumerate(alt.selectors):
                err = self.selectors.get(expr).error
                if err is not None:
                    raise AllocationError(f"claim {claim.key}, request {alt.name}: selector #{i}: CEL compile error: {err.message}",
                                          f"ResourceClaim {claim.key}", f"request {alt.name}: selectors[{i}]")

    # allocation ------------------------------------------------------------------------------
    def allocate(self, node_name: str, labels: Mapping[str, str], claims: Sequence[ResourceClaim]) -> list[Allocation]:
        return _Search(self, node_name, labels, claims).run()

    def allocate_simple(self, node_name: str, labels: Mapping[str, str], claim: ResourceClaim,
                        candidates: Iterable[DeviceRef]) -> Allocation:
        """``allocate`` for one claim of one ExactCount request without constraints whose matching devices on the node
        the caller knows, in the order to try (DynamicResources' fast path)."""
        return _Search(self, node_name, labels, [claim]).run_simple(candidates)


def random_share_id() -> str:
    """A random (version 4) UUID in its text form, as ``str(uuid.uuid4())`` gives (a third of its cost: one per
    share allocated)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _alternatives(spec: ClaimSpec) -> Iterable[ExactRequest]:
    for r in spec.requests:
        yield from r.alternatives()


def taint_blocks(d: Device, spec: ExactRequest) -> bool:
    for t in d.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not any(tol.tolerates(t) for tol in spec.tolerations):
            return True
    return False


class _Search:
    def __init__(self, a: Allocator, node_name: str, labels: Mapping[str, str], claims: Sequence[ResourceClaim]):
        self.a = a
        self.node = node_name
        self.labels = labels
        self.claims = claims
        self._pools: list[NodePool] | None = None  # looked up when needed: not when the caller gave the candidates
        self.alts: list[list[list[_Alt]]] = []  # claim -> request -> alternatives
        self.constraints: list[list[_MatchConstraint]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.allocating_cap: dict[DeviceID, dict[str, Fraction]] = {}
        self.allocating_shares: dict[DeviceID, int] = {}
        self.counters: dict[PoolID, dict[str, dict[str, Fraction]]] = {}  # consumed by devices being allocated
        self.available: dict[PoolID, dict[str, dict[str, Fraction]]] = {}
        self.result: list[list[_Pick]] = [[] for _ in claims]
        self.steps = 0
        self.why: dict[str, set[str]] = {}  # request -> what turned devices away during the search

    @property
    def pools(self) -> list[NodePool]:
        if self._pools is None:
            self._pools = self.a.inventory.node_pools(self.node, self.labels)
        return self._pools

    @property
    def node_devices(self) -> list[DeviceRef]:
        return [r for p in self.pools if p.info.complete and not p.info.invalid for r in p.devices]

    def run_simple(self, candidates: Iterable[DeviceRef]) -> Allocation:
        """One claim with one ExactCount request and no constraint, its matching devices given in the order to try:
        the first ``count`` that can take it (what the search does for such a claim, without the search)."""
        claim = self.claims[0]
        (r,) = claim.spec.requests
        spec = r.exactly
        assert spec is not None and spec.allocation_mode == "ExactCount" and not claim.spec.constraints
        cls = self.a.classes.get(spec.device_class_name)
        if cls is None:
            raise AllocationError(f"claim {claim.key}, request {spec.name}: device class {spec.device_class_name} does not exist",
                                  f"ResourceClaim {claim.key}", f"request {spec.name}: deviceClassName")
        seen: list[DeviceRef] = []
        alt = _Alt(0, r.name, r.name, "", spec, cls, spec.count, candidates=seen)
        self.alts = [[[alt]]]
        self.constraints = [[]]
        if spec.count > ALLOCATION_RESULTS_MAX:
            raise AllocationError(f"claim {claim.key}: {spec.count} devices exceed the claim limit of {ALLOCATION_RESULTS_MAX}",
                                  f"ResourceClaim {claim.key}", "spec.devices.requests")
        got = 0
        for ref in candidates:  # taken lazily: the caller may order the rest only if the first do not do
            seen.append(ref)
            if self._take(alt, ref, must=False) is not None:
                got += 1
                if got == spec.count:
                    return self._build(0)
        raise NoAllocation(self._reason())

    def run(self) -> list[Allocation]:
        for ci, claim in enumerate(self.claims):
            reqs = []
            for r in claim.spec.requests:
                alts = []
                for spec in r.alternatives():
                    cls = self.a.classes.get(spec.device_class_name)
                    if cls is None:
                        raise AllocationError(f"claim {claim.key}, request {spec.name}: device class {spec.device_class_name} does not exist",
                                              f"ResourceClaim {claim.key}", f"request {spec.name}: deviceClassName")
                    sub = spec.name if r.exactly is None else ""
                    alt = _Alt(ci, f"{r.name}/{sub}" if sub else r.name, r.name, sub, spec, cls, spec.count)
                    if spec.allocation_mode == "All":
                        alt.all_devices = self._all_devices(claim, alt)
                        alt.count = len(alt.all_devices)
                    alts.append(alt)
                reqs.append(alts)
            self.alts.append(reqs)
            cons: list[_MatchConstraint] = []
            for c in claim.spec.constraints:
                if c.match_attribute:
                    cons.append(_MatchConstraint(c.match_attribute, c.requests))
                else:
                    cons.append(_DistinctConstraint(c.distinct_attribute or "", c.requests))
            self.constraints.append(cons)
            need = sum(min(a.count for a in alts) for alts in reqs)
            if need > ALLOCATION_RESULTS_MAX:
                raise AllocationError(f"claim {claim.key}: {need} devices exceed the claim limit of {ALLOCATION_RESULTS_MAX}",
                                      f"ResourceClaim {claim.key}", "spec.devices.requests")
        if not self._one(0, 0, 0, 0):
            raise NoAllocation(self._reason())
        return [self._build(ci) for ci in range(len(self.claims))]

    # candidates ---------------------------------------------------------------------------------
    def _selectable(self, claim: ResourceClaim, alt: _Alt, ref: DeviceRef) -> bool:
        if ref.device.problem:
            return False
        return self.a.matches(ref, claim, alt.cls, alt.spec)

    def _candidates(self, alt: _Alt) -> list[DeviceRef]:
        if alt.candidates is None:
            claim = self.claims[alt.claim]
            c = [r for r in self.node_devices if self._selectable(claim, alt, r)]
            if self.a.prefer is not None and len(c) > 1:
                c = self.a.prefer(alt.claim, alt.spec, c)
            alt.candidates = c
        return alt.candidates

    def _all_devices(self, claim: ResourceClaim, alt: _Alt) -> list[DeviceRef]:
        out = []
        for p in self.pools:
            if not p.info.complete:
                raise NoAllocation(f"claim {claim.key}, request {alt.request_name}: asks for all devices, but resource pool "
                                   f"{p.info.driver}/{p.info.name} is currently being updated")
            if p.info.invalid or p.info.malformed:
                raise NoAllocation(f"claim {claim.key}, request {alt.request_name}: asks for all devices, but resource pool "
                                   f"{p.info.driver}/{p.info.name} is invalid ({p.info.invalid or 'malformed devices'})")
            for r in p.devices:
                if self._selectable(claim, alt, r):
                    c = consumed_capacity(alt.spec.capacity_requests, r.device.capacity, r.driver)
                    if c is not None and capacity_fits(c, r.device.capacity, r.driver, None, None):
                        out.append(r)
        return out

    # recursion ------------------------------------------------------------------------------------
    def _one(self, ci: int, ri: int, di: int, start: int, alt: _Alt | None = None) -> bool:
        self.steps += 1
        if self.steps > self.a.max_steps:
            raise NoAllocation(f"gave up after {self.a.max_steps} allocation steps (too many combinations on this node)")
        if ci >= len(self.claims):
            return True
        if ri >= len(self.alts[ci]):
            return self._one(ci + 1, 0, 0, 0)
        if alt is None:
            for cand in self.alts[ci][ri]:  # firstAvailable: the first subrequest that works
                if len(self.result[ci]) + cand.count > ALLOCATION_RESULTS_MAX:
                    continue
                if self._one(ci, ri, 0, 0, cand):
                    return True
            return False
        if di >= alt.count:
            return self._one(ci, ri + 1, 0, 0)
        if alt.all_devices is not None:
            if not alt.all_devices:
                return False
            ref = alt.all_devices[di]
            pick = self._take(alt, ref, must=True)
            if pick is None:
                return False
            if self._one(ci, ri, di + 1, 0, alt):
                return True
            self._give(pick)
            return False
        cands = self._candidates(alt)
        for k in range(start, len(cands)):
            pick = self._take(alt, cands[k], must=False)
            if pick is None:
                continue
            if self._one(ci, ri, di + 1, k + 1, alt):
                return True
            self._give(pick)
        return False

    def _take(self, alt: _Alt, ref: DeviceRef, must: bool) -> _Pick | None:
        d = ref.device
        did = ref.device_id
        spec = alt.spec
        admin = bool(spec.admin_access)
        multi = d.allow_multiple_allocations
        if admin and not multi and alt.claim in self.allocating.get(did, ()):
            return self._no(alt, "in use")
        if not admin and (did in self.a.allocated.exclusive or self.allocating.get(did)):
            return self._no(alt, "in use")
        if not admin and not multi and did in self.a.allocated.shared:
            return self._no(alt, "in use")
        # the same for every device alike and every claim of one template (requests are interned: by identity)
        ckey = (id(spec), ref.capacity_key)
        entry = _CONSUMED.get(ckey)
        if entry is None or entry[0] is not spec:
            got = consumed_capacity(spec.capacity_requests, d.capacity, ref.driver)
            if len(_CONSUMED) > 100_000:
                _CONSUMED.clear()
            caps = _qualified(d.capacity, ref.driver)
            entry = _CONSUMED[ckey] = (spec, got, got is not None and any(_violates(got[n], cap) for n, cap in caps.items()),
                                       got is not None and _fits_beside(got, caps, None, None))
        _, consumed, violates, fits_alone = entry
        if consumed is None:
            return self._no(alt, "has none of the requested capacity")
        already = self.a.allocated.consumed.get(did) if multi else None
        allocating = self.allocating_cap.get(did) if multi else None
        if violates or not (_fits_beside(consumed, _qualified(d.capacity, ref.driver), already, allocating)
                            if already or allocating else fits_alone):  # nothing taken yet: what it takes alone
            return self._no(alt, "not enough capacity left")
        counted = False
        if d.consumes_counters and not (multi and (did in self.a.allocated.shared or did in self.allocating_shares)):
            if not self._counters_take(ref):
                return self._no(alt, "shared counters used up")
            counted = True
        if taint_blocks(d, spec):
            if counted:
                self._counters_give(ref)
            return self._no(alt, "tainted")
        added: list[_MatchConstraint] = []
        for c in self.constraints[alt.claim]:
            if not c.add(alt, ref):
                for x in reversed(added):
                    x.remove(alt, ref)
                if counted:
                    self._counters_give(ref)
                if must:
                    raise NoAllocation(f"claim {self.claims[alt.claim].key}, request {alt.request_name}: cannot add device "
                                       f"{'/'.join(did)} because a claim constraint would not be satisfied")
                return self._no(alt, f"constraint {c.attr}")
            added.append(c)
        share = multi
        if not multi:
            self.allocating.setdefault(did, set()).add(alt.claim)
        else:
            cur = self.allocating_cap.setdefault(did, {})
            for k, v in consumed.items():
                prev = cur.get(k)
                cur[k] = v if prev is None else prev + v
            self.allocating_shares[did] = self.allocating_shares.get(did, 0) + 1
        pick = _Pick(alt, ref, share, consumed if multi else None, counted)
        self.result[alt.claim].append(pick)
        return pick

    def _give(self, pick: _Pick) -> None:
        alt, ref = pick.alt, pick.ref
        did = ref.device_id
        self.result[alt.claim].pop()
        if pick.share:
            cur = self.allocating_cap[did]
            for k, v in (pick.consumed or {}).items():
                cur[k] -= v
            self.allocating_shares[did] -= 1
            if not self.allocating_shares[did]:
                del self.allocating_shares[did]
                del self.allocating_cap[did]
        else:
            s = self.allocating[did]
            s.discard(alt.claim)
            if not s:
                del self.allocating[did]
        for c in reversed(self.constraints[alt.claim]):
            c.remove(alt, ref)
        if pick.counted:
            self._counters_give(ref)

    def _no(self, alt: _Alt, why: str) -> _Pick | None:
        """Note why a device was turned away (for the reason), and turn it away."""
        self.why.setdefault(alt.request_name, set()).add(why)
        return None

    # shared counters (partitionable devices) --------------------------------------------------------
    def _pool_available(self, ref: DeviceRef) -> dict[str, dict[str, Fraction]]:
        pid = (ref.driver, ref.pool)
        got = self.available.get(pid)
        if got is None:
            info = self.a.inventory.pools[pid]
            got = {cs.name: dict(cs.counters) for s in info.slices for cs in s.shared_counters}
            for s in info.slices:
                for d in s.devices:
                    if self.a.allocated.in_use((s.driver, s.pool.name, d.name)):
                        for cc in d.consumes_counters:
                            for name, v in cc.counters:
                                if name in got.get(cc.counter_set, {}):
                                    got[cc.counter_set][name] -= v
            self.available[pid] = got
        return got

    def _counters_take(self, ref: DeviceRef) -> bool:
        avail = self._pool_available(ref)
        used = self.counters.setdefault((ref.driver, ref.pool), {})
        for cc in ref.device.consumes_counters:
            u = used.setdefault(cc.counter_set, {})
            for name, v in cc.counters:
                u[name] = u.get(name, Fraction(0)) + v
        for cs, counters in avail.items():
            for name, v in counters.items():
                if used.get(cs, {}).get(name, 0) > v:
                    self._counters_give(ref)
                    return False
        return True

    def _counters_give(self, ref: DeviceRef) -> None:
        used = self.counters[(ref.driver, ref.pool)]
        for cc in ref.device.consumes_counters:
            for name, v in cc.counters:
                used[cc.counter_set][name] -= v

    # result ---------------------------------------------------------------------------------------
    def _build(self, ci: int) -> Allocation:
        claim = self.claims[ci]
        results = []
        for pick in self.result[ci]:
            spec = pick.alt.spec
            d = pick.ref.device
            results.append(DeviceResult(
                pick.alt.request_name, pick.ref.driver, pick.ref.pool, d.name,
                True if spec.admin_access else None, spec.tolerations,
                self.a.share_id() if pick.share else None,
                dict(pick.consumed) if pick.share and pick.consumed is not None else None,
                d.binding_conditions, d.binding_failure_conditions))
        if not claim.spec.config and not any(p.alt.cls.config for p in self.result[ci]):  # nothing to copy (most claims)
            return Allocation(tuple(results), (), *self._node_selector(ci))
        config: list[Mapping] = []
        seen_cls: dict[str, list[int]] = {}
        chosen = {p.alt.base: p.alt for p in self.result[ci]}
        for r in claim.spec.requests:
            alt = chosen.get(r.name)
            if alt is None:
                continue
            if alt.cls.name in seen_cls:
                for i in seen_cls[alt.cls.name]:
                    config[i] = {**config[i], "requests": list(config[i]["requests"]) + [alt.request_name]}
                continue
            idx = []
            for c in alt.cls.config:
                idx.append(len(config))
                config.append({"source": "FromClass", "requests": [alt.request_name], **dict(c)})
            seen_cls[alt.cls.name] = idx
        names = {a.request_name for a in chosen.values()} | set(chosen)
        for c in claim.spec.config:
            reqs = list(c.get("requests") or [])
            if not reqs or any(x in names for x in reqs):
                config.append({"source": "FromClaim", **dict(c)})
        all_names = {r.name for r in claim.spec.requests}
        for i, c in enumerate(config):
            named = set(c.get("requests") or [])
            if named and all(r in named or (chosen.get(r) is not None and chosen[r].request_name in named) for r in all_names):
                config[i] = {k: v for k, v in c.items() if k != "requests"}
        return Allocation(tuple(results), tuple(config), *self._node_selector(ci))

    def _node_selector(self, ci: int) -> tuple[dict | None, str | None]:
        exprs: list[dict] = []
        fields_: list[dict] = []
        for pick in self.result[ci]:
            s = pick.ref.slice
            node_name = pick.ref.device.node_name if s.per_device_node_selection else s.node_name
            sel = pick.ref.device.node_selector if s.per_device_node_selection else s.node_selector
            if node_name is not None or pick.ref.device.binds_to_node:
                return ({"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]}, self.node)
            if sel is not None and sel.terms:
                for req in sel.terms[0].requirements:
                    e = {"key": req.key, "operator": req.operator, "values": list(req.values)} if req.values else \
                        {"key": req.key, "operator": req.operator}
                    target = fields_ if req.key == "metadata.name" else exprs
                    if e not in target:
                        target.append(e)
        if not exprs and not fields_:
            return None, None
        term: dict = {}
        if exprs:
            term["matchExpressions"] = exprs
        if fields_:
            term["matchFields"] = fields_
        return {"nodeSelectorTerms": [term]}, None

    def _reason(self) -> str:
        """Why the node failed, per request (for events and explain): what matches, what is free, what blocks."""
        parts = []
        for ci, claim in enumerate(self.claims):
            for alts in self.alts[ci]:
                texts = [self._request_reason(claim, alt) for alt in alts]
                if len(alts) > 1:
                    texts = [f"no subrequest fits ({'; '.join(texts)})"]
                parts.extend(texts)
        return "; ".join(parts) if parts else "cannot allocate all claims"

    def _request_reason(self, claim: ResourceClaim, alt: _Alt) -> str:
        head = f"claim {claim.key}, request {alt.request_name}"
        cands = self._candidates(alt) if alt.all_devices is None else alt.all_devices
        if not cands:
            return f"{head}: no device matches class {alt.cls.name}" + (" and the request's selectors" if alt.spec.selectors else "")
        admin = bool(alt.spec.admin_access)
        free = [r for r in cands if admin or not (r.device_id in self.a.allocated.exclusive or (
            r.device_id in self.a.allocated.shared and not r.device.allow_multiple_allocations))]
        tainted = capacity = usable = 0
        for r in free:
            if taint_blocks(r.device, alt.spec):
                tainted += 1
                continue
            c = consumed_capacity(alt.spec.capacity_requests, r.device.capacity, r.driver)
            if c is None or not capacity_fits(c, r.device.capacity, r.driver, self.a.allocated.consumed.get(r.device_id)
                                              if r.device.allow_multiple_allocations else None, None):
                capacity += 1
                continue
            usable += 1
        text = f"{head}: needs {alt.count}, {len(cands)} match class {alt.cls.name}" + (
            " and the selectors" if alt.spec.selectors else "") + f", {len(free)} of them free"
        if tainted:
            text += f", {tainted} with untolerated taints"
        if capacity:
            text += f", {capacity} without the requested capacity left"
        if usable >= alt.count:
            whys = self.why.get(alt.request_name, set())
            cons = sorted(w[len("constraint "):] for w in whys if w.startswith("constraint "))
            if cons:
                text += f"; the {', '.join(cons)} constraint (matchAttribute/distinctAttribute) cannot be met"
            elif "shared counters used up" in whys:
                text += "; their shared counters are used up"
            else:
                text += "; the claims' requests together need more of them"
        return text


__all__ = ["AllocatedState", "AllocationError", "Allocator", "CapacityError", "Inventory", "NoAllocation", "NodePool",
           "PoolInfo", "capacity_fits", "consumed_capacity", "taint_blocks"]
