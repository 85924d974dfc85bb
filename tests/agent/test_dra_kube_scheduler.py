"""The agent's ResourceSlices are standard: the stock kube-scheduler allocates claims from them, and the agent's
kubelet plugin prepares what kube-scheduler allocated.

No kubelet here (the apiserver tier): the agent's DRA driver publishes a fake A100 node's slices (MIG, PCIe roots
from a fake sysfs), the shipped DeviceClasses are applied, kube-scheduler (its own process, its own profile name)
allocates and binds pods whose claims ask for one GPU, two GPUs on one PCIe root (matchAttribute), a MIG slice, the
first available of an H100 or a MIG slice (prioritized list), a GPU another claim holds with admin access, two 20 GiB
shares of one GPU (consumable capacity) and ``nvidia.com/gpu: 1`` (extended resource backed by DRA); a third share
that no longer fits and a claim no device meets stay unscheduled.  The claims kube-scheduler wrote are then prepared
the way kubelet asks the plugin to, and an allocation another allocator wrote for a GPU kube-scheduler already gave
away is refused.

Release-aware (tests/dra_release.py).  On 1.36+ every kind above.  On 1.35 with its default gates, what a user of
deploy/overlays/dra-k8s-1.35 gets: whole GPUs, MIG, matchAttribute, prioritized lists and admin access work; the agent
publishes no shares, a claim written as a share (capacity.requests, dropped by the server) gets a whole GPU, and
``nvidia.com/gpu`` pods stay Pending (no class maps it).  And on 1.35 once more with the alpha gates docs/dra.md names
turned on in kube-apiserver and kube-scheduler (a control plane of its own): everything, as on 1.36+.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.dra.features import Served
from gpufleet.agent.dra.kubeapi import KubeDraApi
from gpufleet.agent.dra.prepare import PrepareError
from gpufleet.agent.nvml import PROFILES
from tests.dra_release import device_classes, full_dra

from tests.apiserver_support import ASSETS, HAVE_ASSETS, ControlPlane, assets_release, stop_process

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"
NODE = "dra-ks-a"
PROFILE = "dra-kube-scheduler"  # kube-scheduler's profile: only this test's pods
NS = "default"
PCIE = {2: "pci0000:00", 3: "pci0000:00", 4: "pci0000:00", 5: "pci0000:80", 6: "pci0000:80", 7: "pci0000:80",
        0: "pci0000:00", 1: "pci0000:80"}
RELEASE = assets_release()
# what 1.35 keeps behind alpha gates (off), turned on in kube-apiserver and kube-scheduler (docs/dra.md)
ALPHA_GATES_135 = "--feature-gates=DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true"
VARIANTS = ["default gates"] + (["1.35 alpha gates on"] if HAVE_ASSETS and not full_dra(RELEASE) else [])


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


def start_kube_scheduler(kubeconfig: Path, d: Path, gates: tuple[str, ...]) -> subprocess.Popen:
    cfg = d / "kube-scheduler.yaml"
    cfg.write_text(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}"}}
leaderElection: {{leaderElect: false}}
profiles:
- schedulerName: {PROFILE}
""")
    with open(d / "kube-scheduler.log", "wb") as log:
        return subprocess.Popen([str(Path(ASSETS) / "kube-scheduler"), f"--config={cfg}", f"--secure-port={_free_port()}",
                                 "--bind-address=127.0.0.1", f"--authentication-kubeconfig={kubeconfig}",
                                 f"--authorization-kubeconfig={kubeconfig}", *gates, "-v=2"],
                                stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    stop_process(proc, 10)


@dataclass
class Published:
    api: KubeDraApi
    driver: DraDriver
    core: object
    full: bool  # consumable capacity, device taints and extended resources served
    admin_ns: str  # a namespace labelled for admin access


@pytest.fixture(scope="module", params=VARIANTS)
def published(request, control_plane):
    """kube-scheduler, the node, its slices (published by the agent's driver) and the shipped DeviceClasses of the
    release; everything made is removed at teardown, whatever failed on the way."""
    from kubernetes import client, config

    if not (Path(ASSETS) / "kube-scheduler").is_file():
        pytest.skip("no kube-scheduler in KUBEBUILDER_ASSETS")
    gated = request.param != "default gates"
    d = Path(tempfile.mkdtemp(prefix="dra-ks-"))
    undo: list = []
    try:
        if gated:  # a control plane of its own: the session's runs with the release's default gates
            cp = ControlPlane(ASSETS, d, extra_args=(ALPHA_GATES_135,))
            undo.append(cp.stop)
            cp.start()
        else:
            cp = control_plane
        proc = start_kube_scheduler(cp.kubeconfig, d, (ALPHA_GATES_135,) if gated else ())
        undo.append(lambda: stop(proc))
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        admin = client.ApiClient(cfg)
        core = client.CoreV1Api(admin)
        api = KubeDraApi(admin, instance="it")
        full = gated or full_dra(RELEASE)
        undo.append(lambda: _remove_everything(api, core))
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
        res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        core.patch_node_status(NODE, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test", "lastHeartbeatTime": None,
             "lastTransitionTime": None}]}})
        admin_ns = f"dra-admin-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": admin_ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix="drak"))
        undo.append(lambda: shutil.rmtree(root, ignore_errors=True))
        drv, gpus = PROFILES["a100-mig"]
        dd = DraDriver(api, NODE, DraOptions(sysfs_root=fake_sysfs(root / "sys")), str(root / "state"), CdiWriter(str(root / "cdi")),
                       plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"))
        dd.update(gpus, drv, {g.index: True for g in gpus}, {})
        assert dd.publish(force=True), dd.publisher.last_error  # type: ignore[union-attr]
        assert dd.served == (Served() if full else Served(False, False))
        co = client.CustomObjectsApi(admin)
        classes = device_classes((1, 36) if gated else RELEASE)
        for c in classes:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c)
            undo.append(lambda n=c["metadata"]["name"]: co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", n))
        yield Published(api, dd, core, full, admin_ns)
    finally:
        for f in reversed(undo):
            try:
                f()
            except Exception as exc:  # keep undoing the rest
                print(f"teardown: {exc}")
        shutil.rmtree(d, ignore_errors=True)


def _remove_everything(api: KubeDraApi, core) -> None:
    """This module's pods, claims, slices and node; each step on its own, so one that fails leaves the rest done."""
    def attempt(what: str, f) -> None:
        for i in range(5):  # a claim kube-scheduler is still writing: read it again
            try:
                f()
                return
            except Exception as exc:  # noqa: BLE001 -- keep undoing the rest
                if "NotFound" in type(exc).__name__ or "404" in str(exc)[:4] or i == 4:
                    print(f"teardown, {what}: {exc}")
                    return
                time.sleep(0.2)

    for p in core.list_pod_for_all_namespaces().items:
        if p.spec.scheduler_name == PROFILE:
            attempt(f"pod {p.metadata.name}", lambda p=p: core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace,
                                                                                     grace_period_seconds=0))
    for c in api._request("GET", f"{RES}/resourceclaims")["items"]:
        ns, name = c["metadata"]["namespace"], c["metadata"]["name"]
        if not (name.startswith("ks-") or ns.startswith("dra-admin-")):
            continue

        def unprotect(ns=ns, name=name) -> None:  # kube-scheduler's delete-protection; no resourceclaim controller here
            cur = api._request("GET", f"{RES}/namespaces/{ns}/resourceclaims/{name}")
            if cur["metadata"].get("finalizers"):
                cur["metadata"]["finalizers"] = []
                api._request("PUT", f"{RES}/namespaces/{ns}/resourceclaims/{name}", cur)
        attempt(f"claim {ns}/{name} finalizers", unprotect)
        attempt(f"claim {ns}/{name}", lambda ns=ns, name=name: api._request("DELETE", f"{RES}/namespaces/{ns}/resourceclaims/{name}"))
    for sl in api.list_slices(NODE, DRIVER)[0]:
        attempt(f"slice {sl['metadata']['name']}", lambda sl=sl: api.delete_slice(sl["metadata"]["name"]))
    attempt(f"node {NODE}", lambda: core.delete_node(NODE))


