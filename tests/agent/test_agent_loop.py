"""The agent's loop driven step by step with a fake clock, against a fake kubelet over real unix sockets:
registration, XID -> Unhealthy -> recovery through ListAndWatch and the inventory, kubelet restart,
reconfiguration, clean stop."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.deviceplugin import api_pb2 as pb
from gpufleet.agent.labels import NodeLabeller
from gpufleet.agent.main import Agent, add_arguments, effective_config
from gpufleet.agent.nvml import FakeBackend
from gpufleet.engine.errors import ConfigError

from .conftest import FakeKubelet
from .test_labels import FakeCore


def health_of(msg):
    """GPU UUID -> health (a GPU's kubelet devices, ``<uuid>::<k>``, share it)."""
    out: dict[str, str] = {}
    for d in msg.devices:
        out.setdefault(d.ID.split("::")[0], d.health)
        assert out[d.ID.split("::")[0]] == d.health, "devices of one GPU disagree on its health"
    return out


def test_agent_loop_health_labels_kubelet_restart_and_reconfigure(sockdir, kubelet):
    be = FakeBackend("h100-nvlink")
    now = [1000.0]
    core = FakeCore()
    agent = Agent(be, AgentConfig(recover_after_s=60, label_interval_s=30), sockdir, os.path.join(sockdir, "st"),
                  labeller=NodeLabeller(core, "gpu-node-1"), clock=lambda: now[0])
    try:
        agent.step()
        assert [r.resource_name for r in kubelet.registered] == ["nvidia.com/gpu"]
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 8 * 10  # default sharesPerGpu 10
        ch.close()
        assert core.labels["nvidia.com/gpu.count"] == "8" and core.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        inv = json.loads(core.annotations["gpufleet.io/gpu-inventory"])
        assert len(inv["gpus"]) == 8 and all(g["healthy"] for g in inv["gpus"])
        assert (inv["gpu_slots"], inv["gpu_resource"]) == (10, "nvidia.com/gpu")
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        stream = stub.ListAndWatch(pb.Empty(), timeout=20)
        assert set(health_of(next(stream)).values()) == {"Healthy"}

        be.inject_xid(3, 31, now[0])  # page fault in someone's kernel: no change
        be.inject_xid(5, 48, now[0])  # double-bit ECC: unhealthy, though NVML still answers
        agent.step()
        h = health_of(next(stream))
        assert h["GPU-h100-05"] == "Unhealthy" and h["GPU-h100-03"] == "Healthy"
        now[0] += 31
        agent.step()  # labels round: the inventory tells the scheduler too
        assert [g["healthy"] for g in json.loads(core.annotations["gpufleet.io/gpu-inventory"])["gpus"]][5] is False
        now[0] += 30
        agent.step()  # 61 s without a fatal XID and NVML answers: healthy again
        assert health_of(next(stream))["GPU-h100-05"] == "Healthy"
        ch.close()

        # kubelet restarts: its socket is re-created, and it wiped ours
        kubelet.stop()
        os.unlink(agent.plugins[0].socket_path)
        agent.step()  # kubelet away: the plugin serves again, waits for kubelet
        k2 = FakeKubelet(sockdir).start()
        try:
            agent.step()
            assert [r.resource_name for r in k2.registered] == ["nvidia.com/gpu"]
            # new config (time-slicing, renamed): plugins rebuilt, registered under the new name
            agent.reconfigure(AgentConfig(replicas=2, shares_per_gpu=2, rename_shared=True, recover_after_s=60))
            agent.step()
            assert k2.registered[-1].resource_name == "nvidia.com/gpu.shared"
            ch, stub = k2.plugin("nvidia.com/gpu.shared")
            assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 16
            ch.close()
            assert core.labels["nvidia.com/gpu.replicas"] == "2"
        finally:
            k2.stop()
    finally:
        agent.stop_plugins()
    assert not [f for f in os.listdir(sockdir) if f.endswith(".sock")]


def test_flags_win_over_the_config_file():
    p = argparse.ArgumentParser()
    add_arguments(p)
    file_cfg = AgentConfig(mig_strategy="single", replicas=4, recover_after_s=10)
    cfg = effective_config(p.parse_args(["--replicas", "2"]), file_cfg)
    assert (cfg.mig_strategy, cfg.replicas, cfg.recover_after_s) == ("single", 2, 10)
    assert effective_config(p.parse_args([]), None) == AgentConfig()
    with pytest.raises(ConfigError, match="replicas must be"):
        effective_config(p.parse_args(["--replicas", "0"]), None)


def test_mig_repartition_is_rediscovered_and_advertised(sockdir, kubelet):
    from dataclasses import replace

    from gpufleet.agent.nvml import MigInfo

    be = FakeBackend("a100-mig")
    now = [0.0]
    agent = Agent(be, AgentConfig(), sockdir, os.path.join(sockdir, "st"), clock=lambda: now[0], rediscover_s=60)
    try:
        agent.step()
        assert sorted(r.resource_name for r in kubelet.registered) == [
            "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
        # an operator re-partitions GPU 2 into 7x 1g.10gb (mig-parted): the next discovery sees it
        g = be.gpus()
        g[2] = replace(g[2], mig_enabled=True, mig=tuple(MigInfo("1g.10gb", 9728, k, f"MIG-a100-2-{k}") for k in range(7)))
        be.set_gpus(g)
        n = len(kubelet.registered)
        now[0] = 30.0
        agent.step()
        assert len(kubelet.registered) == n  # not yet: discovery runs every 60 s
        now[0] = 61.0
        agent.step()
        assert len(kubelet.registered) == n + 4
        ch, stub = kubelet.plugin("nvidia.com/mig-1g.10gb")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 14
        ch.close()
        ch, stub = kubelet.plugin("nvidia.com/gpu")
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 5 * 10  # GPU 2 is no longer whole
        ch.close()
    finally:
        agent.stop_plugins()


def test_register_alone_reregisters_a_restarted_kubelet_and_counts_refusals(sockdir, kubelet):
    # run() calls register() every KUBELET_POLL_S between rounds: kubelet admits its pods at once after a restart
    agent = Agent(FakeBackend("h100-nvlink"), AgentConfig(), sockdir, os.path.join(sockdir, "st"), clock=lambda: 0.0)
    try:
        agent.register()
        assert [r.resource_name for r in kubelet.registered] == ["nvidia.com/gpu"]
        agent.register()
        assert len(kubelet.registered) == 1  # nothing changed: no second registration
        kubelet.stop()
        os.unlink(agent.plugins[0].socket_path)
        agent.register()  # kubelet away: the plugin serves again and waits
        assert agent.plugins[0].serving() and agent.register_failures == 0
        k2 = FakeKubelet(sockdir).start()
        try:
            agent.register()
            assert [r.resource_name for r in k2.registered] == ["nvidia.com/gpu"] and agent.register_failures == 0
        finally:
            k2.stop()
        open(os.path.join(sockdir, "kubelet.sock"), "w").close()  # a socket nobody answers: refused, counted
        agent.register()
        assert agent.register_failures == 1 and agent.kubelet_pending()
    finally:
        agent.stop_plugins()


def test_each_registration_is_announced_on_the_node_and_a_failed_write_retried(sockdir, kubelet):
    # kube/plugin_down holds GPU pods off a node where kubelet refused one for a dead plugin until this says it is back
    said: list[str] = []
    api_up = [False]

    def announce(when: str) -> bool:
        if api_up[0]:
            said.append(when)
        return api_up[0]
    agent = Agent(FakeBackend("h100-nvlink"), AgentConfig(), sockdir, os.path.join(sockdir, "st"), clock=lambda: 0.0)
    agent.announce = announce
    try:
        agent.register()
        assert len(kubelet.registered) == 1 and said == [] and agent.registered_at  # the API away: kept
        when = agent.registered_at
        agent.register()
        assert said == []  # not retried every KUBELET_POLL_S
        api_up[0] = True
        agent.step()  # the round retries it
        assert said == [when] and agent.registered_at is None
        assert when.endswith("Z") and len(when) == len("2026-11-27T05:10:00.123Z")
        agent.step()
        assert said == [when]  # once per registration
        kubelet.stop()
        k2 = FakeKubelet(sockdir).start()
        try:
            agent.register()  # a restarted kubelet: registered again, announced again at once
            assert len(said) == 2 and said[1] >= when
        finally:
            k2.stop()
    finally:
        agent.stop_plugins()
