"""The resource.k8s.io/v1 objects the allocator reads, typed, parsed once at the edge.

Why typed: the allocator and the CEL layer run per device and per node, thousands of times per pod;
they must not re-check JSON shapes there, and a malformed object must be reported once, naming the
object and the field (``ResourceSlice node-a-gpu: field spec.devices[3].attributes[cudaDriverVersion]:
...``), not fail somewhere deep in a scheduling cycle.  Parsing is pure (dicts in, frozen dataclasses
out); the adapters (kube/, simulator/) feed it what they read.

What is refused, as an error on the object (slices) or a problem on one device: a device whose
attribute has no value or two, a version that is not semver 2.0.0, a string longer than 64
characters, a capacity that is not a quantity; list-typed attributes (alpha, off by default in 1.37)
and compatibility groups (alpha).  A device with a problem is left out of allocation and its pool
counts as incomplete for ``allocationMode: All``; the rest of the slice serves as usual.

Field names and defaults follow k8s.io/api/resource/v1 (1.37): ``allocationMode`` ExactCount and
``count`` 1 by default, toleration ``operator`` Equal by default, a request's unqualified capacity and
attribute names under the device's driver domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal, Mapping

from ..errors import GpufleetError, InvalidQuantity
from ..model import Requirement, SelectorTerm
from ..quantity import parse_quantity
from .cel import DeviceView, parse_semver, quantity_value, semver_value

FINALIZER = "resource.kubernetes.io/delete-protection"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
ALLOCATION_RESULTS_MAX = 32
RESERVED_FOR_MAX = 256
ATTRIBUTE_STRING_MAX = 64

AllocationMode = Literal["ExactCount", "All"]


class InvalidDraObject(GpufleetError):
    """A DRA object that cannot be used: names its kind, its name and the field."""

    def __init__(self, kind: str, name: str, field_path: str, message: str):
        self.kind = kind
        self.name = name
        self.field = field_path
        self.message = message
        super().__init__(f"{kind} {name}: field {field_path}: {message}")


@dataclass(frozen=True)
class Problem:
    """Something wrong with one part of an object that does not stop the rest of it."""

    kind: str
    name: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: field {self.field}: {self.message}"


# --- values --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribute:
    """One typed attribute value: int, bool, string or version (semver)."""

    kind: Literal["int", "bool", "string", "version"]
    value: int | bool | str

    def cel(self) -> Any:
        if self.kind == "version":
            return semver_value(parse_semver(str(self.value)))
        return self.value

    def to_api(self) -> dict:
        return {self.kind: self.value}


@dataclass(frozen=True)
class CapacityRange:
    min: Fraction
    max: Fraction | None = None
    step: Fraction | None = None


@dataclass(frozen=True)
class RequestPolicy:
    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    valid_range: CapacityRange | None = None


@dataclass(frozen=True)
class Capacity:
    value: Fraction
    request_policy: RequestPolicy | None = None


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # None | NoSchedule | NoExecute


@dataclass(frozen=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def tolerates(self, taint: DeviceTaint) -> bool:
        """resourceclaim.ToleratesTaint: effect (empty = all), then key/operator/value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value

    def to_api(self) -> dict:
        out: dict[str, Any] = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True)
class CounterConsumption:
    counter_set: str
    counters: tuple[tuple[str, Fraction], ...]


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: tuple[tuple[str, Fraction], ...]


@dataclass(frozen=True)
class NodeSelector:
    """A node selector (terms ORed); ``metadata.name`` field requirements included."""

    terms: tuple[SelectorTerm, ...]

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        return any(_term_matches(t, node_name, labels) for t in self.terms)


def _term_matches(term: SelectorTerm, node_name: str, labels: Mapping[str, str]) -> bool:
    for r in term.requirements:
        v = node_name if r.key == "metadata.name" else labels.get(r.key)
        if r.operator == "In":
            ok = v is not None and v in r.values
        elif r.operator == "NotIn":
            ok = v is None or v not in r.values
        elif r.operator == "Exists":
            ok = v is not None
        elif r.operator == "DoesNotExist":
            ok = v is None
        else:
            try:
                ok = v is not None and (int(v) > int(r.values[0]) if r.operator == "Gt" else int(v) < int(r.values[0]))
            except ValueError:
                ok = False
        if not ok:
            return False
    return bool(term.requirements)


