"""The scheduling queue's policy: which pending pod is tried next, when a failed one is tried
again, and how room is made for a pod that does not fit.

Why a module of its own: the live loop (``kube/loop.py``) and the trace replay
(``simulator/replay.py``) must order pods the same way, back off the same way
and pick the same reclaim/preemption victims, or the replay would not predict
the live scheduler.  Both call these pure functions; neither re-implements
them.  No I/O here: callers pass what they know (priorities, first-seen times,
requests, disruption budgets) and act on the answer (bind, delete, re-queue).

Order (kube-scheduler's activeQ, plus team queues):
  1. pods that had victims deleted for them (they own the room just made);
  2. with queues: hierarchical weighted-DRF across queues (``QueueTree.order``),
     within a queue higher priority first, then first come;
  3. without queues: higher priority first, then first seen, then key.
Backoff: a pod that failed waits 2x its last backoff (``initial_s`` .. ``max_s``)
unless the cluster changes (a pod leaves, a node changes), which wakes every pod.
Gang members are not in this order: they go through ``GangScheduler`` in one
round after the single pods, or before them when a gang had victims deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .model import Assignment, PodRequest
from .preemption import find_victims

if TYPE_CHECKING:  # pragma: no cover
    from .framework import Scheduler
    from .queues import QueueTree

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedPod:
    """A pending pod as the queue sees it; ``request`` None: its spec is invalid (tried first, to be reported)."""

    key: str
    priority: int = 0
    first_seen: float = 0.0
    request: PodRequest | None = None


def sort_key(p: QueuedPod, nominated: Collection[str] = ()) -> tuple[bool, int, float, str]:
    """The order without queues: nominated first, then higher priority, then first seen, then key."""
    return (p.key not in nominated, -p.priority, p.first_seen, p.key)


def order_pending(pods: Sequence[QueuedPod], tree: QueueTree | None = None,
                  nominated: Collection[str] = ()) -> list[str]:
    """Keys of the pods in the order they are tried (see the module docstring)."""
    ps = sorted(pods, key=lambda p: sort_key(p)[1:])
    keys = [p.key for p in ps]
    if tree is not None and len(ps) > 1:
        rest = [p.key for p in ps if p.request is None]
        reqs = [p.request for p in ps if p.request is not None]
        try:
            keys = rest + [r.key for r in tree.order(reqs)]
        except Exception:  # an ordering bug must not stop scheduling: keep priority order
            log.exception("fair-share order failed; using priority order")
    if nominated:
        keys.sort(key=lambda k: k not in nominated)  # stable: keeps the order within each part
    return keys


def next_backoff_s(previous_s: float | None, initial_s: float, max_s: float) -> float:
    """The next backoff of a pod that failed again: ``initial_s``, then doubling up to ``max_s``."""
    return min(max_s, (initial_s / 2 if previous_s is None else previous_s) * 2)


@dataclass
class Backoff:
    """Per-pod backoff timers (the simulator's copy of the loop's ``_backoff``/``_not_before``)."""

    initial_s: float = 1.0
    max_s: float = 60.0
    backoff: dict[str, float] = field(default_factory=dict)
    not_before: dict[str, float] = field(default_factory=dict)

    def defer(self, key: str, now: float) -> float:
        b = self.backoff[key] = next_backoff_s(self.backoff.get(key), self.initial_s, self.max_s)
        self.not_before[key] = now + b
        return now + b

    def ready(self, key: str, now: float) -> bool:
        return self.not_before.get(key, 0.0) <= now

    def wake_all(self) -> None:
        """The cluster changed: every waiting pod may fit now."""
        self.not_before.clear()

    def forget(self, key: str) -> None:
        self.backoff.pop(key, None)
        self.not_before.pop(key, None)


@dataclass
class RoomPlan:
    """Victims whose deletion lets a pod fit: ``kind`` is ``reclaimed`` (quota its queue lent out)
    or ``preempted`` (lower priority); ``node`` is the nominated node for preemption.

    ``kind`` ``held``: no victims; the pod fits in room a plugin holds for pods not yet here (the
    default policy's CPU reserve) on ``node``, and the caller places it there
    (``Scheduler.schedule(take_held=True)``) rather than evict anyone for it."""

    kind: str
    victims: list[Assignment]
    explanation: list[str]
    reason: str
    node: str | None = None


def plan_room(sched: Scheduler, tree: QueueTree | None, req: PodRequest,
              preemption_args: Callable[[], Mapping[str, Any]] | None = None,
              exclude: AbstractSet[str] = frozenset()) -> RoomPlan | None:
    """Reclaim lent quota first, else preempt lower-priority pods; a dry run (changes nothing).

    ``preemption_args`` gives ``find_victims``'s keyword arguments (``budgets``, ``age_rank``,
    candidate bounds); reclaim reads its ``budgets`` and ``age_rank`` too, so both choose victims
    by the same age and keep the same PodDisruptionBudgets.  It is called at most once, and only
    when reclaim or preemption gets as far as choosing victims.
    ``exclude``: pods that are never victims (already on their way out, held by a gang).

    Held room goes before running pods: a pod that could reclaim or preempt but also fits in room a
    plugin holds for pods not yet here (the default's CPU reserve) gets a ``held`` plan, and nobody is
    evicted.  The dry runs let it take held room as well (``take_held``), and so must the caller when
    it places the pod after its victims are gone."""
    memo: list[Mapping[str, Any]] = []

    def args() -> Mapping[str, Any]:  # computed once, only when reclaim or preemption gets that far
        if not memo:
            memo.append(preemption_args() if preemption_args else {})
        return memo[0]

    reclaim = tree.plan_reclaim(sched, req, exclude=exclude, victim_args=args) if tree is not None else None
    may_preempt = not req.preempt_never and any(a.priority < req.priority for a in sched.state.assignments.values())
    node = held_room_node(sched, req) if reclaim is not None or may_preempt else None
    if node is not None:
        return RoomPlan("held", [], [f"{req.key} (priority {req.priority}) takes room held for pods not yet here "
                                     f"on {node} rather than evict anyone"],
                        f"{req.key} placed in held room, nobody evicted", node)
    if reclaim is not None:
        return RoomPlan("reclaimed", reclaim.victims, reclaim.explanation,
                        f"reclaimed: queue {req.queue} needs its quota back for {req.key}")
    if may_preempt:
        plan = find_victims(sched, req, exclude=exclude, **args())
        if plan is not None:
            return RoomPlan("preempted", plan.victims, plan.explanation,
                            f"preempted by {req.key} (priority {req.priority}) on {plan.node}", plan.node)
    return None


def held_room_node(sched: Scheduler, req: PodRequest) -> str | None:
    """The node a pod would go to if it may take room plugins hold for pods not yet here; a dry run."""
    cycle = sched.new_cycle(req, take_held=True)
    return cycle.assignment.node if sched.decide(cycle).ok and cycle.assignment is not None else None


__all__ = ["Backoff", "QueuedPod", "RoomPlan", "held_room_node", "next_backoff_s", "order_pending", "plan_room", "sort_key"]
