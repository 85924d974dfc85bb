"""deploy/autoscaling (prometheus-adapter, its rules) and examples/autoscaling fit together: every metric an example HPA
asks for is served by an adapter rule, every adapter rule reads a series the recording rules make, with the labels
it maps to objects; the APIServices reach the adapter's Service; the shipped config loads in the real adapter
(when scripts/build-prometheus-adapter.sh has built it).  The real HPA controller acting on them is the real-node
tier's (tests/e2e/test_autoscaling_node.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
AUTO = ROOT / "deploy" / "autoscaling"
EXAMPLES = ROOT / "examples" / "autoscaling"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def adapter_config() -> dict:
    cm = docs(AUTO / "adapter-config.yaml")[0]
    return yaml.safe_load(cm["data"]["config.yaml"])


def recorded() -> dict[str, str]:
    rules = docs(AUTO / "prometheus-rules.yaml")[0]["spec"]["groups"]
    return {r["record"]: r["expr"] for g in rules for r in g["rules"] if "record" in r}


def series_name(query: str) -> str:
    m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query)
    assert m, query
    return m.group(1)


def test_adapter_rules_read_recorded_series_with_the_labels_they_map():
    rec = recorded()
    cfg = adapter_config()
    assert set(cfg) == {"rules", "externalRules"}  # no resourceRules: metrics.k8s.io stays metrics-server's
    for rule in cfg["rules"] + cfg["externalRules"]:
        name = series_name(rule["seriesQuery"])
        assert name in rec, f"adapter reads {name}, which no recording rule makes"
        assert re.fullmatch(rule["name"]["matches"].strip("^$").replace("\\", ""), name)
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
        for label in (rule["resources"].get("overrides") or {}):
            # the recording carries the label: by (...) in its expression or label_replace's target
            assert re.search(rf'\b{label}\b', rec[name]) or label in ("namespace", "pod"), (name, label)
    for rule in cfg["externalRules"]:
        assert rule["resources"] == {"namespaced": False}  # a queue spans namespaces
        assert "by (queue)" in rule["metricsQuery"]


def served() -> dict[str, set[str]]:
    """metric name -> resources it is served for ('external' for the external API)."""
    out: dict[str, set[str]] = {}
    for rule in adapter_config()["rules"]:
        res = {v["resource"] for v in rule["resources"]["overrides"].values()} - {"namespace"}
        out.setdefault(rule["name"]["as"], set()).update(res)
    for rule in adapter_config()["externalRules"]:
        out.setdefault(rule["name"]["as"], set()).add("external")
    return out


def test_api_services_reach_the_adapter():
    d = docs(AUTO / "prometheus-adapter.yaml")
    by_kind: dict[str, list[dict]] = {}
    for x in d:
        by_kind.setdefault(x["kind"], []).append(x)
    apis = {(a["spec"]["group"], a["spec"]["version"]) for a in by_kind["APIService"]}
    assert apis == {("custom.metrics.k8s.io", "v1beta2"), ("custom.metrics.k8s.io", "v1beta1"), ("external.metrics.k8s.io", "v1beta1")}
    svc = by_kind["Service"][0]
    dep = by_kind["Deployment"][0]
    for a in by_kind["APIService"]:
        assert a["metadata"]["name"] == f"{a['spec']['version']}.{a['spec']['group']}"
        ref = a["spec"]["service"]
        assert (ref["name"], ref["namespace"], ref["port"]) == (svc["metadata"]["name"], svc["metadata"]["namespace"], 443)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    cm = docs(AUTO / "adapter-config.yaml")[0]
    vol = next(v for v in spec["volumes"] if v.get("configMap"))
    assert vol["configMap"]["name"] == cm["metadata"]["name"] and cm["metadata"]["namespace"] == dep["metadata"]["namespace"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == vol["name"])
    assert args["config"] == f"{mount['mountPath']}/config.yaml" and "config.yaml" in cm["data"]
    assert args["secure-port"] == str(c["ports"][0]["containerPort"])
    # RBAC: the adapter's ServiceAccount gets delegated auth, the front-proxy CA and read access to the objects
    sa = spec["serviceAccountName"]
    bound = {(b["roleRef"]["name"], b["metadata"].get("namespace", "")) for b in by_kind["ClusterRoleBinding"] + by_kind["RoleBinding"]
             if {"kind": "ServiceAccount", "name": sa, "namespace": dep["metadata"]["namespace"]} in b["subjects"]}
    assert ("system:auth-delegator", "") in bound and ("extension-apiserver-authentication-reader", "kube-system") in bound
    reader = next(r for r in by_kind["ClusterRole"] if (r["metadata"]["name"], "") in bound and r["metadata"]["name"] != "system:auth-delegator")
    grants = {(g, res) for rule in reader["rules"] for g in rule["apiGroups"] for res in rule["resources"]}
    assert {("", "pods"), ("", "namespaces"), ("apps", "deployments"), ("apps", "statefulsets")} <= grants


def test_examples_ask_for_what_the_adapter_serves():
    srv = served()
    hpas = []
    for f in sorted(EXAMPLES.glob("*.yaml")):
        d = docs(f)
        deps = {(x["metadata"]["namespace"], x["metadata"]["name"]) for x in d if x["kind"] == "Deployment"}
        for h in (x for x in d if x["kind"] == "HorizontalPodAutoscaler"):
            assert h["apiVersion"] == "autoscaling/v2"
            ref = h["spec"]["scaleTargetRef"]
            assert ref["kind"] == "Deployment" and (h["metadata"]["namespace"], ref["name"]) in deps, f"{f}: {ref}"
            assert h["spec"]["minReplicas"] >= 1  # scale to zero needs an alpha feature gate
            for m in h["spec"]["metrics"]:
                if m["type"] == "Pods":
                    assert "pod" in srv[m["pods"]["metric"]["name"]]
                elif m["type"] == "External":
                    assert "external" in srv[m["external"]["metric"]["name"]]
                    assert set(m["external"]["metric"]["selector"]["matchLabels"]) == {"queue"}  # one queue
                else:
                    pytest.fail(f"{f}: unexpected metric type {m['type']}")
            hpas.append((f.name, h))
    inf = next(h for n, h in hpas if n == "gpu-inference-hpa.yaml")
    assert inf["spec"]["minReplicas"] == 1
    assert inf["spec"]["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "70"}
    dep = next(x for x in docs(EXAMPLES / "gpu-inference-hpa.yaml") if x["kind"] == "Deployment")
    tpl = dep["spec"]["template"]
    assert tpl["spec"]["schedulerName"] == "gpufleet" and "gpufleet.io/gpu-milli" in tpl["metadata"]["annotations"]
    q = docs(EXAMPLES / "queue-workers-hpa.yaml")
    queue = next(x for x in q if x["kind"] == "Queue")["metadata"]["name"]
    ns = next(x for x in q if x["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["gpufleet.io/queue"] == queue
    ext = next(h for n, h in hpas if n == "queue-workers-hpa.yaml")["spec"]["metrics"][0]["external"]
    assert ext["metric"]["selector"]["matchLabels"]["queue"] == queue
    workers = next(x for x in q if x["kind"] == "Deployment")["spec"]["template"]["spec"]
    # the workers never wait in the queue they are scaled on (no feedback): no GPU, not gpufleet's pods
    assert workers.get("schedulerName", "default-scheduler") != "gpufleet"
    assert not any("nvidia.com/gpu" in str(c.get("resources")) for c in workers["containers"])


def adapter_binary() -> Path | None:
    p = os.environ.get("GPUFLEET_PROMETHEUS_ADAPTER") or subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-prometheus-adapter.sh"), "--print-path"], capture_output=True, text=True,
        check=False).stdout.strip()
    return Path(p) if p and Path(p).is_file() else None


@pytest.mark.skipif(adapter_binary() is None, reason="prometheus-adapter not built (scripts/build-prometheus-adapter.sh)")
@pytest.mark.parametrize("broken", [False, True])
def test_the_real_adapter_loads_the_shipped_config(tmp_path, broken):
    """The adapter parses its config strictly at start, before it needs a cluster: the shipped one passes that step
    (it stops later, at the missing kubeconfig); one with a misspelt field does not (so this test can fail)."""
    text = adapter_config_text()
    if broken:
        text = text.replace("seriesQuery", "seriesQeury", 1)
    (tmp_path / "config.yaml").write_text(text)
    r = subprocess.run([str(adapter_binary()), f"--config={tmp_path / 'config.yaml'}", f"--cert-dir={tmp_path / 'certs'}",
                        f"--lister-kubeconfig={tmp_path / 'no-kubeconfig'}", "--secure-port=0"],
                       capture_output=True, text=True, timeout=60, check=False, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode != 0
    assert ("unable to load metrics discovery config" in r.stderr) == broken, r.stderr[-2000:]
    if not broken:
        assert "no-kubeconfig" in r.stderr, r.stderr[-2000:]


def adapter_config_text() -> str:
    return docs(AUTO / "adapter-config.yaml")[0]["data"]["config.yaml"]