# --- ResourceSlice ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict, hash=False)
    capacity: Mapping[str, Capacity] = field(default_factory=dict, hash=False)
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple_allocations: bool = False
    consumes_counters: tuple[CounterConsumption, ...] = ()
    node_name: str | None = None  # per-device node selection
    all_nodes: bool = False
    node_selector: NodeSelector | None = None
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    problem: str | None = None  # set when the device cannot be used (malformed attribute, ...)

    def attribute(self, driver: str, qualified: str) -> Attribute | None:
        """lookupAttribute: a fully qualified name, or the bare id when the domain is the driver's."""
        a = self.attributes.get(qualified)
        if a is not None:
            return a
        domain, _, ident = qualified.rpartition("/")
        if domain == driver:
            return self.attributes.get(ident)
        return None


@dataclass(frozen=True)
class Pool:
    name: str
    generation: int
    slice_count: int


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: Pool
    devices: tuple[Device, ...] = ()
    node_name: str | None = None
    all_nodes: bool = False
    node_selector: NodeSelector | None = None
    per_device_node_selection: bool = False
    shared_counters: tuple[CounterSet, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def pool_id(self) -> tuple[str, str]:
        return (self.driver, self.pool.name)


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def device_view(driver: str, pool: str, d: Device) -> DeviceView:
    """The CEL ``device`` variable of one device (see cel.py)."""
    attrs: dict[str, dict[str, Any]] = {}
    for k, a in d.attributes.items():
        dom, ident = split_qualified(k, driver)
        attrs.setdefault(dom, {})[ident] = a.cel()
    caps: dict[str, dict[str, Any]] = {}
    for k, c in d.capacity.items():
        dom, ident = split_qualified(k, driver)
        caps.setdefault(dom, {})[ident] = quantity_value(c.value)
    return DeviceView(f"{driver}/{pool}/{d.name}", driver, d.allow_multiple_allocations, attrs, caps)


# --- DeviceClass -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    config: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)  # raw, copied into allocations
    extended_resource_name: str | None = None
    created: str = ""  # creationTimestamp (RFC 3339): the newest class wins an extended resource name


# --- ResourceClaim / Template ------------------------------------------------------------------


@dataclass(frozen=True)
class ExactRequest:
    """ExactDeviceRequest, and DeviceSubRequest (which has no adminAccess)."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = "ExactCount"
    count: int = 1
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity_requests: Mapping[str, Fraction] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class DeviceRequest:
    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[ExactRequest, ...] = ()

    def alternatives(self) -> tuple[ExactRequest, ...]:
        return (self.exactly,) if self.exactly is not None else self.first_available


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class ClaimSpec:
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)


@dataclass(frozen=True)
class DeviceResult:
    """status.allocation.devices.results[]: one device given to one request."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    share_id: str | None = None
    consumed_capacity: Mapping[str, Fraction] | None = field(default=None, hash=False)
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def device_id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    def to_api(self) -> dict:
        out: dict[str, Any] = {"request": self.request, "driver": self.driver, "pool": self.pool, "device": self.device}
        if self.admin_access is not None:
            out["adminAccess"] = self.admin_access
        if self.tolerations:
            out["tolerations"] = [t.to_api() for t in self.tolerations]
        if self.share_id:
            out["shareID"] = self.share_id
        if self.consumed_capacity is not None:
            out["consumedCapacity"] = {k: format_quantity(v) for k, v in self.consumed_capacity.items()}
        if self.binding_conditions:
            out["bindingConditions"] = list(self.binding_conditions)
        if self.binding_failure_conditions:
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        return out


@dataclass(frozen=True)
class Allocation:
    results: tuple[DeviceResult, ...]
    config: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)
    node_selector: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)  # raw v1.NodeSelector
    node_name: str | None = None  # the node a matchFields metadata.name In [node] selector pins it to

    def to_api(self) -> dict:
        out: dict[str, Any] = {"devices": {"results": [r.to_api() for r in self.results]}}
        if self.config:
            out["devices"]["config"] = [dict(c) for c in self.config]
        if self.node_selector is not None:
            out["nodeSelector"] = dict(self.node_selector)
        return out


@dataclass(frozen=True)
class ConsumerRef:
    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True)
