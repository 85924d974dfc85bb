"""GPU metrics with dcgm-exporter's names, attributed to pods -- correctly on shared GPUs.

Metric and label names follow dcgm-exporter (``DCGM_FI_DEV_GPU_UTIL`` ...,
labels ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, plus
``container``, ``namespace``, ``pod``) so existing dashboards and alerts keep
working when the gpufleet agent replaces dcgm-exporter.

Which container holds which GPU comes from kubelet's PodResources API (v1
``List``).  A gpufleet fractional pod is handed the GPU its
``gpufleet.io/assignment`` names, which can differ from the device ID kubelet
recorded, so when an assignment source is given it wins for that pod.

A GPU held by one container gets its device numbers with that container's
labels, like dcgm-exporter.  A GPU shared by several containers (time-slicing
replicas, gpufleet shares, MIG instances of one GPU) is where dcgm-exporter
gives every sharer the same whole-GPU numbers; here each sharer gets its own
``DCGM_FI_DEV_FB_USED`` (its processes' memory) and ``DCGM_FI_DEV_GPU_UTIL``
(their SM utilisation) from NVML's per-process accounting, the processes found
through a pid -> container resolver (``/proc/<pid>/cgroup`` + a pod index in
production, injected in tests).  What no sharer's process explains is
exported unattributed, so per-GPU sums still equal the device's numbers; the
other metrics are device-wide and exported once per GPU, unattributed.

``gpufleet_pod_gpu_allocated`` says how much of each GPU a container holds (1 a
whole GPU, 0.5 a 500-milli share, 3/7 a MIG 3g slice), labelled like the
utilisation series plus the pod's workload (``workload_kind``, ``workload``:
Deployment from a ReplicaSet's pod-template-hash, else the controller owner).
Divided into the utilisation series it gives a pod's use of *its own part* of
the GPU -- what an autoscaler must target (a 0.5 share busy 35% of the GPU is
at 70% of what it holds); ``deploy/autoscaling`` records that.  It is exported
only when the pods' assignments could be read (API access): without them a
share could not be told from a whole GPU, and a wrong denominator would make an
autoscaler act on garbage.

One scrape reads NVML once per GPU (a custom collector): telemetry per GPU,
the process list only when some GPU is shared, and no inventory walk (the
GPU list is read at start and on ``refresh_inventory``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Protocol

from prometheus_client.core import GaugeMetricFamily

from ..engine.gpu_models import mig_fraction
from .nvml import Backend, GpuInfo

log = logging.getLogger(__name__)

METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", "gpu_util_pct"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", "mem_copy_util_pct"),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", "fb_used_mib"),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", "fb_free_mib"),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", "temp_c"),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", "power_w"),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", "sm_clock_mhz"),
}
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
HEALTH_METRIC = "gpufleet_gpu_healthy"
PODRESOURCES_UP = "gpufleet_exporter_podresources_up"
SCRAPE_SECONDS = "gpufleet_exporter_collect_seconds"
ALLOCATED_METRIC = "gpufleet_pod_gpu_allocated"
ALL_METRICS = (*METRICS, XID_METRIC, HEALTH_METRIC, PODRESOURCES_UP, SCRAPE_SECONDS)  # every scrape; ALLOCATED_METRIC when pods are known
DEVICE_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
LABELS = DEVICE_LABELS + ["container", "namespace", "pod"]
ALLOCATED_LABELS = LABELS + ["workload_kind", "workload", "queue"]
PER_SHARER = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL")
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


class PodDevices(Protocol):
    def devices(self) -> dict[str, list[ContainerRef]]: ...  # GPU or MIG UUID -> containers holding it


@dataclass(frozen=True)
class PodMeta:
    """What the allocation metric needs of a pod on this node (from its JSON)."""

    gpu_milli: int = 0  # the assignment's compute share per GPU; 0 or 1000: whole GPUs (or a memory-only share)
    gpu_memory_mib: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> MiB a memory share reserved there
    mig: Mapping[str, float] = field(default_factory=dict)  # GPU UUID -> part of it the assigned MIG instances are
    workload_kind: str = "Pod"
    workload: str = ""
    queue: str = ""  # the team queue the scheduler admitted it under (assignment), else its gpufleet.io/queue


def workload_of(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of the pod's workload, from the pod alone (no owner lookups on the node).

    A ReplicaSet named ``<deployment>-<pod-template-hash>`` (the Deployment controller's naming, with the hash
    also on the pod as the ``pod-template-hash`` label) is its Deployment; any other controller owner stands for
    itself (StatefulSet, DaemonSet, Job, a bare ReplicaSet); a pod without one is its own workload.
    """
    meta = pod.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, Mapping) and r.get("kind") and r.get("name")]
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return "Pod", str(meta.get("name") or "")
    kind, name = str(ref["kind"]), str(ref["name"])
    h = str((meta.get("labels") or {}).get("pod-template-hash") or "")
    if kind == "ReplicaSet" and h and name.endswith("-" + h) and len(name) > len(h) + 1:
        return "Deployment", name[: -len(h) - 1]
    return kind, name


