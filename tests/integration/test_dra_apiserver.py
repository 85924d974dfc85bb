"""The agent's DRA driver against a real kube-apiserver (1.37 as built by scripts/build-k8s.sh).

What only a real API server can say: the ResourceSlices the agent publishes pass its validation (names,
attribute types, versions, consumable-capacity policies, taints), the shipped DeviceClasses (CEL,
extendedResourceName) are accepted, a kubelet-style wipe of the node's slices is noticed by the watch and
undone, claims allocated through the status subresource are prepared, and a doubly allocated device is
refused with Events the API stores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"


def wait_for(cond, timeout_s=30.0, step_s=0.1):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step_s)
    return False


@pytest.fixture
def api(admin):
    return KubeDraApi(admin, instance="it")


def make_node(core, name: str) -> str:
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return name


def slices_of(api: KubeDraApi, node: str) -> list[dict]:
    return api.list_slices(node, DRIVER)[0]


@pytest.fixture
def node_a(core, api):
    name = make_node(core, "dra-it-a")
    yield name
    for s in slices_of(api, name):
        api.delete_slice(s["metadata"]["name"])
    core.delete_node(name)


def driver_for(api, node: str, root: Path, profile="a100-mig", **opts) -> DraDriver:
    drv, gpus = PROFILES[profile]
    d = DraDriver(api, node, DraOptions(**opts), str(root / "state"), CdiWriter(str(root / "cdi")),
                  plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"))
    d.update(gpus, drv, {g.index: True for g in gpus}, {})
    return d


def test_slices_pass_validation_and_come_back_after_a_kubelet_wipe(api, node_a, core):
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    d = driver_for(api, node_a, root, nvidia_attributes=True)
    d.start()
    try:
        d.step()
        assert d.publisher.last_error == ""
        (s,) = slices_of(api, node_a)
        spec = s["spec"]
        assert spec["pool"] == {"name": node_a, "generation": 1, "resourceSliceCount": 1}
        assert len(spec["devices"]) == 16
        node_uid = core.read_node(node_a).metadata.uid
        assert s["metadata"]["ownerReferences"][0]["uid"] == node_uid
        gpu2 = next(x for x in spec["devices"] if x["name"] == "gpu-2")
        assert gpu2["allowMultipleAllocations"] is True
        assert gpu2["capacity"]["gpuMilli"]["value"] == "1k"  # the server's canonical form of 1000
        assert gpu2["attributes"]["gpu.nvidia.com/productName"] == {"string": "NVIDIA A100-SXM4-80GB"}

        # kubelet starting: every slice of the node goes (DeleteCollection by node); the watch notices
        api._request("DELETE", f"{RES}/resourceslices?fieldSelector=spec.nodeName%3D{node_a}")
        assert wait_for(lambda: d.publisher._dirty.is_set(), 30)
        d.step()
        (s,) = slices_of(api, node_a)
        assert s["spec"]["pool"]["generation"] == 2 and len(s["spec"]["devices"]) == 16

        # someone edits the slice: put back
        s["spec"]["devices"] = s["spec"]["devices"][:3]
        api.update_slice(s)
        assert wait_for(lambda: d.publisher._dirty.is_set(), 30)
        d.step()
        (s,) = slices_of(api, node_a)
        assert len(s["spec"]["devices"]) == 16 and s["spec"]["pool"]["generation"] == 3

        # an XID: the device and its MIG siblings get a taint the API accepts; recovery removes it
        drv, gpus = PROFILES["a100-mig"]
        d.update(gpus, drv, {g.index: g.index != 1 for g in gpus}, {1: "XID 48"})
        d.step()
        (s,) = slices_of(api, node_a)
        tainted = {x["name"]: x["taints"] for x in s["spec"]["devices"] if x.get("taints")}
        assert set(tainted) == {"gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-1", "gpu-1-mig-2g20gb-2"}
        assert tainted["gpu-1-mig-3g40gb-0"][0]["key"] == "gpu.gpufleet.io/xid" and tainted["gpu-1-mig-3g40gb-0"][0]["value"] == "48"
        d.update(gpus, drv, {g.index: True for g in gpus}, {})
        d.step()
        (s,) = slices_of(api, node_a)
        assert not any(x.get("taints") for x in s["spec"]["devices"])
    finally:
        d.stop()


@pytest.mark.parametrize("profile, shares", [("h100-nvlink", True), ("t4", False)])
def test_other_profiles_and_no_shares_are_valid(api, core, profile, shares):
    node = make_node(core, f"dra-it-{profile}")
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    d = driver_for(api, node, root, profile=profile, shares=shares)
    try:
        drv, gpus = PROFILES[profile]
        d.update(gpus, drv, {g.index: g.index != 0 for g in gpus}, {0: "NVML cannot query the device"})
        d.publisher.sync(force=True)
        assert d.publisher.last_error == ""
        (s,) = slices_of(api, node)
        assert len(s["spec"]["devices"]) == len(gpus)
        assert s["spec"]["devices"][0]["taints"][0]["key"] == "gpu.gpufleet.io/gpu-lost"
    finally:
        for s in slices_of(api, node):
            api.delete_slice(s["metadata"]["name"])
        core.delete_node(node)


def test_shipped_device_classes_are_accepted(admin):
    from kubernetes import client

    co = client.CustomObjectsApi(admin)
    docs = [d for p in ("deploy/dra/deviceclasses.yaml", "deploy/dra/extended-resource/deviceclass.yaml")
            for d in yaml.safe_load_all((ROOT / p).read_text()) if d]
    try:
        for d in docs:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", d)
        got = {d["metadata"]["name"]: d for d in co.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]}
        assert got["gpu-extended.gpufleet.io"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
        assert {"gpu.gpufleet.io", "mig.gpufleet.io", "gpu-share.gpufleet.io"} <= set(got)
    finally:  # the control plane is shared by every integration test: leave no class behind
        for d in docs:
            try:
                co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", d["metadata"]["name"])
            except Exception:
                pass


def allocate(api: KubeDraApi, ns: str, name: str, results: list[dict], node: str, requests=("gpu",)) -> dict:
    """Create a claim and write its allocation through the status subresource, as an allocator does."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": "gpu.gpufleet.io"}} for r in requests]}}}
    c = api._request("POST", f"{RES}/namespaces/{ns}/resourceclaims", body)
    c["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"0000-{name}"}]}
    return api._request("PUT", f"{RES}/namespaces/{ns}/resourceclaims/{name}/status", c)


def events_for(api: KubeDraApi, ns: str, reason: str) -> list[dict]:
    items = api._request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason]