class ResourceClaim:
    namespace: str
    name: str
    uid: str = ""
    spec: ClaimSpec = field(default_factory=ClaimSpec)
    allocation: Allocation | None = None
    reserved_for: tuple[ConsumerRef, ...] = ()
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    owner_pod_uid: str | None = None  # controller owner of kind Pod (claims from templates, extended-resource claims)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def extended_resource_claim(self) -> bool:
        return self.annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"

    def reserved_by(self, pod_uid: str) -> bool:
        return any(r.uid == pod_uid for r in self.reserved_for)


@dataclass(frozen=True)
class ResourceClaimTemplate:
    namespace: str
    name: str
    spec: ClaimSpec
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    raw_spec: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)  # spec.spec as read

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --- parsing -------------------------------------------------------------------------------------


class _P:
    """Parse helpers bound to one object (kind, name) so every error names them."""

    def __init__(self, kind: str, name: str):
        self.kind = kind
        self.name = name

    def fail(self, path: str, message: str) -> InvalidDraObject:
        return InvalidDraObject(self.kind, self.name, path, message)

    def obj(self, path: str, v: Any, required: bool = False) -> Mapping[str, Any]:
        if v is None:
            if required:
                raise self.fail(path, "is required")
            return {}
        if not isinstance(v, Mapping):
            raise self.fail(path, "must be an object")
        return v

    def lst(self, path: str, v: Any) -> list:
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(path, "must be a list")
        return v

    def string(self, path: str, v: Any, required: bool = False) -> str:
        if v is None or v == "":
            if required:
                raise self.fail(path, "is required")
            return ""
        if not isinstance(v, str):
            raise self.fail(path, "must be a string")
        return v

    def integer(self, path: str, v: Any, default: int) -> int:
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(path, "must be an integer")
        return v

    def boolean(self, path: str, v: Any) -> bool | None:
        if v is None:
            return None
        if not isinstance(v, bool):
            raise self.fail(path, "must be true or false")
        return v

    def quantity(self, path: str, v: Any) -> Fraction:
        try:
            return Fraction(parse_quantity(v))
        except InvalidQuantity:
            raise self.fail(path, f"{v!r} is not a quantity") from None

    def selectors(self, path: str, v: Any) -> tuple[str, ...]:
        out = []
        for i, s in enumerate(self.lst(path, v)):
            s = self.obj(f"{path}[{i}]", s)
            cel = self.obj(f"{path}[{i}].cel", s.get("cel"))
            if not cel:
                raise self.fail(f"{path}[{i}]", "has no cel expression (an unknown selector type?)")
            out.append(self.string(f"{path}[{i}].cel.expression", cel.get("expression"), required=True))
        return tuple(out)

    def node_selector(self, path: str, v: Any) -> NodeSelector | None:
        if v is None:
            return None
        ns = self.obj(path, v)
        terms = []
        for i, t in enumerate(self.lst(f"{path}.nodeSelectorTerms", ns.get("nodeSelectorTerms"))):
            tp = f"{path}.nodeSelectorTerms[{i}]"
            t = self.obj(tp, t)
            reqs = []
            for part in ("matchExpressions", "matchFields"):
                for j, e in enumerate(self.lst(f"{tp}.{part}", t.get(part))):
                    ep = f"{tp}.{part}[{j}]"
                    e = self.obj(ep, e)
                    op = e.get("operator")
                    if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                        raise self.fail(f"{ep}.operator", f"unknown operator {op!r}")
                    key = self.string(f"{ep}.key", e.get("key"), required=True)
                    if part == "matchFields" and key != "metadata.name":
                        raise self.fail(f"{ep}.key", "only metadata.name is supported")
                    reqs.append(Requirement(key, op, tuple(str(x) for x in self.lst(f"{ep}.values", e.get("values")))))
            terms.append(SelectorTerm(tuple(reqs)))
        return NodeSelector(tuple(terms))

    def tolerations(self, path: str, v: Any) -> tuple[DeviceToleration, ...]:
        out = []
        for i, t in enumerate(self.lst(path, v)):
            tp = f"{path}[{i}]"
            t = self.obj(tp, t)
            op = t.get("operator") or "Equal"
            if op not in ("Equal", "Exists"):
                raise self.fail(f"{tp}.operator", f"must be Equal or Exists, not {op!r}")
            eff = t.get("effect") or ""
            if eff not in ("", "NoSchedule", "NoExecute", "None"):
                raise self.fail(f"{tp}.effect", f"must be NoSchedule, NoExecute, None or empty, not {eff!r}")
            secs = t.get("tolerationSeconds")
            if secs is not None and (isinstance(secs, bool) or not isinstance(secs, int)):
                raise self.fail(f"{tp}.tolerationSeconds", "must be an integer")
            out.append(DeviceToleration(self.string(f"{tp}.key", t.get("key")), op, self.string(f"{tp}.value", t.get("value")),
                                        eff, secs))
        return tuple(out)


