"""``QueueQuota`` (PreFilter + Reserve): team-queue admission by quota and borrowing (``engine.queues``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..framework import Cycle
from ..queues import PLUGIN, QueueTree, add_vector, request_vector
from ..state import ClusterState
from ..status import Status

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Registry


@dataclass
class QueueQuota:
    """PreFilter + Reserve: admission by queue quota (+ borrowing).

    PreFilter decides from the request (fast, early, with a reason); Reserve checks
    again with the devices actually chosen, so a whole GPU's memory counts exactly.
    Without a tree (built from config before the queues are known) it admits everything.
    """

    tree: QueueTree | None = None
    name: str = PLUGIN

    def pre_filter(self, cycle: Cycle, state: ClusterState) -> Status:
        if self.tree is None:
            return Status.success()
        return self.tree.admit(cycle.request)

    def reserve(self, cycle: Cycle, state: ClusterState) -> Status:
        t = self.tree
        a = cycle.assignment
        if t is None or a is None or not a.queue:
            return Status.success()
        use = t.usage()  # already counts the reserved pod: take it out again
        v = request_vector(state.assignments.get(a.pod_key, a))
        if a.pod_key in state.assignments and a.queue in t.queues:
            for n in t.path(a.queue):
                add_vector(use[n], v, -1)
        return t.check(a.queue, v, use)

    def unreserve(self, cycle: Cycle, state: ClusterState) -> None:
        return None


def register(registry: "Registry") -> None:
    """Make ``QueueQuota`` known to profile configs (preFilter and reserve)."""
    registry.register(PLUGIN, QueueQuota)
