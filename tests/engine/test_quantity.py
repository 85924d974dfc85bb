"""Kubernetes quantity parsing: suffixes, exponents, rounding up, and invalid strings."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufleet.engine.errors import GpufleetError, InvalidQuantity
from gpufleet.engine.quantity import parse_quantity, to_int, to_mib, to_milli


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1", Decimal(1)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),  # an exponent, not exa followed by junk
        ("2e-3", Decimal("0.002")),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("1G", Decimal(10**9)),
        ("1E", Decimal(10**18)),  # exa suffix on its own
        ("1Ki", Decimal(1024)),
        ("16Gi", Decimal(16 * 2**30)),
        ("1.5Mi", Decimal(3 * 2**19)),
        ("+2", Decimal(2)),
        ("-1", Decimal(-1)),
        ("100n", Decimal("1e-7")),
        ("3u", Decimal("3e-6")),
        (3, Decimal(3)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse_quantity(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", " ", "abc", "1.2.3", "5mi", "1Kb", "Gi", "1 Gi", "--1", "1e", "1e999", "0x10", "1_000", None, [], {}, True,
     float("nan"), float("inf")],
)
def test_invalid_quantity_raises_typed_error(bad):
    with pytest.raises(InvalidQuantity) as exc:
        parse_quantity(bad)
    assert isinstance(exc.value, GpufleetError)
    assert repr(bad) in str(exc.value)


@pytest.mark.parametrize(
    "text, milli",
    [("500m", 500), ("2", 2000), ("0.1", 100), ("1e3", 1_000_000), ("0.0001", 1), ("1500u", 2), (4, 4000)],
)
def test_to_milli_rounds_up(text, milli):
    assert to_milli(text) == milli


@pytest.mark.parametrize(
    "text, mib",
    [("16Gi", 16_384), ("1Mi", 1), ("1", 1), ("1.5Mi", 2), ("1M", 1), ("1G", 954), ("512Ki", 1), ("1e9", 954), ("0", 0)],
)
def test_to_mib_rounds_up(text, mib):
    assert to_mib(text) == mib


@pytest.mark.parametrize("text, n", [("2", 2), ("8", 8), ("1e1", 10), ("0", 0), ("1k", 1000)])
def test_to_int(text, n):
    assert to_int(text) == n


@pytest.mark.parametrize("text", ["1.5", "500m", "1Ki.5", "x"])
def test_to_int_rejects_fractions_and_junk(text):
    with pytest.raises(InvalidQuantity):
        to_int(text)
