"""GPU cost on a real node: Debian's Prometheus scrapes the gpufleet agent (fake NVML, 8 H100s) while pods of two teams
run for a set time on a spot node; ``gpufleet cost`` then reports from Prometheus, and its figures are checked against
the pods that actually ran (each container's startedAt..finishedAt from the API server, times its share of a GPU),
against its own identities (pods add up to namespaces and to the cluster), and against the recording rules of
deploy/monitoring/cost-rules.yaml evaluated by the same Prometheus.

The cost table, the check and the timings are printed and written to $E2E_LOGS/gpufleet-cost-report.txt.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from .harness import NODE, module_node, wait

REPO = Path(__file__).resolve().parents[2]
PROFILE = "h100-nvlink"
PROM = "127.0.0.1:19090"
AGENT_METRICS = "127.0.0.1:19400"
RUN_S = 60  # each pod's sleep
SPOT_PRICE, OD_PRICE = 2.5, 6.88
# (namespace, pod, kind, value): a whole GPU, two GPUs, two 500-milli shares of one GPU, a 250-milli share
PODS = [("team-a", "train", "whole", 2), ("team-a", "infer-1", "milli", 500), ("team-a", "infer-2", "milli", 500),
        ("team-b", "eval", "whole", 1), ("team-b", "notebook", "milli", 250)]
SHARE = {"whole": lambda v: float(v), "milli": lambda v: v / 1000.0}
LOAD = {"train": 60, "eval": 30, "infer-1": 20}  # SM % of its GPU each pod's process shows (per GPU for train)


@pytest.fixture(scope="module")
def node():
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not on PATH (Debian package prometheus)")
    with module_node("gpufleet-cost-") as n:
        n.report = [f"node up {n.up_s:.0f} s"]  # type: ignore[attr-defined]
        try:
            yield n
        finally:
            text = "\n".join(n.report)  # type: ignore[attr-defined]
            (n.logs / "gpufleet-cost-report.txt").write_text(text + "\n")
            print("\n" + text)


def _prom(q: str, at: float | None = None) -> list[dict]:
    params = {"query": q, **({"time": f"{at:.3f}"} if at else {})}
    with urllib.request.urlopen(f"http://{PROM}/api/v1/query?" + urllib.parse.urlencode(params), timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def _sleep_pid(uid: str) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cg = (d / "cgroup").read_text()
                if (d / "comm").read_text().strip() == "sleep" and (f"pod{uid}" in cg or f"pod{uid.replace('-', '_')}" in cg):
                    return int(d.name)
            except OSError:
                continue
    return None


def _manifest(ns: str, name: str, kind: str, v) -> dict:
    ann = {"gpufleet.io/spot": "prefer"}
    if kind == "milli":
        ann["gpufleet.io/gpu-milli"] = str(v)
    gpus = str(v) if kind == "whole" else "1"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": ann},
            "spec": {"schedulerName": "gpufleet", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sleep", str(RUN_S)],
                                     "resources": {"limits": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": gpus},
                                                   "requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


def _ts(s: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def test_cost_from_real_prometheus_matches_the_pods_that_ran(node):
    report: list[str] = node.report  # type: ignore[attr-defined]
    fakedev = node.fakedev(8)
    # the node is a spot p5.48xlarge (Karpenter's labels); the price file prices its GPUs
    node.kubectl("label", "node", NODE, "karpenter.sh/capacity-type=spot", "node.kubernetes.io/instance-type=p5.48xlarge",
                 "--overwrite")
    prices = node.data / "prices.yaml"
    prices.write_text(f"instanceTypes:\n  p5.48xlarge: {{onDemandPerGpuHour: {OD_PRICE}, spotPerGpuHour: {SPOT_PRICE}}}\n")
    node.gpufleet("gpufleet-agent", ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(node.kubeconfig),
                                     "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--state-dir",
                                     str(node.data / "gpufleet-agent"), "--metrics-addr", AGENT_METRICS, "--dev-root",
                                     str(fakedev), "--interval", "1", "--prices", str(prices)])
    assert wait(lambda: int((node.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0")) == 80, 90)
    node.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(node.kubeconfig), "--metrics-addr", "127.0.0.1:19251",
                                         "--no-leader-elect"])
    # Prometheus scrapes the agent every second and evaluates the cost rules every second
    doc = yaml.safe_load((REPO / "deploy" / "monitoring" / "cost-rules.yaml").read_text())
    groups = [dict(g, interval="1s") for g in doc["spec"]["groups"] if g["name"] == "gpufleet.cost.recording"]
    (node.data / "cost.rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    cfg = node.data / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [cost.rules.yaml]\n"
                   f"scrape_configs:\n  - job_name: gpufleet-agent\n    static_configs: [{{targets: ['{AGENT_METRICS}']}}]\n")
    node.start("prometheus", ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={node.data / 'prometheus'}",
                              f"--web.listen-address={PROM}"])
    assert wait(lambda: _prom("gpufleet_gpu_info"), 60), "Prometheus has no gpufleet_gpu_info"
    info = _prom("gpufleet_gpu_info")
    assert len(info) == 8 and {r["metric"]["capacity_type"] for r in info} == {"spot"}
    assert {float(r["value"][1]) for r in _prom("gpufleet_gpu_price_per_hour")} == {SPOT_PRICE}

    for ns in ("team-a", "team-b"):
        node.kubectl("create", "namespace", ns, check=False)
    t_start = time.time()
    node.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(_manifest(*p)) for p in PODS))

    def running() -> dict[str, dict]:
        out = {}
        for ns in ("team-a", "team-b"):
            for p in node.get_json("pods", "-n", ns)["items"]:
                if p["status"].get("phase") == "Running":
                    out[p["metadata"]["name"]] = p
        return out

    assert wait(lambda: len(running()) == len(PODS), 120), {k: v["status"].get("phase") for k, v in running().items()}
    load = []
    for name, p in running().items():
        if name in LOAD:
            a = json.loads(p["metadata"]["annotations"]["gpufleet.io/assignment"])
            pid = _sleep_pid(p["metadata"]["uid"])
            assert pid, name
            for g in a["gpus"]:
                load.append({"pid": pid, "gpu": g["index"], "used_memory_mib": 1000, "sm_util_pct": LOAD[name], "pod": name})
    Path(node.env["GPUFLEET_FAKE_PROCESSES"]).write_text(json.dumps(load))

    def finished() -> dict[str, dict]:
        out = {}
        for ns in ("team-a", "team-b"):
            for p in node.get_json("pods", "-n", ns)["items"]:
                if p["status"].get("phase") in ("Succeeded", "Failed"):
                    out[f"{ns}/{p['metadata']['name']}"] = p
        return out

    assert wait(lambda: len(finished()) == len(PODS), RUN_S + 120), list(finished())
    time.sleep(5)  # the last scrapes after the pods ended
    t_end = time.time()
    truth = {}
    for key, p in finished().items():
        st = p["status"]["containerStatuses"][0]["state"]["terminated"]
        kind, v = next((k, v) for ns, n, k, v in PODS if f"{ns}/{n}" == key)
        # the GPUs are held from kubelet's admission (the pod's startTime: its devices are allocated before the
        # container starts) to the container's end
        truth[key] = (SHARE[kind](v), _ts(st["finishedAt"]) - _ts(p["status"]["startTime"]),
                      _ts(st["finishedAt"]) - _ts(st["startedAt"]))

    window = int(t_end - t_start) + 10
    samples = node.data / "cost-samples.json"
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "cost", "--prometheus", f"http://{PROM}", "--window",
                        f"{window}s", "--step", "1s", "--prices", str(prices), "--level", "namespace,queue,workload,pod",
                        "--save-samples", str(samples), "--report", str(node.logs / "cost.html")],
                       env=node.env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    report.append(f"gpufleet cost --prometheus ... --window {window}s --step 1s --prices {prices.name}:\n{r.stdout}")
    js = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "cost", "--samples", str(samples), "--prices", str(prices),
                         "--format", "json"], env=node.env, capture_output=True, text=True, timeout=120, check=False)
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    pods = {row["key"]: row for row in out["rows"]["pod"]}
    lines = ["pod | share | held s (startTime..finishedAt) | container ran s | allocated GPU-h (held x share) | "
             "allocated GPU-h (gpufleet cost) | diff s | cost USD"]
    for key, (share, held_s, ran_s) in sorted(truth.items()):
        got = pods[key]["allocated_gpu_hours"]
        want = share * held_s / 3600
        diff_s = (got - want) * 3600 / share
        lines.append(f"{key} | {share:g} | {held_s:.1f} | {ran_s:.1f} | {want:.5f} | {got:.5f} | {diff_s:+.1f} | "
                     f"{pods[key]['cost']:.5f}")
        # one sample a second, scraped once a second: within a few seconds at each end
        assert abs(diff_s) <= 4, (key, got, want)
        assert pods[key]["cost"] == pytest.approx(got * SPOT_PRICE, rel=1e-4, abs=1e-6)
    ns_rows = {row["key"]: row for row in out["rows"]["namespace"]}
    for ns in ("team-a", "team-b"):
        assert ns_rows[ns]["cost"] == pytest.approx(sum(p["cost"] for k, p in pods.items() if k.startswith(ns + "/")), abs=1e-5)  # JSON: 6 decimals
    cl = out["cluster"]
    assert cl["allocated_gpu_h"] == pytest.approx(sum(p["allocated_gpu_hours"] for p in pods.values()), abs=1e-5)
    assert cl["capacity_gpu_h"] == pytest.approx(cl["allocated_gpu_h"] + cl["unallocated_gpu_h"], abs=1e-5)
    truth_total = sum(s * t / 3600 for s, t, _ in truth.values())
    lines.append(f"total | | | | {truth_total:.5f} | {cl['allocated_gpu_h']:.5f} | | capacity {cl['capacity_gpu_h']:.5f} GPU-h = "
                 f"allocated {cl['allocated_gpu_h']:.5f} + unallocated {cl['unallocated_gpu_h']:.5f}")
    # the busy pods used what their processes showed: train 60% of its 2 GPUs for its whole run
    tr = pods["team-a/train"]
    assert tr["used_gpu_hours"] == pytest.approx(0.6 * tr["allocated_gpu_hours"], rel=0.15)
    # the recording rules, evaluated by the same Prometheus every second, give the namespaces' cost too
    for ns in ("team-a", "team-b"):
        q = f'sum_over_time(gpufleet:namespace_gpu_cost_per_hour{{namespace="{ns}"}}[{window}s]) / 3600'
        res = _prom(q, t_end)
        rules = float(res[0]["value"][1]) if res else 0.0
        lines.append(f"recording rules {ns}: {rules:.5f} vs gpufleet cost {ns_rows[ns]['cost']:.5f}")
        assert rules == pytest.approx(ns_rows[ns]["cost"], rel=0.1), (ns, rules, ns_rows[ns]["cost"])
    report.append("\n".join(lines))
