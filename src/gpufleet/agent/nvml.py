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
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol

from ..engine.model import Gpu, MigInstance

MIB = 1024 * 1024
log = logging.getLogger(__name__)


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
    minor_number: int | None = None  # N of /dev/nvidiaN; None: the same as the index (NVML need not agree)
    brand: str = ""  # NVML's product brand as go-nvlib names it ("Nvidia", "Tesla", ...); "" when unknown

    @property
    def dev_minor(self) -> int:
        return self.index if self.minor_number is None else self.minor_number

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
    """One GPU's device figures; None where the GPU cannot report one (utilisation in MIG mode, ...)."""
    gpu_util_pct: int | None
    mem_copy_util_pct: int | None
    fb_used_mib: int | None
    fb_free_mib: int | None
    temp_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None


class Backend(Protocol):
    def driver(self) -> DriverInfo: ...
    def gpus(self) -> list[GpuInfo]: ...
    def poll_xids(self) -> list[XidEvent]: ...
    def device_ok(self, index: int) -> bool: ...
    def processes(self) -> list[ProcessUsage]: ...
    def telemetry(self, index: int) -> Telemetry: ...


# --- fake --------------------------------------------------------------------------------

# nvmlBrandType_t -> the names go-nvlib (and so NVIDIA's DRA driver's `brand` attribute) gives them
BRANDS = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan", 7: "NvidiaVApps",
          8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX",
          14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX"}


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
                   (8, 0), "ampere", mig_enabled=mig, mig=migs, nvlink_peers=peers, mig_capable=True, brand="Nvidia")


PROFILES: dict[str, tuple[DriverInfo, list[GpuInfo]]] = {
    "a100-mig": (DriverInfo("550.54.15", (12, 4)), [_a100(i, i < 2) for i in range(8)]),
    "h100-nvlink": (DriverInfo("550.90.07", (12, 4)), [
        GpuInfo(i, f"GPU-h100-{i:02d}", "NVIDIA H100 80GB HBM3", 81_559, f"00000000:{0x18 + i * 16:02X}:00.0", 0 if i < 4 else 1,
                (9, 0), "hopper", nvlink_peers=tuple(j for j in range(8) if j != i), mig_capable=True, brand="Nvidia")
        for i in range(8)]),
    "t4": (DriverInfo("535.161.08", (12, 2)), [
        GpuInfo(i, f"GPU-t4-{i:02d}", "Tesla T4", 15_360, f"00000000:{0x3B + i:02X}:00.0", 0, (7, 5), "turing", brand="Nvidia")
        for i in range(4)]),
}


