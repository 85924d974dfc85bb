"""Property tests for Kubernetes quantities: suffix arithmetic and rounding up."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.engine.quantity import parse_quantity, to_mib, to_milli

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None)
n_st = st.integers(0, 10**12)


@SETTINGS
@given(n=n_st)
def test_suffixes_scale_exactly(n):
    assert to_milli(f"{n}m") == n
    assert to_milli(str(n)) == 1000 * n
    assert to_mib(f"{n}Mi") == n and to_mib(f"{n}Gi") == 1024 * n and to_mib(f"{n}Ki") == -(-n // 1024)
    assert parse_quantity(f"{n}k") == parse_quantity(f"{n}e3") == 1000 * n


@SETTINGS
@given(mantissa=st.integers(0, 10**6), exp=st.integers(-9, 9))
def test_exponent_form_equals_decimal_value(mantissa, exp):
    value = Decimal(mantissa).scaleb(exp)
    assert parse_quantity(f"{mantissa}e{exp}") == value
    # rounding up: never less than the exact amount, less than one unit more
    m = to_milli(f"{mantissa}e{exp}")
    assert value * 1000 <= m < value * 1000 + 1
    mib = to_mib(f"{mantissa}e{exp}")
    assert value <= mib * 2**20 < value + 2**20