def pod_meta_from_json(pods: Iterable[Mapping]) -> dict[tuple[str, str], PodMeta]:
    """Pod JSON (the pods on this node) -> {(namespace, pod): PodMeta}; a malformed assignment counts as none."""
    import json

    from ..engine.annotations import ASSIGNMENT, QUEUE

    out: dict[tuple[str, str], PodMeta] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        kind, name = workload_of(p)
        milli, mem, mig = 0, dict[str, int](), dict[str, float]()
        raw = (meta.get("annotations") or {}).get(ASSIGNMENT)
        queue = str((meta.get("annotations") or {}).get(QUEUE) or "")
        if raw:
            try:
                d = json.loads(raw)
                if isinstance(d.get("queue"), str) and d["queue"]:
                    queue = d["queue"]
                m = d.get("gpu_milli") or 0
                milli = m if isinstance(m, int) and 0 < m < 1000 else 0
                gpus = [g for g in d.get("gpus") or [] if isinstance(g, Mapping) and g.get("uuid")]
                for g, mib in zip(gpus, d.get("gpu_memory_mib") or []):
                    if isinstance(mib, int) and mib > 0:
                        mem[str(g["uuid"])] = mib
                uuid_of = {g.get("index"): str(g["uuid"]) for g in gpus}
                for inst in d.get("mig") or []:
                    u = uuid_of.get(inst.get("gpu"))
                    if u:
                        mig[u] = mig.get(u, 0.0) + mig_fraction(str(d.get("mig_profile") or ""))
            except (ValueError, AttributeError, TypeError):
                milli, mem, mig = 0, {}, {}  # the scheduler and the device plugin report malformed annotations
        out[(meta.get("namespace") or "default", meta.get("name") or "")] = PodMeta(milli, mem, mig, kind, name, queue)
    return out


def held_fraction(gpu: GpuInfo, device: str, meta: PodMeta) -> float:
    """How much of ``gpu`` a container holds through ``device`` (the GPU's or one of its MIG instances' UUID)."""
    for m in gpu.mig:
        if m.uuid == device:
            return mig_fraction(m.profile)
    if gpu.uuid in meta.mig:  # MIG instances the assignment names, attributed to their GPU
        return min(1.0, meta.mig[gpu.uuid])
    if 0 < meta.gpu_milli < 1000:
        return meta.gpu_milli / 1000.0
    mib = meta.gpu_memory_mib.get(gpu.uuid, 0)
    if mib > 0 and gpu.memory_mib > 0:  # a memory-only share: its part of the GPU's memory
        return min(1.0, mib / gpu.memory_mib)
    return 1.0


def device_uuid(device_id: str) -> str:
    """kubelet device ID -> GPU/MIG UUID (time-slicing replicas are ``<uuid>::<k>``)."""
    return device_id.split("::", 1)[0]


