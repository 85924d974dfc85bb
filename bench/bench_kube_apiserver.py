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

``--scenario`` picks the pods, one workload or several separated by commas (each round runs every workload
under both schedulers, which one goes first alternating from round to round; nodes always carry hostname and
one of three zone labels):
``gpu`` (default, above); ``one-gpu``: every pod one whole ``nvidia.com/gpu`` (the same request to both
schedulers); ``preferred-anti``: CPU pods, replicas of 10 apps with
preferred hostname anti-affinity among each app's replicas (weight 100);
``spread``: CPU pods, replicas of 10 apps spread over the 3 zones with maxSkew 1
(DoNotSchedule); ``dra``: the nodes are DRA nodes (no ``nvidia.com/gpu``; each publishes a ResourceSlice of 8 A100
as ``gpufleet agent --dra`` does, the shipped DeviceClasses applied), every pod asks for one GPU by a claim from the
ResourceClaimTemplate ``one-gpu``; kube-controller-manager's resourceclaim controller (from $KUBEBUILDER_ASSETS) makes
the claims, and the schedulers start once every pod has its claim, so both time allocation, claim writes and binds.
Afterwards the claims are checked: every bound pod's claim allocated and reserved for it, no device given twice.

``--timing``: ``start`` (default) creates the pods first and times from the scheduler's process start until
every pod is bound; ``created`` starts the scheduler first, waits until it says it is ready (``/readyz``; both
have one), then creates the pods (16 threads) and times from the first pod's creation until every pod is
bound (the creation's own time is printed beside it: a figure close to it means creation, not the scheduler,
set the pace).  Both schedulers get the same client limits, ``--kube-api-qps`` / ``--kube-api-burst``
(default 1,000 / 1,000: kube-scheduler's ``clientConnection``, gpufleet's flags of the same names); the
apiserver's flags are the apiserver tier's (``tests/apiserver_support.ControlPlane``: priority and
fairness off, 2,000 / 1,000 requests in flight).  kube-scheduler runs its stock profile (every default
plugin), named ``gpufleet`` so it takes the same pods, leader election off.  Pods and nodes are created with
plain JSON requests, and binds are counted from a JSON watch decoded as plain dicts, so the bench itself
takes as little of the shared cores as it can.

    KUBEBUILDER_ASSETS=... python bench/bench_kube_apiserver.py --scenario one-gpu,preferred-anti,spread \
        --nodes 500 --pods 3000 --rounds 3 --timing created

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
from tests.apiserver_support import ClaimController, ControlPlane, _free_port  # noqa: E402


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


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of a Python process, by thread name (``py-spy dump`` names the native thread ids;
    /proc counts their CPU); bind workers and watches summed into ``bind_*`` and ``watch-*``.  Empty without py-spy."""
    import re

    try:
        out = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {int(t): n for t, n in re.findall(r'^Thread (\d+) \(\w+\): "(.*)"', out, re.M)}
    got: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = names.get(int(task.name), "other")
        name = "bind_*" if name.startswith("bind_") else "watch-* but pods" if name.startswith("watch-") and name != "watch-pod" else name
        try:
            f = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        got[name] = got.get(name, 0.0) + (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return got


class BindCounter:
    """Counts pods in the namespace that have a node, from a watch decoded as plain JSON (cheap for the apiserver
    and for this process; the same for every scheduler)."""

    def __init__(self, api, namespace: str):
        import threading

        self.bound: set[str] = set()
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._stop = False
        self.namespace = namespace

        def run() -> None:
            rv = api._request("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")["metadata"]["resourceVersion"]
            while not self._stop:
                try:
                    for type_, o in api.watch("pod", rv, 60):
                        m = o.get("metadata") or {}
                        rv = m.get("resourceVersion") or rv
                        if type_ == "BOOKMARK" or m.get("namespace") != namespace:
                            continue
                        if (o.get("spec") or {}).get("nodeName") and m["name"] not in self.bound:
                            self.last_t = time.perf_counter()
                            if self.first_t is None:
                                self.first_t = self.last_t
                            self.bound.add(m["name"])
                        if self._stop:
                            return
                except Exception:
                    time.sleep(0.2)

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def stop(self) -> None:
        self._stop = True


KUBE_SCHEDULER_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}", qps: {qps}, burst: {burst}}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: gpufleet
"""


