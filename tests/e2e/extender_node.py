"""Harness for the extender on a real node: the stock kube-scheduler configured from deploy/extender,
``gpufleet extender``, a real kubelet with the node agent, and the real Prometheus.

The node itself (etcd, kube-apiserver, kube-controller-manager, containerd,
kubelet) comes up as the real-node tier's does: ``tests/e2e/node_up.sh`` on the
project's real-node recipe (``tests/e2e/recipe``), driven by ``harness.RealNode``;
teardown is the recipe's ``node-down.sh``.  This module adds, each as its own process recorded by PID:

* ``gpufleet agent --nvml fake:h100-nvlink`` (8 GPUs) with its default
  configuration: every GPU is ``sharesPerGpu`` (10) kubelet devices, so node
  allocatable ``nvidia.com/gpu`` is 80 and kube-scheduler's own resource fit
  never runs out before the GPUs do -- the extender's filter is what turns the
  ninth whole-GPU pod away;

* ``kube-scheduler`` (``$K8S_BIN``) with ``deploy/extender/kube-scheduler-config.yaml``
  -- only the kubeconfig, the extender's URL and leader election changed --
  in place of the recipe's plain one;
* ``gpufleet extender`` on a free port;
* ``gpufleet scheduler`` (the secondary-scheduler mode) under its own
  ``--scheduler-name``, for the side-by-side figures;
* ``prometheus`` scraping both.

``burst()`` creates pods from several threads at once and times, from a
watch, each pod's creation (client side, just before the POST) to the first
time it is seen with ``spec.nodeName``.  Used by ``test_extender_node.py``
and ``bench/bench_extender_node.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.nvml import FakeBackend

from .harness import RealNode
from .locations import locations, why_not
from .harness import wait as wait_until

REPO = Path(__file__).resolve().parents[2]
NODE = "k8s-e2e-node"


_LOC = locations()
RECIPE = Path(_LOC["recipe"])
K8S_BIN = Path(_LOC["assets"] or "/nonexistent").resolve()
E2E_BIN = Path(_LOC["bin"] or "/nonexistent").resolve()
E2E_DATA = Path(os.environ.get("E2E_DATA") or Path(os.environ.get("TMPDIR", "/tmp")) / "k8s-e2e-data")
E2E_LOGS = Path(os.environ.get("E2E_LOGS") or Path(os.environ.get("TMPDIR", "/tmp")) / "k8s-e2e-logs")
AGENT_PROFILE = "h100-nvlink"
GPUS = len(FakeBackend(AGENT_PROFILE).gpus())  # 8
SHARES_PER_GPU = AgentConfig().shares_per_gpu  # the agent's default: kubelet devices per GPU (10)


def missing() -> str:
    """Why the real-node tier cannot run here ('' when it can)."""
    return why_not(_LOC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout_s: float = 2.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.read().decode()
    except Exception:  # noqa: BLE001 -- polling: not up yet
        return ""


def wait_for(pred, timeout_s: float, what: str, step_s: float = 0.2):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


class Proc:
    """One process this harness started, stopped by its own PID only."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None):
        self.name, self.argv, self.log = name, argv, log
        self.env = env
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.log, "ab")  # noqa: SIM115 -- kept open for the child's life
        f.write(f"\n=== {time.strftime('%H:%M:%S')} start {' '.join(self.argv)}\n".encode())
        f.flush()
        self.p = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                                  start_new_session=True)
        f.close()
        return self

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> int | None:
        if self.p is None:
            return None
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        return self.p.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# --- the node (tests/e2e/node_up.sh on the recipe, as the real-node tier) ----------------------
def real_node() -> RealNode:
    """The node's handle (nothing started yet): node_up.sh / node-down.sh with this harness's locations."""
    E2E_LOGS.mkdir(parents=True, exist_ok=True)
    return RealNode({"bin": str(E2E_BIN), "assets": str(K8S_BIN), "recipe": str(RECIPE)}, E2E_DATA, E2E_LOGS)