def format_quantity(v: Fraction) -> str:
    """A quantity as the API writes it back (exact; binary suffixes where they are exact)."""
    if v.denominator == 1:
        n = v.numerator
        for suf, mult in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if n and n % mult == 0:
                return f"{n // mult}{suf}"
        return str(n)
    milli = v * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    nano = v * 10**9
    return f"{-(-nano.numerator // nano.denominator)}n"  # finer than the API's nano: rounded up


def _meta(p: _P, obj: Any) -> tuple[Mapping[str, Any], str]:
    if not isinstance(obj, Mapping):
        raise InvalidDraObject(p.kind, "<unknown>", "", "must be a JSON object")
    meta = p.obj("metadata", obj.get("metadata"), required=True)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidDraObject(p.kind, "<unknown>", "metadata.name", "is required")
    p.name = name
    return meta, name


def parse_device_class(obj: Any) -> DeviceClass:
    p = _P("DeviceClass", "<unknown>")
    meta, name = _meta(p, obj)
    spec = p.obj("spec", obj.get("spec"))
    config = tuple(p.obj(f"spec.config[{i}]", c) for i, c in enumerate(p.lst("spec.config", spec.get("config"))))
    ern = spec.get("extendedResourceName")
    return DeviceClass(name, p.selectors("spec.selectors", spec.get("selectors")), config,
                       p.string("spec.extendedResourceName", ern) or None, str(meta.get("creationTimestamp") or ""))


def _exact(p: _P, path: str, r: Mapping[str, Any], name: str, sub: bool) -> ExactRequest:
    cls = p.string(f"{path}.deviceClassName", r.get("deviceClassName"), required=True)
    mode = r.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise p.fail(f"{path}.allocationMode", f"must be ExactCount or All, not {mode!r}")
    count = p.integer(f"{path}.count", r.get("count"), 1)
    if mode == "ExactCount" and count < 1:
        raise p.fail(f"{path}.count", "must be at least 1")
    if mode == "All" and r.get("count") is not None:
        raise p.fail(f"{path}.count", "must not be set with allocationMode All")
    admin = None if sub else p.boolean(f"{path}.adminAccess", r.get("adminAccess"))
    caps = None
    cap = r.get("capacity")
    if cap is not None:
        reqs = p.obj(f"{path}.capacity.requests", p.obj(f"{path}.capacity", cap).get("requests"))
        caps = {k: p.quantity(f"{path}.capacity.requests[{k}]", v) for k, v in reqs.items()}
    if r.get("derivedAttributes"):
        raise p.fail(f"{path}.derivedAttributes", "derived attributes (alpha) are not supported")
    req = ExactRequest(name, cls, p.selectors(f"{path}.selectors", r.get("selectors")), "All" if mode == "All" else "ExactCount",
                       count, admin,
                       p.tolerations(f"{path}.tolerations", r.get("tolerations")), caps)
    return intern_request(req)


_REQUESTS: dict[ExactRequest, ExactRequest] = {}


_INTERN_MAX = 10_000  # distinct values kept per table; a full table starts again


def _intern(table: dict, value: Any) -> Any:
    """``value``, or the equal object ``table`` kept before: one object per distinct value."""
    got = table.get(value)
    if got is None:
        if len(table) >= _INTERN_MAX:
            table.clear()
        got = table.setdefault(value, value)
    return got


def intern_request(req: ExactRequest) -> ExactRequest:
    """One object per distinct request (every claim of one template asks the same): the allocator's and the
    plugin's caches keyed by a request then find it by identity instead of comparing its quantities."""
    return _intern(_REQUESTS, req)


