"""gpufleet's scheduler allocates ResourceClaims itself, on a real kube-apiserver 1.37 with kube-controller-manager's
resourceclaim controller (claims from templates, reservations of deleted pods removed, unused claims deallocated).

The agent's DRA driver publishes a fake A100 node's slices (MIG on GPUs 0-1, PCIe roots from a fake sysfs), the shipped
DeviceClasses are applied, ``gpufleet scheduler``'s loop runs on a thread with the real client (8 bind workers).  Pods
ask for one GPU, two GPUs on one PCIe root (matchAttribute), a MIG slice, two 20 GiB shares of GPU 7 (consumable
capacity), one claim shared by two pods, ``nvidia.com/gpu: 1`` through the extended-resource DeviceClass, and an H100
no node has.  Asserted: what the apiserver stores (finalizer, status.allocation in kube-scheduler's shape, reservedFor,
allocationTimestamp; the extended-resource claim and the pod's status.extendedResourceClaimStatus) before each Binding,
no device given twice, the impossible claim's event naming its request and nothing allocated for it, every claim
prepared by the agent's kubelet plugin as kubelet would ask, a restarted scheduler holding every GPU from the claims
alone (a new pod waits), and a deleted pod's claim deallocated by the controller, released by the scheduler and its GPU
given to the waiting pod.

Release-aware (tests/dra_release.py): on 1.35 with its default gates the classes are deploy/overlays/dra-k8s-1.35's
(no share class, no extended-resource class), the agent publishes exclusive GPUs, and the shares and
``nvidia.com/gpu: 1`` are left out (what 1.35 cannot do; tests/agent/test_dra_kube_scheduler.py checks how).
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.dra.kubeapi import KubeDraApi
from gpufleet.agent.nvml import PROFILES
from gpufleet.kube.api import KubernetesApi
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.kube.runner import Runner
from gpufleet.policies import build_profile
from tests.dra_release import device_classes, full_dra

from tests.apiserver_support import assets_release
from tests.agent.test_dra_kube_scheduler import PCIE, fake_sysfs, wait_for
from .test_kube_scheduler import sa_kubeconfig

pytestmark = pytest.mark.apiserver  # needs KUBEBUILDER_ASSETS (tests/apiserver_support.py)

ROOT = Path(__file__).parents[2]
DRIVER = "gpu.gpufleet.io"
RES = "/apis/resource.k8s.io/v1"
NODE = "dra-gf-a"
NS = "dra-gf"
SCHED = "gpufleet-dra"
FINALIZER = "resource.kubernetes.io/delete-protection"
RELEASE = assets_release()
FULL = full_dra(RELEASE)  # shares and nvidia.com/gpu backed by DRA served (1.36+)


class Sched:
    def __init__(self, kubeconfig: str) -> None:
        self.api = KubernetesApi(kubeconfig, pool_size=20)
        self.loop = SchedulerLoop(self.api, build_profile("default"), scheduler_name=SCHED, bind_workers=8, event_thread=True,
                                  backoff_initial_s=0.2, backoff_max_s=2.0)
        self.runner = Runner(self.api, self.loop, watch_timeout_s=20)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.runner.run, args=(self.stop_ev,), daemon=True)
        self.thread.start()
        assert self.runner.ready.wait(30), "scheduler never synced"

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(15)


@pytest.fixture(scope="module")
def cluster(admin, control_plane, claim_controller):
    from kubernetes import client

    core = client.CoreV1Api(admin)
    api = KubeDraApi(admin, instance="gf")
    co = client.CustomObjectsApi(admin)
    made_classes: list[str] = []
    try:
        try:
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        except client.ApiException as exc:
            if exc.status != 409:  # no namespace controller here: a namespace is never really gone
                raise
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
        res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        core.patch_node_status(NODE, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test", "lastHeartbeatTime": None,
             "lastTransitionTime": None}]}})
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dragf"))
        drv, gpus = PROFILES["a100-mig"]
        d = DraDriver(api, NODE, DraOptions(sysfs_root=fake_sysfs(root / "sys")), str(root / "state"), CdiWriter(str(root / "cdi")),
                      plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"))
        d.update(gpus, drv, {g.index: True for g in gpus}, {})
        assert d.publish(force=True), d.publisher.last_error  # type: ignore[union-attr]
        for c in device_classes(RELEASE):
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", c)
            made_classes.append(c["metadata"]["name"])
        yield api, d, core
    finally:  # whatever failed on the way
        for p in core.list_namespaced_pod(NS).items:
            core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)
        for s in api.list_slices(NODE, DRIVER)[0]:
            api.delete_slice(s["metadata"]["name"])
        for n in made_classes:
            co.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", n)
        try:
            core.delete_node(NODE)
        except client.ApiException:
            pass


def template(name: str, request: dict, constraints: list | None = None) -> dict:
    spec: dict = {"devices": {"requests": [request]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": spec}}


def gpu(cls: str = "gpu.gpufleet.io", *selectors: str, **extra) -> dict:
    ex: dict = {"deviceClassName": cls, **extra}
    if selectors:
        ex["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": "gpu", "exactly": ex}


def pod(name: str, template_name: str | None = None, claim_name: str | None = None, limits: dict | None = None) -> dict:
    c: dict = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": dict(limits or {})}}
    spec: dict = {"schedulerName": SCHED, "containers": [c]}
    if template_name or claim_name:
        spec["resourceClaims"] = [{"name": "gpu", **({"resourceClaimTemplateName": template_name} if template_name
                                                      else {"resourceClaimName": claim_name})}]
        c["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def claims_of(api: KubeDraApi, p: dict) -> list[dict]:
    st = p.get("status") or {}
    names = [s["resourceClaimName"] for s in st.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]
    names += [c["resourceClaimName"] for c in p["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
    ext = (st.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return [api.get_claim(NS, n) for n in names + ([ext] if ext else [])]


def test_gpufleet_allocates_claims_on_a_real_apiserver(cluster, control_plane):
    api, d, core = cluster
    idx7 = "device.attributes['gpu.gpufleet.io'].index == 7"
    objs = [template("one-gpu", gpu()),
            template("two-gpus", {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpufleet.io", "count": 2, "selectors": [
                {"cel": {"expression": "device.attributes['gpu.gpufleet.io'].index != 7"}}]}},
                     [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
            template("mig", gpu("mig.gpufleet.io", "device.attributes['gpu.gpufleet.io'].profile == '2g.20gb'")),
            *([template("share", gpu("gpu-share.gpufleet.io", idx7, capacity={"requests": {"memory": "20Gi", "gpuMilli": "300"}}))]
              if FULL else []),
            template("h100", gpu("gpu.gpufleet.io", "device.attributes['gpu.gpufleet.io'].productName.contains('H100')"))]
    for o in objs:
        api._request("POST", f"{RES}/namespaces/{NS}/resourceclaimtemplates", o)
    api._request("POST", f"{RES}/namespaces/{NS}/resourceclaims", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                                                    "metadata": {"name": "shared-gpu"}, "spec": {"devices": {"requests": [gpu()]}}})
    pods = {"one": ("one-gpu", None), "pair": ("two-gpus", None), "mig": ("mig", None), "shared-1": (None, "shared-gpu"),
            "shared-2": (None, "shared-gpu"), "impossible": ("h100", None)}
    if FULL:
        pods.update({"share-a": ("share", None), "share-b": ("share", None), "extended": (None, None)})
    else:  # the two whole GPUs the shares and nvidia.com/gpu take on 1.36+: every GPU taken before the restart below
        pods.update({"fill-a": ("one-gpu", None), "fill-b": ("one-gpu", None)})
    s = Sched(str(control_plane.kubeconfig))
    try:
        for n, (t, c) in pods.items():
            core.create_namespaced_pod(NS, pod(n, t, c, limits={"nvidia.com/gpu": "1"} if n == "extended" else None))
        running = [n for n in pods if n != "impossible"]
        assert wait_for(lambda: all(core.read_namespaced_pod(n, NS).spec.node_name == NODE for n in running), 90), \
            {n: core.read_namespaced_pod(n, NS).spec.node_name for n in running}
        got: dict[str, list[str]] = {}
        for n in running:
            p = api._request("GET", f"/api/v1/namespaces/{NS}/pods/{n}")
            (c,) = claims_of(api, p)
            assert FINALIZER in c["metadata"]["finalizers"], c["metadata"]
            alloc = c["status"]["allocation"]
            assert alloc.get("allocationTimestamp") and alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [NODE]
            assert p["metadata"]["uid"] in [r["uid"] for r in c["status"]["reservedFor"]]
            assert all((r["driver"], r["pool"]) == (DRIVER, NODE) for r in alloc["devices"]["results"])
            got[n] = [r["device"] for r in alloc["devices"]["results"]]
        assert len(got["pair"]) == 2 and len({PCIE[int(x.split("-")[1])] for x in got["pair"]}) == 1, got
        assert got["shared-1"] == got["shared-2"], got
        assert got["mig"][0].startswith("gpu-") and "-mig-2g20gb-" in got["mig"][0]
        if FULL:
            assert got["share-a"] == got["share-b"] == ["gpu-7"], got
            ext = api._request("GET", f"/api/v1/namespaces/{NS}/pods/extended")["status"]["extendedResourceClaimStatus"]
            assert ext["requestMappings"] == [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-2"}]
            ec = api.get_claim(NS, ext["resourceClaimName"])
            assert ec["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        exclusive = got["one"] + got["pair"] + got["mig"] + got["shared-1"] + got.get("extended", []) + \
            got.get("fill-a", []) + got.get("fill-b", [])
        assert len(set(exclusive)) == len(exclusive), got  # no device given twice
        assert ("gpu-7" not in exclusive) == FULL, got  # on 1.36+ GPU 7 is the shares
        imp = core.read_namespaced_pod("impossible", NS)
        assert imp.spec.node_name is None
        (ic,) = claims_of(api, api._request("GET", f"/api/v1/namespaces/{NS}/pods/impossible"))
        assert (ic.get("status") or {}).get("allocation") is None

        assert wait_for(lambda: "request gpu: no device of class gpu.gpufleet.io matches its selectors" in events_of(api, "impossible"), 30), \
            events_of(api, "impossible")

        # what gpufleet wrote, prepared by the agent's kubelet plugin as kubelet asks it to
        for n in running:
            for c in claims_of(api, api._request("GET", f"/api/v1/namespaces/{NS}/pods/{n}")):
                prepared = d.preparer.prepare(NS, c["metadata"]["uid"], c["metadata"]["name"])
                assert prepared, n
    finally:
        s.stop()

    # a restarted scheduler sees the same devices taken, from the claims alone: every whole GPU is held now
    core.create_namespaced_pod(NS, pod("after-restart", "one-gpu"))
    s2 = Sched(str(control_plane.kubeconfig))
    try:
        assert wait_for(lambda: "fewer than 1 free device(s) of class gpu.gpufleet.io" in events_of(api, "after-restart"), 60), \
            events_of(api, "after-restart")
        assert core.read_namespaced_pod("after-restart", NS).spec.node_name is None
        # a pod goes: the controller takes it out of reservedFor and deallocates; the scheduler releases the hold and
        # the waiting pod gets that GPU
        (oc,) = claims_of(api, api._request("GET", f"/api/v1/namespaces/{NS}/pods/one"))
        key = f"{NS}/{oc['metadata']['name']}"
        assert key in s2.loop.cache.state.claim_holds
        core.delete_namespaced_pod("one", NS, grace_period_seconds=0)
        assert wait_for(lambda: core.read_namespaced_pod("after-restart", NS).spec.node_name == NODE, 60)
        assert key not in s2.loop.cache.state.claim_holds
        (c,) = claims_of(api, api._request("GET", f"/api/v1/namespaces/{NS}/pods/after-restart"))
        assert [r["device"] for r in c["status"]["allocation"]["devices"]["results"]] == got["one"]
    finally:
        s2.stop()


def events_of(api: KubeDraApi, name: str) -> str:
    evs = api._request("GET", f"/apis/events.k8s.io/v1/namespaces/{NS}/events")["items"]
    return " | ".join(e.get("note", "") for e in evs if (e.get("regarding") or {}).get("name") == name)


def test_the_manifests_least_privilege_rbac_is_enough_for_dra(cluster, control_plane, admin):
    """The scheduler as deploy/scheduler's ServiceAccount with only its RBAC: a claim from a template and nvidia.com/gpu
    through the extended-resource class are allocated, reserved and bound (resourceclaims/status and the
    resourceclaims/binding check, claim create, pods/status)."""
    api, d, core = cluster
    for p in core.list_namespaced_pod(NS).items:
        core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)
    path = sa_kubeconfig(control_plane, admin, "deploy/scheduler/scheduler.yaml", "gpufleet-scheduler", NS)
    assert wait_for(lambda: not [c for c in api._request("GET", f"{RES}/namespaces/{NS}/resourceclaims")["items"]
                                 if (c.get("status") or {}).get("allocation") and c["metadata"]["name"] != "shared-gpu"], 60)
    names = ["rbac-one"] + (["rbac-ext"] if FULL else [])  # nvidia.com/gpu backed by DRA: 1.36+
    core.create_namespaced_pod(NS, pod("rbac-one", "one-gpu"))
    if FULL:
        core.create_namespaced_pod(NS, pod("rbac-ext", limits={"nvidia.com/gpu": "1"}))
    s = Sched(path)
    try:
        assert wait_for(lambda: all(core.read_namespaced_pod(n, NS).spec.node_name == NODE for n in names), 60), \
            " | ".join(events_of(api, n) for n in names)
        for n in names:
            (c,) = claims_of(api, api._request("GET", f"/api/v1/namespaces/{NS}/pods/{n}"))
            assert c["status"]["allocation"] and c["status"]["reservedFor"][0]["name"] == n
        assert not s.loop.cache.dra.cache.unserved  # type: ignore[union-attr]
    finally:
        s.stop()
