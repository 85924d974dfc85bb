"""GPU discovery and health through NVML, behind a small backend protocol.

``NvmlBackend`` uses ``nvidia-ml-py`` (``pynvml``, imported lazily) and is the
default; when the driver or a GPU is missing it raises ``NoGpuError`` ("no
NVIDIA GPU/driver found: ...") with NVML's own message, never silently
falling back.  ``FakeBackend`` serves realistic profiles (``a100-mig``: 8x
A100-SXM4-80GB, MIG in mixed mode on GPUs 0-1; ``h100-nvlink``: 8x H100 80GB
HBM3 fully NVLinked; ``t4``: 4x T4 on PCIe) and lets tests inject and clear
XID faults and per-process usage; it is chosen only when asked for
(``--nvml fake:PROFILE``, ``GPUFLEET_NVML=fake:PROFILE`` or
``GPUFLEET_FAKE_NVML=PROFILE``).
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol

from ..engine.model import Gpu, MigInstance

MIB = 1024 * 1024


class NoGpuError(RuntimeError):
    pass


def arch_family(major: int, minor: int) -> str:
    """GPU Feature Discovery's ``nvidia.com/gpu.family`` value for a compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
            12: "blackwell"}.get(major, "undefined")


def mig_profile_name(gpu_slices: int, mig_memory_mib: int, gpu_memory_mib: int) -> str:
    """``<slices>g.<GB>gb`` the way nvidia-smi names MIG profiles.

    The memory part is the instance's share of the GPU's memory rounded up to
    eighths (MIG memory slices) times the GPU's size in whole GiB: an A100-80GB
    9728 MiB instance is 1g.10gb, an A30 5836 MiB one 1g.6gb.
    """
    frac = math.ceil(mig_memory_mib / gpu_memory_mib * 8 - 1e-9) / 8
    return f"{gpu_slices}g.{round(frac * math.ceil(gpu_memory_mib / 1024))}gb"


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
    mig_capable: bool = False

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
    migs: tuple[MigInfo, ...] = ()
    if mig:  # mixed strategy: GPU 0 = 7x 1g.10gb, GPU 1 = 1x 3g.40gb + 2x 2g.20gb
        if i == 0:
            migs = tuple(MigInfo("1g.10gb", 9_728, k, f"MIG-a100-{i}-{k}") for k in range(7))
        else:
            migs = (MigInfo("3g.40gb", 40_192, 0, f"MIG-a100-{i}-0"), MigInfo("2g.20gb", 19_968, 1, f"MIG-a100-{i}-1"),
                    MigInfo("2g.20gb", 19_968, 2, f"MIG-a100-{i}-2"))
    peers = tuple(j for j in range(8) if j != i)
    return GpuInfo(i, f"GPU-a100-{i:02d}", "NVIDIA A100-SXM4-80GB", 81_920, f"00000000:{0x07 + i * 8:02X}:00.0", 0 if i < 4 else 1,
                   (8, 0), "ampere", mig_enabled=mig, mig=migs, nvlink_peers=peers, mig_capable=True)