@dataclass
class FakeBackend:
    profile: str = "t4"
    _xids: list[XidEvent] = field(default_factory=list)
    _broken: set[int] = field(default_factory=set)
    _procs: list[ProcessUsage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gpus: list[GpuInfo] | None = None
    _control: tuple[str, list[ProcessUsage]] = ("", [])  # ($GPUFLEET_FAKE_PROCESSES, its last good content)

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

    def poll_xids(self, timeout_ms: int = 0) -> list[XidEvent]:
        """What was injected since the last call; waits up to ``timeout_ms`` for the first one, as NVML's event wait does."""
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            with self._lock:
                if self._xids or time.monotonic() >= deadline:
                    out, self._xids = self._xids, []
                    return out
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def device_ok(self, index: int) -> bool:
        with self._lock:
            return index not in self._broken

    def set_processes(self, procs: list[ProcessUsage]) -> None:
        self._procs = list(procs)

    def processes(self) -> list[ProcessUsage]:
        return self._all_processes()

    def _all_processes(self) -> list[ProcessUsage]:
        """Per-process GPU use: what a test set, plus the test control ``$GPUFLEET_FAKE_PROCESSES``.

        The control is a JSON file, a list of ``{pid, gpu, used_memory_mib, sm_util_pct}``, re-read on every call,
        so a real node's test can load GPUs with its containers' real PIDs and change the load while the agent runs
        (docs/agent.md).  A file that cannot be read or parsed (being rewritten in place) keeps the last good
        content, so a reader never sees the load drop to nothing between two writes; a removed file is no load.
        """
        out = list(self._procs)
        path = os.environ.get("GPUFLEET_FAKE_PROCESSES")
        if path:
            try:
                with open(path) as f:
                    loaded = [ProcessUsage(int(d["pid"]), int(d["gpu"]), int(d.get("used_memory_mib", 0)), int(d.get("sm_util_pct", 0)))
                              for d in json.load(f)]
                self._control = (path, loaded)
            except FileNotFoundError:
                self._control = (path, [])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # half-written: the last good content stands
            if self._control[0] == path:
                out += self._control[1]
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


def _pci_key(bus_id: str) -> tuple[int, int, int]:
    """``domain:bus:device.function`` -> (domain, bus, device), however many digits the domain has."""
    try:
        dom, bus, rest = bus_id.strip().split(":")
        return int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return (-1, -1, -1)


# NVML return codes (nvml.h); getattr on the module with these as defaults keeps stubs small
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND, _TIMEOUT, _FUNCTION_NOT_FOUND, _VERSION_MISMATCH = 3, 4, 6, 10, 13, 25
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def _code(exc: BaseException) -> int:
    return int(getattr(exc, "value", -1))


class NvmlBackend:
    """NVML through nvidia-ml-py. Every call is checked; no GPU is a clear error.

    What a GPU cannot report (NVML's NOT_SUPPORTED, e.g. utilisation of a GPU in
    MIG mode, or NO_PERMISSION) is left out (None), never taken for a fault: a
    fault is NVML failing to answer at all (GPU lost, unknown error).
    """

    PROCESS_UTIL_WINDOW_S = 3.0  # per-process SM utilisation: mean of NVML's samples this recent

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise NoGpuError(f"no NVIDIA GPU/driver found: nvidia-ml-py is not installed: {exc}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise NoGpuError("no NVIDIA GPU/driver found: NVML reports 0 devices")
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        except pynvml.NVMLError as exc:
            raise NoGpuError(f"no NVIDIA GPU/driver found: NVML init failed: {exc} (is the NVIDIA driver installed and "
                             "are /dev/nvidia* and libnvidia-ml.so visible to this container? For a trial without a GPU "
                             "use --nvml fake:PROFILE)") from None
        self._events: Any = None  # NVML event set, made on the first poll_xids (False: NVML refused one)
        self.xid_watch: dict[int, str] = {}  # GPU index -> "watched" or why its XIDs are not
        self._wait_errors: set[int] = set()  # event-wait failures already logged (once each)
        self._mem_v2: bool | None = None  # nvmlDeviceGetMemoryInfo_v2 available (None: not tried yet)
        self._util_since_us: dict[int, int] = {}
        self._lock = threading.Lock()

    def _c(self, name: str, default: int) -> int:
        return int(getattr(self.nv, name, default))

    def _optional(self, fn):
        """fn(), or None when the GPU cannot report it (NOT_SUPPORTED, NO_PERMISSION); other errors raise."""
        try:
            return fn()
        except self.nv.NVMLError as exc:
            if _code(exc) in (self._c("NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED), self._c("NVML_ERROR_NO_PERMISSION", _NO_PERMISSION)):
                return None
            raise

    def driver(self) -> DriverInfo:
        nv = self.nv
        v = _text(nv.nvmlSystemGetDriverVersion())
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2() if hasattr(nv, "nvmlSystemGetCudaDriverVersion_v2") else nv.nvmlSystemGetCudaDriverVersion()
        return DriverInfo(v, (cuda // 1000, (cuda % 1000) // 10))

    def memory(self, h) -> tuple[int, int, int]:
        """(total, used, free) in bytes as nvidia-smi shows them.

        ``nvmlDeviceGetMemoryInfo`` (v1) counts the memory the driver reserves for
        itself as used (NVML's docs: "Sum of Reserved and Allocated"), hundreds of
        MiB on an idle H100; ``_v2`` reports it apart, as nvidia-smi's "FB Memory
        Usage" (Total, Reserved, Used, Free) does. v1 only where v2 is missing.
        """
        nv = self.nv
        if self._mem_v2 is not False and hasattr(nv, "nvmlMemory_v2"):
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                self._mem_v2 = True
                return int(m.total), int(m.used), int(m.free)
            except TypeError:  # an nvidia-ml-py without the version argument
                self._mem_v2 = False
            except nv.NVMLError as exc:
                if _code(exc) not in (self._c("NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND),
                                      self._c("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", _VERSION_MISMATCH),
                                      self._c("NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED)):
                    raise
                self._mem_v2 = False  # an older driver
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return int(m.total), int(m.used), int(m.free)

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
            attrs = nv.nvmlDeviceGetAttributes(mh)
            # the profile's memory (what nvidia-smi and NVIDIA's device plugin name it by); memory info if absent
            mmem = int(getattr(attrs, "memorySizeMB", 0) or 0) or self.memory(mh)[0] // MIB
            try:
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
            except (nv.NVMLError, AttributeError):
                gi = k
            migs.append(MigInfo(mig_profile_name(attrs.gpuInstanceSliceCount, mmem, total_mib), mmem, gi,
                                _text(nv.nvmlDeviceGetUUID(mh))))
        return True, True, migs

    def _links(self, h, i: int, buses: list[tuple[int, int, int]]) -> tuple[list[int], bool | None]:
        """(GPUs this one has an active NVLink to, whether a link ends at an NVSwitch; None: NVML cannot say)."""
        nv = self.nv
        peers: list[int] = []
        switch: bool | None = None
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                rbus = _pci_key(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
            except nv.NVMLError:
                continue  # link not present / not supported: look at the others
            try:
                kind = int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
                switch = bool(switch) or kind == self._c("NVML_NVLINK_DEVICE_TYPE_SWITCH", _NVLINK_SWITCH)
            except (nv.NVMLError, AttributeError):
                pass  # older driver: gpus() falls back to "active links but no GPU at their ends"
            j = next((j for j, b in enumerate(buses) if b == rbus), None)
            if j is not None and j != i and j not in peers:
                peers.append(j)
        return peers, switch

    def gpus(self) -> list[GpuInfo]:
        nv = self.nv
        buses = [_text(nv.nvmlDeviceGetPciInfo(h).busId) for h in self._handles]
        keys = [_pci_key(b) for b in buses]
        out = []
        switched: set[int] = set()
        for i, h in enumerate(self._handles):
            name = _text(nv.nvmlDeviceGetName(h))
            mem = self.memory(h)[0] // MIB
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            try:
                numa = int(nv.nvmlDeviceGetNumaNodeId(h))
            except (nv.NVMLError, AttributeError):
                numa = -1
            try:
                dev_minor = int(nv.nvmlDeviceGetMinorNumber(h))
            except (nv.NVMLError, AttributeError):
                dev_minor = None
            try:
                brand = BRANDS.get(int(nv.nvmlDeviceGetBrand(h)), "")
            except (nv.NVMLError, AttributeError, TypeError, ValueError):
                brand = ""
            capable, enabled, migs = self._mig(h, mem)
            peers, switch = self._links(h, i, keys)
            if switch is None:  # NVSwitch systems (DGX/HGX A100, H100): links end at switches, not at GPUs
                try:
                    switch = not peers and nv.nvmlDeviceGetNvLinkState(h, 0) == nv.NVML_FEATURE_ENABLED
                except nv.NVMLError:
                    switch = False
            if switch:
                switched.add(i)
            out.append(GpuInfo(i, self._uuids[i], name, mem, buses[i], numa, (major, minor), arch_family(major, minor),
                               enabled, tuple(migs), tuple(sorted(peers)), mig_capable=capable, minor_number=dev_minor,
                               brand=brand))
        if switched:  # every GPU on the switches reaches every other one on them
            out = [replace(g, nvlink_peers=tuple(sorted(set(g.nvlink_peers) | (switched - {g.index}))))
                   if g.index in switched else g for g in out]
        return out

    def _watch_xids(self) -> None:
        """Make the event set and register every GPU that can report XIDs; ``xid_watch`` says how each went."""
        nv = self.nv
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_EVENT)
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._events = False
            self.xid_watch = {i: f"no NVML event set: {exc}" for i in range(len(self._handles))}
            log.warning("XID events are not watched: NVML refused an event set (%s); health comes from NVML answering only", exc)
            return
        for i, h in enumerate(self._handles):
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(h))
            except (nv.NVMLError, AttributeError):
                supported = xid  # cannot ask: try to register anyway
            if not supported & xid:
                self.xid_watch[i] = "this GPU reports no XID events"
            else:
                try:
                    nv.nvmlDeviceRegisterEvents(h, xid, self._events)
                    self.xid_watch[i] = "watched"
                except nv.NVMLError as exc:
                    self.xid_watch[i] = f"registering for XID events failed: {exc}"
            if self.xid_watch[i] != "watched":
                log.warning("GPU %d: XIDs not watched (%s); its health comes from NVML answering only", i, self.xid_watch[i])

    def poll_xids(self, timeout_ms: int = 0) -> list[XidEvent]:
        """XID events since the last call; waits up to ``timeout_ms`` for the first one (0: only what is queued)."""
        nv = self.nv
        with self._lock:
            if self._events is None:
                self._watch_xids()
            events = self._events
        if not events:
            return []
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_EVENT)
        out = []
        wait = max(0, int(timeout_ms))
        while True:
            try:
                d = nv.nvmlEventSetWait_v2(events, wait)
            except nv.NVMLError as exc:
                code = _code(exc)
                if code != self._c("NVML_ERROR_TIMEOUT", _TIMEOUT) and code not in self._wait_errors:
                    # e.g. GPU_IS_LOST: device_ok() finds which GPU; logged once per kind of failure
                    self._wait_errors.add(code)
                    log.warning("waiting for XID events failed: %s", exc)
                break
            wait = 0  # then take whatever else is queued without waiting
            if d.eventType != xid:
                continue
            try:
                idx = self._uuids.index(_text(nv.nvmlDeviceGetUUID(d.device)))
            except (nv.NVMLError, ValueError):
                idx = -1  # an event for no device in particular
            out.append(XidEvent(idx, int(d.eventData), time.time()))
        return out

    def device_ok(self, index: int) -> bool:
        """NVML answers for the GPU. A query the GPU does not support (or we may not make) is an answer too."""
        h = self._handles[index]
        try:
            self.nv.nvmlDeviceGetUUID(h)
            self._optional(lambda: self.memory(h))
            return True
        except self.nv.NVMLError:
            return False

    def _process_util(self, i: int, h, now_us: int) -> dict[int, int]:
        """pid -> mean SM utilisation (%) over the last ``PROCESS_UTIL_WINDOW_S``.

        NVML keeps a buffer of per-process samples stamped with the CPU clock in
        microseconds and returns those newer than the timestamp passed: 0 gives
        the whole buffer, seconds of stale samples in no promised order. So ask
        for what is newer than the window's start and average each process's
        samples in it; where the samples' clock is far from ours (a VM), the
        window ends at the newest sample. NOT_FOUND (nothing newer) is no
        activity, NOT_SUPPORTED (MIG mode, old GPUs) no figure: both give {}.
        """
        nv = self.nv
        window_us = int(self.PROCESS_UTIL_WINDOW_S * 1e6)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, self._util_since_us.get(i, 0))
        except nv.NVMLError:
            return {}
        newest = max((int(s.timeStamp) for s in samples), default=0)
        end = now_us if abs(newest - now_us) < 600 * 10**6 or not samples else newest
        start = end - window_us
        self._util_since_us[i] = max(0, start)
        acc: dict[int, list[int]] = {}
        for s in samples:
            if int(s.timeStamp) > start:
                acc.setdefault(int(s.pid), []).append(int(s.smUtil))
        return {pid: round(sum(v) / len(v)) for pid, v in acc.items()}

    def processes(self) -> list[ProcessUsage]:
        nv = self.nv
        out = []
        now_us = int(time.time() * 1e6)
        for i, h in enumerate(self._handles):
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except nv.NVMLError:
                continue
            util = self._process_util(i, h, now_us) if procs else {}
            for p in procs:  # usedGpuMemory: bytes, None where NVML cannot say
                out.append(ProcessUsage(int(p.pid), i, int(p.usedGpuMemory or 0) // MIB, min(100, util.get(int(p.pid), 0))))
        return out

    def telemetry(self, index: int) -> Telemetry:
        nv, h = self.nv, self._handles[index]
        opt = self._optional
        u = opt(lambda: nv.nvmlDeviceGetUtilizationRates(h))  # NOT_SUPPORTED in MIG mode
        m = opt(lambda: self.memory(h))
        temp = opt(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        power_mw = opt(lambda: nv.nvmlDeviceGetPowerUsage(h))  # milliwatts
        clock = opt(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        return Telemetry(None if u is None else int(u.gpu), None if u is None else int(u.memory),
                         None if m is None else m[1] // MIB, None if m is None else m[2] // MIB,
                         None if temp is None else int(temp), None if power_mw is None else power_mw / 1000.0,
                         None if clock is None else int(clock))


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