def parse_claim_spec(p: _P, path: str, spec: Any) -> ClaimSpec:
    spec = p.obj(path, spec)
    devices = p.obj(f"{path}.devices", spec.get("devices"))
    requests = []
    names: set[str] = set()
    for i, r in enumerate(p.lst(f"{path}.devices.requests", devices.get("requests"))):
        rp = f"{path}.devices.requests[{i}]"
        r = p.obj(rp, r)
        name = p.string(f"{rp}.name", r.get("name"), required=True)
        if name in names:
            raise p.fail(f"{rp}.name", f"duplicate request name {name!r}")
        names.add(name)
        ex, fa = r.get("exactly"), r.get("firstAvailable")
        if (ex is None) == (fa is None):
            raise p.fail(rp, "must set exactly one of exactly or firstAvailable")
        if ex is not None:
            requests.append(DeviceRequest(name, exactly=_exact(p, f"{rp}.exactly", p.obj(f"{rp}.exactly", ex), name, sub=False)))
        else:
            subs = []
            for j, s in enumerate(p.lst(f"{rp}.firstAvailable", fa)):
                sp = f"{rp}.firstAvailable[{j}]"
                s = p.obj(sp, s)
                subs.append(_exact(p, sp, s, p.string(f"{sp}.name", s.get("name"), required=True), sub=True))
            if not subs:
                raise p.fail(f"{rp}.firstAvailable", "must list at least one subrequest")
            requests.append(DeviceRequest(name, first_available=tuple(subs)))
    constraints = []
    for i, c in enumerate(p.lst(f"{path}.devices.constraints", devices.get("constraints"))):
        cp = f"{path}.devices.constraints[{i}]"
        c = p.obj(cp, c)
        ma, da = c.get("matchAttribute"), c.get("distinctAttribute")
        if (ma is None) == (da is None):
            raise p.fail(cp, "must set exactly one of matchAttribute or distinctAttribute")
        reqs = tuple(p.string(f"{cp}.requests[{j}]", x, required=True) for j, x in enumerate(p.lst(f"{cp}.requests", c.get("requests"))))
        for j, x in enumerate(reqs):
            if x.split("/")[0] not in names:
                raise p.fail(f"{cp}.requests[{j}]", f"names no request of the claim: {x!r}")
        attr = p.string(f"{cp}.{'matchAttribute' if ma is not None else 'distinctAttribute'}", ma if ma is not None else da, True)
        if "/" not in attr:
            raise p.fail(f"{cp}.{'matchAttribute' if ma is not None else 'distinctAttribute'}",
                         f"must be a fully qualified name (domain/name), got {attr!r}")
        constraints.append(Constraint(reqs, attr if ma is not None else None, attr if da is not None else None))
    config = tuple(p.obj(f"{path}.devices.config[{i}]", c) for i, c in enumerate(p.lst(f"{path}.devices.config", devices.get("config"))))
    out = ClaimSpec(tuple(requests), tuple(constraints), config)
    if config:  # equality leaves the config out: only specs without one are one object per value
        return out
    return _intern(_SPECS, out)


_SPECS: dict[ClaimSpec, ClaimSpec] = {}


def _allocation(p: _P, path: str, a: Any) -> Allocation | None:
    if a is None:
        return None
    a = p.obj(path, a)
    devs = p.obj(f"{path}.devices", a.get("devices"))
    results = []
    for i, r in enumerate(p.lst(f"{path}.devices.results", devs.get("results"))):
        rp = f"{path}.devices.results[{i}]"
        r = p.obj(rp, r)
        cc = r.get("consumedCapacity")
        consumed = None
        if cc is not None:
            consumed = {k: p.quantity(f"{rp}.consumedCapacity[{k}]", v) for k, v in p.obj(f"{rp}.consumedCapacity", cc).items()}
        results.append(DeviceResult(
            p.string(f"{rp}.request", r.get("request"), True), p.string(f"{rp}.driver", r.get("driver"), True),
            p.string(f"{rp}.pool", r.get("pool"), True), p.string(f"{rp}.device", r.get("device"), True),
            p.boolean(f"{rp}.adminAccess", r.get("adminAccess")), p.tolerations(f"{rp}.tolerations", r.get("tolerations")),
            p.string(f"{rp}.shareID", r.get("shareID")) or None, consumed,
            tuple(p.lst(f"{rp}.bindingConditions", r.get("bindingConditions"))),
            tuple(p.lst(f"{rp}.bindingFailureConditions", r.get("bindingFailureConditions")))))
    ns = a.get("nodeSelector")
    node_name = None
    if ns is not None:
        sel = p.node_selector(f"{path}.nodeSelector", ns)
        if sel is not None and len(sel.terms) == 1:
            for req in sel.terms[0].requirements:
                if req.key == "metadata.name" and req.operator == "In" and len(req.values) == 1:
                    node_name = req.values[0]
    config = tuple(p.obj(f"{path}.devices.config[{i}]", c) for i, c in enumerate(p.lst(f"{path}.devices.config", devs.get("config"))))
    return Allocation(tuple(results), config, ns, node_name)


