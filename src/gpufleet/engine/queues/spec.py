"""Queues as objects: their spec (parsed from config or a gpufleet.io Queue), resource vectors, and the
namespace -> queue mapping.  Kept apart from the tree so that code that only reads Queue objects (the
CRD validation in ``kube/policy_objects.py``) needs none of the quota arithmetic."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from .. import annotations as ann
from ..errors import ConfigError, GpufleetError
from ..model import GPU_MILLI, Assignment, PodRequest
from ..quantity import to_int, to_mib, to_milli
from ..selector import LabelSelector, parse_label_selector, selects

RESOURCES = ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")
PLUGIN = "QueueQuota"  # the plugin the tree's statuses name

Vector = dict[str, int]


# --- resource vectors ------------------------------------------------------------------------


def request_vector(r: PodRequest | Assignment) -> Vector:
    """What a pod (request) or a placed pod (assignment) counts against its queue.

    A request for whole GPUs does not know their memory before a node is chosen:
    it counts 0 GPU memory here and the exact amount at Reserve.
    """
    if isinstance(r, PodRequest):
        v = {"gpu_milli": 0 if r.mig_profile else r.total_gpu_milli,
             "gpu_memory_mib": r.gpu_count * r.gpu_memory_mib if r.shared_gpu else 0,
             "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}
        if r.mig_profile:
            v[f"mig:{r.mig_profile}"] = r.gpu_count
        return v
    v = {"gpu_milli": len(r.gpu_indices) * r.gpu_milli, "gpu_memory_mib": sum(r.gpu_memory_mib),
         "cpu_milli": r.cpu_milli, "memory_mib": r.memory_mib}
    if r.mig_profile:
        v[f"mig:{r.mig_profile}"] = len(r.mig)
    for k, x in r.dra_usage:  # devices its ResourceClaims hold (DRA)
        v[k] = v.get(k, 0) + x
    return v


def add_vector(into: Vector, v: Mapping[str, int], sign: int = 1) -> None:
    """``into += sign * v``, resource by resource."""
    for k, x in v.items():
        if x:
            into[k] = into.get(k, 0) + sign * x


def fmt_amount(resource: str, value: int) -> str:
    """An amount as a person reads it: GPUs, cores, Mi/Gi."""
    if resource == "gpu_milli":
        return f"{value // GPU_MILLI}" if value % GPU_MILLI == 0 else f"{value / GPU_MILLI:.3g}"
    if resource == "cpu_milli":
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if resource.endswith("_mib"):
        return f"{value // 1024}Gi" if value % 1024 == 0 and value else f"{value}Mi"
    return str(value)


def resource_label(resource: str) -> str:
    return {"gpu_milli": "GPU", "gpu_memory_mib": "GPU memory", "cpu_milli": "CPU", "memory_mib": "memory"}.get(
        resource, f"MIG {resource[4:]}" if resource.startswith("mig:") else resource)


# --- the Queue object --------------------------------------------------------------------------


@dataclass
class Queue:
    name: str
    quota: Vector = field(default_factory=dict)  # nominal, per resource
    borrowing_limit: Vector = field(default_factory=dict)  # per resource; absent: may borrow without limit
    weight: int = 1
    parent: str | None = None
    namespaces: tuple[str, ...] = ()  # namespaces whose pods go here
    namespace_selector: LabelSelector | None = None  # on the namespace's labels; None: no namespace by label

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Queue":
        """A ``gpufleet.io/v1alpha1`` Queue custom resource; ConfigError names the object and field."""
        if not isinstance(obj, Mapping):
            raise ConfigError(f"Queue: expected an object, got {type(obj).__name__}")
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not name or not isinstance(name, str):
            raise ConfigError("Queue: field metadata.name is required")
        where = f"Queue {name}"
        if obj.get("kind", "Queue") != "Queue":
            raise ConfigError(f"{where}: field kind: expected Queue, got {obj.get('kind')!r}")
        spec = obj.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: field spec: expected an object")
        unknown = set(spec) - {"quota", "borrowingLimit", "weight", "parent", "namespaces", "namespaceSelector"}
        if unknown:
            raise ConfigError(f"{where}: field spec.{sorted(unknown)[0]}: unknown field")
        quota = parse_resources(spec.get("quota"), f"{where}: field spec.quota")
        borrow = parse_resources(spec.get("borrowingLimit"), f"{where}: field spec.borrowingLimit")
        w = spec.get("weight", 1)
        if not isinstance(w, int) or isinstance(w, bool) or w <= 0:
            raise ConfigError(f"{where}: field spec.weight: must be a positive integer, got {w!r}")
        parent = spec.get("parent")
        if parent is not None and (not isinstance(parent, str) or not parent):
            raise ConfigError(f"{where}: field spec.parent: must be a queue name, got {parent!r}")
        if parent == name:
            raise ConfigError(f"{where}: field spec.parent: a queue cannot be its own parent")
        nss = spec.get("namespaces") or []
        if not isinstance(nss, list) or not all(isinstance(x, str) for x in nss):
            raise ConfigError(f"{where}: field spec.namespaces: must be a list of namespace names")
        sel = parse_label_selector(spec.get("namespaceSelector"), "spec.namespaceSelector",
                                   lambda f, m: ConfigError(f"{where}: field {f}: {m}"))
        return cls(name, quota, borrow, w, parent, tuple(nss), sel)


def parse_resources(raw: Any, where: str) -> Vector:
    """Quota resources by their Kubernetes names -> engine units."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected an object of resource: amount")
    out: Vector = {}
    for k, v in raw.items():
        try:
            if k in ("nvidia.com/gpu", "gpus"):
                key, val = "gpu_milli", to_milli(v)  # "8" -> 8000, "500m" -> half a GPU
            elif k in ("gpu-milli", ann.GPU_MILLI):
                key, val = "gpu_milli", to_int(v)
            elif k in ("gpu-memory", ann.GPU_MEMORY):
                key, val = "gpu_memory_mib", to_mib(v)
            elif k == "cpu":
                key, val = "cpu_milli", to_milli(v)
            elif k == "memory":
                key, val = "memory_mib", to_mib(v)
            elif isinstance(k, str) and k.startswith("nvidia.com/mig-") and len(k) > len("nvidia.com/mig-"):
                key, val = f"mig:{k[len('nvidia.com/mig-'):]}", to_int(v)
            else:
                raise ConfigError(f"{where}.{k}: unknown resource (known: nvidia.com/gpu, gpu-milli, gpu-memory, "
                                  f"cpu, memory, nvidia.com/mig-<profile>)")
        except ConfigError:
            raise
        except (GpufleetError, ValueError, TypeError) as exc:
            raise ConfigError(f"{where}.{k}: {exc}") from None
        if isinstance(v, bool) or val < 0:
            raise ConfigError(f"{where}.{k}: must be a non-negative amount, got {v!r}")
        out[key] = out.get(key, 0) + val
    return out


