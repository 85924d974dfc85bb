"""The scheduling queue's policy: which pending pod is tried next, when a failed one is tried
again, and how room is made for a pod that does not fit.

Why a module of its own: the live loop (``kube/loop.py``) and the trace replay
(``simulator/experiments/replay.py``) must order pods the same way, back off the same way
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
unless the cluster changes in a way that may let it fit (``may_fit_after``, kube-scheduler's
queueing hints): a pod leaving node X wakes a pod that only plugins judging each node by itself
kept out (resources, ports, the default policy's reserves) only if it could fit on X; a pod kept
out by a cluster-wide count (queue quota, topology spread, anti-affinity) wakes whenever a pod
leaves; a node added or changed, or a policy object, wakes every pod.  Plugins say which of these
they are (their ``requeue_on``: ``room``, ``pods`` or ``nodes``; unnamed: ``pods``).
Gang members are not in this order: they go through ``GangScheduler`` in one
round after the single pods, or before them when a gang had victims deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .framework import NOMINATED_ROOM
from .model import GPU_MILLI, Assignment, PodRequest
from .preemption import find_victims

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .framework import Profile, Scheduler
    from .queues import QueueTree
    from .state import ClusterState

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

    def wake(self, keys: Iterable[str]) -> None:
        """These pods may fit now (``may_fit_after``): tried at the next round, their backoff kept."""
        for k in keys:
            self.not_before.pop(k, None)

    def forget(self, key: str) -> None:
        self.backoff.pop(key, None)
        self.not_before.pop(key, None)


# --- wake-ups by what changed (queueing hints) ---------------------------------------------------

ROOM, PODS, NODES = "room", "pods", "nodes"  # what may lift a plugin's rejection (its ``requeue_on``)
COULD_FIT = "CouldFit"  # a shell's cheap screen (no node has the room at all): a ``room`` rejection


@dataclass(frozen=True)
class Change:
    """What changed since pending pods last failed: ``freed_nodes`` (indices) gained room because pods
    left them (deleted, finished, evicted); ``anything``: a node was added or changed, a policy object,
    a gang's hold -- every pending pod may fit now."""

    freed_nodes: tuple[int, ...] = ()
    anything: bool = False


EVERYTHING = Change(anything=True)


def requeue_hints(profile: Profile) -> dict[str, str]:
    """Plugin name -> what may lift its rejection (``ROOM``, ``PODS``, ``NODES``), from each plugin's
    ``requeue_on``; plugins that do not say are ``PODS`` (woken whenever a pod leaves)."""
    out = {COULD_FIT: ROOM, NOMINATED_ROOM: ROOM}  # room kept for a nominated pod: more room on its node may do
    plugins: list[Any] = [*profile.pre_filters, *profile.filters, *profile.reserves, profile.gpu_selector]
    for p in plugins:
        if p is not None:
            out.setdefault(p.name, getattr(p, "requeue_on", PODS))
    return out


class QueueingHint(Protocol):
    """A plugin's queueing hint (kube-scheduler's QueueingHintFn, for the one event a replay retries on: pods left
    nodes): of ``rows`` (node indices), [rows] covering every one where its filter passes ``request`` now, in a
    cycle with no held room (more is allowed, never less); None: it may pass on any of them.

    Exact, not a guess: a pod is left asleep only when no node has its room (``room_need``) and passes every hint
    asked, and then no node passes its cycle; a pod woken goes through the whole cycle as before.  A plugin gives
    one (a method ``may_pass``) when the room test does not capture its rule (a rule that is cluster-wide, or on
    more than the room need); the room test stands for the others (NodeResourcesFit, GpuFit: their rules on a
    node need its room)."""

    def __call__(self, request: PodRequest, state: ClusterState, waited_s: float, rows: np.ndarray) -> np.ndarray | None: ...


def queueing_hints(profile: Profile) -> dict[str, QueueingHint]:
    """Filter plugin name -> its queueing hint (``QueueingHint``), for the filters that give one (``may_pass``)."""
    out: dict[str, QueueingHint] = {}
    for p in [*profile.filters]:
        hint = getattr(p, "may_pass", None)
        if callable(hint):
            out.setdefault(p.name, hint)
    return out


def room_only(rejected_by: Collection[str], hints: Mapping[str, str]) -> bool:
    """Can a pod leaving lift these rejections only on a node where the pod then has room?  (Every
    rejecting plugin judges each node by itself, or by what pods never change.)  False when unknown."""
    return bool(rejected_by) and all(hints.get(p, PODS) in (ROOM, NODES) for p in rejected_by)


def room_need(r: PodRequest) -> tuple[int, int, int, int]:
    """What a node must have free for the pod to fit at all: (CPU milli, memory MiB, GPUs, milli on each);
    a MIG pod's slices are not counted (their profile decides)."""
    return r.cpu_milli, r.memory_mib, (r.gpu_count if r.mig_profile is None else 0), min(r.gpu_milli, GPU_MILLI)


def room_on(state: ClusterState, need: tuple[int, int, int, int], nodes: Iterable[int]) -> bool:
    """Could a pod with ``room_need`` ``need`` fit on one of ``nodes`` by its resources (a necessary condition)?"""
    c, m, gc, gm = need
    cpu, mem, gpu = state.cpu_free, state.mem_free, state.gpu_free_milli
    for d in nodes:  # (Python ints by .item and tolist: numpy scalars compare slower)
        if cpu.item(d) >= c and mem.item(d) >= m and (gc == 0 or len([f for f in gpu[d].tolist() if f >= gm]) >= gc):
            return True
    return False


def may_fit_after(change: Change, state: ClusterState, request: PodRequest, rejected_by: Collection[str],
                  hints: Mapping[str, str]) -> bool:
    """Is a pod kept out by ``rejected_by`` worth trying again after ``change``?  (kube-scheduler's
    queueing hints: skipping it changes no outcome, only saves a cycle; its backoff still runs out.)"""
    if change.anything or not rejected_by:
        return True
    if not change.freed_nodes:
        return False
    kinds = {hints.get(p, PODS) for p in rejected_by}
    if PODS in kinds:
        return True
    return ROOM in kinds and room_on(state, room_need(request), change.freed_nodes)


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


__all__ = ["Backoff", "COULD_FIT", "Change", "EVERYTHING", "NODES", "PODS", "QueuedPod", "QueueingHint", "ROOM", "RoomPlan", "held_room_node",
           "may_fit_after", "next_backoff_s", "order_pending", "plan_room", "queueing_hints", "requeue_hints", "room_need", "room_on",
           "room_only", "sort_key"]
