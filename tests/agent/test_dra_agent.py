"""The agent's loop in DRA mode: no device plugin, slices published, an XID taints the device until recovery."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions
from gpufleet.agent.dra.driver import DraDriver
from gpufleet.agent.labels import NodeLabeller
from gpufleet.agent.main import Agent
from gpufleet.agent.nvml import FakeBackend

from .dra_fake import FakeDraApi
from .test_labels import FakeCore


def taints(api: FakeDraApi) -> dict[str, list]:
    (s,) = api.slices.values()
    return {d["name"]: d["taints"] for d in s["spec"]["devices"] if d.get("taints")}


def test_agent_in_dra_mode_publishes_taints_a_faulty_gpu_and_untaints_it_on_recovery(sockdir, kubelet):
    root = Path(sockdir)
    be = FakeBackend("h100-nvlink")
    now = [1_700_000_000.0]
    api = FakeDraApi()
    dra = DraDriver(api, "node-a", DraOptions(), str(root / "st"), CdiWriter(str(root / "cdi")),
                    plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"), clock=lambda: now[0])
    dra.events.api = None
    core = FakeCore(annotations={"gpufleet.io/gpu-inventory": '{"gpus": []}'})  # left from device-plugin mode
    agent = Agent(be, AgentConfig(recover_after_s=60), sockdir, str(root / "st"), clock=lambda: now[0], dra=dra,
                  labeller=NodeLabeller(core, "node-a"))
    dra.start()
    try:
        agent.step()
        agent.step()  # the first step's health round set the devices; this one publishes them
        assert agent.plugins == [] and kubelet.registered == []  # no device plugin next to the DRA driver
        assert core.labels["nvidia.com/gpu.count"] == "8" and "gpufleet.io/gpu-inventory" not in core.annotations
        (s,) = api.slices.values()
        assert [d["name"] for d in s["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
        assert taints(api) == {}
        be.inject_xid(3, 31, now[0])  # an application's fault: no taint
        be.inject_xid(5, 79, now[0])  # fallen off the bus
        agent.step()
        agent.step()
        assert taints(api) == {"gpu-5": [{"key": "gpu.gpufleet.io/xid", "value": "79", "effect": "NoSchedule",
                                          "timeAdded": "2023-11-14T22:13:20Z"}]}
        gen = s["spec"]["pool"]["generation"]
        now[0] += 30
        agent.step()
        agent.step()
        (s,) = api.slices.values()
        assert s["spec"]["pool"]["generation"] == gen + 1 and taints(api)["gpu-5"][0]["timeAdded"] == "2023-11-14T22:13:20Z"
        now[0] += 61  # no fatal XID for recover_after_s: healthy again, taint gone
        agent.step()
        agent.step()
        assert taints(api) == {}
    finally:
        agent.stop_plugins()
        dra.stop()


def test_dra_mode_needs_a_node_name_and_once_prints_the_devices(tmp_path):
    env = dict(os.environ, NODE_NAME="")
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "agent", "--dra", "--nvml", "fake:t4", "--metrics-addr", "",
                        "--state-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--dra needs --node-name" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "agent", "--dra", "--nvml", "fake:t4", "--once"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["driver"] == "gpu.gpufleet.io" and [d["name"] for d in out["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert "FAKE NVML" in r.stderr
