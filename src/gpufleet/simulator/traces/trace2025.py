"""Reading Alibaba's cluster-trace-gpu-v2025 (GPU-disaggregated DLRM inference, NSDI'25).

Columns: ``instance_sn, role, app_name, cpu_request, cpu_limit, gpu_request,
gpu_limit, rdma_request, rdma_limit, memory_request, memory_limit,
disk_request, disk_limit, max_instance_per_node, creation_time,
scheduled_time, deletion_time``.  CPU in cores, memory and disk in GiB, RDMA in
percent of one RDMA NIC's bandwidth, times in seconds from the trace start
(empty/NaN: before the start for creation and scheduling, after the end for
deletion).  ``role`` CN instances run on CPU nodes, HN instances (one GPU
each) on GPU nodes.

How it maps onto the engine: CPU, memory and GPUs as usual; the RDMA share is
an extended resource with a per-node capacity and ``max_instance_per_node`` a
per-app cap on instances per node, both enforced by ``constraints.NodeLimits``
(the pod's ``extras``).  Disk is not modelled (the paper names CPU, GPU, RDMA
and memory as the scheduling dimensions).

The trace has no node list.  ``synth_cluster`` builds one: HN nodes of
``HN_NODE`` (8 GPUs, 128 cores, 1 TiB, 2 RDMA NICs = 200%) and CN nodes of
``CN_NODE`` (192 cores, 1.5 TiB, 1 NIC = 100%), ``size`` x as many as
production's own peak concurrent demand (from its scheduled..deletion times)
needs in its tightest resource.  These shapes are assumptions, stated in every
report; the simulated-versus-production comparison is therefore shown as a
function of that headroom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...engine.model import Gpu, Node, PodRequest
from .constraints import RDMA_CAPACITY_LABEL
from .trace import Trace, TraceError, TracePod, parse_rows

COLUMNS = ("instance_sn", "role", "app_name", "cpu_request", "cpu_limit", "gpu_request", "gpu_limit", "rdma_request",
           "rdma_limit", "memory_request", "memory_limit", "disk_request", "disk_limit", "max_instance_per_node",
           "creation_time", "scheduled_time", "deletion_time")
HN_NODE: dict[str, float] = {"gpus": 8, "cpu": 128, "memory_gib": 1024, "rdma_pct": 200}
CN_NODE: dict[str, float] = {"gpus": 0, "cpu": 192, "memory_gib": 1536, "rdma_pct": 100}
HN_MODEL = "GPU-HN"  # the trace does not name the GPU


@dataclass(frozen=True)
class DlrmPod(TracePod):
    role: str = ""
    app: str = ""
    rdma_pct: float = 0.0
    max_per_node: int = -1
    extras: dict = field(default_factory=dict, hash=False, compare=False)

    def request(self, name: str | None = None) -> PodRequest:
        r = super().request(name)
        node_kind = "HN" if self.num_gpu else "CN"
        from dataclasses import replace

        return replace(r, node_selector=(("gpufleet.io/node-role", node_kind),), labels=(("app", self.app),))


def bundled_path() -> Path:
    """The bundled copy of the trace (see its PROVENANCE.md)."""
    from importlib import resources

    return Path(str(resources.files("gpufleet") / "data" / "alibaba-gpu-v2025" / "disaggregated_DLRM_trace.csv"))


def is_dlrm(path: str | Path) -> bool:
    with open(path, newline="") as f:
        head = f.readline()
    return head.strip().split(",")[:3] == ["instance_sn", "role", "app_name"]


def _num(path: str, line: int, col: str, raw: str, optional: bool = False) -> float | None:
    raw = (raw or "").strip()
    if raw == "" or raw.lower() == "nan":
        if optional:
            return None
        raise TraceError(path, line, col, "missing value")
    try:
        v = float(raw)
    except ValueError:
        raise TraceError(path, line, col, f"expected a number, got {raw!r}") from None
    if not math.isfinite(v):
        raise TraceError(path, line, col, f"expected a finite number, got {raw!r}")
    return v


def _dlrm_row(p: str, lineno: int, d: dict[str, str], name: str) -> DlrmPod:
    role = d["role"].strip()
    if role not in ("CN", "HN"):
        raise TraceError(p, lineno, "role", f"expected CN or HN, got {role!r}")
    cpu = _num(p, lineno, "cpu_request", d["cpu_request"])
    gpu = _num(p, lineno, "gpu_request", d["gpu_request"])
    rdma = _num(p, lineno, "rdma_request", d["rdma_request"])
    mem = _num(p, lineno, "memory_request", d["memory_request"])
    mx = _num(p, lineno, "max_instance_per_node", d["max_instance_per_node"])
    assert cpu is not None and gpu is not None and rdma is not None and mem is not None and mx is not None
    if cpu < 0 or mem < 0 or not 0 <= rdma <= 100:
        raise TraceError(p, lineno, "rdma_request" if not 0 <= rdma <= 100 else "cpu_request", "out of range")
    if gpu != int(gpu) or not 0 <= gpu <= 16:
        raise TraceError(p, lineno, "gpu_request", f"expected 0..16 whole GPUs, got {gpu}")
    ct = _num(p, lineno, "creation_time", d["creation_time"], optional=True)
    st = _num(p, lineno, "scheduled_time", d["scheduled_time"], optional=True)
    dt = _num(p, lineno, "deletion_time", d["deletion_time"], optional=True)
    if ct is not None and dt is not None and dt < ct:
        raise TraceError(p, lineno, "deletion_time", f"{dt} is before creation_time {ct}")
    app = d["app_name"].strip()
    mxn = int(mx)
    return DlrmPod(
        name=name, cpu_milli=round(cpu * 1000), memory_mib=round(mem * 1024), num_gpu=int(gpu),
        gpu_milli=1000 if gpu else 0, qos="LS",
        creation_time=None if ct is None else int(ct), deletion_time=None if dt is None else int(dt),
        scheduled_time=None if st is None else int(st), role=role, app=app, rdma_pct=rdma,
        max_per_node=mxn, extras={"rdma": rdma, "app": app, "max_per_app": mxn, "role": role, "app_name": app})


def load_dlrm(path: str | Path, skip_bad_rows: bool = False) -> Trace:
    pods, skipped = parse_rows(Path(path), (COLUMNS,), "instance_sn", "instance", skip_bad_rows, _dlrm_row)
    return Trace(name=Path(path).stem, pods=list(pods), skipped_rows=skipped)


def peak_demand(pods: Sequence[TracePod], role: str) -> dict[str, float]:
    """Production's peak concurrent (cpu cores, memory GiB, GPUs, RDMA %) of one role, from its
    own scheduled..deletion times (pods already running at the start count from 0)."""
    ev: list[tuple[float, int, np.ndarray]] = []
    end = max((t for p in pods for t in (p.creation_time, p.scheduled_time, p.deletion_time) if t is not None), default=0)
    for p in pods:
        if not isinstance(p, DlrmPod) or p.role != role:
            continue
        s = p.scheduled_time if p.scheduled_time is not None else (0 if p.creation_time is None else None)
        if s is None:
            continue
        e = p.deletion_time if p.deletion_time is not None else end + 1
        v = np.array([p.cpu_milli / 1000, p.memory_mib / 1024, p.num_gpu, p.rdma_pct])
        ev.append((float(s), 1, v))
        ev.append((float(e), 0, -v))
    ev.sort(key=lambda x: (x[0], x[1]))
    cur = np.zeros(4)
    peak = np.zeros(4)
    for _, _, v in ev:
        cur += v
        peak = np.maximum(peak, cur)
    return dict(zip(("cpu", "memory_gib", "gpus", "rdma_pct"), peak.tolist()))


def synth_cluster(pods: Sequence[TracePod], size: float = 1.0) -> list[Node]:
    """HN and CN nodes: ``size`` x as many as production's peak concurrent demand needs in its
    tightest resource (1.0: the peak just fits if packed perfectly; 1.1: 10% headroom)."""
    if not 0 < size <= 10:
        raise ValueError("size must be in (0, 10]")
    nodes: list[Node] = []
    for role, shape in (("HN", HN_NODE), ("CN", CN_NODE)):
        pk = peak_demand(pods, role)
        need = max(pk["cpu"] / shape["cpu"], pk["memory_gib"] / shape["memory_gib"], pk["rdma_pct"] / shape["rdma_pct"],
                   pk["gpus"] / shape.get("gpus", 1) if shape.get("gpus") else 0.0)
        count = max(1, math.ceil(need * size))
        for i in range(count):
            name = f"{role.lower()}-{i:04d}"
            g = int(shape.get("gpus", 0))
            model = HN_MODEL if g else ""
            nodes.append(Node(
                name=name, cpu_milli=int(shape["cpu"]) * 1000, memory_mib=int(shape["memory_gib"]) * 1024,
                gpus=tuple(Gpu(j, f"{name}-gpu{j}", model, 32768) for j in range(g)),
                labels={"kubernetes.io/hostname": name, "gpufleet.io/node-role": role,
                        RDMA_CAPACITY_LABEL: str(shape["rdma_pct"]), **({"nvidia.com/gpu.product": model} if g else {})},
                max_pods=10**6))
    return nodes


__all__ = ["CN_NODE", "COLUMNS", "HN_NODE", "DlrmPod", "is_dlrm", "load_dlrm", "peak_demand", "synth_cluster"]
