"""NodePorts: a pod's hostPorts must be free on the node (port, protocol, hostIP; 0.0.0.0 clashes with any IP)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ._common import passing

NO_FREE_PORTS = "node(s) didn't have free ports for the requested pod ports"


@dataclass
class NodePorts:
    name: str = "NodePorts"
    requeue_on = "room"  # judges each node by itself: a pod leaving helps only where the pod then has room (schedqueue.may_fit_after)

    skip_fields = ("terms",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """The pod asks for no host port."""
        return r.terms is None or not r.terms.host_ports

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        t = cycle.request.terms
        n = len(state)
        if t is None or not t.host_ports or not state.pod_index.ports:
            return passing(n)
        ok = np.ones(n, dtype=bool)
        for hp in t.host_ports:
            for i in state.pod_index.port_conflicts(hp):
                ok[i] = False
        return FilterResult(ok, (NO_FREE_PORTS,))
