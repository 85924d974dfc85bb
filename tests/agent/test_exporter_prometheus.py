"""The exporter against the fake NVML backend and a fake kubelet PodResources server over a real unix socket.

Exposition is parsed back with prometheus_client's own parser, so names,
labels and values are checked as Prometheus would read them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.exporter import (
    ALL_METRICS,
    LABELS,
    CgroupResolver,
    ContainerRef,
    GpuCollector,
    KubeletPodResources,
    apply_assignments,
    parse_cgroup,
    pod_index_from_json,
)
from gpufleet.agent.nvml import FakeBackend, ProcessUsage
from gpufleet.agent.podresources import podresources_pb2 as pb
from gpufleet.agent.podresources import podresources_pb2_grpc as pbg

DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS")

# kubelet's view of the t4 node (4 GPUs):
#  GPU 0: ml/train alone; GPU 1: time-sliced by ml/a and web/b (replica IDs <uuid>::k);
#  GPU 2: two gpufleet shares; kubelet recorded GPU 3 for web/share-y, its assignment says GPU 2;
#  GPU 3: nobody (after the assignment is applied); plus a CPU device that must be ignored.
PODS = [
    ("ml", "train", [("main", "nvidia.com/gpu", ["GPU-t4-00"]), ("sidecar", "example.com/fpga", ["fpga0"])]),
    ("ml", "a", [("worker", "nvidia.com/gpu", ["GPU-t4-01::0"])]),
    ("web", "b", [("infer", "nvidia.com/gpu", ["GPU-t4-01::1"])]),
    ("web", "share-x", [("srv", "nvidia.com/gpu", ["GPU-t4-02::0"])]),
    ("web", "share-y", [("srv", "nvidia.com/gpu", ["GPU-t4-03::0"])]),
]
ASSIGNED = {("web", "share-x"): ["GPU-t4-02"], ("web", "share-y"): ["GPU-t4-02"]}


class FakePodResources(pbg.PodResourcesListerServicer):
    def __init__(self, pods):
        self.pods = pods
        self.calls = 0

    def List(self, request, context):  # noqa: N802
        self.calls += 1
        out = []
        for ns, name, containers in self.pods:
            out.append(pb.PodResources(namespace=ns, name=name, containers=[
                pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)]) for c, r, ids in containers]))
        return pb.ListPodResourcesResponse(pod_resources=out)


class Kubelet:
    def __init__(self, pods):
        self.dir = tempfile.mkdtemp(dir="/tmp", prefix="pr")
        self.sock = os.path.join(self.dir, "kubelet.sock")
        self.svc = FakePodResources(pods)
        self.srv = None

    def start(self):
        self.srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pbg.add_PodResourcesListerServicer_to_server(self.svc, self.srv)
        self.srv.add_insecure_port(f"unix://{self.sock}")
        self.srv.start()

    def stop(self):
        self.srv.stop(0).wait()
        if os.path.exists(self.sock):
            os.unlink(self.sock)


@pytest.fixture
def kubelet():
    k = Kubelet(PODS)
    k.start()
    yield k
    k.srv.stop(0).wait()
    shutil.rmtree(k.dir, ignore_errors=True)


# cgroup files as containerd writes them: v2 + systemd driver, and v1 + cgroupfs driver
CID = {name: f"{i:x}" * 64 for i, name in enumerate(["train", "a", "b", "x", "y", "stray"], start=1)}
UID = {name: f"0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i, name in enumerate(["train", "a", "b", "x", "y", "stray"], start=1)}


def cgroup_v2(pod, qos="burstable"):
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{UID[pod].replace('-', '_')}.slice/cri-containerd-{CID[pod]}.scope\n"


def cgroup_v1(pod):
    return "".join(f"{i}:{c}:/kubepods/besteffort/pod{UID[pod]}/{CID[pod]}\n" for i, c in enumerate(["cpu,cpuacct", "memory", "pids"], 1))


@pytest.fixture
def proc(tmp_path):
    files = {100: cgroup_v2("train"), 200: cgroup_v2("a"), 201: cgroup_v1("a"), 300: cgroup_v1("b"),
             400: cgroup_v2("x", "besteffort"), 500: cgroup_v2("y"), 600: cgroup_v2("stray"), 700: "0::/system.slice/sshd.service\n"}
    for pid, text in files.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def pod_json(ns, name, key, container):
    return {"metadata": {"namespace": ns, "name": name, "uid": UID[key]},
            "status": {"containerStatuses": [{"name": container, "containerID": f"containerd://{CID[key]}"}]}}


INDEX = [pod_json("ml", "train", "train", "main"), pod_json("ml", "a", "a", "worker"), pod_json("web", "b", "b", "infer"),
         pod_json("web", "share-x", "x", "srv"), pod_json("web", "share-y", "y", "srv")]


def scrape(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}


def by(fams, metric, *keys):
    return {tuple(s.labels[k] for k in keys): s.value for s in fams[metric].samples}


def backend():
    be = FakeBackend("t4")
    be.set_processes([
        ProcessUsage(100, 0, 9000, 80),  # ml/train
        ProcessUsage(200, 1, 3000, 50), ProcessUsage(201, 1, 500, 5),  # ml/a: two processes
        ProcessUsage(300, 1, 1000, 10),  # web/b
        ProcessUsage(400, 2, 2000, 30), ProcessUsage(500, 2, 4000, 20),  # the two shares
        ProcessUsage(600, 2, 700, 15),  # a process of a pod kubelet does not list for this GPU
        ProcessUsage(700, 1, 100, 0),  # not a container at all
    ])
    return be


def test_names_labels_and_per_pod_attribution_on_shared_gpus(kubelet, proc):
    calls = []
    resolver = CgroupResolver(lambda: calls.append(1) or pod_index_from_json(INDEX), proc_root=proc)
    col = GpuCollector(backend(), "node-1", KubeletPodResources(kubelet.sock), resolver, assignments=lambda: ASSIGNED)
    fams = scrape(col)
    for name in DCGM:
        assert name in fams, name
        for s in fams[name].samples:
            assert list(s.labels) == LABELS or set(s.labels) == set(LABELS)
    fb = by(fams, "DCGM_FI_DEV_FB_USED", "gpu", "namespace", "pod", "container")
    util = by(fams, "DCGM_FI_DEV_GPU_UTIL", "gpu", "namespace", "pod", "container")
    # exclusive GPU: the device's numbers with the pod's labels, like dcgm-exporter
    assert fb[("0", "ml", "train", "main")] == 9000 and util[("0", "ml", "train", "main")] == 80
    # time-sliced GPU: each sharer its own processes (cgroup v1 and v2 both resolved); the rest unattributed
    assert fb[("1", "ml", "a", "worker")] == 3500 and util[("1", "ml", "a", "worker")] == 55
    assert fb[("1", "web", "b", "infer")] == 1000 and util[("1", "web", "b", "infer")] == 10
    assert fb[("1", "", "", "")] == 100  # the non-container process
    # gpufleet shares: the assignment moved web/share-y from GPU 3 (kubelet's record) to GPU 2
    assert fb[("2", "web", "share-x", "srv")] == 2000 and fb[("2", "web", "share-y", "srv")] == 4000
    assert util[("2", "web", "share-x", "srv")] == 30 and util[("2", "web", "share-y", "srv")] == 20
    assert fb[("2", "", "", "")] == 700 and util[("2", "", "", "")] == 15  # the stray process is nobody's share
    # per-GPU sums equal the device numbers
    dev = {g: backend().telemetry(g) for g in range(4)}
    for g in ("1", "2"):
        assert sum(v for k, v in fb.items() if k[0] == g) == dev[int(g)].fb_used_mib
    # device-wide metrics once per GPU; GPU 3 is idle and unattributed now
    temps = by(fams, "DCGM_FI_DEV_GPU_TEMP", "gpu", "pod")
    assert sorted(temps) == [("0", "train"), ("1", ""), ("2", ""), ("3", "")]
    s = next(x for x in fams["DCGM_FI_DEV_FB_USED"].samples if x.labels["pod"] == "train")
    assert s.labels["UUID"] == "GPU-t4-00" and s.labels["device"] == "nvidia0" and s.labels["modelName"] == "Tesla T4"
    assert s.labels["Hostname"] == "node-1"
    assert fams["gpufleet_exporter_podresources_up"].samples[0].value == 1
    assert len(calls) == 1  # the pod index is read once per TTL, not per process


def test_exclusive_gpus_do_not_read_processes(kubelet):
    class Counting(FakeBackend):
        proc_calls = 0

        def processes(self):
            Counting.proc_calls += 1
            return super().processes()

    k2 = Kubelet([("ml", "train", [("main", "nvidia.com/gpu", ["GPU-t4-00"])])])
    k2.start()
    try:
        fams = scrape(GpuCollector(Counting("t4"), "n", KubeletPodResources(k2.sock)))
        assert Counting.proc_calls == 0 and ("0", "train") in by(fams, "DCGM_FI_DEV_GPU_UTIL", "gpu", "pod")
    finally:
        k2.srv.stop(0).wait()
        shutil.rmtree(k2.dir, ignore_errors=True)


def test_xid_and_health():
    be = FakeBackend("t4")
    be.inject_xid(2, 79, 0.0, device_broken=True)
    col = GpuCollector(be, "n")
    col.note_xids(be.poll_xids())
    fams = scrape(col)
    assert by(fams, "DCGM_FI_DEV_XID_ERRORS", "gpu")[("2",)] == 79 and by(fams, "DCGM_FI_DEV_XID_ERRORS", "gpu")[("0",)] == 0
    assert by(fams, "gpufleet_gpu_healthy", "gpu") == {("0",): 1, ("1",): 1, ("2",): 0, ("3",): 1}
    # an explicit health source (the agent's tracker) wins over NVML's device check
    fams = scrape(GpuCollector(be, "n", health=lambda: {0: False}))
    assert by(fams, "gpufleet_gpu_healthy", "gpu")[("0",)] == 0 and by(fams, "gpufleet_gpu_healthy", "gpu")[("2",)] == 1


def test_kubelet_down_then_back(kubelet):
    pr = KubeletPodResources(kubelet.sock, timeout_s=0.5)
    col = GpuCollector(FakeBackend("t4"), "n", pr)
    assert ("0", "train") in by(scrape(col), "DCGM_FI_DEV_GPU_TEMP", "gpu", "pod")
    kubelet.stop()  # kubelet restarts: its socket goes away
    fams = scrape(col)
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 4 and fams["gpufleet_exporter_podresources_up"].samples[0].value == 0
    assert ("0", "") in by(fams, "DCGM_FI_DEV_GPU_TEMP", "gpu", "pod")
    kubelet.start()  # a new socket at the same path: the exporter reconnects
    fams = scrape(col)
    assert ("0", "train") in by(fams, "DCGM_FI_DEV_GPU_TEMP", "gpu", "pod")
    assert fams["gpufleet_exporter_podresources_up"].samples[0].value == 1


def test_mig_instances_attributed_to_their_gpu():
    k = Kubelet([("ml", "m0", [("c", "nvidia.com/mig-1g.10gb", ["MIG-a100-0-0"])]),
                 ("ml", "m1", [("c", "nvidia.com/mig-1g.10gb", ["MIG-a100-0-1"])]),
                 ("ml", "whole", [("c", "nvidia.com/gpu", ["GPU-a100-05"])])])
    k.start()
    try:
        be = FakeBackend("a100-mig")
        be.set_processes([ProcessUsage(1, 0, 5000, 40), ProcessUsage(2, 0, 3000, 10)])
        who = {1: ContainerRef("ml", "m0", "c"), 2: ContainerRef("ml", "m1", "")}  # container unknown: matched on the pod
        fams = scrape(GpuCollector(be, "n", KubeletPodResources(k.sock), who.get))
        fb = by(fams, "DCGM_FI_DEV_FB_USED", "gpu", "pod")
        assert fb[("0", "m0")] == 5000 and fb[("0", "m1")] == 3000 and ("5", "whole") in fb
    finally:
        k.srv.stop(0).wait()
        shutil.rmtree(k.dir, ignore_errors=True)


def test_parse_cgroup_and_index():
    assert parse_cgroup(cgroup_v2("a")) == (UID["a"], CID["a"])
    assert parse_cgroup(cgroup_v1("b")) == (UID["b"], CID["b"])
    crio = f"0::/kubepods.slice/kubepods-pod{UID['x'].replace('-', '_')}.slice/crio-{CID['x']}.scope"
    assert parse_cgroup(crio) == (UID["x"], CID["x"])
    assert parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n") is None
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-pod{UID['x'].replace('-', '_')}.slice\n") is None  # the pod's own cgroup
    idx = pod_index_from_json(INDEX + [{"metadata": {"name": "no-uid"}}])
    assert idx[UID["a"]].name == "a" and idx[UID["a"]].containers == {CID["a"]: "worker"} and len(idx) == 5


def test_resolver_unknown_pod_and_missing_pid(proc):
    calls = []
    r = CgroupResolver(lambda: calls.append(1) or {}, proc_root=proc, clock=lambda: 100.0)
    assert r(123456) is None  # no such process
    assert r(700) is None  # not in a pod
    assert r(100) is None and len(calls) == 1  # unknown pod: one forced re-read is rate-limited
    assert r(200) is None and len(calls) == 1


def test_apply_assignments():
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    assert apply_assignments({"G1": [a], "G2": [b]}, {("ns", "b"): ["G1"]}) == {"G1": [a, b]}
    assert apply_assignments({"G1": [a]}, {}) == {"G1": [a]}


def test_exposition_parses_and_lists_all_metrics(kubelet):
    text = generate_latest(_reg(GpuCollector(FakeBackend("h100-nvlink"), "n", KubeletPodResources(kubelet.sock)))).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert set(ALL_METRICS) <= names
    json.dumps(sorted(names))


def _reg(c):
    reg = CollectorRegistry()
    reg.register(c)
    return reg


class DraPodResources(pbg.PodResourcesListerServicer):
    """kubelet's List for pods whose GPUs came from DRA claims: dynamic_resources, no device IDs."""

    def List(self, request, context):  # noqa: N802
        def claim_res(dev, share=None):
            r = pb.ClaimResource(driver_name="gpu.gpufleet.io", pool_name="n", device_name=dev,
                                 cdi_devices=[pb.CDIDevice(name=f"k8s.gpu.gpufleet.io/claim=u-{dev}")])
            if share:
                r.share_id = share
            return r

        pods = [("ml", "whole", "gpu-1", None), ("ml", "s1", "gpu-2", "a"), ("ml", "s2", "gpu-2", "b"),
                ("ml", "other-driver", "nic-0", None)]
        out = []
        for ns, name, dev, share in pods:
            res = claim_res(dev, share)
            if name == "other-driver":
                res.driver_name = "nic.example.com"
            out.append(pb.PodResources(namespace=ns, name=name, containers=[pb.ContainerResources(
                name="c", dynamic_resources=[pb.DynamicResource(claim_name=f"{name}-gpu", claim_namespace=ns,
                                                                claim_resources=[res])])]))
        return pb.ListPodResourcesResponse(pod_resources=out)


