"""Kubernetes Node / Pod JSON -> engine model.

A node's GPUs come from the node agent's ``gpufleet.io/gpu-inventory``
annotation when present; otherwise they are modelled from ``nvidia.com/gpu``
allocatable and GPU Feature Discovery's labels (``nvidia.com/gpu.product``,
``nvidia.com/gpu.memory``, ``nvidia.com/gpu.count``, ``nvidia.com/gpu.replicas``), so gpufleet also works beside NVIDIA's own device
plugin.  Bad values raise ``InvalidNodeSpec`` naming the node and the field.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..engine import annotations as ann
from ..engine.errors import InvalidNodeSpec, InvalidPodSpec, InvalidQuantity
from ..engine.gpu_models import lookup, mig_profile_memory_mib
from ..engine.inventory import assignment_from_json, gpus_from_json, inventory_slots
from ..engine.model import Assignment, Gpu, MigInstance, Node, Taint
from ..engine.podspec import (
    _NOT_SCALAR_PREFIXES,
    counted_requests,
    parse_pod,
    pod_key,
    scalar_requests,
)
from ..engine.podterms import lenient_terms
from ..engine.quantity import to_int, to_mib, to_milli
from ..engine.state import ClusterState

GPU_RESOURCE = "nvidia.com/gpu"
NOT_READY_TAINT = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")  # what the node lifecycle controller puts on a node not Ready
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB, as GFD writes it
GFD_COUNT = "nvidia.com/gpu.count"
GFD_REPLICAS = "nvidia.com/gpu.replicas"  # time-slicing: allocatable = count x replicas
GFD_SHARING = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"  # none | single | mixed
GPU_SHARED_RESOURCE = "nvidia.com/gpu.shared"  # NVIDIA's renameByDefault
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def _label_int(name: str, labels: Mapping[str, str], label: str, minimum: int) -> int | None:
    if label not in labels:
        return None
    try:
        v = int(labels[label])
    except ValueError:
        raise InvalidNodeSpec(name, f"metadata.labels[{label}]", f"must be an integer, got {labels[label]!r}") from None
    if v < minimum:
        raise InvalidNodeSpec(name, f"metadata.labels[{label}]", f"must not be below {minimum}, got {v}")
    return v


def node_from_json(obj: Mapping[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or "<unnamed>"
    labels = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    spec = obj.get("spec") or {}

    def q(key: str, conv, default: int) -> int:
        if key not in alloc:
            return default
        try:
            return conv(alloc[key])
        except InvalidQuantity as exc:
            raise InvalidNodeSpec(name, f"status.allocatable.{key}", str(exc)) from None

    cpu = q("cpu", to_milli, 0)
    mem = q("memory", to_mib, 0)
    pods = q("pods", to_int, 110)
    if ann.INVENTORY in annotations:
        # gpufleet's agent: the GPUs as NVML sees them, and how many kubelet devices stand for each
        gpus = gpus_from_json(name, annotations[ann.INVENTORY])
        slots, resource = inventory_slots(name, annotations[ann.INVENTORY])
        if slots is None:  # an agent from before gpu_slots: one device per GPU unless time-sliced
            slots = _label_int(name, labels, GFD_REPLICAS, 1) or 1
        if resource != GPU_RESOURCE or (alloc and GPU_SHARED_RESOURCE in alloc and GPU_RESOURCE not in alloc):
            # renamed (nvidia.com/gpu.shared): kubelet has no nvidia.com/gpu here, so no whole GPU or share fits
            gpus = tuple(replace(g, healthy=False) if not g.mig_enabled else g for g in gpus)
        # what kubelet will hand out now (0 until the agent registered; drops while a GPU is unhealthy)
        devices = q(resource, to_int, 0) if alloc else -1
    else:
        gpus, slots = _gpus_from_nvidia_plugin(name, labels, alloc, q)
        devices = q(GPU_RESOURCE, to_int, 0) if alloc else -1
    taints = []
    for i, t in enumerate(spec.get("taints") or []):
        if not isinstance(t, Mapping) or not t.get("key") or t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise InvalidNodeSpec(name, f"spec.taints[{i}]", f"needs a key and a known effect, got {t!r}")
        taints.append(Taint(t["key"], t.get("value", ""), t["effect"]))
    scalars = []
    for key in alloc:
        if key in ("cpu", "memory", "pods", GPU_RESOURCE) or key.startswith(_NOT_SCALAR_PREFIXES):
            continue
        v = q(key, lambda x: -(-to_milli(x) // 1000), 0)
        if v > 0:
            scalars.append((str(key), v))
    features = status.get("declaredFeatures") or []
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise InvalidNodeSpec(name, "status.declaredFeatures", f"must be a list of feature names, got {features!r}")
    return Node(name=name, cpu_milli=cpu, memory_mib=mem, gpus=gpus, labels=labels, taints=tuple(taints),
                unschedulable=bool(spec.get("unschedulable")), max_pods=pods, scalars=tuple(sorted(scalars)),
                gpu_slots=slots, gpu_devices=devices, declared_features=frozenset(features))


def _gpus_from_nvidia_plugin(name: str, labels: Mapping[str, str], alloc: Mapping[str, Any], q) -> tuple[tuple[Gpu, ...], int]:
    """A node served by NVIDIA's device plugin + GFD: what that plugin can hand out, and nothing more.

    ``nvidia.com/gpu`` allocatable is GPUs x replicas (time-slicing or MPS); each replica is one pod, so a GPU
    takes at most ``replicas`` pods (with replicas 1: never two shares on one GPU).  With ``renameByDefault``
    the replicas are ``nvidia.com/gpu.shared`` and a pod asking for ``nvidia.com/gpu`` cannot be served at
    all.  MIG instances (mixed strategy) are ``nvidia.com/mig-<profile>`` counts; with the single strategy
    they are ``nvidia.com/gpu`` devices and modelled as GPUs of the instance's size (GFD's labels say so).
    """
    replicas = _label_int(name, labels, GFD_REPLICAS, 1) or 1
    strategy = labels.get(GFD_SHARING, "none")
    if strategy not in ("none", "time-slicing", "mps"):
        raise InvalidNodeSpec(name, f"metadata.labels[{GFD_SHARING}]", f"must be none, time-slicing or mps, got {strategy!r}")
    devices = q(GPU_RESOURCE, to_int, 0)
    count = devices // replicas
    gfd_count = _label_int(name, labels, GFD_COUNT, 0)
    if gfd_count is not None:
        count = min(count, gfd_count)
    product = labels.get(GFD_PRODUCT, "unknown-gpu")
    mem_mib = _label_int(name, labels, GFD_MEMORY, 0) or 0
    if not mem_mib:
        m = lookup(product)
        mem_mib = m.memory_mib if m else 16_384
    gpus = [Gpu(i, f"{name}/gpu{i}", product, mem_mib) for i in range(count)]
    if labels.get(GFD_MIG_STRATEGY, "mixed") == "mixed":
        for res in sorted(k for k in alloc if k.startswith(MIG_RESOURCE_PREFIX)):
            n = q(res, to_int, 0)
            prof = res[len(MIG_RESOURCE_PREFIX):]
            if n <= 0:
                continue
            inst_mem = _label_int(name, labels, f"{res}.memory", 0) or mig_profile_memory_mib(prof) or 0
            # the plugin names instances, not GPUs: one MIG-mode "GPU" per profile holds that profile's instances
            gpus.append(Gpu(len(gpus), f"{name}/{prof}", product, max(1, inst_mem * n), mig_enabled=True,
                            mig_instances=tuple(MigInstance(prof, inst_mem, k) for k in range(n))))
    return tuple(gpus), replicas


def node_ready(obj: Mapping[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return True  # no conditions reported (e.g. a test cluster without kubelets): trust it


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _bound_scalars(req: Mapping[str, int], state: ClusterState, node: str) -> tuple[tuple[str, int], ...]:
    """A running pod's scalar requests, limited to resources its node reports (kubelet admitted it)."""
    i = state.index.get(node)
    if i is None:
        return ()
    return tuple((k, v) for k, v in scalar_requests(req) if k in state.scalar_cap and state.scalar_cap[k][i] > 0)


