"""The node's GPUs as ``resource.k8s.io/v1`` devices, with the names NVIDIA's DRA driver publishes.

A claim written for NVIDIA's driver (``gpu.nvidia.com``) selects devices by
attributes such as ``productName``, ``uuid``, ``architecture``,
``cudaComputeCapability`` and by capacity ``memory``; any allocator
(kube-scheduler's or gpufleet's) evaluates those selectors against what the
driver publishes.  So the devices here carry exactly those names, types and
formats (read from kubernetes-sigs/dra-driver-nvidia-gpu ``deviceinfo.go`` /
``mig.go`` and k8s.io/dynamic-resource-allocation ``deviceattribute``), under
gpufleet's own driver domain, plus the standard ``resource.kubernetes.io``
PCI/NUMA attributes.  With ``nvidia_attributes`` they are also published under
the ``gpu.nvidia.com/`` prefix, so ``device.attributes['gpu.nvidia.com']``
selectors and ``matchAttribute: gpu.nvidia.com/...`` constraints work unchanged.

gpufleet's GPU shares become consumable capacity (KEP-5075): a whole GPU is
one device with ``allowMultipleAllocations`` and two capacities, ``memory``
(bytes; an unstated request takes all of it, so a claim that asks for no
capacity gets the whole GPU, exclusively) and ``gpuMilli`` (1000 = the whole
GPU's compute; unstated = 0, gpufleet's memory-only share).  "20 GiB of some
A100" is then one claim: ``capacity.requests: {memory: 20Gi}``.  MIG
instances are separate, exclusive devices; a GPU in MIG mode publishes its
instances only.

A GPU published as shareable also carries the attribute ``shareable: true``: the share DeviceClass selects on it,
so that its CEL compiles on every release (``device.allowMultipleAllocations`` is unknown to a 1.35 kube-apiserver
without ``DRAConsumableCapacity``, which refuses the class; there the agent publishes no shares and the class matches
nothing).

A GPU that is unhealthy (a fatal XID, or NVML no longer answers) gets a
``NoSchedule`` device taint, on its MIG instances too, with NVIDIA's keys
under this driver's domain (``<driver>/xid`` = the XID, ``<driver>/gpu-lost``);
it loses it when the health tracker says it recovered.  Where the API server
does not serve device taints (``taints=False``, Kubernetes 1.35 by default)
the unhealthy GPU's devices are left out of the slice instead; they stay in
``published`` so the kubelet plugin still answers for claims that hold them.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..nvml import DriverInfo, GpuInfo, MigInfo

log = logging.getLogger(__name__)

DRIVER = "gpu.gpufleet.io"
NVIDIA_DOMAIN = "gpu.nvidia.com"
SHAREABLE = "shareable"  # bool attribute, true on a GPU published with allowMultipleAllocations (the share class selects on it)
STANDARD = "resource.kubernetes.io"
MIB = 1024 * 1024
GPU_MILLI = 1000
# a capacity request for memory is rounded up to whole MiB (as NVIDIA's consumable shares do)
MEMORY_STEP = "1Mi"

# go-nvlib's names for NVML architectures, by GPU Feature Discovery family (what our discovery reports)
_ARCH_BY_FAMILY = {"kepler": "Kepler", "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta", "turing": "Turing",
                   "ampere": "Ampere", "ada-lovelace": "Ada Lovelace", "hopper": "Hopper", "blackwell": "Blackwell"}
_BDF = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-9a-f])$")


@dataclass(frozen=True)
class DraOptions:
    driver: str = DRIVER
    shares: bool = True  # whole GPUs take several claims by consumable capacity
    nvidia_attributes: bool = True  # also publish attributes under gpu.nvidia.com/ (NVIDIA's claims match unchanged)
    sysfs_root: str = "/sys"  # for resource.kubernetes.io/pcieRoot


@dataclass(frozen=True)
class Published:
    """What the kubelet plugin needs about one device it published."""

    name: str
    kind: str  # "gpu" | "mig"
    gpu_index: int
    uuid: str  # the GPU's, or the MIG instance's
    parent_uuid: str
    memory_bytes: int
    shareable: bool
    profile: str = ""


@dataclass(frozen=True)
class Fault:
    """Why a GPU is unhealthy, for its device taint."""

    reason: str  # HealthTracker's: "XID 79", "NVML cannot query the device"
    since: str  # RFC 3339, when it became unhealthy (the taint's timeAdded)


@dataclass
class DeviceSet:
    devices: list[dict] = field(default_factory=list)  # resource.k8s.io/v1 Device objects, in slice order
    published: dict[str, Published] = field(default_factory=dict)


def quantity_bytes(n: int) -> str:
    """A byte count in Kubernetes' canonical form (the largest binary suffix that divides it: 80Gi, 81559Mi)."""
    if n <= 0:
        return "0"
    for suffix, exp in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << exp) == 0:
            return f"{n >> exp}{suffix}"
    return str(n)


