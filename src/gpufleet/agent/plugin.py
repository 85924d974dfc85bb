"""The kubelet device plugin (gRPC v1beta1 over unix sockets).

One server per advertised resource:

* ``nvidia.com/gpu``: whole GPUs (not in MIG mode), device ID = GPU UUID; with
  time-slicing, ``replicas`` IDs per GPU (``<uuid>::<k>``), optionally under
  the name ``nvidia.com/gpu.shared``;
* ``nvidia.com/mig-<profile>`` (MIG strategy ``mixed``): one ID per MIG
  instance; with strategy ``single`` MIG instances are ``nvidia.com/gpu``.

kubelet names devices, never the pod.  When the pod being admitted carries
the gpufleet scheduler's ``gpufleet.io/assignment`` (found through a
``PodSource``), ``GetPreferredAllocation`` steers kubelet to the devices of the
assigned GPUs (so kubelet's accounting matches) and ``Allocate`` hands the
container exactly those GPUs, with the MPS limits for a GPU share
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
so the share is enforced by an MPS server rather than only accounted.
Without an assignment kubelet's choice stands, helped by a topology-aware
preference (one NVLink island, one NUMA node) -- with one exception, the node
guard: with ``sharesPerGpu`` > 1 every GPU is several ``nvidia.com/gpu``
devices (so gpufleet's shares can each hold one), and a scheduler that counts
allocatable (kube-scheduler) may bind more whole-GPU pods than the node has
GPUs.  Such a pod (no assignment, so it did not ask to share) gets its GPUs only
if no other pod holds them (kubelet's PodResources) or was placed on them by
gpufleet (their assignments); otherwise ``Allocate`` fails and kubelet refuses
the pod with a message naming the GPU and who uses it, rather than start it on a
GPU another pod uses.  When the agent cannot tell (PodResources unreadable) it
refuses too: fail closed.  An admin who set ``replicas`` > 1 (time-slicing)
asked for sharing; there is no guard then.

Every allocation is written to a checkpoint file (atomic replace), so the
agent's restart neither serves one pod's assignment twice nor forgets what it
handed out.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NoReturn, Protocol

import grpc

from ..engine.annotations import GUARD_REFUSAL, RACED_REFUSAL
from ..engine.model import Assignment
from ..files import replace_atomically
from .deviceplugin import api_pb2 as pb
from .deviceplugin import api_pb2_grpc as pbg
from .endpoint import KubeletSocket as KubeletWatcher  # noqa: F401 - the agent's name for it
from .nvml import GpuInfo
from .pause import pause

log = logging.getLogger(__name__)
API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
CHECKPOINT_VERSION = 1
MAX_ANONYMOUS = 512  # kubelet-choice allocations kept in the checkpoint (newest)
# which /dev/nvidia* device specs Allocate returns: all of them (a real GPU node: a missing file is a real fault that
# containerd reports), only those that exist here (the fake backend on a node without a GPU), or none
DEVICE_SPEC_MODES = ("all", "existing", "none")


class AssignmentMismatch(ValueError):
    """The scheduler's assignment does not fit this node's GPUs (stale inventory, wrong node)."""


class AssignmentRefused(Exception):
    """The pod being admitted must not start: its assignment is malformed, stale, or names an unhealthy GPU."""

    def __init__(self, pod_key: str, uid: str, message: str, reason: str = "GpuAssignmentRefused") -> None:
        super().__init__(message)
        self.pod_key, self.uid, self.message, self.reason = pod_key, uid, message, reason


class PodsUnknown(Exception):
    """The pod source cannot tell which pod kubelet admits (the API server away for the whole wait, or refusing us);
    ``retry``: worth another wait (no answer, or a server-side error)."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class DeviceEntry:
    id: str
    gpu_index: int
    gpu_uuid: str  # physical GPU (or MIG instance) UUID handed to the container
    numa_node: int


@dataclass
class InvalidAssignment:
    """A pod bound here whose ``gpufleet.io/assignment`` cannot be used (bad JSON, another node): refuse it."""

    pod_key: str
    uid: str
    message: str

    @property
    def served_key(self) -> str:
        return f"{self.pod_key}#{self.uid}" if self.uid else self.pod_key