def parse_claim(obj: Any) -> ResourceClaim:
    p = _P("ResourceClaim", "<unknown>")
    meta, name = _meta(p, obj)
    ns = p.string("metadata.namespace", meta.get("namespace")) or "default"
    p.name = f"{ns}/{name}"
    spec = parse_claim_spec(p, "spec", obj.get("spec"))
    status = p.obj("status", obj.get("status"))
    reserved = []
    for i, r in enumerate(p.lst("status.reservedFor", status.get("reservedFor"))):
        rp = f"status.reservedFor[{i}]"
        r = p.obj(rp, r)
        reserved.append(ConsumerRef(p.string(f"{rp}.resource", r.get("resource"), True), p.string(f"{rp}.name", r.get("name")),
                                    p.string(f"{rp}.uid", r.get("uid"), True), p.string(f"{rp}.apiGroup", r.get("apiGroup"))))
    owner = None
    for o in p.lst("metadata.ownerReferences", meta.get("ownerReferences")):
        if isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("controller"):
            owner = str(o.get("uid") or "")
    ann = p.obj("metadata.annotations", meta.get("annotations"))
    return ResourceClaim(
        ns, name, str(meta.get("uid") or ""), spec, _allocation(p, "status.allocation", status.get("allocation")),
        tuple(reserved), bool(meta.get("deletionTimestamp")), tuple(str(f) for f in p.lst("metadata.finalizers", meta.get("finalizers"))),
        owner, {str(k): str(v) for k, v in ann.items()}, str(meta.get("resourceVersion") or ""))


def parse_claim_template(obj: Any) -> ResourceClaimTemplate:
    p = _P("ResourceClaimTemplate", "<unknown>")
    meta, name = _meta(p, obj)
    ns = p.string("metadata.namespace", meta.get("namespace")) or "default"
    p.name = f"{ns}/{name}"
    outer = p.obj("spec", obj.get("spec"), required=True)
    tmeta = p.obj("spec.metadata", outer.get("metadata"))
    inner = outer.get("spec")
    spec = parse_claim_spec(p, "spec.spec", inner)
    return ResourceClaimTemplate(ns, name, spec, dict(p.obj("spec.metadata.labels", tmeta.get("labels"))),
                                 dict(p.obj("spec.metadata.annotations", tmeta.get("annotations"))), dict(p.obj("spec.spec", inner)))


def _attribute(p: _P, path: str, v: Any) -> Attribute:
    if not isinstance(v, Mapping):
        raise p.fail(path, "must be an object with one of int, bool, string, version")
    if any(k in v for k in ("ints", "bools", "strings", "versions")):
        raise p.fail(path, "list-typed attributes (DRAListTypeAttributes, alpha) are not supported")
    kinds = [k for k in ("int", "bool", "string", "version") if v.get(k) is not None]
    if len(kinds) != 1:
        raise p.fail(path, "must set exactly one of int, bool, string, version")
    k = kinds[0]
    x = v[k]
    if k == "int" and (isinstance(x, bool) or not isinstance(x, int)):
        raise p.fail(f"{path}.int", "must be an integer")
    if k == "bool" and not isinstance(x, bool):
        raise p.fail(f"{path}.bool", "must be true or false")
    if k in ("string", "version"):
        if not isinstance(x, str):
            raise p.fail(f"{path}.{k}", "must be a string")
        if len(x) > ATTRIBUTE_STRING_MAX:
            raise p.fail(f"{path}.{k}", f"is {len(x)} characters long, at most {ATTRIBUTE_STRING_MAX} are allowed")
        if k == "version":
            try:
                parse_semver(x)
            except ValueError as exc:
                raise p.fail(f"{path}.version", str(exc)) from None
    return Attribute(k, x)  # type: ignore[arg-type]


