"""deploy/monitoring/cost-rules.yaml through promtool: ``check rules`` and the ``test rules`` cases in cost_rules_test.yaml.

Skipped when promtool is not on PATH (Debian: ``apt install prometheus``).  The metric names the rules read are
checked against what the agent exports without promtool.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .conftest import needs_promtool, promtool

RULES = Path(__file__).parents[3] / "deploy" / "monitoring" / "cost-rules.yaml"
UNIT_TESTS = "cost_rules_test.yaml"


@needs_promtool
def test_promtool_check_and_test_rules(rules_dir):
    r = promtool("check", "rules", "cost.rules.yaml", cwd=rules_dir)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    r = promtool("test", "rules", "cost_rules_test.yaml", cwd=rules_dir)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_a_broken_expectation_fails(rules_dir):
    t = (rules_dir / "cost_rules_test.yaml").read_text().replace("value: 12\n", "value: 13\n")
    (rules_dir / "cost_rules_test.yaml").write_text(t)
    assert promtool("test", "rules", "cost_rules_test.yaml", cwd=rules_dir).returncode != 0


def test_rules_read_only_what_the_agent_exports_and_their_own_records():
    from gpufleet.agent.allocation import GPU_INFO, INFO_LABELS, PRICE, PRICE_LABELS
    from gpufleet.agent.exporter import ALLOCATED_LABELS, ALLOCATED_METRIC, LABELS

    doc = yaml.safe_load(RULES.read_text())
    assert not any(g["name"].startswith("gpufleet.gpu") for g in doc["spec"]["groups"])  # its own groups, not prometheus-rules.yaml's
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    exported = {ALLOCATED_METRIC, GPU_INFO, PRICE, "DCGM_FI_DEV_GPU_UTIL"}
    labels = set(ALLOCATED_LABELS) | set(INFO_LABELS) | set(PRICE_LABELS) | set(LABELS)
    for r in rules:
        names = set(re.findall(r"\b(DCGM_FI_[A-Z_]+|gpufleet_[a-z_]+|gpufleet:[a-z_:0-9]+)", r["expr"]))
        assert names <= exported | recorded, (r.get("record") or r.get("alert"), names - exported - recorded)
        for m in re.finditer(r"\b(?:by|on)\s*\(([^)]*)\)", r["expr"]):
            assert {x.strip() for x in m.group(1).split(",") if x.strip()} <= labels, r["expr"]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert {"GpuTeamOverBudget", "GpuTeamBudgetForecast"} <= set(alerts)
    budgets = [r for r in rules if r.get("record") == "gpufleet:queue_gpu_budget:30d"]
    assert budgets and all(r["labels"].get("queue") for r in budgets)


def test_cost_dashboard_reads_the_cost_records():
    import json

    d = json.loads((RULES.parent / "grafana-cost-dashboard.json").read_text())
    assert d["uid"] == "gpufleet-cost" and d["uid"] != "gpufleet-gpus"
    doc = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in doc["spec"]["groups"] for r in g["rules"] if "record" in r}
    variables = {v["name"] for v in d["templating"]["list"]}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8
    for e in exprs + [v["query"] for v in d["templating"]["list"] if v["type"] == "query"]:
        names = set(re.findall(r"\b(gpufleet[:_][a-z_:0-9]+)", e))
        assert names and names <= recorded, (e, names - recorded)
        for var in re.findall(r"\$(\w+)", e):
            assert var in variables, (var, e)
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for topic in ("namespace", "queue", "idle", "budget", "workload", "unallocated"):
        assert topic in titles, topic
