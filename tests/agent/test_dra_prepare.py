"""Preparing claims: CDI specs, the checkpoint, double allocations refused, bad input named, health."""

from __future__ import annotations

import json
import os

import pytest

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions, Fault, build_devices
from gpufleet.agent.dra.prepare import Preparer, PrepareError, tolerates
from gpufleet.agent.dra.state import Checkpoint
from gpufleet.agent.nvml import PROFILES

from .dra_fake import FakeDraApi, claim, result

DRIVER = "gpu.gpufleet.io"


class Node:
    """A preparer over a fake API, a state dir and a CDI dir, as the agent builds it."""

    def __init__(self, tmp_path, profile="a100-mig", device_specs="all", dev_root="/dev", mps="", shares=True):
        self.tmp = tmp_path
        self.api = FakeDraApi()
        drv, self.gpus = PROFILES[profile]
        self.devs = build_devices(self.gpus, drv, DraOptions(shares=shares))
        self.faults: dict[int, Fault] = {}
        self.cdi_dir = tmp_path / "cdi"
        self.dev_root, self.device_specs, self.mps = dev_root, device_specs, mps
        self.restart()

    def restart(self):
        """A new agent process: everything from the state directory."""
        self.cp = Checkpoint(self.tmp / "state" / "dra.json", DRIVER, "node-a")
        self.p = Preparer(self.api, self.cp, CdiWriter(str(self.cdi_dir), self.dev_root, self.device_specs, self.mps), "node-a",
                          DRIVER, lambda: (self.devs.published, self.faults))
        self.p.events.api = None  # events are kept in p.events.posted; no background threads in these tests
        return self

    def add(self, name, uid, results, **kw):
        self.api.add_claim(claim(name, uid, results, **kw))

    def prepare(self, name, uid, namespace="default"):
        return self.p.prepare(namespace, uid, name)

    def spec(self, uid):
        return json.loads((self.cdi_dir / f"k8s.gpu.gpufleet.io-claim_{uid}.json").read_text())


def env(edits):
    return dict(e.split("=", 1) for e in edits["env"])


