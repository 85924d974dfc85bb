"""The exporter: dcgm-exporter names, per-pod attribution from a fake PodResources server over a real socket."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.exporter import ContainerRef, GpuCollector, KubeletPodResources
from gpufleet.agent.nvml import FakeBackend, ProcessUsage
from gpufleet.agent.podresources import podresources_pb2 as pb
from gpufleet.agent.podresources import podresources_pb2_grpc as pbg


class FakePodResources(pbg.PodResourcesListerServicer):
    def __init__(self, pods):
        self.pods = pods

    def List(self, request, context):  # noqa: N802
        out = []
        for ns, name, containers in self.pods:
            out.append(pb.PodResources(namespace=ns, name=name, containers=[
                pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)]) for c, r, ids in containers]))
        return pb.ListPodResourcesResponse(pod_resources=out)


@pytest.fixture
def kubelet():
    d = tempfile.mkdtemp(dir="/tmp", prefix="pr")
    sock = os.path.join(d, "kubelet.sock")
    svc = FakePodResources([
        ("ml", "train", [("main", "nvidia.com/gpu", ["GPU-t4-00"])]),
        ("ml", "a", [("worker", "nvidia.com/gpu", ["GPU-t4-01::0"])]),
        ("web", "b", [("infer", "nvidia.com/gpu", ["GPU-t4-01::1"])]),
    ])
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_PodResourcesListerServicer_to_server(svc, srv)
    srv.add_insecure_port(f"unix://{sock}")
    srv.start()
    yield sock
    srv.stop(0).wait()
    shutil.rmtree(d, ignore_errors=True)


def scrape(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}


def test_names_labels_and_shared_gpu_attribution(kubelet):
    be = FakeBackend("t4")
    be.set_processes([ProcessUsage(100, 0, 9000, 80), ProcessUsage(200, 1, 3000, 50), ProcessUsage(300, 1, 1000, 10)])
    who = {100: ContainerRef("ml", "train", "main"), 200: ContainerRef("ml", "a", "worker"), 300: ContainerRef("web", "b", "infer")}
    fams = scrape(GpuCollector(be, "node-1", KubeletPodResources(kubelet), who.get))
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS"):
        assert name in fams, name
    fb = {(s.labels["gpu"], s.labels["pod"]): s.value for s in fams["DCGM_FI_DEV_FB_USED"].samples}
    util = {(s.labels["gpu"], s.labels["pod"]): s.value for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert fb[("0", "train")] == 9000 and util[("0", "train")] == 80  # exclusive GPU: device numbers, pod labels
    assert fb[("1", "a")] == 3000 and fb[("1", "b")] == 1000  # shared GPU: each sharer its own memory
    assert util[("1", "a")] == 50 and util[("1", "b")] == 10
    s = next(x for x in fams["DCGM_FI_DEV_FB_USED"].samples if x.labels["pod"] == "train")
    assert s.labels["UUID"] == "GPU-t4-00" and s.labels["device"] == "nvidia0" and s.labels["modelName"] == "Tesla T4"
    assert s.labels["Hostname"] == "node-1" and s.labels["namespace"] == "ml" and s.labels["container"] == "main"
    assert ("2", "") in fb  # idle GPU still reported, unattributed


def test_kubelet_down_still_exports_device_metrics():
    be = FakeBackend("t4")
    fams = scrape(GpuCollector(be, "n", KubeletPodResources("/tmp/does-not-exist.sock", timeout_s=0.2)))
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 4
