"""Typed pod-to-pod and volume constraints: what a pod says about *other* pods.

Why a module of its own: node affinity and resources depend on the node alone,
but inter-pod affinity, topology spread, host ports and volumes depend on which
pods already run where.  ``podterms`` parses them from Pod JSON at the edge;
the pod index (``podindex``) keeps per-node counts of the pods each selector
matches, so a scheduling cycle reads counts instead of rescanning every pod.

Semantics follow Kubernetes (``k8s.io/api/core/v1``): an empty label selector
matches every pod, a missing one matches none; an affinity term with neither
``namespaces`` nor ``namespaceSelector`` applies to the owning pod's namespace;
``namespaceSelector: {}`` means every namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .model import SelectorTerm
from .selector import EVERYTHING, LabelSelector


@dataclass(frozen=True)
class PodAffinityTerm:
    """One inter-pod (anti-)affinity term, namespaces already defaulted.

    ``selector`` None matches no pod.  A pod is in the term's namespaces when
    its namespace is listed or (``namespace_selector`` given) its namespace's
    labels match.  ``weight`` is 0 for required terms.
    """

    selector: LabelSelector | None
    topology_key: str
    namespaces: frozenset[str] = frozenset()
    namespace_selector: LabelSelector | None = None
    weight: int = 0

    def matches(self, namespace: str, labels: Mapping[str, str], ns_labels: Callable[[str], Mapping[str, str]]) -> bool:
        if self.selector is None:
            return False
        if namespace not in self.namespaces and (
                self.namespace_selector is None or not self.namespace_selector.matches(ns_labels(namespace))):
            return False
        return self.selector.matches(labels)


WhenUnsatisfiable = Literal["DoNotSchedule", "ScheduleAnyway"]
InclusionPolicy = Literal["Honor", "Ignore"]


@dataclass(frozen=True)
class SpreadConstraint:
    """One ``topologySpreadConstraints`` entry (``matchLabelKeys`` already merged into the selector)."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: WhenUnsatisfiable
    selector: LabelSelector | None
    min_domains: int = 1
    node_affinity_policy: InclusionPolicy = "Honor"
    node_taints_policy: InclusionPolicy = "Ignore"
    owner_uid: str = ""  # system default constraints: pods of the same controller instead of a selector

    @property
    def hard(self) -> bool:
        return self.when_unsatisfiable == "DoNotSchedule"


@dataclass(frozen=True)
class HostPort:
    port: int
    protocol: str = "TCP"
    host_ip: str = "0.0.0.0"

    def conflicts(self, other: HostPort) -> bool:
        if self.port != other.port or self.protocol != other.protocol:
            return False
        wild = ("0.0.0.0", "::", "")
        return self.host_ip == other.host_ip or self.host_ip in wild or other.host_ip in wild


@dataclass(frozen=True, eq=False)
class PodTerms:
    """A pod's labels and everything it says about other pods, ports and volumes.

    Carried by ``PodRequest.terms`` (the pod being scheduled) and by
    ``Assignment.terms`` (a placed pod), so the pod index learns a pod's labels
    and its terms when it is reserved and forgets them when it is unreserved.
    """

    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_uid: str = ""  # the controlling ownerReference (ReplicaSet, StatefulSet, Job...)
    affinity: tuple[PodAffinityTerm, ...] = ()  # required
    anti_affinity: tuple[PodAffinityTerm, ...] = ()  # required
    preferred_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    claims: tuple[str, ...] = ()  # PersistentVolumeClaim names (pod's namespace), generic ephemeral included

    @property
    def has_affinity_terms(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.preferred_affinity or self.preferred_anti_affinity)

    @property
    def indexed(self) -> bool:
        """Whether the pod index must remember this pod's own terms (symmetry, ports, volumes)."""
        return bool(self.affinity or self.anti_affinity or self.preferred_affinity or self.preferred_anti_affinity
                    or self.host_ports or self.claims)


NO_TERMS = PodTerms()


@dataclass(frozen=True)
class PersistentVolume:
    """What placement needs of a PV: where it can be used, and which driver attaches it."""

    name: str
    node_affinity: tuple[SelectorTerm, ...] = ()  # ORed; empty = usable anywhere
    driver: str = ""  # CSI driver name, for per-node attach limits
    storage_class: str = ""
    capacity_bytes: int = 0
    access_modes: tuple[str, ...] = ()
    claim_ref: str = ""  # namespace/name of the claim it is (being) bound to
    phase: str = "Available"
    volume_mode: str = "Filesystem"
    attributes_class: str = ""  # spec.volumeAttributesClassName (VolumeAttributesClass, GA 1.34)
    deleting: bool = False  # metadata.deletionTimestamp set: never bound to a new claim
    labels: tuple[tuple[str, str], ...] = ()  # what a claim's spec.selector matches


@dataclass(frozen=True)
class ClaimInfo:
    """A PersistentVolumeClaim as the scheduler needs it."""

    namespace: str
    name: str
    volume_name: str = ""  # bound PV
    phase: str = "Pending"
    storage_class: str = ""
    access_modes: tuple[str, ...] = ()
    request_bytes: int = 0
    uid: str = ""
    volume_mode: str = "Filesystem"
    attributes_class: str = ""  # spec.volumeAttributesClassName: a PV must name the same class to be bound to it
    selector: LabelSelector | None = None  # spec.selector: only PVs whose labels it matches; None: any
    bad_selector: str = ""  # why spec.selector could not be read: no PV matches it (never silently any)


@dataclass(frozen=True)
class StorageClassInfo:
    name: str
    binding_mode: str = "Immediate"
    provisioner: str = ""
    allowed_topologies: tuple[SelectorTerm, ...] = ()  # ORed; empty = anywhere

    @property
    def provisions(self) -> bool:
        return bool(self.provisioner) and self.provisioner != "kubernetes.io/no-provisioner"


__all__ = [
    "EVERYTHING",
    "NO_TERMS",
    "ClaimInfo",
    "HostPort",
    "LabelSelector",
    "PersistentVolume",
    "PodAffinityTerm",
    "PodTerms",
    "SpreadConstraint",
]
