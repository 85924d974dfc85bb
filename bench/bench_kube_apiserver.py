"""Live-scheduler throughput on a real kube-apiserver + etcd (the issue's performance set-up).

Starts etcd and kube-apiserver from $KUBEBUILDER_ASSETS (as the integration
tier does), creates ``--nodes`` fake nodes of 8 GPUs (status patched, no
kubelets) and ``--pods`` pending pods with ``schedulerName: gpufleet`` (half
whole single-GPU, half fractional 250/300/500 milli), then starts
``gpufleet scheduler`` as its own process and times until every pod is bound
(a watch on the pods counts them).  Then the same again, on a fresh apiserver,
with the stock ``kube-scheduler`` (client QPS and burst 1,000, its profile
named ``gpufleet`` so it takes the same pods) when ``$KUBEBUILDER_ASSETS``
holds a ``kube-scheduler`` binary or ``--kube-scheduler`` names one.
Everything -- apiserver, etcd, the pod creator and the scheduler -- shares
this machine's cores.

    KUBEBUILDER_ASSETS=/path/to/bin python bench/bench_kube_apiserver.py --nodes 1000 --pods 3000 [--rounds 2]

``--scenario`` picks the pods (nodes always carry hostname and one of three zone labels):
``gpu`` (default, above); ``preferred-anti``: CPU pods, replicas of 10 apps with
preferred hostname anti-affinity among each app's replicas (weight 100);
``spread``: CPU pods, replicas of 10 apps spread over the 3 zones with maxSkew 1
(DoNotSchedule); ``dra``: the nodes are DRA nodes (no ``nvidia.com/gpu``; each publishes a ResourceSlice of 8 A100
as ``gpufleet agent --dra`` does, the shipped DeviceClasses applied), every pod asks for one GPU by a claim from the
ResourceClaimTemplate ``one-gpu``; kube-controller-manager's resourceclaim controller (from $KUBEBUILDER_ASSETS) makes
the claims, and the schedulers start once every pod has its claim, so both time allocation, claim writes and binds.
Afterwards the claims are checked: every bound pod's claim allocated and reserved for it, no device given twice.

    KUBEBUILDER_ASSETS=... python bench/bench_kube_apiserver.py --scenario dra --nodes 500 --pods 3000 --rounds 3
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.integration.conftest import ClaimController, ControlPlane, _free_port  # noqa: E402


def node_body(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:05d}", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8",
        "kubernetes.io/hostname": f"node-{i:05d}", "topology.kubernetes.io/zone": f"zone-{i % 3}"}}}


NODE_STATUS = {"status": {"capacity": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "allocatable": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
                          "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


# a DRA node: kubelet advertises no nvidia.com/gpu; its GPUs are in its ResourceSlice
DRA_NODE_STATUS = {"status": {"capacity": {"cpu": "128", "memory": "1024Gi", "pods": "110"},
                              "allocatable": {"cpu": "128", "memory": "1024Gi", "pods": "110"},
                              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}}


def constrained_pod_body(i: int, scenario: str) -> dict:
    app = f"app-{i % 10}"
    sel = {"matchLabels": {"app": app}}
    spec: dict = {"schedulerName": "gpufleet", "containers": [{"name": "c", "image": "busybox", "resources": {
        "requests": {"cpu": "1", "memory": "1Gi"}}}]}
    if scenario == "preferred-anti":
        spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": sel, "topologyKey": "kubernetes.io/hostname"}}]}}
    else:
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                              "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:06d}", "labels": {"app": app}}, "spec": spec}


def dra_pod_body(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:06d}"},
            "spec": {"schedulerName": "gpufleet", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                     "containers": [{"name": "c", "image": "busybox", "resources": {
                         "requests": {"cpu": "2", "memory": "8Gi"}, "claims": [{"name": "gpu"}]}}]}}


def dra_setup(api_client, nodes: int) -> None:
    """DeviceClasses, one ResourceSlice of 8 A100 per node (the agent's shape), the one-GPU template."""
    from kubernetes import client

    from gpufleet.engine.model import Gpu, Node
    from gpufleet.simulator.traces.dra import node_slice_json

    co = client.CustomObjectsApi(api_client)
    root = Path(__file__).parents[1]
    import yaml

    for c in yaml.safe_load_all((root / "deploy/dra/deviceclasses.yaml").read_text()):
        if c:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c)

    def mk(i: int) -> None:
        n = Node(f"node-{i:05d}", 128_000, 1 << 20, tuple(Gpu(j, f"GPU-{i:05d}-{j}", "NVIDIA A100-SXM4-80GB", 81920) for j in range(8)))
        co.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", node_slice_json(n), _preload_content=False)
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(mk, range(nodes)))
    co.create_namespaced_custom_object("resource.k8s.io", "v1", "bench", "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpufleet.io"}}]}}}})


