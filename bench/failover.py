"""Scheduler failover, measured on a real kube-apiserver + etcd (the issue-35 set-up).

Two ``gpufleet scheduler`` processes with Lease leader election (as deploy/scheduler ships them: 2 replicas), a
burst of ``--pods`` one-GPU pods on ``--nodes`` fake 8-GPU nodes (no kubelets), and ``kill -9`` of the leader once
``--kill-at`` of the pods are bound.  Per run:

* ``takeover_s``: from the kill until the other replica's first bind (its ``gpufleet_binds_total`` moves);
* ``leader_s``: from the kill until it holds the Lease;
* ``bound_twice``: pods seen bound to two nodes (a watch follows every pod), or bound by both replicas beyond
  the pods that exist;
* ``gpus_overcommitted``: GPUs whose ``gpufleet.io/assignment`` shares add up to more than one GPU, and nodes
  with more GPUs assigned than they have;
* ``unscheduled``: pods not bound ``--settle-s`` after the kill.

Each lease duration in ``--lease`` runs ``--runs`` times (interleaved) on one control plane; the median is
printed, and every run with ``--json``.  Everything shares this machine's cores.

    KUBEBUILDER_ASSETS=~/.cache/gpufleet/k8s/v1.37.2/bin python bench/failover.py --lease 15 8 5 --runs 5   # 8 s alone: the default
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.apiserver_support import ControlPlane, _free_port  # noqa: E402

NODE_STATUS = {"status": {"capacity": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "allocatable": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


def node_body(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:04d}", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8",
        "kubernetes.io/hostname": f"node-{i:04d}"}}}


def pod_body(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:05d}"},
            "spec": {"schedulerName": "gpufleet", "containers": [{"name": "c", "image": "busybox", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}


class Watcher:
    """Every pod's node as the watch reports it: a pod seen on two nodes is bound twice."""

    def __init__(self, core, ns: str):
        from kubernetes import watch

        self.node: dict[str, str] = {}
        self.rebound: set[str] = set()
        self.lock = threading.Lock()
        self._w = watch.Watch()
        self._stop = False

        def run() -> None:
            rv = core.list_namespaced_pod(ns, limit=1).metadata.resource_version
            while not self._stop:
                try:
                    for ev in self._w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=60):
                        o = ev["object"]
                        rv = o.metadata.resource_version
                        n = o.spec.node_name
                        if n:
                            with self.lock:
                                old = self.node.get(o.metadata.name)
                                if old is not None and old != n:
                                    self.rebound.add(o.metadata.name)
                                self.node[o.metadata.name] = n
                except Exception:  # noqa: BLE001 - reconnect
                    time.sleep(0.2)

        threading.Thread(target=run, daemon=True).start()

    def bound(self) -> int:
        with self.lock:
            return len(self.node)

    def stop(self) -> None:
        self._stop = True
        self._w.stop()


