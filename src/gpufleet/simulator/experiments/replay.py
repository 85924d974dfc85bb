"""Replay experiment: a trace's pods arrive, wait in the scheduling queue, run, and leave.

A discrete-event loop on a simulated clock (no sleeping, no polling).  Each
pod arrives at its ``creation_time`` and, once placed, runs for its *run
time* -- ``deletion_time - scheduled_time`` (or ``- creation_time`` when the
trace has no scheduled time): the time it held resources in production.  A
pod placed late therefore still runs for as long as it did, as a job would.

Each pod's trip is the live scheduler's, written once in ``engine/``: ``round.SchedulingRound``
(the engine's cycle, held room, reclaim of quota its queue lent out, preemption of
lower-priority pods, the gang round) and ``pending.PendingGroups`` (which waiting pods a change
may let fit, ``schedqueue.may_fit_after`` as the live queue's wake-ups, and the shared queue order:
pods that had victims deleted for them first, then with team queues hierarchical weighted DRF,
else priority and first come).  This module is the shell: it turns the trace into arrivals and
departures on a clock, says what changed (a pod leaving frees room on its node; nothing else
changes in a replay), and carries out the round's decisions.  What differs from the live loop is
only what its API calls do: victims leave at once (back to waiting, like a controller's re-created
pod, keeping their first arrival time), so the pod is placed at once.  Members of a pod group go
through the round's gang scheduler (all or nothing, one holder at a time) after the single pods,
as in ``SchedulerLoop.schedule_due``.  The figures are ``replay_metrics``'.

Load (``load=X``): the arrival times are scaled so that the time-averaged
offered GPU demand is X of the cluster's GPU capacity:

    offered = sum_i(gpu_i * run_i) / (capacity * (t_last_arrival - t_first_arrival))

with ``gpu_i`` in GPUs (a 0.5-GPU share counts 0.5) and ``capacity`` the GPUs
of the *reference* cluster (the one the trace came with, also under a
what-if, so a what-if compares the same workload on another cluster).  Gaps
between arrivals are multiplied by ``offered / X``; run times are kept.

Metrics are taken over the *busy window*: from ``warmup`` (a fraction of the
arrival span, default 10%) after the first arrival to the last arrival.  The
warm-up (an empty cluster filling) and the drain (no more arrivals) are left
out: queueing delay, slowdown and classes count pods that *arrive* in the
window (whenever they are placed), GPU allocation is time-averaged over the
window.  Pods in the trace that already run at its start (``creation_time``
empty, as in the 2025 trace) are placed before the first arrival and are not
measured.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from ...engine.framework import Scheduler
from ...engine.gang import GangResult
from ...engine.model import Node, PodRequest
from ...engine.pending import FitScreen, PendingGroups
from ...engine.plugins.queuequota import QueueQuota
from ...engine.preemption import Plan, candidate_bound
from ...engine.queues import Queue, QueueTree
from ...engine.round import Attempt, RoomFor, SchedulingRound
from ...engine.schedqueue import requeue_hints
from ...engine.state import ClusterState
from ...policies import build_profile
from ...policies.paper.workload import TargetWorkload
from .packing import memo, prime_policy
from .replay_metrics import SAMPLES, ReplayRun, pinned_class, request_class, sample, stats, summarize
from ..traces.trace import TraceError, TracePod
from ..traces.workload import DEFAULT_WARMUP, Workload, workload_from_trace

if TYPE_CHECKING:
    from ..traces.constraints import NodeLimits

PLAN_INTERVAL_S = 300.0  # a queue (or priority) whose reclaim/preemption plan failed plans again at most this often


def _limits_plugin(extras: Sequence[Mapping[str, object]], nodes: Sequence[Node], reqs: Sequence[PodRequest]) -> NodeLimits | None:
    from ..traces.constraints import NodeLimits

    if not any(extras):
        return None
    lim = NodeLimits.for_workload(nodes, extras)
    lim.bind_keys([r.key for r in reqs], extras)
    return lim


def run_replay(
    nodes: Sequence[Node],
    pods: Sequence[TracePod] | Workload,
    policy: str,
    seed: int = 42,
    trace_name: str = "",
    progress: Callable[[int], None] | None = None,
    speedup: float = 1.0,
    load: float | None = None,
    reference_gpus: float | None = None,
    warmup: float = DEFAULT_WARMUP,
    queues: Sequence[Queue] | None = None,
    preemption: bool = True,
    what_if: str = "",
    frag: bool = True,
    copies: int | None = None,
) -> ReplayRun:
    """Replay ``pods`` on ``nodes`` with ``policy``.  ``load`` (offered GPU load, fraction of
    ``reference_gpus``, default the cluster's own GPUs) or ``speedup`` (divide the gaps between
    arrivals) set the pace; ``queues`` turns on team queues (pods' namespaces name their team)."""
    t0 = time.perf_counter()
    if speedup <= 0:
        raise ValueError("speedup must be > 0")
    wl = pods if isinstance(pods, Workload) else workload_from_trace(pods, trace_name or "trace")
    cap_gpus = sum(len(n.gpus) for n in nodes)
    ref = float(reference_gpus or cap_gpus)
    scale = 1.0
    if load is not None:
        wl, scale = paced(wl, load, ref, warmup, copies)
    elif speedup != 1.0:
        wl, scale = wl.scaled(1.0 / speedup), 1.0 / speedup
    state = ClusterState(nodes)
    prof = build_profile(policy)
    tree: QueueTree | None = None
    reqs = list(wl.requests)
    if queues:
        from ...engine.queues import NamespaceQueues

        tree = QueueTree(queues, state)
        nsq = NamespaceQueues(queues)
        names = set(tree.queues)
        reqs = [nsq.apply(r) if r.namespace not in names else replace(r, queue=r.namespace) for r in reqs]
        qq = QueueQuota(tree)
        prof = replace(prof, pre_filters=[qq, *prof.pre_filters], reserves=[qq, *prof.reserves])
    limits = _limits_plugin(wl.extras, nodes, reqs)
    if limits is not None:
        prof = replace(prof, filters=[*prof.filters, limits], reserves=[*prof.reserves, limits])
    sched = Scheduler(prof, state, seed=seed)
    prime_policy(sched, list(reqs))
    # with no queues the pods are the workload's own: their decision groups (made once per process) count the names
    if len(_groups_of(wl.requests).by_key if tree is None else {r.key for r in reqs}) != len(reqs):
        raise TraceError(trace_name or "trace", 0, "name", "pod names must be unique")

    run = ReplayRun(policy=policy, seed=seed, trace=trace_name, load=load, arrival_scale=round(scale, 6),
                    offered_load=round(wl.offered_load(ref, warmup), 4), copies=wl.copies, what_if=what_if, nodes=len(nodes), gpus=cap_gpus,
                    warmup=warmup)
    # (the pods' shapes, the same for every run of this workload: queues and namespaces are not part of a shape)
    tw = cast(TargetWorkload, memo((wl.requests,), ("target",), lambda: TargetWorkload.from_requests(wl.requests))) \
        if frag and cap_gpus else None
    rp = _Replay(wl, reqs, sched, tree, limits, run, tw, preemption, progress)
    run.busy_window_h = [round((rp.w_start - rp.t_first) / 3600, 4), round((rp.w_end - rp.t_first) / 3600, 4)]
    rp.run()
    summarize(rp)
    run.wall_s = round(time.perf_counter() - t0, 3)
    return run


def paced(wl: Workload, load: float, reference_gpus: float, warmup: float = DEFAULT_WARMUP,
          copies: int | None = None) -> tuple[Workload, float]:
    """``wl.at_load(...)``, once per process for the same workload and arguments: the same for every policy's run
    at this load (a sweep's parent paces each load before its workers fork, and they find it here)."""
    ref = float(reference_gpus)
    base = wl
    if copies is not None:  # every load's passes are the same pods: tiled once (``at_load`` on them: the same numbers)
        n = copies
        base, copies = cast(Workload, memo((wl,), ("tiled", n), lambda: wl.tiled(n))), 1
    return cast("tuple[Workload, float]", memo((base,), ("at_load", load, ref, warmup, copies),
                                               lambda: base.at_load(load, ref, warmup, copies)))


def prepare(wl: Workload, loads: Sequence[float], reference_gpus: float, warmup: float, copies: int | None) -> None:
    """What every run of ``wl`` at these loads works out the same, made now and kept in this process
    (``packing.memo``): each load's pacing (``paced``) and the pods' decision groups (``PendingGroups``).  A sweep
    calls it before its workers fork, so that they find it made."""
    for load in loads:
        _groups_of(paced(wl, load, reference_gpus, warmup, copies)[0].requests)


def _groups_of(reqs: list[PodRequest]) -> PendingGroups:
    """The decision groups of a workload's pods, worked out once per process (a template, never a queue itself)."""
    return cast(PendingGroups, memo((reqs,), ("groups",), lambda: PendingGroups(list(reqs), {})))


class _PlanRation:
    """When a failed reclaim/preemption plan may be made again.

    Only once something it could take came (an epoch: pods placed beyond their queue's quota, or of lower
    priority) and ``PLAN_INTERVAL_S`` later: the live loop bounds its planning time too
    (``Preemptor.PLAN_SHARE``); replanning every round would cost hours.  Keys ration planning per queue
    (with queues), per priority (without) or per gang.
    """

    def __init__(self) -> None:
        self._failed: dict[tuple, tuple[tuple, float]] = {}

    def ready(self, key: tuple, epoch: tuple, now: float) -> bool:
        last = self._failed.get(key)
        return last is None or (last[0] != epoch and now >= last[1])

    def failed(self, key: tuple, epoch: tuple, now: float) -> None:
        self._failed[key] = (epoch, now + PLAN_INTERVAL_S)


class _Replay:
    """One replay on the simulated clock: the event loop, and the shell of the shared scheduling round.

    Each pod's trip (the cycle, held room, reclaim, preemption; the gang round) is
    ``engine.round.SchedulingRound``'s, the live loop's too; this class is what the live loop's
    informers and API calls are instead: pods arrive and leave by the trace's clock, victims leave at
    once and wait again (so the round tries the pod again straight away).  It is the round's snapshot,
    ``RoundPort`` and ``RoomPort``.  The waiting pods are ``engine.pending.PendingGroups``; what runs is counted here
    (GPU milli, pods per priority) for the metrics and for the plan rationing.
    """

    hints = True  # the retries ask the queueing hints (``PendingGroups.asleep``); False: every try made (a test's baseline)

    def __init__(self, wl: Workload, reqs: list[PodRequest], sched: Scheduler, tree: QueueTree | None, limits: NodeLimits | None,
                 run: ReplayRun, tw: TargetWorkload | None, preemption: bool, progress: Callable[[int], None] | None) -> None:
        self.wl, self.reqs, self.sched, self.state, self.tree, self.limits = wl, reqs, sched, sched.state, tree, limits
        self.result, self.tw, self.preemption, self.progress = run, tw, preemption, progress
        self.acc = tw.access(self.state.model_names) if tw is not None else None
        self.all_nodes = np.arange(len(self.state))  # the fragmentation sample's rows
        self.frag_kept: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, [node] fragment, [node] version)
        self.capacity = max(self.state.total_gpu_milli(), 1)
        like = _groups_of(wl.requests) if tree is None else None  # with no queues, ``reqs`` are the workload's
        self.pending = PendingGroups(reqs, requeue_hints(sched.profile), like=like)  # waiting pods, what changed, the retries
        self.fit_screen = FitScreen(self.state)  # ``could_fit``, remembering why
        self.by_key = self.pending.by_key
        # per pod, what the per-event bookkeeping reads: ``PodRequest.key`` is a property that formats its string at
        # every read, ``total_gpu_milli`` a product; a replay reads them at every placement and departure
        self.keys: list[str] = [r.key for r in reqs]
        self.milli: list[int] = [r.total_gpu_milli for r in reqs]
        self.trying = -1  # the pod ``_attempt`` sends through the round: its ``bind``/``wait`` are for that pod
        arrival = wl.arrival_s
        self.measured = ~np.isnan(arrival)
        self.t_first = float(arrival[self.measured].min()) if self.measured.any() else 0.0
        self.t_last = float(arrival[self.measured].max()) if self.measured.any() else 0.0
        self.w_start, self.w_end = wl.window(run.warmup)
        # the arrivals, known up front: in the order of (time, pod index), kept out of the heaps.  The departures: a
        # heap of their times (floats compare faster than tuples) and, per time, ``seq << 32 | pod`` (a list of them
        # in the order they were scheduled when several share the time; ``seq`` grows; an int, not a container
        # object per departure).  ``events``: a subclass's other events (time, kind >= 2, seq, index).  Of one
        # time, the departures go first, then the arrivals, then the other events (a heap of (time, kind, ...)
        # with departures kind 0 and arrivals kind 1 would give that order)
        at = np.flatnonzero(self.measured)
        at = at[np.argsort(arrival[at], kind="stable")]  # time, then index (``at`` ascends)
        self.arrival_times: list[float] = arrival[at].tolist()
        self.arrival_order: list[int] = at.tolist()
        self.run_s: list[float] = wl.run_s.tolist()
        self.departures: list[float] = []
        self.departing: dict[float, int | list[int]] = {}
        self.events: list[tuple] = []
        self.seq = 0
        self.ends: dict[int, int] = {}  # pod -> seq of its live departure event (victims' old ones are stale)
        self.arrived_at: dict[int, float] = {}
        self.delays = np.full(len(reqs), np.nan)
        self.used_milli = 0
        self.alloc_integral = 0.0
        self.running_by_prio: dict[int, int] = {}  # priority -> pods running
        self.placed_by_prio: dict[int, int] = {}  # priority -> pods placed so far (an epoch for plan rationing)
        self.lent = 0  # placements beyond a queue's quota so far (an epoch for reclaim planning)
        self.left = 0  # pods that stopped so far (an epoch for planning: room a plan could use)
        self.seen: dict[int, int] = {}  # pod -> when it (or, for a victim, its new pod) came, as a sequence number
        self.seen_n = 0
        self.age: dict[int, int] = {}  # running pod -> its age as the live loop's (start second, then first sight)
        self.plans = _PlanRation()
        self.round = SchedulingRound(self, self, self, preemption)
        self.gangs = self.round.gangs if any(r.pod_group for r in reqs) else None
        self.gang_waiting: dict[int, float] = {}  # pod-group members not placed yet
        self.now = 0.0  # the clock, for the round's port calls
        self.team_names = sorted(tree.queues) if tree else []
        self.team_share: dict[str, list[float]] = {q: [] for q in self.team_names}
        self.team_borrow: dict[str, list[float]] = {q: [] for q in self.team_names}
        self.team_preempted: dict[str, int] = {q: 0 for q in self.team_names}
        self.team_reclaimed: dict[str, int] = {q: 0 for q in self.team_names}

    # --- bookkeeping ------------------------------------------------------------------------------
    def _lower_placed(self, priority: int) -> int:
        return sum(c for p, c in self.placed_by_prio.items() if p < priority)

    def _plan_key(self, room: RoomFor) -> tuple:
        """Planning is rationed per gang, else per queue (with queues) or per priority and decision group (without:
        a plan that failed for one pod fails for a pod the engine cannot tell from it, not for another shape)."""
        if room.request is None:
            return ("gang", room.key)
        if self.tree is not None:
            return (room.request.queue, None)
        return (None, room.priority, self.pending.group_of[self.by_key[room.request.key]])

    def _plan_epoch(self, room: RoomFor) -> tuple:
        """What must have changed since a plan failed: placements beyond quota (not for gangs), lower ones, or a
        pod that stopped (its room may complete a plan, as the live loop finds when it plans again)."""
        return (0 if room.request is None else self.lent, self._lower_placed(room.priority), self.left)

    def _attempt(self, i: int, now: float, fits: bool | None = None, plan: bool = True) -> Attempt:
        """Pod i through the shared round (its decision comes back through ``bind``/``wait``/``evict``)."""
        r = self.reqs[i]
        self.now = now
        self.trying = i
        nominated = self.pending.nominated
        return self.round.try_pod(r, now, now - self.arrived_at.get(i, now), bool(nominated) and self.keys[i] in nominated, fits, plan)

    def _index(self, r: PodRequest) -> int:
        """Pod index of a request the round hands back: the pod being tried (the same object: no key formatted and
        looked up), else by its key (a gang's members, a victim)."""
        i = self.trying
        return i if i >= 0 and self.reqs[i] is r else self.by_key[r.key]

    def place_initial(self, i: int, now: float) -> None:
        """A pod already running when the trace starts: placed if it fits, never waits."""
        r = self.reqs[i]
        self._came(i)
        if self.fit_screen(r) and self.sched.schedule(r, waited_s=0.0).ok:
            self.placed(i, now, tried=True)

    def placed(self, i: int, now: float, tried: bool = False) -> None:
        """Bookkeeping once pod i holds its devices (by the round, alone -- ``tried`` -- or as a gang member)."""
        r, tree = self.reqs[i], self.tree
        p = r.priority
        self.placed_by_prio[p] = self.placed_by_prio.get(p, 0) + 1
        if tree is not None and r.queue in tree.queues and any(
                (nom := tree.nominal(q, "gpu_milli")) is not None and tree.used(q, "gpu_milli") > nom for q in tree.path(r.queue)):
            self.lent += 1  # it borrows: reclaim may find it
        self.used_milli += self.milli[i]
        self.running_by_prio[p] = self.running_by_prio.get(p, 0) + 1
        if (came := self.arrived_at.get(i)) is not None and math.isnan(self.delays[i]):
            self.delays[i] = now - came
        self.pending.placed(i, tried)
        self.seq += 1
        self.ends[i] = self.seq
        self.age[i] = (int(now) << 32) + self.seen.get(i, 0)
        t = now + self.run_s[i]
        code = self.seq << 32 | i
        if (same := self.departing.get(t)) is None:
            self.departing[t] = code
            heapq.heappush(self.departures, t)
        elif isinstance(same, list):
            same.append(code)
        else:
            self.departing[t] = [same, code]
        self.gang_waiting.pop(i, None)

    def _stopped(self, i: int, node: str | None) -> None:
        """What every pod that stops holding its devices changes here (it left, or it was evicted)."""
        r = self.reqs[i]
        if self.limits is not None:
            self.limits.release(r.key)
        self.used_milli -= self.milli[i]
        self.running_by_prio[r.priority] -= 1
        self.ends.pop(i, None)  # an evicted pod's departure event is stale now
        self.left += 1
        if node is not None:
            self.pending.freed.add(self.state.index[node])

    def release(self, i: int) -> None:
        """Pod i ran its time and leaves."""
        key = self.keys[i]
        a = self.state.assignments.get(key)
        if self.gangs is not None and self.reqs[i].pod_group:
            self.gangs.remove(key)  # as the live loop's drop_pod: forgets its devices too
        else:
            self.sched.forget(key)
        self._stopped(i, a.node if a is not None else None)

    def remove_victims(self, victims: Sequence, kind: str, now: float) -> None:
        """What the live loop's deletions do: the victims leave the snapshot and wait again."""
        for v in victims:
            j = self.by_key[v.pod_key]
            self._stopped(j, v.node)
            self._came(j)
            if self.gangs is not None and self.reqs[j].pod_group:
                self.gangs.remove(v.pod_key)  # forgets its devices
                self.gangs.add(self.reqs[j], now)
                self.gang_waiting[j] = now
            else:
                self.sched.forget(v.pod_key)
                self.pending.requeue(j, self.arrived_at.get(j, now))  # as a new pod: tried against every node
            if v.queue in self.team_preempted:
                (self.team_reclaimed if kind == "reclaimed" else self.team_preempted)[v.queue] += 1
        if kind == "reclaimed":
            self.result.reclaims += len(victims)
        else:
            self.result.preemptions += len(victims)

    # --- the round's ports (engine.round.RoundPort, RoomPort) ----------------------------------------
    def could_fit(self, request: PodRequest) -> bool:
        return self.fit_screen(request)

    def bind(self, attempt: Attempt) -> None:
        self.placed(self._index(attempt.request), self.now, tried=True)
        self.result.held_taken += attempt.held_room

    def wait(self, attempt: Attempt) -> None:
        i = self._index(attempt.request)
        self.pending.failed(i, self.arrived_at.get(i, self.now), attempt.decision.rejected_by)

    def gang_result(self, result: GangResult) -> None:
        """Nothing to report: the replay's gangs have no PodGroup objects."""

    def gang_placed(self, result: GangResult, held_room: bool) -> None:
        for d in result.placed:
            self.placed(self.by_key[d.pod_key], self.now)
        if held_room:
            self.result.held_taken += len(result.placed)

    def gang_waits(self, result: GangResult, until: float | None) -> None:
        """Its members stay in ``gang_waiting``; the gang scheduler keeps them."""

    def hold_ended(self) -> None:
        """Nothing: the pods a hold kept out are tried when the next pod leaves."""

    def lower_priority_running(self, priority: int) -> bool:
        for p, c in self.running_by_prio.items():
            if c and p < priority:
                return True
        return False

    def may_plan(self, room: RoomFor, now: float) -> bool:
        """Only once something it could take came since a plan for its kind failed (``_PlanRation``)."""
        return self.plans.ready(self._plan_key(room), self._plan_epoch(room), now)

    def planned(self, room: RoomFor, now: float, spent_s: float, outcome: str) -> None:
        if outcome == "none":
            self.plans.failed(self._plan_key(room), self._plan_epoch(room), now)

    def victim_options(self) -> dict:
        # ages: the order pods were placed (the live loop: their start times); the snapshot's own order is not
        # it, a dry run that rolls back puts a pod last
        return {"age_rank": {self.reqs[i].key: self.age[i] for i in self.ends}, **candidate_bound(self.sched)}

    def room_coming(self, request: PodRequest) -> str:
        return ""  # nothing comes back on its own: pods leave when they end

    def leaving(self) -> frozenset[str]:
        return frozenset()  # victims leave at once

    def evict(self, attempt: Attempt) -> bool:
        rp = attempt.room
        assert rp is not None
        self.remove_victims(rp.victims, rp.kind, self.now)
        self.pending.nominated.add(attempt.request.key)
        return True

    def evict_for_gang(self, room: RoomFor, plan: Plan) -> bool:
        self.remove_victims(plan.victims, "preempted", self.now)
        return True

    # --- the rounds -------------------------------------------------------------------------------
    def gang_round(self, now: float) -> None:
        """Pod-group members go through the round's ``GangScheduler`` (all or nothing, one holder at a
        time), after the single pods, as in ``SchedulerLoop.schedule_due``."""
        if self.gangs is None or not self.gang_waiting:
            return
        self.now = now
        self.round.gang_round(now)

    def retry(self, now: float) -> None:
        """The waiting pods that what changed may let fit go through the round again (``PendingGroups.retry``)."""
        self.now = now
        self.pending.retry(self.round, now, self._retry_attempt, self._waited if self.hints else None)

    # a retry pass's calls back, at ``self.now`` (bound methods: no two closures made per pass)
    def _retry_attempt(self, i: int, fits: bool | None, plan: bool) -> Attempt:
        return self._attempt(i, self.now, fits, plan)

    def _waited(self, i: int) -> float:
        now = self.now
        return now - self.arrived_at.get(i, now)

    # --- the clock --------------------------------------------------------------------------------
    def on_event(self, kind: int, i: int, now: float) -> None:
        raise ValueError(f"unknown replay event kind {kind}")

    def _came(self, i: int) -> None:
        """Pod i came (or, a victim, its controller's new pod did): the live loop's first sight of it."""
        self.seen_n += 1
        self.seen[i] = self.seen_n

    def arrive(self, i: int, now: float) -> None:
        self.result.pods_arrived += 1
        self._came(i)
        self.arrived_at[i] = now
        r = self.reqs[i]
        if self.gangs is not None and r.pod_group:
            self.gang_waiting[i] = now
            self.gangs.add(r, now)
            return
        self._attempt(i, now)

    def run(self) -> None:
        # pods running when the trace starts: placed first, not measured
        for i0 in np.flatnonzero(~self.measured):
            self.place_initial(int(i0), self.t_first)
        t_first, t_last = self.t_first, self.t_last
        sample_times = list(np.linspace(t_first, t_last, SAMPLES)) if t_last > t_first else [t_first]
        si, last_t, ev, dep, departing, ends = 0, t_first, self.events, self.departures, self.departing, self.ends
        n_samples, w_start, w_end, reqs = len(sample_times), self.w_start, self.w_end, self.reqs
        at, order, na, ai = self.arrival_times, self.arrival_order, len(self.arrival_times), 0
        inf = math.inf
        # the next sample's time as a Python float (numpy's scalars compare slower), inf after the last; the
        # sample itself gets ``sample_times[si]``, as before
        next_sample = float(sample_times[0]) if n_samples else inf
        while dep or ev or ai < na:
            now = min(dep[0] if dep else inf, ev[0][0] if ev else inf, at[ai] if ai < na else inf)
            while next_sample <= now:
                sample(self, sample_times[si])
                si += 1
                next_sample = float(sample_times[si]) if si < n_samples else inf
            lo, hi = max(last_t, w_start), min(now, w_end)
            if hi > lo:
                self.alloc_integral += self.used_milli * (hi - lo)
            last_t = now
            left_any = False
            arrivals: list[int] = []
            while True:  # this time's events: departures, then arrivals, then the others
                if dep and dep[0] == now:
                    heapq.heappop(dep)
                    codes = departing.pop(now)
                    for code in codes if isinstance(codes, list) else (codes,):  # (releasing a pod schedules nothing)
                        i = code & 0xFFFFFFFF
                        if ends.get(i) != code >> 32:
                            continue  # a preempted pod's old departure
                        self.release(i)
                        left_any = True
                elif ev and ev[0][0] == now and (ai == na or at[ai] != now):
                    _, kind, s, i = heapq.heappop(ev)
                    self.on_event(kind, int(i), now)  # other events a subclass scheduled (spot_replay: nodes)
                elif ai < na and at[ai] == now:
                    arrivals.append(order[ai])
                    ai += 1
                else:
                    break
            if left_any:
                self.retry(now)
            for i in arrivals:  # as the live loop: every pod that arrived is learned from before any is tried
                self.sched.observe(reqs[i])
            for i in arrivals:
                self.arrive(i, now)
                if self.progress is not None:
                    self.progress(1)
            if self.pending.freed:  # an arrival's victims left: as the live loop's watch of their deletion, the pods
                self.retry(now)  # that may fit where they were are tried at once
            if left_any or (self.gangs is not None and any(reqs[i].pod_group for i in arrivals)):
                self.gang_round(now)  # (no gang scheduler: no pod has a pod group)
        while si < len(sample_times):
            sample(self, sample_times[si])
            si += 1


__all__ = ["ReplayRun", "paced", "pinned_class", "prepare", "request_class", "run_replay", "stats"]
