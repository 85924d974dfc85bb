"""Discovery: fake profiles, conversion to the engine's model and inventory, and the real backend's
NVML calls against a stub ``pynvml`` module (no GPU needed)."""

from __future__ import annotations

import sys
import threading
import time
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
    t0 = time.monotonic()
    assert be.poll_xids(timeout_ms=200) == [] and time.monotonic() - t0 >= 0.19  # waits like NVML's event wait
    threading.Timer(0.05, be.inject_xid, (2, 48, 11.0)).start()
    assert [(e.gpu_index, e.xid) for e in be.poll_xids(timeout_ms=5000)] == [(2, 48)]  # and returns on the event
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
    """pynvml's error: the NVML return code in ``value``."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, TIMEOUT, FUNCTION_NOT_FOUND, GPU_IS_LOST = 3, 4, 6, 10, 13, 15
MIB = 2**20


def stub_pynvml(n_gpus=2, init_error=None, mig_gpu=None, nvswitch=False, device_type=True, minors=None):
    """Enough of pynvml's surface for NvmlBackend: A100s with one NVLink to the next, GPU `mig_gpu` in MIG mode.

    ``m.state`` lets a test change what NVML answers: reserved memory, memory v2 missing, per-process samples,
    XID support per GPU, failures of the event set, the event wait, or a whole GPU.
    """
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_ERROR_NOT_SUPPORTED, m.NVML_ERROR_NO_PERMISSION, m.NVML_ERROR_NOT_FOUND = NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND
    m.NVML_ERROR_TIMEOUT, m.NVML_ERROR_FUNCTION_NOT_FOUND = TIMEOUT, FUNCTION_NOT_FOUND
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 4
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.nvmlEventTypeXidCriticalError = 8
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    m.nvmlMemory_v2 = 0x02000028
    st = NS(reserved_mib=300, used_mib=1000, mem_v2=True, samples={}, since=[], no_xid=set(), set_error=None,
            wait_error=None, waits=[], lost=set(), registered=[])
    m.state = st
    events: list = []
    m._events = events
    gpus = [NS(kind="gpu", i=i, bus=f"00000000:{0x10 + i:02X}:00.0") for i in range(n_gpus)]
    migs = [NS(kind="mig", parent=mig_gpu, k=k, gi=k + 7) for k in range(2)] if mig_gpu is not None else []

    def check(h):
        if h.kind == "gpu" and h.i in st.lost:
            raise NVMLError(GPU_IS_LOST)

    def init():
        if init_error:
            raise NVMLError(init_error)

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: n_gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetUUID = lambda h: (f"GPU-stub-{h.i}" if h.kind == "gpu" else f"MIG-stub-{h.parent}-{h.k}").encode()
    m.nvmlDeviceGetMinorNumber = lambda h: (minors or list(range(n_gpus)))[h.i]

    def brand(h):
        if h.i >= 1:
            raise NVMLError(NOT_SUPPORTED)
        return 14  # NVML_BRAND_NVIDIA

    m.nvmlDeviceGetBrand = brand
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    m.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB"

    def memory(h, version=None):
        check(h)
        total = (81920 if h.kind == "gpu" else 19968) * MIB
        if version is None:  # v1: the driver's reserved memory counts as used
            used = (st.used_mib + st.reserved_mib) * MIB
            return NS(total=total, used=used, free=total - used)
        if not st.mem_v2:
            raise NVMLError(FUNCTION_NOT_FOUND)
        return NS(version=version, total=total, reserved=st.reserved_mib * MIB, used=st.used_mib * MIB,
                  free=total - (st.used_mib + st.reserved_mib) * MIB)

    m.nvmlDeviceGetMemoryInfo = memory
    m.nvmlDeviceGetPciInfo = lambda h: NS(busId=h.bus.encode())
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    m.nvmlDeviceGetNumaNodeId = lambda h: h.i

    def mig_mode(h):
        if h.i >= 2:
            raise NVMLError(NOT_SUPPORTED)  # a GPU that cannot do MIG
        return (1 if h.i == mig_gpu else 0, 0)

    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h, k):
        if k >= len(migs):
            raise NVMLError(NOT_FOUND)
        return migs[k]

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetAttributes = lambda mh: NS(gpuInstanceSliceCount=2, memorySizeMB=19968)
    m.nvmlDeviceGetGpuInstanceId = lambda mh: mh.gi

    def link_state(h, link):
        if link >= 2:
            raise NVMLError(NOT_SUPPORTED)
        return 1

    def remote(h, link):
        if nvswitch and h.i in nvswitch:
            return NS(busId=b"00000000:C0:00.0")  # an NVSwitch, not a GPU
        return NS(busId=gpus[(h.i + 1) % n_gpus].bus.lower().replace("00000000:", "0000:").encode())

    def remote_type(h, link):
        if not device_type:
            raise NVMLError(FUNCTION_NOT_FOUND)
        return 2 if nvswitch and h.i in nvswitch else 0

    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = remote
    m.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type

    def create_set():
        if st.set_error:
            raise NVMLError(st.set_error)
        return "set"

    m.nvmlEventSetCreate = create_set
    m.nvmlDeviceGetSupportedEventTypes = lambda h: 0x2 if h.i in st.no_xid else 0xA

    def register(h, t, s):
        st.registered.append((h.i, t))

    m.nvmlDeviceRegisterEvents = register

    def wait(s, timeout_ms):
        st.waits.append(timeout_ms)
        if st.wait_error:
            raise NVMLError(st.wait_error)
        if not events:
            raise NVMLError(TIMEOUT)
        return events.pop(0)

    m.nvmlEventSetWait_v2 = wait

    def util_rates(h):
        check(h)
        if h.i == mig_gpu:
            raise NVMLError(NOT_SUPPORTED)  # no utilisation figure for a GPU in MIG mode
        return NS(gpu=97, memory=40)

    m.nvmlDeviceGetUtilizationRates = util_rates
    m.nvmlDeviceGetTemperature = lambda h, sensor: 41
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500  # milliwatts
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1410
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [NS(pid=100 + h.i, usedGpuMemory=(4096 + h.i) * MIB),
                                                         NS(pid=200, usedGpuMemory=None)]

    def proc_util(h, since):
        st.since.append(since)
        found = [s for s in st.samples.get(h.i, []) if s.timeStamp > since]
        if not found:
            raise NVMLError(NOT_FOUND)
        return found

    m.nvmlDeviceGetProcessUtilization = proc_util
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
    # remote bus IDs matched as PCI addresses (case and domain width may differ from the local ones)
    assert g0.nvlink_peers == (1,) and g1.nvlink_peers == (0,)
    assert g0.mig_capable and not g0.mig_enabled
    assert g1.mig_enabled and [(m.profile, m.memory_mib, m.instance_id, m.uuid) for m in g1.mig] == [
        ("2g.20gb", 19968, 7, "MIG-stub-1-0"), ("2g.20gb", 19968, 8, "MIG-stub-1-1")]
    stub._events.extend([NS(device=handles[1], eventType=8, eventData=79), NS(device=handles[0], eventType=2, eventData=0)])
    assert [(e.gpu_index, e.xid) for e in be.poll_xids()] == [(1, 79)]  # non-XID events are dropped
    assert be.device_ok(0)


@pytest.mark.parametrize("device_type", [True, False])
def test_real_backend_nvswitch_means_all_to_all_among_switched_gpus(monkeypatch, device_type):
    stub, _ = stub_pynvml(n_gpus=4, nvswitch={0, 1, 2, 3}, device_type=device_type)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    assert [g.nvlink_peers for g in NvmlBackend().gpus()] == [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]
    # GPUs 0-2 on switches, GPU 3 only on a direct link to GPU 0: not everyone's peer
    stub, _ = stub_pynvml(n_gpus=4, nvswitch={0, 1, 2})
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    assert [g.nvlink_peers for g in NvmlBackend().gpus()] == [(1, 2), (0, 2), (0, 1), (0,)]


def test_real_backend_memory_follows_nvidia_smi_reserved_apart(monkeypatch):
    stub, _ = stub_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    t = be.telemetry(0)
    assert (t.fb_used_mib, t.fb_free_mib) == (1000, 81920 - 1300)  # 300 MiB reserved: neither used nor free
    assert (t.gpu_util_pct, t.mem_copy_util_pct, t.temp_c, t.power_w, t.sm_clock_mhz) == (97, 40, 41, 312.5, 1410)
    stub.state.mem_v2 = False  # an older driver: v1, reserved counted as used
    be = NvmlBackend()
    assert be.telemetry(0).fb_used_mib == 1300 and be.gpus()[0].memory_mib == 81920


def test_real_backend_telemetry_of_a_mig_gpu_leaves_out_what_it_cannot_report(monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.agent.exporter import GpuCollector

    stub, _ = stub_pynvml(mig_gpu=1)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    t = be.telemetry(1)
    assert t.gpu_util_pct is None and t.mem_copy_util_pct is None and t.fb_used_mib == 1000 and t.power_w == 312.5
    reg = CollectorRegistry()
    reg.register(GpuCollector(be, "node-a"))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    util = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples}
    power = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_POWER_USAGE"].samples}
    assert util == {"0": 97.0} and power == {"0": 312.5, "1": 312.5}  # GPU 1 still reports, without utilisation


def test_real_backend_process_utilisation_uses_recent_samples_only(monkeypatch):
    stub, _ = stub_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    now = 1_000_000.0
    monkeypatch.setattr(nvml.time, "time", lambda: now)
    now_us = int(now * 1e6)
    s = lambda pid, age_s, util: NS(pid=pid, timeStamp=now_us - int(age_s * 1e6), smUtil=util, memUtil=0)  # noqa: E731
    # the buffer, in no order: pid 100 busy lately (90, 70) after an idle spell; an old sample of pid 200
    stub.state.samples = {0: [s(100, 1.0, 90), s(100, 20.0, 0), s(200, 30.0, 55), s(100, 0.5, 70), s(100, 10.0, 0)]}
    be = NvmlBackend()
    procs = {(p.gpu_index, p.pid): p for p in be.processes()}
    assert (procs[(0, 100)].sm_util_pct, procs[(0, 100)].used_memory_mib) == (80, 4096)  # mean of the last 3 s
    assert procs[(0, 200)].sm_util_pct == 0 and procs[(0, 200)].used_memory_mib == 0  # memory unknown (None)
    assert procs[(1, 101)].sm_util_pct == 0  # NOT_FOUND: no sample, no activity
    assert stub.state.since[:2] == [0, 0]
    now += 5.0  # the next call asks only for samples of the new window
    be.processes()
    assert stub.state.since[2] == now_us - 3_000_000
    # a host whose samples carry another clock (far from time.time()): the window ends at the newest sample
    stub.state.samples = {0: [NS(pid=100, timeStamp=5_000_000, smUtil=10), NS(pid=100, timeStamp=9_000_000, smUtil=30),
                              NS(pid=100, timeStamp=8_500_000, smUtil=50)]}
    be = NvmlBackend()
    assert {p.pid: p.sm_util_pct for p in be.processes() if p.gpu_index == 0}[100] == 40


def test_real_backend_xid_listener_registers_what_each_gpu_supports_and_waits(monkeypatch):
    stub, handles = stub_pynvml(n_gpus=3)
    stub.state.no_xid = {2}
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    assert be.poll_xids(timeout_ms=1500) == []
    assert be.xid_watch == {0: "watched", 1: "watched", 2: "this GPU reports no XID events"}
    assert stub.state.registered == [(0, 8), (1, 8)] and stub.state.waits == [1500]
    stub._events.extend([NS(device=handles[0], eventType=8, eventData=48), NS(device=handles[1], eventType=8, eventData=13)])
    assert [(e.gpu_index, e.xid) for e in be.poll_xids(timeout_ms=1000)] == [(0, 48), (1, 13)]
    assert stub.state.waits[1:] == [1000, 0, 0]  # only the first wait waits


def test_real_backend_xid_failures_do_not_stop_the_health_loop(monkeypatch, caplog):
    from gpufleet.agent.health import HealthTracker

    stub, _ = stub_pynvml()
    stub.state.set_error = NOT_SUPPORTED  # no event set at all (some virtualised GPUs)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    tracker = HealthTracker(be, clock=lambda: 100.0)
    assert tracker.update() == {0: True, 1: True} and be.xid_watch[0].startswith("no NVML event set")
    stub.state.lost.add(1)  # the GPU falls off the bus: NVML stops answering for it
    assert tracker.update() == {0: True, 1: False}
    stub, _ = stub_pynvml()
    stub.state.wait_error = GPU_IS_LOST
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()
    with caplog.at_level("WARNING", logger="gpufleet.agent.nvml"):
        assert be.poll_xids() == [] and be.poll_xids() == []
    assert sum("waiting for XID events failed" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_real_backend_device_ok_only_when_nvml_stops_answering(monkeypatch):
    stub, _ = stub_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    be = NvmlBackend()

    def no_permission(h, version=None):
        raise NVMLError(NO_PERMISSION)  # a MIG GPU's memory, asked without privileges: it answered

    stub.nvmlDeviceGetMemoryInfo = no_permission
    assert be.device_ok(0)
    stub.state.lost.add(0)
    stub.nvmlDeviceGetMemoryInfo = lambda h, version=None: (_ for _ in ()).throw(NVMLError(GPU_IS_LOST))
    assert not be.device_ok(0)


def test_real_backend_device_nodes_follow_the_minor_number(monkeypatch, tmp_path):
    from gpufleet.agent.plugin import DevicePlugin

    stub, _ = stub_pynvml(minors=[3, 0])  # NVML index order need not be /dev/nvidiaN order
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    gpus = NvmlBackend().gpus()
    assert [(g.index, g.dev_minor) for g in gpus] == [(0, 3), (1, 0)]
    p = DevicePlugin("nvidia.com/gpu", gpus, str(tmp_path), device_specs="all", dev_root=str(tmp_path))
    assert [s.container_path for s in p.device_spec_list([0])][:1] == ["/dev/nvidia3"]


def test_real_backend_brand_for_the_dra_attribute(monkeypatch):
    stub, _ = stub_pynvml(n_gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    assert [g.brand for g in NvmlBackend().gpus()] == ["Nvidia", ""]  # a GPU that cannot say: no attribute, no error


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
    f.write_text("[{half")  # being rewritten: the last good load stands (no drop to 0 an autoscaler would act on)
    assert [p.pid for p in be.processes()] == [11, 12] and be.telemetry(2).gpu_util_pct == 50
    f.write_text(_json.dumps([{"pid": 13, "gpu": 1, "sm_util_pct": 70}]))
    assert [(p.pid, p.sm_util_pct) for p in be.processes()] == [(13, 70)] and be.telemetry(2).gpu_util_pct == 0
    f.unlink()  # no control file: no load
    assert be.processes() == []