class KubeletPodResources:
    """GPU UUID -> containers, from kubelet's PodResources ``List`` over its unix socket.

    The gRPC channel is kept between scrapes (a new channel costs more than the
    call) and re-made after an error, e.g. when kubelet restarted.
    """

    def __init__(self, socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock", timeout_s: float = 2.0,
                 dra_uuid: Callable[[str, str, str], str | None] | None = None) -> None:
        self.socket, self.timeout_s = socket, timeout_s
        # DRA claims' devices (driver, pool, device) -> GPU/MIG UUID: the agent in --dra mode knows its own
        self.dra_uuid = dra_uuid
        self._channel: Any = None
        self._stub: Any = None
        self._lock = threading.Lock()

    def _connect(self):
        import grpc

        from .podresources import podresources_pb2_grpc as pbg

        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._stub = pbg.PodResourcesListerStub(self._channel)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def devices(self) -> dict[str, list[ContainerRef]]:
        from .podresources import podresources_pb2 as pb

        with self._lock:
            if self._stub is None:
                self._connect()
            stub = self._stub
        try:
            resp = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except Exception:
            self.close()
            raise
        out: dict[str, list[ContainerRef]] = {}
        for p in resp.pod_resources:
            for c in p.containers:
                ref = ContainerRef(p.namespace, p.name, c.name)
                for d in c.devices:
                    if not d.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                        continue
                    for dev in d.device_ids:
                        lst = out.setdefault(device_uuid(dev), [])
                        if ref not in lst:
                            lst.append(ref)
                if self.dra_uuid is None:
                    continue
                for dr in c.dynamic_resources:
                    for cr in dr.claim_resources:
                        u = self.dra_uuid(cr.driver_name, cr.pool_name, cr.device_name)
                        if u:
                            lst = out.setdefault(u, [])
                            if ref not in lst:
                                lst.append(ref)
        return out


def apply_assignments(holders: Mapping[str, list[ContainerRef]], assigned: Mapping[tuple[str, str], list[str]]) -> dict[str, list[ContainerRef]]:
    """Move pods with a gpufleet assignment onto the GPUs it names (pure).

    ``assigned``: (namespace, pod) -> GPU UUIDs from ``gpufleet.io/assignment``.
    kubelet recorded whichever device ID it picked; the agent's Allocate gave
    the container the assigned GPU instead.
    """
    out: dict[str, list[ContainerRef]] = {}
    moved: dict[tuple[str, str], list[ContainerRef]] = {}
    for uuid, refs in holders.items():
        for r in refs:
            if assigned.get((r.namespace, r.pod)):
                moved.setdefault((r.namespace, r.pod), [])
                if r not in moved[(r.namespace, r.pod)]:
                    moved[(r.namespace, r.pod)].append(r)
            else:
                out.setdefault(uuid, []).append(r)
    for key, refs in moved.items():
        for uuid in assigned[key]:
            lst = out.setdefault(uuid, [])
            lst.extend(r for r in refs if r not in lst)
    return out


# --- pid -> container -----------------------------------------------------------------------

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")


