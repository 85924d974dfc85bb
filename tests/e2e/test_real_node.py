"""GPU sharing on a real node: a seeded random stream of whole / milli-share / memory-share / MIG pods fills a real
kubelet's node (fake A100 with MIG, gpufleet's agent with its DEFAULT configuration), with deletions and refills, a
pod kube-scheduler binds, and in the middle a kubelet restart, a scheduler restart, a kube-apiserver restart and an
agent restart with a changed config.

Asserted: no pod fails kubelet admission; every bound pod runs; each container's NVIDIA_VISIBLE_DEVICES, its
/dev/nvidia* and kubelet's PodResources name exactly its ``gpufleet.io/assignment``; no GPU is over-committed (milli,
memory, MIG instance); at least 90% of the GPU capacity the stream asked for is placed.  The report (also written
to $E2E_LOGS/gpufleet-e2e-report.txt) gives creation->Running per request kind and the restart timings.

Also: a pod kubelet admits while the agent's path to the API server is cut runs on the GPU its assignment names.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.agent.nvml import FakeBackend

from .harness import NODE, RealNode, module_node, wait

PROFILE = "a100-mig"  # GPUs 0-1 in MIG mode (7x 1g.10gb; 3g.40gb + 2x 2g.20gb), GPUs 2-7 whole A100-80GB
GPUS = FakeBackend(PROFILE).gpus()
MIG_UUID = {(g.index, m.instance_id): m.uuid for g in GPUS for m in g.mig}
MIG_SLICES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3}
GPU_MEM = 81920
CAPACITY = 1000 * sum(1 for g in GPUS if not g.mig_enabled) + 1000 * sum(1 for g in GPUS if g.mig_enabled)
KINDS = ["whole", "milli", "memory", "mig"]
# the stream asks for this share of the node's GPU capacity (milli-GPU units; a memory share counts its share of
# the GPU's memory): the rest is room for the shapes not to fit together (a 300-milli share next to 750 milli)
FILL = float(os.environ.get("GPUFLEET_E2E_FILL", "0.9"))


def demand(kind: str, v) -> int:
    """GPU capacity a request asks for, in milli-GPU (a MIG slice is 1/7 GPU, memory as a share of 80 GiB)."""
    return {"whole": lambda: 1000 * v, "milli": lambda: v, "memory": lambda: v * 1024 * 1000 // GPU_MEM,
            "mig": lambda: 1000 * MIG_SLICES[v] // 7}[kind]()


def pod_manifest(name: str, kind: str, v, scheduler: str = "gpufleet") -> dict:
    ann: dict[str, str] = {}
    limits: dict[str, str] = {}
    if kind == "whole":
        limits["nvidia.com/gpu"] = str(v)
    elif kind == "milli":
        limits["nvidia.com/gpu"] = "1"
        ann["gpufleet.io/gpu-milli"] = str(v)
    elif kind == "memory":
        limits["nvidia.com/gpu"] = "1"
        ann["gpufleet.io/gpu-memory"] = f"{v}Gi"
    else:
        limits[f"nvidia.com/mig-{v}"] = "1"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": ann, "labels": {"e2e-kind": kind}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env; echo DEVS; ls /dev; sleep 3600"],
                                     "resources": {"limits": {"cpu": "10m", "memory": "16Mi", **limits},
                                                   "requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


class Stream:
    """The seeded stream and its bookkeeping: what was asked, when each pod was created and first seen Running."""

    def __init__(self, node: RealNode, seed: int) -> None:
        self.node, self.rng = node, random.Random(seed)
        self.asked: dict[str, tuple[str, object, int]] = {}  # name -> (kind, value, demand)
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.deleted: set[str] = set()
        self.n = 0

    def draw(self) -> tuple[str, object]:
        kind = self.rng.choices(KINDS, weights=[3, 3, 3, 2])[0]
        v = {"whole": lambda: self.rng.choice([1, 1, 2]), "milli": lambda: self.rng.choice([100, 200, 250, 300, 500]),
             "memory": lambda: self.rng.choice([8, 10, 16, 20, 40]),
             "mig": lambda: self.rng.choice(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])}[kind]()
        return kind, v

    def live_demand(self) -> int:
        return sum(d for name, (_, _, d) in self.asked.items() if name not in self.deleted)

    def create_until(self, fraction: float, max_pods: int) -> list[str]:
        """Create pods until the live pods ask for ``fraction`` of the node's GPU capacity."""
        items, names = [], []
        tries = 0
        while self.live_demand() < fraction * CAPACITY and len(self.asked) - len(self.deleted) < max_pods and tries < 200:
            tries += 1
            kind, v = self.draw()
            d = demand(kind, v)
            if self.live_demand() + d > CAPACITY:
                continue  # the stream never asks for more than the node has
            name = f"{kind}-{self.n}"
            self.n += 1
            self.asked[name] = (kind, v, d)
            items.append(pod_manifest(name, kind, v))
            names.append(name)
        return self.submit(items, names)

    def submit(self, items: list[dict], names: list[str]) -> list[str]:
        if items:
            t = time.monotonic()
            self.node.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
            for n in names:
                self.created[n] = t
        return names

    def observe(self) -> list[dict]:
        pods = self.node.pods()
        now = time.monotonic()
        for p in pods:
            n = p["metadata"]["name"]
            cs = (p.get("status") or {}).get("containerStatuses") or []
            if n in self.created and n not in self.running and cs and cs[0].get("ready"):
                self.running[n] = now
        return pods

    def settle(self, timeout_s: float) -> list[dict]:
        """Wait until every bound pod of ours runs and nothing is still being placed (or the timeout)."""
        t = time.monotonic()
        pods = self.observe()
        while time.monotonic() - t < timeout_s:
            ours = [p for p in pods if p["metadata"]["name"] in self.created]
            bound_not_running = [p for p in ours if p["spec"].get("nodeName") and p["metadata"]["name"] not in self.running]
            if not bound_not_running and time.monotonic() - t > 3:
                break
            time.sleep(1.0)
            pods = self.observe()
        return pods

    def delete_some(self, fraction: float) -> list[str]:
        live = sorted(n for n in self.running if n not in self.deleted)
        gone = self.rng.sample(live, int(len(live) * fraction))
        if gone:
            self.node.kubectl("delete", "pod", *gone, "--grace-period=1", "--wait=true", timeout=120)
            self.deleted.update(gone)
        return gone


