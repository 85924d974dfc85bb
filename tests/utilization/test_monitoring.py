"""The Grafana dashboard and the PrometheusRule reference metrics and labels gpufleet (or kube-state-metrics) exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from gpufleet.agent.exporter import ALL_METRICS, LABELS
from gpufleet.utilization.reclaim_controller import ReclaimMetrics

ROOT = Path(__file__).parents[2]
MON = ROOT / "deploy" / "monitoring"
KSM = {"kube_node_status_capacity", "kube_node_status_allocatable", "kube_pod_status_phase", "kube_pod_container_resource_requests"}
KSM_LABELS = {"node", "namespace", "pod", "resource", "phase", "container"}
FUNCS = {"sum", "avg", "max", "min", "count", "increase", "avg_over_time", "vector", "by", "on", "and", "or", "bool",
         "group_left", "rate", "humanizePercentage", "printf"}


def scheduler_metrics() -> set[str]:
    src = (ROOT / "src" / "gpufleet" / "kube" / "cli.py").read_text()
    return set(re.findall(r'(?:Counter|Gauge|Histogram|Summary)\("([a-z_]+)"', src))


def reclaim_metrics() -> set[str]:
    text = generate_latest(ReclaimMetrics().registry).decode()
    types = dict(re.findall(r"# TYPE (\S+) (\S+)", text))
    return {n.removesuffix("_total") + "_total" if t == "counter" else n for n, t in types.items()}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(DCGM_FI_[A-Z_]+|gpufleet_[a-z_]+|kube_[a-z_]+|gpufleet:[a-z_:]+)", expr))


def grouping_labels(expr: str) -> set[str]:
    out = set()
    for m in re.finditer(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
        out |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    return out


def balanced(expr: str) -> bool:
    depth = {"(": 0, "{": 0, "[": 0}
    close = {")": "(", "}": "{", "]": "["}
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in depth:
            depth[ch] += 1
        elif ch in close:
            depth[close[ch]] -= 1
            if depth[close[ch]] < 0:
                return False
    return not any(depth.values()) and expr.count('"') % 2 == 0


def known() -> set[str]:
    return set(ALL_METRICS) | scheduler_metrics() | reclaim_metrics() | KSM


def test_alert_rules():
    doc = yaml.safe_load((MON / "prometheus-rules.yaml").read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert {"GpuClusterUtilizationLow", "GpuTeamUtilizationLow", "GpuXidError", "GpuMemoryNearlyFull", "GpuUnhealthy",
            "GpuPodsPendingLong"} <= set(alerts)
    for r in rules:
        used = metric_names(r["expr"])
        assert used, r
        assert used <= known() | recorded, (r.get("alert") or r.get("record"), used - known() - recorded)
        assert balanced(r["expr"]), r["expr"]
        assert grouping_labels(r["expr"]) <= set(LABELS) | KSM_LABELS, r["expr"]
    # the right metric in the right alert
    def expands(name):  # the alert's expression with recording rules inlined
        e = alerts[name]["expr"]
        for r in rules:
            if "record" in r:
                e = e.replace(r["record"], f"({r['expr']})")
        return e

    low = alerts["GpuClusterUtilizationLow"]
    assert "DCGM_FI_DEV_GPU_UTIL" in expands("GpuClusterUtilizationLow") and "< 30" in low["expr"] and low["for"] == "1h"
    team = alerts["GpuTeamUtilizationLow"]
    assert "namespace" in expands("GpuTeamUtilizationLow") and "< 30" in team["expr"] and team["for"] == "1h"
    assert "DCGM_FI_DEV_XID_ERRORS" in alerts["GpuXidError"]["expr"]
    mem = expands("GpuMemoryNearlyFull")
    assert "DCGM_FI_DEV_FB_USED" in mem and "DCGM_FI_DEV_FB_FREE" in mem
    assert "gpufleet_gpu_healthy" in alerts["GpuUnhealthy"]["expr"]
    pend = alerts["GpuPodsPendingLong"]
    assert "Pending" in pend["expr"] and "nvidia_com_gpu" in pend["expr"] and pend["for"] == "30m"
    for a in alerts.values():
        assert a["labels"]["severity"] in ("info", "warning", "critical") and a["annotations"]["summary"]


def test_dashboard():
    d = json.loads((MON / "grafana-dashboard.json").read_text())
    assert d["uid"] == "gpufleet-gpus" and d["panels"]
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "node", "namespace"} <= variables
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for topic in ("utilisation", "allocated", "idle", "xid", "memory"):
        assert topic in titles, topic
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 12
    for e in exprs:
        assert metric_names(e) and metric_names(e) <= known(), (e, metric_names(e) - known())
        assert balanced(e), e
        assert grouping_labels(e) <= set(LABELS) | KSM_LABELS, e
        for var in re.findall(r"\$(\w+)", e):
            assert var in variables, (var, e)


def test_checker_catches_mistakes():
    assert not balanced("sum(rate(x[5m])")
    assert metric_names("avg(DCGM_FI_DEV_GPU_UTILISATION)") - known() == {"DCGM_FI_DEV_GPU_UTILISATION"}
    assert grouping_labels("sum by (hostname) (x)") - set(LABELS) == {"hostname"}
