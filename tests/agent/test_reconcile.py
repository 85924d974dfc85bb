"""The agent records kubelet's GPUs of pods another scheduler bound (pure part, table-driven)."""

from __future__ import annotations

import json

import pytest

from gpufleet.agent.exporter import ContainerRef
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.reconcile import kubelet_assignments

GPUS = FakeBackend("a100-mig").gpus()


def pod(name, node="n1", annotations=None, phase="Running"):
    return {"metadata": {"name": name, "namespace": "x", "annotations": annotations or {}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def ref(name):
    return ContainerRef("x", name, "c")


@pytest.mark.parametrize("holders, pods, want", [
    # alone on GPU 5: the whole GPU
    ({"GPU-a100-05": [ref("f")]}, [pod("f")], {"f": ([5], 1000, None)}),
    # two GPUs, both alone
    ({"GPU-a100-03": [ref("f")], "GPU-a100-04": [ref("f")]}, [pod("f")], {"f": ([3, 4], 1000, None)}),
    # GPU 2 also holds a gpufleet share: one device there, no compute/memory counted
    ({"GPU-a100-02": [ref("f"), ref("s")]}, [pod("f"), pod("s", annotations={"gpufleet.io/assignment": "{}"})],
     {"f": ([2], 0, None)}),
    # a MIG instance
    ({"MIG-a100-1-0": [ref("m")]}, [pod("m")], {"m": ([], 0, [[1, 0]])}),
    # already has an assignment, other node, finished, holds nothing: nothing to record
    ({"GPU-a100-05": [ref("a")]}, [pod("a", annotations={"gpufleet.io/assignment": "{}"})], {}),
    ({"GPU-a100-05": [ref("o")]}, [pod("o", node="n2")], {}),
    ({"GPU-a100-05": [ref("d")]}, [pod("d", phase="Succeeded")], {}),
    ({}, [pod("idle")], {}),
])
def test_kubelet_assignments(holders, pods, want):
    got = kubelet_assignments("n1", GPUS, holders, pods)
    assert sorted(k[1] for k in got) == sorted(want)
    for (_, name), text in got.items():
        d = json.loads(text)
        idx, milli, mig = want[name]
        assert d["source"] == "kubelet" and d["node"] == "n1"
        assert [g["index"] for g in d["gpus"]] == idx and d["gpu_milli"] == milli
        assert [[m["gpu"], m["instance_id"]] for m in d.get("mig", [])] == (mig or [])
        if idx:
            assert [g["uuid"] for g in d["gpus"]] == [f"GPU-a100-{i:02d}" for i in idx]
