"""The container image: its size (and what makes it up) and how soon ``gpufleet scheduler`` is Ready in it.

Start-up: etcd + kube-apiserver from $KUBEBUILDER_ASSETS (as the integration tier starts them) with ``--nodes``
GPU nodes and ``--pods`` pending pods, then ``gpufleet scheduler`` in the image (podman, host network, the
apiserver's kubeconfig mounted read-only, read-only root filesystem as in the Deployment) is started ``--rounds``
times; each round times

* container start -> /readyz 200: from the container's StartedAt (podman inspect) to the first 200 (what kubelet's
  probe sees: the process imports, loads its profile, lists nodes and pods);
* ``podman run`` -> /readyz 200: the same plus podman creating the container (an upper bound);

and, side by side, the same scheduler from this checkout on the host (``python -m gpufleet.cli.main``).

    KUBEBUILDER_ASSETS=/path/to/bin python bench/bench_image.py --image ghcr.io/gpufleet/gpufleet:0.1.0 [--rounds 5]
    python bench/bench_image.py --image IMAGE --size-only
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

ENGINE = os.environ.get("CONTAINER_ENGINE") or shutil.which("podman") or "podman"
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def size_report(image: str) -> None:
    info = json.loads(subprocess.check_output([ENGINE, "image", "inspect", image]))[0]
    print(f"{image}: {info['Size'] / 1e6:.0f} MB uncompressed ({info['Size'] / 2**20:.0f} MiB)")
    script = ("cd /opt/gpufleet/lib/python3*/site-packages && du -sk /usr && du -sk /opt/gpufleet && du -sk . "
              "&& du -sk * | sort -n | tail -14")  # one du each: du counts a directory once across its arguments
    out = subprocess.run([ENGINE, "run", "--rm", *LIMITS, "--entrypoint", "/bin/sh", image, "-c", script],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [line.split("\t") for line in out if "\t" in line]
    labels = {"/usr": "base image /usr (python3, libc, ...)", "/opt/gpufleet": "runtime venv", ".": "  site-packages"}
    for kb, name in rows[:3]:
        print(f"  {labels.get(name, name):<40} {int(kb) / 1024:7.1f} MiB")
    for kb, name in reversed(rows[3:]):
        print(f"    {name:<38} {int(kb) / 1024:7.1f} MiB")


def wait_ready(url: str, timeout_s: float = 60) -> float:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if urllib.request.urlopen(url, timeout=1).status == 200:
                return time.time()
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def started_at(name: str) -> float:
    s = subprocess.check_output([ENGINE, "inspect", "-f", "{{.State.StartedAt}}", name], text=True).strip()
    # podman prints e.g. "2026-11-23 14:50:01.123456789 +0000 UTC"
    day, clock, off = s.split()[:3]
    clock = (clock + ".0")[: clock.find(".") + 7] if "." in clock else clock
    return dt.datetime.strptime(f"{day} {clock} {off}", "%Y-%m-%d %H:%M:%S.%f %z" if "." in clock else "%Y-%m-%d %H:%M:%S %z").timestamp()


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_image.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", required=True)
    ap.add_argument("--rounds", type=int_range(1), default=5)
    ap.add_argument("--nodes", type=int_range(1), default=100)
    ap.add_argument("--pods", type=int_range(1), default=300)
    ap.add_argument("--size-only", action="store_true")
    args = ap.parse_args()
    size_report(args.image)
    if args.size_only:
        return 0
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        print("start-up: needs KUBEBUILDER_ASSETS (kube-apiserver, etcd)", file=sys.stderr)
        return 2
    from kubernetes import client, config

    from bench.bench_kube_apiserver import NODE_STATUS, node_body, pod_body
    from tests.apiserver_support import ControlPlane, _free_port

    d = Path(tempfile.mkdtemp(prefix="gpufleet-bench-image-"))
    cp = ControlPlane(assets, d)
    share = Path(tempfile.mkdtemp(prefix="gpufleet-bench-kc-"))
    try:
        cp.start()
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        core: Any = client.CoreV1Api(client.ApiClient(cfg))  # plain JSON bodies, as the adapter sends them
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        for i in range(args.nodes):
            core.create_node(node_body(i), _preload_content=False)
            core.patch_node_status(f"node-{i:05d}", NODE_STATUS, _preload_content=False)
        for i in range(args.pods):
            pod = pod_body(i)
            pod["spec"]["schedulerName"] = "nobody"  # pending and listed, never bound: every round sees the same
            core.create_namespaced_pod("bench", pod, _preload_content=False)
        # the kubeconfig and CA, readable by the image's user 10001
        shutil.copy(d / "certs" / "apiserver.crt", share / "ca.crt")
        (share / "kubeconfig").write_text(cp.kubeconfig.read_text().replace(str(d / "certs" / "apiserver.crt"), "/kc/ca.crt"))
        share.chmod(0o755)
        for f in share.iterdir():
            f.chmod(0o644)
        print(f"\nstart-up to /readyz 200 ({args.nodes} nodes, {args.pods} pending pods), seconds:")
        print(f"{'round':>5} {'container start->ready':>23} {'podman run->ready':>18} {'host process->ready':>20}")
        res: dict[str, list[float]] = {"ctr": [], "run": [], "host": []}
        for r in range(args.rounds):
            port = _free_port()
            name = f"gpufleet-bench-{os.getpid()}-{r}"
            t0 = time.time()
            subprocess.run([ENGINE, "run", "-d", "--rm", "--name", name, *LIMITS, "--network", "host", "--read-only",
                            "-v", f"{share}:/kc:ro", args.image, "scheduler", "--kubeconfig", "/kc/kubeconfig",
                            "--no-leader-elect", f"--metrics-addr=127.0.0.1:{port}"], check=True, capture_output=True)
            t_ready = wait_ready(f"http://127.0.0.1:{port}/readyz")
            t_start = started_at(name)
            subprocess.run([ENGINE, "stop", "-t", "5", name], capture_output=True, check=False)
            port = _free_port()
            h0 = time.time()
            proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(cp.kubeconfig),
                                     "--no-leader-elect", f"--metrics-addr=127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
            h1 = wait_ready(f"http://127.0.0.1:{port}/readyz")
            proc.terminate()
            proc.wait(10)
            res["ctr"].append(t_ready - t_start)
            res["run"].append(t_ready - t0)
            res["host"].append(h1 - h0)
            print(f"{r + 1:>5} {res['ctr'][-1]:>23.2f} {res['run'][-1]:>18.2f} {res['host'][-1]:>20.2f}")
        print(f"{'median':>5} {statistics.median(res['ctr']):>23.2f} {statistics.median(res['run']):>18.2f} "
              f"{statistics.median(res['host']):>20.2f}")
    finally:
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(share, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_image.py", main))
