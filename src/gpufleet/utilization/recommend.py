"""Right-sizing: requested vs used GPU per workload, and the request that would do.

For each workload (the pod's top owner: Deployment, Job, StatefulSet...), the
utilisation and GPU-memory percentiles over the window give what its pods
really need; with headroom, that becomes a whole-GPU count or a fractional
``gpufleet.io/gpu-milli`` + ``gpufleet.io/gpu-memory`` share, and the
difference times the window is the GPU-hours it would free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class WorkloadUsage:
    workload: str  # "namespace/Kind/name"
    pods: int
    requested_gpus: float  # per pod
    gpu_memory_mib: int  # memory of one GPU of the model it runs on
    util_pct: Sequence[float]  # samples, per pod-GPU, 0..100
    mem_used_mib: Sequence[float]  # samples, per pod (all its GPUs)
    window_h: float


@dataclass(frozen=True)
class Recommendation:
    workload: str
    requested_gpus: float
    util_p50: float
    util_p95: float
    util_max: float
    mem_p95_mib: float
    recommended_gpus: float
    recommended_milli: int | None  # set when a share suffices
    recommended_memory_mib: int | None
    gpu_hours_freed: float

    def request_text(self) -> str:
        if self.recommended_milli is not None:
            return f'gpufleet.io/gpu-milli: "{self.recommended_milli}", gpufleet.io/gpu-memory: "{self.recommended_memory_mib}Mi" (nvidia.com/gpu: 1)'
        return f"nvidia.com/gpu: {int(self.recommended_gpus)}"


def recommend(w: WorkloadUsage, headroom: float = 1.2, step_milli: int = 50) -> Recommendation:
    u = np.asarray(w.util_pct, dtype=float) if len(w.util_pct) else np.zeros(1)
    m = np.asarray(w.mem_used_mib, dtype=float) if len(w.mem_used_mib) else np.zeros(1)
    p50, p95, mx = (float(np.percentile(u, 50)), float(np.percentile(u, 95)), float(u.max()))
    mem95 = float(np.percentile(m, 95))
    # GPUs of compute and of memory the pod needs, with headroom
    need_compute = w.requested_gpus * p95 / 100.0 * headroom
    need_memory = mem95 * headroom / max(w.gpu_memory_mib, 1)
    need = max(need_compute, need_memory, 0.05)
    if need < 1.0:
        milli = min(1000, int(math.ceil(need * 1000 / step_milli) * step_milli))
        mem = int(math.ceil(max(mem95 * headroom, 1024) / 256) * 256)
        rec_gpus, rec_milli, rec_mem = milli / 1000.0, milli, min(mem, w.gpu_memory_mib)
    else:
        rec_gpus, rec_milli, rec_mem = float(min(math.ceil(need), math.ceil(w.requested_gpus))), None, None
    freed = max(0.0, w.requested_gpus - rec_gpus) * w.pods * w.window_h
    return Recommendation(w.workload, w.requested_gpus, round(p50, 1), round(p95, 1), round(mx, 1), round(mem95, 0), rec_gpus,
                          rec_milli, rec_mem, round(freed, 2))


def owner_of(pod: dict, owners: dict[tuple[str, str, str], dict]) -> str:
    """'namespace/Kind/name' of the top controller (Pod -> ReplicaSet -> Deployment ...)."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "default")
    kind, name = "Pod", meta.get("name", "")
    refs = meta.get("ownerReferences") or []
    seen = 0
    while refs and seen < 5:
        ref = next((r for r in refs if r.get("controller")), refs[0])
        kind, name = ref.get("kind", kind), ref.get("name", name)
        parent = owners.get((ns, kind, name))
        refs = ((parent or {}).get("metadata") or {}).get("ownerReferences") or []
        seen += 1
    return f"{ns}/{kind}/{name}"
