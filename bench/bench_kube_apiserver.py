"""Live-scheduler throughput on a real kube-apiserver + etcd (the issue's performance set-up).

Starts etcd and kube-apiserver from $KUBEBUILDER_ASSETS (as the integration
tier does), creates ``--nodes`` fake nodes of 8 GPUs (status patched, no
kubelets) and ``--pods`` pending pods with ``schedulerName: gpufleet`` (half
whole single-GPU, half fractional 250/300/500 milli), then starts
``gpufleet scheduler`` as its own process and times until every pod is bound,
reading ``gpufleet_binds_total`` from its /metrics.  Everything -- apiserver,
etcd, the pod creator and the scheduler -- shares this machine's cores.

    KUBEBUILDER_ASSETS=/work/envtest-assets python bench/bench_kube_apiserver.py --nodes 1000 --pods 3000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.integration.conftest import ControlPlane, _free_port  # noqa: E402


def node_body(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:05d}", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8"}}}


NODE_STATUS = {"status": {"capacity": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "allocatable": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


def pod_body(i: int) -> dict:
    ann = {"gpufleet.io/gpu-milli": str([250, 500, 300][i % 3])} if i % 2 else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:06d}", "annotations": ann},
            "spec": {"schedulerName": "gpufleet", "containers": [{"name": "c", "image": "busybox", "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def binds(url: str) -> int:
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except Exception:
        return -1
    m = re.search(r"^gpufleet_binds_total ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--bind-workers", type=int, default=16)
    ap.add_argument("--timeout-s", type=float, default=300)
    args = ap.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets or not all((Path(assets) / b).is_file() for b in ("etcd", "kube-apiserver")):
        print("set KUBEBUILDER_ASSETS to a folder with etcd and kube-apiserver", file=sys.stderr)
        return 2
    from kubernetes import client, config

    d = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    cp = ControlPlane(assets, d)
    proc = None
    try:
        cp.start()
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        core = client.CoreV1Api(client.ApiClient(cfg))
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as ex:
            def mk(i):
                core.create_node(node_body(i), _preload_content=False)
                core.patch_node_status(f"node-{i:05d}", NODE_STATUS, _preload_content=False)
            list(ex.map(mk, range(args.nodes)))
            t1 = time.perf_counter()
            list(ex.map(lambda i: core.create_namespaced_pod("bench", pod_body(i), _preload_content=False), range(args.pods)))
        t2 = time.perf_counter()
        print(f"setup: {args.nodes} nodes in {t1 - t0:.1f} s, {args.pods} pods in {t2 - t1:.1f} s")
        port = _free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        log = open(d / "scheduler.log", "wb")
        cpu0 = {p.args[0].rsplit("/", 1)[-1]: cpu_s(p.pid) for p in cp.procs}
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(cp.kubeconfig),
                                 "--no-leader-elect", f"--metrics-addr=127.0.0.1:{port}", f"--policy={args.policy}",
                                 f"--bind-workers={args.bind_workers}", "--log-level=WARNING"], stdout=log, stderr=subprocess.STDOUT)
        first = None
        n = 0
        while time.perf_counter() - start < args.timeout_s:
            n = binds(url)
            if n > 0 and first is None:
                first = (time.perf_counter(), n)
            if n >= args.pods:
                break
            if proc.poll() is not None:
                print((d / "scheduler.log").read_text()[-3000:])
                return 1
            time.sleep(0.1)
        end = time.perf_counter()
        cpu = {k: cpu_s(p.pid) - cpu0[k] for k, p in zip(cpu0, cp.procs)}
        cpu["gpufleet scheduler"] = cpu_s(proc.pid)
        total = end - start
        print(f"scheduler: {n} of {args.pods} pods bound in {total:.2f} s from process start = {n / total:.0f} pods/s")
        if first:
            ft, fn = first
            print(f"           first bind seen after {ft - start:.2f} s (start-up: imports, list of {args.nodes} nodes and "
                  f"{args.pods} pods); steady {(n - fn) / max(1e-9, end - ft):.0f} pods/s from then")
        print("CPU seconds while scheduling: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()) + f" (wall {total:.1f} s, {os.cpu_count()} cores)")
        bound = sum(1 for p in core.list_namespaced_pod("bench").items if p.spec.node_name)
        print(f"check: {bound} pods bound according to the apiserver")
        return 0 if n >= args.pods else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
