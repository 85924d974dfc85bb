"""The tier markers (tests/conftest.py): each test gets exactly one, from its folder, its markers or hypothesis;
``pytest -m TIER`` then selects that tier and no other."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TESTS, TIERS, tier_of


def test_the_folder_the_markers_and_hypothesis_decide_the_tier_first_rule_wins():
    assert tier_of(TESTS / "e2e" / "test_x.py", []) == "node"
    assert tier_of(TESTS / "deploy" / "test_x.py", ["node", "slow"]) == "node"
    assert tier_of(TESTS / "kube" / "test_x.py", ["apiserver", "slow"]) == "apiserver"
    assert tier_of(TESTS / "queues" / "test_x.py", ["integration", "skipif"]) == "apiserver"
    assert tier_of(TESTS / "simulator" / "test_x.py", ["slow"], hypothesis=True) == "slow"
    assert tier_of(TESTS / "engine" / "test_x.py", [], hypothesis=True) == "property"
    assert tier_of(TESTS / "engine" / "test_x.py", ["property"]) == "property"
    assert tier_of(TESTS / "engine" / "test_x.py", ["parametrize"]) == "unit"
    assert tier_of(TESTS.parent / "elsewhere.py", []) == "unit"


def test_pytest_m_selects_one_tier_and_every_test_is_in_exactly_one(tmp_path):
    """Collect a few real folders once per tier: the tiers split the collection, and each lands where it should."""
    paths = [str(TESTS / p) for p in ("test_tiers.py", "engine/test_quantity_property.py",
                                      "engine/test_properties.py", "deploy/test_deploy_image.py", "deploy/test_image.py")]

    def collect(*args: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                              *args, *paths], capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
        assert out.returncode in (0, 5), out.stdout + out.stderr  # 5: none collected
        return {line for line in out.stdout.splitlines() if "::" in line}

    every = collect()
    per = {t: collect("-m", t) for t in TIERS}
    assert set().union(*per.values()) == every and sum(map(len, per.values())) == len(every)
    assert all(n.startswith("tests/test_tiers.py") for n in per["unit"])
    assert per["property"] and all("test_quantity_property" in n or "engine/test_properties" in n
                                   for n in per["property"])
    assert per["node"] and all("test_deploy_image" in n for n in per["node"])
    assert per["slow"] and all("deploy/test_image" in n for n in per["slow"])