def claim(name: str, request: dict, constraints=None, ns: str = NS) -> dict:
    spec: dict = {"devices": {"requests": [request]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def pod(name: str, claim_name: str | None = None, limits: dict | None = None, ns: str = NS) -> dict:
    c: dict = {"name": "c", "image": "busybox", "resources": {"limits": dict(limits or {})}}
    spec: dict = {"schedulerName": PROFILE, "nodeSelector": {"kubernetes.io/hostname": NODE}, "containers": [c]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        c["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def gpu(cls="gpu.gpufleet.io", **extra) -> dict:
    return {"name": "gpu", "exactly": {"deviceClassName": cls, **extra}}


def idx(expr: str) -> list:
    return [{"cel": {"expression": expr}}]


def test_kube_scheduler_allocates_from_the_agents_slices_and_the_plugin_prepares_it(published):
    api, d, core, full = published.api, published.driver, published.core, published.full
    seven = idx("device.attributes['gpu.gpufleet.io'].index == 7")
    share = {"capacity": {"requests": {"memory": "20Gi", "gpuMilli": "300"}}, "selectors": seven}
    # the first available: no H100 here, so a 1g.10gb MIG slice (results name "gpu/mig")
    first = {"name": "gpu", "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu.gpufleet.io",
         "selectors": idx("device.attributes['gpu.gpufleet.io'].productName.contains('H100')")},
        {"name": "mig", "deviceClassName": "mig.gpufleet.io", "selectors": idx("device.attributes['gpu.gpufleet.io'].profile == '1g.10gb'")}]}
    claims = [claim("ks-whole", gpu()),
              claim("ks-pair", {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpufleet.io", "count": 2,
                                                            "selectors": idx("device.attributes['gpu.gpufleet.io'].index != 7")}},
                    [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
              claim("ks-mig", gpu("mig.gpufleet.io", selectors=idx("device.attributes['gpu.gpufleet.io'].profile == '2g.20gb'"))),
              claim("ks-first", first),
              claim("ks-h100", gpu(selectors=idx("device.attributes['gpu.gpufleet.io'].productName.contains('H100')")))]
    if full:
        claims += [claim("ks-share-a", gpu("gpu-share.gpufleet.io", **share)),
                   claim("ks-share-b", gpu("gpu-share.gpufleet.io", **share)),
                   claim("ks-share-big", gpu("gpu-share.gpufleet.io", capacity={"requests": {"memory": "50Gi"}}, selectors=seven))]
    else:  # a share written for 1.36+ against the whole-GPU class: the server drops capacity.requests
        claims += [claim("ks-share-a", gpu(**share))]
    for c in claims:
        api._request("POST", f"{RES}/namespaces/{NS}/resourceclaims", c)
    placed = ["whole", "pair", "mig", "first", "share-a"] + (["share-b"] if full else [])
    for name in placed:
        core.create_namespaced_pod(NS, pod(f"ks-{name}", f"ks-{name}"))
    assert wait_for(lambda: all(core.read_namespaced_pod(f"ks-{n}", NS).spec.node_name == NODE for n in placed), 90), \
        [(n, core.read_namespaced_pod(f"ks-{n}", NS).status.conditions) for n in placed]
    core.create_namespaced_pod(NS, pod("ks-extended", limits={"nvidia.com/gpu": "1"}))
    if full:
        core.create_namespaced_pod(NS, pod("ks-share-big", "ks-share-big"))
    core.create_namespaced_pod(NS, pod("ks-h100", "ks-h100"))
    if full:
        assert wait_for(lambda: core.read_namespaced_pod("ks-extended", NS).spec.node_name == NODE, 90)

    def results(cn: str, ns: str = NS) -> list[dict]:
        c = api.get_claim(ns, cn)
        return c["status"]["allocation"]["devices"]["results"]

    got = {n: [r["device"] for r in results(f"ks-{n}")] for n in placed}
    assert len(got["pair"]) == 2 and len({PCIE[int(x.split("-")[1])] for x in got["pair"]}) == 1, got
    assert got["mig"][0].startswith("gpu-1-mig-2g20gb-"), got
    (fr,) = results("ks-first")
    assert fr["request"] == "gpu/mig" and fr["device"].startswith("gpu-0-mig-1g10gb-"), fr
    whole = set(got["whole"] + got["pair"])
    assert len(whole) == 3 and "gpu-7" not in whole and not any("mig" in x for x in whole)
    sa = results("ks-share-a")[0]
    assert got["share-a"] == ["gpu-7"]
    if full:
        assert got["share-b"] == ["gpu-7"], got
        assert sa["consumedCapacity"]["memory"] in ("20Gi", str(20 << 30)) and sa.get("shareID")
        ext = core.read_namespaced_pod("ks-extended", NS)
        ext_claim = api._request("GET", f"/api/v1/namespaces/{NS}/pods/ks-extended")["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        (ext_res,) = results(ext_claim)
        assert ext_res["device"] not in whole | {"gpu-7"} and not ext_res["device"].count("mig"), ext_res
        assert ext.spec.node_name == NODE
    else:  # the "share" is a whole GPU: nothing consumed, no shareID, the device exclusive
        assert "consumedCapacity" not in sa and not sa.get("shareID"), sa
        assert api.get_claim(NS, "ks-share-a")["spec"]["devices"]["requests"][0]["exactly"].get("capacity") is None
    time.sleep(3)  # kube-scheduler had its chance: these stay unscheduled
    waiting = ["ks-h100"] + (["ks-share-big"] if full else ["ks-extended"])
    for n in waiting:
        p = core.read_namespaced_pod(n, NS)
        assert p.spec.node_name is None, n
        cond = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
        assert cond and cond[0].status == "False" and cond[0].reason == "Unschedulable", (n, cond)
        if n == "ks-extended":  # no class maps nvidia.com/gpu on 1.35 (and no device plugin): not a DRA pod at all
            assert "Insufficient nvidia.com/gpu" in cond[0].message, cond

    # admin access (monitoring): the MIG instance ks-mig holds, in a namespace labelled for it. (Not a whole GPU: with
    # shares published, kube-scheduler charges an admin request capacity like any share, and ks-whole took all of it.)
    ans = published.admin_ns
    uuid_of = {x["name"]: x["attributes"]["uuid"]["string"] for sl in api.list_slices(NODE, DRIVER)[0] for x in sl["spec"]["devices"]}
    api._request("POST", f"{RES}/namespaces/{ans}/resourceclaims", claim("ks-admin", gpu(
        "mig.gpufleet.io", adminAccess=True, selectors=idx(f"device.attributes['gpu.gpufleet.io'].uuid == '{uuid_of[got['mig'][0]]}'")),
        ns=ans))
    core.create_namespaced_pod(ans, pod("ks-admin", "ks-admin", ns=ans))
    assert wait_for(lambda: core.read_namespaced_pod("ks-admin", ans).spec.node_name == NODE, 60), \
        [c.message for c in core.read_namespaced_pod("ks-admin", ans).status.conditions]
    (adm,) = results("ks-admin", ans)
    assert adm["device"] == got["mig"][0] and adm.get("adminAccess") is True, adm

    # what kube-scheduler wrote, prepared as kubelet would ask the plugin to
    p = d.preparer
    prepared = {}
    names = [f"ks-{n}" for n in placed] + ([ext_claim] if full else [])
    for cn in names:
        c = api.get_claim(NS, cn)
        prepared[cn] = p.prepare(NS, c["metadata"]["uid"], cn)
    c = api.get_claim(ans, "ks-admin")
    (pa,) = p.prepare(ans, c["metadata"]["uid"], "ks-admin")  # beside ks-mig's holder: admin access overlaps
    assert pa.admin and pa.device == got["mig"][0]
    assert prepared["ks-first"][0].request == "gpu"  # what the container's resources.claims names
    a = prepared["ks-share-a"][0]
    if full:
        b = prepared["ks-share-b"][0]
        assert (a.whole, a.memory_bytes, a.gpu_milli) == (False, 20 << 30, 300) and a.share_id and a.share_id != b.share_id
        spec = json.loads(p.cdi.path(api.get_claim(NS, "ks-share-a")["metadata"]["uid"]).read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-07" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    else:
        assert (a.whole, a.gpu_milli) == (True, 1000)
    assert all(x.whole for cn in ("ks-whole", "ks-pair", *([ext_claim] if full else [])) for x in prepared[cn])

    # another allocator hands the GPU kube-scheduler gave ks-whole to a second claim: the plugin refuses it
    stolen = api._request("POST", f"{RES}/namespaces/{NS}/resourceclaims", claim("ks-stolen", gpu()))
    stolen["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                                 "device": got["whole"][0]}]}}}
    stolen = api._request("PUT", f"{RES}/namespaces/{NS}/resourceclaims/ks-stolen/status", stolen)
    with pytest.raises(PrepareError) as e:
        p.prepare(NS, stolen["metadata"]["uid"], "ks-stolen")
    assert "default/ks-stolen" in e.value.message and "default/ks-whole" in e.value.message