def check_pods(node: RealNode, pods: list[dict], stream: Stream, problems: list[str]) -> dict:
    """Per running pod: env + /dev + PodResources == assignment; GPUs not over-committed; no admission failure."""
    pr = node.pod_resources()
    (node.logs / f"pods-{int(time.time())}.json").write_text(json.dumps(pods))
    milli: dict[int, int] = {}
    mem: dict[int, int] = {}
    mig_used: dict[tuple[int, int], str] = {}
    checked = 0
    for p in pods:
        name, ns = p["metadata"]["name"], p["metadata"]["namespace"]
        status = p.get("status") or {}
        if status.get("phase") == "Failed" or "Admission" in (status.get("reason") or ""):
            problems.append(f"{name}: {status.get('phase')} {status.get('reason')}: {status.get('message')}")
            continue
        if not p["spec"].get("nodeName"):
            continue
        cs = status.get("containerStatuses") or []
        if not (cs and cs[0].get("ready")):
            problems.append(f"{name}: bound but not running: {json.dumps(cs)[:300]}")
            continue
        text = (p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment")
        if not text:
            if any(r.startswith(("nvidia.com/", )) for r in (p["spec"]["containers"][0].get("resources") or {}).get("limits", {})):
                problems.append(f"{name}: holds GPUs but has no gpufleet.io/assignment (not recorded)")
            continue
        a = json.loads(text)
        if a.get("mig"):
            want = [MIG_UUID[(m["gpu"], m["instance_id"])] for m in a["mig"]]
            want_idx = sorted({m["gpu"] for m in a["mig"]})
            for m in a["mig"]:
                k = (m["gpu"], m["instance_id"])
                if k in mig_used:
                    problems.append(f"MIG instance {k} held by {mig_used[k]} and {name}")
                mig_used[k] = name
        else:
            want = [g["uuid"] for g in a["gpus"]]
            want_idx = sorted(g["index"] for g in a["gpus"])
            for g, m in zip(a["gpus"], a["gpu_memory_mib"]):
                milli[g["index"]] = milli.get(g["index"], 0) + a["gpu_milli"]
                mem[g["index"]] = mem.get(g["index"], 0) + (GPU_MEM if a["gpu_milli"] >= 1000 else m)
        out = node.pod_logs(ns, name)
        env = dict(line.split("=", 1) for line in out.split("DEVS")[0].splitlines() if "=" in line)
        devs = out.split("DEVS", 1)[1].split() if "DEVS" in out else []
        seen = env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")
        if seen != want:
            problems.append(f"{name}: NVIDIA_VISIBLE_DEVICES {seen} != assignment {want}")
        have_idx = sorted(int(d[6:]) for d in devs if d.startswith("nvidia") and d[6:].isdigit())
        if have_idx != want_idx or "nvidiactl" not in devs:
            problems.append(f"{name}: /dev nvidia{have_idx} (+ctl {'nvidiactl' in devs}) != assigned GPUs {want_idx}")
        ids = sorted({i.split("::")[0] for i in pr.get((ns, name), [])})
        if ids != sorted(want):
            problems.append(f"{name}: kubelet PodResources {pr.get((ns, name))} != assignment {want}")
        checked += 1
    for g, v in milli.items():
        if v > 1000:
            problems.append(f"GPU {g} over-committed: {v} milli")
    for g, v in mem.items():
        if v > GPU_MEM:
            problems.append(f"GPU {g} over-committed: {v} MiB of {GPU_MEM}")
    return {"checked": checked, "milli": milli, "mem": mem, "mig": len(mig_used)}


@pytest.fixture(scope="module")
def real_node():
    with module_node("gpufleet-e2e-") as node:
        yield node


def start_agent(node: RealNode, extra: list[str]) -> None:
    node.gpufleet("gpufleet-agent", ["agent", "--nvml", f"fake:{PROFILE}", "--node-name", NODE,
                                     "--kubeconfig", str(node.kubeconfig), "--device-plugin-dir", "/var/lib/kubelet/device-plugins",
                                     "--state-dir", str(node.data / "gpufleet-agent"), "--metrics-addr", "127.0.0.1:19400",
                                     "--dev-root", str(node.data / "fakedev"), "--interval", "1", *extra])


def gpu_allocatable(node: RealNode) -> int:
    return int((node.node()["status"].get("allocatable") or {}).get("nvidia.com/gpu", "0"))


def test_real_node_random_stream_with_restarts(real_node):
    node = real_node
    timings: dict = {"node up s": round(node.up_s, 1)}
    report: list[str] = []
    problems: list[str] = []
    t_start = time.monotonic()
    node.fakedev(len(GPUS))
    seed = int(os.environ.get("GPUFLEET_E2E_SEED", "12"))

    # the agent, DEFAULT configuration
    t = time.monotonic()
    start_agent(node, [])
    assert wait(lambda: gpu_allocatable(node) == 60, 60), f"allocatable nvidia.com/gpu: {gpu_allocatable(node)}"
    timings["agent start -> allocatable (6 GPUs x 10 devices) s"] = round(time.monotonic() - t, 1)
    assert wait(lambda: "gpu_slots" in node.node()["metadata"].get("annotations", {}).get("gpufleet.io/gpu-inventory", ""), 30)
    policy = os.environ.get("GPUFLEET_E2E_POLICY", "default")
    node.gpufleet("gpufleet-scheduler", ["scheduler", "--kubeconfig", str(node.kubeconfig), "--metrics-addr",
                                         "127.0.0.1:19251", "--no-leader-elect", "--policy", policy])
    report.append(f"seed {seed}, scheduler policy {policy}")
    s = Stream(node, seed)

    # a pod another scheduler (kube-scheduler) binds: kubelet + the agent pick its GPU, the agent records it
    s.submit([pod_manifest("foreign-0", "whole", 1, scheduler="default-scheduler")], ["foreign-0"])
    s.asked["foreign-0"] = ("foreign", 1, 1000)
    assert wait(lambda: "gpufleet.io/assignment" in (node.get_json("pod", "foreign-0")["metadata"].get("annotations") or {}), 60), \
        "the agent did not record the GPU kubelet gave foreign-0"

    # wave 1: 60% of capacity
    s.create_until(0.6, 30)
    s.settle(90)

    # bad input on the node: a malformed and a stale assignment (GPU 9 does not exist) on pods bound here directly
    t = time.monotonic()
    bad = []
    for name, text in (("bad-json", "{not json"),
                       ("bad-stale", json.dumps({"node": NODE, "gpus": [{"index": 9, "uuid": "GPU-gone"}], "gpu_milli": 500,
                                                 "gpu_memory_mib": [0]}))):
        m = pod_manifest(name, "milli", 500, scheduler="nobody")
        m["metadata"]["annotations"]["gpufleet.io/assignment"] = text
        m["spec"]["nodeName"] = NODE
        bad.append(m)
    node.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": bad}))

    def refused(name: str) -> bool:
        p = node.get_json("pod", name)
        ev = node.get_json("events", "--field-selector", f"involvedObject.name={name}")["items"]
        return (p["status"].get("phase") == "Failed" and "UnexpectedAdmissionError" in (p["status"].get("reason") or "")
                and any(e.get("reason") == "GpuAssignmentRefused" for e in ev))
    for name in ("bad-json", "bad-stale"):
        if not wait(lambda n=name: refused(n), 60):
            p = node.get_json("pod", name)
            problems.append(f"{name}: not refused with an event: {p['status'].get('phase')} {p['status'].get('reason')} "
                            f"{p['status'].get('message')}")
        elif node.get_json("pod", name)["status"].get("containerStatuses"):
            problems.append(f"{name}: a container was created")
    msgs = {e["involvedObject"]["name"]: e["message"] for e in node.get_json("events")["items"] if e.get("reason") == "GpuAssignmentRefused"}
    report.append(f"bad input refused in {time.monotonic() - t:.1f} s: {json.dumps(msgs)[:600]}")
    node.kubectl("delete", "pod", "bad-json", "bad-stale", "--grace-period=0", "--wait=false")

    # kubelet restart in the middle of the stream
    before = node.log_size("kubelet")
    argv = node.stop("kubelet")
    time.sleep(2)
    t = time.monotonic()
    node.start("kubelet", argv)
    reg = wait(lambda: node.kubelet_log_has('Got registration request from device plugin with resource" resourceName="nvidia.com/gpu"', before), 60, 0.2)
    timings["kubelet restart -> agent re-registered s"] = round(time.monotonic() - t, 1) if reg else None
    if not reg:
        problems.append("the agent did not re-register with the restarted kubelet")
    wait(lambda: gpu_allocatable(node) == 60, 60)

    # wave 2 up to 100%, with a scheduler restart while it is being placed
    s.create_until(0.75, 36)
    time.sleep(2)
    node.restart("gpufleet-scheduler")
    s.create_until(FILL, 36)
    pods = s.settle(120)
    report.append(f"after wave 2: {json.dumps(check_pods(node, pods, s, problems))}")

    # deletions, a kube-apiserver restart, refills with an agent restart (changed config) in the middle
    s.delete_some(0.35)
    timings["kube-apiserver restart -> ready s"] = round(node.restart_apiserver(), 1)
    s.create_until(0.7, 36)
    cfg = node.data / "agent.yaml"
    cfg.write_text("sharesPerGpu: 16\n")
    node.stop("gpufleet-agent")
    t = time.monotonic()
    start_agent(node, ["--config", str(cfg)])
    ok = wait(lambda: gpu_allocatable(node) == 96, 90)
    timings["agent restart (sharesPerGpu 16) -> allocatable 96 s"] = round(time.monotonic() - t, 1) if ok else None
    if not ok:
        problems.append(f"allocatable after the agent restart: {gpu_allocatable(node)}")
    s.create_until(FILL, 36)
    pods = s.settle(150)
    final = check_pods(node, pods, s, problems)
    report.append(f"final: {json.dumps(final)}")

    (node.logs / "events.txt").write_text(node.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
    # capacity placed, per-kind creation -> Running
    live = {n: v for n, v in s.asked.items() if n not in s.deleted}
    placed = sum(d for n, (_, _, d) in live.items() if n in s.running)
    asked = sum(d for _, _, d in live.values())
    pending = sorted(n for n in live if n not in s.running)
    report.append(f"pods created {len(s.asked)}, deleted {len(s.deleted)}, live {len(live)}, running {len(live) - len(pending)}, "
                  f"pending {pending}")
    report.append(f"GPU capacity asked by live pods {asked} milli (stream fills to {FILL:.0%}), placed {placed} "
                  f"({100 * placed / max(asked, 1):.1f}%), node capacity {CAPACITY}")
    for kind in KINDS + ["foreign"]:
        lat = sorted(s.running[n] - s.created[n] for n, (k, _, _) in s.asked.items() if k == kind and n in s.running)
        if lat:
            report.append(f"creation -> Running, {kind:6s}: n={len(lat)} median {statistics.median(lat):.1f} s, "
                          f"max {lat[-1]:.1f} s")
    timings["tier wall s"] = round(time.monotonic() - t_start, 1)
    report.append("timings: " + json.dumps(timings))
    report += [f"PROBLEM {p}" for p in problems]
    text = "\n".join(report)
    (node.logs / "gpufleet-e2e-report.txt").write_text(text + "\n")
    print("\n" + text)
    assert not problems, "\n".join(problems)
    assert placed >= 0.9 * asked, f"placed {placed} of {asked} milli asked"


def _prom(url: str, q: str) -> list[dict]:
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(q)}", timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def _sleep_pid(uid: str) -> int | None:
    """The container's `sleep` process of the pod with this UID (its cgroup path names the pod)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() == "sleep" and (
                    f"pod{uid}" in (d / "cgroup").read_text() or f"pod{uid.replace('-', '_')}" in (d / "cgroup").read_text()):
                return int(d.name)
        except OSError:
            continue
    return None


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not on PATH (Debian package prometheus)")
def test_real_prometheus_scrapes_the_agent_and_gpufleet_queries_it(real_node):
    """Debian's Prometheus scrapes the agent on the node; the shares of one GPU are attributed to their pods and add
    up to the GPU's own figure; `gpufleet top` and `gpufleet recommend` answer from real PromQL; `gpufleet reclaim`
    runs its dry run against it."""
    node = real_node
    pods = [p for p in node.pods() if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running"]
    by_gpu: dict[int, list[dict]] = {}
    for p in pods:
        a = json.loads((p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment", "{}") or "{}")
        if a.get("gpus") and not a.get("mig") and a.get("gpu_milli", 1000) < 1000:
            by_gpu.setdefault(a["gpus"][0]["index"], []).append(p)
    shared = [(g, ps) for g, ps in sorted(by_gpu.items()) if len(ps) >= 2]
    assert shared, f"no GPU with two shares running: {by_gpu}"
    gpu, sharers = shared[0]
    load = []
    for k, p in enumerate(sharers[:3]):
        pid = _sleep_pid(p["metadata"]["uid"])
        assert pid, f"no process of {p['metadata']['name']}"
        load.append({"pid": pid, "gpu": gpu, "used_memory_mib": 1000 * (k + 1), "sm_util_pct": 10 * (k + 2), "pod": p["metadata"]["name"]})
    Path(node.env["GPUFLEET_FAKE_PROCESSES"]).write_text(json.dumps(load))
    cfg = node.data / "prometheus.yml"
    cfg.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                   "scrape_configs:\n  - job_name: gpufleet-agent\n    static_configs: [{targets: ['127.0.0.1:19400']}]\n")
    url = "http://127.0.0.1:19090"
    node.start("prometheus", ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={node.data / 'prometheus'}",
                              "--web.listen-address=127.0.0.1:19090"])
    report = []
    try:
        want = {x["pod"]: x["sm_util_pct"] for x in load}
        names = {p["metadata"]["name"] for p in sharers}
        want.update({n: 0 for n in names if n not in want})  # the GPU's other sharers run nothing on it
        q = f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",pod!=""}}'
        assert wait(lambda: {r["metric"]["pod"]: float(r["value"][1]) for r in _prom(url, q)} == want, 90), \
            f"per-pod series {_prom(url, q)} != {want}"
        total = float(_prom(url, f'sum(DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}"}})')[0]["value"][1])
        assert total == sum(want.values()), total  # the fake GPU's own utilisation is its processes' sum
        mem = {r["metric"]["pod"]: float(r["value"][1]) for r in _prom(url, f'DCGM_FI_DEV_FB_USED{{gpu="{gpu}",pod!=""}}')}
        assert mem == {**{n: 0 for n in names}, **{x["pod"]: x["used_memory_mib"] for x in load}}, mem
        report.append(f"GPU {gpu}: per-pod util {want} sum {total}; FB_USED {mem}")
        env = dict(node.env)
        top = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "top", "--once", "--kubeconfig", str(node.kubeconfig),
                              "--prometheus", url], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert top.returncode == 0 and NODE in top.stdout, top.stdout + top.stderr
        report.append("gpufleet top --once:\n" + top.stdout[-1500:])
        rec = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "recommend", "--prometheus", url, "--kubeconfig",
                              str(node.kubeconfig), "--window", "5m", "--step", "1s", "--json"], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
        assert rec.returncode == 0, rec.stdout + rec.stderr
        report.append("gpufleet recommend --json: " + rec.stdout[-800:])
        rcl = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "reclaim", "--prometheus", url, "--kubeconfig",
                              str(node.kubeconfig), "--json"], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert rcl.returncode == 0, rcl.stdout + rcl.stderr
        report.append("gpufleet reclaim (dry run) --json: " + rcl.stdout[-800:])
    finally:
        node.stop("prometheus")
        text = "\n".join(report)
        with open(node.logs / "gpufleet-e2e-report.txt", "a") as f:
            f.write(text + "\n")
        print("\n" + text)


class CuttableProxy:
    """A TCP forwarder to the API server that the test can cut: while cut, connections are closed as soon as they
    are accepted and the open ones are dropped, as in an API server restart or a lost network path."""

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self._socket, self.target = socket, target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.cut, self.refused = threading.Event(), 0
        self.lock, self.conns = threading.Lock(), set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.cut.is_set():
                self.refused += 1
                c.close()
                continue
            try:
                u = self._socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns |= {c, u}
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(a, b)

    def _drop(self, *socks) -> None:
        for s in socks:
            try:
                s.shutdown(self._socket.SHUT_RDWR)
            except OSError:
                pass

    def set_cut(self, on: bool) -> None:
        if not on:
            self.cut.clear()
            return
        self.cut.set()
        with self.lock:
            self._drop(*self.conns)
            self.conns.clear()

    def close(self) -> None:
        self.set_cut(True)
        self.sock.close()


def test_a_pod_admitted_while_the_agent_cannot_reach_the_api_server_runs_on_its_assigned_gpu(real_node):
    """Found on this tier: a pod kubelet admitted during a kube-apiserver restart ran on GPU 2 while its assignment
    said GPU 3 (the agent could not read the assignment and let kubelet's choice stand).  Here the agent's own path
    to the API server is cut while kubelet admits a pod bound with an assignment, and restored 6 s later: the agent
    waits for it (``--api-wait-s``), and the pod runs on the GPU the assignment names."""
    import re

    node = real_node
    node.fakedev(len(GPUS))
    text = node.kubeconfig.read_text()
    m = re.search(r"server:\s*https://([\d.]+):(\d+)", text)
    assert m, "no https server in the kubeconfig"
    proxy = CuttableProxy((m[1], int(m[2])))
    cut_kubeconfig = node.data / "kubeconfig-cuttable"
    cut_kubeconfig.write_text(text.replace(m[0], f"server: https://{m[1]}:{proxy.port}"))
    if node.pid_of("gpufleet-agent"):
        node.stop("gpufleet-agent")
    cfg = node.data / "agent.yaml"  # the config the stream test left the agent with, if it ran
    before = node.log_size("kubelet")
    start_agent(node, (["--config", str(cfg)] if cfg.exists() else []) + ["--kubeconfig", str(cut_kubeconfig)])  # last wins
    name = "cut-api"
    try:
        # the Node's allocatable may still show the last agent's devices: wait for kubelet to take this one's
        assert wait(lambda: node.kubelet_log_has('Got registration request from device plugin with resource" '
                                                 'resourceName="nvidia.com/gpu"', before), 60, 0.2), "the agent did not register"
        time.sleep(3)  # its first ListAndWatch: kubelet marks the devices healthy
        # the GPU: the busiest whole A100 that still takes a 100-milli share (highest index on a tie), so that
        # kubelet's own choice (GPUs nobody uses, lowest index first; else the least loaded) is another one
        milli = {g.index: 0 for g in GPUS if not g.mig_enabled}
        held = {g: 0 for g in milli}
        for p in node.pods():
            if p["spec"].get("nodeName") != NODE or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            a = json.loads((p["metadata"].get("annotations") or {}).get("gpufleet.io/assignment", "{}") or "{}")
            for g in a.get("gpus") or []:
                if g["index"] in milli:
                    milli[g["index"]] += a.get("gpu_milli", 1000)
                    held[g["index"]] += 1
        room = [g for g in milli if milli[g] <= 900]
        assert room, f"no A100 with 100 milli free: {milli}"
        gpu = max(room, key=lambda g: (held[g], g))
        uuid = next(g.uuid for g in GPUS if g.index == gpu)
        pm = pod_manifest(name, "milli", 100, scheduler="nobody")
        pm["spec"]["nodeName"] = NODE
        pm["metadata"]["annotations"]["gpufleet.io/assignment"] = json.dumps(
            {"node": NODE, "gpus": [{"index": gpu, "uuid": uuid}], "gpu_milli": 100, "gpu_memory_mib": [0]})
        proxy.set_cut(True)
        node.kubectl("create", "-f", "-", input=json.dumps(pm))  # straight to the API server, not through the proxy
        time.sleep(6)
        assert proxy.refused > 0, "the agent did not try the API server while it was cut"
        proxy.set_cut(False)
        assert wait(lambda: ((node.get_json("pod", name).get("status") or {}).get("containerStatuses") or [{}])[0].get("ready"), 90), \
            f"{name} not running: {json.dumps(node.get_json('pod', name).get('status'))[:600]}"
        out = node.pod_logs("default", name)
        env = dict(line.split("=", 1) for line in out.split("DEVS")[0].splitlines() if "=" in line)
        ids = node.pod_resources().get(("default", name), [])
        print(f"\n{name}: assigned GPU {gpu}; NVIDIA_VISIBLE_DEVICES {env.get('NVIDIA_VISIBLE_DEVICES')}, kubelet {ids}; "
              f"the proxy turned away {proxy.refused} connection(s) while cut")
        assert env.get("NVIDIA_VISIBLE_DEVICES") == uuid
        assert ids and all(i.split("::")[0] == uuid for i in ids), ids
    finally:
        proxy.close()
        node.kubectl("delete", "pod", name, "--grace-period=0", "--wait=false", check=False)
        node.stop("gpufleet-agent")
