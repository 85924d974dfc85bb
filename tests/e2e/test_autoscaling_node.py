"""GPU autoscaling on a real node: the real HPA controller (kube-controller-manager) scales the two examples of
examples/autoscaling through the aggregated custom and external metrics APIs, served by prometheus-adapter from a
real Prometheus (Debian's) that scrapes gpufleet's agent and scheduler and evaluates
deploy/autoscaling/prometheus-rules.yaml.

- ``llm-inference`` (500-milli shares, target 70% of the share each pod holds, minReplicas 1): the fake NVML
  backend's test control (``$GPUFLEET_FAKE_PROCESSES``, the containers' real PIDs) makes the pods busier than the
  target, the Deployment goes 1 -> 3, then idler, and it comes back to 1 after the HPA's scale-down stabilization;
- ``team-a-stager`` (one worker per 2 GPUs pending in queue team-a): team-a's quota is in use, GPU pods queue up
  behind it, the workers follow the pending GPUs up and back down;
- bad input: a metric no pod reports (CPU-only pods), a metric name no adapter rule serves, a queue no scheduler
  knows, Prometheus down: the HPA's ScalingActive condition says why, the replica count does not move, and
  ``gpufleet explain-hpa`` names the cause.

Timelines (metric change -> Prometheus' recorded value -> metrics API -> the HPA's desired replicas -> the
Deployment's replicas -> pods Ready) are printed and written to $E2E_LOGS/gpufleet-autoscaling-report.txt.

What is adapted to this node and why, all in the test (the shipped files are applied otherwise as written):
prometheus-adapter runs as a host process from scripts/build-prometheus-adapter.sh's binary (no image registry
here) with the Deployment's own arguments, under the ServiceAccount token of deploy/autoscaling's RBAC; its Service
becomes ExternalName ``localhost`` and the APIServices point at the adapter's port, since the node has no
kube-proxy; the examples' stand-in image is the node's busybox; the scale-down stabilization is 30 s instead of
the examples' 300 s / 120 s. kube-controller-manager runs its controllers under their ServiceAccounts
(``--use-service-account-credentials``), so the HPA controller reads the metrics through deploy/autoscaling's RBAC.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from .harness import NODE, RealNode, module_node, wait

REPO = Path(__file__).resolve().parents[2]
PROFILE = "h100-nvlink"  # 8 whole GPUs
IMAGE = "local/busybox:1"
ADAPTER_PORT = 16443
PROM = "127.0.0.1:19090"
AGENT_METRICS = "127.0.0.1:19400"
SCHED_METRICS = "127.0.0.1:19251"
STABILIZE_DOWN_S = 30


def adapter_binary() -> str:
    p = os.environ.get("GPUFLEET_PROMETHEUS_ADAPTER") or subprocess.run(
        ["bash", str(REPO / "scripts" / "build-prometheus-adapter.sh"), "--print-path"], capture_output=True, text=True,
        check=False).stdout.strip()
    return p if p and Path(p).is_file() else ""


def docs_of(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- the stack -------------------------------------------------------------------------------------------------


class Stack:
    """The node (recipe), gpufleet's agent and scheduler, Prometheus, the adapter, and API clients."""

    def __init__(self, node: RealNode) -> None:
        from kubernetes import client, config

        self.node = node
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(node.kubeconfig), client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.core, self.apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        self.hpa = client.AutoscalingV2Api(self.api)
        self.load_file = node.data / "fake-processes.json"
        self.report: list[str] = []

    def kubectl_apply(self, docs: list[dict]) -> None:
        self.node.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs, sort_keys=False))

    def prom(self, q: str) -> list[dict]:
        with urllib.request.urlopen(f"http://{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=5) as r:
            return json.loads(r.read())["data"]["result"]

    def raw(self, path: str) -> Any:
        return json.loads(self.node.kubectl("get", "--raw", path, timeout=20))

    def running(self, ns: str, app: str) -> list[Any]:
        pods = self.core.list_namespaced_pod(ns, label_selector=f"app={app}").items
        return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]

    def ready(self, ns: str, app: str) -> int:
        return sum(1 for p in self.running(ns, app)
                   if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))

    def replicas(self, ns: str, name: str) -> int:
        return int(self.apps.read_namespaced_deployment(name, ns).spec.replicas)

    def hpa_status(self, ns: str, name: str) -> Any:
        return self.hpa.read_namespaced_horizontal_pod_autoscaler(name, ns).status

    def condition(self, ns: str, name: str, type_: str) -> tuple[str, str, str]:
        for c in self.hpa_status(ns, name).conditions or []:
            if c.type == type_:
                return c.status, c.reason or "", c.message or ""
        return "", "", ""

    def explain(self, key: str) -> str:
        r = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "explain-hpa", key, "--kubeconfig", str(self.node.kubeconfig),
                            "--prometheus", f"http://{PROM}"], env=self.node.env, capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout


