"""What the scheduler knows about volumes: PVCs, PVs, StorageClasses, per-node attach limits.

Filled by the Kubernetes adapter from watches (``from_json`` helpers below
parse the API objects at the edge); the engine reads it through
``ClusterState.volumes``.  gpufleet does not *bind* volumes: a pod whose claim
is unbound stays pending with a reason naming the claim (see
docs/kubernetes.md for why), and a pod whose claim is bound lands only where
the PersistentVolume's node affinity allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .constraints import ClaimInfo, PersistentVolume
from .errors import InvalidPodSpec
from .model import Node, Requirement, SelectorTerm

# in-tree volume plugins and the CSI drivers they migrated to (node allocatable attachable-volumes-<plugin>)
IN_TREE_DRIVERS = {"aws-ebs": "ebs.csi.aws.com", "gce-pd": "pd.csi.storage.gke.io", "azure-disk": "disk.csi.azure.com",
                   "cinder": "cinder.csi.openstack.org"}
_IN_TREE_SOURCES = {"awsElasticBlockStore": "aws-ebs", "gcePersistentDisk": "gce-pd", "azureDisk": "azure-disk", "cinder": "cinder"}
ZONE_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region",
               "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region")


@dataclass
class VolumeCatalog:
    claims: dict[str, ClaimInfo] = field(default_factory=dict)  # namespace/name
    volumes: dict[str, PersistentVolume] = field(default_factory=dict)  # PV name
    binding_modes: dict[str, str] = field(default_factory=dict)  # StorageClass -> volumeBindingMode
    attach_limits: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> CSI driver -> max volumes

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
        c = self.claims.get(claim_key)
        pv = self.volumes.get(c.volume_name) if c is not None and c.volume_name else None
        return pv.driver if pv is not None else ""


def claim_from_json(obj: Mapping[str, Any]) -> ClaimInfo:
    m = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return ClaimInfo(namespace=m.get("namespace") or "default", name=m.get("name") or "",
                     volume_name=spec.get("volumeName") or "", phase=(obj.get("status") or {}).get("phase") or "Pending",
                     storage_class=spec.get("storageClassName") or "",
                     access_modes=tuple(str(m) for m in spec.get("accessModes") or ()))


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
    return PersistentVolume(name, tuple(terms), driver)


def csinode_limits(obj: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
    """A CSINode's per-driver ``allocatable.count`` (the node's attach limit)."""
    name = (obj.get("metadata") or {}).get("name") or ""
    out: dict[str, int] = {}
    for d in (obj.get("spec") or {}).get("drivers") or []:
        cnt = (d.get("allocatable") or {}).get("count") if isinstance(d, Mapping) else None
        if isinstance(cnt, int) and not isinstance(cnt, bool) and cnt >= 0 and d.get("name"):
            out[d["name"]] = cnt
    return name, out
