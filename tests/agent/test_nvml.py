"""Discovery: fake profiles, conversion to the engine's model and inventory, and the real backend's
NVML calls against a stub ``pynvml`` module (no GPU needed)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

from gpufleet.agent import nvml
from gpufleet.agent.labels import inventory_json
from gpufleet.agent.nvml import (FakeBackend, NoGpuError, NvmlBackend, arch_family, backend_spec, engine_gpus,
                                 mig_profile_name)
from gpufleet.engine.inventory import gpus_from_json
from gpufleet.engine.model import Gpu, MigInstance


def test_fake_profiles_are_realistic():
    a100 = FakeBackend("a100-mig").gpus()
    assert len(a100) == 8 and {g.name for g in a100} == {"NVIDIA A100-SXM4-80GB"} and a100[0].memory_mib == 81920
    assert [g.mig_enabled for g in a100] == [True, True] + [False] * 6 and all(g.mig_capable for g in a100)
    assert [m.profile for m in a100[1].mig] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    # one A100 has 7 compute and 8 memory slices: the instances must fit
    for g in a100[:2]:
        assert sum(int(m.profile.split("g.")[0]) for m in g.mig) <= 7 and sum(m.memory_mib for m in g.mig) <= g.memory_mib
    h100 = FakeBackend("h100-nvlink").gpus()
    assert all(len(g.nvlink_peers) == 7 and g.compute_capability == (9, 0) and g.family == "hopper" for g in h100)
    assert {g.numa_node for g in h100[:4]} == {0} and {g.numa_node for g in h100[4:]} == {1}
    t4 = FakeBackend("t4").gpus()
    assert len(t4) == 4 and t4[0].family == "turing" and not t4[0].mig_capable and not t4[0].nvlink_peers
    assert FakeBackend("t4").driver().cuda_version == (12, 2)
    with pytest.raises(ValueError, match="unknown fake GPU profile 'a100'"):
        FakeBackend("a100")


def test_discovery_converts_to_the_engine_model_and_inventory_round_trips():
    gpus = FakeBackend("a100-mig").gpus()
    eng = engine_gpus(gpus, {3: False})
    assert eng[0] == Gpu(0, "GPU-a100-00", "NVIDIA A100-SXM4-80GB", 81920, mig_enabled=True,
                         mig_instances=tuple(MigInstance("1g.10gb", 9728, k) for k in range(7)),
                         nvlink_peers=(1, 2, 3, 4, 5, 6, 7), healthy=True)
    assert eng[3].healthy is False
    back = gpus_from_json("node-a", inventory_json(gpus, {3: False}))
    assert back == eng  # what the scheduler reads is what the agent discovered


def test_fake_xid_injection_clearing_and_process_usage():
    be = FakeBackend("t4")
    be.inject_xid(1, 79, 10.0, device_broken=True)
    assert [(e.gpu_index, e.xid) for e in be.poll_xids()] == [(1, 79)] and be.poll_xids() == []
    assert not be.device_ok(1)
    be.clear_fault(1)
    assert be.device_ok(1)
    be.set_processes([nvml.ProcessUsage(10, 0, 2048, 40)])
    t = be.telemetry(0)
    assert t.fb_used_mib == 2048 and t.fb_free_mib == 15360 - 2048 and t.gpu_util_pct == 40


@pytest.mark.parametrize("cc,family", [((7, 0), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"), ((8, 6), "ampere"),
                                       ((8, 9), "ada-lovelace"), ((9, 0), "hopper"), ((10, 0), "blackwell"), ((6, 0), "pascal")])
def test_arch_family_matches_gfd(cc, family):
    assert arch_family(*cc) == family


@pytest.mark.parametrize("slices,mig_mib,gpu_mib,name", [
    (1, 9728, 81920, "1g.10gb"), (2, 19968, 81920, "2g.20gb"), (3, 40192, 81920, "3g.40gb"), (7, 80896, 81920, "7g.80gb"),
    (1, 4864, 40960, "1g.5gb"), (3, 19968, 40960, "3g.20gb"),  # A100-40GB
    (1, 5836, 24576, "1g.6gb"),  # A30
    (1, 9984, 81559, "1g.10gb"), (1, 19968, 81559, "1g.20gb"),  # H100
])
def test_mig_profile_names_follow_nvidia_smi(slices, mig_mib, gpu_mib, name):
    assert mig_profile_name(slices, mig_mib, gpu_mib) == name


def test_backend_choice_is_explicit():
    assert backend_spec(None, {}) is None  # real NVML by default
    assert backend_spec("fake:t4", {}) == "t4"
    assert backend_spec(None, {"GPUFLEET_FAKE_NVML": "h100-nvlink"}) == "h100-nvlink"
    assert backend_spec(None, {"GPUFLEET_NVML": "fake:a100-mig", "GPUFLEET_FAKE_NVML": "t4"}) == "a100-mig"
    assert backend_spec("real", {"GPUFLEET_FAKE_NVML": "t4"}) is None  # the flag wins
    for bad in ("fake:v100", "fake", "nvml"):
        with pytest.raises(ValueError, match="--nvml must be"):
            backend_spec(bad, {})


# --- the real backend against a stub pynvml ------------------------------------------------


class NVMLError(Exception):
    pass


def stub_pynvml(n_gpus=2, init_error=None, mig_gpu=None, nvswitch=False):
    """Enough of pynvml's surface for NvmlBackend: 2 A100s with one NVLink between them, GPU `mig_gpu` in MIG mode."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 4
    m.nvmlEventTypeXidCriticalError = 8
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    events: list = []
    m._events = events
    gpus = [NS(kind="gpu", i=i, bus=f"00000000:{0x10 + i:02X}:00.0") for i in range(n_gpus)]
    migs = [NS(kind="mig", parent=mig_gpu, k=k, gi=k + 7) for k in range(2)] if mig_gpu is not None else []

    def init():
        if init_error:
            raise NVMLError(init_error)

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: n_gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetUUID = lambda h: (f"GPU-stub-{h.i}" if h.kind == "gpu" else f"MIG-stub-{h.parent}-{h.k}").encode()
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    m.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB"
    m.nvmlDeviceGetMemoryInfo = lambda h: NS(total=(81920 if h.kind == "gpu" else 19968) * 2**20, used=0, free=0)
    m.nvmlDeviceGetPciInfo = lambda h: NS(busId=h.bus.encode())
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    m.nvmlDeviceGetNumaNodeId = lambda h: h.i

    def mig_mode(h):
        return (1 if h.i == mig_gpu else 0, 0)

    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h, k):
        if k >= len(migs):
            raise NVMLError("Not Found")
        return migs[k]

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetAttributes = lambda mh: NS(gpuInstanceSliceCount=2)
    m.nvmlDeviceGetGpuInstanceId = lambda mh: mh.gi

    def link_state(h, link):
        if link >= 2:
            raise NVMLError("Not Supported")
        return 1

    def remote(h, link):
        if nvswitch:
            return NS(busId=b"00000000:C0:00.0")  # an NVSwitch, not a GPU
        return NS(busId=gpus[(h.i + 1) % n_gpus].bus.lower().encode())

    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = remote
    m.nvmlEventSetCreate = lambda: "set"
    m.nvmlDeviceRegisterEvents = lambda h, t, s: None

    def wait(s, timeout_ms):
        if not events:
            raise NVMLError("Timeout")
        return events.pop(0)

    m.nvmlEventSetWait_v2 = wait
    return m, gpus


