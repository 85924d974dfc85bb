"""The agent's DRA driver against a real kube-apiserver (1.35 and 1.37 as built by scripts/build-k8s.sh).

What only a real API server can say: the ResourceSlices the agent publishes pass its validation (names,
attribute types, versions, consumable-capacity policies, taints), the shipped DeviceClasses (CEL,
extendedResourceName) are accepted, a kubelet-style wipe of the node's slices is noticed by the watch and
undone, claims allocated through the status subresource are prepared, and a doubly allocated device is
refused with Events the API stores.

Release-aware (tests/dra_release.py): on 1.35, whose default gates drop consumable capacity and device taints,
the agent must find that out from the server itself, publish exclusive GPUs and leave an unhealthy one out of its
slices, with a Node Event naming each gate; the share and extended-resource classes are refused or emptied there,
which is why deploy/overlays/dra-k8s-1.35 leaves them out.
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
from gpufleet.agent.dra.features import Served
from gpufleet.agent.dra.kubeapi import KubeDraApi
from gpufleet.agent.dra.prepare import PrepareError
from gpufleet.agent.nvml import PROFILES
from tests.dra_release import BASE_CLASSES, FULL_CLASSES, full_dra

from tests.apiserver_support import assets_release

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"
RELEASE = assets_release()
FULL = full_dra(RELEASE)  # 1.36+: consumable capacity and device taints served by default


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


def remove_node(core, api: KubeDraApi, name: str) -> None:
    """The node and its slices, whatever state a failed test left them in."""
    for s in slices_of(api, name):
        try:
            api.delete_slice(s["metadata"]["name"])
        except Exception:
            pass
    try:
        core.delete_node(name)
    except Exception:
        pass


@pytest.fixture
def fresh_node(core, api):
    """make(name): a Node (no kubelet), deleted with its slices at teardown even when the test fails."""
    made: list[str] = []

    def make(name: str) -> str:
        made.append(name)
        return make_node(core, name)

    yield make
    for n in made:
        remove_node(core, api, n)


@pytest.fixture
def node_a(fresh_node):
    return fresh_node("dra-it-a")


def node_events(api: KubeDraApi, node: str, reason: str) -> list[dict]:
    items = api._request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")["items"]
    return [e for e in items if e.get("reason") == reason and (e.get("regarding") or {}).get("name") == node
            and (e.get("regarding") or {}).get("kind") == "Node"]


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
        # what the server serves, found out by the agent itself (a dry-run create), before its first write
        assert d.served_known and d.served == (Served() if FULL else Served(False, False)), RELEASE
        (s,) = slices_of(api, node_a)
        spec = s["spec"]
        assert spec["pool"] == {"name": node_a, "generation": 1, "resourceSliceCount": 1}
        assert len(spec["devices"]) == 16
        node_uid = core.read_node(node_a).metadata.uid
        assert s["metadata"]["ownerReferences"][0]["uid"] == node_uid
        gpu2 = next(x for x in spec["devices"] if x["name"] == "gpu-2")
        assert gpu2["attributes"]["gpu.nvidia.com/productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
        if FULL:
            assert gpu2["allowMultipleAllocations"] is True
            assert gpu2["capacity"]["gpuMilli"]["value"] == "1k"  # the server's canonical form of 1000
            assert not node_events(api, node_a, "DRAFeatureNotServed")
        else:  # 1.35: exclusive whole GPUs, said on the Node once per missing gate
            assert "allowMultipleAllocations" not in gpu2 and set(gpu2["capacity"]) == {"memory", "gpu.nvidia.com/memory"}
            assert wait_for(lambda: len(node_events(api, node_a, "DRAFeatureNotServed")) == 2, 20)
            notes = {e["note"].split("feature gate ")[1].split(",")[0]: e for e in node_events(api, node_a, "DRAFeatureNotServed")}
            assert set(notes) == {"DRAConsumableCapacity", "DRADeviceTaints"}
            assert all(e["type"] == "Warning" and e["regarding"]["uid"] == node_uid for e in notes.values())
            assert "--feature-gates=DRAConsumableCapacity=true on kube-apiserver and kube-scheduler" in \
                notes["DRAConsumableCapacity"]["note"]

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

        # an XID: the device and its MIG siblings get a taint the API accepts (1.35: they leave the slice);
        # recovery removes it (brings them back)
        drv, gpus = PROFILES["a100-mig"]
        d.update(gpus, drv, {g.index: g.index != 1 for g in gpus}, {1: "XID 48"})
        d.step()
        (s,) = slices_of(api, node_a)
        gpu1 = {"gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-1", "gpu-1-mig-2g20gb-2"}
        tainted = {x["name"]: x["taints"] for x in s["spec"]["devices"] if x.get("taints")}
        if FULL:
            assert set(tainted) == gpu1
            assert tainted["gpu-1-mig-3g40gb-0"][0]["key"] == "gpu.gpufleet.io/xid" and tainted["gpu-1-mig-3g40gb-0"][0]["value"] == "48"
        else:
            assert tainted == {} and not gpu1 & {x["name"] for x in s["spec"]["devices"]}
            assert len(s["spec"]["devices"]) == 16 - 3
        d.update(gpus, drv, {g.index: True for g in gpus}, {})
        d.step()
        (s,) = slices_of(api, node_a)
        assert not any(x.get("taints") for x in s["spec"]["devices"]) and len(s["spec"]["devices"]) == 16
    finally:
        d.stop()


@pytest.mark.parametrize("profile, shares", [("h100-nvlink", True), ("t4", False)])
def test_other_profiles_and_no_shares_are_valid(api, fresh_node, profile, shares):
    node = fresh_node(f"dra-it-{profile}")
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    d = driver_for(api, node, root, profile=profile, shares=shares)
    drv, gpus = PROFILES[profile]
    d.update(gpus, drv, {g.index: g.index != 0 for g in gpus}, {0: "NVML cannot query the device"})
    assert d.publish(force=True)
    assert d.publisher.last_error == ""
    (s,) = slices_of(api, node)
    devs = s["spec"]["devices"]
    assert all(x.get("allowMultipleAllocations", False) == (shares and FULL) for x in devs)
    if FULL:
        assert len(devs) == len(gpus)
        assert devs[0]["taints"][0]["key"] == "gpu.gpufleet.io/gpu-lost"
    else:  # no device taints: the unhealthy GPU is not offered at all
        assert [x["name"] for x in devs] == [f"gpu-{g.index}" for g in gpus if g.index != 0]


def test_shipped_device_classes_are_accepted(admin):
    """deploy/dra's classes on every release (`kubectl apply -k deploy/dra` works on 1.35 too); on 1.35 the two
    deploy/overlays/dra-k8s-1.35 leaves out are accepted but serve nothing: the share class selects the agent's
    `shareable` attribute, which it does not publish there, and the extended-resource class loses
    extendedResourceName."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    co = client.CustomObjectsApi(admin)
    docs = {p: [d for d in yaml.safe_load_all((ROOT / p).read_text()) if d] for p in FULL_CLASSES}
    made: list[str] = []
    try:
        for p in BASE_CLASSES:
            for d in docs[p]:
                co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", d)
                made.append(d["metadata"]["name"])
        share = docs["deploy/dra/shares/deviceclass.yaml"][0]
        extended = docs["deploy/dra/extended-resource/deviceclass.yaml"][0]
        for d in (share, extended):
            made.append(d["metadata"]["name"])
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", d)
        # what the class would have said before (device.allowMultipleAllocations): refused by 1.35's CEL
        old = {**share, "metadata": {"name": "old-share.gpufleet.io"}, "spec": {"selectors": [{"cel": {"expression":
               "device.driver == 'gpu.gpufleet.io' && device.allowMultipleAllocations"}}]}}
        if FULL:
            made.append("old-share.gpufleet.io")
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", old)
        else:
            with pytest.raises(ApiException) as e:
                co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", old)
            assert e.value.status == 422 and "undefined field 'allowMultipleAllocations'" in e.value.body
        got = {d["metadata"]["name"]: d for d in co.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]}
        assert {"gpu.gpufleet.io", "mig.gpufleet.io", "gpu-share.gpufleet.io", "gpu-extended.gpufleet.io"} <= set(got)
        if FULL:
            assert got["gpu-extended.gpufleet.io"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
        else:  # dropped without DRAExtendedResource: a class mapping nothing
            assert "extendedResourceName" not in got["gpu-extended.gpufleet.io"]["spec"]
    finally:  # the control plane is shared by every integration test: leave no class behind
        for n in made:
            try:
                co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", n)
            except Exception:
                pass


def test_what_1_35_drops_from_a_claim_and_a_slice(api):
    """Why the agent checks what the server serves: kube-apiserver without the gates drops the gated fields without an
    error. On 1.35 a share's capacity.requests is dropped (the claim asks for a whole GPU), and so is a toleration; the
    slice fields are dropped from a dry-run create. On 1.36+ all are kept."""
    ns = "default"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "dra-drop", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.gpufleet.io", "capacity": {"requests": {"memory": "20Gi"}},
                "tolerations": [{"key": "gpu.gpufleet.io/xid", "operator": "Exists", "effect": "NoSchedule"}]}}]}}}
    try:
        got = api._request("POST", f"{RES}/namespaces/{ns}/resourceclaims", body)["spec"]["devices"]["requests"][0]["exactly"]
    finally:
        try:
            api._request("DELETE", f"{RES}/namespaces/{ns}/resourceclaims/dra-drop")
        except Exception:
            pass
    assert ("capacity" in got, "tolerations" in got) == (FULL, FULL), got
    from gpufleet.agent.dra.features import probe_slice

    sent = probe_slice("no-such-node", DRIVER)
    dev = api.probe_slice(sent)["spec"]["devices"][0]
    assert ("allowMultipleAllocations" in dev, "taints" in dev) == (FULL, FULL), dev
    assert api.list_slices("no-such-node", DRIVER)[0] == []  # a dry run stores nothing


