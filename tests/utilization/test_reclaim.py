"""Reclaim against a recorded utilisation series: who is warned, evicted, cleared, protected, under each policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpufleet.engine.disruption import PodDisruptionBudget
from gpufleet.engine.errors import ConfigError
from gpufleet.utilization.reclaim import (
    NamespacePolicy,
    PodInfo,
    ReclaimConfig,
    decide,
    idle_run,
    load_config,
    parse_duration,
    pod_info_from_json,
)
from gpufleet.utilization.reclaim_controller import Reclaimer
from gpufleet.utilization.sources import PrometheusSource, parse_query_range

FIX = Path(__file__).parent / "fixtures"
UTIL = json.loads((FIX / "reclaim_util.json").read_text())
CLUSTER = json.loads((FIX / "reclaim_cluster.json").read_text())
NOW = float(CLUSTER["now"])
H = 3600.0

POLICY = load_config({
    "default": {"action": "report", "idleUtilPercent": 5, "window": "1h"},
    "namespaces": {"research": {"action": "warn"}, "prod": {"action": "evict", "grace": "1h"}, "dev": {"action": "report"}},
})


class FakeKube:
    """ReclaimKube in memory; records calls; can refuse evictions like a PDB would."""

    def __init__(self, pods, pdbs, refuse=()):
        self.pods, self.pdbs, self.refuse = pods, pdbs, set(refuse)
        self.calls: list[tuple[str, str, str]] = []

    def list_running_pods(self):
        return self.pods

    def list_pdbs(self):
        return self.pdbs

    def warn(self, ns, name, warned_at, message):
        self.calls.append(("warn", f"{ns}/{name}", warned_at))
        return "warned"

    def clear(self, ns, name, message):
        self.calls.append(("clear", f"{ns}/{name}", ""))
        return "cleared"

    def evict(self, ns, name, message):
        self.calls.append(("evict", f"{ns}/{name}", ""))
        if f"{ns}/{name}" in self.refuse:
            return "blocked"
        if name == "boom":
            raise ConnectionError("API away")
        return "evicted"


class RecordedPrometheus:
    """PrometheusSource's fetch, answering with the recorded response and keeping the URL asked."""

    def __init__(self):
        self.urls = []

    def __call__(self, url, timeout_s):
        self.urls.append(url)
        return json.dumps(UTIL).encode()


def round_(apply=False, config=POLICY, refuse=()):
    kube = FakeKube(CLUSTER["pods"], CLUSTER["pdbs"], refuse)
    fetch = RecordedPrometheus()
    lines: list[str] = []
    rec = Reclaimer(kube, PrometheusSource("http://prom:9090", fetch=fetch), config, apply=apply, clock=lambda: NOW, out=lines.append)
    return rec, rec.run_once(), kube, fetch, lines


def test_recorded_series_under_report_warn_evict_policies():
    rec, res, kube, fetch, lines = round_()
    acts = {a.pod: a for a in res.actions}
    # research: warn
    assert acts["research/notebook-idle"].action == "warn" and "holding 1 GPU" in acts["research/notebook-idle"].reason
    assert "research/train-busy" not in acts and "research/bursty" not in acts  # busy / a burst 20 min ago
    assert "research/multi-gpu" not in acts  # one of its two GPUs is busy
    assert acts["research/young"].action == "protect" and "younger" in acts["research/young"].reason
    assert acts["research/optout"].action == "protect" and "opted out" in acts["research/optout"].reason
    assert acts["research/critical"].action == "protect" and "priority" in acts["research/critical"].reason
    assert acts["research/ds-idle"].action == "protect" and "DaemonSet" in acts["research/ds-idle"].reason
    assert acts["research/gappy"].action == "protect" and "gap" in acts["research/gappy"].reason
    assert acts["research/stale"].action == "protect" and "stale" in acts["research/stale"].reason
    assert acts["research/nodata"].action == "protect" and "no utilisation data" in acts["research/nodata"].reason
    assert "research/cpu-only" not in acts
    # prod: evict after a 1 h grace
    assert acts["prod/idle-warned-2h"].action == "evict"
    assert acts["prod/idle-warned-2h"].gpus == 2 and acts["prod/idle-warned-2h"].gpu_hours == pytest.approx(6.0, abs=0.05)
    assert acts["prod/idle-warned-10m"].action == "report" and "eviction in 50m" in acts["prod/idle-warned-10m"].reason
    assert acts["prod/idle-unwarned"].action == "warn" and "grace period" in acts["prod/idle-unwarned"].reason
    assert acts["prod/pdb-a"].action == "evict"  # the PDB allows one disruption ...
    assert acts["prod/pdb-b"].action == "protect" and "PodDisruptionBudget prod/serve allows 1" in acts["prod/pdb-b"].reason  # ... not two
    assert acts["prod/recovered"].action == "clear"
    assert acts["prod/bare"].action == "evict" and "bare pod" in acts["prod/bare"].reason  # unix-seconds warning accepted
    assert acts["prod/old-warning"].action == "warn"  # a warning from an earlier idle episode does not count
    # dev: report only; shares and MIG slices count as fractions
    assert acts["dev/share-idle"].action == "report" and acts["dev/share-idle"].gpus == 0.25
    assert acts["dev/mig-idle"].action == "report" and acts["dev/mig-idle"].gpus == pytest.approx(3 / 7, abs=1e-3)
    assert "dev/bad-share" not in acts and any("bad-share" in s and "gpu-milli" in s for s in res.skipped)
    # the query and window asked of Prometheus
    assert "DCGM_FI_DEV_GPU_UTIL" in fetch.urls[0] and f"start={NOW - 2 * H:.3f}" in fetch.urls[0]
    # dry run: nothing written, but counted and summarised
    assert kube.calls == []
    assert res.summary["evict"] == 3 and res.summary["warn"] == 3 and res.summary["clear"] == 1
    assert res.summary["gpus_evicted"] == 4
    body = generate_latest(rec.metrics.registry).decode()
    assert 'gpufleet_reclaim_actions_total{action="evict",mode="dry-run",namespace="prod"} 3.0' in body
    assert 'gpufleet_reclaim_gpus_returned_total{mode="dry-run",namespace="prod"} 4.0' in body
    assert 'gpufleet_reclaim_errors_total{kind="bad-pod"} 1.0' in body
    assert lines[-1].startswith("reclaim dry run") and "3 evicted (4 GPUs)" in lines[-1]


