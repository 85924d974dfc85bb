"""Right-sizing: requested vs used GPU per workload, and the request that would do.

Pods are grouped by their workload (the top of the owner chain: Pod ->
ReplicaSet -> Deployment, Pod -> Job -> CronJob, StatefulSet, ...).  For each
workload the utilisation and GPU-memory percentiles over the window say what
its pods really use; with headroom that becomes either whole GPUs or, when
less than one GPU would do, a fractional share (``gpufleet.io/gpu-milli`` +
``gpufleet.io/gpu-memory``).  The difference from the request, times the pod-
hours observed, is the GPU-hours the change would free (negative: the
workload is squeezed and should get more).

Utilisation samples are per pod per timestamp, of its busiest GPU (so a multi-
GPU pod is judged by its busiest device: conservative), in percent of a whole
GPU; memory samples likewise, in MiB per GPU.  Everything here is pure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine.errors import GpufleetError
from ..engine.podspec import pod_key
from .podjson import gpus_held, requested_gpu_devices, top_owner

DEFAULT_GPU_MEMORY_MIB = 81_920


@dataclass(frozen=True)
class WorkloadUsage:
    workload: str  # "namespace/Kind/name"
    pods: int
    requested_gpus: float  # per pod; fractional for a share
    devices: int  # GPU devices per pod (1 for a share)
    gpu_memory_mib: int  # memory of one GPU of the model it runs on
    util_pct: Sequence[float]  # samples, 0..100 of a whole GPU
    mem_used_mib: Sequence[float]  # samples, MiB per GPU
    pod_hours: float  # pod-hours observed in the window
    example_pod: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # one of its pods (for patches)


@dataclass(frozen=True)
class Recommendation:
    workload: str
    pods: int
    requested_gpus: float
    util_p50: float
    util_p95: float
    util_max: float
    mem_p50_mib: float
    mem_p95_mib: float
    mem_max_mib: float
    recommended_gpus: float
    recommended_milli: int | None  # set when a share suffices
    recommended_memory_mib: int | None
    gpu_hours_freed: float
    samples: int
    note: str = ""

    def request_text(self) -> str:
        if self.recommended_milli is not None:
            return (f'nvidia.com/gpu: 1 + gpufleet.io/gpu-milli: "{self.recommended_milli}", '
                    f'gpufleet.io/gpu-memory: "{self.recommended_memory_mib}Mi"')
        return f"nvidia.com/gpu: {int(self.recommended_gpus)}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["request"] = self.request_text()
        return d


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else 0.0


def recommend(w: WorkloadUsage, headroom: float = 1.2, step_milli: int = 50, min_samples: int = 12,
              share_below: float = 0.9) -> Recommendation:
    """The request that covers the p95 of use plus ``headroom``; never below one step."""
    u = np.asarray([x for x in w.util_pct if not math.isnan(x)], dtype=float)
    m = np.asarray([x for x in w.mem_used_mib if not math.isnan(x)], dtype=float)
    p50, p95, umax = _pct(u, 50), _pct(u, 95), float(u.max()) if u.size else 0.0
    m50, m95, mmax = _pct(m, 50), _pct(m, 95), float(m.max()) if m.size else 0.0
    stats: dict[str, Any] = dict(util_p50=round(p50, 1), util_p95=round(p95, 1), util_max=round(umax, 1),
                                 mem_p50_mib=round(m50), mem_p95_mib=round(m95), mem_max_mib=round(mmax), samples=int(u.size))
    if u.size < min_samples:
        return Recommendation(w.workload, w.pods, w.requested_gpus, **stats, recommended_gpus=w.requested_gpus,
                              recommended_milli=None, recommended_memory_mib=None, gpu_hours_freed=0.0,
                              note=f"keep: only {u.size} utilisation samples (need {min_samples})")
    gpu_mem = max(w.gpu_memory_mib, 1)
    devices = max(w.devices, 1)
    # memory must never be cut below what was seen (the max bounds it), nor exceed a device
    mem_need = min(gpu_mem, max(m95 * headroom, mmax))
    need_compute = min(devices, devices * p95 / 100.0 * headroom)  # a device gives at most 100%: more GPUs would not help
    need_memory = devices * mem_need / gpu_mem
    need = max(need_compute, need_memory, step_milli / 1000.0)
    note = ""
    if need < share_below:
        milli = min(1000, int(math.ceil(need * 1000 / step_milli) * step_milli))
        mem = min(gpu_mem, int(math.ceil(max(mem_need, 1024) / 256) * 256))
        rec_gpus, rec_milli, rec_mem = milli / 1000.0, milli, mem
        if devices > 1:
            note = f"{devices}-GPU pods fit one GPU share: check the code does not need {devices} devices"
    else:
        rec_gpus, rec_milli, rec_mem = float(max(1, math.ceil(need - 1e-9))), None, None
        if need_memory > need_compute and rec_gpus >= devices:
            note = "memory-bound"
    if abs(rec_gpus - w.requested_gpus) < 1e-9:
        note = note or "right-sized"
    elif rec_gpus > w.requested_gpus:
        note = "under-sized: busier than its request" if need_compute >= need_memory else "under-sized: needs more GPU memory"
    freed = (w.requested_gpus - rec_gpus) * w.pod_hours
    return Recommendation(w.workload, w.pods, w.requested_gpus, **stats, recommended_gpus=rec_gpus,
                          recommended_milli=rec_milli, recommended_memory_mib=rec_mem, gpu_hours_freed=round(freed, 2), note=note)


@dataclass
class _Group:
    pods: int = 0
    requested: list[float] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)
    gpu_mem: list[int] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    mem: list[float] = field(default_factory=list)
    pod_hours: float = 0.0
    example: Mapping[str, Any] | None = None


def workloads(pods: Sequence[Mapping[str, Any]], owners: Mapping[tuple[str, str, str], Mapping[str, Any]],
              util: Mapping[str, Sequence[tuple[float, float]]], mem: Mapping[str, Sequence[tuple[float, float]]],
              node_gpu_memory_mib: Mapping[str, int], step_s: float, skipped: list[str] | None = None) -> list[WorkloadUsage]:
    """Group GPU pods by workload and gather their samples (``util``/``mem`` keyed ``namespace/pod``).

    Pods that are gone but left series are not in ``pods`` and so not counted;
    a pod whose spec cannot be read is skipped and named in ``skipped``.
    """
    groups: dict[str, _Group] = {}
    for p in pods:
        try:
            held = gpus_held(p)
            devices = requested_gpu_devices(p)
        except GpufleetError as exc:
            if skipped is not None:
                skipped.append(str(exc))
            continue
        if held <= 0:
            continue
        ns = (p.get("metadata") or {}).get("namespace") or "default"
        kind, name = top_owner(p, owners)
        g = groups.setdefault(f"{ns}/{kind}/{name}", _Group())
        key = pod_key(p)
        g.pods += 1
        if g.example is None or held > max(g.requested):
            g.example = p  # the largest request's pod: the one the recommendation is compared with
        g.requested.append(held)
        g.devices.append(max(1, devices if held >= 1 else 1))
        g.gpu_mem.append(node_gpu_memory_mib.get((p.get("spec") or {}).get("nodeName") or "", DEFAULT_GPU_MEMORY_MIB))
        us = util.get(key, ())
        g.util.extend(v for _, v in us)
        g.mem.extend(v for _, v in mem.get(key, ()))
        g.pod_hours += len(us) * step_s / 3600.0
    out = []
    for w, g in sorted(groups.items()):
        # one request per workload: its pods share a template; the largest wins if they differ
        out.append(WorkloadUsage(w, g.pods, max(g.requested), max(g.devices), min(g.gpu_mem), g.util, g.mem, round(g.pod_hours, 3),
                                 g.example))
    return out


def render_table(recs: Sequence[Recommendation]) -> str:
    head = (f"{'WORKLOAD':<44} {'PODS':>4} {'REQ':>5} {'UTIL p50/p95/max':>17} {'MEM p95':>9}  "
            f"{'RECOMMENDED':<72} {'GPU-h FREED':>11}  NOTE")
    lines = [head]
    for r in recs:
        util = f"{r.util_p50:.0f}/{r.util_p95:.0f}/{r.util_max:.0f}%"
        lines.append(f"{r.workload[:44]:<44} {r.pods:>4} {r.requested_gpus:>5g} {util:>17} {r.mem_p95_mib / 1024:>7.1f}Gi  "
                     f"{r.request_text():<72} {r.gpu_hours_freed:>11.1f}  {r.note}")
    total = sum(r.gpu_hours_freed for r in recs if r.gpu_hours_freed > 0)
    lines.append(f"{len(recs)} workload(s); right-sizing the over-sized ones frees {total:.1f} GPU-hours per window")
    return "\n".join(lines)
