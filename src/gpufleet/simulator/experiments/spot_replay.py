"""Replay with spot capacity that comes and goes: high-priority and spot jobs, per-class delay, evictions, cost.

The trace replay's event loop (``simulator.experiments.replay``) with three node events from ``spot_trace.spot_events``: an
interruption *notice* closes the node (nothing new lands there: the live scheduler sees the
``karpenter.sh/disrupted`` taint, the replay holds the node's free room, see ``_fill``) and drains it at once with the live scheduler's plan (``engine.interruption.drain_plan``: every pod, highest priority first, a gang
whole), each moved pod tried again at once in that order; the node is *gone* ``notice_s`` later (anything still
bound to it is evicted and counted: nothing stays bound to a node that is gone); it comes *back* later, empty.

Jobs are the GFS-shaped workload (``spot_trace.jobs``): an organization is a namespace (a team), a multi-worker
job a gang (``gpufleet.io/pod-group``), every pod pinned to its GPU model.  HP jobs have priority 1000 and never go
to spot nodes; Spot jobs have priority 0 and ``gpufleet.io/spot: prefer`` (spot nodes first, on-demand nodes when
spot is full, where an HP pod may preempt them).  An evicted pod starts again from the beginning when it is placed
again (no checkpoints): its partial run is *lost* GPU-hours, paid for and wasted.

Reported per class (HP, Spot): pods, first-placement queueing delay, re-placement delay after an eviction,
evictions by cause (interruption, preemption), completed GPU-hours (runs that reached their end), lost GPU-hours,
GPU-hours on spot and on on-demand nodes, their cost at the price file's prices and what the same GPU-hours cost
on on-demand nodes.  ``run_spot_replay(..., spot_share=0)`` is the same replay with every node on-demand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ...engine.capacity import SpotConfig
from ...engine.framework import Scheduler
from ...engine.interruption import drain_plan
from ...engine.model import GPU_MILLI, Assignment, Gpu, Node, PodRequest, Taint
from ...engine.prices import PriceBook
from ...engine.state import ClusterState
from ...policies import build_profile
from .packing import prime_policy
from .replay import _Replay
from .replay_metrics import ReplayRun, stats, summarize
from ..traces.spot_trace import HP, SPOT, GfsJob, GfsNode, SpotEvent
from ..traces.workload import Workload

HP_PRIORITY, SPOT_PRIORITY = 1000, 0
SPOT_LABELS = {"karpenter.sh/capacity-type": "spot"}
NOTICE_TAINT = Taint("karpenter.sh/disrupted", "", "NoSchedule")
NODE_EVENT = 2  # event kind in the replay's heap (0 departure, 1 arrival)
TIMER_EVENT = 3  # a gang hold's deadline: the live loop's timer, so a hold that times out frees its room
PREFILL = "prefill"  # pods already running at the start: they hold capacity, their figures are not reported
HOLD_NS, HOLD_PRIORITY = "spot-gone", 1 << 30  # what holds a going node's room (never a victim)
GPU_MEMORY_MIB = {"A10": 23028, "A100-SXM4-80GB": 81920, "A800-SXM4-80GB": 81920, "H800": 81559,
                  "GPU-series-1": 32768, "GPU-series-2": 81920}


def engine_node(n: GfsNode) -> Node:
    mem = GPU_MEMORY_MIB.get(n.model, 32768)
    gpus = tuple(Gpu(j, f"{n.name}-gpu{j}", n.model, mem) for j in range(n.gpus))
    labels = {"kubernetes.io/hostname": n.name, **(SPOT_LABELS if n.spot else {})}
    return Node(n.name, n.cpus * 1000, n.cpus * 8 * 1024, gpus, labels)


def job_pods(j: GfsJob) -> list[PodRequest]:
    gang = j.name if j.workers > 1 else None
    if j.gpu_milli_per_worker >= GPU_MILLI:
        count, milli = j.gpu_milli_per_worker // GPU_MILLI, GPU_MILLI
    else:
        count, milli = 1, j.gpu_milli_per_worker
    return [PodRequest(name=f"{j.name}-w{k}", namespace=j.org, cpu_milli=j.cpus_per_worker * 1000, gpu_count=count,
                       gpu_milli=milli, gpu_models_allow=frozenset({j.model}),
                       priority=HP_PRIORITY if j.kind == HP else SPOT_PRIORITY, pod_group=gang,
                       pod_group_min=j.workers if gang else 0, spot="prefer" if j.kind == SPOT else None)
            for k in range(j.workers)]


def workload(jobs: Sequence[GfsJob]) -> tuple[Workload, list[str]]:
    """Pods of the jobs; a job submitted before the start (``submit_s`` < 0) runs at it for what it has left, and is
    not measured (its class is ``prefill``)."""
    reqs, arr, run, kinds = [], [], [], []
    for j in jobs:
        for r in job_pods(j):
            if j.submit_s < 0:  # already running: its gang was placed long ago, its members leave one by one
                r = replace(r, pod_group=None, pod_group_min=0)
            reqs.append(r)
            arr.append(j.submit_s if j.submit_s >= 0 else np.nan)
            run.append(j.duration_s if j.submit_s >= 0 else j.submit_s + j.duration_s)
            kinds.append(j.kind if j.submit_s >= 0 else PREFILL)
    n = len(reqs)
    return Workload(reqs, np.array(arr, dtype=float), np.array(run, dtype=float), np.full(n, np.nan)), kinds


@dataclass
class ClassFigures:
    pods: int = 0
    delays_s: list[float] = field(default_factory=list)  # first placement
    replace_delays_s: list[float] = field(default_factory=list)  # placed again after an eviction
    interrupted: int = 0  # evictions by an interruption notice (or their gang's)
    evicted_pods: set[str] = field(default_factory=set)  # pods evicted at least once, for any cause
    preempted: int = 0  # pods evicted for higher-priority pods
    completed_gpu_h: float = 0.0
    lost_gpu_h: float = 0.0  # runs cut short by an eviction: paid for, to be run again
    unfinished_gpu_h: float = 0.0  # runs still going when the replay ends
    spot_gpu_h: float = 0.0
    on_demand_gpu_h: float = 0.0
    cost: float = 0.0
    cost_all_on_demand: float = 0.0
    unpriced_gpu_h: float = 0.0
    never_placed: int = 0

    def to_json(self) -> dict:
        return {"pods": self.pods, "queue_delay_s": stats(self.delays_s), "replacement_delay_s": stats(self.replace_delays_s),
                "evicted_by_interruption": self.interrupted, "evicted_by_preemption": self.preempted,
                "evicted_pod_share": round(len(self.evicted_pods) / self.pods, 4) if self.pods else 0.0,
                "completed_gpu_hours": round(self.completed_gpu_h, 3), "lost_gpu_hours": round(self.lost_gpu_h, 3),
                "unfinished_gpu_hours": round(self.unfinished_gpu_h, 3),
                "spot_gpu_hours": round(self.spot_gpu_h, 3), "on_demand_gpu_hours": round(self.on_demand_gpu_h, 3),
                "cost": round(self.cost, 2), "cost_all_on_demand": round(self.cost_all_on_demand, 2),
                "saving_pct": round(100.0 * (1 - self.cost / self.cost_all_on_demand), 2) if self.cost_all_on_demand else 0.0,
                "unpriced_gpu_hours": round(self.unpriced_gpu_h, 3), "never_placed": self.never_placed}


@dataclass
class SpotRun:
    replay: ReplayRun
    spot_share: float
    spot_nodes: int
    node_events: dict[str, int]
    classes: dict[str, ClassFigures]
    currency: str
    leftover_on_gone_nodes: int  # pods still bound to a node when it went (must be 0)
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return {"experiment": "spot", "spot_share": self.spot_share, "spot_nodes": self.spot_nodes,
                "node_events": self.node_events, "currency": self.currency,
                "leftover_on_gone_nodes": self.leftover_on_gone_nodes, "wall_s": self.wall_s,
                "classes": {k: v.to_json() for k, v in self.classes.items() if k != PREFILL},
                "prefill": {"pods": self.classes[PREFILL].pods, "not_placed": self.classes[PREFILL].never_placed},
                "replay": {k: v for k, v in self.replay.to_json().items()
                           if k in ("policy", "seed", "load", "offered_load", "nodes", "gpus", "busy_window_h",
                                    "pods_arrived", "pods_placed", "mean_gpu_alloc_pct", "preemptions")}}


class _SpotReplay(_Replay):
    """The trace replay plus node events, per-class accounting and prices."""

    def __init__(self, *a, kinds: list[str], events: Sequence[SpotEvent], prices: PriceBook, spot_cfg: SpotConfig, **kw) -> None:
        super().__init__(*a, **kw)
        self.kinds, self.node_events, self.prices, self.spot_cfg = kinds, list(events), prices, spot_cfg
        self.clean = {n.name: n for n in self.state.nodes}
        self.cls = {HP: ClassFigures(), SPOT: ClassFigures(), PREFILL: ClassFigures()}
        for kind in kinds:
            self.cls[kind].pods += 1
        self.started: dict[int, tuple[float, str]] = {}  # pod -> (start, node)
        self.ever_placed: set[int] = set()
        self.timers: set[float] = set()
        self.evicted_at: dict[int, float] = {}
        self.cause = ""
        self.leftover = 0
        self.counts = {"notice": 0, "gone": 0, "back": 0}
        for k, e in enumerate(self.node_events):
            self.seq += 1
            self.events.append((e.t_s + self.t_first, NODE_EVENT, self.seq, k))
        import heapq

        heapq.heapify(self.events)

    # --- accounting ---------------------------------------------------------------------------------
    def _segment(self, i: int, now: float, how: str) -> None:
        """Pod i stops holding its devices at ``now``: its run so far is ``done``, ``lost`` or ``unfinished``."""
        s = self.started.pop(i, None)
        if s is None:
            return
        start, node = s
        r, f = self.reqs[i], self.cls[self.kinds[i]]
        gpu_h = r.total_gpu_milli / GPU_MILLI * max(0.0, now - start) / 3600.0
        n = self.clean[node]
        spot = self.spot_cfg.is_spot(n.labels)
        model = n.gpus[0].model if n.gpus else ""
        p = self.prices.price(node, "", model, spot).per_gpu_hour
        od = self.prices.price(node, "", model, False).per_gpu_hour
        if spot:
            f.spot_gpu_h += gpu_h
        else:
            f.on_demand_gpu_h += gpu_h
        if p is None or od is None:
            f.unpriced_gpu_h += gpu_h
        else:
            f.cost += p * gpu_h
            f.cost_all_on_demand += od * gpu_h
        if how == "done":
            f.completed_gpu_h += gpu_h
        elif how == "lost":
            f.lost_gpu_h += gpu_h
        else:
            f.unfinished_gpu_h += gpu_h

    def placed(self, i: int, now: float, tried: bool = False) -> None:
        first = np.isnan(self.delays[i])
        super().placed(i, now, tried)
        a = self.state.assignments.get(self.reqs[i].key)
        if a is not None:
            self.started[i] = (now, a.node)
        self.ever_placed.add(i)
        f = self.cls[self.kinds[i]]
        if first and i in self.arrived_at and self.w_start <= self.arrived_at[i] <= self.w_end:  # busy window only
            f.delays_s.append(now - self.arrived_at[i])
        elif i in self.evicted_at:
            f.replace_delays_s.append(now - self.evicted_at.pop(i))

    def release(self, i: int) -> None:
        s = self.started.get(i)
        if s is not None:  # it ran its time: its departure is its start + its run time
            self._segment(i, s[0] + float(self.wl.run_s[i]), "done")
        super().release(i)

    def remove_victims(self, victims: Sequence, kind: str, now: float) -> None:
        for v in victims:
            j = self.by_key[v.pod_key]
            self._segment(j, now, "lost")
            self.evicted_at[j] = now
            f = self.cls[self.kinds[j]]
            f.evicted_pods.add(v.pod_key)
            if kind == "interrupted":
                f.interrupted += 1
            else:
                f.preempted += 1
        super().remove_victims(victims, kind, now)
        if kind == "interrupted":
            self.result.preemptions -= len(victims)  # the base counts every non-reclaim eviction as a preemption

    # --- node events --------------------------------------------------------------------------------
    def _fill(self, node: str) -> None:
        """Hold all that is free on a going or gone node: nothing new lands there.  The replay does this rather than
        taint the node (what the live scheduler sees), which would rebuild the snapshot and drop every score cache
        at each of thousands of node events; for placement the two are the same."""
        i = self.state.index[node]
        n = self.state.nodes[i]
        gpus = tuple(g.index for g in n.gpus if self.state.gpu_free_milli[i, g.index] == GPU_MILLI)
        a = Assignment(f"{HOLD_NS}/{node}", node, int(self.state.cpu_free[i]), int(self.state.mem_free[i]), gpus,
                       GPU_MILLI if gpus else 0, tuple(int(self.state.gpu_mem_cap[i, j]) for j in gpus), priority=HOLD_PRIORITY)
        self.state.reserve(a)

    def gang_round(self, now: float) -> None:
        super().gang_round(now)
        if self.gangs is not None:
            d = self.gangs.hold_deadline()
            if d is not None and d > now and d not in self.timers:
                import heapq

                self.timers.add(d)
                self.seq += 1
                heapq.heappush(self.events, (d + 1e-6, TIMER_EVENT, self.seq, -1))

    def on_event(self, kind: int, k: int, now: float) -> None:
        if kind == TIMER_EVENT:
            self.timers.discard(now - 1e-6)
            self.retry(now)
            self.gang_round(now)
            return
        e = self.node_events[k]
        self.counts[e.kind] += 1
        hold = f"{HOLD_NS}/{e.node}"
        if e.kind == "notice":
            if hold in self.state.assignments:
                return
            plan = drain_plan(self.state, {e.node: f"taint {NOTICE_TAINT.key}"})
            self.remove_victims([self.state.assignments[m.pod_key] for m in plan], "interrupted", now)
            self._fill(e.node)
            self.pending.freed.discard(self.state.index[e.node])
            for m in plan:  # placed again at once, highest priority first; gangs through the gang round
                j = self.by_key[m.pod_key]
                if not self.reqs[j].pod_group and j in self.pending:
                    self._attempt(j, now)  # the shared round: placed, or room made for it
            if any(m.group for m in plan):
                self.gang_round(now)
        elif e.kind == "gone":
            left = [self.state.assignments[x] for x in sorted(self.state.pods_on_node.get(e.node, ())) if x != hold]
            self.leftover += len(left)  # nothing may still be bound to a node that is gone
            if left:
                self.remove_victims(left, "interrupted", now)
        else:  # back, empty
            if self.state.unreserve(hold) is None:
                return
            self.pending.freed.add(self.state.index[e.node])
            self.retry(now)
            models = {g.model for g in self.clean[e.node].gpus}
            if any((allow := self.reqs[j].gpu_models_allow) is None or allow & models for j in self.gang_waiting):
                self.gang_round(now)  # only gangs that could use the node (every trace pod is pinned to its model)


def run_spot_replay(nodes: Sequence[GfsNode], jobs: Sequence[GfsJob], events: Sequence[SpotEvent], prices: PriceBook,
                    policy: str = "default", seed: int = 42, load: float | None = None, warmup: float = 0.1) -> SpotRun:
    """One replay of ``jobs`` on ``nodes`` with the spot ``events`` (see the module docstring)."""
    t0 = time.perf_counter()
    wl, kinds = workload(jobs)
    engine_nodes = [engine_node(n) for n in nodes]
    cap = sum(len(n.gpus) for n in engine_nodes)
    if load is not None:
        wl, _ = wl.at_load(load, cap, warmup, copies=1)
    state = ClusterState(engine_nodes)
    sched = Scheduler(build_profile(policy), state, seed=seed)
    prime_policy(sched, list(wl.requests))
    run = ReplayRun(policy=policy, seed=seed, trace="gfs-shaped", load=load, offered_load=round(wl.offered_load(cap, warmup), 4),
                    nodes=len(engine_nodes), gpus=cap, warmup=warmup)
    rp = _SpotReplay(wl, list(wl.requests), sched, None, None, run, None, True, None, kinds=kinds, events=events,
                     prices=prices, spot_cfg=prices.spot)
    run.busy_window_h = [round((rp.w_start - rp.t_first) / 3600, 4), round((rp.w_end - rp.t_first) / 3600, 4)]
    rp.run()
    summarize(rp)
    end = max(rp.t_last, max((e.t_s + rp.t_first for e in events), default=rp.t_last))
    for i in list(rp.started):  # still running at the end: what ran so far is paid for, not completed (yet)
        rp._segment(i, min(end, rp.started[i][0] + float(rp.wl.run_s[i])), "unfinished")
    for i in np.flatnonzero(~rp.measured).tolist():
        if i not in rp.ever_placed:
            rp.cls[PREFILL].never_placed += 1  # the cluster could not hold all that was running at the start
    for i in rp.pending.queued:
        rp.cls[kinds[i]].never_placed += 1
    for i in rp.gang_waiting:
        rp.cls[kinds[i]].never_placed += 1
    out = SpotRun(run, sum(1 for n in nodes if n.spot) / max(1, len(nodes)), sum(1 for n in nodes if n.spot), rp.counts,
                  rp.cls, prices.currency, rp.leftover)
    out.wall_s = round(time.perf_counter() - t0, 3)
    return out
