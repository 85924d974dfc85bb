"""What the scheduler knows about volumes: PVCs, PVs, StorageClasses, per-node attach limits.

Filled by the Kubernetes adapter from watches (``from_json`` helpers below
parse the API objects at the edge); the engine reads it through
``ClusterState.volumes``.  A pod whose claim is bound lands only where the
PersistentVolume's node affinity allows.  A claim of a WaitForFirstConsumer
StorageClass is bound the way kube-scheduler binds it: the node is chosen
first, among nodes where an available PV matching the claim can be used (a
static, e.g. local, volume) or where the class's provisioner may create one
(``allowedTopologies``); ``plan_bindings`` then names the PV to bind, or asks
for provisioning on the node (the adapter writes the PV's ``claimRef`` or the
claim's ``volume.kubernetes.io/selected-node`` and binds the pod once the
claim is bound).  An unbound claim of an Immediate class waits for the PV
controller, with kube-scheduler's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .constraints import ClaimInfo, PersistentVolume, StorageClassInfo
from .errors import InvalidPodSpec, InvalidQuantity
from .model import Node, Requirement, SelectorTerm
from .quantity import parse_quantity

# in-tree volume plugins and the CSI drivers they migrated to (node allocatable attachable-volumes-<plugin>)
IN_TREE_DRIVERS = {"aws-ebs": "ebs.csi.aws.com", "gce-pd": "pd.csi.storage.gke.io", "azure-disk": "disk.csi.azure.com",
                   "cinder": "cinder.csi.openstack.org"}
_IN_TREE_SOURCES = {"awsElasticBlockStore": "aws-ebs", "gcePersistentDisk": "gce-pd", "azureDisk": "azure-disk", "cinder": "cinder"}
SELECTED_NODE = "volume.kubernetes.io/selected-node"  # the node a WaitForFirstConsumer claim is provisioned for
ZONE_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region",
               "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region")


@dataclass
class VolumeCatalog:
    claims: dict[str, ClaimInfo] = field(default_factory=dict)  # namespace/name
    volumes: dict[str, PersistentVolume] = field(default_factory=dict)  # PV name
    binding_modes: dict[str, str] = field(default_factory=dict)  # StorageClass -> volumeBindingMode
    attach_limits: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> CSI driver -> max volumes
    classes: dict[str, StorageClassInfo] = field(default_factory=dict)
    node_drivers: dict[str, frozenset[str]] = field(default_factory=dict)  # node -> CSI drivers its CSINode lists
    # CSIDrivers with preventPodSchedulingIfMissing (VolumeLimitScaling, beta in 1.37): only nodes listing them
    required_drivers: frozenset[str] = frozenset()
    assumed: dict[str, str] = field(default_factory=dict)  # PV -> claim key, promised by this scheduler, not yet bound

    def binding_mode(self, storage_class: str) -> str:
        sc = self.classes.get(storage_class)
        return sc.binding_mode if sc is not None else self.binding_modes.get(storage_class, "Immediate")

    def candidates(self, claim: ClaimInfo) -> list[PersistentVolume]:
        """Available PVs that could be bound to an unbound claim (class, size, volume mode, attributes class, the
        claim's label selector, access modes), smallest first."""
        key = f"{claim.namespace}/{claim.name}"
        out = []
        for pv in self.volumes.values():
            if pv.storage_class != claim.storage_class or pv.capacity_bytes < claim.request_bytes:
                continue
            # kube-scheduler's FindMatchingVolume: same volume mode and VolumeAttributesClass, not being deleted
            if pv.volume_mode != claim.volume_mode or pv.attributes_class != claim.attributes_class or pv.deleting:
                continue
            if claim.bad_selector or (claim.selector is not None and not claim.selector.matches(dict(pv.labels))):
                continue
            if pv.claim_ref not in ("", key) or self.assumed.get(pv.name, key) != key:
                continue
            if pv.phase not in ("Available", "Pending") and pv.claim_ref != key:
                continue
            if not set(claim.access_modes) <= set(pv.access_modes):
                continue
            out.append(pv)
        return sorted(out, key=lambda v: (v.capacity_bytes, v.name))

    def limits_of(self, node: Node) -> dict[str, int]:
        """Attach limits per CSI driver: the node's CSINode, else its ``attachable-volumes-*`` allocatable."""
        out: dict[str, int] = {}
        for name, v in node.scalars:
            if name.startswith("attachable-volumes-csi-"):
                out[name[len("attachable-volumes-csi-"):]] = v
            elif name.startswith("attachable-volumes-") and name[len("attachable-volumes-"):] in IN_TREE_DRIVERS:
                out[IN_TREE_DRIVERS[name[len("attachable-volumes-"):]]] = v
        out.update(self.attach_limits.get(node.name, {}))
        return out

    def driver_of(self, claim_key: str) -> str:
        """The CSI driver that attaches a claim's volume: its bound PV's, else its StorageClass's provisioner
        (the volume it will get), as kube-scheduler's NodeVolumeLimits counts an unbound claim."""
        c = self.claims.get(claim_key)
        if c is None:
            return ""
        pv = self.volumes.get(c.volume_name) if c.volume_name else None
        if pv is not None or c.volume_name:
            return pv.driver if pv is not None else ""
        sc = self.classes.get(c.storage_class)
        return sc.provisioner if sc is not None and sc.provisioner != "kubernetes.io/no-provisioner" else ""


def _bytes(v: Any) -> int:
    try:
        return int(parse_quantity(v)) if v is not None else 0
    except InvalidQuantity:
        return 0


def claim_from_json(obj: Mapping[str, Any]) -> ClaimInfo:
    from .podterms import parse_selector

    m = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    req = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    selector, bad = None, ""
    try:
        selector = parse_selector(f"persistentvolumeclaim {m.get('namespace') or 'default'}/{m.get('name')}", "spec.selector", spec.get("selector"))
    except InvalidPodSpec as exc:
        bad = str(exc)
    return ClaimInfo(namespace=m.get("namespace") or "default", name=m.get("name") or "",
                     volume_name=spec.get("volumeName") or "", phase=(obj.get("status") or {}).get("phase") or "Pending",
                     storage_class=spec.get("storageClassName") or "",
                     access_modes=tuple(str(x) for x in spec.get("accessModes") or ()),
                     request_bytes=_bytes(req), uid=str(m.get("uid") or ""),
                     volume_mode=spec.get("volumeMode") or "Filesystem",
                     attributes_class=spec.get("volumeAttributesClassName") or "", selector=selector, bad_selector=bad)


def _topology_terms(raw: Any) -> tuple[SelectorTerm, ...]:
    out = []
    for t in raw or []:
        reqs = tuple(Requirement(str(e.get("key")), "In", tuple(str(v) for v in e.get("values") or ()))
                     for e in (t.get("matchLabelExpressions") or []) if isinstance(e, Mapping) and e.get("key"))
        out.append(SelectorTerm(reqs))
    return tuple(out)


def storageclass_from_json(obj: Mapping[str, Any]) -> StorageClassInfo:
    return StorageClassInfo(name=(obj.get("metadata") or {}).get("name") or "",
                            binding_mode=obj.get("volumeBindingMode") or "Immediate",
                            provisioner=obj.get("provisioner") or "",
                            allowed_topologies=_topology_terms(obj.get("allowedTopologies")))


def pv_from_json(obj: Mapping[str, Any]) -> PersistentVolume:
    """A PV's required node affinity; a term that cannot be parsed makes the PV usable nowhere (never silently anywhere)."""
    from .podspec import (
        _term,  # the node-selector term parser, shared with node affinity
    )

    m = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = m.get("name") or ""
    req = ((spec.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms") or []
    terms: list[SelectorTerm] = []
    for i, t in enumerate(req):
        try:
            terms.append(_term(f"persistentvolume {name}", f"spec.nodeAffinity.required.nodeSelectorTerms[{i}]", t))
        except InvalidPodSpec:
            terms.append(SelectorTerm(()))  # an empty term matches no node
    if req and not terms:
        terms = [SelectorTerm(())]
    # VolumeZone: a PV labelled with zones/regions (in-tree and older provisioners) is usable only there;
    # each label ANDs into every term ("a__b" lists several zones)
    zone_reqs = tuple(Requirement(k, "In", tuple(str(m.get("labels", {})[k]).split("__")))
                      for k in ZONE_LABELS if k in (m.get("labels") or {}))
    if zone_reqs:
        terms = [SelectorTerm(t.requirements + zone_reqs) for t in terms] or [SelectorTerm(zone_reqs)]
    driver = (spec.get("csi") or {}).get("driver") or ""
    for src, plugin in _IN_TREE_SOURCES.items():
        if not driver and spec.get(src) is not None:
            driver = IN_TREE_DRIVERS[plugin]
    ref = spec.get("claimRef") or {}
    claim_ref = f"{ref.get('namespace') or 'default'}/{ref.get('name')}" if ref.get("name") else ""
    return PersistentVolume(name, tuple(terms), driver, storage_class=spec.get("storageClassName") or "",
                            capacity_bytes=_bytes((spec.get("capacity") or {}).get("storage")),
                            access_modes=tuple(str(x) for x in spec.get("accessModes") or ()), claim_ref=claim_ref,
                            phase=(obj.get("status") or {}).get("phase") or "Available",
                            volume_mode=spec.get("volumeMode") or "Filesystem",
                            attributes_class=spec.get("volumeAttributesClassName") or "",
                            deleting=bool(m.get("deletionTimestamp")),
                            labels=tuple(sorted((str(k), str(v)) for k, v in (m.get("labels") or {}).items())))


def csinode_drivers(obj: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """The CSI drivers a CSINode says are installed on its node."""
    name = (obj.get("metadata") or {}).get("name") or ""
    return name, frozenset(str(d["name"]) for d in (obj.get("spec") or {}).get("drivers") or []
                           if isinstance(d, Mapping) and d.get("name"))


def csidriver_required(obj: Mapping[str, Any]) -> tuple[str, bool]:
    """A CSIDriver's name, and whether pods need it installed on their node (``spec.preventPodSchedulingIfMissing``)."""
    return (obj.get("metadata") or {}).get("name") or "", (obj.get("spec") or {}).get("preventPodSchedulingIfMissing") is True


def csinode_limits(obj: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
    """A CSINode's per-driver ``allocatable.count`` (the node's attach limit)."""
    name = (obj.get("metadata") or {}).get("name") or ""
    out: dict[str, int] = {}
    for d in (obj.get("spec") or {}).get("drivers") or []:
        cnt = (d.get("allocatable") or {}).get("count") if isinstance(d, Mapping) else None
        if isinstance(cnt, int) and not isinstance(cnt, bool) and cnt >= 0 and d.get("name"):
            out[d["name"]] = cnt
    return name, out


def matches_node(terms: tuple[SelectorTerm, ...], node: Node) -> bool:
    """ORed node-selector terms (empty: everywhere)."""
    from .plugins._common import term_matches

    return not terms or any(term_matches(t, node.labels, node.name) for t in terms)


def provisionable_on(cat: VolumeCatalog, claim: ClaimInfo, node: Node) -> bool:
    sc = cat.classes.get(claim.storage_class)
    return sc is not None and sc.provisions and matches_node(sc.allowed_topologies, node)


def plan_bindings(cat: VolumeCatalog, namespace: str, claims: tuple[str, ...], node: Node) -> list[tuple[ClaimInfo, str]] | None:
    """For each unbound WaitForFirstConsumer claim: the PV to bind on ``node`` ("" = provision there); None if impossible."""
    out: list[tuple[ClaimInfo, str]] = []
    taken: set[str] = set()
    for c in claims:
        claim = cat.claims.get(f"{namespace}/{c}")
        if claim is None or claim.volume_name or cat.binding_mode(claim.storage_class) != "WaitForFirstConsumer":
            continue
        pv = next((v for v in cat.candidates(claim) if v.name not in taken and matches_node(v.node_affinity, node)), None)
        if pv is not None:
            taken.add(pv.name)
            out.append((claim, pv.name))
        elif provisionable_on(cat, claim, node):
            out.append((claim, ""))
        else:
            return None
    return out