@dataclass
class PodAssignment:
    pod_key: str
    assignment: Assignment
    gpu_uuids: list[str]  # as the annotation names them, one per assigned GPU ("" = unknown)
    uid: str = ""
    again: bool = False  # served before, and kubelet still lists it without devices: it is being admitted again

    @property
    def served_key(self) -> str:
        """What the checkpoint remembers: a re-created pod of the same name (new UID) is a new pod."""
        return f"{self.pod_key}#{self.uid}" if self.uid else self.pod_key


@dataclass(frozen=True)
class GpuUse:
    """Who holds this node's GPUs, for the node guard: kubelet's devices and gpufleet's assignments."""

    by_device: dict[str, str]  # kubelet device ID -> the pod (namespace/name) holding it (PodResources)
    by_gpu: dict[int, set[str]]  # GPU index -> pods bound here, not finished, whose gpufleet.io/assignment names it
    admitting: tuple[str, str] | None = None  # (pod, uid) kubelet is admitting without an assignment, when known
    # pods bound here that gpufleet did not place: no assignment, or one the agent recorded from kubelet's devices
    foreign: frozenset[str] = frozenset()


RACED = RACED_REFUSAL  # in the refusal of a pod gpufleet placed on a GPU kubelet gave another scheduler's pod first


class PodSource(Protocol):
    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | None: ...


class NoPods:
    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | None:
        return None

    def gpu_use(self, resource: str, count: int) -> GpuUse | None:
        return None  # no API, no PodResources: the guard cannot tell who uses a GPU


def build_devices(gpus: list[GpuInfo], resource: str, strategy: str = "mixed", replicas: int = 1) -> list[DeviceEntry]:
    """The devices one resource advertises."""
    out: list[DeviceEntry] = []
    if resource.startswith("nvidia.com/mig-"):
        prof = resource[len("nvidia.com/mig-"):]
        for g in gpus:
            for m in g.mig:
                if m.profile == prof:
                    out.append(DeviceEntry(m.uuid, g.index, m.uuid, g.numa_node))
        return out
    for g in gpus:
        if g.mig_enabled:
            if strategy == "single":
                out.extend(DeviceEntry(m.uuid, g.index, m.uuid, g.numa_node) for m in g.mig)
            continue
        if replicas > 1:
            out.extend(DeviceEntry(f"{g.uuid}::{k}", g.index, g.uuid, g.numa_node) for k in range(replicas))
        else:
            out.append(DeviceEntry(g.uuid, g.index, g.uuid, g.numa_node))
    return out


def resources_for(gpus: list[GpuInfo], strategy: str, replicas: int, rename_shared: bool) -> list[str]:
    names = ["nvidia.com/gpu.shared" if replicas > 1 and rename_shared else "nvidia.com/gpu"]
    if strategy == "mixed":
        names += sorted({f"nvidia.com/mig-{m.profile}" for g in gpus for m in g.mig})
    return names


def nvlink_islands(gpus: list[GpuInfo]) -> dict[int, int]:
    """GPU index -> island id: connected components of the NVLink graph (a lone GPU is its own island)."""
    idx = {g.index for g in gpus}
    adj: dict[int, set[int]] = {i: set() for i in idx}
    for g in gpus:
        for p in g.nvlink_peers:
            if p in idx:
                adj[g.index].add(p)
                adj[p].add(g.index)
    island: dict[int, int] = {}
    for start in sorted(idx):
        if start in island:
            continue
        stack = [start]
        while stack:
            i = stack.pop()
            if i in island:
                continue
            island[i] = start
            stack.extend(adj[i] - island.keys())
    return island