def load_queues(objs: Iterable[Any]) -> tuple[list[Queue], list[str]]:
    """Parse many Queue objects; a bad one is reported and skipped, never fatal."""
    out: list[Queue] = []
    errors: list[str] = []
    seen: set[str] = set()
    for o in objs:
        try:
            q = Queue.from_json(o)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        if q.name in seen:
            errors.append(f"Queue {q.name}: defined twice; the first one is used")
            continue
        seen.add(q.name)
        out.append(q)
    return out, errors


# --- namespace -> queue ----------------------------------------------------------------------


def namespace_queue(ns: Mapping[str, Any]) -> str | None:
    """The queue a Namespace object names by label or annotation ``gpufleet.io/queue`` (annotation wins)."""
    meta = ns.get("metadata") or {}
    a = (meta.get("annotations") or {}).get(ann.QUEUE)
    return a or (meta.get("labels") or {}).get(ann.QUEUE) or None


class NamespaceQueues:
    """Which queue a pod goes to: its own annotation, else its namespace's label/annotation,
    else a queue that lists the namespace or whose namespaceSelector matches its labels."""

    def __init__(self, queues: Iterable[Queue], namespaces: Iterable[Mapping[str, Any]] = ()):
        self.queues = list(queues)
        self.labels: dict[str, dict[str, str]] = {}
        self.named: dict[str, str] = {}
        for ns in namespaces:
            self.update_namespace(ns)

    def update_namespace(self, ns: Mapping[str, Any]) -> None:
        meta = ns.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        self.labels[name] = dict(meta.get("labels") or {})
        q = namespace_queue(ns)
        if q:
            self.named[name] = q
        else:
            self.named.pop(name, None)

    def queue_for_namespace(self, namespace: str) -> str | None:
        if namespace in self.named:
            return self.named[namespace]
        labels = self.labels.get(namespace, {})
        for q in sorted(self.queues, key=lambda q: q.name):  # deterministic when several match
            if namespace in q.namespaces:
                return q.name
        for q in sorted(self.queues, key=lambda q: q.name):
            if selects(q.namespace_selector, labels):
                return q.name
        return None

    def apply(self, r: PodRequest) -> PodRequest:
        if r.queue:
            return r
        q = self.queue_for_namespace(r.namespace)
        return replace(r, queue=q) if q else r
