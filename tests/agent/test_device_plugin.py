"""The device plugin against a fake kubelet: real gRPC over real unix sockets."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from concurrent import futures

import grpc
import pytest

from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.deviceplugin import api_pb2_grpc as pbg
from gpufleet.agent.health import HealthTracker, is_fatal
from gpufleet.agent.labels import desired_labels, label_patch
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import DevicePlugin, KubeletWatcher, PodAssignment, build_devices, resources_for
from gpufleet.engine.model import Assignment


class FakeKubelet(pbg.RegistrationServicer):
    def __init__(self, sock_dir: str):
        self.sock = os.path.join(sock_dir, "kubelet.sock")
        self.registered: list[pb.RegisterRequest] = []
        self.server = None

    def Register(self, request, context):  # noqa: N802
        self.registered.append(request)
        return pb.Empty()

    def start(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.sock}")
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()
        if os.path.exists(self.sock):
            os.unlink(self.sock)


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(dir="/tmp", prefix="gf")  # short: unix socket paths are limited to ~107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def client(plugin: DevicePlugin):
    ch = grpc.insecure_channel(f"unix://{plugin.socket_path}")
    grpc.channel_ready_future(ch).result(timeout=5)
    return ch, pbg.DevicePluginStub(ch)


class OnePod:
    def __init__(self, pa):
        self.pa = pa

    def pending_assignment(self, resource, count, exclude):
        return None if self.pa.pod_key in exclude else self.pa


def test_register_list_and_allocate_whole_gpus(sockdir):
    kubelet = FakeKubelet(sockdir)
    kubelet.start()
    gpus = FakeBackend("h100-nvlink").gpus()
    p = DevicePlugin("nvidia.com/gpu", gpus, sockdir)
    p.start()
    try:
        p.register(kubelet.sock)
        r = kubelet.registered[0]
        assert r.version == "v1beta1" and r.resource_name == "nvidia.com/gpu" and r.endpoint == p.endpoint
        assert r.options.get_preferred_allocation_available
        ch, stub = client(p)
        first = next(stub.ListAndWatch(pb.Empty(), timeout=5))
        assert len(first.devices) == 8 and all(d.health == "Healthy" for d in first.devices)
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-h100-03", "GPU-h100-05"])]))
        c = resp.container_responses[0]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-03,GPU-h100-05"
        paths = {d.host_path for d in c.devices}
        assert {"/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths
        with pytest.raises(grpc.RpcError) as exc:
            stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["nope"])]))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ch.close()
    finally:
        p.stop()
        kubelet.stop()


def test_list_and_watch_reports_unhealthy_then_recovery(sockdir):
    be = FakeBackend("t4")
    now = [1000.0]
    tracker = HealthTracker(be, recover_after_s=60, clock=lambda: now[0])
    p = DevicePlugin("nvidia.com/gpu", be.gpus(), sockdir)
    p.start()
    try:
        ch, stub = client(p)
        stream = stub.ListAndWatch(pb.Empty(), timeout=10)
        assert all(d.health == "Healthy" for d in next(stream).devices)
        be.inject_xid(1, 13, now[0])  # application error: stays healthy
        p.set_health(tracker.update())
        be.inject_xid(2, 79, now[0], device_broken=True)  # fell off the bus
        p.set_health(tracker.update())
        msg = next(stream)
        assert {d.ID: d.health for d in msg.devices}["GPU-t4-02"] == "Unhealthy"
        assert {d.ID: d.health for d in msg.devices}["GPU-t4-01"] == "Healthy"
        be.repair(2)
        now[0] += 30
        p.set_health(tracker.update())  # not long enough yet
        now[0] += 31
        p.set_health(tracker.update())
        msg = next(stream)
        assert all(d.health == "Healthy" for d in msg.devices)
        ch.close()
    finally:
        p.stop()


@pytest.mark.parametrize("xid,fatal", [(13, False), (31, False), (43, False), (45, False), (68, False), (48, True), (63, True), (74, True), (79, True), (94, True)])
def test_xid_classification(xid, fatal):
    assert is_fatal(xid) is fatal


def test_mig_mixed_single_and_replicas():
    gpus = FakeBackend("a100-mig").gpus()
    assert resources_for(gpus, "mixed", 1, False) == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
    assert len(build_devices(gpus, "nvidia.com/gpu", "mixed")) == 6  # MIG GPUs are not whole GPUs
    assert len(build_devices(gpus, "nvidia.com/mig-1g.10gb", "mixed")) == 7
    assert len(build_devices(gpus, "nvidia.com/gpu", "single")) == 6 + 7 + 3
    t4 = FakeBackend("t4").gpus()
    reps = build_devices(t4, "nvidia.com/gpu", "mixed", replicas=4)
    assert len(reps) == 16 and reps[0].id == "GPU-t4-00::0" and reps[0].gpu_uuid == "GPU-t4-00"
    assert resources_for(t4, "mixed", 4, True) == ["nvidia.com/gpu.shared"]


def test_allocate_mig_and_replica_and_fractional(sockdir):
    gpus = FakeBackend("a100-mig").gpus()
    mig = DevicePlugin("nvidia.com/mig-1g.10gb", gpus, sockdir)
    c = mig.allocate_one(["MIG-a100-0-3"])
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-0-3" and any(d.host_path == "/dev/nvidia0" for d in c.devices)
    t4 = FakeBackend("t4").gpus()
    rep = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4)
    c = rep.allocate_one(["GPU-t4-01::0", "GPU-t4-01::3"])
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-01"
    a = Assignment(pod_key="ml/share", node="n", cpu_milli=0, memory_mib=0, gpu_indices=(2,), gpu_milli=300, gpu_memory_mib=(4096,))
    frac = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(PodAssignment("ml/share", a, ["GPU-t4-02"])))
    c = frac.allocate_one(["GPU-t4-00::1"])  # kubelet's pick is overridden by the scheduler's GPU
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"
    assert c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "GPU-t4-02=4096M"
    # the agent restarts: the checkpoint still says the pod was served
    again = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(PodAssignment("ml/share", a, ["GPU-t4-02"])))
    assert "ml/share" in again.allocated
    assert again.allocate_one(["GPU-t4-03::0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-03"


def test_preferred_allocation_keeps_nvlink_island_and_numa(sockdir):
    gpus = FakeBackend("a100-mig").gpus()  # GPUs 2..7 whole, 2-3 on NUMA 0, 4-7 on NUMA 1
    p = DevicePlugin("nvidia.com/gpu", gpus, sockdir)
    p.start()
    try:
        ch, stub = client(p)
        avail = [f"GPU-a100-{i:02d}" for i in (2, 3, 4, 5, 6, 7)]
        r = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=avail, allocation_size=4)]))
        got = list(r.container_responses[0].deviceIDs)
        assert len(got) == 4 and {p.by_id[g].numa_node for g in got} == {1}
        r = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=avail, must_include_deviceIDs=["GPU-a100-02"], allocation_size=2)]))
        assert list(r.container_responses[0].deviceIDs)[0] == "GPU-a100-02"
        ch.close()
    finally:
        p.stop()


def test_kubelet_restart_is_noticed_and_plugin_reregisters(sockdir):
    kubelet = FakeKubelet(sockdir)
    kubelet.start()
    w = KubeletWatcher(kubelet.sock)
    assert w.changed()  # first sight
    assert not w.changed()
    p = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), sockdir)
    p.start()
    p.register(kubelet.sock)
    kubelet.stop()  # kubelet restarts: socket gone and re-created
    time.sleep(0.05)
    kubelet2 = FakeKubelet(sockdir)
    kubelet2.start()
    try:
        assert w.changed()
        p.stop()
        p.start()
        p.register(kubelet2.sock)
        assert kubelet2.registered and kubelet2.registered[0].resource_name == "nvidia.com/gpu"
        ch, stub = client(p)
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 4
        ch.close()
    finally:
        p.stop()
        kubelet2.stop()


def test_labels_follow_gfd_and_patch_removes_stale():
    be = FakeBackend("h100-nvlink")
    want = desired_labels(be.driver(), be.gpus(), "mixed")
    assert want["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and want["nvidia.com/gpu.count"] == "8"
    assert want["nvidia.com/gpu.family"] == "hopper" and want["nvidia.com/mig.capable"] == "true"
    assert want["nvidia.com/cuda.driver.major"] == "550" and want["nvidia.com/cuda.runtime.minor"] == "4"
    current = {**want, "nvidia.com/gpu.count": "7", "nvidia.com/gpu.replicas": "4", "team": "ml"}
    patch = label_patch(current, want, inventory="{}", current_inventory="{}")
    assert patch == {"metadata": {"labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": None}}}
    assert label_patch(want, want) is None