def allocate(api: KubeDraApi, core, ns: str, name: str, results: list[dict], node: str, requests=("gpu",)) -> dict:
    """Create a claim and write its allocation through the status subresource, as an allocator does, reserved for a
    real pod (``<name>-pod``, bound to ``node``, never run: no kubelet).  The pod must exist: once the session's
    resourceclaim controller runs (a module that needs it started it), it removes a reservation for a pod that does
    not exist and deallocates the claim, and the test would see neither the pods' events nor the allocation."""
    pod = core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-pod"},
                                          "spec": {"nodeName": node, "containers": [{"name": "c", "image": "none"}]}})
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": "gpu.gpufleet.io"}} for r in requests]}}}
    c = api._request("POST", f"{RES}/namespaces/{ns}/resourceclaims", body)
    c["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]}
    return api._request("PUT", f"{RES}/namespaces/{ns}/resourceclaims/{name}/status", c)


@pytest.fixture
def fresh_ns(core):
    """A namespace of the test's own, deleted (with its pods, claims and events) at teardown: events another test
    posted in a shared namespace cannot satisfy (or confuse) this test's waits."""
    import uuid

    ns = f"dra-it-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield ns
    try:
        core.delete_namespace(ns)
    except Exception:
        pass


def events_for(api: KubeDraApi, ns: str, reason: str) -> list[dict]:
    items = api._request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason]