_SUFFIX: dict[str, int | Fraction] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


def parse_quantity(raw: object) -> int:
    """A Kubernetes quantity ("20Gi", "1k", "21474836480", "1.5e3") as an integer, rounded up; ValueError if malformed."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise ValueError(f"not a quantity: {raw!r}")
    m = _QUANTITY.match(str(raw).strip())
    if not m:
        raise ValueError(f"not a quantity: {raw!r}")
    num, exp, suffix = m.groups()
    v = Fraction(num) * (Fraction(10) ** int(exp[1:]) if exp else _SUFFIX[suffix or ""])
    return -((-v.numerator) // v.denominator)


def semver(raw: str) -> str | None:
    """A version as strict semver (major.minor.patch, no leading zeros): "535.161.08" -> "535.161.8", "8.0" -> "8.0.0"."""
    parts = raw.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in nums)


def pci_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's "00000000:07:00.0" as extended BDF "0000:07:00.0" (lower case), as go-nvlib's GetPCIBusID does."""
    bdf = nvml_bus_id.strip().lower()
    if len(bdf) == 16 and bdf.startswith("0000"):
        bdf = bdf[4:]
    return bdf if _BDF.match(bdf) else None


def pcie_root(bdf: str, sysfs_root: str = "/sys") -> str | None:
    """The PCIe root complex (``pci0000:00``) of a device, from the ``/sys/bus/pci/devices/<bdf>`` link."""
    link = os.path.join(sysfs_root, "bus", "pci", "devices", bdf)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    rel = os.path.normpath(os.path.join("bus/pci/devices", target)) if not os.path.isabs(target) else \
        os.path.relpath(target, sysfs_root)
    parts = rel.split(os.sep)
    if len(parts) < 3 or parts[0] != "devices" or not parts[1].startswith("pci") or parts[-1] != bdf:
        return None
    return parts[1]


def device_name(g: GpuInfo, m: MigInfo | None = None) -> str:
    """``gpu-<index>``; MIG: ``gpu-<index>-mig-<profile without dots>-<GPU instance>`` (DNS labels)."""
    if m is None:
        return f"gpu-{g.index}"
    prof = re.sub(r"[^a-z0-9-]", "-", m.profile.lower().replace(".", "")).strip("-")
    return f"gpu-{g.index}-mig-{prof}-{m.instance_id}"


def _s(v: str) -> dict:
    return {"string": v[:64]}


def _v(v: str) -> dict:
    return {"version": v}


def _common(g: GpuInfo, drv: DriverInfo, opts: DraOptions) -> dict[str, dict]:
    """Attributes a GPU and its MIG instances share, unqualified (the driver's domain)."""
    attrs: dict[str, dict] = {"productName": _s(g.name)}
    if g.brand:
        attrs["brand"] = _s(g.brand)
    arch = _ARCH_BY_FAMILY.get(g.family, "")
    if arch:
        attrs["architecture"] = _s(arch)
    for key, raw in (("cudaComputeCapability", f"{g.compute_capability[0]}.{g.compute_capability[1]}"),
                     ("driverVersion", drv.driver_version),
                     ("cudaDriverVersion", f"{drv.cuda_version[0]}.{drv.cuda_version[1]}")):
        v = semver(raw)
        if v is None:
            log.warning("GPU %d: %s %r is not a version; attribute left out", g.index, key, raw)
        else:
            attrs[key] = _v(v)
    attrs["index"] = {"int": g.index}
    return attrs


def _standard(g: GpuInfo, opts: DraOptions) -> dict[str, dict]:
    out: dict[str, dict] = {}
    bdf = pci_bus_id(g.pci_bus_id)
    if bdf is None:
        log.warning("GPU %d: PCI bus id %r is not a BDF; PCI attributes left out", g.index, g.pci_bus_id)
    else:
        out[f"{STANDARD}/pciBusID"] = _s(bdf)
        root = pcie_root(bdf, opts.sysfs_root)
        if root is not None:
            out[f"{STANDARD}/pcieRoot"] = _s(root)
    if g.numa_node >= 0:  # a device with no NUMA affinity must not publish it (it would match every other one)
        out[f"{STANDARD}/numaNode"] = {"int": g.numa_node}
    return out


