"""CEL device selectors, evaluated as kube-scheduler evaluates them.

Why this library: DeviceClass and request selectors are CEL, and a scheduler that disagrees with
kube-scheduler about which device a selector matches hands out the wrong GPU.  So the expressions run
on ``cel-expr-python``, Google's Python binding of the C++ CEL runtime the CEL team maintains (the
parser, macros, optional syntax ``.?x.orValue()``, ``cel.bind``, the strings extension and RE2
``matches`` are the reference implementation's), not on a hand-written evaluator.  ``cel-python``
(``celpy``, pure Python) was measured too: 50x slower per evaluation (270 us against 5 us) and it
parses neither ``.?`` nor ``cel.bind`` nor the strings extension that NVIDIA's examples use
(docs/dra.md).

What Kubernetes adds to CEL and the library lacks is written here, after apiserver's
``pkg/cel/library`` (1.37): ``quantity()`` / ``isQuantity()`` with ``sign``, ``isInteger``,
``asInteger``, ``asApproximateFloat``, ``add``, ``sub``, ``compareTo``, ``isGreaterThan``,
``isLessThan``; ``semver()`` / ``isSemver()`` (with the ``normalize`` argument) with ``major``,
``minor``, ``patch`` and the same comparisons; the lists library (``isSorted``, ``sum``, ``min``,
``max``, ``includes``; the list forms of ``indexOf`` / ``lastIndexOf`` clash with the strings
extension's and are left out) and regex ``find`` / ``findAll``.  Quantities and
versions travel through CEL as one protobuf message type (the runtime dispatches overloads on the
kind of value, so two message types could not share ``isGreaterThan``); its ``value`` is canonical
(an exact fraction, a version without build metadata), so ``==`` compares values as Kubernetes does.

The ``device`` variable is what kube-scheduler builds: ``driver``, ``allowMultipleAllocations``,
``attributes[domain][id]`` and ``capacity[domain][id]``, unqualified names under the driver's domain,
version attributes as semver values.  Looking up a domain the device lacks gives an empty map
(kube-scheduler's default), for every domain the expression names as a string literal.

Errors, as kube-scheduler treats them: an expression that does not compile, or whose result is not a
bool, is a ``CelCompileError``; one that fails on a device (a missing attribute without ``has()``, a
type mismatch, a division by zero) is a ``CelRuntimeError``: the allocation for that claim stops and
the pod is unschedulable with the expression, the device and the error in its reason.  The runtime
cost limit (``CELSelectorExpressionMaxCost``, 1,000,000) has no equivalent in the C++ runtime's Python
binding; its comprehension iteration budget stops runaway loops instead and is reported as the cost
limit.  Expressions longer than 10 KiB are refused as the API refuses them.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping

from ..errors import GpufleetError, InvalidQuantity
from ..quantity import parse_quantity

MAX_EXPRESSION_LENGTH = 10 * 1024  # resourceapi.CELSelectorExpressionMaxLength
DEVICE_FIELDS = ("driver", "allowMultipleAllocations", "attributes", "capacity")


class CelCompileError(GpufleetError):
    """A selector that does not compile (or is not a bool): the claim or class is wrong, not the device."""

    def __init__(self, expression: str, message: str):
        self.expression = expression
        self.message = message
        super().__init__(f"CEL compile error: {message}")


class CelRuntimeError(GpufleetError):
    """A selector that failed on one device."""

    def __init__(self, expression: str, device: str, message: str):
        self.expression = expression
        self.device = device
        self.message = message
        super().__init__(f"CEL runtime error on device {device}: {message}")


# --- semantic versions (semver 2.0.0, as blang/semver parses them) ---------------------------

_NUM = r"(0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER_RE = re.compile(
    rf"^{_NUM}\.{_NUM}\.{_NUM}(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True, order=False)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + ("-" + ".".join(self.pre) if self.pre else "")

    def compare(self, other: "Semver") -> int:
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:
            return 1  # a release is newer than its pre-releases
        if not other.pre:
            return -1
        for x, y in zip(self.pre, other.pre):
            if x == y:
                continue
            xn, yn = x.isdigit(), y.isdigit()
            if xn and yn:
                return -1 if int(x) < int(y) else 1
            if xn != yn:
                return -1 if xn else 1  # numeric identifiers have lower precedence
            return -1 if x < y else 1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))


def parse_semver(text: str) -> Semver:
    """Strict semver 2.0.0 (what the API accepts for version attributes); ValueError otherwise."""
    m = _SEMVER_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a semantic version (semver 2.0.0)")
    return Semver(int(m.group(1)), int(m.group(2)), int(m.group(3)), tuple(m.group(4).split(".")) if m.group(4) else ())


def _normalize_semver(text: str) -> Semver:
    """apiserver's normalizeAndParse: no "v" prefix, missing minor/patch as 0, leading zeros dropped."""
    s = text[1:] if text.startswith("v") else text
    parts = s.split(".", 2)
    for i, p in enumerate(parts):
        if len(p) > 1:
            p = p.lstrip("0")
            if not p or not p[0].isdigit():
                p = "0" + p
            parts[i] = p
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse_semver(".".join(parts))


