"""CEL selectors with the Kubernetes extensions, and errors as kube-scheduler reports them."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufleet.engine.dra.cel import (CelCompileError, CelRuntimeError, DeviceView, SelectorCache, parse_semver,
                                     quantity_value, semver_value)

DEV = DeviceView("gpu.nvidia.com/n1/gpu-0", "gpu.nvidia.com", False,
                 {"gpu.nvidia.com": {"productName": "NVIDIA A100-SXM4-80GB", "type": "gpu",
                                     "driverVersion": semver_value(parse_semver("550.54.15")), "numa": 1}},
                 {"gpu.nvidia.com": {"memory": quantity_value(Fraction(80 * 2**30))}})
CACHE = SelectorCache()


@pytest.mark.parametrize("expr, want", [
    ('device.attributes["gpu.nvidia.com"].type == "gpu"', True),
    ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))', True),
    ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("40Gi"))', False),
    ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) == 0', True),
    ('device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")', True),  # equal values, different units
    ('quantity("1.5").isInteger() == false && quantity("2k").asInteger() == 2000 && quantity("1").sign() == 1', True),
    ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi") && quantity("2").sub(1) == quantity("1")', True),
    ('isQuantity("10Gi") && !isQuantity("ten")', True),
    ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("535.0.0"))', True),
    ('device.attributes["gpu.nvidia.com"].driverVersion.major() == 550 && semver("1.2.3").minor() == 2', True),
    ('semver("1.0.0-alpha").isLessThan(semver("1.0.0")) && semver("1.0.0-2").isLessThan(semver("1.0.0-a"))', True),
    ('semver("v1.2", true) == semver("1.2.0") && !isSemver("1.0") && isSemver("1.0", true)', True),
    ('has(device.attributes["other.example.com"].x)', False),  # an absent domain is an empty map
    ('device.attributes["gpu.nvidia.com"].?nope.orValue("a") == "a"', True),
    ('device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")', True),
    ('cel.bind(g, device.attributes["gpu.nvidia.com"], g.type == "gpu" && g.numa == 1)', True),
    ('device.driver == "gpu.nvidia.com" && !device.allowMultipleAllocations', True),
    ('device.attributes["gpu.nvidia.com"].productName.find("A[0-9]+") == "A100"', True),
    ('"a1b22".findAll("[0-9]+") == ["1", "22"]', True),
    ('[1, 2, 3].isSorted() && [1, 2].sum() == 3 && [3, 1].min() == 1 && [3, 1].max() == 3', True),
    ('["a", "b"].includes("a") && "x".includes("x") && ![1].includes(2)', True),
    ('"abc".indexOf("b") == 1', True),
    ('device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA A100")', True),
])
def test_matches(expr, want):
    assert CACHE.get(expr).matches(DEV) is want


@pytest.mark.parametrize("expr, msg", [
    ('device.attributes["other.example.com"].x == 1', 'Key not found in map : "x"'),
    ('device.attributes["gpu.nvidia.com"].nope == "a"', '"nope"'),
    ('device.attributes["gpu.nvidia.com"].numa', "result is int, not a bool"),
    ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(semver("1.0.0"))', "expected a quantity, got semver"),
    ('quantity("ten") == quantity("1")', "quantities must match"),
    ('1 / 0 == 1', "divide by zero"),
    ("[" + ",".join(["1"] * 200) + "].all(a, [" + ",".join(["1"] * 200) + "].all(b, a == b))", "cost limit exceeded"),
])
def test_runtime_errors_name_the_device(expr, msg):
    with pytest.raises(CelRuntimeError) as e:
        CACHE.get(expr).matches(DEV)
    assert msg in e.value.message and e.value.device == "gpu.nvidia.com/n1/gpu-0"


@pytest.mark.parametrize("expr, msg", [
    ("device.foo == 1", "undefined field 'foo'"),
    ("1 +", "Syntax error"),
    ('"a" + 1 == "a1"', "found no matching overload"),
    ("1 + 1", "must evaluate to bool"),
    ("true || " * 2000 + "true", "limit is 10240"),
])
def test_compile_errors(expr, msg):
    s = CACHE.get(expr)
    assert isinstance(s.error, CelCompileError) and msg in s.error.message
    with pytest.raises(CelCompileError):
        s.matches(DEV)


def test_compiled_once():
    c = SelectorCache()
    assert c.get("true") is c.get("true")
