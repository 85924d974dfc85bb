"""The loop's scheduling queue, as kube-scheduler's: the pods waiting for us, when each may be
tried again, when it was first seen (e2e latency), when it arrived (first-come order) and the last
FailedScheduling words it was told (not repeated).

Like kube-scheduler's queue it has three parts.  A new pod is due at once (its activeQ).  A pod
that failed backs off (``engine.schedqueue.Backoff``: ``backoff_initial_s`` doubling to
``backoff_max_s``); one the engine found no room for is also *parked* (kube-scheduler's
unschedulablePods) in ``engine.pending.PendingGroups``, by decision group, with what kept it out.
What changes in the cluster (``changed``: a pod left a node, or anything: a node, a policy object, a
gang's hold) wakes the parked pods PendingGroups says it may let fit -- the replay's rule, the same
code (kube-scheduler's queueing hints: ``schedqueue.may_fit_after``'s room, count and node kinds) --
and they are tried at the next round, their backoff kept for the next failure.  A pod that failed for
a reason the engine did not give (an API error, an invalid spec, a claim given back) is not parked:
any change wakes it.  A parked pod no change woke is tried again when its backoff runs out, so no pod
waits longer than ``backoff_max_s`` without a try (kube-scheduler's periodic flush of pods left
unschedulable for podMaxInUnschedulablePodsDuration).

First come is by the pod's ``creationTimestamp``, mapped onto the loop's clock, not by when this
process first saw it: after a restart or a relist every pending pod is "seen" at once, and an
order by first sight would fall back to names (``whole-12`` before ``whole-9``, found on the real
node when the scheduler restarted mid-stream).

Why a module of its own: the queue is one responsibility of the loop (see ``loop.py``), with
state no other part writes: the cache adds and removes pods as the watch shows them, the cycle
takes due pods from it, the binder puts a pod back after a failed bind.  Which pod goes first
among the due ones is ``engine.schedqueue.order_pending``'s call (the cycle asks it).
"""

from __future__ import annotations

import time
from typing import Callable

from collections.abc import Collection, Mapping

from ..engine.model import PodRequest
from ..engine.pending import PendingGroups, pod_group
from ..engine.round import SchedulingRound
from ..engine.schedqueue import Backoff, Change
from ..engine.state import ClusterState
from .pods import created_s