def gpu_allocatable(node: RealNode) -> int:
    return int((node.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0"))


def node_up(node: RealNode, log: Path) -> None:
    """Control plane + containerd + kubelet (``node_up.sh``), then ``gpufleet agent --nvml fake:h100-nvlink`` with its
    default configuration, started here and recorded in the recipe's node-pids (``gpufleet-agent``); returns when
    kubelet has the agent's 8 x sharesPerGpu devices and the agent has published its inventory (``gpu_slots``)."""
    t = time.monotonic()
    node.up()
    # fake device nodes in a private dir (not /dev): the agent hands containers /dev/nvidiaN from there
    fakedev = node.data / "fakedev"
    fakedev.mkdir(exist_ok=True)
    for i in range(GPUS):
        if not (fakedev / f"nvidia{i}").exists():
            os.mknod(fakedev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    if not (fakedev / "nvidiactl").exists():
        os.mknod(fakedev / "nvidiactl", 0o666 | 0o020000, os.makedev(195, 255))
    node.gpufleet("gpufleet-agent", ["agent", "--nvml", f"fake:{AGENT_PROFILE}", "--node-name", NODE,
                                     "--kubeconfig", str(node.kubeconfig),
                                     "--device-plugin-dir", "/var/lib/kubelet/device-plugins",
                                     "--state-dir", str(node.data / "gpufleet-agent"),
                                     "--metrics-addr", f"127.0.0.1:{free_port()}",
                                     "--dev-root", str(fakedev), "--interval", "1"])
    want = GPUS * SHARES_PER_GPU
    if not wait_until(lambda: gpu_allocatable(node) == want, 90):
        raise RuntimeError(f"allocatable nvidia.com/gpu is not {want}: {gpu_allocatable(node)}; agent log: "
                           f"{(node.logs / 'gpufleet-agent.log').read_text(errors='replace')[-2000:]}")
    if not wait_until(lambda: "gpu_slots" in (node.node()["metadata"].get("annotations") or {}).get("gpufleet.io/gpu-inventory", ""),
                      60):
        raise RuntimeError("the agent did not publish its inventory (gpufleet.io/gpu-inventory with gpu_slots)")
    with open(log, "a") as f:
        f.write(f"node up with gpufleet agent (fake:{AGENT_PROFILE}, allocatable nvidia.com/gpu {want}) "
                f"in {time.monotonic() - t:.1f} s; logs in {node.logs}\n")


def node_down(node: RealNode, log: Path) -> None:
    """Stop the agent started here (by its recorded PID), then the recipe's ``node-down.sh`` (every other
    process by PID, host changes undone)."""
    with open(log, "a") as f:
        try:
            if node.pid_of("gpufleet-agent"):
                node.stop("gpufleet-agent")
        except Exception as exc:  # noqa: BLE001 -- the cleanup below stops it by PID anyway
            f.write(f"stopping gpufleet-agent: {exc}\n")
        f.write(node.down())


def stop_recipe_scheduler() -> None:
    """The recipe's kube-scheduler (no extender) gives way to ours: by its recorded PID, after checking the binary."""
    pids = E2E_DATA / "pids"
    for line in pids.read_text().splitlines() if pids.exists() else []:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "kube-scheduler":
            pid = int(parts[1])
            try:
                exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
            except OSError:
                continue
            if Path(exe).resolve() == (K8S_BIN / "kube-scheduler").resolve():
                os.kill(pid, signal.SIGTERM)
                wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 20, "recipe kube-scheduler to stop")


def core_api(kubeconfig: Path):
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


# --- our processes ----------------------------------------------------------------------------
def gpufleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet.cli.main", *args]


def gpufleet_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONDONTWRITEBYTECODE": "1"}


def kube_scheduler_config(kubeconfig: Path, extender_url: str, out: Path) -> Path:
    """deploy/extender/kube-scheduler-config.yaml with this node's kubeconfig, the extender's URL, no leader election."""
    cfg = yaml.safe_load((REPO / "deploy" / "extender" / "kube-scheduler-config.yaml").read_text())
    cfg["clientConnection"] = {**cfg.get("clientConnection", {}), "kubeconfig": str(kubeconfig), "qps": 1000, "burst": 1000}
    cfg["leaderElection"] = {"leaderElect": False}
    assert len(cfg["extenders"]) == 1
    cfg["extenders"][0]["urlPrefix"] = extender_url
    out.write_text(yaml.safe_dump(cfg))
    return out


@dataclass
class Stack:
    """The processes of one real-node session beyond the recipe's."""

    kubeconfig: Path
    workdir: Path
    reservation_ttl_s: float = 10.0
    ext_port: int = field(default_factory=free_port)
    sched_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    prom_port: int = field(default_factory=free_port)
    secondary_name: str = "gpufleet-bench"
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def ext_url(self) -> str:
        return f"http://127.0.0.1:{self.ext_port}"

    def start_extender(self) -> Proc:
        p = Proc("extender", gpufleet_argv("extender", "--kubeconfig", str(self.kubeconfig), "--addr", f"127.0.0.1:{self.ext_port}",
                                          "--reservation-ttl", str(self.reservation_ttl_s)),
                 self.workdir / "gpufleet-extender.log", gpufleet_env()).start()
        self.procs["extender"] = p
        wait_for(lambda: http_get(self.ext_url + "/readyz") == "ok" or (not p.alive() and _raise(p)), 60, "extender /readyz")
        return p

    def start_kube_scheduler(self) -> Proc:
        cfg = kube_scheduler_config(self.kubeconfig, self.ext_url, self.workdir / "kube-scheduler-extender.yaml")
        port = free_port()
        p = Proc("kube-scheduler", [str(K8S_BIN / "kube-scheduler"), f"--config={cfg}", "--bind-address=127.0.0.1",
                                    f"--secure-port={port}", f"--authentication-kubeconfig={self.kubeconfig}",
                                    f"--authorization-kubeconfig={self.kubeconfig}"],
                 self.workdir / "kube-scheduler.log").start()
        self.procs["kube-scheduler"] = p

        def healthy() -> bool:
            if not p.alive():
                _raise(p)
            r = subprocess.run(["curl", "-sk", "--max-time", "2", f"https://127.0.0.1:{port}/healthz"], capture_output=True, text=True,
                               check=False)
            return r.stdout == "ok"
        wait_for(healthy, 90, "kube-scheduler /healthz", 0.5)
        return p

    def start_secondary(self) -> Proc:
        p = Proc("scheduler", gpufleet_argv("scheduler", "--kubeconfig", str(self.kubeconfig), "--scheduler-name", self.secondary_name,
                                          "--metrics-addr", f"127.0.0.1:{self.metrics_port}", "--no-leader-elect"),
                 self.workdir / "gpufleet-scheduler.log", gpufleet_env()).start()
        self.procs["scheduler"] = p
        wait_for(lambda: http_get(f"http://127.0.0.1:{self.metrics_port}/readyz") == "ok" or (not p.alive() and _raise(p)),
                 60, "gpufleet scheduler /readyz")
        return p

    def start_prometheus(self) -> Proc:
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "scrape_configs": [
                   {"job_name": "gpufleet-extender", "static_configs": [{"targets": [f"127.0.0.1:{self.ext_port}"]}]},
                   {"job_name": "gpufleet-scheduler", "static_configs": [{"targets": [f"127.0.0.1:{self.metrics_port}"]}]}]}
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        p = Proc("prometheus", ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'prom-data'}",
                                f"--web.listen-address=127.0.0.1:{self.prom_port}", "--log.level=warn"],
                 self.workdir / "prometheus.log").start()
        self.procs["prometheus"] = p
        wait_for(lambda: "Ready" in http_get(f"http://127.0.0.1:{self.prom_port}/-/ready") or (not p.alive() and _raise(p)),
                 60, "prometheus /-/ready")
        return p

    def promql(self, query: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        out = json.loads(http_get(url, 5) or "{}")
        if out.get("status") != "success":
            raise RuntimeError(f"prometheus query {query!r}: {out}")
        return out["data"]["result"]

    def stop_all(self) -> None:
        for name in ("kube-scheduler", "extender", "scheduler", "prometheus"):
            if name in self.procs:
                self.procs[name].stop()


def bring_up(node: RealNode, workdir: Path, ns: str, prometheus: bool = False) -> tuple[Any, Stack]:
    """(core API, stack): the node up (recipe + agent) with the recipe's scheduler stopped, ``ns`` created, and the
    extender, kube-scheduler calling it and the secondary scheduler running (and Prometheus); what the tier and
    its benchmark both run on.  If a process fails to start, the ones started are stopped again; the node is
    the caller's to take down (``node_down``)."""
    node_up(node, workdir / "run-e2e.log")
    core = core_api(node.kubeconfig)
    stop_recipe_scheduler()
    ensure_namespace(core, ns)
    stack = Stack(node.kubeconfig, workdir)
    try:
        stack.start_extender()
        stack.start_kube_scheduler()
        stack.start_secondary()
        if prometheus:
            stack.start_prometheus()
    except BaseException:
        stack.stop_all()
        raise
    return core, stack


def _raise(p: Proc) -> bool:
    raise RuntimeError(f"{p.name} exited with {p.p.returncode if p.p else '?'}:\n{p.text()[-3000:]}")


# --- pods ---------------------------------------------------------------------------------------
def pod_body(name: str, scheduler: str, gpus: int = 1, milli: int | None = None) -> dict:
    ann = {"gpufleet.io/gpu-milli": str(milli)} if milli else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann, "labels": {"app": "burst"}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "sleep 3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                                   "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def ensure_namespace(core, ns: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def clear_pods(core, ns: str, timeout_s: float = 120) -> None:
    """Delete every pod of the namespace and wait until kubelet has let them go (their devices are free then).

    Pending pods go first, while the bound ones still hold the GPUs: deleted together, the GPUs freed by the bound
    pods send a pending one back to kube-scheduler, which may then be binding it through the extender when it is
    deleted too -- a "pod not found" bind error in kube-scheduler's log that the next test would count as its own."""
    pending = [p.metadata.name for p in core.list_namespaced_pod(ns).items if not p.spec.node_name]
    for name in pending:
        try:
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        except Exception:  # noqa: BLE001 -- bound or gone meanwhile: the collection delete below takes it
            pass
    wait_for(lambda: not {p.metadata.name for p in core.list_namespaced_pod(ns).items} & set(pending), timeout_s,
             f"pending pods of {ns} gone", 0.2)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout_s, f"pods of {ns} gone", 0.5)


@dataclass
class Burst:
    n: int
    created: dict[str, float]
    bound: dict[str, float]
    wall_s: float

    @property
    def latencies_s(self) -> list[float]:
        return sorted(self.bound[k] - self.created[k] for k in self.bound if k in self.created)

    def p(self, q: float) -> float:
        lat = self.latencies_s
        if not lat:
            return float("nan")
        return lat[min(len(lat) - 1, max(0, round(q * len(lat) + 0.5) - 1))]

    @property
    def binds_per_s(self) -> float:
        if not self.bound:
            return 0.0
        span = max(self.bound.values()) - min(self.created.values())
        return len(self.bound) / span if span > 0 else float("inf")

    def summary(self) -> str:
        return (f"{len(self.bound)}/{self.n} bound, {self.binds_per_s:.1f} binds/s, create-to-bound p50 {self.p(0.5) * 1000:.0f} ms "
                f"p99 {self.p(0.99) * 1000:.0f} ms")


def burst(core, ns: str, scheduler: str, n: int, gpus: int = 1, milli: int | None = None, prefix: str = "b",
          expect_bound: int | None = None, timeout_s: float = 60, during=None, threads: int = 8) -> Burst:
    """Create ``n`` pods at once; wait until ``expect_bound`` (default n) are bound, then a short settle.

    ``during(bound_count)`` is called from the waiting loop (restarts mid-burst)."""
    from kubernetes import watch

    want = n if expect_bound is None else expect_bound
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    w = watch.Watch()
    stop = threading.Event()

    def watcher() -> None:
        nonlocal rv
        while not stop.is_set():
            try:
                for ev in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5,
                                   allow_watch_bookmarks=True):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version or rv
                    if ev["type"] != "BOOKMARK" and obj.spec and obj.spec.node_name and obj.metadata.name not in bound:
                        bound[obj.metadata.name] = time.monotonic()
                    if stop.is_set():
                        return
            except Exception:  # noqa: BLE001 -- reconnect (e.g. 410 after a long burst)
                time.sleep(0.1)

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    time.sleep(0.2)
    names = [f"{prefix}{i:03d}" for i in range(n)]

    def create(name: str) -> None:
        created[name] = time.monotonic()
        core.create_namespaced_pod(ns, pod_body(name, scheduler, gpus, milli))

    t0 = time.monotonic()
    end = t0 + timeout_s
    with ThreadPoolExecutor(threads) as pool:
        # the waiting loop runs while the pods are still being created: a fast node binds the first ones
        # before the last is created, and ``during`` must see the burst in flight
        futures = [pool.submit(create, name) for name in names]
        while (len(bound) < want or not all(f.done() for f in futures)) and time.monotonic() < end:
            if during is not None:
                during(len(bound))
            time.sleep(0.05)
        for f in futures:
            f.result()  # a failed create fails the burst
    time.sleep(2.0)  # settle: anything more that binds now would be over-commitment
    stop.set()
    w.stop()
    t.join(10)
    return Burst(n, created, dict(bound), time.monotonic() - t0)


def gpu_use(core, ns: str) -> Counter:
    """milli-GPU per (node, GPU index) from the pods' assignment annotations."""
    used: Counter = Counter()
    for p in core.list_namespaced_pod(ns).items:
        a = (p.metadata.annotations or {}).get("gpufleet.io/assignment")
        if a and p.spec.node_name:
            d = json.loads(a)
            for g in d["gpus"]:
                used[(d["node"], g["index"])] += d.get("gpu_milli") or 1000
    return used


def events(core, ns: str, reason: str = "FailedScheduling") -> list[tuple[str, str]]:
    return [(e.involved_object.name, e.message or "") for e in core.list_namespaced_event(ns).items if e.reason == reason]


def summarize(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f})" if xs else "n/a"
