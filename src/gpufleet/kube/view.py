"""``ClusterView``: the cache as the loop's other parts read it (``cache.SchedulerCache`` implements it).

Why a Protocol of its own: the binder, volume binding and preemption need the snapshot and the objects it
was built from, and ``cache.py`` imports none of them; they depend on this small view, not on the cache's
module, and a relist that replaces the snapshot reaches them because they look it up each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..engine.disruption import Budgets
    from ..engine.framework import Scheduler
    from ..engine.queues import QueueTree
    from ..engine.state import ClusterState
    from .policy_objects import PolicyObjects


class ClusterView(Protocol):
    """What the cache shows the loop's other parts: the snapshot (rebuilt on a relist: read it
    through this view each time, never keep it) and the objects it was built from; and the two
    writes a bind result makes (the pod held as bound, its resources reserved)."""

    @property
    def state(self) -> ClusterState: ...
    @property
    def sched(self) -> Scheduler: ...
    @property
    def tree(self) -> QueueTree | None: ...
    @property
    def objects(self) -> PolicyObjects: ...
    @property
    def bound_pods(self) -> Mapping[str, dict]: ...

    def add_bound(self, key: str, pod: dict) -> dict:
        """Hold a pod seen bound (unless the watch already showed it); returns what is held."""
        ...

    def reserve_bound(self, key: str, pod: dict) -> None:
        """Hold a bound pod's resources in the snapshot (unless they clash with what it holds)."""
        ...

    def budgets(self) -> Budgets:
        """The PodDisruptionBudgets with the facts about the bound pods they may cover."""
        ...

    def age_rank(self) -> dict[str, int]:
        """Larger = younger (started later, see ``pod_age_key``), so the youngest go first."""
        ...
