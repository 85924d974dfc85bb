"""GPU Feature Discovery labels and the node patch, computed and applied without a cluster."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from gpufleet.agent.labels import NO_INVENTORY, NodeLabeller, desired_labels, label_patch, owned
from gpufleet.agent.nvml import FakeBackend


def test_labels_follow_gfd_names_and_values():
    be = FakeBackend("h100-nvlink")
    want = desired_labels(be.driver(), be.gpus(), "mixed")
    assert want["nvidia.com/gpu.present"] == "true"
    assert want["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and want["nvidia.com/gpu.count"] == "8"
    assert want["nvidia.com/gpu.memory"] == "81559" and want["nvidia.com/gpu.family"] == "hopper"
    assert want["nvidia.com/mig.capable"] == "true" and want["nvidia.com/mig.strategy"] == "mixed"
    assert (want["nvidia.com/cuda.driver.major"], want["nvidia.com/cuda.driver.minor"], want["nvidia.com/cuda.driver.rev"]) == ("550", "90", "07")
    assert want["nvidia.com/cuda.driver-version.full"] == "550.90.07" and want["nvidia.com/cuda.driver-version.revision"] == "07"
    assert (want["nvidia.com/cuda.runtime.major"], want["nvidia.com/cuda.runtime.minor"]) == ("12", "4")
    assert want["nvidia.com/gpu.compute.major"] == "9" and want["nvidia.com/gpu.replicas"] == "1"
    assert all(owned(k) for k in want)
    t4 = FakeBackend("t4")
    shared = desired_labels(t4.driver(), t4.gpus(), "none", replicas=4)
    assert shared["nvidia.com/gpu.product"] == "Tesla-T4-SHARED" and shared["nvidia.com/gpu.replicas"] == "4"
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing" and shared["nvidia.com/mig.capable"] == "false"
    assert desired_labels(t4.driver(), t4.gpus(), "none", 4, rename_shared=True)["nvidia.com/gpu.product"] == "Tesla-T4"
    assert desired_labels(t4.driver(), [], "mixed") == {"nvidia.com/gpu.present": "false"}


def test_mig_labels_mixed_and_single():
    be = FakeBackend("a100-mig")
    mixed = desired_labels(be.driver(), be.gpus(), "mixed")
    assert mixed["nvidia.com/mig-1g.10gb.count"] == "7" and mixed["nvidia.com/mig-2g.20gb.count"] == "2"
    assert mixed["nvidia.com/mig-3g.40gb.memory"] == "40192" and mixed["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
    # single strategy with one profile everywhere: the MIG device is "the GPU"
    from dataclasses import replace

    g = be.gpus()
    one = [g[0]] + [replace(x, mig_enabled=False, mig=()) for x in g[1:]]
    single = desired_labels(be.driver(), one[:1], "single")
    assert single["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert single["nvidia.com/gpu.count"] == "7" and single["nvidia.com/gpu.memory"] == "9728"
    assert not any(k.startswith("nvidia.com/mig-") for k in single)


def test_patch_sets_changes_removes_stale_and_leaves_others_alone():
    be = FakeBackend("h100-nvlink")
    want = desired_labels(be.driver(), be.gpus(), "mixed")
    current = {**want, "nvidia.com/gpu.count": "7", "nvidia.com/mig-1g.10gb.count": "7", "team": "ml",
               "nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gfd.timestamp": "1"}
    patch = label_patch(current, want, inventory="{}", current_inventory="{}")
    assert patch == {"metadata": {"labels": {"nvidia.com/gpu.count": "8", "nvidia.com/mig-1g.10gb.count": None}}}
    assert label_patch(want, want) is None
    p = label_patch(want, want, inventory='{"v":2}', current_inventory='{"v":1}')
    assert p == {"metadata": {"annotations": {"gpufleet.io/gpu-inventory": '{"v":2}'}}}
    # DRA mode: no inventory; one left from device-plugin mode is removed
    assert label_patch(want, want, NO_INVENTORY, '{"v":1}') == {"metadata": {"annotations": {"gpufleet.io/gpu-inventory": None}}}
    assert label_patch(want, want, NO_INVENTORY, None) is None


class FakeCore:
    def __init__(self, labels=None, annotations=None, fail=False):
        self.labels, self.annotations, self.fail = dict(labels or {}), dict(annotations or {}), fail
        self.patches: list = []

    def read_node(self, name):
        if self.fail:
            raise RuntimeError("connection refused")
        return NS(metadata=NS(labels=dict(self.labels), annotations=dict(self.annotations)))

    def patch_node(self, name, body):
        self.patches.append((name, body))
        for k, v in body["metadata"].get("labels", {}).items():
            if v is None:
                self.labels.pop(k, None)
            else:
                self.labels[k] = v
        for k, v in body["metadata"].get("annotations", {}).items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v


def test_node_labeller_patches_only_on_change():
    be = FakeBackend("t4")
    want = desired_labels(be.driver(), be.gpus(), "mixed")
    core = FakeCore(labels={"kubernetes.io/hostname": "n1", "nvidia.com/gpu.replicas": "4"})
    lab = NodeLabeller(core, "n1")
    assert lab.sync(want, '{"gpus":[]}') is not None
    assert core.labels["nvidia.com/gpu.product"] == "Tesla-T4" and core.labels["nvidia.com/gpu.replicas"] == "1"
    assert core.labels["kubernetes.io/hostname"] == "n1" and core.annotations["gpufleet.io/gpu-inventory"] == '{"gpus":[]}'
    assert lab.sync(want, '{"gpus":[]}') is None and len(core.patches) == 1  # nothing changed: no write
    assert NodeLabeller(FakeCore(fail=True), "n1").sync(want, "{}") is None  # API away: logged, no exception
    json.dumps(core.patches)  # the patch is plain JSON


@pytest.mark.parametrize("taints, on, want", [
    ([], True, [{"key": "gpufleet.io/agent-restarting", "value": "true", "effect": "NoSchedule"}]),
    ([{"key": "a", "effect": "NoExecute"}], True,
     [{"key": "a", "effect": "NoExecute"}, {"key": "gpufleet.io/agent-restarting", "value": "true", "effect": "NoSchedule"}]),
    ([{"key": "gpufleet.io/agent-restarting", "value": "true", "effect": "NoSchedule"}], True, None),
    ([{"key": "a", "effect": "NoExecute"}, {"key": "gpufleet.io/agent-restarting", "effect": "NoSchedule"}], False,
     [{"key": "a", "effect": "NoExecute"}]),
    ([{"key": "a", "effect": "NoExecute"}], False, None),
])
def test_restart_taint_is_added_and_removed_leaving_other_taints(taints, on, want):
    from gpufleet.agent.labels import taints_with

    assert taints_with(taints, on) == want