def metric(port: int, name: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except Exception:  # noqa: BLE001 - not up, or killed
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return None


def overcommit(core, ns: str) -> int:
    per_gpu: dict[tuple[str, int], int] = {}
    per_node: dict[str, set[int]] = {}
    for p in core.list_namespaced_pod(ns).items:
        a = (p.metadata.annotations or {}).get("gpufleet.io/assignment")
        if not p.spec.node_name or not a:
            continue
        d = json.loads(a)
        for g in d.get("gpus") or []:
            per_gpu[(d["node"], g["index"])] = per_gpu.get((d["node"], g["index"]), 0) + int(d.get("gpu_milli") or 1000)
            per_node.setdefault(d["node"], set()).add(g["index"])
    return sum(1 for v in per_gpu.values() if v > 1000) + sum(1 for v in per_node.values() if len(v) > 8)


def run_once(cp: ControlPlane, core, lease_s: int, run: int, args, d: Path) -> dict:
    from kubernetes import client

    ns = f"fo-{lease_s}-{run}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    coord = client.CoordinationV1Api(core.api_client)
    procs: dict[str, tuple[subprocess.Popen, int]] = {}
    for ident in ("a", "b"):
        port = _free_port()
        log = open(d / f"{ns}-{ident}.log", "wb")
        procs[ident] = (subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(cp.kubeconfig),
             f"--metrics-addr=127.0.0.1:{port}", "--lease-namespace", ns, "--lease-name", "gpufleet-scheduler",
             "--identity", ident, f"--lease-duration={lease_s}", "--log-level=WARNING", f"--policy={args.policy}"],
            stdout=log, stderr=subprocess.STDOUT), port)
    watcher = Watcher(core, ns)
    try:
        def holder() -> str:
            try:
                spec = coord.read_namespaced_lease("gpufleet-scheduler", ns).spec
                return (spec.holder_identity if spec is not None else "") or ""
            except Exception:  # noqa: BLE001 - not created yet
                return ""
        t = time.monotonic()
        while holder() not in procs and time.monotonic() - t < 60:
            time.sleep(0.1)
        leader = holder()
        follower = "b" if leader == "a" else "a"
        fport = procs[follower][1]
        while metric(procs[leader][1], "gpufleet_leader") != 1.0 and time.monotonic() - t < 60:
            time.sleep(0.1)
        stop_creating = threading.Event()

        def create() -> None:
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: stop_creating.is_set() or core.create_namespaced_pod(ns, pod_body(i), _preload_content=False),
                            range(args.pods)))
        creator = threading.Thread(target=create, daemon=True)
        creator.start()
        kill_at = int(args.kill_at * args.pods)
        while watcher.bound() < kill_at and time.monotonic() - t < args.settle_s:
            time.sleep(0.01)
        binds_before = metric(fport, "gpufleet_binds_total") or 0.0
        os.kill(procs[leader][0].pid, signal.SIGKILL)
        t_kill = time.monotonic()
        bound_at_kill = watcher.bound()
        takeover = leader_s = None
        while time.monotonic() - t_kill < args.settle_s:
            now = time.monotonic()
            if leader_s is None and metric(fport, "gpufleet_leader") == 1.0:
                leader_s = now - t_kill
            b = metric(fport, "gpufleet_binds_total")
            if takeover is None and b is not None and b > binds_before:
                takeover = now - t_kill
            if takeover is not None and watcher.bound() >= args.pods:
                break
            time.sleep(0.02)
        creator.join(60)
        time.sleep(1.0)  # the watch catches up
        final = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(ns).items}
        follower_binds = int(metric(fport, "gpufleet_binds_total") or 0)
        res: dict[str, Any] = {"lease_s": lease_s, "run": run, "pods": len(final), "bound_at_kill": bound_at_kill,
               "leader_s": None if leader_s is None else round(leader_s, 2),
               "takeover_s": None if takeover is None else round(takeover, 2),
               "bound_twice": len(watcher.rebound) + sum(1 for k, v in final.items() if v and watcher.node.get(k, v) != v),
               "follower_binds": follower_binds,
               "gpus_overcommitted": overcommit(core, ns), "unscheduled": sum(1 for v in final.values() if not v)}
        # the follower bound what was left: more than that would be a pod bound by both
        res["bound_twice"] += max(0, follower_binds - (len(final) - bound_at_kill))
        print(json.dumps(res), flush=True)
        return res
    finally:
        watcher.stop()
        for p, _ in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def main() -> int:
    from kubernetes import client, config

    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="failover.py")
    ap.add_argument("--nodes", type=int_range(1), default=150)
    ap.add_argument("--pods", type=int_range(1), default=1000)
    ap.add_argument("--lease", type=int_range(3, 3600), nargs="+", default=[8],
                    help="lease durations to compare (s; default 8, gpufleet scheduler's --lease-duration default)")
    ap.add_argument("--runs", type=int_range(1), default=5)
    ap.add_argument("--kill-at", type=float_range(0, 1), default=0.3, help="share of the pods bound when the leader dies")
    ap.add_argument("--settle-s", type=float_range(1), default=180)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--json", default="", help="write every run here")
    args = ap.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    if not assets or not (Path(assets) / "kube-apiserver").is_file():
        print("failover.py: KUBEBUILDER_ASSETS must name a folder with kube-apiserver and etcd", file=sys.stderr)
        return 2
    d = Path(tempfile.mkdtemp(prefix="gpufleet-failover-"))
    cp = ControlPlane(assets, d)
    results: list[dict] = []
    try:
        cp.start()
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        core: Any = client.CoreV1Api(client.ApiClient(cfg))
        with ThreadPoolExecutor(16) as ex:
            def mk(i: int) -> None:
                core.create_node(node_body(i), _preload_content=False)
                core.patch_node_status(f"node-{i:04d}", NODE_STATUS, _preload_content=False)
            list(ex.map(mk, range(args.nodes)))
        for run in range(args.runs):
            for lease_s in args.lease:
                results.append(run_once(cp, core, lease_s, run, args, d))
    finally:
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    bad = 0
    for lease_s in args.lease:
        rs = [r for r in results if r["lease_s"] == lease_s]
        tk = [r["takeover_s"] for r in rs if r["takeover_s"] is not None]
        ld = [r["leader_s"] for r in rs if r["leader_s"] is not None]
        worst = {k: max(r[k] for r in rs) for k in ("bound_twice", "gpus_overcommitted", "unscheduled")}
        print(f"lease {lease_s} s, {len(rs)} runs, {args.pods} pods, {args.nodes} nodes: takeover (kill -9 -> the other "
              f"replica binds again) median {statistics.median(tk) if tk else 'n/a'} s (min {min(tk, default=0)}, "
              f"max {max(tk, default=0)}); lease taken after median {statistics.median(ld) if ld else 'n/a'} s; "
              f"worst run: bound twice {worst['bound_twice']}, GPUs over-committed {worst['gpus_overcommitted']}, "
              f"unscheduled {worst['unscheduled']}")
        bad += sum(worst.values()) + (len(tk) < len(rs))
    return 1 if bad else 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("failover.py", main))