def test_claims_allocated_through_the_api_are_prepared_and_a_double_allocation_refused(api, core, node_a, fresh_ns):
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    d = driver_for(api, node_a, root, profile="h100-nvlink")
    ns = fresh_ns
    d.start()
    try:
        d.step()
        whole = allocate(api, core, ns, "dra-whole", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-2"}],
                         node_a)
        s1 = allocate(api, core, ns, "dra-share-1", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-5",
                                                     "shareID": "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d01",
                                                     "consumedCapacity": {"memory": "40Gi", "gpuMilli": "500"}}], node_a)
        s2 = allocate(api, core, ns, "dra-share-2", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-5",
                                                     "shareID": "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d02",
                                                     "consumedCapacity": {"memory": "30Gi", "gpuMilli": "600"}}], node_a)
        dup = allocate(api, core, ns, "dra-dup", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-2"}], node_a)
        gone = allocate(api, core, ns, "dra-gone", [{"request": "gpu", "driver": DRIVER, "pool": node_a, "device": "gpu-9"}],
                        node_a)
        p = d.preparer
        (w,) = p.prepare(ns, whole["metadata"]["uid"], "dra-whole")
        assert (w.device, w.uuid, w.whole) == ("gpu-2", "GPU-h100-02", True)
        spec = json.loads((root / "cdi" / f"k8s.gpu.gpufleet.io-claim_{whole['metadata']['uid']}.json").read_text())
        assert "NVIDIA_VISIBLE_DEVICES=GPU-h100-02" in spec["devices"][0]["containerEdits"]["env"]
        (sh,) = p.prepare(ns, s1["metadata"]["uid"], "dra-share-1")
        if FULL:
            assert (sh.memory_bytes, sh.gpu_milli, sh.share_id) == (40 << 30, 500, "6b1a4d0e-1f2a-4c3b-8d4e-5f6a7b8c9d01")
            with pytest.raises(PrepareError, match=r"gpuMilli: 500 held \+ 600 asked > 1000"):
                p.prepare(ns, s2["metadata"]["uid"], "dra-share-2")
        else:  # 1.35 dropped shareID and consumedCapacity: two whole allocations of one GPU, the second refused
            assert (sh.whole, sh.gpu_milli, sh.share_id) == (True, 1000, "")
            with pytest.raises(PrepareError, match=f"{ns}/dra-share-1"):
                p.prepare(ns, s2["metadata"]["uid"], "dra-share-2")
        with pytest.raises(PrepareError) as e:
            p.prepare(ns, dup["metadata"]["uid"], "dra-dup")
        assert f"{ns}/dra-dup" in e.value.message and f"{ns}/dra-whole" in e.value.message
        with pytest.raises(PrepareError, match="device 'gpu-9' does not exist on node dra-it-a"):
            p.prepare(ns, gone["metadata"]["uid"], "dra-gone")
        assert wait_for(lambda: len(events_for(api, ns, "DeviceAlreadyAllocated")) >= 3, 20)  # claim + pod, x2 claims
        evs = events_for(api, ns, "DeviceAlreadyAllocated")
        regarding = {(e["regarding"]["kind"], e["regarding"]["name"]) for e in evs}
        assert {("ResourceClaim", "dra-dup"), ("Pod", "dra-dup-pod"), ("ResourceClaim", "dra-share-2")} <= regarding
        assert any(f"{ns}/dra-whole" in e["note"] for e in evs if e["regarding"]["name"] == "dra-dup")
        assert wait_for(lambda: any(e["regarding"]["name"] == "dra-gone" for e in events_for(api, ns, "DeviceNotFound")), 20)
        p.unprepare(ns, whole["metadata"]["uid"], "dra-whole")
        assert p.prepare(ns, dup["metadata"]["uid"], "dra-dup")[0].device == "gpu-2"
    finally:
        d.stop()  # the claims and pods go with the namespace


def test_the_agent_process_in_dra_mode(control_plane, api, fresh_node):
    """`gpufleet agent --dra` as a process: publishes (as the server serves: no shares on 1.35, said in its log),
    serves the plugin sockets, stops on SIGTERM (exit 0)."""
    node = fresh_node("dra-it-proc")
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
        assert all(x.get("allowMultipleAllocations", False) == FULL for x in s["spec"]["devices"] if "mig" not in x["name"])
        if not FULL:
            assert wait_for(lambda: len(node_events(api, node, "DRAFeatureNotServed")) == 2, 20)
            assert "DRAConsumableCapacity" in (d / "agent.log").read_text()
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