def test_whole_gpu_cdi_spec_checkpoint_and_idempotence(tmp_path):
    n = Node(tmp_path)
    n.add("c1", "uid-1", [result("gpu-3")])
    devs = n.prepare("c1", "uid-1")
    assert [(d.request, d.device, d.uuid, d.whole, d.cdi_ids) for d in devs] == [
        ("gpu", "gpu-3", "GPU-a100-03", True, ("k8s.gpu.gpufleet.io/claim=uid-1-gpu",))]
    spec = n.spec("uid-1")
    assert spec["kind"] == "k8s.gpu.gpufleet.io/claim" and spec["cdiVersion"] == "0.6.0"
    (dev,) = spec["devices"]
    assert dev["name"] == "uid-1-gpu"
    assert env(dev["containerEdits"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a100-03", "GPUFLEET_DRA_CLAIM": "default/c1"}
    assert [d["path"] for d in dev["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    calls = n.api.calls["get_claim"]
    assert n.prepare("c1", "uid-1") == devs  # idempotent, answered from the checkpoint
    assert n.api.calls["get_claim"] == calls
    saved = json.loads((tmp_path / "state" / "dra.json").read_text())
    assert saved["claims"]["uid-1"]["devices"][0]["device"] == "gpu-3"


def test_unprepare_with_the_identity_only_after_an_agent_restart(tmp_path):
    n = Node(tmp_path)
    n.add("c1", "uid-1", [result("gpu-3")])
    n.prepare("c1", "uid-1")
    del n.api.claims["default/c1"]  # the claim object may be gone before kubelet unprepares
    n.restart()
    assert n.cp.get("uid-1") is not None
    n.p.unprepare("default", "uid-1", "c1")
    assert n.cp.get("uid-1") is None and not os.listdir(n.cdi_dir)
    n.p.unprepare("default", "uid-1", "c1")  # idempotent
    n.restart()
    assert n.cp.get("uid-1") is None


def test_two_gpus_of_one_request_one_cdi_device_both_uuids(tmp_path):
    n = Node(tmp_path, profile="h100-nvlink")
    n.add("pair", "uid-2", [result("gpu-4"), result("gpu-5"), result("gpu-6", request="other")])
    devs = n.prepare("pair", "uid-2")
    assert [d.cdi_ids for d in devs] == [("k8s.gpu.gpufleet.io/claim=uid-2-gpu",), (), ("k8s.gpu.gpufleet.io/claim=uid-2-other",)]
    by = {d["name"]: d["containerEdits"] for d in n.spec("uid-2")["devices"]}
    assert env(by["uid-2-gpu"])["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-04,GPU-h100-05"
    assert [d["path"] for d in by["uid-2-gpu"]["deviceNodes"]][:2] == ["/dev/nvidia4", "/dev/nvidia5"]
    assert env(by["uid-2-other"])["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-06"


def test_first_available_subrequest_is_reported_under_its_base_request(tmp_path):
    n = Node(tmp_path)
    n.add("fa", "uid-fa", [result("gpu-0-mig-1g10gb-2", request="gpu/small")])
    (d,) = n.prepare("fa", "uid-fa")
    assert d.request == "gpu" and d.uuid == "MIG-a100-0-2"
    assert env(n.spec("uid-fa")["devices"][0]["containerEdits"])["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-0-2"


def test_a_device_prepared_for_another_claim_is_refused_with_events_naming_both(tmp_path):
    n = Node(tmp_path)
    n.add("first", "uid-a", [result("gpu-2")], pods=("pod-a",))
    n.add("second", "uid-b", [result("gpu-2")], pods=("pod-b",))
    n.prepare("first", "uid-a")
    with pytest.raises(PrepareError) as e:
        n.prepare("second", "uid-b")
    msg = e.value.message
    assert "default/second" in msg and "default/first" in msg and "gpu-2" in msg
    assert e.value.reason == "DeviceAlreadyAllocated" and n.p.refused == 1
    kinds = {(r["kind"], r["name"]) for r, t, reason, note in n.p.events.posted if reason == "DeviceAlreadyAllocated"}
    assert kinds == {("ResourceClaim", "second"), ("Pod", "pod-b")}
    assert n.cp.get("uid-b") is None and not (n.cdi_dir / "k8s.gpu.gpufleet.io-claim_uid-b.json").exists()
    # the same refusal retried by kubelet does not repeat the event
    with pytest.raises(PrepareError):
        n.prepare("second", "uid-b")
    assert len([1 for _, _, reason, _ in n.p.events.posted if reason == "DeviceAlreadyAllocated"]) == 2
    # once the first claim is unprepared the second one gets the device
    n.p.unprepare("default", "uid-a", "first")
    assert n.prepare("second", "uid-b")[0].device == "gpu-2"


def test_mig_instance_is_exclusive(tmp_path):
    n = Node(tmp_path)
    n.add("m1", "u1", [result("gpu-1-mig-3g40gb-0", request="mig")])
    n.add("m2", "u2", [result("gpu-1-mig-3g40gb-0", request="mig")])
    n.prepare("m1", "u1")
    with pytest.raises(PrepareError, match="already prepared"):
        n.prepare("m2", "u2")


def share(device, mem, milli=None, request="gpu", share_id="11111111-2222-3333-4444-555555555555"):
    cc = {"memory": mem}
    if milli is not None:
        cc["gpuMilli"] = milli
    return result(device, request=request, shareID=share_id, consumedCapacity=cc)


def test_shares_by_consumable_capacity_fit_until_memory_or_compute_runs_out(tmp_path):
    n = Node(tmp_path, profile="h100-nvlink", mps="/run/nvidia/mps")
    n.add("s1", "u1", [share("gpu-0", "20Gi", "300")])
    n.add("s2", "u2", [share("gpu-0", "20Gi", "300")])
    (d1,) = n.prepare("s1", "u1")
    assert (d1.whole, d1.memory_bytes, d1.gpu_milli, d1.share_id) == (False, 20 << 30, 300, "11111111-2222-3333-4444-555555555555")
    n.prepare("s2", "u2")
    e = env(n.spec("u1")["devices"][0]["containerEdits"])
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480MB"
    assert e["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
    assert n.spec("u1")["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == "/run/nvidia/mps"
    n.add("s3", "u3", [share("gpu-0", "40Gi", "500")])  # 81559 MiB: 40960 + 40960 > 81559
    with pytest.raises(PrepareError, match=r"memory: 40960 MiB held \+ 40960 MiB asked > 81559 MiB"):
        n.prepare("s3", "u3")
    n.add("s4", "u4", [share("gpu-0", "1Gi", "500")])  # memory fits, compute does not
    with pytest.raises(PrepareError, match=r"gpuMilli: 600 held \+ 500 asked > 1000"):
        n.prepare("s4", "u4")
    n.add("s5", "u5", [share("gpu-0", "1Gi")])  # a memory-only share takes no compute
    assert n.prepare("s5", "u5")[0].gpu_milli == 0
    n.add("whole", "u6", [result("gpu-0")])  # a whole-GPU allocation next to shares: refused
    with pytest.raises(PrepareError, match="already prepared"):
        n.prepare("whole", "u6")


def test_a_share_cannot_join_a_whole_gpu_allocation_without_consumed_capacity(tmp_path):
    n = Node(tmp_path, profile="t4")
    n.add("w", "u1", [result("gpu-1")])  # an allocator that wrote no consumedCapacity: the whole device
    n.add("s", "u2", [share("gpu-1", "1Gi", "100")])
    n.prepare("w", "u1")
    with pytest.raises(PrepareError, match="holds the whole device"):
        n.prepare("s", "u2")


def test_admin_access_overlaps_anything(tmp_path):
    n = Node(tmp_path)
    n.add("work", "u1", [result("gpu-5")])
    n.add("monitor", "u2", [result("gpu-5", adminAccess=True)])
    n.prepare("work", "u1")
    (d,) = n.prepare("monitor", "u2")
    assert d.admin
    n.add("next", "u3", [result("gpu-5")])
    with pytest.raises(PrepareError, match="default/work"):  # admin access is not a holder
        n.prepare("next", "u3")


@pytest.mark.parametrize("results, field, reason", [
    ([result("gpu-9")], "results[0].device 'gpu-9' does not exist on node node-a", "DeviceNotFound"),
    ([result("gpu-2", pool="node-b")], "results[0].pool is 'node-b', but this node's pool is 'node-a'", "InvalidAllocation"),
    ([result("gpu-2"), {"request": "gpu", "driver": DRIVER, "pool": "node-a"}], "results[1].device must be a non-empty string",
     "InvalidAllocation"),
    (["oops"], "results[0] is not an object", "InvalidAllocation"),
    ([share("gpu-2", "lots")], "results[0].consumedCapacity.memory is not a quantity: 'lots'", "InvalidAllocation"),
    ([share("gpu-2", "100Gi")], "exceeds device gpu-2", "InvalidAllocation"),
])
def test_bad_allocations_are_refused_naming_the_object_and_field(tmp_path, results, field, reason):
    n = Node(tmp_path)
    n.add("bad", "u-bad", results)
    with pytest.raises(PrepareError) as e:
        n.prepare("bad", "u-bad")
    assert e.value.message.startswith("ResourceClaim default/bad: status.allocation.devices.") and field in e.value.message
    assert e.value.reason == reason
    assert [(r["kind"], r["name"]) for r, _, why, _ in n.p.events.posted if why == reason] == [("ResourceClaim", "bad"),
                                                                                               ("Pod", "pod-1")]
    n.add("good", "u-good", [result("gpu-2")])  # everyone else keeps being served
    assert n.prepare("good", "u-good")[0].device == "gpu-2"


def test_opaque_config_for_this_driver_is_refused_other_drivers_config_ignored(tmp_path):
    n = Node(tmp_path)
    c = claim("cfg", "u1", [result("gpu-2")])
    c["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}},
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"sharing": "MPS"}}}]
    n.api.add_claim(c)
    with pytest.raises(PrepareError, match=r"config\[1\].opaque \(from its DeviceClass\): this driver takes no opaque"):
        n.prepare("cfg", "u1")
    del c["status"]["allocation"]["devices"]["config"][1]
    assert n.prepare("cfg", "u1")[0].device == "gpu-2"


def test_claims_for_other_drivers_results_are_skipped(tmp_path):
    n = Node(tmp_path)
    n.add("mixed", "u1", [result("nic-0", driver="nic.example.com", pool="x"), result("gpu-4")])
    assert [d.device for d in n.prepare("mixed", "u1")] == ["gpu-4"]


def test_not_allocated_missing_and_recreated_claims(tmp_path):
    n = Node(tmp_path)
    n.add("pending", "u1", [], allocated=False)
    with pytest.raises(PrepareError, match="status.allocation is not set"):
        n.prepare("pending", "u1")
    with pytest.raises(PrepareError, match="ResourceClaim default/nope not found"):
        n.prepare("nope", "u2")
    n.add("again", "new-uid", [result("gpu-2")])
    with pytest.raises(PrepareError, match="metadata.uid is new-uid, kubelet asked for old-uid"):
        n.prepare("again", "old-uid")
    n.api.fail = 1
    with pytest.raises(PrepareError, match="cannot read it: injected"):
        n.prepare("again", "new-uid")
    assert n.prepare("again", "new-uid")


def test_an_unhealthy_gpu_is_refused_unless_tolerated(tmp_path):
    n = Node(tmp_path)
    n.faults = {4: Fault("XID 79", "2026-11-26T10:00:00Z")}
    n.add("c", "u1", [result("gpu-4")])
    with pytest.raises(PrepareError, match=r"gpu-4 is unhealthy \(XID 79; taint gpu.gpufleet.io/xid=79:NoSchedule\)") as e:
        n.prepare("c", "u1")
    assert e.value.reason == "DeviceUnhealthy"
    n.add("t", "u2", [result("gpu-4", tolerations=[{"key": "gpu.gpufleet.io/xid", "operator": "Exists"}])])
    assert n.prepare("t", "u2")[0].device == "gpu-4"


def test_tolerations():
    taint = {"key": "gpu.gpufleet.io/xid", "value": "79", "effect": "NoSchedule"}
    assert tolerates([{"operator": "Exists"}], taint)
    assert tolerates([{"key": "gpu.gpufleet.io/xid", "value": "79"}], taint)
    assert not tolerates([{"key": "gpu.gpufleet.io/xid", "value": "48"}], taint)
    assert not tolerates([{"operator": "Exists", "effect": "NoExecute"}], taint)
    assert tolerates([{"key": "gpu.gpufleet.io/xid", "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert not tolerates([], taint) and not tolerates(["junk"], taint)


def test_device_specs_existing_and_none(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia3", "nvidiactl"):
        (dev / name).write_text("")
    n = Node(tmp_path, device_specs="existing", dev_root=str(dev))
    n.add("c", "u1", [result("gpu-3")])
    n.prepare("c", "u1")
    nodes = n.spec("u1")["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/nvidia3", "hostPath": str(dev / "nvidia3")},
                     {"path": "/dev/nvidiactl", "hostPath": str(dev / "nvidiactl")}]
    n2 = Node(tmp_path / "b", device_specs="none")
    n2.add("c", "u1", [result("gpu-3")])
    n2.prepare("c", "u1")
    assert "deviceNodes" not in n2.spec("u1")["devices"][0]["containerEdits"]


def test_a_lost_cdi_spec_is_rewritten_and_orphans_are_removed(tmp_path):
    n = Node(tmp_path)
    n.add("c", "u1", [result("gpu-3")])
    n.prepare("c", "u1")
    (n.cdi_dir / "k8s.gpu.gpufleet.io-claim_u1.json").unlink()  # /var/run is a tmpfs: a reboot empties it
    (n.cdi_dir / "k8s.gpu.gpufleet.io-claim_crashed.json").write_text("{}")  # written, then the agent died
    (n.cdi_dir / "other-vendor_x.json").write_text("{}")
    n.restart()
    assert n.p.clean_orphans() == ["crashed"]
    n.prepare("c", "u1")
    assert sorted(os.listdir(n.cdi_dir)) == ["k8s.gpu.gpufleet.io-claim_u1.json", "other-vendor_x.json"]


def test_a_corrupt_checkpoint_is_set_aside_not_overwritten(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "dra.json").write_text("{not json")
    n = Node(tmp_path)
    assert n.cp.all() == []
    assert any(p.name.startswith("dra.json.corrupt-") for p in (tmp_path / "state").iterdir())


def test_checkpoint_write_failure_reports_not_prepared(tmp_path):
    n = Node(tmp_path)
    (tmp_path / "state" / "dra.json").mkdir(parents=True)  # the checkpoint cannot be replaced: a full disk, a bad mount
    n.add("c", "u1", [result("gpu-3")])
    with pytest.raises(PrepareError, match="cannot record the prepared claim"):
        n.prepare("c", "u1")
    assert n.cp.get("u1") is None and not (n.cdi_dir / "k8s.gpu.gpufleet.io-claim_u1.json").exists()