def test_claims_allocated_through_the_api_are_prepared_and_a_double_allocation_refused(api, node_a):
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    d = driver_for(api, node_a, root, profile="h100-nvlink")
    ns = "default"
    d.start()
    try:
        d.step()
        whole = allocate(api, ns, "dra-whole", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-2"}], node_a)
        s1 = allocate(api, ns, "dra-share-1", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-5",
                                               "shareID": "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d01",
                                               "consumedCapacity": {"memory": "40Gi", "gpuMilli": "500"}}], node_a)
        s2 = allocate(api, ns, "dra-share-2", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-5",
                                               "shareID": "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d02",
                                               "consumedCapacity": {"memory": "30Gi", "gpuMilli": "600"}}], node_a)
        dup = allocate(api, ns, "dra-dup", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-2"}], node_a)
        gone = allocate(api, ns, "dra-gone", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-9"}], node_a)
        p = d.preparer
        (w,) = p.prepare(ns, whole["metadata"]["uid"], "dra-whole")
        assert (w.device, w.uuid, w.whole) == ("gpu-2", "GPU-h100-02", True)
        spec = json.loads((root / "cdi" / f"k8s.gpu.gpufleet.io-claim_{whole['metadata']['uid']}.json").read_text())
        assert "NVIDIA_VISIBLE_DEVICES=GPU-h100-02" in spec["devices"][0]["containerEdits"]["env"]
        (sh,) = p.prepare(ns, s1["metadata"]["uid"], "dra-share-1")
        assert (sh.memory_bytes, sh.gpu_milli, sh.share_id) == (40 << 30, 500, "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d01")
        with pytest.raises(PrepareError, match=r"gpuMilli: 500 held \+ 600 asked > 1000"):
            p.prepare(ns, s2["metadata"]["uid"], "dra-share-2")
        with pytest.raises(PrepareError) as e:
            p.prepare(ns, dup["metadata"]["uid"], "dra-dup")
        assert "default/dra-dup" in e.value.message and "default/dra-whole" in e.value.message
        with pytest.raises(PrepareError, match="device 'gpu-9' does not exist on node dra-it-a"):
            p.prepare(ns, gone["metadata"]["uid"], "dra-gone")
        assert wait_for(lambda: len(events_for(api, ns, "DeviceAlreadyAllocated")) >= 3, 20)  # claim + pod, x2 claims
        evs = events_for(api, ns, "DeviceAlreadyAllocated")
        regarding = {(e["regarding"]["kind"], e["regarding"]["name"]) for e in evs}
        assert {("ResourceClaim", "dra-dup"), ("Pod", "dra-dup-pod"), ("ResourceClaim", "dra-share-2")} <= regarding
        assert any("default/dra-whole" in e["note"] for e in evs if e["regarding"]["name"] == "dra-dup")
        assert wait_for(lambda: any(e["regarding"]["name"] == "dra-gone" for e in events_for(api, ns, "DeviceNotFound")), 20)
        p.unprepare(ns, whole["metadata"]["uid"], "dra-whole")
        assert p.prepare(ns, dup["metadata"]["uid"], "dra-dup")[0].device == "gpu-2"
    finally:
        d.stop()
        for n in ("dra-whole", "dra-share-1", "dra-share-2", "dra-dup", "dra-gone"):
            try:
                api._request("DELETE", f"{RES}/namespaces/{ns}/resourceclaims/{n}")
            except Exception:
                pass


def test_the_agent_process_in_dra_mode(control_plane, api, core):
    """`gpufleet agent --dra` as a process: publishes, serves the plugin sockets, stops on SIGTERM (exit 0)."""
    node = make_node(core, "dra-it-proc")
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="drap"))
    log = open(d / "agent.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli.main", "agent", "--dra", "--nvml", "fake:a100-mig", "--node-name", node,
         "--kubeconfig", str(control_plane.kubeconfig), "--state-dir", str(d / "state"), "--cdi-dir", str(d / "cdi"),
         "--kubelet-plugins-dir", str(d / "plugins"), "--kubelet-registry-dir", str(d / "reg"), "--metrics-addr", "",
         "--no-labels", "--interval", "0.2", "--stop-drain-seconds", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    try:
        assert wait_for(lambda: len(slices_of(api, node)) == 1, 60), (d / "agent.log").read_text()
        (s,) = slices_of(api, node)
        assert len(s["spec"]["devices"]) == 16
        assert (d / "reg" / "gpu.gpufleet.io-reg.sock").is_socket()
        assert (d / "plugins" / "gpu.gpufleet.io" / "dra.sock").is_socket()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not (d / "reg" / "gpu.gpufleet.io-reg.sock").exists()
        assert len(slices_of(api, node)) == 1  # slices stay: kubelet removes them 30 s after a disconnect
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        for s in slices_of(api, node):
            api.delete_slice(s["metadata"]["name"])
        core.delete_node(node)