class DevicePlugin(pbg.DevicePluginServicer):
    def __init__(self, resource: str, gpus: list[GpuInfo], socket_dir: str, strategy: str = "mixed", replicas: int = 1,
                 pods: PodSource | None = None, slots: int | None = None, checkpoint: str | None = None, state_dir: str | None = None,
                 mps_pipe_dir: str | None = None, device_specs: str = "all", dev_root: str = "/dev") -> None:
        if device_specs not in DEVICE_SPEC_MODES:
            raise ValueError(f"device_specs must be one of {DEVICE_SPEC_MODES}, got {device_specs!r}")
        self.device_specs = device_specs
        self.dev_root = dev_root
        self.resource = resource
        self.strategy = strategy
        self.replicas = replicas
        self.slots = max(replicas, slots or replicas)  # kubelet devices per GPU
        # the node guard: several devices per GPU for gpufleet's shares, not time-slicing the admin asked for
        self.guard = resource == "nvidia.com/gpu" and replicas == 1 and self.slots > 1
        self.gpus = {g.index: g for g in gpus}
        self.devices = build_devices(gpus, resource, strategy, self.slots)
        self.by_id = {d.id: d for d in self.devices}
        self.island = nvlink_islands(gpus)
        self.health: dict[int, bool] = {g.index: True for g in gpus}
        self.socket_dir = socket_dir
        safe = resource.replace("/", "_").replace(".", "-")
        self.endpoint = f"gpufleet-{safe}.sock"
        self.pods = pods or NoPods()
        self.mps_pipe_dir = mps_pipe_dir
        self.checkpoint = Path(checkpoint or os.path.join(state_dir or socket_dir, f"gpufleet-{safe}.checkpoint.json"))
        self._lock = threading.RLock()  # allocations and the checkpoint
        self.allocated: dict[str, dict] = {}  # pod key -> {"devices", "uuids", "time_s"}
        self.anonymous: list[dict] = []  # kubelet's choice, no pod known
        self._load_checkpoint()
        self._cond = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()

    # --- state --------------------------------------------------------------------------
    def _load_checkpoint(self) -> None:
        try:
            data = json.loads(self.checkpoint.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s: checkpoint %s unreadable (%s); starting without it", self.resource, self.checkpoint, exc)
            return
        if not isinstance(data, dict):
            log.warning("%s: checkpoint %s is not an object; starting without it", self.resource, self.checkpoint)
            return
        pods = data.get("pods", data.get("allocated", {}))  # "allocated": the first format (pod -> device IDs)
        for key, v in (pods.items() if isinstance(pods, dict) else ()):
            if isinstance(v, list):
                v = {"devices": v, "uuids": [], "time_s": 0.0}
            if isinstance(v, dict):
                self.allocated[str(key)] = v
        anon = data.get("anonymous", [])
        self.anonymous = [a for a in anon if isinstance(a, dict)] if isinstance(anon, list) else []

    def _save_checkpoint(self) -> None:
        data = {"version": CHECKPOINT_VERSION, "resource": self.resource, "pods": self.allocated,
                "anonymous": self.anonymous[-MAX_ANONYMOUS:]}
        if self.checkpoint.exists() and not self.checkpoint.is_file():
            log.error("%s: checkpoint path %s is not a regular file; not replacing it", self.resource, self.checkpoint)
            return
        try:
            self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.checkpoint, json.dumps(data, sort_keys=True))
        except OSError as exc:  # a full disk must not fail the container's start
            log.error("%s: cannot write checkpoint %s: %s", self.resource, self.checkpoint, exc)

    def prune(self, live_pods: set[str]) -> int:
        """Forget served pods that no longer exist; returns how many were dropped."""
        with self._lock:
            gone = [k for k in self.allocated if k not in live_pods]
            for k in gone:
                del self.allocated[k]
            if gone:
                self._save_checkpoint()
            return len(gone)

    def set_health(self, health: dict[int, bool]) -> None:
        with self._cond:
            if any(self.health.get(i) != h for i, h in health.items()):
                self.health.update(health)
                self._version += 1
                self._cond.notify_all()

    def _listing(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[
            pb.Device(ID=d.id, health=HEALTHY if self.health.get(d.gpu_index, True) else UNHEALTHY,
                      topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]) if d.numa_node >= 0 else None)
            for d in self.devices
        ])

    # --- the scheduler's assignment -----------------------------------------------------------
    def _pending(self, count: int, looks: int = 1) -> PodAssignment | InvalidAssignment | None:
        """The pod kubelet admits; ``looks``: how many times to wait for a pod source that cannot tell (an API server
        away for longer than one wait) before kubelet's choice stands."""
        for look in range(1, looks + 1):
            try:
                return self.pods.pending_assignment(self.resource, count, set(self.allocated))
            except PodsUnknown as exc:
                if exc.retry and look < looks:
                    log.warning("%s: %s; waiting for it once more", self.resource, exc)
                    continue
                log.error("%s: %s; kubelet's device choice stands", self.resource, exc)
                return None
            except Exception as exc:  # a pod source failure must not fail admission: kubelet's choice stands
                log.warning("%s: pod source failed: %s", self.resource, exc)
                return None
        return None

    def by_uuid_index(self, uuid: str) -> int | None:
        """GPU index of a GPU or MIG UUID on this node."""
        for g in self.gpus.values():
            if g.uuid == uuid or any(m.uuid == uuid for m in g.mig):
                return g.index
        return None

    def assigned_devices(self, pa: PodAssignment) -> tuple[list[str], list[list[str]]]:
        """The UUIDs to expose and, per assigned GPU/instance, the device IDs that stand for it here."""
        a = pa.assignment
        uuids: list[str] = []
        ids: list[list[str]] = []
        if a.mig:
            for gi, inst in a.mig:
                g = self.gpus.get(gi)
                m = next((m for m in (g.mig if g else ()) if m.instance_id == inst), None)
                if m is None:
                    raise AssignmentMismatch(f"{pa.pod_key}: assignment names MIG instance {inst} on GPU {gi}, not on this node")
                if self.resource.startswith("nvidia.com/mig-") and self.resource != f"nvidia.com/mig-{m.profile}":
                    raise AssignmentMismatch(f"{pa.pod_key}: MIG instance {inst} on GPU {gi} is {m.profile}, not {self.resource}")
                uuids.append(m.uuid)
                ids.append([m.uuid] if m.uuid in self.by_id else [])
            return uuids, ids
        for k, gi in enumerate(a.gpu_indices):
            g = self.gpus.get(gi)
            if g is None:
                raise AssignmentMismatch(f"{pa.pod_key}: assignment names GPU {gi}, this node has {sorted(self.gpus)}")
            want = pa.gpu_uuids[k] if k < len(pa.gpu_uuids) else ""
            if want and want != g.uuid:
                raise AssignmentMismatch(f"{pa.pod_key}: assignment names GPU {gi} as {want}, but GPU {gi} here is {g.uuid}")
            if g.mig_enabled:
                raise AssignmentMismatch(f"{pa.pod_key}: GPU {gi} is in MIG mode; a whole-GPU assignment cannot use it")
            uuids.append(g.uuid)
            ids.append([d.id for d in self.devices if d.gpu_index == gi])
        return uuids, ids

    # --- gRPC -------------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context) -> Iterator[pb.ListAndWatchResponse]:  # noqa: N802
        with self._cond:
            seen = self._version
            first = self._listing()
        yield first
        while not self._stop.is_set() and context.is_active():
            with self._cond:
                self._cond.wait_for(lambda: self._version != seen or self._stop.is_set(), timeout=1.0)  # noqa: B023 - called within this iteration
                if self._version == seen:
                    continue
                seen = self._version
                msg = self._listing()
            yield msg

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        out = []
        for cr in request.container_requests:
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=self.prefer(
                list(cr.available_deviceIDs), list(cr.must_include_deviceIDs), cr.allocation_size)))
        return pb.PreferredAllocationResponse(container_responses=out)

    def prefer(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The scheduler's GPUs when the pod has an assignment, else one NVLink island / NUMA node."""
        chosen = list(dict.fromkeys(must))
        avail = [a for a in dict.fromkeys(available) if a in self.by_id and a not in chosen]
        if len(chosen) >= size:
            return chosen[:size]
        # kubelet records these devices for the pod for good; a preference made without the pod's assignment and an
        # Allocate that finds it a moment later disagree (the real node: an API server restart of ~35 s, a 30 s
        # wait, the pod ran on GPU 5 while kubelet held a device of GPU 6): wait twice before a blind preference
        pa = self._pending(size, looks=2)
        if isinstance(pa, InvalidAssignment):
            pa = None  # Allocate refuses it
        if pa is not None:
            try:
                _, per_gpu = self.assigned_devices(pa)
                pick = list(chosen)
                for ids in per_gpu:
                    free = [i for i in ids if i in avail and i not in pick]
                    if not any(i in pick for i in ids) and free:
                        pick.append(free[0])
                if len(pick) == size:
                    return pick
                log.info("%s: %s's assigned devices are not all available to kubelet; topology preference instead", self.resource, pa.pod_key)
            except AssignmentMismatch as exc:
                log.warning("%s: %s", self.resource, exc)
        elif self.guard:
            avail = self._not_promised(avail, size - len(chosen))
        return chosen + self.topology_pick(avail, size - len(chosen))

    def _not_promised(self, avail: list[str], need: int) -> list[str]:
        """For a pod without an assignment under the node guard: leave out the GPUs gpufleet assigned to pods kubelet
        has not admitted yet.  kubelet sees all their devices free, so it would pick one, and the guard would then
        refuse the pod (seen on the real node: gpufleet's pod and kube-scheduler's created together, kubelet
        offered the second the GPU of the first).  When too few GPUs are left, ``avail`` unchanged (the guard
        decides)."""
        source = getattr(self.pods, "gpu_use", None)
        try:
            use = source(self.resource, need) if source is not None else None
        except Exception as exc:  # noqa: BLE001 - a preference only: Allocate's guard asks again
            log.warning("%s: cannot tell which GPUs gpufleet assigned: %s", self.resource, exc)
            use = None
        if use is None:
            return avail
        me = use.admitting[0] if use.admitting else ""
        promised = {gi for gi, pods in use.by_gpu.items() if pods - {me}}
        left = [a for a in avail if self.by_id[a].gpu_index not in promised]
        return left if len({self.by_id[a].gpu_index for a in left}) >= need else avail

    def topology_pick(self, avail: list[str], need: int) -> list[str]:
        if need <= 0:
            return []
        by_island_numa: dict[tuple[int, int], list[str]] = {}
        by_island: dict[int, list[str]] = {}
        by_numa: dict[int, list[str]] = {}
        for a in avail:
            d = self.by_id[a]
            isl = self.island.get(d.gpu_index, d.gpu_index)
            by_island_numa.setdefault((isl, d.numa_node), []).append(a)
            by_island.setdefault(isl, []).append(a)
            by_numa.setdefault(d.numa_node, []).append(a)
        if self.replicas > 1:
            # time-slicing: spread over the least-loaded GPUs, on the NUMA node with the most free replicas
            fits = [(-len(ids), k) for k, ids in by_numa.items() if len(ids) >= need]
            return self._spread(by_numa[min(fits)[1]] if fits else avail, need)
        if self.slots > 1:
            return self._whole_gpus(avail, need)
        return self._group_pick(avail, need, by_island_numa, by_island, by_numa)

    def _group_pick(self, avail: list[str], need: int, by_island_numa: dict, by_island: dict, by_numa: dict) -> list[str]:
        # the smallest group that holds the request: keeps bigger groups whole for bigger requests
        grouped: tuple[dict[Any, list[str]], ...] = (by_island_numa, by_island, by_numa)
        for groups in grouped:
            fits = [(len(ids), k) for k, ids in groups.items() if len(ids) >= need]
            if fits:
                _, key = min(fits)
                return self._spread(groups[key], need)
        return self._spread(avail, need)

    def _whole_gpus(self, avail: list[str], need: int) -> list[str]:
        """A pod without an assignment (another scheduler's) gets GPUs nobody uses: one device of each of the
        ``need`` lowest-index GPUs whose devices are all free, exactly as the scheduler models such a pod
        (``kube.convert.bound_assignment``), so both agree on which GPUs it holds; only when there are not
        enough such GPUs, devices of the least-loaded GPUs."""
        by_gpu: dict[int, list[str]] = {}
        for a in sorted(avail):
            by_gpu.setdefault(self.by_id[a].gpu_index, []).append(a)
        per_gpu = {d.gpu_index: 0 for d in self.devices}
        for d in self.devices:
            per_gpu[d.gpu_index] += 1
        free = [ids[0] for g, ids in sorted(by_gpu.items()) if len(ids) == per_gpu[g]]
        if len(free) >= need:
            return free[:need]
        rest = [a for a in avail if a not in free]
        return free + self._spread(rest, need - len(free))

    def _spread(self, ids: list[str], n: int) -> list[str]:
        # replicas: one per GPU, least-loaded GPUs (most free replicas) first, then more of the same
        by_gpu: dict[int, list[str]] = {}
        for a in sorted(ids):
            by_gpu.setdefault(self.by_id[a].gpu_index, []).append(a)
        order = sorted(by_gpu, key=lambda g: (-len(by_gpu[g]), g))
        out: list[str] = []
        while len(out) < n and any(by_gpu.values()):
            for g in order:
                if by_gpu[g] and len(out) < n:
                    out.append(by_gpu[g].pop(0))
        return out

    def Allocate(self, request, context):  # noqa: N802
        responses = []
        for cr in request.container_requests:
            ids = list(cr.devices_ids)
            unknown = [i for i in ids if i not in self.by_id]
            if unknown or not ids:
                msg = f"{self.resource}: unknown device IDs {unknown}" if unknown else f"{self.resource}: no device IDs"
                log.warning("Allocate refused: %s", msg)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg)
            try:
                responses.append(self.allocate_one(ids))
            except AssignmentRefused as exc:
                # kubelet fails the pod's admission with this message: its container never starts on other GPUs
                log.warning("Allocate refused: %s", exc.message)
                report = getattr(self.pods, "report_refused", None)
                if report is not None and exc.pod_key:
                    if exc.reason == "GpuAssignmentRefused":
                        report(exc.pod_key, exc.uid, exc.message)
                    else:
                        report(exc.pod_key, exc.uid, exc.message, reason=exc.reason)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, exc.message)
        return pb.AllocateResponse(container_responses=responses)

    def _refuse(self, pa: PodAssignment | InvalidAssignment, message: str) -> NoReturn:
        with self._lock:  # remembered as served: the same pod is not matched again
            self.allocated[pa.served_key] = {"devices": [], "uuids": [], "time_s": round(time.time(), 3), "refused": message}
            self._save_checkpoint()
        raise AssignmentRefused(pa.pod_key, pa.uid, message)

    def allocate_one(self, ids: list[str]) -> pb.ContainerAllocateResponse:
        envs: dict[str, str] = {}
        mismatch: tuple[PodAssignment, list[str], list[str]] | None = None
        mounts: list[pb.Mount] = []
        pa = self._pending(len(ids))
        if pa is None and self.guard:
            # before the guard treats it as another scheduler's pod: look once more (the first lookup may have given
            # up on an API server that was restarting; seen on the real node: the guard then refused a pod gpufleet
            # had placed, because its own assignment named the GPU)
            pa = self._pending(len(ids))
        uuids: list[str] | None = None
        if isinstance(pa, PodAssignment) and pa.again:
            log.info("%s: kubelet admits %s again (its earlier Allocate did not complete): its own GPUs again",
                     self.resource, pa.pod_key)
        if isinstance(pa, InvalidAssignment):
            self._refuse(pa, f"pod {pa.pod_key}: {pa.message}; not starting it on GPUs the scheduler did not choose")
        if pa is not None:
            try:
                uuids, _ = self.assigned_devices(pa)
            except AssignmentMismatch as exc:
                self._refuse(pa, f"{exc} (stale assignment); not starting it on GPUs the scheduler did not choose")
            held = {i for i in (self.by_uuid_index(u) for u in uuids or []) if i is not None}
            bad = sorted(held - {i for i, ok in self.health.items() if ok})
            if bad:
                self._refuse(pa, f"pod {pa.pod_key}: its assignment names unhealthy GPU(s) {bad} on this node; "
                                 "not starting it there (the scheduler places it again once it is re-created)")
            if self.guard and not pa.assignment.mig:
                self._not_taken_or_refuse(pa, held, len(ids))
        if pa is None and self.guard:
            self._exclusive_or_refuse(ids)
        with self._lock:
            if pa is not None and pa.served_key in self.allocated and not pa.again:
                uuids = None  # served meanwhile by a concurrent Allocate
            if uuids and pa is not None:
                a = pa.assignment
                share = not a.mig and 0 <= a.gpu_milli < 1000 and (a.gpu_milli > 0 or any(a.gpu_memory_mib))
                if share:
                    if a.gpu_milli > 0:
                        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, a.gpu_milli // 10))
                    # device ordinals as the container sees them (NVIDIA_VISIBLE_DEVICES order)
                    limits = [f"{k}={m}MB" for k, m in enumerate(a.gpu_memory_mib) if m]
                    if limits:
                        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
                    if self.mps_pipe_dir:
                        envs["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_pipe_dir
                        mounts.append(pb.Mount(container_path=self.mps_pipe_dir, host_path=self.mps_pipe_dir))
                envs["GPUFLEET_POD"] = pa.pod_key
                entry: dict[str, Any] = {"devices": ids, "uuids": uuids, "time_s": round(time.time(), 3)}
                kubelet_uuids = list(dict.fromkeys(self.by_id[i].gpu_uuid for i in ids))
                if set(kubelet_uuids) != set(uuids):
                    entry["kubelet_uuids"] = kubelet_uuids
                    mismatch = (pa, kubelet_uuids, uuids)
                self.allocated[pa.served_key] = entry
            else:
                uuids = list(dict.fromkeys(self.by_id[i].gpu_uuid for i in ids))
                self.anonymous = (self.anonymous + [{"devices": ids, "uuids": uuids, "time_s": round(time.time(), 3)}])[-MAX_ANONYMOUS:]
            self._save_checkpoint()
        if mismatch is not None:
            self._report_mismatch(*mismatch)
        pause("allocate", pa.pod_key if isinstance(pa, PodAssignment) else f"devices {ids} (no assignment)")
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        indices = sorted({g.index for g in self.gpus.values() if g.uuid in uuids}
                         | {g.index for g in self.gpus.values() for m in g.mig if m.uuid in uuids})
        return pb.ContainerAllocateResponse(envs=envs, devices=self.device_spec_list(indices), mounts=mounts)

    def _gpu_names(self, uuids: list[str]) -> str:
        return ", ".join(f"GPU {i} ({u})" if (i := self.by_uuid_index(u)) is not None else u for u in uuids)

    def _report_mismatch(self, pa: PodAssignment, kubelet_uuids: list[str], uuids: list[str]) -> None:
        """kubelet holds devices of other GPUs than the assignment the container got (its preference was made without
        the assignment: the API server away for both waits).  kubelet's record cannot be changed: the container runs
        on the scheduler's GPUs (the ones it counts), the checkpoint keeps both, the node guard counts the assigned
        GPUs as held (``_actual_gpus``), and the pod gets a Warning event saying so."""
        message = (f"pod {pa.pod_key}: kubelet allocated devices of {self._gpu_names(kubelet_uuids)} (its device "
                   f"preference was made while the API server could not be read), the container runs on "
                   f"{self._gpu_names(uuids)} as its gpufleet.io/assignment says; kubelet's PodResources shows the "
                   "former until the pod ends")
        log.warning("%s: %s", self.resource, message)
        report = getattr(self.pods, "report_refused", None)
        if report is not None:
            report(pa.pod_key, pa.uid, message, reason="GpuAccountingMismatch")

    def _actual_gpus(self, holder: str, device: str) -> set[int]:
        """The GPUs the agent gave the pod ``holder`` (namespace/name) that kubelet holds ``device`` for: the
        checkpoint's, when it served that pod on those devices; else the device's own GPU."""
        d = self.by_id.get(device)
        out = {d.gpu_index} if d is not None else set()
        with self._lock:
            for key, e in self.allocated.items():
                if key.split("#", 1)[0] == holder and device in (e.get("devices") or ()):
                    out |= {i for i in (self.by_uuid_index(str(u)) for u in e.get("uuids") or ()) if i is not None}
        return out

    def _not_taken_or_refuse(self, pa: PodAssignment, held: set[int], count: int) -> None:
        """The node guard's other half: a pod gpufleet placed, whose assigned GPU kubelet has already given to a pod
        another scheduler placed.  Two schedulers raced for the GPU (no admission routing, Kubernetes 1.35): gpufleet
        decided before its snapshot showed the other pod's binding, kubelet admitted that pod first.  Serving the
        assignment would share the GPU unasked; so the pod is refused (``RACED`` in the message) and gpufleet places
        it again (a bare pod is re-created: kube/plugin_down).  Cannot tell (PodResources unreadable): served, as before."""
        source = getattr(self.pods, "gpu_use", None)
        try:
            use = source(self.resource, count) if source is not None else None
        except Exception as exc:  # noqa: BLE001 - cannot tell: the assignment decides, as without the guard
            log.warning("%s: cannot tell who uses the GPUs of %s: %s", self.resource, pa.pod_key, exc)
            use = None
        if use is None or not use.foreign:
            return
        taken: dict[int, set[str]] = {}
        for dev, holder in use.by_device.items():
            if holder == pa.pod_key or holder not in use.foreign or dev not in self.by_id:
                continue
            for gi in self._actual_gpus(holder, dev) & held:
                taken.setdefault(gi, set()).add(holder)
        if taken:
            who = "; ".join(f"GPU {gi} ({self.gpus[gi].uuid}) to {', '.join(sorted(p))}" for gi, p in sorted(taken.items()))
            self._refuse(pa, f"pod {pa.pod_key}: its gpufleet.io/assignment names a GPU kubelet has already given to a pod "
                             f"another scheduler placed ({who}): {RACED}; refusing rather than share it unasked "
                             "(gpufleet places the pod again: a bare pod is re-created, a controller replaces its pod)")

    def _exclusive_or_refuse(self, ids: list[str]) -> None:
        """The node guard (see the module docstring): a pod without an assignment gets GPUs nobody else holds, or
        ``AssignmentRefused``."""
        want = {self.by_id[i].gpu_index for i in ids}
        source = getattr(self.pods, "gpu_use", None)
        try:
            use = source(self.resource, len(ids)) if source is not None else None
        except Exception as exc:  # noqa: BLE001 - cannot tell: refused below
            log.warning("%s: cannot tell who uses the GPUs: %s", self.resource, exc)
            use = None
        if use is None:
            raise AssignmentRefused("", "", (
                f"{self.resource}: a pod without a gpufleet.io/assignment asks for GPU(s) {sorted(want)}, and the agent "
                "cannot tell whether another pod uses them (kubelet's PodResources API or the API server unreachable); "
                "refusing it rather than risk sharing a GPU it did not ask to share"), "GpuInUse")
        pod, uid = use.admitting or ("", "")
        holders: dict[int, set[str]] = {}
        for dev, holder in use.by_device.items():
            if holder == pod or dev not in self.by_id:
                continue
            for gi in self._actual_gpus(holder, dev) & want:
                holders.setdefault(gi, set()).add(holder)
        for gi, pods in use.by_gpu.items():
            if gi in want and pods - {pod}:
                holders.setdefault(gi, set()).update(pods - {pod})
        if holders:
            who = "; ".join(f"GPU {gi} ({self.gpus[gi].uuid}) is used by {', '.join(sorted(p))}" for gi, p in sorted(holders.items()))
            raise AssignmentRefused(pod, uid, (
                f"{'pod ' + pod + ': ' if pod else ''}{self.resource}: {GUARD_REFUSAL} for a pod "
                f"that did not ask to share ({who}). This pod has no gpufleet.io/assignment: a scheduler that counts "
                f"{self.resource} allocatable ({self.slots} devices per GPU, for gpufleet's GPU shares) bound it. "
                "Refusing rather than share a GPU silently: schedule GPU pods with gpufleet (schedulerName: gpufleet; "
                "deploy/admission routes them there), or run kube-scheduler with the gpufleet extender"), "GpuInUse")

    def device_spec_list(self, indices: list[int]) -> list:
        """``/dev/nvidiaN`` (N: the GPU's device minor number) for the GPUs handed out plus the control devices, as ``device_specs`` says."""
        if self.device_specs == "none":
            return []
        paths = [f"/dev/nvidia{self.gpus[i].dev_minor if i in self.gpus else i}" for i in indices] + list(CONTROL_DEVICES)
        out = []
        for p in paths:
            host = os.path.join(self.dev_root, p[len("/dev/"):])
            if self.device_specs == "existing" and not os.path.exists(host):
                continue
            out.append(pb.DeviceSpec(container_path=p, host_path=host, permissions="rw"))
        return out

    def PreStartContainer(self, request, context):  # noqa: N802
        return pb.PreStartContainerResponse()

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, self.endpoint)

    def start(self) -> None:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self._stop.clear()
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"dp-{self.resource}"))
        pbg.add_DevicePluginServicer_to_server(self, srv)
        srv.add_insecure_port(f"unix://{self.socket_path}")
        srv.start()
        self._server = srv

    def stop(self, grace_s: float = 0.5) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._server:
            self._server.stop(grace=grace_s).wait()
            self._server = None

    def serving(self) -> bool:
        return self._server is not None and os.path.exists(self.socket_path)

    def register(self, kubelet_socket: str, timeout_s: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
            pbg.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)),
                timeout=timeout_s)