def scheduler_cmd(which: str, args, kubeconfig: Path, d: Path, port: int) -> list[str]:
    if which.startswith("gpufleet"):
        prof = ["-m", "cProfile", "-o", args.profile] if args.profile and which == "gpufleet" else []
        # an older checkout (--old-src) may not have the client limit flags: it runs without a limit
        limits = [f"--kube-api-qps={args.kube_api_qps}", f"--kube-api-burst={args.kube_api_burst}"] if which == "gpufleet" else []
        return [sys.executable, *prof, "-m", "gpufleet.cli.main", "scheduler", "--kubeconfig", str(kubeconfig),
                "--no-leader-elect", f"--metrics-addr=127.0.0.1:{port}", f"--policy={args.policy}",
                f"--bind-workers={args.bind_workers}", *limits, "--log-level=WARNING"]
    # the stock kube-scheduler, its profile named like ours so it takes the same pods (the
    # fractional annotation means nothing to it: each pod takes one whole nvidia.com/gpu)
    cfg = d / "kube-scheduler.yaml"
    cfg.write_text(KUBE_SCHEDULER_CONFIG.format(kubeconfig=kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst))
    return [args.kube_scheduler, f"--config={cfg}", f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}", "-v=1"]


def scheduler_ready(which: str, port: int) -> bool:
    """The scheduler's own /readyz: gpufleet's after its first list, kube-scheduler's once its informers synced."""
    import ssl
    import urllib.request

    ours = which.startswith("gpufleet")
    url = f"http://127.0.0.1:{port}/readyz" if ours else f"https://127.0.0.1:{port}/readyz"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        return urllib.request.urlopen(url, timeout=2, context=None if ours else ctx).status == 200
    except OSError:
        return False


def create_all(api, bodies: list[tuple[str, dict]], threads: int = 16) -> None:
    """POST every (path, body) from ``threads`` threads, plain JSON through gpufleet's raw client."""
    with ThreadPoolExecutor(threads) as ex:
        for f in [ex.submit(api._request, "POST", path, body) for path, body in bodies]:
            f.result()


