"""Extended resources backed by DRA (KEP-5004, GA in 1.37): ``nvidia.com/gpu: 1`` on a node where no device
plugin advertises it is served by a ResourceClaim of the DeviceClass whose ``spec.extendedResourceName`` names it
(or ``deviceclass.resource.kubernetes.io/<class>`` for any class).

Why per node: kube-scheduler decides it node by node.  Where the node's allocatable has the resource, the device
plugin serves it and nothing changes; where it has none and a class maps the name, the scheduler allocates a
claim (one request per container, ``container-<i>-request-<j>``) and writes it before the bind, with the pod's
``status.extendedResourceClaimStatus`` naming the claim and which container's resource each request serves.
gpufleet models it the same way: ``ExtendedClaim`` is that claim (built by the adapter from the pod and the
classes), ``dra_way`` says on which nodes it applies; the pod's GPU fields keep describing ``nvidia.com/gpu`` for
the device-plugin nodes and for scoring.

Supported: every resource a class maps, served by DRA on nodes whose allocatable lacks all of the pod's mapped
resources and by device plugins on nodes that have all of them; a node that has some of them only is left out
for such a pod (its reason says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .objects import ResourceClaim

if TYPE_CHECKING:
    from ..state import ClusterState

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class ExtendedClaim:
    """The claim a pod's DRA-backed extended resources need on a node without them (not created yet, or created
    by an earlier attempt: ``claim.uid`` set), and what the pod's status will say about it."""

    claim: ResourceClaim
    resources: tuple[tuple[str, int], ...]  # (extended resource name, pod-level amount)
    mappings: tuple[tuple[str, str, str], ...]  # (container, resource, request) for status.extendedResourceClaimStatus
    stale: bool = False  # created by an earlier attempt that did not bind: to be deleted first (kube-scheduler's PostFilter)

    @property
    def key(self) -> str:
        return self.claim.key


def dra_way(state: "ClusterState", ext: ExtendedClaim) -> tuple[np.ndarray, np.ndarray]:
    """(nodes where the pod's extended resources come from DRA, nodes that have some of them from a device plugin
    and lack others): per node, from allocatable (``nvidia.com/gpu``: kubelet's device count; unknown counts as a
    device plugin)."""
    n = len(state)
    has = np.zeros((len(ext.resources), n), dtype=bool)
    for i, (name, _) in enumerate(ext.resources):
        if name == GPU_RESOURCE:
            has[i] = state.gpu_dev_cap != 0
        else:
            cap = state.scalar_cap.get(name)
            has[i] = cap > 0 if cap is not None else False
    if not ext.resources:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    anyv = np.asarray(has.any(axis=0), dtype=bool)
    allv = np.asarray(has.all(axis=0), dtype=bool)
    return ~anyv, anyv & ~allv


__all__ = ["ExtendedClaim", "GPU_RESOURCE", "dra_way"]
