"""Every test gets exactly one tier marker, so one command runs one tier: ``pytest -m unit`` (or ``property``,
``slow``, ``apiserver``, ``node``).

Why here, by rule, and not by hand on each test: a tier is what a test needs to run (a real kube-apiserver, a real
node, time), and that is already said once -- by the folder of the real-node tier (``tests/e2e``, whose conftest sets
it up and skips it cleanly without its components), by an explicit marker (``apiserver``, ``slow``, ``node``,
``integration``, ``property``), or by the test being a hypothesis test.  Tests live beside the part of ``src/`` they
test (``tests/engine/``, ``tests/kube/``, ...), whatever their tier: an apiserver-tier module says
``pytestmark = pytest.mark.apiserver``, and ``tests/apiserver_support.py`` (loaded below as a plugin) gives it the
control plane and skips it cleanly without KUBEBUILDER_ASSETS.  The first rule that holds wins."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

pytest_plugins = ("tests.apiserver_support",)  # the apiserver tier's control plane, fixtures and hooks

TESTS = Path(__file__).resolve().parent
TIERS = ("node", "apiserver", "slow", "property", "unit")


def tier_of(path: Path, markers: Iterable[str], hypothesis: bool = False) -> str:
    """The one tier of a test in ``path`` (a file under tests/) carrying ``markers``."""
    marks = set(markers)
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        top = ""
    if "node" in marks or "e2e" in marks or top == "e2e":
        return "node"
    if "apiserver" in marks or "integration" in marks:
        return "apiserver"
    if "slow" in marks:
        return "slow"
    if "property" in marks or hypothesis:
        return "property"
    return "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marks = [m.name for m in item.iter_markers()]
        fn = getattr(item, "function", None)
        tier = tier_of(Path(str(item.fspath)), marks, bool(getattr(fn, "is_hypothesis_test", False)))
        if tier not in marks:
            item.add_marker(getattr(pytest.mark, tier))
