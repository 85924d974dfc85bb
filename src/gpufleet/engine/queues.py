"""Team queues: quotas with borrowing, fair share by dominant resource, reclaim.

A queue has a nominal quota per resource and may borrow up to
``borrowing_limit`` more from what other queues leave idle (Kueue's cohort
model).  Usage is counted from the assignments in ``ClusterState`` -- the
single source of truth -- so it survives restarts like everything else.
Admission is a PreFilter plugin: a pod that would push its queue over
quota + what it may borrow waits, with a reason that says which resource.

Resources: ``gpu_milli`` (1000 per whole GPU), ``cpu_milli``, ``memory_mib``
and ``mig:<profile>`` counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .errors import ConfigError
from .framework import Cycle
from .model import GPU_MILLI, Assignment, PodRequest
from .quantity import to_mib, to_milli
from .state import ClusterState
from .status import Status

RESOURCES = ("gpu_milli", "cpu_milli", "memory_mib")


def request_vector(r: PodRequest | Assignment) -> dict[str, int]:
    if isinstance(r, PodRequest):
        v = {"gpu_milli": r.total_gpu_milli if not r.mig_profile else 0, "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}
        if r.mig_profile:
            v[f"mig:{r.mig_profile}"] = r.gpu_count
        return v
    v = {"gpu_milli": len(r.gpu_indices) * r.gpu_milli, "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}
    if r.mig_profile:
        v[f"mig:{r.mig_profile}"] = len(r.mig)
    return v


@dataclass
class Queue:
    name: str
    quota: dict[str, int]
    borrowing_limit: dict[str, int] = field(default_factory=dict)  # absent: may borrow without limit
    weight: int = 1
    parent: str | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Queue":
        """A ``gpufleet.io/v1alpha1`` Queue custom resource."""
        name = (obj.get("metadata") or {}).get("name") or ""
        spec = obj.get("spec") or {}
        if not name:
            raise ConfigError("Queue: metadata.name is required")

        def res(field_: str, raw: Mapping[str, Any]) -> dict[str, int]:
            out = {}
            for k, v in (raw or {}).items():
                try:
                    if k == "nvidia.com/gpu":
                        out["gpu_milli"] = int(v) * GPU_MILLI
                    elif k == "gpu-milli":
                        out["gpu_milli"] = int(v)
                    elif k == "cpu":
                        out["cpu_milli"] = to_milli(v)
                    elif k == "memory":
                        out["memory_mib"] = to_mib(v)
                    elif k.startswith("nvidia.com/mig-"):
                        out[f"mig:{k[len('nvidia.com/mig-'):]}"] = int(v)
                    else:
                        raise ConfigError(f"Queue {name}: spec.{field_}.{k}: unknown resource")
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"Queue {name}: spec.{field_}.{k}: {exc}") from None
                except ConfigError:
                    raise
                except Exception as exc:  # InvalidQuantity
                    raise ConfigError(f"Queue {name}: spec.{field_}.{k}: {exc}") from None
            return out

        w = spec.get("weight", 1)
        if not isinstance(w, int) or w <= 0:
            raise ConfigError(f"Queue {name}: spec.weight must be a positive integer, got {w!r}")
        return cls(name, res("quota", spec.get("quota")), res("borrowingLimit", spec.get("borrowingLimit")) if "borrowingLimit" in spec else {},
                   w, spec.get("parent"))


class QueueTree:
    """All queues and their usage (recomputed from the cluster state on demand)."""

    def __init__(self, queues: Iterable[Queue], state: ClusterState) -> None:
        self.queues = {q.name: q for q in queues}
        self.state = state
        for q in self.queues.values():
            if q.parent and q.parent not in self.queues:
                raise ConfigError(f"Queue {q.name}: parent {q.parent!r} does not exist")

    def usage(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {n: {} for n in self.queues}
        for a in self.state.assignments.values():
            if a.queue in out:
                for k, v in request_vector(a).items():
                    out[a.queue][k] = out[a.queue].get(k, 0) + v
        # a parent's usage includes its children's
        for name in list(out):
            p = self.queues[name].parent
            while p:
                for k, v in out[name].items():
                    out[p][k] = out[p].get(k, 0) + v
                p = self.queues[p].parent
        return out

    def admit(self, r: PodRequest) -> Status:
        if not r.queue:
            return Status.success()
        if r.queue not in self.queues:
            return Status.unresolvable(f"queue {r.queue!r} does not exist", plugin="QueueQuota")
        use = self.usage()
        want = request_vector(r)
        roots = [q for q in self.queues.values() if not q.parent]
        # what all queues together may hand out (idle quota of others can be borrowed)
        total_quota = {k: sum(q.quota.get(k, 0) for q in roots) for k in want}  # per resource
        total_use = {k: sum(use[q.name].get(k, 0) for q in roots) for k in want}
        name: str | None = r.queue
        while name:
            q = self.queues[name]
            u = use[name]
            for k, v in want.items():
                if not v or k not in q.quota:  # no quota set for a resource: not limited by this queue
                    continue
                nominal = q.quota.get(k, 0)
                limit = nominal + q.borrowing_limit[k] if k in q.borrowing_limit else None
                if limit is not None and u.get(k, 0) + v > limit:
                    return Status.unschedulable(
                        f"queue {q.name}: {k} quota {nominal} + borrowing limit {q.borrowing_limit[k]} exhausted "
                        f"({u.get(k, 0)} used, pod needs {v})", plugin="QueueQuota")
                if u.get(k, 0) + v > nominal and total_use[k] + v > total_quota[k]:
                    return Status.unschedulable(
                        f"queue {q.name}: {k} over its quota {nominal} ({u.get(k, 0)} used, pod needs {v}) and nothing idle to borrow",
                        plugin="QueueQuota")
            name = q.parent
        return Status.success()

    def dominant_share(self, queue: str, use: dict[str, dict[str, int]] | None = None) -> float:
        """Dominant resource share of a queue, divided by its weight (DRF)."""
        use = use or self.usage()
        q = self.queues[queue]
        shares = [use[queue].get(k, 0) / v for k, v in q.quota.items() if v > 0]
        return (max(shares) if shares else 0.0) / q.weight

    def order(self, pending: list[PodRequest]) -> list[PodRequest]:
        """Pending pods by fair share: queues furthest below their share first, then priority."""
        use = self.usage()
        return sorted(pending, key=lambda r: (self.dominant_share(r.queue, use) if r.queue in self.queues else 0.0, -r.priority))

    def borrowed(self) -> list[Assignment]:
        """Running pods beyond their queue's nominal quota, reclaim candidates: lowest priority, youngest first."""
        use = self.usage()
        out = []
        by_queue: dict[str, list[Assignment]] = {}
        for a in self.state.assignments.values():
            if a.queue in self.queues:
                by_queue.setdefault(a.queue, []).append(a)
        for name, pods in by_queue.items():
            q = self.queues[name]
            over = {k: use[name].get(k, 0) - q.quota.get(k, 0) for k in RESOURCES}
            for a in sorted(pods, key=lambda a: (a.priority, -list(self.state.assignments).index(a.pod_key))):
                v = request_vector(a)
                if any(over.get(k, 0) > 0 and v.get(k, 0) > 0 for k in RESOURCES):
                    out.append(a)
                    for k in RESOURCES:
                        over[k] = over.get(k, 0) - v.get(k, 0)
        return sorted(out, key=lambda a: (a.priority, -list(self.state.assignments).index(a.pod_key)))


@dataclass
class QueueQuota:
    """PreFilter: admission by queue quota (+ borrowing)."""

    tree: QueueTree | None = None
    name: str = "QueueQuota"

    def pre_filter(self, cycle: Cycle, state: ClusterState) -> Status:
        if self.tree is None:
            return Status.success()
        return self.tree.admit(cycle.request)