def sleep_pid(uid: str) -> int | None:
    """The container's `sleep` process of the pod with this UID (its cgroup path names the pod)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() == "sleep":
                cg = (d / "cgroup").read_text()
                if f"pod{uid}" in cg or f"pod{uid.replace('-', '_')}" in cg:
                    return int(d.name)
        except OSError:
            continue
    return None


class LoadDriver:
    """Plays the inference traffic through the fake NVML control: a total load, in % of ONE share, spread evenly
    over the Deployment's running pods (as a load balancer would), each pod's process busy with its part of the GPU.
    Rewritten every 0.5 s (tmp + rename), so new replicas take their part as soon as they run."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.loads: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()
        self.per_pod: dict[str, int] = {}
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="load")
        self.thread.start()

    def set(self, ns: str, app: str, total_share_pct: float) -> float:
        self.loads[(ns, app)] = total_share_pct
        self.write()
        return time.monotonic()

    def write(self) -> None:
        entries, per_pod = [], {}
        for (ns, app), total in list(self.loads.items()):
            pods = self.stack.running(ns, app)
            for p in pods:
                a = json.loads((p.metadata.annotations or {}).get("gpufleet.io/assignment") or "{}")
                pid = sleep_pid(p.metadata.uid)
                if not a.get("gpus") or pid is None:
                    continue
                milli = a.get("gpu_milli") or 1000
                pct = round(total / len(pods) * milli / 1000)
                entries.append({"pid": pid, "gpu": a["gpus"][0]["index"], "sm_util_pct": min(100, pct), "used_memory_mib": 1000})
                per_pod[p.metadata.name] = pct
        tmp = self.stack.load_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, self.stack.load_file)
        self.per_pod = per_pod

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.write()
            except Exception as exc:  # noqa: BLE001 - the API server busy for a moment: next round
                self.errors.append(str(exc))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


class Timeline:
    """From one change: when each step of the chain first showed the new state (seconds after the change)."""

    def __init__(self, label: str, t0: float) -> None:
        self.label, self.t0 = label, t0
        self.at: dict[str, float] = {}

    def mark(self, step: str, cond: bool) -> None:
        if cond and step not in self.at:
            self.at[step] = round(time.monotonic() - self.t0, 1)

    def text(self) -> str:
        return f"{self.label}: " + ", ".join(f"{k} +{v} s" for k, v in self.at.items())


