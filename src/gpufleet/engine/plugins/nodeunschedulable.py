"""NodeUnschedulable: a cordoned node takes only pods that tolerate its unschedulable taint (kube-scheduler's plugin)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import PodRequest, Taint
from ..state import ClusterState
from ._common import MetaCache, passing


_UNSCHEDULABLE = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


@dataclass
class NodeUnschedulable:
    name: str = "NodeUnschedulable"
    requeue_on = "nodes"  # judges what only node changes change: a pod leaving never helps (schedqueue.may_fit_after)
    _c: MetaCache = field(default_factory=MetaCache)

    skip_fields = ("tolerations",)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        return self._cached(cycle.request, state)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No node cordoned against this pod (the framework then does not run the filter)."""
        return self._cached(r, state).passes_all

    def _cached(self, r: PodRequest, state: ClusterState) -> FilterResult:
        tols = r.tolerations
        tolerated = bool(tols) and any(t.tolerates(_UNSCHEDULABLE) for t in tols)
        # the verdict itself is kept per epoch (it reads node metadata only): no new result per cycle
        return self._c.get((tolerated, "result"), state, lambda: self._verdict(state, tolerated))

    def _verdict(self, state: ClusterState, tolerated: bool) -> FilterResult:
        ok = np.array([tolerated or not n.unschedulable for n in state.nodes], dtype=bool)
        if ok.all():
            return passing(len(state))
        return FilterResult(ok, ("node(s) were unschedulable",))
