"""The node guard: with several devices per GPU (sharesPerGpu, for gpufleet's shares), a pod without an assignment
-- bound by a scheduler that counts allocatable -- never starts on a GPU another pod uses; kubelet refuses it
with a message naming the GPU and the pod using it.  Pods gpufleet placed are never refused by it."""

from __future__ import annotations

import json

import grpc
import pytest

from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import AssignmentRefused, DevicePlugin, GpuUse, PodAssignment
from gpufleet.agent.podsource import gpu_use
from gpufleet.engine.model import Assignment

from .test_device_plugin import alloc, client

H100 = FakeBackend("h100-nvlink").gpus()  # 8 GPUs, GPU-h100-00 .. 07
NODE = "n"


class Source:
    """A pod source that knows who holds which GPU; ``pa``: the assigned pod being admitted, if any."""

    def __init__(self, use: GpuUse | None, pa: PodAssignment | None = None):
        self.use, self.pa = use, pa
        self.reported: list[tuple] = []

    def pending_assignment(self, resource, count, exclude):
        return self.pa

    def gpu_use(self, resource, count):
        return self.use

    def report_refused(self, pod_key, uid, message, reason="GpuAssignmentRefused"):
        self.reported.append((pod_key, reason, message))


def plugin(sockdir, use, pa=None, replicas=1, slots=10):
    return DevicePlugin("nvidia.com/gpu", H100, sockdir, replicas=replicas, slots=slots, pods=Source(use, pa))


def dev(gpu, k=0):
    return f"GPU-h100-{gpu:02d}::{k}"