def follow(stack: Stack, tl: Timeline, steps: dict[str, Callable[[], bool]], until: str, timeout_s: float) -> Timeline:
    """Poll every step each 0.5 s until ``until`` holds; every step is checked in order each round."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and until not in tl.at:
        for name, check in steps.items():
            if name in tl.at:
                continue
            try:
                tl.mark(name, check())
            except Exception:  # noqa: BLE001, S110 - a component answering late: next round
                pass
        time.sleep(0.5)
    stack.report.append(tl.text())
    return tl


@pytest.fixture(scope="module")
def stack():
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH (Debian package prometheus)")
    adapter = adapter_binary()
    if not adapter:
        pytest.skip("prometheus-adapter not built: scripts/build-prometheus-adapter.sh")
    # the HPA controller under its own ServiceAccount (kube-system/horizontal-pod-autoscaler), as kubeadm runs it: the
    # metrics APIs then authorize it through deploy/autoscaling's RBAC, not as an admin
    with module_node("gpufleet-hpa-", env={"KCM_EXTRA_ARGS": "--use-service-account-credentials=true"}) as node:
        s = Stack(node)
        s.report.append(f"node up {node.up_s:.0f} s")
        try:
            pid = node.pid_of("kube-controller-manager")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if pid else []
            creds = [a for a in argv if a.startswith("--use-service-account-credentials=")]
            assert creds and creds[-1].endswith("=true"), f"kube-controller-manager without ServiceAccount credentials: {argv}"
            start_gpufleet(node)
            install_adapter_objects(s)
            start_prometheus(node)
            s.adapter_argv = adapter_argv(s, adapter)  # type: ignore[attr-defined]
            yield s
        finally:
            text = "\n".join(s.report)
            (node.logs / "gpufleet-autoscaling-report.txt").write_text(text + "\n")
            print("\n" + text)


def start_gpufleet(node: RealNode) -> None:
    fakedev = node.fakedev(8)
    node.gpufleet("gpufleet-agent", ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE, "--kubeconfig", str(node.kubeconfig),
                                     "--device-plugin-dir", "/var/lib/kubelet/device-plugins", "--state-dir",
                                     str(node.data / "gpufleet-agent"), "--metrics-addr", AGENT_METRICS, "--dev-root",
                                     str(fakedev), "--interval", "1"])
    assert wait(lambda: int((node.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0")) == 80, 90)
    node.kubectl("apply", "-k", str(REPO / "deploy" / "crds"))
    node.kubectl("wait", "--for=condition=Established", "crd/queues.gpufleet.io", "--timeout=60s")
    node.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(node.kubeconfig), "--metrics-addr", SCHED_METRICS,
                                         "--no-leader-elect"])


def install_adapter_objects(s: Stack) -> None:
    """deploy/autoscaling as kustomize builds it, but for where the adapter runs (see the module docstring)."""
    out = []
    for d in yaml.safe_load_all(s.node.kubectl("kustomize", str(REPO / "deploy" / "autoscaling"))):
        if not d or d["kind"] == "Deployment":
            continue
        if d["kind"] == "Service":
            d["spec"] = {"type": "ExternalName", "externalName": "localhost", "ports": d["spec"]["ports"]}
        if d["kind"] == "APIService":
            d["spec"]["service"]["port"] = ADAPTER_PORT
        out.append(d)
    s.kubectl_apply(out)


def start_prometheus(node: RealNode) -> None:
    rules = docs_of(REPO / "deploy" / "autoscaling" / "prometheus-rules.yaml")[0]["spec"]
    (node.data / "autoscaling.rules.yaml").write_text(yaml.safe_dump({"groups": rules["groups"]}, sort_keys=False))
    cfg = node.data / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "5s", "evaluation_interval": "15s"},
        "rule_files": [str(node.data / "autoscaling.rules.yaml")],
        "scrape_configs": [{"job_name": "gpufleet-agent", "static_configs": [{"targets": [AGENT_METRICS]}]},
                           {"job_name": "gpufleet-scheduler", "static_configs": [{"targets": [SCHED_METRICS]}]}]}))
    r = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    node.start("prometheus", ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={node.data / 'prometheus'}",
                              f"--web.listen-address={PROM}"])
    assert wait(lambda: urllib.request.urlopen(f"http://{PROM}/-/ready", timeout=2).status == 200, 60)


def adapter_argv(s: Stack, binary: str) -> list[str]:
    """The shipped Deployment's arguments, with this node's paths, under the adapter ServiceAccount's token."""
    node = s.node
    dep = next(d for d in docs_of(REPO / "deploy" / "autoscaling" / "prometheus-adapter.yaml") if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    cfg = docs_of(REPO / "deploy" / "autoscaling" / "adapter-config.yaml")[0]["data"]["config.yaml"]
    (node.data / "adapter-config.yaml").write_text(cfg)
    token = node.kubectl("create", "token", "prometheus-adapter", "-n", "monitoring", "--duration=4h").strip()
    kc = yaml.safe_load(node.kubeconfig.read_text())
    cluster = kc["clusters"][0]["cluster"]
    (node.data / "adapter.kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "prometheus-adapter", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "prometheus-adapter"}}], "current-context": "c"}))
    os.chmod(node.data / "adapter.kubeconfig", 0o600)
    here = {"config": str(node.data / "adapter-config.yaml"), "cert-dir": str(node.data / "adapter-certs"),
            "prometheus-url": f"http://{PROM}/", "secure-port": str(ADAPTER_PORT)}
    out = [binary]
    for a in args:
        k = a.removeprefix("--").split("=", 1)[0]
        out.append(f"--{k}={here[k]}" if k in here else a)
    kcf = str(node.data / "adapter.kubeconfig")
    return out + ["--bind-address=127.0.0.1", f"--lister-kubeconfig={kcf}", f"--authentication-kubeconfig={kcf}",
                  f"--authorization-kubeconfig={kcf}"]


def start_adapter(s: Stack) -> None:
    s.node.start("prometheus-adapter", s.adapter_argv)  # type: ignore[attr-defined]

    def available() -> bool:
        for name in ("v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io"):
            a = json.loads(s.node.kubectl("get", "apiservice", name, "-o", "json"))
            if not any(c["type"] == "Available" and c["status"] == "True" for c in a["status"].get("conditions") or []):
                return False
        return True

    assert wait(available, 90), s.node.kubectl("get", "apiservices", check=False) + (s.node.logs / "prometheus-adapter.log").read_text()[-3000:]


def example(name: str) -> list[dict]:
    """An example as written, with the node's image and the test's short scale-down stabilization."""
    out = []
    for d in docs_of(REPO / "examples" / "autoscaling" / name):
        d = copy.deepcopy(d)
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                c["image"], c["imagePullPolicy"] = IMAGE, "Never"
        if d["kind"] == "HorizontalPodAutoscaler":
            d["spec"].setdefault("behavior", {}).setdefault("scaleDown", {})["stabilizationWindowSeconds"] = STABILIZE_DOWN_S
        out.append(d)
    return out


def split(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    return [d for d in docs if d["kind"] != "HorizontalPodAutoscaler"], hpas


def pod_metric(s: Stack, ns: str, app: str) -> dict[str, float]:
    from gpufleet.engine.quantity import parse_quantity

    doc = s.raw(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/gpu_utilization?labelSelector=app%3D{app}")
    return {i["describedObject"]["name"]: float(parse_quantity(i["value"])) for i in doc["items"]}


# --- the tests ---------------------------------------------------------------------------------------------------


def test_inference_scales_on_its_gpu_utilisation(stack):
    s = stack
    ns, app = "ml-serving", "llm-inference"
    objs, hpas = split(example("gpu-inference-hpa.yaml"))
    s.kubectl_apply(objs)
    assert wait(lambda: s.ready(ns, app) == 1, 120), s.node.kubectl("get", "pods", "-A", "-o", "wide")
    load = s.load = LoadDriver(s)  # type: ignore[attr-defined]
    load.set(ns, app, 60)  # 60% of its half GPU: under the target
    q = f'gpufleet:pod_gpu_utilization:percent{{namespace="{ns}"}}'
    assert wait(lambda: [float(r["value"][1]) for r in s.prom(q)] == [60.0], 90), s.prom(q)
    # queues exist before the adapter lists the series (it re-lists every minute)
    s.kubectl_apply(split(example("queue-workers-hpa.yaml"))[0])
    assert wait(lambda: s.prom('gpufleet:queue_pending_gpus:max{queue="team-a"}'), 90)
    start_adapter(s)
    assert wait(lambda: pod_metric(s, ns, app) and list(pod_metric(s, ns, app).values()) == [60.0], 90)
    # the Deployment-level figure through the same API (type Object)
    obj = s.raw(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/deployments.apps/{app}/gpu_utilization")
    s.report.append(f"custom.metrics.k8s.io deployments.apps/{app} gpu_utilization: {obj.get('value') or obj['items'][0]['value']}")
    s.kubectl_apply(hpas)
    assert wait(lambda: s.condition(ns, app, "ScalingActive")[0] == "True", 90), s.condition(ns, app, "ScalingActive")
    # the controller read the metrics as its own ServiceAccount (created for it only with ServiceAccount credentials)
    assert s.node.kubectl("get", "serviceaccount", "-n", "kube-system", "horizontal-pod-autoscaler", "-o", "name").strip()
    time.sleep(20)  # a sync or two at 60% of 70: nothing moves
    assert s.replicas(ns, app) == 1

    # up: 180% of one share's worth of work -> 90% of the GPU on the one pod (180% of its share) -> 3 replicas at 60%
    t0 = load.set(ns, app, 180)
    tl = follow(s, Timeline("inference 1 -> 3 (load 60% -> 180% of a share)", t0), {
        "recorded": lambda: any(float(r["value"][1]) >= 170 for r in s.prom(q)),
        "metrics API": lambda: any(v >= 170 for v in pod_metric(s, ns, app).values()),
        "HPA desired 3": lambda: s.hpa_status(ns, app).desired_replicas == 3,
        "Deployment replicas 3": lambda: s.replicas(ns, app) == 3,
        "3 pods Ready": lambda: s.ready(ns, app) == 3,
    }, until="3 pods Ready", timeout_s=240)
    assert "3 pods Ready" in tl.at, (tl.text(), s.condition(ns, app, "ScalingActive"), s.hpa_status(ns, app))
    assert wait(lambda: sorted(pod_metric(s, ns, app).values()) == [60.0, 60.0, 60.0], 90), pod_metric(s, ns, app)
    time.sleep(35)  # stable at 3: 60% is within reach of 70 (3 x 60/70 = 2.6 -> 3)
    assert s.replicas(ns, app) == 3, s.hpa_status(ns, app)
    s.report.append(f"  3 replicas at {sorted(pod_metric(s, ns, app).values())} % of their shares; load per pod "
                    f"(% of the GPU): {load.per_pod}")

    # down: 60% of a share in all -> 20% each -> 1 replica after the scale-down stabilization
    t0 = load.set(ns, app, 60)
    tl = follow(s, Timeline(f"inference 3 -> 1 (load 180% -> 60%, scale-down stabilization {STABILIZE_DOWN_S} s)", t0), {
        "recorded": lambda: all(float(r["value"][1]) <= 21 for r in s.prom(q)),
        "metrics API": lambda: all(v <= 21 for v in pod_metric(s, ns, app).values()),
        "HPA desired 1": lambda: s.hpa_status(ns, app).desired_replicas == 1,
        "Deployment replicas 1": lambda: s.replicas(ns, app) == 1,
        "1 pod left": lambda: len(s.running(ns, app)) == 1,
    }, until="1 pod left", timeout_s=240)
    assert "Deployment replicas 1" in tl.at, (tl.text(), s.hpa_status(ns, app))
    # the HPA's own stabilization held it: the low value was seen at most a sync (15 s) after the metrics API had it,
    # and the recommendation of 3 from the sync before that is kept for STABILIZE_DOWN_S
    assert tl.at["Deployment replicas 1"] - tl.at["metrics API"] >= STABILIZE_DOWN_S - 15, tl.text()
    assert wait(lambda: list(pod_metric(s, ns, app).values()) == [60.0], 90)
    assert s.condition(ns, app, "ScalingActive")[0] == "True"


def test_queue_workers_follow_pending_gpus(stack):
    s = stack
    ns, app = "team-a", "team-a-stager"
    s.node.kubectl("delete", "namespace", "ml-serving", "--wait=false")
    s.load.set("ml-serving", "llm-inference", 0)  # type: ignore[attr-defined]
    assert wait(lambda: not s.core.list_namespaced_pod("ml-serving").items, 120)  # its GPU share is free again
    s.kubectl_apply(split(example("queue-workers-hpa.yaml"))[1])
    assert wait(lambda: s.condition(ns, app, "ScalingActive")[0] == "True", 90), s.condition(ns, app, "ScalingActive")
    assert s.replicas(ns, app) == 1

    def gpu_pod(name: str, gpus: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"schedulerName": "gpufleet", "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                                         "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "10m", "memory": "16Mi"}}}]}}

    # team-a's quota (8 GPUs) in use by its running jobs
    s.kubectl_apply([gpu_pod(f"running-{i}", 2) for i in range(4)])
    assert wait(lambda: sum(1 for p in s.core.list_namespaced_pod(ns).items if p.status.phase == "Running"
                            and p.metadata.name.startswith("running-")) == 4, 120)
    q = 'gpufleet:queue_pending_gpus:max{queue="team-a"}'

    def pending() -> float:
        r = s.prom(q)
        return float(r[0]["value"][1]) if r else -1

    assert wait(lambda: pending() == 0, 60)
    ext = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/gpufleet_queue_pending_gpus?labelSelector=queue%3Dteam-a"

    def api_value() -> float:
        from gpufleet.engine.quantity import parse_quantity

        items = s.raw(ext)["items"]
        return float(parse_quantity(items[0]["value"])) if items else -1

    for label, pods, want_pending, want in [("0 -> 6 GPUs pending", [gpu_pod(f"wait-{i}", 2) for i in range(3)], 6, 3),
                                            ("6 -> 10 GPUs pending", [gpu_pod(f"wait-{i}", 2) for i in range(3, 5)], 10, 5)]:
        t0 = time.monotonic()
        s.kubectl_apply(pods)
        tl = follow(s, Timeline(f"queue workers 1 -> {want} ({label})" if want == 3 else f"queue workers 3 -> {want} ({label})", t0), {
            "scheduler gauge": lambda w=want_pending: float(
                urllib.request.urlopen(f"http://{SCHED_METRICS}/metrics", timeout=5).read().decode()
                .split('gpufleet_queue_pending_gpus{queue="team-a"} ')[1].split()[0]) == w,
            "recorded": lambda w=want_pending: pending() == w,
            "metrics API": lambda w=want_pending: api_value() == w,
            f"HPA desired {want}": lambda w=want: s.hpa_status(ns, app).desired_replicas == w,
            f"Deployment replicas {want}": lambda w=want: s.replicas(ns, app) == w,
            f"{want} workers Ready": lambda w=want: s.ready(ns, app) == w,
        }, until=f"{want} workers Ready", timeout_s=240)
        assert f"{want} workers Ready" in tl.at, (tl.text(), s.hpa_status(ns, app))

    t0 = time.monotonic()
    s.node.kubectl("delete", "pod", "-n", ns, *[f"wait-{i}" for i in range(5)], "--wait=false")
    tl = follow(s, Timeline(f"queue workers 5 -> 1 (10 -> 0 GPUs pending; stabilization {STABILIZE_DOWN_S} s)", t0), {
        "recorded": lambda: pending() == 0,
        "metrics API": lambda: api_value() == 0,
        "HPA desired 1": lambda: s.hpa_status(ns, app).desired_replicas == 1,
        "Deployment replicas 1": lambda: s.replicas(ns, app) == 1,
        "1 worker left": lambda: len(s.running(ns, app)) == 1,
    }, until="1 worker left", timeout_s=240)
    assert "Deployment replicas 1" in tl.at, (tl.text(), s.hpa_status(ns, app))