def test_apply_writes_and_counts_what_the_api_server_answered():
    rec, res, kube, _, lines = round_(apply=True, refuse={"prod/pdb-a"})
    done = {(c[0], c[1]) for c in kube.calls}
    assert ("warn", "research/notebook-idle") in done and ("warn", "prod/idle-unwarned") in done
    assert ("clear", "prod/recovered") in done
    assert {c[1] for c in kube.calls if c[0] == "evict"} == {"prod/idle-warned-2h", "prod/pdb-a", "prod/bare"}
    assert not any(c[1].startswith(("research/young", "research/optout", "dev/")) for c in kube.calls)
    warn_time = next(c[2] for c in kube.calls if c[0] == "warn")
    assert warn_time == "2025-11-22T14:00:00Z"
    assert res.outcomes["prod/pdb-a"] == "blocked" and res.summary["evict"] == 2 and res.summary["gpus_evicted"] == 3
    body = generate_latest(rec.metrics.registry).decode()
    assert 'gpufleet_reclaim_outcomes_total{namespace="prod",outcome="blocked"} 1.0' in body
    assert 'gpufleet_reclaim_gpus_returned_total{mode="applied",namespace="prod"} 3.0' in body
    assert any(line.startswith("blocked") for line in lines) and lines[-1].startswith("reclaim applied")


def test_report_everywhere_never_warns_or_evicts():
    _, res, kube, _, _ = round_(apply=True, config=load_config({"default": {"action": "report"}}))
    assert {a.action for a in res.actions} <= {"report", "protect"} and kube.calls == []


def test_one_failing_call_does_not_stop_the_round():
    pods = [dict(p) for p in CLUSTER["pods"] if p["metadata"]["name"] in ("idle-warned-2h", "bare")]
    boom = json.loads(json.dumps(pods[0]))
    boom["metadata"]["name"] = "boom"
    util = dict(UTIL)
    util = json.loads(json.dumps(UTIL))
    util["data"]["result"].append({"metric": {"namespace": "prod", "pod": "boom"},
                                   "values": next(s["values"] for s in UTIL["data"]["result"] if s["metric"].get("pod") == "bare")})
    kube = FakeKube([boom] + pods, [])
    rec = Reclaimer(kube, PrometheusSource("http://p", fetch=lambda u, t: json.dumps(util).encode()), POLICY, apply=True,
                    clock=lambda: NOW, out=lambda s: None)
    res = rec.run_once()
    assert res.outcomes == {"prod/boom": "error", "prod/idle-warned-2h": "evicted", "prod/bare": "evicted"}