class SchedulingQueue:
    """Pending pods (key -> pod JSON) and their timers; runs on the loop's thread."""

    def __init__(self, clock: Callable[[], float], backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0,
                 wall: Callable[[], float] = time.time, hints: Mapping[str, str] | None = None) -> None:
        self.clock = clock
        self.wall = wall  # seconds since the epoch, to read creationTimestamp against
        self.backoff_max_s = backoff_max_s
        self.pending: dict[str, dict] = {}  # key -> pod JSON, waiting for us
        self._timers = Backoff(backoff_initial_s, backoff_max_s)
        self._first_seen: dict[str, float] = {}
        self._arrival: dict[str, float] = {}  # creation time on the loop's clock (first sight without one)
        self._new: dict[str, None] = {}  # pods added since ``take_new`` (in order)
        self._last_failure: dict[str, tuple[str, float]] = {}
        # parked: pods the engine found no room for, by decision group, with what kept them out (hints:
        # schedqueue.requeue_hints of the profile; none known: every plugin's rejection may lift when a pod leaves)
        self.parked = PendingGroups([], hints or {}, group_by=pod_group)
        self._blind: set[str] = set()  # failed for a reason the engine did not give: any change wakes them

    # --- pods in and out ------------------------------------------------------------------
    def add(self, key: str, pod: dict) -> None:
        """A pod waiting for us (new, or a newer version of one); its first-seen time stays."""
        self.pending[key] = pod
        now = self.clock()
        self._first_seen.setdefault(key, now)
        if key not in self._arrival:
            self._new[key] = None
            created = created_s(pod)
            self._arrival[key] = now - max(0.0, self.wall() - created) if created is not None else now

    def put_back(self, key: str, pod: dict) -> None:
        """A pod whose bind failed: pending again, with the timers it had."""
        self.pending[key] = pod

    def remove(self, key: str) -> dict | None:
        """Out of the queue (binding, bound, gone); its timers stay until ``forget``."""
        return self.pending.pop(key, None)

    def clear(self) -> set[str]:
        """Empty the queue for a relist (timers stay); returns the keys that were pending."""
        keys = set(self.pending)
        self.pending.clear()
        return keys

    def forget(self, key: str) -> None:
        """Drop the pod's timers and first-seen time (bound by someone else, gone)."""
        self._last_failure.pop(key, None)
        self._unpark(key)
        self._timers.forget(key)
        self._first_seen.pop(key, None)
        self._arrival.pop(key, None)
        self._new.pop(key, None)

    def scheduled(self, key: str, default: float) -> float:
        """Our bind of the pod succeeded: drop its timers; returns when it was first seen (``default`` if unknown)."""
        self._timers.forget(key)
        self._last_failure.pop(key, None)
        if (i := self.parked.by_key.get(key)) is not None:
            self.parked.placed(i)  # its group is not kept out by a count any more
        self._unpark(key)
        self._arrival.pop(key, None)
        return self._first_seen.pop(key, default)

    def take_new(self) -> list[str]:
        """The pods that joined the queue since the last call (for the plugins that learn the workload)."""
        keys = list(self._new)
        self._new.clear()
        return keys

    # --- timers ---------------------------------------------------------------------------
    def first_seen(self, key: str, default: float = 0.0) -> float:
        return self._first_seen.get(key, default)

    def arrival(self, key: str, default: float = 0.0) -> float:
        """When the pod was created, on the loop's clock: its place in first-come order."""
        return self._arrival.get(key, default)

    def waited_s(self, key: str, now: float) -> float:
        """How long the pod has waited since it was created (0 for a pod the queue does not know)."""
        return now - self._arrival.get(key, now)

    def defer(self, key: str, until: float | None = None,
              rejected: tuple[PodRequest, Collection[str]] | None = None) -> None:
        """Back off exponentially; ``until``: retry no later than this (e.g. when a hold times out);
        ``rejected``: the pod's request and the plugins that kept it out: parked until a change may let it fit
        (None: unknown, any change wakes it)."""
        now = self.clock()
        t = self._timers.defer(key, now)
        if until is not None:
            self._timers.not_before[key] = min(t, max(until, now))
        if rejected is None:
            self._unpark(key)
            self._blind.add(key)
        else:
            self._blind.discard(key)
            i = self.parked.register(rejected[0])
            self.parked.failed(i, self._arrival.get(key, now), rejected[1])

    def _unpark(self, key: str) -> None:
        self._blind.discard(key)
        if (i := self.parked.by_key.get(key)) is not None:
            self.parked.unregister(i)

    def wake_all(self) -> None:
        """The cluster changed: every waiting pod may fit now."""
        self.changed(Change(anything=True))

    def changed(self, change: Change, state: ClusterState | None = None, rnd: SchedulingRound | None = None) -> None:
        """``change`` happened (on ``state``'s nodes): wake the waiting pods it may let fit
        (``PendingGroups.woken``; with the scheduling round, less those their queueing hints keep asleep), and those
        nothing is known of; the others keep backing off."""
        if change.anything or state is None:
            self._timers.wake_all()
            return
        self.parked.freed.update(change.freed_nodes)
        reqs, pending = self.parked.reqs, self.pending
        now = self.clock()
        keys = [k for i in self.parked.woken(state, rnd, lambda i: self.waited_s(reqs[i].key, now))
                if (k := reqs[i].key) in pending]
        self._timers.wake(keys + [k for k in self._blind if k in pending])

    def ready(self, now: float) -> list[tuple[str, dict]]:
        """Pending pods not backing off at ``now``, in insertion order."""
        nb = self._timers.not_before
        return [(k, p) for k, p in self.pending.items() if nb.get(k, 0.0) <= now]

    def has_due(self) -> bool:
        now = self.clock()
        nb = self._timers.not_before
        return any(nb.get(k, 0.0) <= now for k in self.pending)

    def wakeups(self) -> list[float]:
        """When each pending pod may be tried next (0.0: now)."""
        nb = self._timers.not_before
        return [nb.get(k, 0.0) for k in self.pending]

    def should_report(self, key: str, message: str) -> bool:
        """Tell the pod this FailedScheduling message?  Not the same words again within ``backoff_max_s``."""
        now = self.clock()
        last = self._last_failure.get(key)
        if last is not None and last[0] == message and now - last[1] < self.backoff_max_s:
            return False
        self._last_failure[key] = (message, now)
        return True