def parse_cgroup(text: str) -> tuple[str, str] | None:
    """``/proc/<pid>/cgroup`` -> (pod UID, container ID), cgroup v1 or v2, cgroupfs or systemd paths."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _POD_UID.search(path)
        if not m:
            continue
        ids = _CONTAINER_ID.findall(path)
        if ids:
            return m.group(1).replace("_", "-"), ids[-1]
    return None


@dataclass(frozen=True)
class PodEntry:
    namespace: str
    name: str
    containers: Mapping[str, str]  # container ID (hex, no runtime prefix) -> container name


def pod_index_from_json(pods: Iterable[Mapping]) -> dict[str, PodEntry]:
    """Pod JSON (the pods on this node) -> {pod UID: PodEntry}."""
    out: dict[str, PodEntry] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            continue
        conts = {}
        st = p.get("status") or {}
        for cs in (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or []):
            cid = (cs.get("containerID") or "").split("://", 1)[-1]
            if cid and cs.get("name"):
                conts[cid] = cs["name"]
        out[uid] = PodEntry(meta.get("namespace") or "default", meta.get("name") or "", conts)
    return out


class CgroupResolver:
    """pid -> ContainerRef: pod UID and container ID from ``/proc/<pid>/cgroup``, names from a pod index.

    Needs the host's PID namespace (``hostPID: true``): NVML reports host PIDs.
    The index (pod UID -> names) is re-read at most every ``index_ttl_s``, or
    at once when a pod UID is not in it yet.
    """

    def __init__(self, index: Callable[[], Mapping[str, PodEntry]], proc_root: str = "/proc", index_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._index_fn, self.proc_root, self.ttl, self.clock = index, proc_root, index_ttl_s, clock
        self._index: Mapping[str, PodEntry] = {}
        self._index_at = -1e18
        self._lock = threading.Lock()

    def _entries(self, force: bool = False) -> Mapping[str, PodEntry]:
        now = self.clock()
        if force and now - self._index_at < 2.0:
            force = False  # a burst of unknown pods does not hammer the API
        if force or now - self._index_at > self.ttl:
            try:
                self._index = self._index_fn()
            except Exception as exc:
                log.warning("pod index for process attribution unavailable: %s", exc)
            self._index_at = now
        return self._index

    def __call__(self, pid: int) -> ContainerRef | None:
        try:
            with open(os.path.join(self.proc_root, str(pid), "cgroup")) as f:
                found = parse_cgroup(f.read())
        except OSError:
            return None
        if found is None:
            return None
        uid, cid = found
        with self._lock:
            entry = self._entries().get(uid)
            if entry is None:
                entry = self._entries(force=True).get(uid)
        if entry is None:
            return None
        name = entry.containers.get(cid)
        if name is None and len(set(entry.containers.values())) == 1:
            name = next(iter(entry.containers.values()))
        return ContainerRef(entry.namespace, entry.name, name or "")


class KubeNodePods:
    """Pods on this node through the API (official client), for the resolver, the assignments and the allocations.

    The list is kept ``ttl_s``; a pod kubelet reports that the list does not have yet (just started) makes it be
    read again at once, at most every ``min_refresh_s``, so a new replica's series follow within a scrape or two.
    """

    def __init__(self, core_v1, node: str, ttl_s: float = 15.0, min_refresh_s: float = 2.0) -> None:
        self.core, self.node, self.ttl, self.min_refresh_s = core_v1, node, ttl_s, min_refresh_s
        self._pods: list[dict] = []
        self._at = -1e18

    def pods(self, force: bool = False) -> list[dict]:
        age = time.monotonic() - self._at
        if age > self.ttl or (force and age > self.min_refresh_s):
            items = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
            self._pods = [self.core.api_client.sanitize_for_serialization(x) for x in items]
            self._at = time.monotonic()
        return self._pods

    def pod_meta(self, wanted: Collection[tuple[str, str]] = ()) -> dict[tuple[str, str], PodMeta]:
        meta = pod_meta_from_json(self.pods())
        if any(k not in meta for k in wanted):
            meta = pod_meta_from_json(self.pods(force=True))
        return meta

    def index(self) -> dict[str, PodEntry]:
        return pod_index_from_json(self.pods())

    def node_labels(self) -> dict[str, str]:
        """This node's labels (instance type, spot or on-demand), re-read at most every minute."""
        if time.monotonic() - getattr(self, "_labels_at", -1e18) > 60.0:
            self._labels = dict(self.core.read_node(self.node).metadata.labels or {})
            self._labels_at = time.monotonic()
        return self._labels

    def assignments(self) -> dict[tuple[str, str], list[str]]:
        import json

        from ..engine.annotations import ASSIGNMENT

        out = {}
        for p in self.pods():
            meta = p.get("metadata") or {}
            raw = (meta.get("annotations") or {}).get(ASSIGNMENT)
            if not raw:
                continue
            try:
                uuids = [g.get("uuid") for g in json.loads(raw).get("gpus") or [] if g.get("uuid")]
            except (ValueError, AttributeError):
                continue  # the scheduler and the device plugin report malformed annotations
            if uuids:
                out[(meta.get("namespace") or "default", meta.get("name") or "")] = uuids
        return out


# --- the collector ----------------------------------------------------------------------------


