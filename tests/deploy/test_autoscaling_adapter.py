"""prometheus-adapter serving gpufleet's metrics through a real kube-apiserver's aggregation layer, from a real
Prometheus evaluating deploy/autoscaling/prometheus-rules.yaml, with the adapter config and RBAC as shipped.

The node's side is a stand-in here: a small HTTP server exports what the agent and the scheduler would (a 500-milli
share at 35% of its GPU, a whole-GPU pod at 80%, 6 GPUs pending in queue team-a) for pods that exist in the API
but run nowhere (no kubelet).  The HPA controller acting on the values is the real-node tier's
(tests/e2e/test_autoscaling_node.py); this tier proves the wiring in CI without root: aggregation flags, the
APIServices' availability, delegated authentication and authorization under the adapter's ServiceAccount, the
adapter rules' names and label mapping, the recording rules' values, and the errors the HPA would get.

Needs KUBEBUILDER_ASSETS, Debian's prometheus, kubectl and the adapter (scripts/build-prometheus-adapter.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.apiserver_support import ASSETS, HAVE_ASSETS, ControlPlane, stop_process

ROOT = Path(__file__).parents[2]
KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl")


def adapter_binary() -> str:
    p = os.environ.get("GPUFLEET_PROMETHEUS_ADAPTER") or subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-prometheus-adapter.sh"), "--print-path"], capture_output=True, text=True,
        check=False).stdout.strip()
    return p if p and Path(p).is_file() else ""


pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.skipif(not KUBECTL, reason="no kubectl ($KUBECTL or on PATH)"),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not on PATH (Debian package prometheus)"),
    pytest.mark.skipif(not adapter_binary(), reason="prometheus-adapter not built (scripts/build-prometheus-adapter.sh)"),
]

# what the agent and the scheduler export for the stand-in pods
EXPOSITION = """\
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",container="server",namespace="ml-serving",pod="llm-inference-a"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",container="server",namespace="ml-serving",pod="llm-inference-b"} 28
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",device="nvidia1",modelName="H100",Hostname="n1",container="main",namespace="ml-serving",pod="trainer-0"} 80
gpufleet_pod_gpu_allocated{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",container="server",namespace="ml-serving",pod="llm-inference-a",workload_kind="Deployment",workload="llm-inference"} 0.5
gpufleet_pod_gpu_allocated{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",container="server",namespace="ml-serving",pod="llm-inference-b",workload_kind="Deployment",workload="llm-inference"} 0.5
gpufleet_pod_gpu_allocated{gpu="1",UUID="GPU-1",device="nvidia1",modelName="H100",Hostname="n1",container="main",namespace="ml-serving",pod="trainer-0",workload_kind="StatefulSet",workload="trainer"} 1
gpufleet_gpu_healthy{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1"} 1
gpufleet_pending_pods 3
gpufleet_queue_pending_pods{queue="team-a"} 3
gpufleet_queue_pending_gpus{queue="team-a"} 6
gpufleet_queue_pending_pods{queue="team-b"} 0
gpufleet_queue_pending_gpus{queue="team-b"} 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Env:
    def __init__(self, d: Path) -> None:
        self.d = d
        self.procs: dict[str, subprocess.Popen] = {}
        self.prom_port, self.adapter_port = free_port(), free_port()

    def start(self, name: str, argv: list[str]) -> None:
        self.procs[name] = subprocess.Popen(argv, stdout=open(self.d / f"{name}.log", "wb"), stderr=subprocess.STDOUT)

    def stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is not None:
            stop_process(p, 10)

    def log(self, name: str) -> str:
        return (self.d / f"{name}.log").read_text(errors="replace")[-3000:]


def wait_for(pred, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - not there yet
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last})")


@pytest.fixture(scope="module")
def stack():
    if not HAVE_ASSETS:
        pytest.skip("KUBEBUILDER_ASSETS with kube-apiserver and etcd not set")
    d = Path(tempfile.mkdtemp(prefix="gpufleet-adapter-"))
    # the aggregation layer: a front-proxy CA and the client the kube-apiserver forwards requests with
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "fp-ca.key"), "-out", str(d / "fp-ca.crt"),
            "-days", "1", "-subj", "/CN=front-proxy-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "fp.key"), "-out", str(d / "fp.csr"), "-subj",
            "/CN=front-proxy-client")
    (d / "ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", str(d / "fp.csr"), "-CA", str(d / "fp-ca.crt"), "-CAkey", str(d / "fp-ca.key"),
            "-CAcreateserial", "-out", str(d / "fp.crt"), "-days", "1", "-extfile", str(d / "ext"))
    cp = ControlPlane(ASSETS, d, extra_args=(
        f"--requestheader-client-ca-file={d / 'fp-ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-", f"--proxy-client-cert-file={d / 'fp.crt'}",
        f"--proxy-client-key-file={d / 'fp.key'}"))
    env = Env(d)
    srv = None
    try:
        cp.start()
        env.kubeconfig = cp.kubeconfig  # type: ignore[attr-defined]
        # the node's exporters, stood in for
        body = EXPOSITION.encode()

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        rules = yaml.safe_load((ROOT / "deploy" / "autoscaling" / "prometheus-rules.yaml").read_text())["spec"]
        (d / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        (d / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "2s", "evaluation_interval": "15s"}, "rule_files": [str(d / "rules.yaml")],
            "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{srv.server_address[1]}"]}]}]}))
        env.prom_argv = ["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",  # type: ignore[attr-defined]
                         f"--web.listen-address=127.0.0.1:{env.prom_port}"]
        env.start("prometheus", env.prom_argv)  # type: ignore[attr-defined]
        yield env, cp
    finally:
        for name in list(env.procs):
            env.stop(name)
        if srv is not None:
            srv.shutdown()
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)


