"""NodeDeclaredFeatures: a pod that needs a node feature (GA in 1.37) goes only to nodes declaring it.

kubelet lists the features it supports in ``status.declaredFeatures``; kube-scheduler infers from the pod
spec which of them the pod needs (``PodRequest.node_features``: a ``RestartAllContainers`` restart rule,
host network with ``hostUsers: false``, ``bindMountOptions``) and filters out nodes that lack one, so an
older or differently configured kubelet never gets a pod it would run wrongly or refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ._common import MetaCache, passing

NOT_DECLARED = "node(s) didn't match Pod's required features"


@dataclass
class NodeDeclaredFeatures:
    name: str = "NodeDeclaredFeatures"
    _c: MetaCache = field(default_factory=MetaCache)

    skip_fields = ("node_features",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """The pod needs no declared feature."""
        return not r.node_features

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        need = cycle.request.node_features
        if not need:
            return passing(len(state))
        ok = self._c.get((need,), state, lambda: np.array([need <= n.declared_features for n in state.nodes], dtype=bool))
        return FilterResult(ok, (NOT_DECLARED,))
