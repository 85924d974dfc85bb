"""The cluster model: nodes, GPUs, MIG instances, pod requests, assignments.

Plain dataclasses with units in their names and integers for resources
(``cpu_milli``, ``memory_mib``, ``gpu_milli`` with 1000 = one whole GPU).  Raw
Kubernetes JSON never gets past the adapters; ``podspec`` and ``inventory``
translate it into these.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from .constraints import PodTerms
    from .dra.pods import PodClaims

GPU_MILLI = 1000  # a whole GPU

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance carved out of one GPU (e.g. profile ``1g.10gb``)."""

    profile: str
    memory_mib: int
    instance_id: int = 0


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[int, ...] = ()
    healthy: bool = True


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Node:
    """A node as the scheduler sees it: allocatable resources and its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=True)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    max_pods: int = 110
    # allocatable of every other scalar resource (ephemeral-storage, hugepages-*, rdma/*, vendor devices)
    scalars: tuple[tuple[str, int], ...] = ()
    # kubelet devices per GPU for nvidia.com/gpu (the device plugin's slots/replicas): every pod on a GPU, whole or
    # a share, holds one of them, so no GPU takes more pods than kubelet can hand devices for. 0 = no limit (simulator)
    gpu_slots: int = 0
    # kubelet's allocatable nvidia.com/gpu (healthy devices it will hand out); -1 = unknown (simulator)
    gpu_devices: int = -1
    # status.declaredFeatures: node features kubelet declares (NodeDeclaredFeatures, GA in 1.37)
    declared_features: frozenset[str] = frozenset()
    # kubelet refused a pod because the node's GPU device plugin was down and it has not registered again
    # (kube/plugin_down): kubelet would refuse every GPU pod placed here now, so GpuFit places none
    gpu_plugin_down: bool = False


# --- pod requests ---------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One node-selector requirement (key, operator, values)."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        """Whether a label (or field) with this value, None when absent, meets the requirement.

        The one place the operators are evaluated: label selectors (``selector``) and node
        selectors (``plugins._common``) both call it.  Gt/Lt compare integers; a value that is
        not one fails."""
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        try:
            iv, lim = int(value), int(self.values[0])  # type: ignore[arg-type]
        except (TypeError, ValueError, IndexError):
            return False
        return iv > lim if op == "Gt" else iv < lim


@dataclass(frozen=True)
class SelectorTerm:
    """Requirements ANDed together; a term list is ORed (Kubernetes semantics)."""

    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class PreferredTerm:
    weight: int
    term: SelectorTerm


@dataclass(frozen=True)
class Toleration:
    """``Gt`` / ``Lt`` (TaintTolerationComparisonOperators, alpha in 1.35): the taint's value, an integer, is
    greater / less than the toleration's; a value that is not an integer is never tolerated."""

    key: str = ""
    operator: Literal["Equal", "Exists", "Gt", "Lt"] = "Equal"
    value: str = ""
    effect: str = ""  # empty matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        if self.operator in ("Gt", "Lt"):
            if self.key and self.key != taint.key:
                return False
            try:
                mine, theirs = int(self.value), int(taint.value)
            except ValueError:
                return False
            return theirs > mine if self.operator == "Gt" else theirs < mine
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class PodRequest:
    """What one pod needs, in engine units.

    GPU demand is ``gpu_count`` devices, each with ``gpu_milli`` of compute
    share (1000 = whole, exclusive GPU) and ``gpu_memory_mib`` of memory (0 =
    no memory reservation; a whole GPU always takes all of its memory).  A MIG
    request is ``mig_profile`` with ``gpu_count`` instances.
    """

    name: str
    namespace: str = "default"
    uid: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    gpu_models_allow: frozenset[str] | None = None
    gpu_models_deny: frozenset[str] = frozenset()
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[SelectorTerm, ...] = ()
    preferred_terms: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    scheduler_name: str = "default-scheduler"
    queue: str | None = None
    pod_group: str | None = None
    pod_group_min: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    # every other scalar resource requested (name, amount in the resource's base unit)
    scalars: tuple[tuple[str, int], ...] = ()
    # labels and pod-to-pod / port / volume terms (None: no labels, no terms, as in a trace)
    terms: PodTerms | None = field(default=None, compare=False, hash=False)
    preempt_never: bool = False  # spec.preemptionPolicy: Never (waits, never evicts lower-priority pods)
    # node features the pod needs (kube-scheduler's NodeDeclaredFeatures infers them from the spec)
    node_features: frozenset[str] = frozenset()
    # spec.schedulingGroup.podGroupName: a scheduling.k8s.io PodGroup (gang.resolve_scheduling_group makes it a gang)
    scheduling_group: str | None = None
    priority_class: str = ""  # spec.priorityClassName
    spot: str | None = None  # gpufleet.io/spot: prefer | allow | never (None: from the PriorityClass, see engine.capacity)
    # the pod's ResourceClaims (DRA), resolved by the adapter; the GPU fields above then describe what they ask
    # for, for scoring, and the claims' devices are held by the claims, not by the pod's assignment
    dra: PodClaims | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> str:  # not cached: one more __dict__ entry grows each request's dict (+24 MiB in a replay run)
        return f"{self.namespace}/{self.name}"

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0

    @property
    def whole_gpus(self) -> bool:
        return self.gpu_count > 0 and self.mig_profile is None and self.gpu_milli >= GPU_MILLI

    @property
    def shared_gpu(self) -> bool:
        return self.gpu_count > 0 and self.mig_profile is None and self.gpu_milli < GPU_MILLI

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU (MIG instances count as their slice share)."""
        return self.gpu_count * self.gpu_milli

    def shape(self) -> tuple:
        """What resource-only scoring depends on; pods of one shape share score caches."""
        return (
            self.cpu_milli,
            self.memory_mib,
            self.gpu_count,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.mig_profile,
            self.gpu_models_allow,
            self.gpu_models_deny,
        )


def request_copy(r: PodRequest, **changes: object) -> PodRequest:
    """``dataclasses.replace(r, **changes)`` without running the frozen dataclass's ``__init__`` over its forty
    fields again (every arrival of a resampled trace, every resolved DRA pod); the caller passes field names only,
    and nothing but fields may live in a request's ``__dict__`` (no cached properties)."""
    out = object.__new__(PodRequest)
    d = out.__dict__
    d.update(r.__dict__)
    d.update(changes)
    return out