def hpa_doc(ns: str, name: str, target: str, metric: dict) -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name, "namespace": ns},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}, "minReplicas": 1,
                     "maxReplicas": 5, "metrics": [metric]}}


def deployment(ns: str, name: str, gpu: bool) -> dict:
    tpl: dict = {"metadata": {"labels": {"app": name}},
                 "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                     "name": "c", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", "exec sleep 2147483647"],
                     "resources": {"limits": {"cpu": "20m", "memory": "16Mi"}}}]}}
    if gpu:
        tpl["metadata"]["annotations"] = {"gpufleet.io/gpu-milli": "500"}
        tpl["spec"]["schedulerName"] = "gpufleet"
        tpl["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": tpl}}


def pods_metric(name: str) -> dict:
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": "70"}}}


def test_bad_input_says_why_and_scales_nothing(stack):
    s = stack
    ns = "bad-input"
    s.node.kubectl("create", "namespace", ns)
    s.node.kubectl("delete", "pod", "-n", "team-a", "--all", "--wait=false")  # free the GPUs
    busy = deployment(ns, "busy", gpu=True)
    # one Deployment per HPA: two HPAs on one target are refused by the controller itself (AmbiguousSelector)
    s.kubectl_apply([deployment(ns, "cpu-only", gpu=False), deployment(ns, "cpu-only-2", gpu=False), busy])
    assert wait(lambda: s.ready(ns, "busy") == 1 and s.ready(ns, "cpu-only") == 1 and s.ready(ns, "cpu-only-2") == 1, 120)
    s.load.set(ns, "busy", 200)  # type: ignore[attr-defined]  # 200% of its share: a working HPA would scale it
    q = f'gpufleet:pod_gpu_utilization:percent{{namespace="{ns}"}}'
    assert wait(lambda: [float(r["value"][1]) for r in s.prom(q)] == [200.0], 90)
    cases = [
        ("no-gpu", "cpu-only", pods_metric("gpu_utilization"), "FailedGetPodsMetric",
         "no metrics returned", "no DCGM_FI_DEV_GPU_UTIL and no gpufleet_pod_gpu_allocated: it holds no GPU"),
        ("typo", "busy", pods_metric("gpu_utilisation"), "FailedGetPodsMetric", "could not find the metric gpu_utilisation",
         "cause: the adapter serves no metric 'gpu_utilisation'"),
        ("no-queue", "cpu-only-2", {"type": "External", "external": {
            "metric": {"name": "gpufleet_queue_pending_gpus", "selector": {"matchLabels": {"queue": "team-x"}}},
            "target": {"type": "AverageValue", "averageValue": "1"}}}, "FailedGetExternalMetric", "no metrics returned",
         "cause: the scheduler exports no queue 'team-x' (queues it knows: team-a)"),
    ]
    s.kubectl_apply([hpa_doc(ns, name, target, metric) for name, target, metric, *_ in cases])
    for name, _target, _m, reason, in_message, in_explain in cases:
        assert wait(lambda n=name, r=reason: s.condition(ns, n, "ScalingActive")[1] == r, 90), (name, s.condition(ns, name, "ScalingActive"))
        st, why, msg = s.condition(ns, name, "ScalingActive")
        assert st == "False" and in_message in msg, (name, msg)
        out = s.explain(f"{ns}/{name}")
        assert in_explain in out, out
        s.report.append(f"bad input {name}: ScalingActive {st} {why}: {msg}\n  gpufleet explain-hpa: "
                        + next(x.strip() for x in out.splitlines() if in_explain in x))
    time.sleep(35)  # two HPA syncs more: nothing moved
    for name, target, *_ in cases:
        assert s.replicas(ns, target) == 1, (name, s.hpa_status(ns, name))
        s.node.kubectl("delete", "hpa", "-n", ns, name)

    # Prometheus down: an HPA on the busy pods (200% of their shares: it would want 3 replicas) gets no value and
    # holds the count; Prometheus back (same storage), it scales
    s.node.stop("prometheus")
    t0 = time.monotonic()
    s.kubectl_apply([hpa_doc(ns, "works", "busy", pods_metric("gpu_utilization"))])
    assert wait(lambda: s.condition(ns, "works", "ScalingActive")[1] == "FailedGetPodsMetric", 120), s.condition(ns, "works", "ScalingActive")
    st, why, msg = s.condition(ns, "works", "ScalingActive")
    out = s.explain(f"{ns}/works")
    assert f"cause: Prometheus at http://{PROM} does not answer" in out, out
    assert "cause: the adapter cannot query Prometheus" in out, out
    s.report.append(f"bad input prometheus-down: after {time.monotonic() - t0:.0f} s ScalingActive {st} {why}: {msg}\n"
                    "  gpufleet explain-hpa: " + " / ".join(x.strip() for x in out.splitlines() if "cause:" in x))
    for _ in range(8):  # two HPA syncs and more: the count stays
        assert s.replicas(ns, "busy") == 1, s.hpa_status(ns, "works")
        time.sleep(5)
    node = s.node
    node.start("prometheus", ["prometheus", f"--config.file={node.data / 'prometheus.yml'}",
                              f"--storage.tsdb.path={node.data / 'prometheus'}", f"--web.listen-address={PROM}"])
    t0 = time.monotonic()
    assert wait(lambda: s.replicas(ns, "busy") >= 2, 180), s.hpa_status(ns, "works")
    s.report.append(f"prometheus back: busy scaled to {s.replicas(ns, 'busy')} replicas {time.monotonic() - t0:.0f} s after "
                    "Prometheus restarted")
    s.load.close()  # type: ignore[attr-defined]