def _capacity(p: _P, path: str, v: Any) -> Capacity:
    v = p.obj(path, v, required=True)
    value = p.quantity(f"{path}.value", v.get("value"))
    pol = v.get("requestPolicy")
    policy = None
    if pol is not None:
        pol = p.obj(f"{path}.requestPolicy", pol)
        default = p.quantity(f"{path}.requestPolicy.default", pol["default"]) if pol.get("default") is not None else None
        values = tuple(p.quantity(f"{path}.requestPolicy.validValues[{i}]", x)
                       for i, x in enumerate(p.lst(f"{path}.requestPolicy.validValues", pol.get("validValues"))))
        if list(values) != sorted(values):
            raise p.fail(f"{path}.requestPolicy.validValues", "must be sorted ascending")
        rng = None
        if pol.get("validRange") is not None:
            r = p.obj(f"{path}.requestPolicy.validRange", pol["validRange"])
            if r.get("min") is None:
                raise p.fail(f"{path}.requestPolicy.validRange.min", "is required")
            step = p.quantity(f"{path}.requestPolicy.validRange.step", r["step"]) if r.get("step") is not None else None
            if step is not None and step <= 0:
                raise p.fail(f"{path}.requestPolicy.validRange.step", "must be positive")
            rng = CapacityRange(p.quantity(f"{path}.requestPolicy.validRange.min", r["min"]),
                                p.quantity(f"{path}.requestPolicy.validRange.max", r["max"]) if r.get("max") is not None else None,
                                step)
        policy = RequestPolicy(default, values, rng)
    return Capacity(value, policy)


def _device(p: _P, path: str, d: Any, per_device: bool) -> Device:
    d = p.obj(path, d)
    name = p.string(f"{path}.name", d.get("name"), required=True)
    problem = None
    attrs: dict[str, Attribute] = {}
    caps: dict[str, Capacity] = {}
    try:
        for k, v in p.obj(f"{path}.attributes", d.get("attributes")).items():
            attrs[k] = _attribute(p, f"{path}.attributes[{k}]", v)
        for k, v in p.obj(f"{path}.capacity", d.get("capacity")).items():
            caps[k] = _capacity(p, f"{path}.capacity[{k}]", v)
        for i, cc in enumerate(p.lst(f"{path}.consumesCounters", d.get("consumesCounters"))):
            if isinstance(cc, Mapping) and cc.get("compatibilityGroups"):
                raise p.fail(f"{path}.consumesCounters[{i}].compatibilityGroups", "compatibility groups (alpha) are not supported")
    except InvalidDraObject as exc:
        problem = f"field {exc.field}: {exc.message}"
    taints = []
    for i, t in enumerate(p.lst(f"{path}.taints", d.get("taints"))):
        tp = f"{path}.taints[{i}]"
        t = p.obj(tp, t)
        eff = t.get("effect") or ""
        if eff not in ("NoSchedule", "NoExecute", "None"):
            problem = problem or f"field {tp}.effect: must be NoSchedule, NoExecute or None, not {eff!r}"
        taints.append(DeviceTaint(p.string(f"{tp}.key", t.get("key"), True), p.string(f"{tp}.value", t.get("value")), eff))
    counters = []
    for i, cc in enumerate(p.lst(f"{path}.consumesCounters", d.get("consumesCounters"))):
        cp = f"{path}.consumesCounters[{i}]"
        cc = p.obj(cp, cc)
        counters.append(CounterConsumption(
            p.string(f"{cp}.counterSet", cc.get("counterSet"), True),
            tuple((k, p.quantity(f"{cp}.counters[{k}].value", p.obj(f"{cp}.counters[{k}]", v).get("value")))
                  for k, v in p.obj(f"{cp}.counters", cc.get("counters")).items())))
    amm = p.boolean(f"{path}.allowMultipleAllocations", d.get("allowMultipleAllocations")) or False
    if per_device and d.get("nodeName") is None and not d.get("allNodes") and d.get("nodeSelector") is None:
        raise p.fail(path, "perDeviceNodeSelection needs nodeName, nodeSelector or allNodes on every device")
    return Device(
        name, attrs, caps, tuple(taints), amm, tuple(counters), p.string(f"{path}.nodeName", d.get("nodeName")) or None,
        bool(p.boolean(f"{path}.allNodes", d.get("allNodes"))), p.node_selector(f"{path}.nodeSelector", d.get("nodeSelector")),
        bool(p.boolean(f"{path}.bindsToNode", d.get("bindsToNode"))),
        tuple(str(x) for x in p.lst(f"{path}.bindingConditions", d.get("bindingConditions"))),
        tuple(str(x) for x in p.lst(f"{path}.bindingFailureConditions", d.get("bindingFailureConditions"))),
        problem)