def _mirror(attrs: dict[str, dict], opts: DraOptions) -> dict[str, dict]:
    if not opts.nvidia_attributes:
        return attrs
    return {**attrs, **{f"{NVIDIA_DOMAIN}/{k}": v for k, v in attrs.items() if "/" not in k and k != "index"}}


def fault_taints(driver: str, fault: Fault | None) -> list[dict]:
    if fault is None:
        return []
    m = re.match(r"^XID (\d+)$", fault.reason)
    if m:
        return [{"key": f"{driver}/xid", "value": m.group(1), "effect": "NoSchedule", "timeAdded": fault.since}]
    return [{"key": f"{driver}/gpu-lost", "effect": "NoSchedule", "timeAdded": fault.since}]


def gpu_capacity(memory_bytes: int, shares: bool) -> dict[str, dict]:
    mem: dict = {"value": quantity_bytes(memory_bytes)}
    if not shares:
        return {"memory": mem}
    full = quantity_bytes(memory_bytes)
    mem["requestPolicy"] = {"default": full, "validRange": {"min": MEMORY_STEP, "max": full, "step": MEMORY_STEP}}
    milli = {"value": str(GPU_MILLI), "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": str(GPU_MILLI), "step": "1"}}}
    return {"memory": mem, "gpuMilli": milli}


def build_devices(gpus: list[GpuInfo], drv: DriverInfo, opts: DraOptions = DraOptions(),
                  faults: dict[int, Fault] | None = None, taints: bool = True) -> DeviceSet:
    """Every device this node publishes: whole GPUs not in MIG mode, and MIG instances.

    ``taints=False``: an unhealthy GPU's devices are not in ``devices`` (the slice), only in ``published``."""
    faults = faults or {}
    out = DeviceSet()
    for g in sorted(gpus, key=lambda g: g.index):
        common = _common(g, drv, opts)
        std = _standard(g, opts)
        fault_t = fault_taints(opts.driver, faults.get(g.index))
        memory_bytes = g.memory_mib * MIB
        if not g.mig_enabled:
            name = device_name(g)
            dev: dict = {"name": name,
                         "attributes": {**_mirror({"type": _s("gpu"), "uuid": _s(g.uuid), **common}, opts), **std},
                         "capacity": gpu_capacity(memory_bytes, opts.shares)}
            if opts.shares:
                dev["allowMultipleAllocations"] = True
                # the share class selects on this, not on allowMultipleAllocations, which a 1.35 kube-apiserver's CEL
                # does not know (deploy/dra/shares): one DeviceClass for every release
                dev["attributes"][SHAREABLE] = {"bool": True}
            if opts.nvidia_attributes:
                dev["capacity"][f"{NVIDIA_DOMAIN}/memory"] = _mirror_capacity(memory_bytes, opts.shares)
            if fault_t:
                dev["taints"] = fault_t
            if taints or not fault_t:
                out.devices.append(dev)
            out.published[name] = Published(name, "gpu", g.index, g.uuid, g.uuid, memory_bytes, opts.shares)
            continue
        for m in g.mig:
            name = device_name(g, m)
            attrs = {"type": _s("mig"), "uuid": _s(m.uuid), "parentUUID": _s(g.uuid), "profile": _s(m.profile), **common}
            mdev: dict = {"name": name, "attributes": {**_mirror(attrs, opts), **std},
                          "capacity": {"memory": {"value": quantity_bytes(m.memory_mib * MIB)}}}
            if opts.nvidia_attributes:
                mdev["capacity"][f"{NVIDIA_DOMAIN}/memory"] = {"value": quantity_bytes(m.memory_mib * MIB)}
            if fault_t:
                mdev["taints"] = fault_t
            if taints or not fault_t:
                out.devices.append(mdev)
            out.published[name] = Published(name, "mig", g.index, m.uuid, g.uuid, m.memory_mib * MIB, False, m.profile)
    return out


def _mirror_capacity(memory_bytes: int, shares: bool) -> dict:
    """``gpu.nvidia.com/memory`` for selectors only: on a shared device it must not be consumed (default 0)."""
    cap: dict = {"value": quantity_bytes(memory_bytes)}
    if shares:
        cap["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": quantity_bytes(memory_bytes), "step": MEMORY_STEP}}
    return cap


__all__ = ["DRIVER", "SHAREABLE", "DeviceSet", "DraOptions", "Fault", "Published", "build_devices", "device_name", "gpu_capacity",
           "parse_quantity", "pci_bus_id", "pcie_root", "quantity_bytes", "semver"]
