"""deploy/autoscaling's recording rules through promtool: ``check rules`` and the ``test rules`` unit tests beside this
file (autoscaling_rules_test.yaml).  Skipped when promtool is not on PATH (Debian: ``apt install prometheus``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import needs_promtool, promtool

RULES = Path(__file__).parents[3] / "deploy" / "autoscaling" / "prometheus-rules.yaml"
UNIT_TESTS = "autoscaling_rules_test.yaml"


@needs_promtool
def test_promtool_check_rules(rules_dir):
    r = promtool("check", "rules", "autoscaling.rules.yaml", cwd=rules_dir)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr


@needs_promtool
def test_promtool_test_rules(rules_dir):
    r = promtool("test", "rules", UNIT_TESTS, cwd=rules_dir)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
@pytest.mark.parametrize("old, new", [("value: 70     # 35%", "value: 35     # 35%"), ("value: 60", "value: 55")])
def test_a_broken_expectation_fails(rules_dir, old, new):
    """The unit tests can fail: the per-pod figure of the whole GPU (35), or the plain mean of the pods (55)."""
    t = (rules_dir / UNIT_TESTS).read_text()
    assert old in t
    (rules_dir / UNIT_TESTS).write_text(t.replace(old, new))
    assert promtool("test", "rules", UNIT_TESTS, cwd=rules_dir).returncode != 0


def test_own_group_apart_from_the_monitoring_rules():
    """Its own PrometheusRule and group (deploy/monitoring has the alerts), and no record name defined twice."""
    mine = yaml.safe_load(RULES.read_text())
    theirs = yaml.safe_load((RULES.parents[1] / "monitoring" / "prometheus-rules.yaml").read_text())
    assert mine["metadata"]["name"] != theirs["metadata"]["name"]
    names = {g["name"] for g in theirs["spec"]["groups"]}
    assert not names & {g["name"] for g in mine["spec"]["groups"]}
    records = [r["record"] for doc in (mine, theirs) for g in doc["spec"]["groups"] for r in g["rules"] if "record" in r]
    assert len(records) == len(set(records))
