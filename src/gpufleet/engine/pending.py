"""Pending pods by decision group, woken by what changed, and tried again in the queue's order.

Why: which waiting pods are worth another cycle after a change, and in which order they get it, is a
scheduling decision, not the trace replay's bookkeeping; it was the replay's own code (``retry``,
``retry_queues`` and the wake-up sets in ``simulator/experiments/replay.py``).  Here it is pure and
beside the round (``engine.round.SchedulingRound``), whose ``try_pod`` each retry goes through.

Pods of one (queue, shape, labels, priority) get the same answer from the scheduler against the same
cluster (a *decision group*), so they are kept in one list in the shared queue order
(``schedqueue.sort_key``) and a pass tries a group's head and moves on when it fails: resources only
shrink while a pass places pods.  What changed since the last pass decides which groups are tried
(``schedqueue.may_fit_after``, kube-scheduler's queueing hints, for every group at once):

* ``freed``: nodes that gained room (a pod left or was evicted): groups that could fit on one of them;
* ``kept_out``: groups last kept out by a cluster-wide count (queue quota, spread): every pass;
* ``fresh``: groups with a pod back in the queue (a victim, as its controller's new pod): never tried
  against this cluster yet;
* with preemption, a group whose head could evict lower-priority pods and may plan now (the port's
  rationing): the room that came may complete a plan.

A group that is tried but has no node with room for its head (``room_on``) is passed over without a
cycle when a try could only make it wait (``SchedulingRound.only_waits``): no gang hold to look past,
no room it may plan now.  Skipping changes no outcome, only saves the call.

A group with room on a freed node whose head was last turned away by a plugin that gives a queueing hint
(``schedqueue.QueueingHint``: the default's whole-GPU reserve, whose scarcity is cluster-wide) is asked
that plugin first, as kube-scheduler asks only the plugins that rejected a pod (``asleep``): when no node
has the head's room and passes every hint asked, no node passes its cycle, and a try whose cycle fails
would only tell it to wait (``SchedulingRound.fails_quietly``) with reasons that keep it out by room
alone: it sleeps on, and every outcome is the same (tested: a replay with and without the hints).

With team queues the candidates (the first pods of each due group) go through ``order_pending``
(hierarchical weighted DRF), as the live loop's due pods do; passes repeat while a group had all its
candidates placed, and within a pass a group makes room once.

The live loop's queue (``kube.scheduling_queue``) parks the pods the engine found no room for here too
(kube-scheduler's unschedulablePods): its pods come and go (``register``, ``unregister``; a pod from the
API is a group by itself, ``pod_group``), and a change wakes the pods ``woken`` names -- the
groups a pass of ``retry`` would try -- while the queue keeps its per-pod backoff and events.

No I/O: the shell says what changed and carries out the round's decisions through its ports.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .model import PodRequest
from .queues import request_vector
from .round import Attempt, RoomFor, SchedulingRound
from .schedqueue import NODES, PODS, ROOM, QueuedPod, QueueingHint, order_pending, queueing_hints, room_need, room_on, room_only
from .state import ClusterState

PER_GROUP = 8  # with team queues: a group's candidates per pass


def trace_group(r: PodRequest) -> Hashable:
    """A trace pod's decision group: what the scheduler's answer depends on for pods with no terms of their own."""
    return r.queue, r.shape(), r.labels, r.priority


def pod_group(r: PodRequest) -> Hashable:
    """A live pod's decision group: pods asking the very same (name and uid aside).  A pod with terms (labels,
    affinity, spread, ports, volumes; ``parse_pod`` gives every pod from the API its terms) or resource claims
    is a group by itself: what decides for it is not all in the request's fields."""
    if r.terms is not None or r.dra is not None:
        return r.key
    return replace(r, name="", uid="")