def run_one(which: str, scenario: str, args, assets: str) -> dict | None:
    from kubernetes import client, config

    from gpufleet.kube.api import KubernetesApi

    d = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    cp = ControlPlane(assets, d)
    proc = None
    counter = None
    claims = None
    spy = None
    tag = f"{which} {scenario}"
    try:
        cp.start()
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        api_client = client.ApiClient(cfg)
        core: Any = client.CoreV1Api(api_client)  # plain JSON bodies, as the adapter sends them
        raw = KubernetesApi(str(cp.kubeconfig), pool_size=32)
        raw._request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        dra = scenario == "dra"
        status = DRA_NODE_STATUS if dra else NODE_STATUS
        t0 = time.perf_counter()
        create_all(raw, [("/api/v1/nodes", node_body(i)) for i in range(args.nodes)])
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda i: raw._request("PATCH", f"/api/v1/nodes/node-{i:05d}/status", status,
                                               content_type="application/merge-patch+json"), range(args.nodes)))
        if dra:
            dra_setup(api_client, args.nodes)
            claims = ClaimController(assets, cp.kubeconfig, d)
        t1 = time.perf_counter()
        pods = [("/api/v1/namespaces/bench/pods", pod_body(i, scenario)) for i in range(args.pods)]
        port = _free_port()
        log = open(d / "scheduler.log", "wb")
        cpu0: dict[str, float] = {}
        created_s = None
        counter = BindCounter(raw, "bench")

        def launch() -> subprocess.Popen:
            nonlocal spy
            env = None
            if which == "gpufleet-old":  # the same scheduler from another checkout, side by side
                env = {**os.environ, "PYTHONPATH": str(Path(args.old_src) / "src")}
            p = subprocess.Popen(scheduler_cmd(which, args, cp.kubeconfig, d, port), stdout=log, stderr=subprocess.STDOUT, env=env)
            if args.py_spy and which == "gpufleet":
                out = f"{args.py_spy}.{scenario}.{len(list(Path(args.py_spy).parent.glob(Path(args.py_spy).name + '.*')))}.txt"
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(p.pid), "--threads", "--gil", "--rate", "100",
                                        "--format", "raw", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return p

        if args.timing == "start":
            create_all(raw, pods)
            t2 = time.perf_counter()
            if dra:  # the controller makes every pod's claim before any scheduler starts
                while sum(1 for p in core.list_namespaced_pod("bench").items if p.status.resource_claim_statuses) < args.pods:
                    if time.perf_counter() - t2 > args.timeout_s:
                        print(f"[{tag}] the resourceclaim controller did not make every claim in {args.timeout_s:.0f} s", file=sys.stderr)
                        return None
                    time.sleep(1)
            print(f"[{tag}] setup: {args.nodes} nodes in {t1 - t0:.1f} s, {args.pods} pods in {t2 - t1:.1f} s"
                  + (f", their claims in {time.perf_counter() - t2:.1f} s" if dra else ""))
            cpu0 = {proc_name(p): cpu_s(p.pid) for p in cp.procs}
            start = time.perf_counter()
            proc = launch()
        else:
            print(f"[{tag}] setup: {args.nodes} nodes in {t1 - t0:.1f} s")
            proc = launch()
            while not scheduler_ready(which, port):
                if proc.poll() is not None or time.perf_counter() - t1 > args.timeout_s:
                    print(f"[{tag}] the scheduler did not get ready", file=sys.stderr)
                    print((d / "scheduler.log").read_text()[-3000:])
                    return None
                time.sleep(0.1)
            cpu0 = {proc_name(p): cpu_s(p.pid) for p in cp.procs}
            cpu0[which] = cpu_s(proc.pid)
            start = time.perf_counter()
            create_all(raw, pods)
            created_s = time.perf_counter() - start
        while time.perf_counter() - start < args.timeout_s and len(counter.bound) < args.pods:
            if proc.poll() is not None:
                print((d / "scheduler.log").read_text()[-3000:])
                return None
            time.sleep(0.05)
        n = len(counter.bound)
        end = counter.last_t if n >= args.pods and counter.last_t else time.perf_counter()
        threads = thread_cpu(proc.pid) if args.thread_cpu and which.startswith("gpufleet") else {}
        cpu = {k: cpu_s(p.pid) - cpu0[k] for k, p in zip(cpu0, cp.procs)}
        cpu[which] = cpu_s(proc.pid) - cpu0.get(which, 0.0)
        total = end - start
        res = {"which": which, "scenario": scenario, "bound": n, "total_s": total, "pods_per_s": n / total, "steady": None,
               "cpu": cpu, "created_s": created_s}
        since = "from process start" if args.timing == "start" else f"from the first pod's creation (creating them took {created_s:.2f} s)"
        print(f"[{tag}] {n} of {args.pods} pods bound in {total:.2f} s {since} = {n / total:.0f} pods/s")
        if counter.first_t and args.timing == "start":
            ft = counter.first_t
            res["steady"] = n / max(1e-9, end - ft)
            print(f"[{tag}] first bind after {ft - start:.2f} s (start-up, list of nodes and pods); {res['steady']:.0f} pods/s from then")
        if dra:
            res["quality"] = dra_quality(api_client)
            print(f"[{tag}] claims: {res['quality']}")
        elif scenario not in ("gpu", "one-gpu"):
            res["quality"] = placement_quality(core, scenario)
            print(f"[{tag}] placement: {res['quality']}")
        warn = [ln for ln in (d / "scheduler.log").read_text(errors="replace").splitlines() if "pool is full" in ln]
        if warn:
            print(f"[{tag}] {len(warn)} connection(s) opened beyond the client's pool (urllib3: pool is full)")
        print(f"[{tag}] CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()) + f" (wall {total:.1f} s, {os.cpu_count()} cores)")
        if threads:
            res["threads"] = threads
            print(f"[{tag}] its threads' CPU seconds (start-up included): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1])))
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
        if spy is not None:
            try:
                spy.wait(20)
            except subprocess.TimeoutExpired:
                spy.kill()
        if claims is not None:
            claims.stop()
        cp.stop()
        if args.keep:
            print(f"[{tag}] kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


def timeit_us() -> float:
    """``python -m timeit "sum(range(1000))"``'s figure (best of 5, microseconds): the machine's speed now."""
    import timeit

    t = timeit.Timer("sum(range(1000))")
    n, _ = t.autorange()
    return min(t.repeat(5, n)) / n * 1e6


def main() -> int:
    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_kube_apiserver.py")
    ap.add_argument("--nodes", type=int_range(1), default=1000)
    ap.add_argument("--pods", type=int_range(1), default=3000)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--scenario", default="gpu", help="gpu, one-gpu, preferred-anti, spread or dra; several separated by commas")
    ap.add_argument("--timing", choices=("start", "created"), default="start",
                    help="start: pods first, timed from the scheduler's start; created: scheduler ready first, timed "
                         "from the first pod's creation")
    ap.add_argument("--bind-workers", type=int_range(1), default=16)
    ap.add_argument("--kube-api-qps", type=int_range(1), default=1000, help="both schedulers' client QPS (default 1000)")
    ap.add_argument("--kube-api-burst", type=int_range(1), default=1000, help="both schedulers' client burst (default 1000)")
    ap.add_argument("--timeout-s", type=float_range(0, lo_open=True), default=300)
    ap.add_argument("--profile", default="", help="write a cProfile of the gpufleet scheduler process here")
    ap.add_argument("--py-spy", default="", metavar="PREFIX",
                    help="sample the gpufleet scheduler with py-spy (every thread, samples of the thread holding the GIL: where its Python CPU goes) into PREFIX.<scenario>.<n>.txt")
    ap.add_argument("--thread-cpu", action="store_true", help="print the gpufleet scheduler's CPU seconds per thread (needs py-spy)")
    ap.add_argument("--keep", action="store_true", help="keep each run's folder (logs of the apiserver and the scheduler)")
    ap.add_argument("--rounds", type=int_range(1), default=1, help="rounds; each runs every scheduler once, alternating")
    ap.add_argument("--only", default="", help="run only these schedulers (gpufleet, gpufleet-old, kube-scheduler; commas)")
    ap.add_argument("--old-src", default="", metavar="CHECKOUT",
                    help="also run gpufleet from this checkout (its src/) as gpufleet-old, in the same rounds")
    ap.add_argument("--kube-scheduler", default="", help="stock kube-scheduler binary to compare with "
                    "(default: $KUBEBUILDER_ASSETS/kube-scheduler when present)")
    args = ap.parse_args()
    scenarios = [x.strip() for x in args.scenario.split(",") if x.strip()]
    bad = [x for x in scenarios if x not in ("gpu", "one-gpu", "preferred-anti", "spread", "dra")]
    if bad or not scenarios:
        print(f"bench_kube_apiserver.py: --scenario {args.scenario}: unknown workload {bad[0] if bad else '(none)'!r} "
              "(gpu, one-gpu, preferred-anti, spread, dra)", file=sys.stderr)
        return 2
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets or not all((Path(assets) / b).is_file() for b in ("etcd", "kube-apiserver")):
        print("set KUBEBUILDER_ASSETS to a folder with etcd and kube-apiserver", file=sys.stderr)
        return 2
    if not args.kube_scheduler and (Path(assets) / "kube-scheduler").is_file():
        args.kube_scheduler = str(Path(assets) / "kube-scheduler")
    which = ["gpufleet"] + (["gpufleet-old"] if args.old_src else []) + (["kube-scheduler"] if args.kube_scheduler else [])
    if args.only:
        which = [w for w in which if w in args.only.split(",")]
    results: dict[tuple[str, str], list[dict]] = {(s, w): [] for s in scenarios for w in which}
    ok = True
    speeds = [timeit_us()]
    print(f"timeit sum(range(1000)): {speeds[0]:.1f} us; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for rnd in range(args.rounds):
        for s in scenarios:
            for w in (which if rnd % 2 == 0 else which[::-1]):
                r = run_one(w, s, args, assets)
                ok &= r is not None
                if r:
                    results[(s, w)].append(r)
        speeds.append(timeit_us())
        print(f"timeit sum(range(1000)): {speeds[-1]:.1f} us; load average {os.getloadavg()[0]:.1f}")
    timing = "from process start" if args.timing == "start" else "from the first pod's creation"
    print(f"summary ({args.nodes} nodes, {args.pods} pods, pods bound/s {timing}, median of {args.rounds} round(s); "
          f"timeit {min(speeds):.1f}-{max(speeds):.1f} us):")
    for s in scenarios:
        for w in which:
            rs = results[(s, w)]
            if rs:
                rates = ", ".join(f"{r['pods_per_s']:.0f}" for r in rs)
                print(f"  {s:<15} {w:<15} {statistics.median(r['pods_per_s'] for r in rs):6.0f} pods/s  (rounds: {rates}; "
                      f"scheduler CPU s median {statistics.median(r['cpu'][w] for r in rs):.1f})")
        for other in ("kube-scheduler", "gpufleet-old"):
            if "gpufleet" in which and other in which and results[(s, "gpufleet")] and results[(s, other)]:
                a = statistics.median(r["pods_per_s"] for r in results[(s, "gpufleet")])
                b = statistics.median(r["pods_per_s"] for r in results[(s, other)])
                print(f"  {s:<15} gpufleet / {other} = {a / b:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_kube_apiserver.py", main))
