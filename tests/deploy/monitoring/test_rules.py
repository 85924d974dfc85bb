"""deploy/monitoring's alert rules through promtool: ``check rules`` and the ``test rules`` unit tests beside this file.

The manifest is a prometheus-operator PrometheusRule; promtool reads plain rule files, so its ``spec`` (the groups)
is written to a temporary rules file first.  Skipped when promtool is not on PATH (Debian: ``apt install prometheus``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent
RULES = HERE.parents[2] / "deploy" / "monitoring" / "prometheus-rules.yaml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (Debian package prometheus)")


@pytest.fixture
def rules_dir(tmp_path):
    doc = yaml.safe_load(RULES.read_text())
    assert doc["kind"] == "PrometheusRule"
    (tmp_path / "gpufleet.rules.yaml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
    shutil.copy(HERE / "rules_test.yaml", tmp_path / "rules_test.yaml")
    return tmp_path


def test_promtool_check_rules(rules_dir):
    r = subprocess.run([PROMTOOL, "check", "rules", str(rules_dir / "gpufleet.rules.yaml")], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_promtool_test_rules(rules_dir):
    r = subprocess.run([PROMTOOL, "test", "rules", "rules_test.yaml"], cwd=rules_dir, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_expectation_fails(rules_dir):
    """The unit tests can fail: the same file with one expected value changed does."""
    t = (rules_dir / "rules_test.yaml").read_text().replace("value: 18", "value: 19")
    (rules_dir / "rules_test.yaml").write_text(t)
    r = subprocess.run([PROMTOOL, "test", "rules", "rules_test.yaml"], cwd=rules_dir, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode != 0