def dra_quality(api_client) -> str:
    """Every bound pod's claim allocated and reserved for it; devices given twice."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    co: Any = client.CustomObjectsApi(api_client)
    claims = {c["metadata"]["name"]: c for c in co.list_namespaced_custom_object("resource.k8s.io", "v1", "bench", "resourceclaims")["items"]}
    bad = 0
    held: dict[tuple, int] = {}
    for p in core.list_namespaced_pod("bench").items:
        if not p.spec.node_name:
            continue
        (st,) = p.status.resource_claim_statuses or [None]
        c: dict = (claims.get(st.resource_claim_name) if st else None) or {}
        alloc = (c.get("status") or {}).get("allocation")
        if not alloc or p.metadata.uid not in [r["uid"] for r in c["status"].get("reservedFor") or []]:
            bad += 1
            continue
        for r in alloc["devices"]["results"]:
            held[(r["pool"], r["device"])] = held.get((r["pool"], r["device"]), 0) + 1
    twice = sum(1 for v in held.values() if v > 1)
    return f"{bad} bound pod(s) without an allocated, reserved claim; {twice} device(s) given twice"


def pod_body(i: int, scenario: str = "gpu") -> dict:
    if scenario == "dra":
        return dra_pod_body(i)
    if scenario != "gpu":
        return constrained_pod_body(i, scenario)
    ann = {"gpufleet.io/gpu-milli": str([250, 500, 300][i % 3])} if i % 2 else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:06d}", "annotations": ann},
            "spec": {"schedulerName": "gpufleet", "containers": [{"name": "c", "image": "busybox", "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}


def placement_quality(core, scenario: str) -> str:
    """What the constraint asked for, checked on the bound pods: zone skew per app, or replicas sharing a node."""
    per: dict[tuple[str, str], int] = {}
    for p in core.list_namespaced_pod("bench").items:
        if not p.spec.node_name:
            continue
        app = (p.metadata.labels or {}).get("app", "")
        where = f"zone-{int(p.spec.node_name.rsplit('-', 1)[1]) % 3}" if scenario == "spread" else p.spec.node_name
        per[(app, where)] = per.get((app, where), 0) + 1
    if scenario == "spread":
        apps = {a for a, _ in per}
        skew = max(max(per.get((a, f"zone-{z}"), 0) for z in range(3)) - min(per.get((a, f"zone-{z}"), 0) for z in range(3)) for a in apps)
        return f"max zone skew over apps {skew} (maxSkew 1)"
    return f"{sum(v - 1 for v in per.values() if v > 1)} replica(s) sharing a node with one of their app"


def proc_name(p: subprocess.Popen) -> str:
    """The program's file name (etcd, kube-apiserver)."""
    first = p.args[0] if isinstance(p.args, (list, tuple)) else p.args
    return Path(str(first)).name


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class BindCounter:
    """Counts pods in the namespace that have a node, from a watch (cheap for the apiserver, same for every scheduler)."""

    def __init__(self, core, namespace: str):
        import threading

        from kubernetes import watch

        self.bound: set[str] = set()
        self.first_t: float | None = None
        self._w = watch.Watch()
        self._stop = False

        def run() -> None:
            rv = core.list_namespaced_pod(namespace, limit=1).metadata.resource_version
            while not self._stop:
                try:
                    for ev in self._w.stream(core.list_namespaced_pod, namespace, resource_version=rv, timeout_seconds=60):
                        o = ev["object"]
                        rv = o.metadata.resource_version
                        if o.spec.node_name and o.metadata.name not in self.bound:
                            if self.first_t is None:
                                self.first_t = time.perf_counter()
                            self.bound.add(o.metadata.name)
                except Exception:
                    time.sleep(0.2)

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def stop(self) -> None:
        self._stop = True
        self._w.stop()