class GpuCollector:
    """prometheus_client custom collector: one NVML pass per scrape."""

    def __init__(self, backend: Backend, hostname: str, pods: PodDevices | None = None,
                 pid_to_container: Callable[[int], ContainerRef | None] | None = None,
                 assignments: Callable[[], Mapping[tuple[str, str], list[str]]] | None = None,
                 health: Callable[[], Mapping[int, bool]] | None = None,
                 pod_meta: Callable[[Collection[tuple[str, str]]], Mapping[tuple[str, str], PodMeta]] | None = None,
                 cost: "CostContext | None" = None) -> None:
        self.backend = backend
        self.cost = cost  # who holds which share of each GPU, what it is and costs (agent.allocation)
        self.hostname = hostname
        self.pods = pods
        self.pid_to_container = pid_to_container or (lambda pid: None)
        self.assignments = assignments
        self.health = health
        self.pod_meta = pod_meta
        self.xid_counts: dict[int, int] = {}
        self.last_xid: dict[int, int] = {}
        self._gpus: list[GpuInfo] = backend.gpus()

    def refresh_inventory(self) -> None:
        self._gpus = self.backend.gpus()

    def note_xids(self, events: Iterable) -> None:
        for e in events:
            self.last_xid[e.gpu_index] = e.xid
            self.xid_counts[e.gpu_index] = self.xid_counts.get(e.gpu_index, 0) + 1

    def _holders(self) -> tuple[dict[str, list[ContainerRef]], bool, Mapping[tuple[str, str], PodMeta] | None]:
        """(GPU/MIG UUID -> containers, PodResources answered, pod metadata or None when it could not be read)."""
        if self.pods is None:
            return {}, False, None
        try:
            holders = self.pods.devices()
        except Exception as exc:  # kubelet away (restarting): device metrics still flow, unattributed
            log.debug("PodResources List failed: %s", exc)
            return {}, False, None
        meta = None
        if self.pod_meta is not None:  # first: it re-reads the node's pods when a new one holds a GPU
            try:
                meta = self.pod_meta({(r.namespace, r.pod) for refs in holders.values() for r in refs})
            except Exception as exc:
                log.debug("pod metadata unavailable: %s", exc)
        if self.assignments is not None:
            try:
                holders = apply_assignments(holders, self.assignments())
            except Exception as exc:
                log.debug("assignments unavailable: %s", exc)
                meta = None  # who holds which GPU is kubelet's guess now: no allocations from it
        return holders, True, meta

    def _allocated(self, holders: Mapping[str, list[ContainerRef]], meta: Mapping[tuple[str, str], PodMeta]) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(ALLOCATED_METRIC, "Part of this GPU the container holds (1 a whole GPU, 0.5 a 500-milli "
                                "share, 3/7 a MIG 3g instance); DCGM_FI_DEV_GPU_UTIL over it is the use of its own part.",
                                labels=ALLOCATED_LABELS)
        for g in self._gpus:
            held: dict[ContainerRef, float] = {}
            for dev in (g.uuid, *(m.uuid for m in g.mig)):
                for r in holders.get(dev, []):
                    pm = meta.get((r.namespace, r.pod))
                    if pm is not None:  # a pod not listed yet: no series rather than a guess
                        held[r] = held.get(r, 0.0) + held_fraction(g, dev, pm)
            for r, frac in held.items():
                pm = meta[(r.namespace, r.pod)]
                fam.add_metric([str(g.index), g.uuid, f"nvidia{g.dev_minor}", g.name, self.hostname, r.container, r.namespace,
                                r.pod, pm.workload_kind, pm.workload, pm.queue], round(frac, 6))
        return fam

    def collect(self):
        t0 = time.perf_counter()
        fams = {name: GaugeMetricFamily(name, help_, labels=LABELS) for name, (help_, _) in METRICS.items()}
        xid = GaugeMetricFamily(XID_METRIC, "Value of the last XID error encountered.", labels=LABELS)
        healthy = GaugeMetricFamily(HEALTH_METRIC, "1 if the GPU is healthy (no fatal XID, NVML answers), else 0.", labels=DEVICE_LABELS)
        holders, up, meta = self._holders()
        users_of: dict[int, list[ContainerRef]] = {}
        for g in self._gpus:
            users = list(holders.get(g.uuid, []))
            for m in g.mig:  # MIG instances are attributed to the GPU they live on
                users += [u for u in holders.get(m.uuid, []) if u not in users]
            users_of[g.index] = users
        shared = any(len(u) > 1 for u in users_of.values())
        procs = []
        if shared:
            try:
                procs = self.backend.processes()
            except Exception as exc:
                log.warning("NVML process list failed: %s", exc)
        health = None
        if self.health is not None:
            try:
                health = self.health()
            except Exception as exc:
                log.debug("health source failed: %s", exc)
        owners: dict[int, ContainerRef | None] = {}
        for g in self._gpus:
            base = [str(g.index), g.uuid, f"nvidia{g.dev_minor}", g.name, self.hostname]
            ok = health.get(g.index, True) if health is not None else self.backend.device_ok(g.index)
            healthy.add_metric(base, 1.0 if ok else 0.0)
            try:
                t = self.backend.telemetry(g.index)
            except Exception as exc:  # a GPU fallen off the bus: the others still report
                log.warning("telemetry of GPU %d failed: %s", g.index, exc)
                continue
            users = users_of[g.index]
            if len(users) <= 1:
                who = users[0] if users else None
                lab = base + ([who.container, who.namespace, who.pod] if who else ["", "", ""])
                for name, (_, attr) in METRICS.items():
                    if getattr(t, attr) is not None:  # None: this GPU cannot report it (utilisation in MIG mode)
                        fams[name].add_metric(lab, float(getattr(t, attr)))
                xid.add_metric(lab, float(self.last_xid.get(g.index, 0)))
                continue
            # shared GPU: per-container numbers from per-process accounting
            per: dict[ContainerRef, list[int]] = {u: [0, 0] for u in users}
            for p in procs:
                if p.gpu_index != g.index:
                    continue
                if p.pid not in owners:
                    try:
                        owners[p.pid] = self.pid_to_container(p.pid)
                    except Exception:
                        owners[p.pid] = None
                ref = owners[p.pid]
                if ref is not None and ref not in per:
                    # resolver knows the pod but not the container name: match on the pod
                    ref = next((u for u in users if (u.namespace, u.pod) == (ref.namespace, ref.pod)), None)
                if ref in per:
                    per[ref][0] += p.used_memory_mib
                    per[ref][1] += p.sm_util_pct
            mem_sum = util_sum = 0
            for u, (mem, util) in per.items():
                lab = base + [u.container, u.namespace, u.pod]
                fams["DCGM_FI_DEV_FB_USED"].add_metric(lab, float(mem))
                if t.gpu_util_pct is not None:  # no device figure (MIG mode): no per-process one either
                    fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(lab, float(min(util, 100)))
                mem_sum += mem
                util_sum += min(util, 100)
            lab = base + ["", "", ""]  # device-wide values once, unattributed
            if t.fb_used_mib is not None:
                fams["DCGM_FI_DEV_FB_USED"].add_metric(lab, float(max(0, t.fb_used_mib - mem_sum)))
            if t.gpu_util_pct is not None:
                fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(lab, float(max(0, t.gpu_util_pct - util_sum)))
            for name, (_, attr) in METRICS.items():
                if name not in PER_SHARER and getattr(t, attr) is not None:
                    fams[name].add_metric(lab, float(getattr(t, attr)))
            xid.add_metric(lab, float(self.last_xid.get(g.index, 0)))
        yield from fams.values()
        yield xid
        yield healthy
        if meta is not None:
            yield self._allocated(holders, meta)
        if self.cost is not None and meta is not None:  # who holds what is known (the allocation series above)
            yield from self._cost_families()
        pr = GaugeMetricFamily(PODRESOURCES_UP, "1 if kubelet's PodResources API answered this scrape.")
        pr.add_metric([], 1.0 if up else 0.0)
        yield pr
        dur = GaugeMetricFamily(SCRAPE_SECONDS, "Time this collector took for the scrape (s).")
        dur.add_metric([], time.perf_counter() - t0)
        yield dur


    def _cost_families(self) -> list:
        from .allocation import families

        c = self.cost
        assert c is not None
        try:
            labels = c.node_labels()
        except Exception as exc:  # API away: the node's instance and capacity type are unknown: no cost series
            log.debug("node labels unavailable: %s", exc)
            return []
        book, ok = c.prices()
        return families(self._gpus, self.hostname, c.node, labels, book, ok)


