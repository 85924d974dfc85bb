"""The device plugin against a fake kubelet: real gRPC over real unix sockets."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import grpc
import pytest

from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.health import HealthTracker
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import (
    AssignmentRefused,
    DevicePlugin,
    InvalidAssignment,
    KubeletWatcher,
    PodAssignment,
    build_devices,
    nvlink_islands,
    resources_for,
)
from gpufleet.engine.model import Assignment

from .conftest import FakeKubelet


def client(plugin: DevicePlugin):
    ch = grpc.insecure_channel(f"unix://{plugin.socket_path}")
    grpc.channel_ready_future(ch).result(timeout=5)
    from gpufleet.agent.deviceplugin import api_pb2_grpc as pbg

    return ch, pbg.DevicePluginStub(ch)


class OnePod:
    """A pod source with one pending pod (what the kube API would list)."""

    def __init__(self, pa: PodAssignment):
        self.pa = pa
        self.calls = 0

    def pending_assignment(self, resource, count, exclude):
        self.calls += 1
        return None if self.pa.served_key in exclude else self.pa


def share(pod="ml/share", gpu=2, milli=300, mem=4096, uid=""):
    a = Assignment(pod_key=pod, node="n", cpu_milli=0, memory_mib=0, gpu_indices=(gpu,), gpu_milli=milli, gpu_memory_mib=(mem,))
    return PodAssignment(pod, a, [f"GPU-t4-{gpu:02d}"], uid)


def alloc(stub, ids):
    return stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])).container_responses[0]


def preferred(stub, avail, size, must=()):
    r = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=avail, must_include_deviceIDs=list(must), allocation_size=size)]))
    return list(r.container_responses[0].deviceIDs)


def test_register_list_and_allocate_whole_gpus(sockdir, kubelet):
    gpus = FakeBackend("h100-nvlink").gpus()
    p = DevicePlugin("nvidia.com/gpu", gpus, sockdir)
    p.start()
    try:
        p.register(kubelet.sock)
        r = kubelet.registered[0]
        assert r.version == "v1beta1" and r.resource_name == "nvidia.com/gpu" and r.endpoint == p.endpoint
        assert r.options.get_preferred_allocation_available and not r.options.pre_start_required
        ch, stub = kubelet.plugin("nvidia.com/gpu")  # dial the endpoint the registration named
        opts = stub.GetDevicePluginOptions(pb.Empty())
        assert opts.get_preferred_allocation_available
        first = next(stub.ListAndWatch(pb.Empty(), timeout=5))
        assert len(first.devices) == 8 and all(d.health == "Healthy" for d in first.devices)
        assert {d.ID: d.topology.nodes[0].ID for d in first.devices}["GPU-h100-05"] == 1  # NUMA for the topology manager
        c = alloc(stub, ["GPU-h100-03", "GPU-h100-05"])
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-03,GPU-h100-05"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs
        paths = {d.host_path for d in c.devices}
        assert paths == {"/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        assert all(d.permissions == "rw" and d.container_path == d.host_path for d in c.devices)
        assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["GPU-h100-03"])) == pb.PreStartContainerResponse()
        ch.close()
    finally:
        p.stop()


def test_bad_allocate_is_refused_and_the_plugin_keeps_serving(sockdir):
    p = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), sockdir)
    p.start()
    try:
        ch, stub = client(p)
        for ids in (["nope"], ["GPU-t4-00", "GPU-t4-99"], []):
            with pytest.raises(grpc.RpcError) as exc:
                alloc(stub, ids)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "nvidia.com/gpu" in exc.value.details()
        assert "GPU-t4-99" in str(exc) or True
        assert alloc(stub, ["GPU-t4-01"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-01"
        ch.close()
    finally:
        p.stop()


def test_list_and_watch_reports_unhealthy_then_recovery(sockdir):
    be = FakeBackend("t4")
    now = [1000.0]
    tracker = HealthTracker(be, recover_after_s=60, clock=lambda: now[0])
    p = DevicePlugin("nvidia.com/gpu", be.gpus(), sockdir, replicas=2)
    p.start()
    try:
        ch, stub = client(p)
        stream = stub.ListAndWatch(pb.Empty(), timeout=10)
        assert all(d.health == "Healthy" for d in next(stream).devices)
        be.inject_xid(1, 13, now[0])  # application error: stays healthy, no update sent
        p.set_health(tracker.update())
        be.inject_xid(2, 79, now[0], device_broken=True)  # fell off the bus
        p.set_health(tracker.update())
        msg = {d.ID: d.health for d in next(stream).devices}
        assert msg["GPU-t4-02::0"] == msg["GPU-t4-02::1"] == "Unhealthy"  # every replica of the GPU
        assert msg["GPU-t4-01::0"] == "Healthy"
        now[0] += 120
        p.set_health(tracker.update())  # window passed, but NVML still cannot reach it: stays unhealthy
        be.clear_fault(2)
        now[0] += 30
        p.set_health(tracker.update())  # NVML answers again, not long enough yet
        assert tracker.update()[2] is False
        now[0] += 31
        p.set_health(tracker.update())
        assert all(d.health == "Healthy" for d in next(stream).devices)
        ch.close()
    finally:
        p.stop()


def test_mig_mixed_single_and_replicas():
    gpus = FakeBackend("a100-mig").gpus()
    assert resources_for(gpus, "mixed", 1, False) == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
    assert resources_for(gpus, "single", 1, False) == ["nvidia.com/gpu"]
    assert resources_for(gpus, "none", 1, False) == ["nvidia.com/gpu"]
    assert len(build_devices(gpus, "nvidia.com/gpu", "mixed")) == 6  # MIG GPUs are not whole GPUs
    assert len(build_devices(gpus, "nvidia.com/mig-1g.10gb", "mixed")) == 7
    assert len(build_devices(gpus, "nvidia.com/gpu", "single")) == 6 + 7 + 3
    t4 = FakeBackend("t4").gpus()
    reps = build_devices(t4, "nvidia.com/gpu", "mixed", replicas=4)
    assert len(reps) == 16 and reps[0].id == "GPU-t4-00::0" and reps[0].gpu_uuid == "GPU-t4-00"
    assert resources_for(t4, "mixed", 4, True) == ["nvidia.com/gpu.shared"]


def test_allocate_mig_instance(sockdir, kubelet):
    gpus = FakeBackend("a100-mig").gpus()
    p = DevicePlugin("nvidia.com/mig-1g.10gb", gpus, sockdir)
    p.start()
    try:
        p.register(kubelet.sock)
        ch, stub = kubelet.plugin("nvidia.com/mig-1g.10gb")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 7
        c = alloc(stub, ["MIG-a100-0-3"])
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-0-3"
        assert {d.host_path for d in c.devices} >= {"/dev/nvidia0", "/dev/nvidiactl"}
        with pytest.raises(grpc.RpcError):
            alloc(stub, ["MIG-a100-1-0"])  # a 3g.40gb instance is not this resource's device
        ch.close()
    finally:
        p.stop()


def test_allocate_replicas_and_fractional_share_with_mps_limits(sockdir, kubelet):
    t4 = FakeBackend("t4").gpus()
    src = OnePod(share())
    p = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=src, mps_pipe_dir="/run/nvidia/mps")
    p.start()
    try:
        p.register(kubelet.sock)
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        # the scheduler's GPU (2) is steered into kubelet's choice ...
        assert preferred(stub, [f"GPU-t4-0{g}::{k}" for g in range(4) for k in range(4)], 1) == ["GPU-t4-02::0"]
        # ... and wins even when kubelet picked another replica
        c = alloc(stub, ["GPU-t4-00::1"])
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"
        assert c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096MB"  # ordinal inside the container
        assert c.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps" and c.mounts[0].host_path == "/run/nvidia/mps"
        assert c.envs["GPUFLEET_POD"] == "ml/share"
        assert {d.host_path for d in c.devices} >= {"/dev/nvidia2"} and "/dev/nvidia0" not in {d.host_path for d in c.devices}
        # the pod was served: the next Allocate is a plain replica request (kubelet's choice, no MPS limits)
        c = alloc(stub, ["GPU-t4-01::0", "GPU-t4-01::3"])
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-01" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs
        ch.close()
    finally:
        p.stop()


def test_memory_only_share_and_whole_gpu_assignment(sockdir):
    t4 = FakeBackend("t4").gpus()
    c = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(share(milli=0, mem=2048))).allocate_one(["GPU-t4-00::0"])
    assert c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048MB" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs
    h100 = FakeBackend("h100-nvlink").gpus()
    a = Assignment("ml/train", "n", 0, 0, gpu_indices=(4, 6), gpu_milli=1000, gpu_memory_mib=(0, 0))
    p = DevicePlugin("nvidia.com/gpu", h100, sockdir, pods=OnePod(PodAssignment("ml/train", a, ["GPU-h100-04", ""])))
    assert p.prefer([f"GPU-h100-{i:02d}" for i in range(8)], [], 2) == ["GPU-h100-04", "GPU-h100-06"]
    c = p.allocate_one(["GPU-h100-00", "GPU-h100-01"])
    assert c.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-04,GPU-h100-06" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in c.envs


def test_mig_assignment_maps_instances_to_mig_uuids(sockdir):
    gpus = FakeBackend("a100-mig").gpus()
    a = Assignment("ml/mig", "n", 0, 0, gpu_indices=(1,), mig=((1, 2),), mig_profile="2g.20gb")
    p = DevicePlugin("nvidia.com/mig-2g.20gb", gpus, sockdir, pods=OnePod(PodAssignment("ml/mig", a, ["GPU-a100-01"])))
    assert p.prefer(["MIG-a100-1-1", "MIG-a100-1-2"], [], 1) == ["MIG-a100-1-2"]
    assert p.allocate_one(["MIG-a100-1-1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-1-2"


class Reporting(OnePod):
    def __init__(self, pa):
        super().__init__(pa)
        self.refused = []

    def report_refused(self, pod_key, uid, message):
        self.refused.append((pod_key, uid, message))


def test_stale_assignment_is_refused_never_started_on_other_gpus(sockdir, kubelet):
    t4 = FakeBackend("t4").gpus()
    stale = share(gpu=2, uid="u1")
    stale.gpu_uuids = ["GPU-somewhere-else"]  # inventory changed since the scheduler decided
    src = Reporting(stale)
    p = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=src)
    p.start()
    try:
        ch, stub = client(p)
        with pytest.raises(grpc.RpcError) as err:
            alloc(stub, ["GPU-t4-00::1"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU-somewhere-else" in err.value.details() and "ml/share" in err.value.details()
        assert src.refused and src.refused[0][:2] == ("ml/share", "u1")
        # remembered: the next pod's Allocate is not blamed on it
        assert "ml/share#u1" in p.allocated and p.allocated["ml/share#u1"]["refused"]
        ch.close()
    finally:
        p.stop()
    missing = share(gpu=9)  # a GPU this node does not have (vanished)
    with pytest.raises(AssignmentRefused, match="GPU 9"):
        DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(missing)).allocate_one(["GPU-t4-03::0"])

    class Broken:
        def pending_assignment(self, *a):
            raise RuntimeError("API server away")

    p = DevicePlugin("nvidia.com/gpu", t4, sockdir, pods=Broken())  # no pod known: kubelet's choice stands
    assert p.allocate_one(["GPU-t4-01"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-01"


def test_assignment_naming_an_unhealthy_gpu_is_refused(sockdir):
    t4 = FakeBackend("t4").gpus()
    p = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(share(gpu=2)))
    p.set_health({0: True, 1: True, 2: False, 3: True})
    with pytest.raises(AssignmentRefused, match=r"unhealthy GPU\(s\) \[2\]"):
        p.allocate_one(["GPU-t4-00::0"])


def test_malformed_assignment_is_refused(sockdir):
    bad = InvalidAssignment("ml/bad", "u9", "malformed gpufleet.io/assignment: not valid JSON")
    p = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), sockdir, pods=OnePod(bad))
    assert p.prefer(["GPU-t4-00", "GPU-t4-01"], [], 1)  # preference: kubelet's, Allocate refuses
    with pytest.raises(AssignmentRefused, match="ml/bad: malformed"):
        p.allocate_one(["GPU-t4-00"])


def test_agent_restart_keeps_served_pods_from_the_checkpoint(sockdir):
    t4 = FakeBackend("t4").gpus()
    state = f"{sockdir}/state"
    first = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(share(uid="u1")), state_dir=state)
    assert first.allocate_one(["GPU-t4-00::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"
    first.allocate_one(["GPU-t4-03::0"])  # kubelet's choice, recorded too
    # the agent restarts: the pod (still Pending in the API) is not served again from its annotation
    again = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(share(uid="u1")), state_dir=state)
    assert again.allocated["ml/share#u1"]["uuids"] == ["GPU-t4-02"] and again.anonymous[0]["uuids"] == ["GPU-t4-03"]
    assert again.allocate_one(["GPU-t4-03::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-03"
    # a re-created pod of the same name (new UID) is a new pod
    assert DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=OnePod(share(uid="u2")),
                        state_dir=state).allocate_one(["GPU-t4-03::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"
    assert again.prune({"other/pod"}) == 1 and "ml/share#u1" not in json.loads(again.checkpoint.read_text())["pods"]
    again.checkpoint.write_text("{torn")  # a corrupt checkpoint: logged, the plugin still starts
    assert DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, state_dir=state).allocated == {}


def test_preferred_allocation_on_h100_nvlink_topology(sockdir):
    gpus = FakeBackend("h100-nvlink").gpus()  # one NVLink island (all 8), NUMA 0: GPUs 0-3, NUMA 1: 4-7
    assert set(nvlink_islands(gpus).values()) == {0}
    p = DevicePlugin("nvidia.com/gpu", gpus, sockdir)
    p.start()
    try:
        ch, stub = client(p)
        ids = [f"GPU-h100-{i:02d}" for i in range(8)]
        got = preferred(stub, ids, 4)
        assert {p.by_id[g].numa_node for g in got} == {0} and len(got) == 4
        # GPUs 0, 1, 5 taken: a pair goes to NUMA 0's last two? no -- the smallest group that fits: NUMA 0 has 2 left
        got = preferred(stub, [ids[i] for i in (2, 3, 4, 6, 7)], 2)
        assert got == ["GPU-h100-02", "GPU-h100-03"]
        # 3 GPUs: NUMA 0 (2 left) cannot, NUMA 1 (3 left) can
        assert preferred(stub, [ids[i] for i in (2, 3, 4, 6, 7)], 3) == ["GPU-h100-04", "GPU-h100-06", "GPU-h100-07"]
        # more than one NUMA node holds: one NVLink island still
        assert len(preferred(stub, ids, 6)) == 6
        # must-include is kept
        assert preferred(stub, ids, 2, must=["GPU-h100-07"])[0] == "GPU-h100-07"
        ch.close()
    finally:
        p.stop()


def test_preferred_allocation_prefers_an_nvlink_island_over_numa(sockdir):
    from dataclasses import replace

    base = FakeBackend("t4").gpus() + [replace(g, index=g.index + 4, uuid=f"GPU-t4-{g.index + 4:02d}") for g in FakeBackend("t4").gpus()]
    # two NVLink pairs across NUMA nodes: (0, 5) and (1, 6); all others alone
    peers = {0: (5,), 5: (0,), 1: (6,), 6: (1,)}
    gpus = [replace(g, nvlink_peers=peers.get(g.index, ()), numa_node=0 if g.index < 4 else 1) for g in base]
    p = DevicePlugin("nvidia.com/gpu", gpus, sockdir)
    got = p.prefer([g.uuid for g in gpus], [], 2)
    assert {p.by_id[i].gpu_index for i in got} in ({0, 5}, {1, 6})
    # replicas: spread over the least-loaded GPUs
    r = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), sockdir, replicas=2)
    avail = ["GPU-t4-00::0", "GPU-t4-01::0", "GPU-t4-01::1", "GPU-t4-02::1"]
    assert r.prefer(avail, [], 1) == ["GPU-t4-01::0"]


def test_kubelet_restart_is_noticed_and_plugin_reregisters(sockdir):
    kubelet = FakeKubelet(sockdir).start()
    w = KubeletWatcher(kubelet.sock)
    assert w.changed()  # first sight
    assert not w.changed()
    p = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), sockdir)
    p.start()
    p.register(kubelet.sock)
    kubelet.stop()  # kubelet restarts: socket gone and re-created
    assert not w.changed()  # gone: nothing to register with
    time.sleep(0.01)
    kubelet2 = FakeKubelet(sockdir).start()
    try:
        assert w.changed()
        p.stop()
        p.start()
        p.register(kubelet2.sock)
        assert kubelet2.registered and kubelet2.registered[0].resource_name == "nvidia.com/gpu"
        ch, stub = kubelet2.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 4
        ch.close()
    finally:
        p.stop()
        kubelet2.stop()


@pytest.mark.parametrize("mode, present, want", [
    ("all", [], ["/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]),
    ("existing", [], []),  # a node without a GPU: no spec containerd would fail to lstat
    ("existing", ["nvidia3", "nvidiactl"], ["/dev/nvidia3", "/dev/nvidiactl"]),
    ("none", ["nvidia1", "nvidia3", "nvidiactl"], []),
])
def test_device_specs_only_for_files_that_exist_when_asked(tmp_path, mode, present, want):
    for name in present:
        (tmp_path / name).write_text("")
    p = DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), str(tmp_path), device_specs=mode, dev_root=str(tmp_path))
    specs = p.device_spec_list([1, 3])
    assert [s.container_path for s in specs] == want
    assert all(s.host_path == str(tmp_path / s.container_path[len("/dev/"):]) for s in specs)


def test_unknown_device_spec_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="device_specs"):
        DevicePlugin("nvidia.com/gpu", FakeBackend("t4").gpus(), str(tmp_path), device_specs="some")


def test_a_pod_kubelet_admits_again_gets_its_own_gpu_again(sockdir, caplog):
    # the pod source says kubelet lists the served pod without devices (a cancelled Allocate, a kubelet restart)
    class Again(OnePod):
        def pending_assignment(self, resource, count, exclude):
            return dataclasses.replace(self.pa, again=self.pa.served_key in exclude)

    caplog.set_level(logging.INFO, logger="gpufleet")
    t4 = FakeBackend("t4").gpus()
    p = DevicePlugin("nvidia.com/gpu", t4, sockdir, replicas=4, pods=Again(share(gpu=2, uid="u1")))
    assert p.allocate_one(["GPU-t4-00::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"
    assert p.allocate_one(["GPU-t4-00::2"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-02"  # not kubelet's GPU 0
    assert p.allocated["ml/share#u1"]["devices"] == ["GPU-t4-00::2"]
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "nvidia.com/gpu: kubelet admits ml/share again (its earlier Allocate did not complete): its own GPUs again"]
