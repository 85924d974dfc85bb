"""GPU metrics with dcgm-exporter's names, attributed to pods -- correctly on shared GPUs.

Metric and label names follow dcgm-exporter (``DCGM_FI_DEV_GPU_UTIL`` ...,
labels ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, plus
``pod``, ``namespace``, ``container``) so existing dashboards keep working.

Which container holds which GPU comes from kubelet's PodResources API.  A GPU
held by one container gets its device numbers with that container's labels,
like dcgm-exporter.  A GPU shared by several containers (time-slicing
replicas, or a fractional gpufleet assignment) is where dcgm-exporter gives
every sharer the same, whole-GPU numbers; here each sharer gets its own
series from NVML's per-process accounting (``FB_USED`` = its processes'
memory, ``GPU_UTIL`` = their SM utilisation), its processes found through a
pid -> container resolver (``/proc/<pid>/cgroup`` in production, injected in
tests).  One scrape reads NVML once (a custom collector).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from prometheus_client.core import GaugeMetricFamily

from .nvml import Backend

METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", "gpu_util_pct"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", "mem_copy_util_pct"),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", "fb_used_mib"),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", "fb_free_mib"),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", "temp_c"),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", "power_w"),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", "sm_clock_mhz"),
}
LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "container", "namespace", "pod"]


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


class PodDevices(Protocol):
    def devices(self) -> dict[str, list[ContainerRef]]: ...  # physical GPU UUID -> containers holding it


class KubeletPodResources:
    """GPU UUID -> containers, from kubelet's PodResources List over its unix socket."""

    def __init__(self, socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock", timeout_s: float = 2.0) -> None:
        self.socket, self.timeout_s = socket, timeout_s

    def devices(self) -> dict[str, list[ContainerRef]]:
        import grpc

        from .podresources import podresources_pb2 as pb
        from .podresources import podresources_pb2_grpc as pbg

        with grpc.insecure_channel(f"unix://{self.socket}") as ch:
            resp = pbg.PodResourcesListerStub(ch).List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        out: dict[str, list[ContainerRef]] = {}
        for p in resp.pod_resources:
            for c in p.containers:
                for d in c.devices:
                    if not (d.resource_name.startswith("nvidia.com/")):
                        continue
                    for dev in d.device_ids:
                        uuid = dev.split("::", 1)[0]  # time-slicing replica IDs are <uuid>::<k>
                        ref = ContainerRef(p.namespace, p.name, c.name)
                        lst = out.setdefault(uuid, [])
                        if ref not in lst:
                            lst.append(ref)
        return out


_CGROUP_POD = re.compile(r"pod([0-9a-f_\-]{36})")


def cgroup_container_id(pid: int) -> str | None:
    """The container ID in /proc/<pid>/cgroup (last 64-hex token), or None."""
    try:
        text = open(f"/proc/{pid}/cgroup").read()
    except OSError:
        return None
    ids = re.findall(r"([0-9a-f]{64})", text)
    return ids[-1] if ids else None


class GpuCollector:
    def __init__(self, backend: Backend, hostname: str, pods: PodDevices | None = None,
                 pid_to_container: Callable[[int], ContainerRef | None] | None = None) -> None:
        self.backend = backend
        self.hostname = hostname
        self.pods = pods
        self.pid_to_container = pid_to_container or (lambda pid: None)
        self.xid_counts: dict[int, int] = {}
        self.last_xid: dict[int, int] = {}

    def note_xids(self, events: Iterable) -> None:
        for e in events:
            self.last_xid[e.gpu_index] = e.xid
            self.xid_counts[e.gpu_index] = self.xid_counts.get(e.gpu_index, 0) + 1

    def collect(self):
        fams = {name: GaugeMetricFamily(name, help_, labels=LABELS) for name, (help_, _) in METRICS.items()}
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS)
        gpus = self.backend.gpus()
        try:
            holders = self.pods.devices() if self.pods else {}
        except Exception:  # kubelet away (restarting): device metrics still flow, unattributed
            holders = {}
        procs = self.backend.processes() if any(len(v) > 1 for v in holders.values()) else []
        for g in gpus:
            t = self.backend.telemetry(g.index)
            base = [str(g.index), g.uuid, f"nvidia{g.index}", g.name, self.hostname]
            users = list(holders.get(g.uuid, []))
            for m in g.mig:  # MIG instances are attributed to the GPU they live on
                users += [u for u in holders.get(m.uuid, []) if u not in users]
            if len(users) <= 1:
                who = users[0] if users else None
                lab = base + ([who.container, who.namespace, who.pod] if who else ["", "", ""])
                for name, (_, attr) in METRICS.items():
                    fams[name].add_metric(lab, float(getattr(t, attr)))
                xid.add_metric(lab, float(self.last_xid.get(g.index, 0)))
                continue
            # shared GPU: per-container numbers from per-process accounting
            per: dict[ContainerRef, list[int]] = {u: [0, 0] for u in users}
            for p in procs:
                if p.gpu_index != g.index:
                    continue
                ref = self.pid_to_container(p.pid)
                if ref in per:
                    per[ref][0] += p.used_memory_mib
                    per[ref][1] += p.sm_util_pct
            for u, (mem, util) in per.items():
                lab = base + [u.container, u.namespace, u.pod]
                fams["DCGM_FI_DEV_FB_USED"].add_metric(lab, float(mem))
                fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(lab, float(min(util, 100)))
            lab = base + ["", "", ""]  # device-wide values once, unattributed
            for name, (_, attr) in METRICS.items():
                if name not in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"):
                    fams[name].add_metric(lab, float(getattr(t, attr)))
            xid.add_metric(lab, float(self.last_xid.get(g.index, 0)))
        yield from fams.values()
        yield xid