KUBE_SCHEDULER_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}", qps: 1000, burst: 1000}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: gpufleet
"""


def scheduler_cmd(which: str, args, kubeconfig: Path, d: Path) -> list[str]:
    if which == "gpufleet":
        prof = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        return [sys.executable, *prof, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(kubeconfig),
                "--no-leader-elect", f"--metrics-addr=127.0.0.1:{_free_port()}", f"--policy={args.policy}",
                f"--bind-workers={args.bind_workers}", "--log-level=WARNING"]
    # the stock kube-scheduler, its profile named like ours so it takes the same pods (the
    # fractional annotation means nothing to it: each pod takes one whole nvidia.com/gpu)
    cfg = d / "kube-scheduler.yaml"
    cfg.write_text(KUBE_SCHEDULER_CONFIG.format(kubeconfig=kubeconfig))
    return [args.kube_scheduler, f"--config={cfg}", f"--secure-port={_free_port()}", "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}", "-v=1"]


def run_one(which: str, args, assets: str) -> dict | None:
    from kubernetes import client, config

    d = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    cp = ControlPlane(assets, d)
    proc = None
    counter = None
    claims = None
    try:
        cp.start()
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        api_client = client.ApiClient(cfg)
        core: Any = client.CoreV1Api(api_client)  # plain JSON bodies, as the adapter sends them
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        dra = args.scenario == "dra"
        status = DRA_NODE_STATUS if dra else NODE_STATUS
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as ex:
            def mk(i):
                core.create_node(node_body(i), _preload_content=False)
                core.patch_node_status(f"node-{i:05d}", status, _preload_content=False)
            list(ex.map(mk, range(args.nodes)))
            if dra:
                dra_setup(api_client, args.nodes)
                claims = ClaimController(assets, cp.kubeconfig, d)
            t1 = time.perf_counter()
            list(ex.map(lambda i: core.create_namespaced_pod("bench", pod_body(i, args.scenario), _preload_content=False), range(args.pods)))
        t2 = time.perf_counter()
        if dra:  # the controller makes every pod's claim before any scheduler starts
            while sum(1 for p in core.list_namespaced_pod("bench").items if p.status.resource_claim_statuses) < args.pods:
                if time.perf_counter() - t2 > args.timeout_s:
                    print(f"[{which}] the resourceclaim controller did not make every claim in {args.timeout_s:.0f} s", file=sys.stderr)
                    return None
                time.sleep(1)
        t3 = time.perf_counter()
        print(f"[{which}] setup: {args.nodes} nodes in {t1 - t0:.1f} s, {args.pods} pods in {t2 - t1:.1f} s"
              + (f", their claims in {t3 - t2:.1f} s" if dra else ""))
        counter = BindCounter(core, "bench")
        log = open(d / "scheduler.log", "wb")
        cpu0 = {proc_name(p): cpu_s(p.pid) for p in cp.procs}
        start = time.perf_counter()
        proc = subprocess.Popen(scheduler_cmd(which, args, cp.kubeconfig, d), stdout=log, stderr=subprocess.STDOUT)
        while time.perf_counter() - start < args.timeout_s and len(counter.bound) < args.pods:
            if proc.poll() is not None:
                print((d / "scheduler.log").read_text()[-3000:])
                return None
            time.sleep(0.05)
        end = time.perf_counter()
        n = len(counter.bound)
        cpu = {k: cpu_s(p.pid) - cpu0[k] for k, p in zip(cpu0, cp.procs)}
        cpu[which] = cpu_s(proc.pid)
        total = end - start
        res = {"which": which, "bound": n, "total_s": total, "pods_per_s": n / total, "steady": None, "cpu": cpu}
        print(f"[{which}] {n} of {args.pods} pods bound in {total:.2f} s from process start = {n / total:.0f} pods/s")
        if counter.first_t:
            ft = counter.first_t
            res["steady"] = n / max(1e-9, end - ft)
            print(f"[{which}] first bind after {ft - start:.2f} s (start-up, list of nodes and pods); {res['steady']:.0f} pods/s from then")
        if dra:
            res["quality"] = dra_quality(api_client)
            print(f"[{which}] claims: {res['quality']}")
        elif args.scenario != "gpu":
            res["quality"] = placement_quality(core, args.scenario)
            print(f"[{which}] placement: {res['quality']}")
        print(f"[{which}] CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()) + f" (wall {total:.1f} s, {os.cpu_count()} cores)")
        return res if n >= args.pods else None
    finally:
        if counter is not None:
            counter.stop()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if claims is not None:
            claims.stop()
        cp.stop()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_kube_apiserver.py")
    ap.add_argument("--nodes", type=int_range(1), default=1000)
    ap.add_argument("--pods", type=int_range(1), default=3000)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--scenario", choices=("gpu", "preferred-anti", "spread", "dra"), default="gpu")
    ap.add_argument("--bind-workers", type=int_range(1), default=16)
    ap.add_argument("--timeout-s", type=float_range(0, lo_open=True), default=300)
    ap.add_argument("--profile", default="", help="write a cProfile of the gpufleet scheduler process here")
    ap.add_argument("--rounds", type=int_range(1), default=1, help="rounds; each runs every scheduler once, alternating")
    ap.add_argument("--kube-scheduler", default="", help="stock kube-scheduler binary to compare with "
                    "(default: $KUBEBUILDER_ASSETS/kube-scheduler when present)")
    args = ap.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets or not all((Path(assets) / b).is_file() for b in ("etcd", "kube-apiserver")):
        print("set KUBEBUILDER_ASSETS to a folder with etcd and kube-apiserver", file=sys.stderr)
        return 2
    if not args.kube_scheduler and (Path(assets) / "kube-scheduler").is_file():
        args.kube_scheduler = str(Path(assets) / "kube-scheduler")
    which = ["gpufleet"] + (["kube-scheduler"] if args.kube_scheduler else [])
    results: dict[str, list[dict]] = {w: [] for w in which}
    ok = True
    for _ in range(args.rounds):
        for w in which:
            r = run_one(w, args, assets)
            ok &= r is not None
            if r:
                results[w].append(r)
    print(f"summary ({args.scenario}: {args.nodes} nodes, {args.pods} pods, median of {args.rounds} round(s)):")
    for w, rs in results.items():
        if rs:
            print(f"  {w:<15} {statistics.median(r['pods_per_s'] for r in rs):6.0f} pods/s from process start, "
                  f"{statistics.median(r['steady'] or 0 for r in rs):6.0f} steady")
    if all(results[w] for w in which) and len(which) == 2:
        a = statistics.median(r["pods_per_s"] for r in results["gpufleet"])
        b = statistics.median(r["pods_per_s"] for r in results["kube-scheduler"])
        print(f"  gpufleet / kube-scheduler = {a / b:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_kube_apiserver.py", main))
