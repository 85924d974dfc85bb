"""Kubernetes resource quantities (``500m``, ``16Gi``, ``1e3``) as integers.

Follows apimachinery's ``resource.Quantity`` grammar: a signed decimal number,
then a binary SI suffix (Ki..Ei), a decimal SI suffix (n, u, m, '', k, M, G, T,
P, E) or a decimal exponent (e/E).  Results are rounded *up* like Kubernetes
does when it converts to a coarser unit (a request of 1.5 MiB needs 2 MiB).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from .errors import InvalidQuantity

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|([eE][+-]?\d+))?$")


def parse_quantity(value: object) -> Decimal:
    """Return the quantity as an exact Decimal in base units."""
    if isinstance(value, bool):
        raise InvalidQuantity(value)
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidQuantity(value)
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise InvalidQuantity(value, "must be a string or a number")
    m = _RE.match(value.strip())
    if not m or not value.strip():
        raise InvalidQuantity(value)
    number, suffix, exponent = m.groups()
    try:
        num = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex guards this
        raise InvalidQuantity(value) from exc
    if exponent:
        exp = int(exponent[1:])
        if abs(exp) > 30:
            raise InvalidQuantity(value, "exponent out of range")
        return num.scaleb(exp)
    if suffix in _BINARY:
        return num * _BINARY[suffix]
    return num * _DECIMAL[suffix or ""]


def _ceil(d: Decimal) -> int:
    return int(d.to_integral_value(rounding=ROUND_CEILING))


def to_milli(value: object) -> int:
    """CPU-style quantity in thousandths (``"500m"`` -> 500, ``"2"`` -> 2000)."""
    return _ceil(parse_quantity(value) * 1000)


def to_mib(value: object) -> int:
    """Byte quantity in MiB, rounded up (``"16Gi"`` -> 16384)."""
    return _ceil(parse_quantity(value) / (2**20))


def to_int(value: object) -> int:
    """Countable quantity (GPUs, pods) as an integer; fractions are an error."""
    d = parse_quantity(value)
    if d != d.to_integral_value():
        raise InvalidQuantity(value, "must be a whole number")
    return int(d)
