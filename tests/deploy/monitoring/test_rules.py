"""deploy/monitoring's alert rules through promtool: ``check rules`` and the ``test rules`` unit tests beside this file.

The manifest is a prometheus-operator PrometheusRule; promtool reads plain rule files, so its ``spec`` (the groups)
is written to a temporary rules file first (conftest's ``rules_dir``).  Skipped when promtool is not on PATH (Debian:
``apt install prometheus``).
"""

from __future__ import annotations

from pathlib import Path

from .conftest import needs_promtool, promtool

RULES = Path(__file__).parents[3] / "deploy" / "monitoring" / "prometheus-rules.yaml"
UNIT_TESTS = "rules_test.yaml"
pytestmark = needs_promtool


def test_promtool_check_rules(rules_dir):
    r = promtool("check", "rules", "gpufleet.rules.yaml", cwd=rules_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_promtool_test_rules(rules_dir):
    r = promtool("test", "rules", UNIT_TESTS, cwd=rules_dir)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_expectation_fails(rules_dir):
    """The unit tests can fail: the same file with one expected value changed does."""
    t = (rules_dir / UNIT_TESTS).read_text()
    assert "value: 18" in t
    (rules_dir / UNIT_TESTS).write_text(t.replace("value: 18", "value: 19"))
    assert promtool("test", "rules", UNIT_TESTS, cwd=rules_dir).returncode != 0
