"""The kubelet device plugin (gRPC v1beta1 over unix sockets).

One server per advertised resource:

* ``nvidia.com/gpu``: whole GPUs (not in MIG mode), device ID = GPU UUID; with
  time-slicing, ``replicas`` IDs per GPU (``<uuid>::<k>``), optionally under
  the name ``nvidia.com/gpu.shared``;
* ``nvidia.com/mig-<profile>`` (MIG strategy ``mixed``): one ID per MIG
  instance; with strategy ``single`` MIG instances are ``nvidia.com/gpu``.

``Allocate`` gives the container the GPUs the gpufleet scheduler chose when the
pod being admitted carries a ``gpufleet.io/assignment`` (found through a
``PodSource``), else kubelet's choice: ``NVIDIA_VISIBLE_DEVICES`` with UUIDs,
the device nodes, and for a GPU share the MPS limits
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
so the share is enforced, not only accounted.  What was handed out is kept in
a checkpoint file, so the agent's restart loses nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

import grpc

from ..engine.model import Assignment
from .deviceplugin import api_pb2 as pb
from .deviceplugin import api_pb2_grpc as pbg
from .nvml import GpuInfo

log = logging.getLogger(__name__)
API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


@dataclass(frozen=True)
class DeviceEntry:
    id: str
    gpu_index: int
    gpu_uuid: str  # physical GPU (or MIG instance) UUID handed to the container
    numa_node: int


@dataclass
class PodAssignment:
    pod_key: str
    assignment: Assignment
    gpu_uuids: list[str]


class PodSource(Protocol):
    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | None: ...


class NoPods:
    def pending_assignment(self, resource: str, count: int, exclude: set[str]) -> PodAssignment | None:
        return None


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


class DevicePlugin(pbg.DevicePluginServicer):
    def __init__(self, resource: str, gpus: list[GpuInfo], socket_dir: str, strategy: str = "mixed", replicas: int = 1,
                 pods: PodSource | None = None, checkpoint: str | None = None) -> None:
        self.resource = resource
        self.gpus = {g.index: g for g in gpus}
        self.devices = build_devices(gpus, resource, strategy, replicas)
        self.by_id = {d.id: d for d in self.devices}
        self.health: dict[int, bool] = {g.index: True for g in gpus}
        self.socket_dir = socket_dir
        safe = resource.replace("/", "_").replace(".", "-")
        self.endpoint = f"gpufleet-{safe}.sock"
        self.pods = pods or NoPods()
        self.checkpoint = Path(checkpoint or os.path.join(socket_dir, f"gpufleet-{safe}.checkpoint.json"))
        self.allocated: dict[str, list[str]] = self._load_checkpoint()  # pod key -> device IDs
        self._cond = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()

    # --- state --------------------------------------------------------------------------
    def _load_checkpoint(self) -> dict[str, list[str]]:
        try:
            return dict(json.loads(self.checkpoint.read_text()).get("allocated", {}))
        except (OSError, ValueError):
            return {}

    def _save_checkpoint(self) -> None:
        tmp = self.checkpoint.with_suffix(".tmp")
        tmp.write_text(json.dumps({"resource": self.resource, "allocated": self.allocated}))
        os.replace(tmp, self.checkpoint)

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
                self._cond.wait_for(lambda: self._version != seen or self._stop.is_set(), timeout=1.0)
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
        """Keep a multi-GPU request on one NVLink island, else one NUMA node; replicas spread over GPUs."""
        chosen = list(must)
        avail = [a for a in available if a in self.by_id and a not in chosen]
        if len(chosen) >= size:
            return chosen[:size]
        need = size - len(chosen)
        groups: dict[tuple, list[str]] = {}
        for a in avail:
            d = self.by_id[a]
            g = self.gpus.get(d.gpu_index)
            island = tuple(sorted({d.gpu_index, *(g.nvlink_peers if g else ())}))
            groups.setdefault((island, d.numa_node), []).append(a)
        if need > 1:
            # the smallest group that holds the whole request, counting distinct GPUs first
            for key, ids in sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[0])):
                if len(ids) >= need:
                    return chosen + self._spread(ids, need)
            numa: dict[int, list[str]] = {}
            for a in avail:
                numa.setdefault(self.by_id[a].numa_node, []).append(a)
            for _, ids in sorted(numa.items(), key=lambda kv: len(kv[1])):
                if len(ids) >= need:
                    return chosen + self._spread(ids, need)
        return chosen + self._spread(avail, need)

    def _spread(self, ids: list[str], n: int) -> list[str]:
        # replicas of distinct GPUs first, so a multi-replica request lands on several GPUs
        by_gpu: dict[int, list[str]] = {}
        for a in sorted(ids):
            by_gpu.setdefault(self.by_id[a].gpu_index, []).append(a)
        out: list[str] = []
        while len(out) < n and any(by_gpu.values()):
            for g in sorted(by_gpu):
                if by_gpu[g] and len(out) < n:
                    out.append(by_gpu[g].pop(0))
        return out

    def Allocate(self, request, context):  # noqa: N802
        responses = []
        for cr in request.container_requests:
            ids = list(cr.devices_ids)
            unknown = [i for i in ids if i not in self.by_id]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource}: unknown device IDs {unknown}")
            responses.append(self.allocate_one(ids))
        return pb.AllocateResponse(container_responses=responses)

    def allocate_one(self, ids: list[str]) -> pb.ContainerAllocateResponse:
        envs: dict[str, str] = {}
        pa = self.pods.pending_assignment(self.resource, len(ids), set(self.allocated))
        if pa is not None and pa.gpu_uuids:
            uuids = list(pa.gpu_uuids)
            a = pa.assignment
            if 0 < a.gpu_milli < 1000:
                envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, a.gpu_milli // 10))
                mems = [m for m in a.gpu_memory_mib if m]
                if mems:
                    envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{u}={m}M" for u, m in zip(uuids, mems))
            envs["GPUFLEET_POD"] = pa.pod_key
            self.allocated[pa.pod_key] = ids
            self._save_checkpoint()
        else:
            uuids = list(dict.fromkeys(self.by_id[i].gpu_uuid for i in ids))
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        indices = sorted({g.index for g in self.gpus.values() if g.uuid in uuids} | {self.by_id[i].gpu_index for i in ids if self.by_id[i].gpu_uuid in uuids})
        devs = [pb.DeviceSpec(container_path=f"/dev/nvidia{i}", host_path=f"/dev/nvidia{i}", permissions="rw") for i in indices]
        for extra in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            devs.append(pb.DeviceSpec(container_path=extra, host_path=extra, permissions="rw"))
        return pb.ContainerAllocateResponse(envs=envs, devices=devs)

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
        srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_DevicePluginServicer_to_server(self, srv)
        srv.add_insecure_port(f"unix://{self.socket_path}")
        srv.start()
        self._server = srv

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._server:
            self._server.stop(grace=0.5).wait()
            self._server = None

    def register(self, kubelet_socket: str, timeout_s: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
            pbg.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)),
                timeout=timeout_s)


@dataclass
class KubeletWatcher:
    """Notices kubelet restarts: kubelet.sock is re-created (new inode)."""

    path: str
    _ident: tuple | None = field(default=None)

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
            ident = (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            ident = None
        if ident != self._ident:
            self._ident = ident
            return ident is not None
        return False
