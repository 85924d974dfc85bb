"""The image, deployed for real: containerd + kubelet + kube-apiserver, the project's manifests via ``kubectl apply -k``.

Real-node tier, skipped unless these name what it needs (and it runs as root):

    GPUFLEET_E2E_BIN        the binaries scripts/build-k8s.sh built (kubelet, kube-controller-manager, kubectl,
                            containerd v2, and the control plane unless KUBEBUILDER_ASSETS names another folder)
    GPUFLEET_E2E_IMAGE_TAR  the image as a docker-archive (scripts/build-image.sh --save FILE)
    GPUFLEET_E2E_IMAGE      its name in that archive (default ghcr.io/gpufleet/gpufleet:<version>)
    GPUFLEET_E2E_RECIPE     the real-node recipe (default the project's tests/e2e/recipe)

GPUFLEET_E2E_NODE_UP=1 uses a node that ``tests/e2e/node_up.sh`` left up and leaves it up (the gpufleet objects
are still removed).  The node is shared host state, one at a time: run it under the lock,

    flock -w 1200 /work/realnode.lock env GPUFLEET_E2E_BIN=... GPUFLEET_E2E_IMAGE_TAR=... \\
        python -m pytest -p no:cacheprovider tests/deploy/test_deploy_image.py

What happens: the node comes up as the real-node tier's does (``tests/e2e/node_up.sh`` on the recipe, through
``tests/e2e/harness.RealNode``: control plane with the recipe's kube-scheduler, containerd, kubelet; no gpufleet
process), the fake GPUs' device nodes are made in /dev (recorded in the recipe's ``created-devnodes``, as its own
run does), the image is imported into the node's containerd and ``tests/deploy/e2e-overlay`` is applied (the shipped
``deploy/`` plus ``deploy/extender`` and ``deploy/reclaim``, with only what the recipe's node needs changed: host
network and the apiserver's address, since it has no kube-proxy; the imported image; the fake NVML backend, handing
containers those device nodes).  The checks: the agent's DaemonSet pod registers with kubelet (allocatable
``nvidia.com/gpu`` = GPUs x the shipped config's devices per GPU, ``sharesPerGpu``) and labels the node under its own
ServiceAccount; the scheduler's pod runs under its ServiceAccount and RBAC, holds the lease and is Ready within 5 s of
its container starting; a GPU pod is placed by it, admitted by kubelet through the agent and sees exactly its
assigned GPUs; the extender answers kube-scheduler's filter verb in-cluster; the reclaim controller completes rounds.
Everything is torn down at the end (``kubectl delete -k``, the recipe's ``node-down.sh``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpufleet.agent.config import load_agent_config
from gpufleet.agent.nvml import FakeBackend
from tests.e2e.harness import RealNode
from tests.e2e.locations import locations

ROOT = Path(__file__).parents[2]
OVERLAY = Path(__file__).parent / "e2e-overlay"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
RECIPE = locations()["recipe"]
E2E_BIN = locations()["bin"]
IMAGE_TAR = os.environ.get("GPUFLEET_E2E_IMAGE_TAR", "")
IMAGE = os.environ.get("GPUFLEET_E2E_IMAGE", f"ghcr.io/gpufleet/gpufleet:{VERSION}")
OVERLAY_IMAGE = "localhost/gpufleet:e2e-test"  # the overlay's images: entry
NODE = "k8s-e2e-node"  # the recipe's node name
NS = "kube-system"
AGENT_STATE = "/var/lib/kubelet/gpufleet-e2e-agent-state"  # the overlay's hostPath
FAKE_PROFILE = "h100-nvlink"  # the overlay's GPUFLEET_FAKE_NVML


def overlay_for_release(n) -> str:
    """The overlay as the release takes it: on 1.35 without deploy/admission's MutatingAdmissionPolicy (not served
    there; what deploy/overlays/k8s-1.35 leaves out)."""
    from tests.dra_release import release_of

    out = n.k("kustomize", str(OVERLAY))
    if release_of(Path(E2E_BIN) / "kubelet") >= (1, 36):
        return out
    return yaml.safe_dump_all([d for d in yaml.safe_load_all(out) if d and not d["kind"].startswith("MutatingAdmissionPolicy")])


def shipped_agent_config():
    """The agent's configuration as deploy/agent ships it (its ConfigMap's agent.yaml), read by the agent's own loader."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "agent" / "daemonset.yaml").read_text())
    cm = next(d for d in docs if d and d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "gpufleet-agent-config")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(cm["data"]["agent.yaml"])
        f.flush()
        return load_agent_config(f.name)


