"""The DRA driver on an API server that drops gated fields (Kubernetes 1.35 by default): no shares, no taints published.

The fake API server strips ``allowMultipleAllocations`` / ``requestPolicy`` and ``taints`` from what it stores, as
kube-apiserver does when DRAConsumableCapacity / DRADeviceTaints are off; the driver must find out (dry-run probe, and
the slices it writes), say so once (log + Node Event naming the gate) and publish what allocators can honour.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpufleet.agent.dra.cdi import CdiWriter
from gpufleet.agent.dra.devices import DraOptions, build_devices
from gpufleet.agent.dra.driver import PROBE_RETRY_S, DraDriver
from gpufleet.agent.dra.features import CONSUMABLE_CAPACITY, DEVICE_TAINTS, Served, lost, probe_slice, served_by_probe
from gpufleet.agent.dra.prepare import PrepareError
from gpufleet.agent.nvml import PROFILES

from .dra_fake import FakeDraApi, claim, result


def driver(root: Path, api: FakeDraApi, now: list[float], profile: str = "a100-mig", **opts) -> DraDriver:
    d = DraDriver(api, "node-a", DraOptions(**opts), str(root / "st"), CdiWriter(str(root / "cdi")),
                  plugins_dir=str(root / "plugins"), registry_dir=str(root / "reg"), clock=lambda: now[0], resync_s=300)
    drv, gpus = PROFILES[profile]
    d.update(gpus, drv, {g.index: True for g in gpus}, {})
    return d


def devices(api: FakeDraApi) -> dict[str, dict]:
    (s,) = api.slices.values()
    return {d["name"]: d for d in s["spec"]["devices"]}


def node_events(api: FakeDraApi, d: DraDriver) -> list[tuple[str, str, str]]:
    # the sink posts on a thread; its own record is synchronous
    return [(t, r, n) for reg, t, r, n in d.events.posted if reg.get("kind") == "Node"]


def test_on_a_server_that_serves_everything_nothing_changes_and_nothing_is_said(sockdir):
    api, now = FakeDraApi(), [1000.0]
    d = driver(Path(sockdir), api, now)
    try:
        d.step()
        assert d.served == Served() and d.served_known
        devs = devices(api)
        assert devs["gpu-2"]["allowMultipleAllocations"] is True and "gpuMilli" in devs["gpu-2"]["capacity"]
        assert node_events(api, d) == [] and api.calls["probe_slice"] == 1
        d.step()
        assert api.calls["probe_slice"] == 1  # the next probe only after resync_s
        now[0] += 300
        d.step()
        assert api.calls["probe_slice"] == 2 and api.calls["create_slice"] == 1
    finally:
        d.stop()


def test_a_1_35_server_gets_exclusive_gpus_and_a_node_event_per_missing_gate(sockdir, caplog):
    api, now = FakeDraApi(), [1000.0]
    api.drops = {"consumable-capacity", "taints"}
    d = driver(Path(sockdir), api, now)
    try:
        with caplog.at_level(logging.WARNING, logger="gpufleet.agent.dra"):
            d.step()
        assert d.served == Served(False, False)
        devs = devices(api)
        assert len(devs) == 16
        assert not any("allowMultipleAllocations" in x for x in devs.values())
        assert set(devs["gpu-2"]["capacity"]) == {"memory", "gpu.nvidia.com/memory"}  # no gpuMilli: nothing to share
        assert not any("requestPolicy" in c for x in devs.values() for c in x["capacity"].values())
        assert api.calls["create_slice"] == 1  # decided before the first write: never published as shares
        assert not any(p.shareable for p in d.devices.published.values())
        evs = node_events(api, d)
        assert [(t, r) for t, r, _ in evs] == [("Warning", "DRAFeatureNotServed")] * 2
        cc = next(n for _, _, n in evs if "DRAConsumableCapacity" in n)
        assert "allowMultipleAllocations" in cc and "--feature-gates=DRAConsumableCapacity=true" in cc
        assert "kube-apiserver and kube-scheduler" in cc and "exclusive" in cc
        dt = next(n for _, _, n in evs if "DRADeviceTaints" in n)
        assert "spec.devices[].taints" in dt and "left out" in dt
        (reg, *_), = [e for e in d.events.posted if "DRAConsumableCapacity" in e[3]]
        assert reg == {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid-1"}
        assert sum("DRAConsumableCapacity" in r.getMessage() for r in caplog.records) == 1
        d.step()
        now[0] += 300
        d.step()  # probed again, still missing: said once only
        assert len(node_events(api, d)) == 2 and api.calls["probe_slice"] == 2
    finally:
        d.stop()


def test_without_taints_an_unhealthy_gpu_leaves_the_slice_and_comes_back_on_recovery(sockdir):
    api, now = FakeDraApi(), [1000.0]
    api.drops = {"consumable-capacity", "taints"}
    d = driver(Path(sockdir), api, now)
    drv, gpus = PROFILES["a100-mig"]
    try:
        d.step()
        d.update(gpus, drv, {g.index: g.index not in (1, 4) for g in gpus}, {1: "XID 79", 4: "NVML cannot query the device"})
        d.step()
        names = set(devices(api))
        assert "gpu-4" not in names and not any(n.startswith("gpu-1-") for n in names) and "gpu-5" in names
        assert len(names) == 16 - 1 - 3
        # kubelet still gets an answer for the device: refused as unhealthy, not as unknown
        api.add_claim(claim("c", "uid-c", [result("gpu-4")]))
        with pytest.raises(PrepareError) as e:
            d.preparer.prepare("default", "uid-c", "c")
        assert e.value.reason == "DeviceUnhealthy"
        d.update(gpus, drv, {g.index: True for g in gpus}, {})
        d.step()
        assert len(devices(api)) == 16 and not any(x.get("taints") for x in devices(api).values())
    finally:
        d.stop()


def test_a_server_that_refuses_dry_runs_is_found_out_by_the_first_write(sockdir):
    api, now = FakeDraApi(), [1000.0]
    api.drops, api.probe_fails = {"consumable-capacity"}, True
    d = driver(Path(sockdir), api, now)
    try:
        d.step()
        assert not d.served.consumable_capacity and d.served.device_taints  # taints never written yet: not judged
        assert not any("allowMultipleAllocations" in x for x in devices(api).values())
        assert "gpuMilli" not in devices(api)["gpu-2"]["capacity"]  # republished in the same step
        assert api.calls["create_slice"] == 1 and api.calls["update_slice"] == 1
        assert [r for _, r, _ in node_events(api, d)] == ["DRAFeatureNotServed"]
        d.step()
        assert api.calls["probe_slice"] == 1  # a failed probe is retried after PROBE_RETRY_S, not every step
        now[0] += PROBE_RETRY_S
        d.step()
        assert api.calls["probe_slice"] == 2
    finally:
        d.stop()


def test_a_control_plane_upgraded_to_serve_the_gates_gets_shares_back(sockdir):
    api, now = FakeDraApi(), [1000.0]
    api.drops = {"consumable-capacity", "taints"}
    d = driver(Path(sockdir), api, now)
    try:
        d.step()
        assert not d.served.consumable_capacity
        api.drops = set()  # kube-apiserver upgraded to 1.36 (or the gates turned on)
        now[0] += 300
        d.step()
        assert d.served == Served()
        assert devices(api)["gpu-2"]["allowMultipleAllocations"] is True
        assert [r for t, r, _ in node_events(api, d) if t == "Normal"] == ["DRAFeatureServed"] * 2
    finally:
        d.stop()


def test_without_shares_asked_for_only_the_taints_are_reported(sockdir):
    api, now = FakeDraApi(), [1000.0]
    api.drops = {"consumable-capacity", "taints"}
    d = driver(Path(sockdir), api, now, shares=False)
    try:
        d.step()
        evs = node_events(api, d)
        assert len(evs) == 1 and "DRADeviceTaints" in evs[0][2]
    finally:
        d.stop()


def test_probe_and_lost_fields():
    sent = probe_slice("node-a", "gpu.gpufleet.io")
    dev = sent["spec"]["devices"][0]
    assert dev["allowMultipleAllocations"] and dev["taints"] and "requestPolicy" in dev["capacity"]["memory"]
    assert served_by_probe(sent, sent) == Served()
    stripped = {"spec": {"devices": [{"name": "probe", "capacity": {"memory": {"value": "1Gi"}}}]}}
    assert served_by_probe(sent, stripped) == Served(False, False)
    with pytest.raises(ValueError):
        served_by_probe(sent, {"spec": {}})
    drv, gpus = PROFILES["a100-mig"]
    devs = build_devices(gpus, drv, DraOptions()).devices
    assert lost(devs, devs) == []
    assert lost(devs, [{k: v for k, v in x.items() if k != "allowMultipleAllocations"} for x in devs]) == [CONSUMABLE_CAPACITY]
    tainted = [dict(x, taints=[{"key": "k", "effect": "NoSchedule"}]) for x in devs]
    assert lost(tainted, devs) == [DEVICE_TAINTS]