def held_amounts(pod: Mapping[str, Any], state: ClusterState, node: str) -> tuple[int, int, tuple[tuple[str, int], ...]]:
    """cpu milli, memory MiB and scalars a bound pod holds now (in-place resize included)."""
    req = counted_requests(pod)
    return req.get("cpu", 0), req.get("memory", 0), _bound_scalars(req, state, node)


def bound_assignment(pod: Mapping[str, Any], state: ClusterState) -> Assignment:
    """The resources a bound pod holds: its assignment annotation, else modelled from its requests.

    A pod bound by another scheduler (no annotation) still holds CPU, memory
    and ``nvidia.com/gpu`` GPUs; those are taken from the node's free whole
    GPUs in index order, which is what a device plugin without gpufleet hands
    out first.  Raises ``InvalidPodSpec`` for an annotation that contradicts
    the binding.
    """
    key = pod_key(pod)
    req = counted_requests(pod)  # the larger of desired and allocated while an in-place resize is pending
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    spec = pod.get("spec") or {}
    node_name = spec.get("nodeName", "")
    prio = int(spec.get("priority") or 0)
    cpu, mem = req.get("cpu", 0), req.get("memory", 0)
    if ann.ASSIGNMENT in annotations:
        a = assignment_from_json(key, annotations[ann.ASSIGNMENT], cpu, mem, prio)
        if a.node != node_name:
            raise InvalidPodSpec(key, f"metadata.annotations[{ann.ASSIGNMENT}].node", f"says {a.node!r} but the pod is bound to {node_name!r}")
        return replace(a, scalars=_bound_scalars(req, state, node_name), terms=lenient_terms(pod))
    want = req.get(GPU_RESOURCE, 0)
    gpus: tuple[int, ...] = ()
    if want and node_name in state.index:
        i = state.index[node_name]
        ng = state.gpu_free_milli.shape[1]
        free = [int(g) for g in range(ng)
                if state.gpu_usable[i, g] and state.gpu_free_milli[i, g] == 1000 and state.gpu_slots_free[i, g] > 0
                and state.gpu_mem_free[i, g] == state.gpu_mem_cap[i, g]]
        gpus = tuple(free[:want])  # what gpufleet's agent hands a pod without an assignment
        if len(gpus) < want:
            # no whole GPU left for it: kubelet still gave it devices; hold one device (slot) of the GPUs with most
            # devices left, so kubelet's count and ours stay equal (its compute/memory are unknown)
            rest = sorted((g for g in range(ng) if state.gpu_usable[i, g] and state.gpu_slots_free[i, g] > 0 and g not in gpus),
                          key=lambda g: (-int(state.gpu_slots_free[i, g]), g))
            extra = tuple(rest[: want - len(gpus)])
            if extra:
                return Assignment(pod_key=key, node=node_name, cpu_milli=cpu, memory_mib=mem, gpu_indices=gpus + extra,
                                  gpu_milli=0, gpu_memory_mib=(0,) * (len(gpus) + len(extra)), priority=prio)
    return Assignment(pod_key=key, node=node_name, cpu_milli=cpu, memory_mib=mem, gpu_indices=gpus,
                      gpu_milli=1000 if gpus else 0,
                      gpu_memory_mib=tuple(int(state.gpu_mem_cap[state.index[node_name], g]) for g in gpus),
                      priority=prio, scalars=_bound_scalars(req, state, node_name), terms=lenient_terms(pod))


__all__ = ["bound_assignment", "held_amounts", "is_terminal", "node_from_json", "node_ready", "parse_pod", "pod_key"]