def test_a_free_gpu_is_given_and_a_used_one_refused_naming_who_uses_it(sockdir):
    use = GpuUse({dev(0, 3): "ml/first"}, {}, ("ml/ninth", "u9"))
    p = plugin(sockdir, use)
    assert p.allocate_one([dev(1)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-01"
    with pytest.raises(AssignmentRefused) as e:
        p.allocate_one([dev(0, 5)])
    msg = e.value.message
    assert "pod ml/ninth" in msg and "GPU 0 (GPU-h100-00) is used by ml/first" in msg and "did not ask to share" in msg
    assert e.value.reason == "GpuInUse" and e.value.pod_key == "ml/ninth"


def test_gpus_gpufleet_assigned_to_pods_not_yet_admitted_count_as_used(sockdir):
    p = plugin(sockdir, GpuUse({}, {2: {"ml/placed"}}))
    with pytest.raises(AssignmentRefused, match=r"GPU 2 \(GPU-h100-02\) is used by ml/placed"):
        p.allocate_one([dev(2, 1)])
    assert p.allocate_one([dev(3)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-03"


def test_a_multi_gpu_pod_needs_every_gpu_free(sockdir):
    p = plugin(sockdir, GpuUse({dev(5): "ml/x"}, {}))
    with pytest.raises(AssignmentRefused, match="GPU 5"):
        p.allocate_one([dev(4), dev(5, 2)])
    assert p.allocate_one([dev(4), dev(6)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-04,GPU-h100-06"


def test_fail_closed_when_the_agent_cannot_tell(sockdir):
    with pytest.raises(AssignmentRefused, match="cannot tell whether another pod uses them"):
        plugin(sockdir, None).allocate_one([dev(0)])

    class Broken(Source):
        def gpu_use(self, resource, count):
            raise RuntimeError("kubelet away")

    p = DevicePlugin("nvidia.com/gpu", H100, sockdir, slots=10, pods=Broken(None))
    with pytest.raises(AssignmentRefused, match="cannot tell"):
        p.allocate_one([dev(0)])


def test_no_guard_for_pods_gpufleet_placed_for_time_slicing_or_one_device_per_gpu(sockdir):
    a = Assignment(pod_key="ml/share", node=NODE, cpu_milli=0, memory_mib=0, gpu_indices=(0,), gpu_milli=300)
    shared = PodAssignment("ml/share", a, ["GPU-h100-00"])
    busy = GpuUse({dev(0, 1): "ml/other-share"}, {0: {"ml/other-share", "ml/share"}})
    # a share gpufleet placed on a GPU other shares use: kubelet never refuses what gpufleet placed
    assert plugin(sockdir, busy, pa=shared).allocate_one([dev(0, 2)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-00"
    # time-slicing replicas: the admin asked for sharing
    assert plugin(sockdir, busy, replicas=4, slots=4).allocate_one([dev(0, 2)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-00"
    # one device per GPU: kubelet itself never hands a GPU out twice
    p = DevicePlugin("nvidia.com/gpu", H100, sockdir, pods=Source(None))
    assert not p.guard and p.allocate_one(["GPU-h100-00"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-00"


def test_kubelet_refuses_through_grpc_and_the_pod_gets_an_event(sockdir):
    p = plugin(sockdir, GpuUse({dev(0, 3): "ml/first"}, {}, ("ml/ninth", "u9")))
    p.start()
    try:
        ch, stub = client(p)
        with pytest.raises(grpc.RpcError) as e:
            alloc(stub, [dev(0, 4)])
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "ml/first" in e.value.details()
        assert p.pods.reported and p.pods.reported[0][:2] == ("ml/ninth", "GpuInUse")  # type: ignore[attr-defined]
        ch.close()
    finally:
        p.stop()


def _pod(name, ann=None, node=NODE, phase="Pending", gpus=1):
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "annotations": ann or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def test_gpu_use_reads_kubelets_devices_and_gpufleets_assignments():
    asg = json.dumps({"node": "n", "gpus": [{"index": 3}], "gpu_milli": 1000})
    pods = [_pod("running", phase="Running"), _pod("placed", {"gpufleet.io/assignment": asg}),
            _pod("done", {"gpufleet.io/assignment": json.dumps({"node": "n", "gpus": [{"index": 4}]})}, phase="Succeeded"),
            _pod("elsewhere", {"gpufleet.io/assignment": json.dumps({"node": "m", "gpus": [{"index": 5}]})}),
            _pod("ninth"), _pod("two", gpus=2)]
    devices = {("ml", "running"): {"nvidia.com/gpu": [dev(0, 1)]}, ("ml", "ninth"): {}, ("ml", "two"): {}}
    use = gpu_use(NODE, "nvidia.com/gpu", 1, devices, pods)
    assert use.by_device == {dev(0, 1): "ml/running"}
    assert use.by_gpu == {3: {"ml/placed"}}  # finished pods and other nodes' assignments hold nothing here
    assert use.admitting == ("ml/ninth", "u-ninth")  # the one waiting pod without an assignment asking for 1
    assert gpu_use(NODE, "nvidia.com/gpu", 2, devices, pods).admitting == ("ml/two", "u-two")
    assert gpu_use(NODE, "nvidia.com/gpu", 1, devices, None).by_gpu == {}  # API away: kubelet's devices only


def test_the_pod_being_admitted_is_not_its_own_other_user():
    # a pod gpufleet placed whose lookup failed (API server restarting): its own assignment is not another's use
    asg = json.dumps({"node": "n", "gpus": [{"index": 4}], "gpu_milli": 1000})
    pods = [_pod("mine", {"gpufleet.io/assignment": asg}), _pod("running", phase="Running")]
    devices = {("ml", "mine"): {}, ("ml", "running"): {"nvidia.com/gpu": [dev(0)]}}
    use = gpu_use(NODE, "nvidia.com/gpu", 1, devices, pods)
    assert use.admitting == ("ml/mine", "u-mine") and use.by_gpu == {4: {"ml/mine"}}


def test_a_second_lookup_serves_a_placed_pod_by_its_assignment(sockdir):
    a = Assignment(pod_key="ml/placed", node=NODE, cpu_milli=0, memory_mib=0, gpu_indices=(4,), gpu_milli=1000)

    class Flaky(Source):
        calls = 0

        def pending_assignment(self, resource, count, exclude):
            Flaky.calls += 1
            return None if Flaky.calls == 1 else PodAssignment("ml/placed", a, ["GPU-h100-04"])

    p = DevicePlugin("nvidia.com/gpu", H100, sockdir, slots=10, pods=Flaky(GpuUse({}, {4: {"ml/placed"}})))
    r = p.allocate_one([dev(0)])  # kubelet's choice (GPU 0) while the first lookup failed
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-04" and r.envs["GPUFLEET_POD"] == "ml/placed"


def test_preference_for_a_pod_without_assignment_skips_gpus_gpufleet_assigned(sockdir):
    """kubelet sees every device of a GPU gpufleet assigned to a pod not admitted yet as free: the preference must not
    offer it to another scheduler's pod, or the guard refuses that pod (both created together on the real node)."""
    every = [dev(g, k) for g in range(8) for k in range(10)]
    p = plugin(sockdir, GpuUse({dev(1, 0): "ml/running"}, {0: {"ml/placed"}, 1: {"ml/running"}}, ("ml/foreign", "u")))
    assert p.prefer([d for d in every if d != dev(1, 0)], [], 1) == [dev(2)]
    assert p.prefer(every, [], 2) == [dev(2), dev(3)]
    # its own assignment is not another pod's promise; with too few GPUs left the guard decides (avail unchanged)
    own = plugin(sockdir, GpuUse({}, {0: {"ml/foreign"}}, ("ml/foreign", "u")))
    assert own.prefer(every, [], 1) == [dev(0)]
    full = plugin(sockdir, GpuUse({}, {g: {f"ml/p{g}"} for g in range(7)}))
    assert full.prefer(every, [], 2) == [dev(0), dev(1)]
    # without the guard (time-slicing asked for) nothing is left out
    assert plugin(sockdir, GpuUse({}, {0: {"ml/placed"}}), replicas=10, slots=10).prefer(every, [], 1) == [dev(0)]


def test_a_placed_pod_whose_gpu_kubelet_gave_another_schedulers_pod_first_is_refused(sockdir):
    """Two schedulers raced (Kubernetes 1.35, no routing; seen on the real node): kubelet admitted kube-scheduler's
    whole-GPU pod on GPU 1 before gpufleet's snapshot showed its binding, and gpufleet put shares there.  Serving a share
    would share GPU 1 unasked: it is refused with RACED in the message (kube/plugin_down re-creates it).  Other
    gpufleet pods on the GPU, or a foreign pod on another GPU, refuse nothing."""
    from gpufleet.agent.plugin import RACED

    a = Assignment(pod_key="ml/s0", node=NODE, cpu_milli=0, memory_mib=0, gpu_indices=(1,), gpu_milli=250)
    share = PodAssignment("ml/s0", a, ["GPU-h100-01"], uid="u-s0")
    use = GpuUse({dev(1, 4): "ml/d0", dev(1, 0): "ml/s9"}, {1: {"ml/s0", "ml/s9"}}, foreign=frozenset({"ml/d0"}))
    p = plugin(sockdir, use, pa=share)
    with pytest.raises(AssignmentRefused) as e:
        p.allocate_one([dev(1, 7)])
    msg = e.value.message
    assert RACED in msg and "GPU 1 (GPU-h100-01) to ml/d0" in msg and msg.startswith("pod ml/s0: ") and e.value.pod_key == "ml/s0"
    # only gpufleet's pods on its GPU (ml/s9), or the foreign pod on another GPU: served by its assignment
    ok = GpuUse({dev(1, 0): "ml/s9", dev(2, 0): "ml/d0"}, {1: {"ml/s0", "ml/s9"}}, foreign=frozenset({"ml/d0"}))
    assert plugin(sockdir, ok, pa=share).allocate_one([dev(1, 7)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-01"
    # cannot tell (PodResources unreadable): the assignment decides, as before
    assert plugin(sockdir, None, pa=share).allocate_one([dev(1, 7)]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-01"


def test_gpu_use_names_the_pods_gpufleet_did_not_place():
    mine = json.dumps({"node": "n", "gpus": [{"index": 1}], "gpu_milli": 250})
    recorded = json.dumps({"node": "n", "gpus": [{"index": 1}], "gpu_milli": 1000, "source": "kubelet"})
    pods = [_pod("s0", {"gpufleet.io/assignment": mine}), _pod("d0", {"gpufleet.io/assignment": recorded}), _pod("bare")]
    use = gpu_use(NODE, "nvidia.com/gpu", 1, {}, pods)
    assert use.foreign == {"ml/d0", "ml/bare"}
