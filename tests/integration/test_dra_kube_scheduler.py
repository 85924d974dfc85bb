"""The agent's ResourceSlices are standard: the stock kube-scheduler 1.37 allocates claims from them, and the
agent's kubelet plugin prepares what kube-scheduler allocated.

No kubelet here (the apiserver tier): the agent's DRA driver publishes a fake A100 node's slices (MIG, PCIe roots
from a fake sysfs), the shipped DeviceClasses are applied, kube-scheduler 1.37 (its own process, its own profile
name) allocates and binds pods whose claims ask for one GPU, two GPUs on one PCIe root (matchAttribute), a MIG
slice, two 20 GiB shares of one GPU (consumable capacity) and ``nvidia.com/gpu: 1`` (extended resource backed by
DRA); a third share that no longer fits and a claim no device meets stay unscheduled.  The claims kube-scheduler
wrote are then prepared the way kubelet asks the plugin to, and an allocation another allocator wrote for a GPU
kube-scheduler already gave away is refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.dra.kubeapi import KubeDraApi
from gpufleet.agent.dra.prepare import PrepareError
from gpufleet.agent.nvml import PROFILES

from .conftest import ASSETS

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"
NODE = "dra-ks-a"
PROFILE = "dra-kube-scheduler"  # kube-scheduler's profile: only this test's pods
NS = "default"
PCIE = {2: "pci0000:00", 3: "pci0000:00", 4: "pci0000:00", 5: "pci0000:80", 6: "pci0000:80", 7: "pci0000:80",
        0: "pci0000:00", 1: "pci0000:80"}


def wait_for(cond, timeout_s=60.0, step_s=0.2):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step_s)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_sysfs(root: Path) -> str:
    drv, gpus = PROFILES["a100-mig"]
    for g in gpus:
        bdf = g.pci_bus_id.lower()[4:]
        (root / "devices" / PCIE[g.index] / bdf).mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../devices/{PCIE[g.index]}/{bdf}", root / "bus" / "pci" / "devices" / bdf)
    return str(root)


@pytest.fixture(scope="module")
def kube_scheduler(control_plane):
    if not (Path(ASSETS) / "kube-scheduler").is_file():
        pytest.skip("no kube-scheduler in KUBEBUILDER_ASSETS")
    d = Path(tempfile.mkdtemp(prefix="dra-ks-"))
    cfg = d / "kube-scheduler.yaml"
    cfg.write_text(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{control_plane.kubeconfig}"}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: {PROFILE}
""")
    log = open(d / "kube-scheduler.log", "wb")
    proc = subprocess.Popen([str(Path(ASSETS) / "kube-scheduler"), f"--config={cfg}", f"--secure-port={_free_port()}",
                             "--bind-address=127.0.0.1", f"--authentication-kubeconfig={control_plane.kubeconfig}",
                             f"--authorization-kubeconfig={control_plane.kubeconfig}", "-v=2"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield d / "kube-scheduler.log"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def published(admin, kube_scheduler):
    """The node, its slices (published by the agent's driver) and the DeviceClasses."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    api = KubeDraApi(admin, instance="it")
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    core.patch_node_status(NODE, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test", "lastHeartbeatTime": None,
         "lastTransitionTime": None}]}})
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="drak"))
    drv, gpus = PROFILES["a100-mig"]
    d = DraDriver(api, NODE, DraOptions(sysfs_root=fake_sysfs(root / "sys")), str(root / "state"), CdiWriter(str(root / "cdi")),
                  plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"))
    d.update(gpus, drv, {g.index: True for g in gpus}, {})
    assert d.publisher.sync(force=True), d.publisher.last_error
    co = client.CustomObjectsApi(admin)
    classes = [x for p in ("deploy/dra/deviceclasses.yaml", "deploy/dra/extended-resource/deviceclass.yaml")
               for x in yaml.safe_load_all((ROOT / p).read_text()) if x]
    for c in classes:
        co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c)
    try:
        yield api, d, core
    finally:
        for c in classes:
            co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c["metadata"]["name"])
        for s in api.list_slices(NODE, DRIVER)[0]:
            api.delete_slice(s["metadata"]["name"])
        for p in core.list_namespaced_pod(NS).items:
            if p.spec.scheduler_name == PROFILE:
                core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)
        for c in api._request("GET", f"{RES}/namespaces/{NS}/resourceclaims")["items"]:
            if c["metadata"]["name"].startswith("ks-"):
                api._request("DELETE", f"{RES}/namespaces/{NS}/resourceclaims/{c['metadata']['name']}")
        core.delete_node(NODE)


def claim(name: str, request: dict, constraints=None) -> dict:
    spec: dict = {"devices": {"requests": [request]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def pod(name: str, claim_name: str | None = None, limits: dict | None = None) -> dict:
    c: dict = {"name": "c", "image": "busybox", "resources": {"limits": dict(limits or {})}}
    spec: dict = {"schedulerName": PROFILE, "nodeSelector": {"kubernetes.io/hostname": NODE}, "containers": [c]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        c["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def gpu(cls="gpu.gpufleet.io", **extra) -> dict:
    return {"name": "gpu", "exactly": {"deviceClassName": cls, **extra}}


def idx(expr: str) -> list:
    return [{"cel": {"expression": expr}}]


def test_kube_scheduler_allocates_from_the_agents_slices_and_the_plugin_prepares_it(published):
    api, d, core = published
    share = {"capacity": {"requests": {"memory": "20Gi", "gpuMilli": "300"}},
             "selectors": idx("device.attributes['gpu.gpufleet.io'].index == 7")}
    claims = [claim("ks-whole", gpu()),
              claim("ks-pair", {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpufleet.io", "count": 2,
                                                            "selectors": idx("device.attributes['gpu.gpufleet.io'].index != 7")}},
                    [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
              claim("ks-mig", gpu("mig.gpufleet.io", selectors=idx("device.attributes['gpu.gpufleet.io'].profile == '2g.20gb'"))),
              claim("ks-share-a", gpu("gpu-share.gpufleet.io", **share)),
              claim("ks-share-b", gpu("gpu-share.gpufleet.io", **share)),
              claim("ks-share-big", gpu("gpu-share.gpufleet.io", capacity={"requests": {"memory": "50Gi"}},
                                        selectors=idx("device.attributes['gpu.gpufleet.io'].index == 7"))),
              claim("ks-h100", gpu(selectors=idx("device.attributes['gpu.gpufleet.io'].productName.contains('H100')")))]
    for c in claims:
        api._request("POST", f"{RES}/namespaces/{NS}/resourceclaims", c)
    for name in ("whole", "pair", "mig", "share-a", "share-b"):
        core.create_namespaced_pod(NS, pod(f"ks-{name}", f"ks-{name}"))
    assert wait_for(lambda: all(core.read_namespaced_pod(f"ks-{n}", NS).spec.node_name == NODE
                                for n in ("whole", "pair", "mig", "share-a", "share-b")), 90)
    core.create_namespaced_pod(NS, pod("ks-extended", limits={"nvidia.com/gpu": "1"}))
    core.create_namespaced_pod(NS, pod("ks-share-big", "ks-share-big"))
    core.create_namespaced_pod(NS, pod("ks-h100", "ks-h100"))
    assert wait_for(lambda: core.read_namespaced_pod("ks-extended", NS).spec.node_name == NODE, 90)

    def results(cn: str) -> list[dict]:
        c = api.get_claim(NS, cn)
        return c["status"]["allocation"]["devices"]["results"]

    got = {n: [r["device"] for r in results(f"ks-{n}")] for n in ("whole", "pair", "mig", "share-a", "share-b")}
    assert len(got["pair"]) == 2 and len({PCIE[int(x.split("-")[1])] for x in got["pair"]}) == 1, got
    assert got["mig"][0].startswith("gpu-1-mig-2g20gb-") and got["share-a"] == got["share-b"] == ["gpu-7"], got
    whole = set(got["whole"] + got["pair"])
    assert len(whole) == 3 and "gpu-7" not in whole and not any("mig" in x for x in whole)
    sa = results("ks-share-a")[0]
    assert sa["consumedCapacity"]["memory"] in ("20Gi", str(20 << 30)) and sa.get("shareID")
    ext = core.read_namespaced_pod("ks-extended", NS)
    ext_claim = api._request("GET", f"/api/v1/namespaces/{NS}/pods/ks-extended")["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    (ext_res,) = results(ext_claim)
    assert ext_res["device"] not in whole | {"gpu-7"} and not ext_res["device"].count("mig"), ext_res
    assert ext.spec.node_name == NODE
    time.sleep(3)  # kube-scheduler had its chance: the big share and the H100 claim stay unscheduled
    for n in ("ks-share-big", "ks-h100"):
        p = core.read_namespaced_pod(n, NS)
        assert p.spec.node_name is None, n
        cond = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
        assert cond and cond[0].status == "False" and cond[0].reason == "Unschedulable", (n, cond)

    # what kube-scheduler wrote, prepared as kubelet would ask the plugin to
    p = d.preparer
    prepared = {}
    for cn in ("ks-whole", "ks-pair", "ks-mig", "ks-share-a", "ks-share-b", ext_claim):
        c = api.get_claim(NS, cn)
        prepared[cn] = p.prepare(NS, c["metadata"]["uid"], cn)
    a, b = prepared["ks-share-a"][0], prepared["ks-share-b"][0]
    assert (a.whole, a.memory_bytes, a.gpu_milli) == (False, 20 << 30, 300) and a.share_id and a.share_id != b.share_id
    assert all(x.whole for cn in ("ks-whole", "ks-pair", ext_claim) for x in prepared[cn])
    spec = json.loads(p.cdi.path(api.get_claim(NS, "ks-share-a")["metadata"]["uid"]).read_text())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-07" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

    # another allocator hands the GPU kube-scheduler gave ks-whole to a second claim: the plugin refuses it
    stolen = api._request("POST", f"{RES}/namespaces/{NS}/resourceclaims", claim("ks-stolen", gpu()))
    stolen["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                                 "device": got["whole"][0]}]}}}
    stolen = api._request("PUT", f"{RES}/namespaces/{NS}/resourceclaims/ks-stolen/status", stolen)
    with pytest.raises(PrepareError) as e:
        p.prepare(NS, stolen["metadata"]["uid"], "ks-stolen")
    assert "default/ks-stolen" in e.value.message and "default/ks-whole" in e.value.message
