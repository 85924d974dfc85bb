"""VolumeBinding and NodeVolumeLimits over the state's ``VolumeCatalog``.

VolumeBinding: every claim the pod mounts must exist; a bound one's
PersistentVolume must be usable on the node (required node affinity, zone
labels: VolumeZone); an unbound WaitForFirstConsumer one needs an available
matching PV usable on the node or a provisioner allowed there (the adapter
binds it, see ``engine/volumes.py``); an unbound Immediate one waits for the
PV controller.  A ReadWriteOncePod claim already in use by a pod keeps others
off every node (VolumeRestrictions).
NodeVolumeLimits: where a node reports an attach limit for a driver (its
CSINode's ``allocatable.count``, else ``attachable-volumes-csi-<driver>`` or
an in-tree ``attachable-volumes-aws-ebs`` / ``-gce-pd`` / ``-azure-disk`` /
``-cinder`` in its allocatable, mapped to the CSI driver it migrated to), the
distinct claims of that driver on the node plus the pod's new ones must stay
within it (an unbound claim counts for its StorageClass's provisioner); and a CSIDriver with
``preventPodSchedulingIfMissing`` keeps the pod off nodes whose CSINode does not list it
(VolumeLimitScaling, beta in 1.37).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constraints import ClaimInfo
from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ..volumes import VolumeCatalog, matches_node, provisionable_on
from ._common import passing
from ._common import term_matches

VOLUME_AFFINITY = "node(s) had volume node affinity conflict"
NO_PV_TO_BIND = "node(s) didn't find available persistent volumes to bind"
RWOP_IN_USE = "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
MAX_VOLUMES = "node(s) exceed max volume count"
NOT_INSTALLED = "{driver} CSI driver is not installed on the node"


@dataclass
class VolumeBinding:
    name: str = "VolumeBinding"

    skip_fields = ("terms",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """The pod uses no PersistentVolumeClaim."""
        return r.terms is None or not r.terms.claims

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        t = cycle.request.terms
        n = len(state)
        if t is None or not t.claims:
            return passing(n)
        cat = state.volumes
        none = np.zeros(n, dtype=bool)
        if cat is None:
            return FilterResult(none, ("volumes are not known to this scheduler (PersistentVolumeClaims not watched)",))
        ok = np.ones(n, dtype=bool)
        bind_ok = np.ones(n, dtype=bool)
        for c in t.claims:
            claim = cat.claims.get(f"{t.namespace}/{c}")
            if claim is None:
                return FilterResult(none, (f'persistentvolumeclaim "{c}" not found',))
            if not claim.volume_name:
                mode = cat.binding_mode(claim.storage_class)
                if mode != "WaitForFirstConsumer":  # kube-scheduler's words; the PV controller binds it, then the pod is retried
                    return FilterResult(none, (f'pod has unbound immediate PersistentVolumeClaims (persistentvolumeclaim "{c}")',))
                bind_ok &= self._bindable(state, cat, claim)
                continue
            if "ReadWriteOncePod" in claim.access_modes and state.pod_index.claims.get(f"{t.namespace}/{c}"):
                return FilterResult(none, (RWOP_IN_USE,))  # one pod in the whole cluster may use it
            pv = cat.volumes.get(claim.volume_name)
            if pv is None:
                return FilterResult(none, (f'persistentvolume "{claim.volume_name}" (bound to claim "{c}") not found',))
            if pv.node_affinity:
                ok &= self._mask(state, pv.node_affinity)
        return FilterResult(ok & bind_ok, (VOLUME_AFFINITY, NO_PV_TO_BIND), np.where(ok, 1, 0))

    @staticmethod
    def _bindable(state: ClusterState, cat: VolumeCatalog, claim: ClaimInfo) -> np.ndarray:
        """Nodes where an unbound WaitForFirstConsumer claim could get a volume: a matching PV usable there, or provisioning."""
        pvs = cat.candidates(claim)
        return np.array([any(matches_node(v.node_affinity, n) for v in pvs) or provisionable_on(cat, claim, n)
                         for n in state.nodes], dtype=bool)

    @staticmethod
    def _mask(state: ClusterState, terms: tuple) -> np.ndarray:
        return np.array([any(term_matches(x, n.labels, n.name) for x in terms) for n in state.nodes], dtype=bool)


@dataclass
class NodeVolumeLimits:
    name: str = "NodeVolumeLimits"
    requeue_on = "room"  # judges each node by itself: a pod leaving helps only where the pod then has room (schedqueue.may_fit_after)

    skip_fields = ("terms",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """The pod uses no PersistentVolumeClaim."""
        return r.terms is None or not r.terms.claims

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        t = cycle.request.terms
        n = len(state)
        cat = state.volumes
        if t is None or not t.claims or cat is None:
            return passing(n)
        new_by_driver: dict[str, set[str]] = {}
        for c in t.claims:
            key = f"{t.namespace}/{c}"
            d = cat.driver_of(key)
            if d:
                new_by_driver.setdefault(d, set()).add(key)
        ok = np.ones(n, dtype=bool)
        if not new_by_driver:
            return FilterResult(ok, (MAX_VOLUMES,))
        reasons = [MAX_VOLUMES]
        codes = np.zeros(n, dtype=np.int64)
        used = state.pod_index.claims
        for i, node in enumerate(state.nodes):
            # VolumeLimitScaling (beta, on in 1.37): a driver that asks for it must be installed on the node
            missing = sorted(d for d in new_by_driver if d in cat.required_drivers and d not in cat.node_drivers.get(node.name, ()))
            if missing:
                why = NOT_INSTALLED.format(driver=missing[0])
                if why not in reasons:
                    reasons.append(why)
                ok[i], codes[i] = False, reasons.index(why)
                continue
            limits = cat.limits_of(node) if cat.attach_limits or node.scalars else {}
            for d, new in new_by_driver.items():
                if d not in limits:
                    continue
                on_node = {k for k, nodes in used.items() if i in nodes and cat.driver_of(k) == d}
                if len(on_node | new) > limits[d]:
                    ok[i] = False
        return FilterResult(ok, tuple(reasons), codes)