class PendingGroups:
    """Pending pods (by index into ``reqs``) per decision group, each group's list in queue order, and what
    changed since the last pass (``freed``, ``kept_out``, ``fresh``; see the module docstring)."""

    by_key: dict[str, int]  # pod key -> index
    group_of: list[Hashable]  # [index]: the pod's decision group
    need: list[tuple[int, int, int, int]]  # [group id]: ``room_need`` of its pods
    cpu_milli: np.ndarray  # [group id], and the other columns of ``need``
    memory_mib: np.ndarray
    gpu_count: np.ndarray
    gpu_milli: np.ndarray
    priority: np.ndarray  # [group id]

    def __init__(self, reqs: list[PodRequest], hints: Mapping[str, str],
                 group_by: Callable[[PodRequest], Hashable] = trace_group, like: PendingGroups | None = None) -> None:
        """``like``: a queue made (and not changed since) over the same requests in the same order, with the same
        ``group_by``: its groups are copied, not worked out again (a replay's runs of one workload share them)."""
        self.reqs = reqs  # the replay's pods; the live queue's grow with ``register``
        self.hints = hints  # schedqueue.requeue_hints of the profile
        self.group_by = group_by
        self.queued: dict[int, QueuedPod] = {}  # pending pods, in the order they came
        self.groups: dict[Hashable, list[tuple]] = {}  # group -> [(-priority, first seen, key, index, group id)], in
        # ``schedqueue.sort_key``'s order; only non-empty groups
        self.group_ids: dict[Hashable, int]  # group -> its id
        self.group_list: list[Hashable]  # [group id]: the group
        if like is not None:
            if like.group_by is not group_by or len(like.reqs) != len(reqs):
                raise ValueError("PendingGroups(like=...): another grouping or other requests")
            self.by_key = dict(like.by_key)
            self.group_of = list(like.group_of)
            self.group_ids = dict(like.group_ids)
            self.group_list = list(like.group_list)
            self.need = list(like.need)
            self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli, self.priority = (
                a.copy() for a in (like.cpu_milli, like.memory_mib, like.gpu_count, like.gpu_milli, like.priority))
        else:
            self.by_key = {r.key: i for i, r in enumerate(reqs)}
            self.group_of = [group_by(r) for r in reqs]
            self.group_ids = {}
            for g in self.group_of:
                self.group_ids.setdefault(g, len(self.group_ids))
            self.group_list = list(self.group_ids)
            first: dict[Hashable, PodRequest] = {}
            for i, g in enumerate(self.group_of):
                first.setdefault(g, reqs[i])
            self.need = [room_need(first[g]) for g in self.group_list]  # [group id]
            need = np.array(self.need, dtype=np.int64).reshape(-1, 4)
            self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli = (need[:, k].copy() for k in range(4))
            self.priority = np.array([first[g].priority for g in self.group_list], dtype=np.int64)  # [group id]
        self.count = np.zeros(len(self.group_list), dtype=np.int64)  # [group id]: pods waiting in it
        self.front: list[tuple | None] = [None] * len(self.group_list)  # [group id]: its list's first (sort key, index)
        self.priorities = sorted(set(self.priority.tolist()))
        self.freed: set[int] = set()  # nodes that gained room since the last pass
        self.kept_out: set[Hashable] = set()  # groups last kept out by a cluster-wide count: tried at every pass
        self.fresh: set[Hashable] = set()  # groups of pods back in the queue: never tried against this cluster yet
        self.nominated: set[str] = set()  # pods that had victims deleted for them: tried first, held room is theirs
        self._refs = [0] * len(self.group_list)  # [group id]: registered pods in it (``register``, ``unregister``)
        self._free: list[int] = []  # indices given back by ``unregister``
        self._free_groups: list[int] = []
        self._rank: tuple[int, np.ndarray, np.ndarray] | None = None  # ``_gpu_rank``'s, for a GPU count per node
        self._parts: tuple[int, tuple] | None = None  # ``_room_parts``'
        self._room_only: dict[frozenset[str], bool] = {}  # ``room_only`` of the plugins that rejected a pod
        self.rejected: dict[int, frozenset[str]] = {}  # waiting pod -> the plugins that turned it away last (``asleep``)
        self._hints: tuple[Any, dict[str, QueueingHint], dict[frozenset[str], tuple[QueueingHint, ...]]] | None = None
        self._screen: FitScreen | None = None  # the nodes with a group's room (``asleep``), kept between passes
        self._kinds: tuple[Any, Any, Any, bool] | None = None  # (pre-filters, filters run, hints, all room or nodes?)

    # --- pods that come and go (the live queue: its pods are not known up front) --------------------
    def register(self, r: PodRequest) -> int:
        """Pod ``r``'s index (a new one, or its old one again if its request is the same), its group made if new."""
        i = self.by_key.get(r.key)
        if i is not None:
            if self.reqs[i] == r and self.reqs[i].terms is r.terms and self.reqs[i].dra is r.dra:
                return i
            self.unregister(i)
        g = self.group_by(r)
        if self._free:
            i = self._free.pop()
            self.reqs[i], self.group_of[i] = r, g
        else:
            i = len(self.reqs)
            self.reqs.append(r)
            self.group_of.append(g)
        self.by_key[r.key] = i
        gid = self.group_ids.get(g)
        if gid is None:
            gid = self._new_group(g, r)
        self._refs[gid] += 1
        return i

    def unregister(self, i: int) -> None:
        """Pod i is gone for good: out of the queue; its index (and its group, when it was the last) reused."""
        self.remove(i)
        r, g = self.reqs[i], self.group_of[i]
        if self.by_key.get(r.key) == i:
            del self.by_key[r.key]
        self.nominated.discard(r.key)
        self._free.append(i)
        gid = self.group_ids[g]
        self._refs[gid] -= 1
        if not self._refs[gid]:
            del self.group_ids[g]
            self.kept_out.discard(g)
            self.fresh.discard(g)
            self._free_groups.append(gid)

    def _new_group(self, g: Hashable, r: PodRequest) -> int:
        need = room_need(r)
        if self._free_groups:
            gid = self._free_groups.pop()
            self.group_list[gid], self.need[gid] = g, need
            self._refs[gid] = 0
        else:
            gid = len(self.group_list)
            self.group_list.append(g)
            self.need.append(need)
            self._refs.append(0)
            if gid >= len(self.count):  # room for twice as many groups
                grow = max(gid, 8)
                self.count, self.priority, self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli = (
                    np.concatenate([a, np.zeros(grow, dtype=np.int64)]) for a in (
                        self.count, self.priority, self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_milli))
                self.front.extend([None] * grow)
        self.group_ids[g] = gid
        self._rank = self._parts = None
        self.cpu_milli[gid], self.memory_mib[gid], self.gpu_count[gid], self.gpu_milli[gid] = need
        self.priority[gid] = r.priority
        if r.priority not in self.priorities:
            bisect.insort(self.priorities, r.priority)
        return gid

    def __len__(self) -> int:
        return len(self.queued)

    def __contains__(self, i: int) -> bool:
        return i in self.queued

    # --- the queue ---------------------------------------------------------------------------------
    def add(self, i: int, first_seen_s: float) -> None:
        if i not in self.queued:
            r, g = self.reqs[i], self.group_of[i]
            self.queued[i] = QueuedPod(r.key, r.priority, first_seen_s, r)
            lst = self.groups.setdefault(g, [])
            gid = self.group_ids[g]
            bisect.insort(lst, (-r.priority, first_seen_s, r.key, i, gid))  # an entry: ``sort_key``'s order
            self.count[gid] += 1
            self.front[gid] = lst[0]

    def remove(self, i: int) -> None:
        q = self.queued.pop(i, None)
        if q is not None:
            self.rejected.pop(i, None)
            group = self.group_of[i]
            g = self.groups[group]
            gid = self.group_ids[group]
            g.remove((-q.priority, q.first_seen, q.key, i, gid))
            self.count[gid] -= 1
            if g:
                self.front[gid] = g[0]
            else:
                del self.groups[group]
                self.front[gid] = None

    def head(self, group: Hashable) -> int | None:
        g = self.groups.get(group)
        return g[0][3] if g else None

    def first(self, group: Hashable, n: int) -> list[QueuedPod]:
        return [self.queued[e[3]] for e in self.groups[group][:n]]

    # --- what the round decided, what changed ------------------------------------------------------
    def failed(self, i: int, first_seen_s: float, rejected_by: Collection[str]) -> None:
        """Pod i does not fit: it waits; kept out not only by room, its group is tried whenever a pod leaves."""
        by = rejected_by if isinstance(rejected_by, frozenset) else frozenset(rejected_by)
        only = self._room_only.get(by)  # (a few distinct sets of plugins)
        if only is None:
            only = self._room_only[by] = room_only(by, self.hints)
        if not only:
            self.kept_out.add(self.group_of[i])
        self.add(i, first_seen_s)
        self.rejected[i] = by

    def placed(self, i: int, tried: bool = True) -> None:
        """Pod i holds its devices.  ``tried``: it went through a cycle of its own (not a gang member), so its
        group is not kept out by a count any more."""
        if tried and self.kept_out:
            self.kept_out.discard(self.group_of[i])
        self.remove(i)
        if self.nominated:
            self.nominated.discard(self.reqs[i].key)

    def requeue(self, i: int, first_seen_s: float) -> None:
        """Pod i (a victim) waits again, as a new pod: its group is tried against every node at the next pass."""
        self.add(i, first_seen_s)
        self.fresh.add(self.group_of[i])

    # --- room tests --------------------------------------------------------------------------------
    def with_room(self, state: ClusterState, nodes: Iterable[int]) -> np.ndarray:
        """[group id]: could the group fit on one of ``nodes`` (CPU, memory, enough GPUs with its milli free).

        At least ``gpu_count`` GPUs of a node have ``gpu_milli`` free when its ``gpu_count``-th freest GPU has: one
        look-up per group in the node's sorted free milli.  Each of the three tests is kept per class of the node's
        amounts (``_room_parts``), so a node whose amounts fall in classes seen before costs no compare over the
        groups, only the two ``&``; and their ``&`` is kept per class of all three (``by_node``), so a node whose
        classes were seen together before costs one look-up (a retry pass asks this for the node a pod left, and
        again after each try placed a pod there: about 30,000 calls a replay).  The answer may be that kept array,
        read-only: a caller that writes copies it."""
        width = state.gpu_free_milli.shape[1]
        parts = self._room_parts(width)
        cpu_thr, mem_thr, gpu_thr, by_cpu, by_mem, by_gpu, by_node = parts
        cpu_free, mem_free, gpu_free = state.cpu_free, state.mem_free, state.gpu_free_milli
        ok = None
        for d in nodes:
            c, m = cpu_free.item(d), mem_free.item(d)
            row = gpu_free[d].tolist()
            row.sort()
            kg = tuple([_bisect(gpu_thr, v) for v in row])
            if (fit := by_node.get(kn := (_bisect(cpu_thr, c), _bisect(mem_thr, m), kg))) is None:
                if (a := by_cpu.get(k := kn[0])) is None:
                    a = by_cpu[k] = self.cpu_milli <= c
                if (b := by_mem.get(k := kn[1])) is None:
                    b = by_mem[k] = self.memory_mib <= m
                if (g := by_gpu.get(kg)) is None:
                    rank, need = self._gpu_rank(width)
                    g = by_gpu[kg] = np.array(row if width else [0], dtype=np.int64)[rank] >= need
                fit = by_node[kn] = a & b & g
                fit.flags.writeable = False  # the cache's own, and perhaps the answer: read, never written
            ok = fit if ok is None else ok | fit
        return np.zeros(len(self.count), dtype=bool) if ok is None else ok

    def _room_parts(self, width: int) -> tuple:
        """``with_room``'s three tests by class: the sorted distinct CPU, memory and GPU milli the groups ask
        (thresholds), and per class of a node's amount (how many thresholds it reaches: every group answers alike
        for any amount of one class) [group id] the group has that much: CPU, memory, and for the node's sorted GPU
        free milli, class by class, enough GPUs; and the three's ``&`` per (CPU, memory, GPU) class.  Made again when
        groups come (``_new_group``) or the width moves."""
        memo = self._parts
        if memo is None or memo[0] != width:
            thr = [sorted(set(a.tolist())) for a in (self.cpu_milli, self.memory_mib, self.gpu_milli)]
            memo = self._parts = (width, (*thr, {}, {}, {}, {}))
        return memo[1]

    def _gpu_rank(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """[group id]: which of a node's GPUs, in ascending free milli, must have ``need`` milli free for the group's
        GPUs to fit: the ``gpu_count``-th from the end (with no GPUs asked, the lowest ``need`` there is; with more
        than the node has, more than any has)."""
        memo = self._rank
        if memo is None or memo[0] != width:
            gc = self.gpu_count
            need = np.where(gc == 0, np.iinfo(np.int64).min, np.where(gc > width, np.iinfo(np.int64).max, self.gpu_milli))
            memo = self._rank = (width, max(width - 1, 0) - np.clip(gc - 1, 0, max(width - 1, 0)), need)
        return memo[1], memo[2]

    def fits_on(self, gid: int, state: ClusterState, nodes: Sequence[int]) -> bool:
        """``with_room`` for one group on a few nodes, without numpy's per-call cost."""
        return room_on(state, self.need[gid], nodes)

    # --- queueing hints ---------------------------------------------------------------------------
    def _hints_of(self, sched: Any) -> tuple[Any, dict[str, QueueingHint], dict[frozenset[str], tuple[QueueingHint, ...]]]:
        """(the profile, its plugins' hints by name, the hints asked per set of rejecting plugins), made again when the
        shell's profile is replaced."""
        memo = self._hints
        if memo is None or memo[0] is not sched.profile:
            memo = self._hints = (sched.profile, queueing_hints(sched.profile), {})
        return memo

    def asleep(self, i: int, rnd: SchedulingRound, waited_s: float) -> bool:
        """Would a try of waiting pod i now only tell it to wait, as its queueing hints show?  True when the plugins
        that turned it away last give hints (``schedqueue.QueueingHint``), no node has its room (``room_need``) and
        passes them all (so no node passes its cycle), a try whose cycle fails changes nothing else
        (``SchedulingRound.fails_quietly``), and every filter its cycle runs is lifted by room or node changes only
        (the try would not keep its group out by a count: ``failed``)."""
        by = self.rejected.get(i)
        if by is None:
            return False
        sched = rnd.sched
        memo = self._hints_of(sched)
        asked = memo[2].get(by)
        if asked is None:
            asked = memo[2][by] = tuple(h for name, h in sorted(memo[1].items()) if name in by)
        if not asked:
            return False
        r = self.reqs[i]
        if not rnd.fails_quietly(r):
            return False
        pre, run, hints = sched.profile.pre_filters, sched.filters_for(r), self.hints
        kinds = self._kinds
        if kinds is None or kinds[0] is not pre or kinds[1] is not run or kinds[2] is not hints:  # (most often the same)
            names = [p.name for p in pre] + [p.name for p in run]
            kinds = self._kinds = (pre, run, hints, all(hints.get(name, PODS) in (ROOM, NODES) for name in names))
        if not kinds[3]:
            return False
        state = sched.state
        screen = self._screen
        if screen is None or screen.state is not state:
            screen = self._screen = FitScreen(state)
        return not _hints_pass(asked, r, state, waited_s, screen.rooms(self.need[self.group_ids[self.group_of[i]]]).nonzero()[0])

    # --- what changed -------------------------------------------------------------------------------
    def changes(self, state: ClusterState) -> tuple[list[int], np.ndarray, set[Hashable]]:
        """What changed since the last call, taken: the nodes that gained room, [group id] could the group fit on
        one of them (``schedqueue.may_fit_after``'s room test, for every group at once), the groups with a pod
        back in the queue."""
        fresh, self.fresh = _waiting(self.fresh, self.groups), set()
        room = sorted(self.freed)
        self.freed.clear()
        return room, self.with_room(state, room), fresh

    def woken(self, state: ClusterState, rnd: SchedulingRound | None = None,
              waited: Callable[[int], float] | None = None) -> list[int]:
        """The waiting pods what changed may let fit (the live queue's wake-ups; a pass of ``retry`` tries the same
        groups): groups with room on a node that gained room, groups back in the queue, and, when a pod left,
        groups kept out by a cluster-wide count.  With the round and ``waited`` (pod -> seconds it has waited), a
        pod woken only by room that its queueing hints keep ``asleep`` is left out."""
        room, ok, fresh = self.changes(state)
        ok = ok.copy()  # (``with_room``'s may be read-only)
        hinted = ok.copy() if rnd is not None and waited is not None and self.rejected else None
        for g in fresh | (_waiting(self.kept_out, self.groups) if room else set()):
            ok[self.group_ids[g]] = True
            if hinted is not None:
                hinted[self.group_ids[g]] = False  # tried whatever the room
        groups, group_list = self.groups, self.group_list
        out = [e[3] for gid in np.flatnonzero(ok & (self.count > 0)).tolist() for e in groups[group_list[gid]]]
        if hinted is None or rnd is None or waited is None:
            return out
        return [i for i in out if not (hinted[self.group_ids[self.group_of[i]]] and self.asleep(i, rnd, waited(i)))]

    # --- a pass ------------------------------------------------------------------------------------
    def retry(self, rnd: SchedulingRound, now: float, attempt: Callable[[int, bool | None, bool], Attempt],
              waited: Callable[[int], float] | None = None) -> None:
        """One pass over the waiting pods that what changed may let fit, in the shared queue order.

        ``attempt(i, fits, plan)`` sends pod i through ``rnd.try_pod`` (the shell knows how long it waited);
        ``fits``: True (it has room on a freed node), None (ask the shell's screen), False (no room: straight
        to making room); ``plan`` False: make no room for it this time.  ``waited(i)``: the seconds ``attempt``
        says pod i has waited; given, a head with room that its queueing hints keep ``asleep`` is passed over."""
        if not len(self):
            self.fresh = set()
            self.freed.clear()
            return
        state = rnd.sched.state
        room, fit, fresh = self.changes(state)
        ok = fit.copy()
        for g in fresh:
            ok[self.group_ids[g]] = True
        if rnd.tree is not None:
            self._retry_queues(rnd, now, ok, attempt)
            return
        for g in _waiting(self.kept_out, self.groups):
            ok[self.group_ids[g]] = True
        if rnd.preemption and room:  # a pod that could evict: the room that came may complete a plan
            above = [p for p in self.priorities if rnd.rooms.lower_priority_running(p)]
            could = ~ok & (self.count > 0) & np.isin(self.priority, above) if above else None
            for gid in could.nonzero()[0].tolist() if could is not None else ():
                g = self.group_list[gid]
                i0 = self.head(g)
                if i0 is not None and rnd.rooms.may_plan(RoomFor((r0 := self.reqs[i0]).key, r0.priority, r0), now):
                    ok[gid] = True
                    fresh.add(g)
        nominated, groups, group_ids, group_list, reqs = self.nominated, self.groups, self.group_ids, self.group_list, self.reqs
        # per group its first entry (-priority, first seen, key, index, group id): the order of sort_key(head) (an
        # entry names the pod, so two never tie), itself when nobody is nominated; else (not nominated?, entry)
        queued = ok & (self.count > 0)  # [group id]: in ``heads`` (a group is there at most once)
        due = queued.nonzero()[0].tolist()
        front = self.front
        flagged = bool(nominated)
        heads: list = [e for gid in due if (e := front[gid]) is not None]
        if not heads:
            return
        if flagged:
            heads = [(reqs[e[3]].key not in nominated, e) for e in heads]
        heapq.heapify(heads)
        if len(heads) < len(due):  # a group counted but gone (never, while counts follow the lists)
            queued[:] = False
            for h in heads:
                queued[h[1][4] if flagged else h[4]] = True
        # [group id]: kept out by a count, or back in the queue (tried whatever the room; a group's own try is the
        # only thing in a pass that changes its ``kept_out``)
        either = [False] * len(group_list)
        n_either = 0
        if tried_anyway := _waiting(self.kept_out, groups) | fresh:
            for g in tried_anyway:
                either[group_ids[g]] = True
            n_either = sum(either[h[1][4] if flagged else h[4]] for h in heads)
        # one priority: when no queued group fits and none is tried whatever the room, every one left would be
        # passed over (``waits_by_priority``, nobody nominated), and passing over changes nothing: the pass ends
        prio = self.priorities[0] if len(self.priorities) == 1 else None
        # ``fit`` is kept true to the cluster: after a try that only placed its pod on one node (no room made, no
        # gang hold that a try could end) only that node changed, and it lost room: ``fit`` moves only if that node
        # is one of ``room`` (recomputed then); a try that failed with no room planned changed nothing; after any
        # other try it is recomputed as a whole
        room_set = set(room)
        waits: dict[int, bool] = {}  # priority -> a pod of it with no nomination would only wait; valid until a try
        kept_out, rejected = self.kept_out, self.rejected
        hinted = self._hints_of(rnd.sched)[1].keys() if waited is not None else {}.keys()  # plugins that give hints
        while heads:
            gid = heapq.heappop(heads)[1][4] if flagged else heapq.heappop(heads)[4]
            queued[gid] = False
            n_either -= either[gid]
            if (head := front[gid]) is None:
                continue
            i = head[3]
            if fit[gid]:
                if waited is not None and (by := rejected.get(i)) is not None and not by.isdisjoint(hinted) and \
                        self.asleep(i, rnd, waited(i)):
                    continue  # no node passes its cycle now: a try would only tell it to wait, as it was told
                fits: bool | None = True
            elif either[gid]:
                fits = None
            else:
                r = reqs[i]
                if (skip := waits.get(r.priority)) is None:
                    skip = waits[r.priority] = rnd.waits_by_priority(r.priority)
                if skip and not ((noms := rnd.nominations) and r.key in noms):
                    continue  # what ``rnd.only_waits`` says for it, without asking per pod
                if not skip and rnd.only_waits(r, now):
                    continue  # no room on a freed node and nothing else a try could do: it would only wait
                fits = False
            held = bool(rnd.gangs.held)
            a = attempt(i, fits, True)
            waits.clear()
            if kept_out or fresh:
                group = group_list[gid]
                either[gid] = group in kept_out or group in fresh
            else:
                either[gid] = False
            asg = a.decision.assignment
            if held or a.made_room:
                stale = True
            elif not a.ok:
                stale = a.room is not None  # no room made, nothing planned: nothing changed (a dry run rolls back)
            elif asg is not None and (d := state.index.get(asg.node)) is not None:
                stale = d in room_set  # one pod placed on node d, nothing else changed
            else:
                stale = True
            if a.ok:
                if a.made_room:  # victims left (or held room was taken): their nodes count as gained room
                    room = sorted(set(room) | self.freed)
                    room_set = set(room)
                if (head := front[gid]) is not None:
                    if flagged:
                        heapq.heappush(heads, (reqs[head[3]].key not in nominated, head))
                    elif nominated and reqs[head[3]].key in nominated:  # (every entry so far: not nominated)
                        heads = [(True, e) for e in heads]  # (the same order: still a heap)
                        flagged = True
                        heapq.heappush(heads, (False, head))
                    else:
                        heapq.heappush(heads, head)
                    queued[gid] = True
                    n_either += either[gid]
            if stale and heads:
                fit = self.with_room(state, room)
                if prio is not None and not n_either and not rnd.nominations and not _any(fit & queued) and \
                        rnd.waits_by_priority(prio):
                    break

    def _retry_queues(self, rnd: SchedulingRound, now: float, ok: np.ndarray,
                      attempt: Callable[[int, bool | None, bool], Attempt]) -> None:
        """With queues: the candidates are the first pods of each group that could fit on a node that gained
        room, whose last failure was a cluster-wide count (its quota: usage moved), or that could reclaim
        (within its quota while others borrow); they go through ``order_pending`` (DRF), as the live loop's
        due pods do.  Passes repeat while a group had all its candidates placed; within one, a group makes
        room once."""
        tree = rnd.tree
        assert tree is not None
        borrowing = False
        if rnd.preemption:
            use = tree.usage()
            borrowing = any((nom := tree.nominal(q, "gpu_milli")) is not None and use[q].get("gpu_milli", 0) > nom
                            for q in tree.queues)
        for _ in range(64):
            cands: list[QueuedPod] = []
            for group, members in self.groups.items():
                r0 = self.reqs[members[0][3]]
                if ok[self.group_ids[group]] or group in self.kept_out or (
                        borrowing and r0.queue and rnd.rooms.may_plan(RoomFor(r0.key, r0.priority, r0), now)
                        and tree.within_nominal(r0.queue, request_vector(r0))):
                    cands.extend(self.first(group, PER_GROUP))
            if not cands:
                return
            failed: set = set()
            room_tried: set = set()
            placed_n: dict[Hashable, int] = {}
            for key in order_pending(cands, tree, self.nominated):
                i = self.by_key[key]
                if i not in self:
                    continue
                group = self.group_of[i]
                if group in failed:
                    continue
                plan = group not in room_tried
                a = attempt(i, None, plan)
                if a.ok and not a.made_room:
                    placed_n[group] = placed_n.get(group, 0) + 1
                    continue
                if plan:
                    room_tried.add(group)
                if a.ok:
                    failed.clear()  # room was made: room for others too
                    placed_n[group] = placed_n.get(group, 0) + 1
                    continue
                failed.add(group)
            more = {g for g, n in placed_n.items() if n >= PER_GROUP and g in self.groups}
            if not more:
                return
            ok = np.zeros(len(self.count), dtype=bool)
            for g in more:
                ok[self.group_ids[g]] = True


def _waiting(some: set[Hashable], groups: Mapping[Hashable, list]) -> set[Hashable]:
    """``some & groups.keys()``, looking up each of ``some`` (a few groups) instead of hashing every waiting group's
    key as ``set & dict_keys`` does (it iterates over the keys)."""
    return {g for g in some if g in groups} if some else set()


def _hints_pass(hints: Iterable[QueueingHint], r: PodRequest, state: ClusterState, waited_s: float, rows: np.ndarray) -> bool:
    """Could ``r`` pass every hint's plugin on one of ``rows``?  (Each hint covers the rows where its plugin passes.)"""
    if not rows.size:
        return False
    ok: np.ndarray | None = None
    for hint in hints:
        where = hint(r, state, waited_s, rows)
        if where is not None:
            ok = where if ok is None else ok & where
    return ok is None or bool(_any(ok))


_bisect = bisect.bisect_right
_any = np.logical_or.reduce  # ``a.any()`` of a 1-d bool array, without the method's wrapper
_count = np.add.reduce  # ``a.sum(axis=...)`` of a bool array (counts), without the method's wrapper


def room_mask(state: ClusterState, need: tuple[int, int, int, int], rows: np.ndarray | None = None) -> np.ndarray:
    """[nodes] (or [``rows``]): the node has the CPU, memory and free GPUs of ``need`` (``room_need``)."""
    c, m, gc, gm = need
    if rows is None:
        ok = (state.cpu_free >= c) & (state.mem_free >= m)
        if gc:
            ok &= _count(state.gpu_free_milli >= gm, axis=1) >= gc
        return ok
    ok = (state.cpu_free[rows] >= c) & (state.mem_free[rows] >= m)
    if gc:
        ok &= _count(state.gpu_free_milli[rows] >= gm, axis=1) >= gc
    return ok


def could_fit(state: ClusterState, r: PodRequest) -> bool:
    """A necessary condition, cheap: some node has the CPU, memory and free GPUs the pod asks for (``room_need``)."""
    return bool(room_mask(state, room_need(r)).any())


class FitScreen:
    """``could_fit`` against one ClusterState, remembering per room need (``room_need``) which nodes had room and
    each node's ``version`` then.  Versions only go up, one per change of a node's free amounts, so a node whose
    version is the same has the same room: a node that had room and has not changed answers at once, and otherwise
    only the nodes that changed since are tested again.  The answer is ``could_fit``'s, without the [nodes, GPUs]
    test on most calls (a replay asks it for every arrival).

    The nodes that changed since come from the state's log (``changed_since``, with a mark taken whenever every
    node's version was brought up to date), tested one by one in Python when they are a few; a comparison of every
    node's version only where the log cannot say or lists many.  Why: about half of a replay's arrivals ask for a
    room no node had, and there the compare over every node (1,213 at the sweep's cluster) and the few changed
    rows' numpy tests were most of the call; most often none or one node moved since."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # need -> [epoch, a node with room (-1: none), its version then, [nodes] room, [nodes] version of that room,
        #          the log's mark when every node's version in it was the state's]
        self._seen: dict[tuple[int, int, int, int], list] = {}

    def _new(self, need: tuple[int, int, int, int]) -> list:
        st = self.state
        seen = self._seen[need] = [st.epoch, -1, 0, room_mask(st, need), st.version.copy(), st.change_mark()]
        return seen

    def _changed(self, seen: list, need: tuple[int, int, int, int]) -> tuple[list[int] | np.ndarray, list | np.ndarray]:
        """Brings ``seen``'s room and versions up to date: (the nodes whose version moved since, ascending, once
        each; whether each has the room now)."""
        st = self.state
        versions, room = seen[4], seen[3]
        moved = st.changed_since(seen[5])
        seen[5] = st.change_mark()
        if moved is not None and len(moved) <= _FEW_MOVED:
            few = sorted(set(moved))  # what the compare below finds: versions only go up, each move is logged
            now_room = [room_on(st, need, (d,)) for d in few]
            vers = st.version
            for d, ok in zip(few, now_room):
                room[d] = ok
                versions[d] = vers.item(d)
            return few, now_room
        changed = (st.version != versions).nonzero()[0]
        if not changed.size:
            return changed, changed
        now = room_mask(st, need, changed)
        versions[changed] = st.version[changed]
        room[changed] = now
        return changed, now

    def rooms(self, need: tuple[int, int, int, int]) -> np.ndarray:
        """[nodes]: which nodes have ``need``'s room now (``room_mask``), kept from the last answer for ``need`` and
        tested again only on the nodes whose version moved since.  The array is the screen's own: read, not kept."""
        st = self.state
        seen = self._seen.get(need)
        if seen is None or seen[0] != st.epoch:
            seen = self._new(need)
        else:
            self._changed(seen, need)
        room = seen[3]
        if seen[1] < 0:  # ``__call__``'s "no node had room" must stay true to ``room``
            k = int(room.argmax())
            if room[k]:
                seen[1], seen[2] = k, int(st.version[k])
        return room

    def __call__(self, r: PodRequest) -> bool:
        st = self.state
        need = room_need(r)
        seen = self._seen.get(need)
        if seen is None or seen[0] != st.epoch:
            seen = self._new(need)
        else:
            node = seen[1]
            if node >= 0:
                if st.version.item(node) == seen[2]:
                    return True
                if room_on(st, need, (node,)):
                    seen[2] = st.version.item(node)
                    return True
            changed, now_room = self._changed(seen, need)
            if node < 0:  # no node had room: only a changed one may have now, the first of them is the first
                for k, ok in enumerate(now_room):
                    if ok:
                        d = int(changed[k])
                        seen[1], seen[2] = d, st.version.item(d)
                        return True
                return False  # (``room`` stays all False)
        room = seen[3]
        node = int(room.argmax())
        if room[node]:
            seen[1], seen[2] = node, int(st.version[node])
            return True
        seen[1] = -1
        return False


_FEW_MOVED = 6  # ``FitScreen``: up to this many logged moves, the changed nodes are tested one by one in Python


__all__ = ["PER_GROUP", "FitScreen", "PendingGroups", "could_fit", "pod_group", "trace_group"]