# --- the value type quantities and versions travel in --------------------------------------

_KIND_QUANTITY = "quantity"
_KIND_SEMVER = "semver"
_MSG_NAME = "kubernetes.dra.ExtValue"


def _build_message_class() -> tuple[Any, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="gpufleet_dra_cel.proto", package="kubernetes.dra", syntax="proto3")
    m = fdp.message_type.add(name="ExtValue")
    m.field.add(name="kind", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    m.field.add(name="value", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool, message_factory.GetMessageClass(pool.FindMessageTypeByName(_MSG_NAME))


_POOL, _ExtValue = _build_message_class()
_FRACTIONS: dict[str, Fraction] = {}
_SEMVERS: dict[str, Semver] = {}


def quantity_value(q: Fraction) -> Any:
    """A quantity as the CEL value (canonical: equal quantities are equal messages)."""
    return _ExtValue(kind=_KIND_QUANTITY, value=str(q))


def semver_value(v: Semver) -> Any:
    return _ExtValue(kind=_KIND_SEMVER, value=str(v))


def _as_fraction(msg: Any) -> Fraction:
    if getattr(msg, "kind", None) != _KIND_QUANTITY:
        raise TypeError(f"no such overload: expected a quantity, got {_type_name(msg)}")
    f = _FRACTIONS.get(msg.value)
    if f is None:
        f = _FRACTIONS[msg.value] = Fraction(msg.value)
        if len(_FRACTIONS) > 65536:
            _FRACTIONS.clear()
    return f


def _as_semver(msg: Any) -> Semver:
    if getattr(msg, "kind", None) != _KIND_SEMVER:
        raise TypeError(f"no such overload: expected a semver, got {_type_name(msg)}")
    v = _SEMVERS.get(msg.value)
    if v is None:
        v = _SEMVERS[msg.value] = parse_semver(msg.value)
        if len(_SEMVERS) > 65536:
            _SEMVERS.clear()
    return v


def _type_name(x: Any) -> str:
    kind = getattr(x, "kind", None)
    if kind:
        return str(kind)
    return type(x).__name__


def _cmp(a: Any, b: Any) -> int:
    if getattr(a, "kind", None) == _KIND_SEMVER:
        return _as_semver(a).compare(_as_semver(b))
    x, y = _as_fraction(a), _as_fraction(b)
    return (x > y) - (x < y)


def _parse_quantity_text(s: str) -> Fraction:
    try:
        return Fraction(parse_quantity(s))
    except InvalidQuantity as exc:
        raise ValueError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {s!r}") from exc


def _is_quantity(s: str) -> bool:
    try:
        _parse_quantity_text(s)
    except ValueError:
        return False
    return True


INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _as_integer(q: Any) -> int:
    f = _as_fraction(q)
    if f.denominator != 1 or not INT64_MIN <= f.numerator <= INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return f.numerator


def _is_integer(q: Any) -> bool:
    f = _as_fraction(q)
    return f.denominator == 1 and INT64_MIN <= f.numerator <= INT64_MAX


def _add(a: Any, b: Any) -> Any:
    return quantity_value(_as_fraction(a) + (Fraction(b) if isinstance(b, int) else _as_fraction(b)))


def _sub(a: Any, b: Any) -> Any:
    return quantity_value(_as_fraction(a) - (Fraction(b) if isinstance(b, int) else _as_fraction(b)))


def _semver(s: str, normalize: bool = False) -> Any:
    return semver_value(_normalize_semver(s) if normalize else parse_semver(s))


def _is_semver(s: str, normalize: bool = False) -> bool:
    try:
        _normalize_semver(s) if normalize else parse_semver(s)
    except ValueError:
        return False
    return True


def _list_min(xs: list) -> Any:
    if not xs:
        raise ValueError("min called on empty list")
    return min(xs)


def _list_max(xs: list) -> Any:
    if not xs:
        raise ValueError("max called on empty list")
    return max(xs)


def _list_sum(xs: list) -> Any:
    return sum(xs[1:], xs[0]) if xs else 0


def _includes(target: Any, x: Any) -> bool:
    if isinstance(target, list):
        return any(y == x for y in target)
    return bool(target == x)


def _find(s: str, pattern: str) -> str:
    m = re.search(pattern, s)
    return m.group(0) if m else ""


def _find_all(s: str, pattern: str, limit: int = -1) -> list:
    if limit == 0:
        return []
    out = [m.group(0) for m in re.finditer(pattern, s)]
    return out if limit < 0 else out[:limit]


def _declarations() -> list:
    from cel_expr_python import cel

    T = cel.Type
    E = T(_MSG_NAME)
    D = T.DYN
    L = T.List(D)
    scalars = (("string", T.STRING), ("int", T.INT), ("uint", T.UINT), ("double", T.DOUBLE), ("bool", T.BOOL), ("ext", E))

    def fn(name: str, *overloads: tuple) -> Any:
        return cel.FunctionDecl(name, [
            cel.Overload(oid, return_type=ret, parameters=list(params), is_member=member, impl=impl)
            for oid, ret, params, member, impl in overloads
        ])

    return [
        fn("quantity", ("string_to_quantity", E, [T.STRING], False, lambda s: quantity_value(_parse_quantity_text(s)))),
        fn("isQuantity", ("is_quantity_string", T.BOOL, [T.STRING], False, _is_quantity)),
        fn("sign", ("quantity_sign", T.INT, [E], True, lambda q: (lambda f: (f > 0) - (f < 0))(_as_fraction(q)))),
        fn("isInteger", ("quantity_is_integer", T.BOOL, [E], True, _is_integer)),
        fn("asInteger", ("quantity_get_integer", T.INT, [E], True, _as_integer)),
        fn("asApproximateFloat", ("quantity_get_float", T.DOUBLE, [E], True, lambda q: float(_as_fraction(q)))),
        fn("add", ("quantity_add", E, [E, E], True, _add), ("quantity_add_int", E, [E, T.INT], True, _add)),
        fn("sub", ("quantity_sub", E, [E, E], True, _sub), ("quantity_sub_int", E, [E, T.INT], True, _sub)),
        fn("isGreaterThan", ("ext_is_greater_than", T.BOOL, [E, E], True, lambda a, b: _cmp(a, b) > 0)),
        fn("isLessThan", ("ext_is_less_than", T.BOOL, [E, E], True, lambda a, b: _cmp(a, b) < 0)),
        fn("compareTo", ("ext_compare_to", T.INT, [E, E], True, _cmp)),
        fn("semver", ("string_to_semver", E, [T.STRING], False, _semver),
           ("string_bool_to_semver", E, [T.STRING, T.BOOL], False, _semver)),
        fn("isSemver", ("is_semver_string", T.BOOL, [T.STRING], False, _is_semver),
           ("is_semver_string_bool", T.BOOL, [T.STRING, T.BOOL], False, _is_semver)),
        fn("major", ("semver_major", T.INT, [E], True, lambda v: _as_semver(v).major)),
        fn("minor", ("semver_minor", T.INT, [E], True, lambda v: _as_semver(v).minor)),
        fn("patch", ("semver_patch", T.INT, [E], True, lambda v: _as_semver(v).patch)),
        fn("isSorted", ("list_is_sorted", T.BOOL, [L], True, lambda xs: all(xs[i] <= xs[i + 1] for i in range(len(xs) - 1)))),
        fn("sum", ("list_sum", D, [L], True, _list_sum)),
        fn("min", ("list_min", D, [L], True, _list_min)),
        fn("max", ("list_max", D, [L], True, _list_max)),
        # the runtime matches overloads on each argument's kind (a dyn parameter matches none): one per kind
        fn("includes", *([(f"list_{k}_includes", T.BOOL, [L, t], True, _includes) for k, t in scalars]
                         + [(f"{k}_includes", T.BOOL, [t, t], True, _includes) for k, t in scalars])),
        fn("find", ("string_find", T.STRING, [T.STRING, T.STRING], True, _find)),
        fn("findAll", ("string_find_all", T.List(T.STRING), [T.STRING, T.STRING], True, _find_all),
           ("string_find_all_n", T.List(T.STRING), [T.STRING, T.STRING, T.INT], True, _find_all)),
    ]


_ENV: Any = None
_ENV_LOCK = threading.Lock()


def _env() -> Any:
    global _ENV
    with _ENV_LOCK:
        if _ENV is None:
            from cel_expr_python import cel
            from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

            _ENV = cel.NewEnv(
                _POOL,
                variables={"device": cel.Type.DYN},
                functions=_declarations(),
                extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings(), ext_bindings.ExtBindings()],
            )
        return _ENV


_LITERAL = re.compile(r"""'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)\"""")
_DEVICE_FIELD = re.compile(r"\bdevice\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Selector:
    """One compiled expression: ``matches(activation)`` is True/False or raises CelRuntimeError."""

    expression: str
    program: Any = None
    error: CelCompileError | None = None
    domains: tuple[str, ...] = ()  # string literals: domains a lookup may name (an absent one is an empty map)

    def matches(self, device: "DeviceView") -> bool:
        if self.error is not None:
            raise self.error
        data = device.activation(self.domains)
        try:
            r = self.program.eval(data={"device": data})
        except RuntimeError as exc:
            msg = str(exc)
            if "Iteration budget exceeded" in msg:
                msg = "operation cancelled: actual cost limit exceeded"
            raise CelRuntimeError(self.expression, device.name, msg) from None
        v = r.value()
        if isinstance(v, bool):
            return v
        text = str(v).strip()
        if r.type().name() == "ERROR":
            raise CelRuntimeError(self.expression, device.name, _clean(text))
        raise CelRuntimeError(self.expression, device.name, f"result is {_type_name(v)}, not a bool: {text}")


class DeviceView:
    """A device as the ``device`` CEL variable sees it, built once per device."""

    __slots__ = ("name", "_base", "_attrs", "_caps", "_ext")

    def __init__(self, name: str, driver: str, allow_multiple: bool, attributes: Mapping[str, Mapping[str, Any]],
                 capacity: Mapping[str, Mapping[str, Any]]):
        self.name = name
        self._attrs = {d: dict(v) for d, v in attributes.items()}
        self._caps = {d: dict(v) for d, v in capacity.items()}
        self._base = {"driver": driver, "allowMultipleAllocations": allow_multiple, "attributes": self._attrs,
                      "capacity": self._caps}
        self._ext: dict[tuple[str, ...], dict] = {}

    def activation(self, domains: tuple[str, ...]) -> dict:
        if not domains:
            return self._base
        got = self._ext.get(domains)
        if got is None:
            attrs = dict(self._attrs)
            caps = dict(self._caps)
            for d in domains:
                attrs.setdefault(d, {})
                caps.setdefault(d, {})
            got = self._ext[domains] = {**self._base, "attributes": attrs, "capacity": caps}
        return got


class SelectorCache:
    """Compile each expression once (kube-scheduler's cel.Cache): classes and claims repeat a handful."""

    def __init__(self, max_size: int = 4096):
        self._cache: dict[str, Selector] = {}
        self._max = max_size
        self._lock = threading.Lock()

    def get(self, expression: str) -> Selector:
        s = self._cache.get(expression)
        if s is None:
            s = compile_selector(expression)
            with self._lock:
                if len(self._cache) >= self._max:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[expression] = s
        return s


def compile_selector(expression: str) -> Selector:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return Selector(expression, error=CelCompileError(
            expression, f"expression is {len(expression)} characters long, the limit is {MAX_EXPRESSION_LENGTH}"))
    for m in _DEVICE_FIELD.finditer(_strip_literals(expression)):
        if m.group(1) not in DEVICE_FIELDS:
            return Selector(expression, error=CelCompileError(
                expression, f"undefined field '{m.group(1)}' (device has {', '.join(DEVICE_FIELDS)})"))
    env = _env()  # an environment that does not build is a bug here, not a bad expression: let it raise
    try:
        program = env.compile(expression)
    except RuntimeError as exc:
        return Selector(expression, error=CelCompileError(expression, _clean(str(exc))))
    rt = program.return_type().name()
    if rt not in ("bool", "dyn", "BOOL", "DYN"):
        return Selector(expression, error=CelCompileError(expression, f"must evaluate to bool, not {rt}"))
    literals = {m.group(1) if m.group(1) is not None else m.group(2) for m in _LITERAL.finditer(expression)}
    domains = tuple(sorted(d for d in literals if d and "." in d))  # domains are DNS subdomains
    return Selector(expression, program=program, domains=domains)


def _strip_literals(expression: str) -> str:
    return _LITERAL.sub('""', expression)


def _clean(msg: str) -> str:
    msg = re.sub(r"^\w+: ", "", msg.strip())
    msg = re.sub(r"\s*\[[A-Z_]+\]$", "", msg)
    return msg


def make_quantity(value: Fraction | int) -> Any:
    return quantity_value(Fraction(value))


CelFunction = Callable[..., Any]
__all__ = ["CelCompileError", "CelRuntimeError", "DeviceView", "Selector", "SelectorCache", "Semver", "compile_selector",
           "make_quantity", "parse_semver", "quantity_value", "semver_value"]