GPUS = len(FakeBackend(FAKE_PROFILE).gpus())  # 8
SLOTS = shipped_agent_config().slots  # kubelet devices per GPU: sharesPerGpu (default 10) or replicas, whichever is more
ALLOCATABLE = str(GPUS * SLOTS)  # what kubelet must show once the DaemonSet's agent registered (80 as shipped)

pytestmark = [
    pytest.mark.skipif(not (E2E_BIN and IMAGE_TAR), reason="real-node tier: set GPUFLEET_E2E_BIN and GPUFLEET_E2E_IMAGE_TAR"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the real node needs root"),
    pytest.mark.node,
]


def recipe_env() -> dict[str, str]:
    """The recipe's locations, resolved by its own lib/env.sh (the project's names win: GPUFLEET_E2E_BIN, KUBEBUILDER_ASSETS)."""
    env = {**os.environ, "HERE": RECIPE, "GPUFLEET_SRC": str(ROOT)}
    if os.environ.get("GPUFLEET_E2E_BIN"):
        env["E2E_BIN"] = os.environ["GPUFLEET_E2E_BIN"]
    if os.environ.get("KUBEBUILDER_ASSETS") or E2E_BIN:
        env["K8S_BIN"] = os.environ.get("KUBEBUILDER_ASSETS") or E2E_BIN
    out = subprocess.run(["bash", "-c", ('. "$HERE/lib/env.sh"; for v in K8S_BIN E2E_BIN E2E_DATA E2E_LOGS; '
                          'do echo "$v=${!v}"; done')], env=env, check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


class Node:
    def __init__(self) -> None:
        e = recipe_env()
        self.logs = Path(e["E2E_LOGS"])
        self.logs.mkdir(parents=True, exist_ok=True)
        # the real-node tier's handle: node_up.sh up, the recipe's node-down.sh down
        self.real = RealNode({"bin": e["E2E_BIN"], "assets": e["K8S_BIN"], "recipe": RECIPE}, Path(e["E2E_DATA"]), self.logs)
        self.data = self.real.data
        self.kubectl = str(Path(e["E2E_BIN"]) / "kubectl")
        self.kcfg = str(self.real.kubeconfig)
        self.ctr = [str(Path(e["E2E_BIN"]) / "ctr"), "-a", str(self.data / "containerd" / "containerd.sock"), "-n", "k8s.io"]

    def make_fake_devnodes(self) -> list[str]:
        """/dev/nvidia0..N-1, nvidiactl, nvidia-uvm{,-tools} as on a GPU node (the agent hands them to containers,
        containerd stats them); each one made here is recorded in the recipe's created-devnodes, which its cleanup
        removes (as its own run does)."""
        made = []
        nodes = [(f"nvidia{i}", 195, i) for i in range(GPUS)] + [("nvidiactl", 195, 255), ("nvidia-uvm", 509, 0),
                                                                 ("nvidia-uvm-tools", 509, 1)]
        with open(self.data / "created-devnodes", "a") as rec:
            for name, major, minor in nodes:
                path = f"/dev/{name}"
                if not os.path.exists(path):
                    os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
                    os.chmod(path, 0o666)
                    rec.write(path + "\n")
                    made.append(path)
        return made

    def k(self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
        r = subprocess.run([self.kubectl, "--kubeconfig", self.kcfg, *args], input=stdin, capture_output=True,
                           text=True, timeout=timeout, check=False)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.k("get", *args, "-o", "json"))

    def pods(self, selector: str, ns: str = NS) -> list[dict]:
        return self.get("pods", "-n", ns, "-l", selector)["items"]


def wait_for(what: str, fn, timeout_s: float = 120, every_s: float = 0.5):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except (AssertionError, KeyError, IndexError, ValueError, OSError) as exc:
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def ts(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)


@pytest.fixture(scope="module")
def node():
    assert (Path(RECIPE) / "node-down.sh").is_file(), f"no node-down.sh in GPUFLEET_E2E_RECIPE={RECIPE}"
    assert Path(IMAGE_TAR).is_file(), f"GPUFLEET_E2E_IMAGE_TAR={IMAGE_TAR}: no such file"
    n = Node()
    reuse = os.environ.get("GPUFLEET_E2E_NODE_UP") == "1"  # a node left by `node_up.sh`: neither start nor stop it
    log = n.logs / "gpufleet-deploy-image.log"
    try:
        if not reuse:
            took = n.real.up()  # node_up.sh: raises with its output when the node is not Ready
            print(f"\nnode up (tests/e2e/node_up.sh on {RECIPE}) in {took:.1f} s")
        made = n.make_fake_devnodes()
        with open(log, "a") as f:
            f.write(f"fake device nodes made: {' '.join(made) or 'none (already there)'}\n")
        n.k("delete", "pods", "--all", "-n", "default", "--grace-period=1", "--wait=true", timeout=120)
        # a reused node may carry what an earlier agent wrote: gone, so what is there at the end is the DaemonSet's doing
        labels = n.get("node", NODE)["metadata"].get("labels", {})
        ours = [f"{k}-" for k in labels if k.startswith(("nvidia.com/", "gpufleet.io/"))]
        if ours:
            n.k("label", "node", NODE, *ours)
        n.k("annotate", "node", NODE, "gpufleet.io/gpu-inventory-")
        n.k("label", "node", NODE, "feature.node.kubernetes.io/pci-10de.present=true", "--overwrite")  # as NFD would
        subprocess.run([*n.ctr, "images", "import", IMAGE_TAR], check=True, capture_output=True, timeout=600)
        subprocess.run([*n.ctr, "images", "tag", "--force", IMAGE, OVERLAY_IMAGE], check=True, capture_output=True, timeout=60)
        n.applied_at = time.time()  # type: ignore[attr-defined]
        n.k("apply", "-f", "-", stdin=overlay_for_release(n), timeout=120)
        yield n
    finally:
        for pod in ("gpufleet-e2e-gpu2",):
            n.k("delete", "pod", pod, "-n", "default", "--grace-period=1", "--ignore-not-found", check=False, timeout=90)
        n.k("delete", "-f", "-", "--ignore-not-found", "--wait=true", check=False, timeout=120, stdin=overlay_for_release(n))
        if not reuse:
            out = n.real.down()  # the recipe's node-down.sh: every process by PID, host changes (dev nodes) undone
            with open(log, "a") as f:
                f.write(out)
        shutil.rmtree(AGENT_STATE, ignore_errors=True)


def test_image_is_imported_into_containerd(node):
    out = subprocess.run([*node.ctr, "images", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    assert OVERLAY_IMAGE in out or f"docker.io/{OVERLAY_IMAGE}" in out, out


def test_agent_daemonset_registers_with_kubelet(node):
    pod = wait_for("the agent's DaemonSet pod Running", lambda: [
        p for p in node.pods("app.kubernetes.io/name=gpufleet-agent") if p["status"].get("phase") == "Running"], 180)[0]
    assert pod["spec"]["serviceAccountName"] == "gpufleet-agent" and pod["spec"]["nodeName"] == NODE
    assert pod["spec"]["containers"][0]["image"].endswith(OVERLAY_IMAGE)
    alloc = wait_for(f"allocatable nvidia.com/gpu = {ALLOCATABLE} ({GPUS} GPUs x {SLOTS}) from the DaemonSet's plugin", lambda: (
        node.get("node", NODE)["status"]["allocatable"].get("nvidia.com/gpu") == ALLOCATABLE), 120)
    assert alloc
    kubelet_log = (node.logs / "kubelet.log").read_text(errors="replace")
    assert 'Got registration request from device plugin with resource" resourceName="nvidia.com/gpu"' in kubelet_log
    # labels and the inventory annotation, written under the agent's ServiceAccount (RBAC: nodes get+patch)
    meta = wait_for("the agent's labels and gpufleet.io/gpu-inventory", lambda: (
        m if (m := node.get("node", NODE)["metadata"]).get("annotations", {}).get("gpufleet.io/gpu-inventory") else None), 90)
    assert meta["labels"].get("nvidia.com/gpu.present") == "true" and meta["labels"].get("nvidia.com/gpu.count") == str(GPUS)
    inv = json.loads(meta["annotations"]["gpufleet.io/gpu-inventory"])
    assert len(inv["gpus"]) == GPUS and inv.get("gpu_slots") == SLOTS, {k: v for k, v in inv.items() if k != "gpus"}
    metrics = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=10).read().decode()
    assert metrics.count("DCGM_FI_DEV_GPU_UTIL{") == GPUS
    print(f"agent pod {pod['metadata']['name']} ({pod['spec']['containers'][0]['image']}): kubelet allocatable "
          f"nvidia.com/gpu={ALLOCATABLE} ({GPUS} GPUs x {SLOTS}), node labelled, inventory gpu_slots {SLOTS}, "
          f"{GPUS} GPUs in /metrics")


def test_scheduler_runs_under_its_service_account_and_is_ready_within_5s(node):
    pod = wait_for("the scheduler pod Ready", lambda: [p for p in node.pods("app.kubernetes.io/name=gpufleet-scheduler")
                                                      if ready(p)], 180)[0]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "gpufleet-scheduler"
    assert spec["containers"][0]["image"].endswith(OVERLAY_IMAGE)
    cs = pod["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 0
    started = ts(cs["state"]["running"]["startedAt"])
    readied = ts(next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"])
    took = (readied - started).total_seconds()  # whole seconds; includes the probe's 2 s period
    print(f"scheduler pod: container started {started.time()}, Ready {readied.time()}: {took:.0f} s")
    assert took <= 5, f"scheduler Ready {took:.0f} s after its container started (target: under 5 s)"
    lease = node.get("lease", "gpufleet-scheduler", "-n", NS)  # leader election under the Role on leases
    assert lease["spec"]["holderIdentity"] == pod["metadata"]["name"]
    # the in-cluster identity, not the admin's: the apiserver saw the ServiceAccount's token
    log = node.k("logs", "-n", NS, pod["metadata"]["name"])
    assert "Forbidden" not in log and "forbidden" not in log, log[-2000:]


def test_gpu_pod_is_placed_admitted_and_sees_its_assigned_gpus(node):
    wait_for(f"allocatable nvidia.com/gpu = {ALLOCATABLE}",
             lambda: node.get("node", NODE)["status"]["allocatable"].get("nvidia.com/gpu") == ALLOCATABLE, 120)
    wait_for("the scheduler pod Ready", lambda: any(ready(p) for p in node.pods("app.kubernetes.io/name=gpufleet-scheduler")), 120)
    name = "gpufleet-e2e-gpu2"
    node.k("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "gpufleet", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": "local/busybox:1", "imagePullPolicy": "Never",
            "command": ["sh", "-c", "env | grep ^NVIDIA_VISIBLE_DEVICES=; ls /dev | grep ^nvidia; sleep 3600"],
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}))
    pod = wait_for(f"{name} Running", lambda: p if (p := node.get("pod", name, "-n", "default"))["status"].get(
        "phase") == "Running" else None, 120)
    assert pod["spec"]["nodeName"] == NODE
    assignment = json.loads(pod["metadata"]["annotations"]["gpufleet.io/assignment"])
    uuids = [g["uuid"] for g in assignment["gpus"]]
    assert len(uuids) == 2 and assignment["node"] == NODE
    events = node.get("events", "-n", "default", "--field-selector", f"involvedObject.name={name}")["items"]
    assert any(e["reason"] == "Scheduled" and "gpufleet" in e.get("reportingComponent", "") for e in events), [
        (e["reason"], e.get("reportingComponent"), e.get("source")) for e in events]
    logs = wait_for("the GPU pod's output", lambda: o if "NVIDIA_VISIBLE_DEVICES=" in (o := node.k(
        "logs", name, "-n", "default", check=False)) else None, 60)
    seen = next(line.split("=", 1)[1] for line in logs.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES="))
    print(f"{name}: on {pod['spec']['nodeName']}, assignment {uuids}, container sees NVIDIA_VISIBLE_DEVICES={seen}")
    assert sorted(seen.split(",")) == sorted(uuids), (seen, uuids)  # the scheduler's GPUs, handed over by the agent
    devs = {line.strip() for line in logs.splitlines() if line.startswith("nvidia")}
    assert {f"nvidia{g['index']}" for g in assignment["gpus"]} <= devs and "nvidiactl" in devs, devs


def test_extender_answers_filter_in_cluster(node):
    wait_for("the extender pod Ready", lambda: any(ready(p) for p in node.pods("app.kubernetes.io/name=gpufleet-extender")), 180)
    pod = node.pods("app.kubernetes.io/name=gpufleet-extender")[0]
    assert pod["spec"]["serviceAccountName"] == "gpufleet-extender"
    args = {"Pod": {"metadata": {"name": "probe", "namespace": "default", "uid": "u-probe"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
            "NodeNames": [NODE]}
    req = urllib.request.Request("http://127.0.0.1:8888/filter", data=json.dumps(args).encode(),
                                 headers={"Content-Type": "application/json"})
    res = wait_for("the extender's filter to know the node", lambda: r if (r := json.loads(
        urllib.request.urlopen(req, timeout=10).read())).get("NodeNames") == [NODE] else None, 60)
    assert not res.get("Error"), res


def test_reclaim_controller_runs_rounds_under_its_rbac(node):
    pod = wait_for("the reclaim pod Running", lambda: [p for p in node.pods("app.kubernetes.io/name=gpufleet-reclaim")
                                                       if p["status"].get("phase") == "Running"], 180)[0]
    assert pod["spec"]["serviceAccountName"] == "gpufleet-reclaim"

    def ok_rounds() -> float:
        text = urllib.request.urlopen("http://127.0.0.1:9402/metrics", timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith('gpufleet_reclaim_rounds_total{result="ok"}'))

    assert wait_for("a reclaim round that listed pods and PDBs and scraped the agent", ok_rounds, 90) >= 1
    log = node.k("logs", "-n", NS, pod["metadata"]["name"])
    assert "round failed" not in log and "orbidden" not in log, log[-2000:]
