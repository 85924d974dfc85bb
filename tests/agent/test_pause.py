"""The test-only pause points the fault drills kill the agent at: off without the variable, one pause per arming,
and placed after the checkpoint records the result and before kubelet gets it."""

from __future__ import annotations

import json

from gpufleet.agent import pause as pause_mod
from gpufleet.agent.dra.server import DraService
from gpufleet.agent.dra import dra_v1_pb2 as dpb
from gpufleet.agent.nvml import FakeBackend
from gpufleet.agent.plugin import DevicePlugin, PodAssignment
from gpufleet.engine.model import Assignment

from .test_dra_prepare import Node
from .dra_fake import result


class Ctx:
    def abort(self, code, msg):  # pragma: no cover - not reached in these tests
        raise AssertionError(msg)


def test_off_without_the_variable_and_one_pause_per_arming(tmp_path, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(pause_mod, "_sleep", slept.append)
    monkeypatch.delenv(pause_mod.ENV, raising=False)
    (tmp_path / "allocate").write_text("7")
    assert pause_mod.pause("allocate", "ml/a") == 0 and slept == []  # armed, but the agent was not told to look
    monkeypatch.setenv(pause_mod.ENV, str(tmp_path))
    assert pause_mod.pause("prepare", "x") == 0  # another point is not armed
    assert pause_mod.pause("allocate", "ml/a") == 7 and slept == [7]
    assert (tmp_path / "allocate.paused").read_text() == "ml/a" and not (tmp_path / "allocate").exists()
    assert pause_mod.pause("allocate", "ml/b") == 0 and slept == [7]  # disarmed by the first call
    (tmp_path / "allocate").write_text("soon")
    assert pause_mod.pause("allocate", "ml/c") == 0 and slept == [7]  # not seconds: logged, no pause


def test_allocate_pauses_after_its_checkpoint_before_its_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(pause_mod.ENV, str(tmp_path / "pause"))
    (tmp_path / "pause").mkdir()
    (tmp_path / "pause" / "allocate").write_text("30")
    gpus = FakeBackend("h100-nvlink").gpus()
    pa = PodAssignment("ml/train", Assignment("ml/train", "n", 0, 0, gpu_indices=(3,), gpu_milli=1000, gpu_memory_mib=(0,)), ["GPU-h100-03"], uid="u1")

    class Src:
        def pending_assignment(self, resource, count, exclude):
            return None if pa.served_key in exclude else pa

    p = DevicePlugin("nvidia.com/gpu", gpus, str(tmp_path), pods=Src(), slots=10, state_dir=str(tmp_path / "state"))
    seen: list[dict] = []
    monkeypatch.setattr(pause_mod, "_sleep", lambda s: seen.append(json.loads(p.checkpoint.read_text())["pods"]))
    resp = p.allocate_one(["GPU-h100-00::0"])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-h100-03"
    assert seen and seen[0]["ml/train#u1"]["uuids"] == ["GPU-h100-03"]  # recorded when the pause began
    assert (tmp_path / "pause" / "allocate.paused").read_text() == "ml/train"


def test_prepare_pauses_after_its_checkpoint_before_its_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(pause_mod.ENV, str(tmp_path / "pause"))
    (tmp_path / "pause").mkdir()
    (tmp_path / "pause" / "prepare").write_text("30")
    n = Node(tmp_path)
    n.add("c1", "uid-1", [result("gpu-3")])
    seen: list[dict] = []
    monkeypatch.setattr(pause_mod, "_sleep", lambda s: seen.append(json.loads((tmp_path / "state" / "dra.json").read_text())))
    out = DraService(n.p).NodePrepareResources(dpb.NodePrepareResourcesRequest(claims=[
        dpb.Claim(namespace="default", uid="uid-1", name="c1")]), Ctx())
    assert [d.device_name for d in out.claims["uid-1"].devices] == ["gpu-3"]
    assert seen and seen[0]["claims"]["uid-1"]["devices"][0]["device"] == "gpu-3"
    assert (tmp_path / "pause" / "prepare.paused").read_text() == "default/c1 (uid-1)"
