"""scripts/compat.py: the compatibility table is generated from the tiers' own reports, so what it counts and says
(failures, skips, tests deselected for a release that does not serve their feature, the floor) is checked here on
reports made for the purpose, and its deselection plugin inside a real pytest run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "compat.py"


@pytest.fixture(scope="module")
def compat():
    spec = importlib.util.spec_from_file_location("compat_under_test", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
 skipped="1" tests="5"><testcase classname="tests.e2e.test_a" name="test_ok"/>
<testcase classname="tests.e2e.test_a" name="test_ok2"/>
<testcase classname="tests.e2e.test_a" name="test_bad"><failure message="AssertionError: pod p0 Pending&#10;more">x</failure></testcase>
<testcase classname="tests.e2e.test_a" name="test_err"><error message="failed on setup: node not Ready">x</error></testcase>
<testcase classname="tests.e2e.test_a" name="test_skip"><skipped message="no GPU here">x</skipped></testcase>
</testsuite></testsuites>"""


def test_counts_failures_and_skips_come_from_the_junit_report(compat, tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT)
    assert compat._junit_counts(xml) == {"passed": 2, "failed": 2, "skipped": 1}
    assert compat._failures(xml) == ["tests.e2e.test_a::test_bad: AssertionError: pod p0 Pending",
                                     "tests.e2e.test_a::test_err: failed on setup: node not Ready"]
    assert compat._skip_reasons(xml) == ["test_skip: no GPU here"]


def test_a_deselected_test_is_recorded_with_its_markers_reason(tmp_path):
    # a tier deselects by min_release as tests/apiserver_support.py does; the script, loaded with -p compat, records it
    (tmp_path / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'min_release(major, minor): test')\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    old = [i for i in items if i.get_closest_marker('min_release')]\n"
        "    config.hook.pytest_deselected(items=old)\n"
        "    items[:] = [i for i in items if i not in old]\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.min_release(1, 36, reason='the policy API is served from 1.36')\n"
        "def test_new():\n    pass\n"
        "@pytest.mark.min_release(1, 37)\n"
        "def test_newer():\n    pass\n"
        "def test_old():\n    pass\n")
    out = tmp_path / "deselected.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]),
               GPUFLEET_COMPAT_DESELECTED=str(out))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "compat", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 2 deselected" in r.stdout
    recs = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda d: d["test"])
    assert recs == [{"test": "test_x.py::test_new", "reason": "the policy API is served from 1.36"},
                    {"test": "test_x.py::test_newer", "reason": "needs Kubernetes 1.37 or later"}]


def _rec(tier: str, release: str, passed: int, failed: int = 0, **kw) -> dict:
    return {"release": release, "tier": tier, "what": "", "paths": [], "passed": passed, "failed": failed, "skipped": 0,
            "deselected": len(kw.get("deselect_reasons", [])), "skip_reasons": [], "failures": [], "wall_s": 61.4,
            "exit": 1 if failed else 0, "versions": {"kube-apiserver": f"Kubernetes v{release}"}, "commit": "abc1234",
            "date": "2026-11-26", **kw}


def test_the_table_says_counts_failures_deselections_and_the_floor(compat, tmp_path):
    results = tmp_path / "compat"
    results.mkdir()
    for t in compat.TIERS:
        (results / f"{t}-1.37.2.json").write_text(json.dumps(_rec(t, "1.37.2", 10)))
        if t == "apiserver":
            rec = _rec(t, "1.35.4", 9, deselect_reasons=["tests/x.py::test_gang: the Workload API exists from 1.37 only"])
        elif t == "node":
            rec = _rec(t, "1.35.4", 8, 1, failures=["tests.e2e.test_a::test_bad: AssertionError: pod Pending"])
        else:
            rec = _rec(t, "1.35.4", 10)
        (results / f"{t}-1.35.4.json").write_text(json.dumps(rec))
    table = tmp_path / "compatibility.md"
    compat.render(results, table)
    text = table.read_text()
    head = text.index("| tier |")
    assert text[head:].splitlines()[0] == "| tier | what it proves | v1.37.2 | v1.35.4 |"  # newest first
    node = next(line for line in text.splitlines() if line.startswith("| node |"))
    assert "**pass**: 10 passed, 0 failed, 0 skipped, 0 deselected; 61 s (2026-11-26, abc1234)" in node
    assert "**FAIL**: 8 passed, 1 failed, 0 skipped, 0 deselected" in node
    api = next(line for line in text.splitlines() if line.startswith("| apiserver |"))
    assert "**pass**: 9 passed, 0 failed, 0 skipped, 1 deselected" in api
    assert "- node v1.35.4: tests.e2e.test_a::test_bad: AssertionError: pod Pending" in text
    assert "- apiserver v1.35.4: tests/x.py::test_gang: the Workload API exists from 1.37 only" in text
    assert "Every tier passes on: v1.37.2. The oldest of them, **v1.37.2**" in text
    assert "Not every tier passes (or was run) on: v1.35.4" in text
    assert "**1.28**" in text and "no older than 1.34" in text


def test_the_runs_own_output_does_not_make_the_checkout_dirty(compat, tmp_path):
    def git(*a: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs" / "compat").mkdir(parents=True)
    (tmp_path / "docs" / "compat" / "node-1.37.2.json").write_text("{}\n")
    (tmp_path / "docs" / "compatibility.md").write_text("# t\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "docs" / "compat" / "node-1.37.2.json").write_text('{"a": 1}\n')
    (tmp_path / "docs" / "compatibility.md").write_text("# t2\n")
    (tmp_path / "untracked.txt").write_text("u\n")
    assert not compat._dirty(tmp_path)  # a second tier after the first rewrote its record is still the commit's code
    (tmp_path / "code.py").write_text("x = 2\n")
    assert compat._dirty(tmp_path)