def parse_slice(obj: Any) -> ResourceSlice:
    """A ResourceSlice; a device with a malformed part is kept with ``problem`` set (and listed in ``problems``)."""
    p = _P("ResourceSlice", "<unknown>")
    _meta(p, obj)
    spec = p.obj("spec", obj.get("spec"), required=True)
    driver = p.string("spec.driver", spec.get("driver"), required=True)
    pool = p.obj("spec.pool", spec.get("pool"), required=True)
    pool_t = Pool(p.string("spec.pool.name", pool.get("name"), required=True), p.integer("spec.pool.generation", pool.get("generation"), 0),
                  p.integer("spec.pool.resourceSliceCount", pool.get("resourceSliceCount"), 1))
    if pool_t.slice_count < 1:
        raise p.fail("spec.pool.resourceSliceCount", "must be at least 1")
    node_name = p.string("spec.nodeName", spec.get("nodeName")) or None
    all_nodes = bool(p.boolean("spec.allNodes", spec.get("allNodes")))
    sel = p.node_selector("spec.nodeSelector", spec.get("nodeSelector"))
    per_device = bool(p.boolean("spec.perDeviceNodeSelection", spec.get("perDeviceNodeSelection")))
    if sum([node_name is not None, all_nodes, sel is not None, per_device]) != 1:
        raise p.fail("spec", "must set exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    devices = []
    seen: set[str] = set()
    problems = []
    for i, d in enumerate(p.lst("spec.devices", spec.get("devices"))):
        dev = _device(p, f"spec.devices[{i}]", d, per_device)
        if dev.name in seen:
            raise p.fail(f"spec.devices[{i}].name", f"duplicate device name {dev.name!r}")
        seen.add(dev.name)
        if dev.problem:
            field_path, _, msg = dev.problem.removeprefix("field ").partition(": ")
            problems.append(Problem("ResourceSlice", p.name, field_path, msg))
        devices.append(dev)
    counter_sets = []
    for i, cs in enumerate(p.lst("spec.sharedCounters", spec.get("sharedCounters"))):
        cp = f"spec.sharedCounters[{i}]"
        cs = p.obj(cp, cs)
        counter_sets.append(CounterSet(p.string(f"{cp}.name", cs.get("name"), True), tuple(
            (k, p.quantity(f"{cp}.counters[{k}].value", p.obj(f"{cp}.counters[{k}]", v).get("value")))
            for k, v in p.obj(f"{cp}.counters", cs.get("counters")).items())))
    return ResourceSlice(p.name, driver, pool_t, tuple(devices), node_name, all_nodes, sel, per_device, tuple(counter_sets),
                         tuple(problems))


@dataclass(eq=False)
class DeviceRef:
    """One device of the inventory: where it is, how CEL sees it (built on first use), and the
    selector results seen so far (expression -> bool, or the error it raised)."""

    driver: str
    pool: str
    device: Device
    slice: ResourceSlice
    matches: dict = field(default_factory=dict, repr=False)

    @property
    def device_id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device.name)

    @cached_property
    def view(self) -> DeviceView:
        return device_view(self.driver, self.pool, self.device)

    @cached_property
    def capacity_key(self) -> int | tuple:
        """What a request's consumption of this device depends on: devices alike share it (the allocator's cache).
        A small int per distinct (driver, capacities), so the allocator's lookups hash no quantities; the tuple itself
        once more kinds than ``_CAPACITY_KINDS_MAX`` were seen (never equal to an int: still one key per kind)."""
        key = (self.driver, tuple(sorted(self.device.capacity.items())))
        got = _CAPACITY_KINDS.get(key)
        if got is None:
            if len(_CAPACITY_KINDS) >= _CAPACITY_KINDS_MAX:
                return key
            got = _CAPACITY_KINDS.setdefault(key, len(_CAPACITY_KINDS))
        return got


_CAPACITY_KINDS: dict[tuple, int] = {}
_CAPACITY_KINDS_MAX = 10_000