def kubectl(cp, *args: str, input: str | None = None, check: bool = True) -> str:
    r = subprocess.run([str(KUBECTL), "--kubeconfig", str(cp.kubeconfig), *args], input=input, capture_output=True, text=True,
                       timeout=60, check=False)
    assert not check or r.returncode == 0, f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout if check else r.stdout + r.stderr


def prom(env: Env, q: str) -> list:
    url = f"http://127.0.0.1:{env.prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def test_the_metrics_apis_serve_gpufleets_series(stack):
    env, cp = stack
    # deploy/autoscaling as built, the adapter a process here: its Service an ExternalName to it (no kube-proxy)
    docs = [x for x in yaml.safe_load_all(kubectl(cp, "kustomize", str(ROOT / "deploy" / "autoscaling"))) if x]
    for x in docs:
        if x["kind"] == "Service":
            x["spec"] = {"type": "ExternalName", "externalName": "localhost", "ports": x["spec"]["ports"]}
        if x["kind"] == "APIService":
            x["spec"]["service"]["port"] = env.adapter_port
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump_all([x for x in docs if x["kind"] != "Deployment"]))
    # the objects the series name (pods that run nowhere: the adapter only lists them)
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump_all(
        [x for x in yaml.safe_load_all((ROOT / "examples" / "autoscaling" / "gpu-inference-hpa.yaml").read_text())
         if x["kind"] in ("Namespace", "Deployment")] +
        [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "ml-serving", "labels": {"app": "llm-inference"}},
          "spec": {"containers": [{"name": "server", "image": "x"}]}} for n in ("llm-inference-a", "llm-inference-b")]))
    wait_for(lambda: prom(env, "gpufleet:queue_pending_gpus:max") and prom(env, "gpufleet:deployment_gpu_utilization:percent"),
             60, "recorded series")
    token = kubectl(cp, "create", "token", "prometheus-adapter", "-n", "monitoring").strip()
    kc = yaml.safe_load(Path(cp.kubeconfig).read_text())
    kc["users"] = [{"name": "admin", "user": {"token": token}}]  # the adapter's ServiceAccount, not the admin
    (env.d / "adapter.kubeconfig").write_text(yaml.safe_dump(kc))
    dep = next(x for x in docs if x["kind"] == "Deployment")
    cfg = next(x for x in docs if x["kind"] == "ConfigMap")["data"]["config.yaml"]
    (env.d / "adapter.yaml").write_text(cfg)
    here = {"config": str(env.d / "adapter.yaml"), "cert-dir": str(env.d / "certs"),
            "prometheus-url": f"http://127.0.0.1:{env.prom_port}/", "secure-port": str(env.adapter_port)}
    argv = [adapter_binary()]
    for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]:
        k = a.removeprefix("--").split("=", 1)[0]
        argv.append(f"--{k}={here[k]}" if k in here else a)
    kcf = str(env.d / "adapter.kubeconfig")
    env.start("adapter", [*argv, "--bind-address=127.0.0.1", f"--lister-kubeconfig={kcf}", f"--authentication-kubeconfig={kcf}",
                          f"--authorization-kubeconfig={kcf}"])

    def available():
        out = json.loads(kubectl(cp, "get", "apiservices", "-o", "json"))
        return all(any(c["type"] == "Available" and c["status"] == "True" for c in a["status"].get("conditions") or [])
                   for a in out["items"] if "metrics.k8s.io" in a["metadata"]["name"])

    try:
        wait_for(available, 60, "APIServices Available")
    except AssertionError:
        raise AssertionError(kubectl(cp, "get", "apiservices", check=False) + env.log("adapter")) from None

    def raw(path: str) -> dict:
        return json.loads(kubectl(cp, "get", "--raw", path))

    pods = wait_for(lambda: raw("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml-serving/pods/*/gpu_utilization"
                                "?labelSelector=app%3Dllm-inference")["items"], 30, "pod metrics")
    # 35% and 28% of the GPU are 70% and 56% of the half GPU each holds
    assert {i["describedObject"]["name"]: i["value"] for i in pods} == {"llm-inference-a": "70", "llm-inference-b": "56"}
    obj = raw("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml-serving/deployments.apps/llm-inference/gpu_utilization")
    assert (obj.get("value") or obj["items"][0]["value"]) == "63"  # (35 + 28) / (0.5 + 0.5)
    ext = raw("/apis/external.metrics.k8s.io/v1beta1/namespaces/anywhere/gpufleet_queue_pending_gpus?labelSelector=queue%3Dteam-a")
    assert [(i["metricLabels"], i["value"]) for i in ext["items"]] == [({"queue": "team-a"}, "6")]
    unknown = kubectl(cp, "get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml-serving/pods/*/gpu_utilisation",
                      check=False)
    assert "could not find the metric gpu_utilisation for pods" in unknown, unknown
    # gpufleet explain-hpa on the example's HPA: values, no cause
    kubectl(cp, "apply", "-f", str(ROOT / "examples" / "autoscaling" / "gpu-inference-hpa.yaml"))
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "explain-hpa", "ml-serving/llm-inference", "--kubeconfig",
                        str(cp.kubeconfig), "--prometheus", f"http://127.0.0.1:{env.prom_port}"],
                       capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0 and "values: llm-inference-a 70, llm-inference-b 56" in r.stdout and "cause" not in r.stdout, r.stdout + r.stderr

    # Prometheus down: the adapter's error, which the HPA would carry in its condition
    env.stop("prometheus")
    down = kubectl(cp, "get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml-serving/pods/*/gpu_utilization"
                   "?labelSelector=app%3Dllm-inference", check=False)
    assert "unable to fetch metrics" in down, down
    env.start("prometheus", env.prom_argv)  # type: ignore[attr-defined]
