"""GPU discovery and health through NVML, behind a small backend protocol.

``NvmlBackend`` uses ``nvidia-ml-py`` (``pynvml``) and is the default; when the
driver or a GPU is missing it raises ``NoGpuError`` with NVML's own message,
never silently falling back.  ``FakeBackend`` serves realistic profiles
(``a100-mig``: 8x A100-SXM4-80GB with MIG in mixed mode on GPUs 0-1;
``h100-nvlink``: 8x H100 80GB HBM3 fully NVLinked; ``t4``: 4x T4) and lets
tests inject XID events and per-process usage; select it with
``--fake-gpus PROFILE`` or ``GPUFLEET_FAKE_NVML=PROFILE``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..engine.model import Gpu, MigInstance


class NoGpuError(RuntimeError):
    pass


@dataclass(frozen=True)
class MigInfo:
    profile: str
    memory_mib: int
    instance_id: int
    uuid: str


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int
    compute_capability: tuple[int, int]
    family: str
    mig_enabled: bool = False
    mig: tuple[MigInfo, ...] = ()
    nvlink_peers: tuple[int, ...] = ()

    def to_engine(self, healthy: bool = True) -> Gpu:
        return Gpu(self.index, self.uuid, self.name, self.memory_mib, mig_enabled=self.mig_enabled,
                   mig_instances=tuple(MigInstance(m.profile, m.memory_mib, m.instance_id) for m in self.mig),
                   nvlink_peers=self.nvlink_peers, healthy=healthy)


@dataclass(frozen=True)
class DriverInfo:
    driver_version: str  # "550.54.15"
    cuda_version: tuple[int, int]  # CUDA the driver supports (runtime API), e.g. (12, 4)


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int
    timestamp_s: float


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    gpu_index: int
    used_memory_mib: int
    sm_util_pct: int


@dataclass(frozen=True)
class Telemetry:
    gpu_util_pct: int
    mem_copy_util_pct: int
    fb_used_mib: int
    fb_free_mib: int
    temp_c: int
    power_w: float
    sm_clock_mhz: int


class Backend(Protocol):
    def driver(self) -> DriverInfo: ...
    def gpus(self) -> list[GpuInfo]: ...
    def poll_xids(self) -> list[XidEvent]: ...
    def device_ok(self, index: int) -> bool: ...
    def processes(self) -> list[ProcessUsage]: ...
    def telemetry(self, index: int) -> Telemetry: ...


# --- fake --------------------------------------------------------------------------------

def _a100(i: int, mig: bool) -> GpuInfo:
    migs = ()
    if mig:  # mixed strategy: GPU 0 = 7x 1g.10gb, GPU 1 = 1x 3g.40gb + 2x 2g.20gb
        if i == 0:
            migs = tuple(MigInfo("1g.10gb", 9_728, k, f"MIG-a100-{i}-{k}") for k in range(7))
        else:
            migs = (MigInfo("3g.40gb", 40_192, 0, f"MIG-a100-{i}-0"), MigInfo("2g.20gb", 19_968, 1, f"MIG-a100-{i}-1"),
                    MigInfo("2g.20gb", 19_968, 2, f"MIG-a100-{i}-2"))
    peers = tuple(j for j in range(8) if j != i)
    return GpuInfo(i, f"GPU-a100-{i:02d}", "NVIDIA A100-SXM4-80GB", 81_920, f"00000000:{0x07 + i * 8:02X}:00.0", 0 if i < 4 else 1,
                   (8, 0), "ampere", mig_enabled=mig, mig=migs, nvlink_peers=peers)


PROFILES: dict[str, tuple[DriverInfo, list[GpuInfo]]] = {
    "a100-mig": (DriverInfo("550.54.15", (12, 4)), [_a100(i, i < 2) for i in range(8)]),
    "h100-nvlink": (DriverInfo("550.90.07", (12, 4)), [
        GpuInfo(i, f"GPU-h100-{i:02d}", "NVIDIA H100 80GB HBM3", 81_559, f"00000000:{0x18 + i * 16:02X}:00.0", 0 if i < 4 else 1,
                (9, 0), "hopper", nvlink_peers=tuple(j for j in range(8) if j != i)) for i in range(8)]),
    "t4": (DriverInfo("535.161.08", (12, 2)), [
        GpuInfo(i, f"GPU-t4-{i:02d}", "Tesla T4", 15_360, f"00000000:{0x3B + i:02X}:00.0", 0, (7, 5), "turing") for i in range(4)]),
}


@dataclass
class FakeBackend:
    profile: str = "t4"
    _xids: list[XidEvent] = field(default_factory=list)
    _broken: set[int] = field(default_factory=set)
    _procs: list[ProcessUsage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown fake GPU profile {self.profile!r}; known: {', '.join(sorted(PROFILES))}")

    def driver(self) -> DriverInfo:
        return PROFILES[self.profile][0]

    def gpus(self) -> list[GpuInfo]:
        return list(PROFILES[self.profile][1])

    def inject_xid(self, gpu_index: int, xid: int, timestamp_s: float, device_broken: bool | None = None) -> None:
        with self._lock:
            self._xids.append(XidEvent(gpu_index, xid, timestamp_s))
            if device_broken:
                self._broken.add(gpu_index)

    def repair(self, gpu_index: int) -> None:
        with self._lock:
            self._broken.discard(gpu_index)

    def poll_xids(self) -> list[XidEvent]:
        with self._lock:
            out, self._xids = self._xids, []
            return out

    def device_ok(self, index: int) -> bool:
        return index not in self._broken

    def set_processes(self, procs: list[ProcessUsage]) -> None:
        self._procs = list(procs)

    def processes(self) -> list[ProcessUsage]:
        return list(self._procs)

    def telemetry(self, index: int) -> Telemetry:
        g = PROFILES[self.profile][1][index]
        procs = [p for p in self._procs if p.gpu_index == index]
        used = sum(p.used_memory_mib for p in procs)
        util = min(100, sum(p.sm_util_pct for p in procs))
        return Telemetry(util, util // 2, used, g.memory_mib - used, 35 + util // 3, 60.0 + 3.0 * util, 1410 if util else 210)


# --- real ---------------------------------------------------------------------------------

class NvmlBackend:
    """NVML through nvidia-ml-py. Every call is checked; no GPU is a clear error."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise NoGpuError(f"nvidia-ml-py is not installed: {exc}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpuError(f"no NVIDIA GPU/driver found: NVML init failed: {exc} (is the NVIDIA driver installed and "
                             "/dev/nvidia* visible to this container?)") from None
        if pynvml.nvmlDeviceGetCount() == 0:
            raise NoGpuError("no NVIDIA GPU/driver found: NVML reports 0 devices")
        self._events = None
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def driver(self) -> DriverInfo:
        nv = self.nv
        v = nv.nvmlSystemGetDriverVersion()
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2() if hasattr(nv, "nvmlSystemGetCudaDriverVersion_v2") else nv.nvmlSystemGetCudaDriverVersion()
        return DriverInfo(v if isinstance(v, str) else v.decode(), (cuda // 1000, (cuda % 1000) // 10))

    def gpus(self) -> list[GpuInfo]:
        nv = self.nv
        out = []
        uuids = []
        for h in self._handles:
            u = nv.nvmlDeviceGetUUID(h)
            uuids.append(u if isinstance(u, str) else u.decode())
        for i, h in enumerate(self._handles):
            name = nv.nvmlDeviceGetName(h)
            name = name if isinstance(name, str) else name.decode()
            mem = nv.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            pci = nv.nvmlDeviceGetPciInfo(h)
            bus = pci.busId if isinstance(pci.busId, str) else pci.busId.decode()
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            try:
                numa = nv.nvmlDeviceGetNumaNodeId(h)
            except (nv.NVMLError, AttributeError):
                numa = -1
            mig_enabled, migs = False, []
            try:
                cur, _pending = nv.nvmlDeviceGetMigMode(h)
                mig_enabled = cur == nv.NVML_DEVICE_MIG_ENABLE
            except nv.NVMLError:
                pass
            if mig_enabled:
                for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                    except nv.NVMLError:
                        continue
                    mmem = nv.nvmlDeviceGetMemoryInfo(mh).total // (1024 * 1024)
                    attrs = nv.nvmlDeviceGetAttributes(mh)
                    gslices = attrs.gpuInstanceSliceCount
                    prof = f"{gslices}g.{round(mmem / 1024 / 5) * 5 or 5}gb"
                    mu = nv.nvmlDeviceGetUUID(mh)
                    migs.append(MigInfo(prof, mmem, k, mu if isinstance(mu, str) else mu.decode()))
            peers = []
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    rp = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
                    rbus = rp.busId if isinstance(rp.busId, str) else rp.busId.decode()
                    for j, hj in enumerate(self._handles):
                        b = nv.nvmlDeviceGetPciInfo(hj).busId
                        if (b if isinstance(b, str) else b.decode()) == rbus and j != i and j not in peers:
                            peers.append(j)
                except nv.NVMLError:
                    break
            family = {9: "hopper", 8: "ampere", 7: "volta" if minor == 0 else "turing", 6: "pascal"}.get(major, f"sm{major}{minor}")
            if major == 8 and minor == 9:
                family = "ada-lovelace"
            out.append(GpuInfo(i, uuids[i], name, mem, bus, numa, (major, minor), family, mig_enabled, tuple(migs), tuple(sorted(peers))))
        return out

    def poll_xids(self) -> list[XidEvent]:
        import time

        nv = self.nv
        if self._events is None:
            self._events = nv.nvmlEventSetCreate()
            for h in self._handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
                except nv.NVMLError:
                    pass
        out = []
        while True:
            try:
                d = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break
            idx = next((i for i, h in enumerate(self._handles) if nv.nvmlDeviceGetIndex(h) == nv.nvmlDeviceGetIndex(d.device)), -1)
            out.append(XidEvent(idx, int(d.eventData), time.time()))
        return out

    def device_ok(self, index: int) -> bool:
        try:
            self.nv.nvmlDeviceGetMemoryInfo(self._handles[index])
            return True
        except self.nv.NVMLError:
            return False

    def processes(self) -> list[ProcessUsage]:
        nv = self.nv
        out = []
        for i, h in enumerate(self._handles):
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except nv.NVMLError:
                continue
            util = {}
            try:
                for s in nv.nvmlDeviceGetProcessUtilization(h, 0):
                    util[s.pid] = s.smUtil
            except nv.NVMLError:
                pass
            for p in procs:
                out.append(ProcessUsage(p.pid, i, (p.usedGpuMemory or 0) // (1024 * 1024), int(util.get(p.pid, 0))))
        return out


def _telemetry(nv, h) -> Telemetry:
    u = nv.nvmlDeviceGetUtilizationRates(h)
    m = nv.nvmlDeviceGetMemoryInfo(h)
    return Telemetry(int(u.gpu), int(u.memory), m.used // (1024 * 1024), m.free // (1024 * 1024),
                     int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                     int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))


NvmlBackend.telemetry = lambda self, index: _telemetry(self.nv, self._handles[index])  # type: ignore[attr-defined]


def open_backend(fake: str | None) -> Backend:
    return FakeBackend(fake) if fake else NvmlBackend()


__all__ = ["Backend", "DriverInfo", "FakeBackend", "GpuInfo", "MigInfo", "NoGpuError", "NvmlBackend", "PROFILES",
           "ProcessUsage", "Telemetry", "XidEvent", "open_backend", "replace"]