def test_idle_run_edges():
    thr, gap = 5.0, 720.0
    pts = [(NOW - i * 60, 1.0) for i in range(120)]
    assert idle_run(NOW, pts, thr, gap).idle_s == pytest.approx(119 * 60)
    assert idle_run(NOW, pts, thr, gap).stopped_by == "start"
    assert idle_run(NOW, pts + [(NOW - 30 * 60 - 1, 50.0)], thr, gap).stopped_by == "busy"
    assert idle_run(NOW, [(NOW, 50.0)], thr, gap).idle_s == 0
    assert idle_run(NOW, [(t - 3600, v) for t, v in pts], thr, gap).stopped_by == "stale"
    assert idle_run(NOW, [], thr, gap).stopped_by == "none"
    assert idle_run(NOW, [(NOW, float("nan"))], thr, gap).stopped_by == "none"
    # at the threshold is idle, above is not
    assert idle_run(NOW, [(NOW - 60, 5.0), (NOW, 5.0)], thr, gap).idle_s == 60
    assert idle_run(NOW, [(NOW - 60, 5.1), (NOW, 5.0)], thr, gap).stopped_by == "busy"


def test_pod_younger_than_window_is_never_touched_even_with_old_looking_data():
    p = PodInfo("a", "p", 1, created_s=NOW - 0.9 * H, annotations={"gpufleet.io/idle-warning": str(NOW - 2 * H)})
    acts = decide(NOW, [p], {"a/p": [(NOW - i * 60, 0.0) for i in range(200)]}, {"a": NamespacePolicy("evict", grace_s=60)})
    assert [a.action for a in acts] == ["protect"]


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"namespaces\.ml\.action"):
        load_config({"namespaces": {"ml": {"action": "delete"}}})
    with pytest.raises(ConfigError, match=r"namespaces\.ml: unknown field\(s\) treshold"):
        load_config({"namespaces": {"ml": {"treshold": 5}}})
    with pytest.raises(ConfigError, match=r"default\.window"):
        load_config({"default": {"window": "an hour"}})
    with pytest.raises(ConfigError, match="unknown top-level"):
        load_config({"namespace": {}})
    cfg = load_config({"default": {"window": "2h", "grace": "15m", "idleUtilPercent": 10}, "namespaces": {"x": {"action": "evict"}}})
    assert cfg.for_namespace("x").window_s == 7200 and cfg.for_namespace("x").grace_s == 900
    assert cfg.for_namespace("x").action == "evict" and cfg.for_namespace("y").action == "report"
    assert cfg.lookback_s() == 7200 + 900
    assert parse_duration("w", 90) == 90 and parse_duration("w", "1.5h") == 5400
    assert isinstance(load_config(None), ReclaimConfig)


def test_json_adapters():
    assert pod_info_from_json({"metadata": {"name": "x", "creationTimestamp": "2025-01-01T00:00:00Z"},
                               "spec": {"containers": [{"name": "c"}]}}) is None
    # reclaim reads budgets with the one PodDisruptionBudget type (tests/engine/test_disruption.py has the rest)
    null = PodDisruptionBudget.from_json({"metadata": {"namespace": "a", "name": "b"}, "spec": {}, "status": {"disruptionsAllowed": 0}})
    assert null.selector is None and not null.covers_pod(PodInfo("a", "p", 1, 0).facts())
    everything = PodDisruptionBudget.from_json({"metadata": {"namespace": "a", "name": "b"}, "spec": {"selector": {}},
                                                "status": {"disruptionsAllowed": 0}})
    assert everything.covers_pod(PodInfo("a", "p", 1, 0).facts()) and not everything.covers_pod(PodInfo("other", "p", 1, 0).facts())
    from gpufleet.engine.errors import InvalidPodSpec

    with pytest.raises(ConfigError, match="matchExpressions"):
        PodDisruptionBudget.from_json({"metadata": {"name": "b"}, "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}})
    with pytest.raises(InvalidPodSpec, match="creationTimestamp"):
        pod_info_from_json({"metadata": {"name": "x", "creationTimestamp": "yesterday"},
                            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})


def test_prometheus_errors_are_clear():
    from gpufleet.utilization.sources import SourceError

    with pytest.raises(SourceError, match="bad_data"):
        parse_query_range({"status": "error", "error": "bad_data: parse error"})
    with pytest.raises(SourceError, match="matrix"):
        parse_query_range({"status": "success", "data": {"resultType": "vector", "result": []}})
    with pytest.raises(SourceError, match="not JSON"):
        PrometheusSource("http://p", fetch=lambda u, t: b"<html>").series(0, 60)
    with pytest.raises(SourceError, match="http"):
        PrometheusSource("prom:9090")
    s = parse_query_range({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"namespace": "a", "pod": "b"}, "values": [[1, "3"], [2, "NaN"], [3, "x"], "junk"]}]}})
    assert s == {"a/b": [(1.0, 3.0)]}
