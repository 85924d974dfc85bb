"""Per-node limits the engine has no plugin for yet, for trace replays: an extended resource
with a per-node capacity (the 2025 trace's RDMA bandwidth share) and a cap on instances of one
app per node (its ``max_instance_per_node``).

Why here and not in the engine: these come with one trace; the engine's general extended-resource
and spread plugins are another issue's work.  This is a Filter + Reserve plugin with its own
per-node counters; the replay calls ``release`` when a pod leaves (``Scheduler.forget`` does not
run Reserve plugins).  Each pod's needs come from the workload's ``extras``:
``{"rdma": percent, "app": name, "max_per_app": n (-1: no limit)}``; each node's RDMA capacity
from its ``gpufleet.io/rdma-capacity`` label (percent of one RNIC times RNICs; absent: no limit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...engine.framework import Cycle, FilterResult
from ...engine.model import Node
from ...engine.state import ClusterState
from ...engine.status import Status

RDMA_CAPACITY_LABEL = "gpufleet.io/rdma-capacity"


@dataclass
class NodeLimits:
    rdma_capacity: np.ndarray  # per node; inf: no limit
    need: dict[str, tuple[float, str, int]]  # pod key -> (rdma, app, max per node)
    name: str = "NodeLimits"
    requeue_on = "room"  # judges each node by itself: a pod leaving helps only where the pod then has room (schedqueue.may_fit_after)
    rdma_used: np.ndarray = field(default_factory=lambda: np.zeros(0))
    per_app: dict[str, np.ndarray] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=dict)  # pod key -> node index

    @classmethod
    def for_workload(cls, nodes: Sequence[Node], extras: Sequence[Mapping[str, object]]) -> NodeLimits:
        cap = np.array([float(n.labels.get(RDMA_CAPACITY_LABEL, "inf")) for n in nodes])
        lim = cls(cap, {})
        lim.rdma_used = np.zeros(len(nodes))
        return lim

    def bind_keys(self, keys: Sequence[str], extras: Sequence[Mapping[str, object]]) -> None:
        for k, e in zip(keys, extras):
            if e:
                self.need[k] = (float(str(e.get("rdma", 0) or 0)), str(e.get("app", "")), int(str(e.get("max_per_app", -1) or -1)))

    def _counts(self, app: str) -> np.ndarray:
        c = self.per_app.get(app)
        if c is None:
            c = self.per_app[app] = np.zeros(len(self.rdma_capacity), dtype=np.int64)
        return c

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        n = self.need.get(cycle.request.key)
        if n is None:
            return FilterResult(np.ones(len(state), dtype=bool))
        rdma, app, mx = n
        ok_rdma = self.rdma_used + rdma <= self.rdma_capacity + 1e-9
        ok = ok_rdma.copy()
        codes = np.zeros(len(state), dtype=np.int64)
        if mx > 0 and app:
            ok_app = self._counts(app) < mx
            codes[ok_rdma & ~ok_app] = 1
            ok &= ok_app
        return FilterResult(ok, ("Insufficient rdma", f"node(s) already run {mx} instance(s) of app {app}"), codes)

    def reserve(self, cycle: Cycle, state: ClusterState) -> Status:
        a = cycle.assignment
        if a is None or a.pod_key not in self.need:
            return Status.success()
        i = state.index[a.node]
        rdma, app, _ = self.need[a.pod_key]
        self.rdma_used[i] += rdma
        if app:
            self._counts(app)[i] += 1
        self.placed[a.pod_key] = i
        return Status.success()

    def unreserve(self, cycle: Cycle, state: ClusterState) -> None:
        if cycle.assignment is not None:
            self.release(cycle.assignment.pod_key)

    def release(self, pod_key: str) -> None:
        i = self.placed.pop(pod_key, None)
        if i is None:
            return
        rdma, app, _ = self.need[pod_key]
        self.rdma_used[i] -= rdma
        if app:
            self._counts(app)[i] -= 1


__all__ = ["RDMA_CAPACITY_LABEL", "NodeLimits"]