def test_dra_claims_devices_are_attributed_through_the_drivers_device_map():
    k = Kubelet([])
    k.svc = DraPodResources()
    k.start()
    try:
        uuids = {("gpu.gpufleet.io", "n", f"gpu-{i}"): f"GPU-t4-{i:02d}" for i in range(4)}
        pr = KubeletPodResources(k.sock, timeout_s=10, dra_uuid=lambda d, p, n: uuids.get((d, p, n)))  # a busy CI box
        holders = pr.devices()
        assert {u: sorted(r.pod for r in refs) for u, refs in holders.items()} == {"GPU-t4-01": ["whole"], "GPU-t4-02": ["s1", "s2"]}
        assert KubeletPodResources(k.sock, timeout_s=10).devices() == {}  # a device-plugin agent does not read claims
        fams = scrape(GpuCollector(FakeBackend("t4"), "n", pr))
        # the exclusive claim's GPU carries its pod; the shared one's device-wide series stay unattributed, as for shares
        assert sorted(by(fams, "DCGM_FI_DEV_GPU_TEMP", "gpu", "pod")) == [("0", ""), ("1", "whole"), ("2", ""), ("3", "")]
    finally:
        k.srv.stop(0).wait()
        shutil.rmtree(k.dir, ignore_errors=True)