def test_real_backend_without_a_driver_is_a_clear_error(monkeypatch):
    stub, _ = stub_pynvml(init_error="Driver Not Loaded")
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    with pytest.raises(NoGpuError, match="no NVIDIA GPU/driver found: NVML init failed: Driver Not Loaded"):
        NvmlBackend()
    stub, _ = stub_pynvml(n_gpus=0)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    with pytest.raises(NoGpuError, match="0 devices"):
        NvmlBackend()


def test_real_backend_discovery_mig_nvlink_and_xids(monkeypatch):
    stub, handles = stub_pynvml(mig_gpu=1)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    assert be.driver() == nvml.DriverInfo("550.54.15", (12, 4))
    g0, g1 = be.gpus()
    assert (g0.uuid, g0.memory_mib, g0.family, g0.numa_node, g0.pci_bus_id) == ("GPU-stub-0", 81920, "ampere", 0, "00000000:10:00.0")
    assert g0.nvlink_peers == (1,) and g1.nvlink_peers == (0,)  # remote bus IDs matched case-insensitively
    assert g0.mig_capable and not g0.mig_enabled
    assert g1.mig_enabled and [(m.profile, m.memory_mib, m.instance_id, m.uuid) for m in g1.mig] == [
        ("2g.20gb", 19968, 7, "MIG-stub-1-0"), ("2g.20gb", 19968, 8, "MIG-stub-1-1")]
    stub._events.extend([NS(device=handles[1], eventType=8, eventData=79), NS(device=handles[0], eventType=2, eventData=0)])
    assert [(e.gpu_index, e.xid) for e in be.poll_xids()] == [(1, 79)]  # non-XID events are dropped
    assert be.device_ok(0)


def test_real_backend_nvswitch_means_all_to_all(monkeypatch):
    stub, _ = stub_pynvml(n_gpus=4, nvswitch=True)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    assert [g.nvlink_peers for g in NvmlBackend().gpus()] == [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]


def test_fake_backend_reads_processes_from_a_file(tmp_path, monkeypatch):
    import json as _json

    from gpufleet.agent.nvml import FakeBackend

    f = tmp_path / "procs.json"
    f.write_text(_json.dumps([{"pid": 11, "gpu": 2, "used_memory_mib": 1000, "sm_util_pct": 30},
                              {"pid": 12, "gpu": 2, "used_memory_mib": 500, "sm_util_pct": 20}]))
    monkeypatch.setenv("GPUFLEET_FAKE_PROCESSES", str(f))
    be = FakeBackend("a100-mig")
    assert [p.pid for p in be.processes()] == [11, 12]
    t = be.telemetry(2)
    assert (t.gpu_util_pct, t.fb_used_mib) == (50, 1500)
    f.write_text("[{half")
    assert be.processes() == []