PROFILES: dict[str, tuple[DriverInfo, list[GpuInfo]]] = {
    "a100-mig": (DriverInfo("550.54.15", (12, 4)), [_a100(i, i < 2) for i in range(8)]),
    "h100-nvlink": (DriverInfo("550.90.07", (12, 4)), [
        GpuInfo(i, f"GPU-h100-{i:02d}", "NVIDIA H100 80GB HBM3", 81_559, f"00000000:{0x18 + i * 16:02X}:00.0", 0 if i < 4 else 1,
                (9, 0), "hopper", nvlink_peers=tuple(j for j in range(8) if j != i), mig_capable=True) for i in range(8)]),
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
    _gpus: list[GpuInfo] | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown fake GPU profile {self.profile!r}; known: {', '.join(sorted(PROFILES))}")

    def driver(self) -> DriverInfo:
        return PROFILES[self.profile][0]

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._gpus if self._gpus is not None else PROFILES[self.profile][1])

    def set_gpus(self, gpus: list[GpuInfo]) -> None:
        """Change the node's GPUs (a MIG re-partition, a GPU gone): what the next discovery sees."""
        with self._lock:
            self._gpus = list(gpus)

    def inject_xid(self, gpu_index: int, xid: int, timestamp_s: float, device_broken: bool | None = None) -> None:
        with self._lock:
            self._xids.append(XidEvent(gpu_index, xid, timestamp_s))
            if device_broken:
                self._broken.add(gpu_index)

    def clear_fault(self, gpu_index: int) -> None:
        """The fault is gone: NVML answers for the GPU again (a reset, a transient bus error)."""
        with self._lock:
            self._broken.discard(gpu_index)

    repair = clear_fault

    def poll_xids(self) -> list[XidEvent]:
        with self._lock:
            out, self._xids = self._xids, []
            return out

    def device_ok(self, index: int) -> bool:
        with self._lock:
            return index not in self._broken

    def set_processes(self, procs: list[ProcessUsage]) -> None:
        self._procs = list(procs)

    def processes(self) -> list[ProcessUsage]:
        return self._all_processes()

    def _all_processes(self) -> list[ProcessUsage]:
        """Per-process GPU use: what a test set, plus ``$GPUFLEET_FAKE_PROCESSES`` (a JSON list of
        ``{pid, gpu, used_memory_mib, sm_util_pct}``, re-read on every call) so a real node's test can load
        GPUs with its containers' real PIDs."""
        out = list(self._procs)
        path = os.environ.get("GPUFLEET_FAKE_PROCESSES")
        if path:
            try:
                with open(path) as f:
                    out += [ProcessUsage(int(d["pid"]), int(d["gpu"]), int(d.get("used_memory_mib", 0)), int(d.get("sm_util_pct", 0)))
                            for d in json.load(f)]
            except (OSError, ValueError, KeyError, TypeError):
                pass  # no load file (yet) or a half-written one: no extra processes this time
        return out

    def telemetry(self, index: int) -> Telemetry:
        g = self.gpus()[index]
        procs = [p for p in self._all_processes() if p.gpu_index == index]
        used = sum(p.used_memory_mib for p in procs)
        util = min(100, sum(p.sm_util_pct for p in procs))
        return Telemetry(util, util // 2, used, g.memory_mib - used, 35 + util // 3, 60.0 + 3.0 * util, 1410 if util else 210)


# --- real ---------------------------------------------------------------------------------

def _text(v: str | bytes) -> str:
    return v if isinstance(v, str) else v.decode()


class NvmlBackend:
    """NVML through nvidia-ml-py. Every call is checked; no GPU is a clear error."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise NoGpuError(f"no NVIDIA GPU/driver found: nvidia-ml-py is not installed: {exc}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise NoGpuError(f"no NVIDIA GPU/driver found: NVML init failed: {exc} (is the NVIDIA driver installed and "
                             "are /dev/nvidia* and libnvidia-ml.so visible to this container? For a trial without a GPU "
                             "use --nvml fake:PROFILE)") from None
        if count == 0:
            raise NoGpuError("no NVIDIA GPU/driver found: NVML reports 0 devices")
        self._events = None
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]

    def driver(self) -> DriverInfo:
        nv = self.nv
        v = _text(nv.nvmlSystemGetDriverVersion())
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2() if hasattr(nv, "nvmlSystemGetCudaDriverVersion_v2") else nv.nvmlSystemGetCudaDriverVersion()
        return DriverInfo(v, (cuda // 1000, (cuda % 1000) // 10))

    def _mig(self, h, total_mib: int) -> tuple[bool, bool, list[MigInfo]]:
        nv = self.nv
        try:
            cur, _pending = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError:  # NOT_SUPPORTED: not a MIG-capable GPU
            return False, False, []
        if cur != nv.NVML_DEVICE_MIG_ENABLE:
            return True, False, []
        migs = []
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError:
                continue  # an empty slot
            mmem = nv.nvmlDeviceGetMemoryInfo(mh).total // MIB
            attrs = nv.nvmlDeviceGetAttributes(mh)
            try:
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
            except (nv.NVMLError, AttributeError):
                gi = k
            migs.append(MigInfo(mig_profile_name(attrs.gpuInstanceSliceCount, mmem, total_mib), mmem, gi,
                                _text(nv.nvmlDeviceGetUUID(mh))))
        return True, True, migs

    def _peers(self, h, i: int, buses: list[str]) -> list[int]:
        nv = self.nv
        peers: list[int] = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                rbus = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except nv.NVMLError:
                continue  # link not present / not supported: look at the others
            # through an NVSwitch the remote end is the switch, not a GPU: no peer from this link
            j = next((j for j, b in enumerate(buses) if b.lower() == rbus.lower()), None)
            if j is not None and j != i and j not in peers:
                peers.append(j)
        return peers

    def gpus(self) -> list[GpuInfo]:
        nv = self.nv
        buses = [_text(nv.nvmlDeviceGetPciInfo(h).busId) for h in self._handles]
        out = []
        nvswitch = False
        for i, h in enumerate(self._handles):
            name = _text(nv.nvmlDeviceGetName(h))
            mem = nv.nvmlDeviceGetMemoryInfo(h).total // MIB
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            try:
                numa = int(nv.nvmlDeviceGetNumaNodeId(h))
            except (nv.NVMLError, AttributeError):
                numa = -1
            capable, enabled, migs = self._mig(h, mem)
            peers = self._peers(h, i, buses)
            try:  # NVSwitch systems (DGX/HGX A100, H100): links go to switches, every GPU reaches every other
                if not peers and nv.nvmlDeviceGetNvLinkState(h, 0) == nv.NVML_FEATURE_ENABLED:
                    nvswitch = True
            except nv.NVMLError:
                pass
            out.append(GpuInfo(i, self._uuids[i], name, mem, buses[i], numa, (major, minor), arch_family(major, minor),
                               enabled, tuple(migs), tuple(sorted(peers)), mig_capable=capable))
        if nvswitch:
            out = [replace(g, nvlink_peers=tuple(j for j in range(len(out)) if j != g.index)) for g in out]
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
                    pass  # not supported on this device: its XIDs are not watched (logged by the caller via reasons)
        out = []
        while True:
            try:
                d = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # TIMEOUT: no more events
                break
            if d.eventType != nv.nvmlEventTypeXidCriticalError:
                continue
            try:
                u = _text(nv.nvmlDeviceGetUUID(d.device))
                idx = self._uuids.index(u)
            except (nv.NVMLError, ValueError):
                idx = -1  # an event for no device in particular
            out.append(XidEvent(idx, int(d.eventData), time.time()))
        return out

    def device_ok(self, index: int) -> bool:
        try:
            self.nv.nvmlDeviceGetMemoryInfo(self._handles[index])
            self.nv.nvmlDeviceGetUUID(self._handles[index])
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
                out.append(ProcessUsage(p.pid, i, (p.usedGpuMemory or 0) // MIB, int(util.get(p.pid, 0))))
        return out

    def telemetry(self, index: int) -> Telemetry:
        return _telemetry(self.nv, self._handles[index])


def _telemetry(nv, h) -> Telemetry:
    u = nv.nvmlDeviceGetUtilizationRates(h)
    m = nv.nvmlDeviceGetMemoryInfo(h)
    return Telemetry(int(u.gpu), int(u.memory), m.used // (1024 * 1024), m.free // (1024 * 1024),
                     int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                     int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))


def backend_spec(flag: str | None, env: Mapping[str, str]) -> str | None:
    """Which backend: ``--nvml`` wins, then ``GPUFLEET_NVML``, then ``GPUFLEET_FAKE_NVML=PROFILE``.

    Returns the fake profile, or None for the real NVML.  Anything else is a
    ValueError: a typo must not quietly pick a backend.
    """
    spec = flag or env.get("GPUFLEET_NVML") or (f"fake:{env['GPUFLEET_FAKE_NVML']}" if env.get("GPUFLEET_FAKE_NVML") else "real")
    if spec == "real":
        return None
    if spec.startswith("fake:") and spec[5:] in PROFILES:
        return spec[5:]
    raise ValueError(f"--nvml must be 'real' or fake:PROFILE with PROFILE one of {', '.join(sorted(PROFILES))}; got {spec!r}")


def open_backend(fake: str | None) -> Backend:
    return FakeBackend(fake) if fake else NvmlBackend()


def engine_gpus(gpus: list[GpuInfo], health: Mapping[int, bool] | None = None) -> tuple[Gpu, ...]:
    """Discovery as the engine's model (what the scheduler sees through the inventory)."""
    return tuple(g.to_engine((health or {}).get(g.index, True)) for g in gpus)


__all__ = ["Backend", "DriverInfo", "FakeBackend", "GpuInfo", "MigInfo", "NoGpuError", "NvmlBackend", "PROFILES",
           "ProcessUsage", "Telemetry", "XidEvent", "arch_family", "backend_spec", "engine_gpus", "mig_profile_name",
           "open_backend"]