class CostContext:
    """What the cost series need beyond the allocation series: the node's labels and the price file."""

    def __init__(self, node_pods: "KubeNodePods", prices_path: str | None = None) -> None:
        from .allocation import PriceFile

        self.node = node_pods.node
        self._pods = node_pods
        self._prices = PriceFile(prices_path)

    def node_labels(self) -> Mapping[str, str]:
        return self._pods.node_labels()

    def prices(self):
        return self._prices.get()


def build_collector(backend: Backend, hostname: str, pod_resources_socket: str | None, core_v1=None, node_name: str = "",
                    health: Callable[[], Mapping[int, bool]] | None = None, proc_root: str = "/proc",
                    dra_uuid: Callable[[str, str, str], str | None] | None = None,
                    prices_path: str | None = None) -> GpuCollector:
    """The production wiring: PodResources, and with API access the pid resolver, gpufleet assignments and the
    cost series (``agent.allocation``)."""
    pods = KubeletPodResources(pod_resources_socket, dra_uuid=dra_uuid) if pod_resources_socket else None
    resolver = assignments = pod_meta = cost = None
    if core_v1 is not None and node_name:
        node_pods = KubeNodePods(core_v1, node_name)
        resolver = CgroupResolver(node_pods.index, proc_root=proc_root)
        assignments = node_pods.assignments
        pod_meta = node_pods.pod_meta
        cost = CostContext(node_pods, prices_path)
    return GpuCollector(backend, hostname, pods, resolver, assignments, health, pod_meta, cost)
