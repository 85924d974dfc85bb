"""Dashboards and alerts reference the metrics gpufleet actually exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gpufleet.agent.exporter import METRICS

ROOT = Path(__file__).parents[2] / "deploy" / "monitoring"
KNOWN = set(METRICS) | {"DCGM_FI_DEV_XID_ERRORS", "gpufleet_pending_pods", "gpufleet_binds_total", "gpufleet_schedule_attempts_total",
                        "kube_node_status_capacity", "kube_node_status_allocatable"}


def metric_names(expr: str) -> set[str]:
    return {m for m in re.findall(r"\b(DCGM_FI_[A-Z_]+|gpufleet_[a-z_]+|kube_[a-z_]+)\b", expr)}


def test_alert_rules():
    doc = yaml.safe_load((ROOT / "prometheus-rules.yaml").read_text())
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {"GpuClusterUtilizationLow", "GpuTeamUtilizationLow", "GpuXidError", "GpuMemoryNearlyFull", "GpuUnhealthy", "GpuPodsPendingLong"} <= names
    for r in rules:
        used = metric_names(r["expr"])
        assert used and used <= KNOWN, (r["alert"], used - KNOWN)
    low = next(r for r in rules if r["alert"] == "GpuClusterUtilizationLow")
    assert "< 30" in low["expr"] and low["for"] == "1h"


def test_dashboard():
    d = json.loads((ROOT / "grafana-dashboard.json").read_text())
    assert d["panels"] and d["uid"] == "gpufleet-gpus"
    for p in d["panels"]:
        for t in p["targets"]:
            assert metric_names(t["expr"]) <= KNOWN