_T = TypeVar("_T")


def quick_frozen_init(cls: type[_T]) -> type[_T]:
    """Give a frozen dataclass an ``__init__`` that fills the new instance's ``__dict__`` in one update, where the
    generated one calls ``object.__setattr__`` once per field (its way round the class's frozen ``__setattr__``).

    Why: the engine makes an ``Assignment``, a ``Decision``, a ``GpuChoice`` and for a refused pod a ``Status`` on
    every decision; with sixteen fields the generated ``__init__`` of an ``Assignment`` took about 2 us of a cheap
    policy's 65 us cycle, this one about 1 us.  The instance is the
    same (fields, defaults, equality, hash, repr: tests/engine/test_quick_init.py compares them); only for classes
    whose fields all have a plain default or none (no ``default_factory``, ``__post_init__``, ``InitVar``, slots)."""
    params, names, ns = [], [], {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not MISSING or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: quick_frozen_init needs a plain default or none")
        names.append(f.name)
        if f.default is MISSING:
            params.append(f.name)
        else:
            ns[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        raise TypeError(f"{cls.__name__}: quick_frozen_init does not call __post_init__ or fill slots")
    src = (f"def __init__(self, {', '.join(params)}):\n"
           f"    self.__dict__.update({', '.join(f'{n}={n}' for n in names)})\n")
    exec(src, ns)  # as dataclasses builds the generated __init__: from source text
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@quick_frozen_init  # made on every placement (see quick_frozen_init)
@dataclass(frozen=True)
class Assignment:
    """Where a pod runs: the node and the exact devices it holds."""

    pod_key: str
    node: str
    cpu_milli: int
    memory_mib: int
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0  # per GPU
    gpu_memory_mib: tuple[int, ...] = ()  # per GPU, reserved
    mig: tuple[tuple[int, int], ...] = ()  # (gpu index, instance id)
    mig_profile: str | None = None
    priority: int = 0
    queue: str | None = None
    pod_group: str | None = None
    scalars: tuple[tuple[str, int], ...] = ()
    terms: PodTerms | None = field(default=None, compare=False, hash=False, repr=False)
    claims: tuple[str, ...] = ()  # ResourceClaims (namespace/name) the pod uses: their devices are held per claim
    # what the pod's claims take, for team queues (DRA: the claims, not the assignment, hold the devices):
    # (resource, amount) as queues count it -- gpu_milli, gpu_memory_mib, mig:<profile>
    dra_usage: tuple[tuple[str, int], ...] = ()

    @property
    def held_gpu_milli(self) -> int:
        """GPU compute the pod holds: its device-plugin GPUs', or what its claims hold for it (DRA)."""
        return len(self.gpu_indices) * self.gpu_milli + dict(self.dra_usage).get("gpu_milli", 0)
