"""Replay with team queues: quotas, borrowing, fair share and reclaim, on the simulated clock.

Why: quotas and fair share are only worth their complexity if, on a real
workload, teams get their share quickly while idle GPUs still get used.  Pods
of the trace are given to synthetic teams by a stable hash of their name (same
team on every run); each team's queue gets a configurable share of the
cluster's GPUs as nominal quota (equal shares by default) and may borrow idle
quota, optionally up to a borrowing limit.  Pods arrive at ``creation_time``
and leave at ``deletion_time`` (the trace's clock, as in ``replay``); waiting
pods are retried in weighted-DRF order whenever a pod leaves.  A waiting pod
within its team's quota that does not fit reclaims borrowed GPUs: the engine's
reclaim planner preempts other teams' borrowed pods (lowest priority, youngest
first), which go back to waiting.

Reported per queue: queueing delay (arrival to first placement), share of the
cluster's GPUs over time, preemptions suffered; overall: GPU allocation over
time and Jain's fairness index of each team's allocation relative to its
weighted max-min fair share given its demand (1 = every team with demand gets
its fair share).
"""

from __future__ import annotations

import heapq
import html
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from ...engine.framework import Scheduler
from ...engine.model import Node
from ...engine.plugins.queuequota import QueueQuota
from ...engine.queues import Queue, QueueTree, apply_reclaim
from ...engine.state import ClusterState
from ...policies import build_profile
from ..traces.trace import TracePod, TraceError

SAMPLES = 300


def jain(x: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1 = all equal."""
    a = np.asarray(list(x), dtype=float)
    if a.size == 0 or not a.any():
        return 1.0
    return float(a.sum() ** 2 / (a.size * (a ** 2).sum()))


def fair_shares(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity`` (water-filling): no team gets more than it asks."""
    out = {k: 0.0 for k in demand}
    left = capacity
    active = {k for k, d in demand.items() if d > 0}
    while active and left > 1e-9:
        wsum = sum(weight[k] for k in active)
        step = {k: left * weight[k] / wsum for k in active}
        done = {k for k in active if out[k] + step[k] >= demand[k]}
        if not done:
            for k in active:
                out[k] += step[k]
            break
        for k in done:
            left -= demand[k] - out[k]
            out[k] = demand[k]
        active -= done
    return out


def team_of(name: str, teams: Sequence[str]) -> str:
    """A pod's synthetic team: stable across runs and machines (crc32, not Python's hash)."""
    return teams[zlib.crc32(name.encode()) % len(teams)]


@dataclass
class QueueReplayRun:
    policy: str
    teams: list[str]
    seed: int = 42
    quota_pct: dict[str, float] = field(default_factory=dict)
    borrowing_limit_pct: float | None = None
    t_h: list[float] = field(default_factory=list)
    share_pct: dict[str, list[float]] = field(default_factory=dict)
    gpu_alloc_pct: list[float] = field(default_factory=list)
    jain: list[float] = field(default_factory=list)
    delay_s: dict[str, dict[str, float]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    never_placed: dict[str, int] = field(default_factory=dict)
    mean_gpu_alloc_pct: float = 0.0
    mean_jain: float = 1.0
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__, experiment="queues")


def run_queue_replay(nodes: Sequence[Node], pods: Sequence[TracePod], policy: str = "default", teams: int = 3,
                     speedup: float = 1.0, seed: int = 42, quotas: Sequence[float] | None = None,
                     borrowing_limit_pct: float | None = None, reclaim: bool = True) -> QueueReplayRun:
    """``quotas``: each team's nominal share of the cluster's GPUs (fractions; default equal);
    ``borrowing_limit_pct``: how much more (% of the cluster's GPUs) a team may borrow (None: no limit);
    ``reclaim``: preempt borrowed pods for a team within its quota."""
    t0 = time.perf_counter()
    if teams < 1:
        raise ValueError("teams must be >= 1")
    if speedup <= 0:
        raise ValueError("speedup must be > 0")
    for p in pods:
        if p.creation_time is None:
            raise TraceError("trace", 0, "creation_time", f"pod {p.name} has no creation_time; the queues experiment needs the 11-column trace")
    names = [f"team-{chr(97 + i)}" for i in range(teams)]
    fr = list(quotas) if quotas is not None else [1.0 / teams] * teams
    if len(fr) != teams or any(q < 0 for q in fr):
        raise ValueError(f"quotas: need {teams} non-negative fractions, got {fr}")
    state = ClusterState(nodes)
    cap = max(state.total_gpu_milli(), 1)
    borrow = {} if borrowing_limit_pct is None else {"gpu_milli": int(cap * borrowing_limit_pct / 100)}
    weight = {n: max(1, round(f * 100)) for n, f in zip(names, fr)}
    tree = QueueTree([Queue(n, {"gpu_milli": int(cap * f)}, dict(borrow), weight[n]) for n, f in zip(names, fr)], state)
    prof = build_profile(policy)
    qq = QueueQuota(tree)
    prof.pre_filters = [qq] + list(prof.pre_filters)
    prof.reserves = [qq] + list(prof.reserves)
    sched = Scheduler(prof, state, seed=seed)
    base = min(int(p.creation_time or 0) for p in pods) if pods else 0

    def squeeze(p: TracePod) -> TracePod:
        c = base + int((int(p.creation_time or 0) - base) / speedup)
        d = None if p.deletion_time is None else c + (int(p.deletion_time) - int(p.creation_time or 0))
        return replace(p, creation_time=c, deletion_time=d)

    pods = [squeeze(p) for p in pods] if speedup != 1.0 else list(pods)
    reqs = {p.name: replace(p.request(), queue=team_of(p.name, names)) for p in pods}
    # events: (time, kind, seq, name); departures (0) before arrivals (1) at equal times
    ev: list[tuple[int, int, int, str]] = []
    for i, p in enumerate(pods):
        ev.append((int(p.creation_time or 0), 1, i, p.name))
        if p.deletion_time is not None:
            ev.append((max(int(p.deletion_time), int(p.creation_time or 0)), 0, i, p.name))
    heapq.heapify(ev)
    arrived: dict[str, int] = {}
    pending: dict[str, None] = {}  # insertion-ordered set
    ever_placed: set[str] = set()
    delays: dict[str, list[float]] = {n: [] for n in names}
    run = QueueReplayRun(policy, names, seed, {n: round(100 * f, 2) for n, f in zip(names, fr)}, borrowing_limit_pct,
                         share_pct={n: [] for n in names}, preemptions={n: 0 for n in names}, never_placed={n: 0 for n in names})
    t_end = max((int(p.creation_time or 0) for p in pods), default=base)
    step = max((t_end - base) / SAMPLES, 1.0)
    next_sample = float(base)

    def place(name: str, now: int, try_reclaim: bool) -> bool:
        r = reqs[name]
        waited_s = float(now - arrived.get(name, now))  # the default's CPU reserve lets a pod in after a while
        if sched.schedule(r, waited_s=waited_s).ok:
            placed(name, now)
            return True
        if not (reclaim and try_reclaim and r.gpu_count):
            return False
        plan = tree.plan_reclaim(sched, r)
        if plan is None:
            return False
        apply_reclaim(sched, plan)
        for v in plan.victims:
            run.preemptions[v.queue] += 1  # type: ignore[index]
            pending[v.pod_key.split("/", 1)[1]] = None  # back to waiting
        if sched.schedule(r, waited_s=waited_s, take_held=True).ok:  # as the plan's dry run
            placed(name, now)
            return True
        return False  # pragma: no cover - the plan was checked against this state

    def placed(name: str, now: int) -> None:
        pending.pop(name, None)
        if name not in ever_placed:
            ever_placed.add(name)
            delays[reqs[name].queue].append(float(now - arrived[name]))  # type: ignore[index]

    def retry(now: int) -> None:
        failed: set = set()
        reclaim_tried: set = set()
        for r in tree.order([reqs[n] for n in pending]):
            shape = (r.queue, r.shape())
            if shape in failed or r.name not in pending:
                continue
            ok = place(r.name, now, try_reclaim=r.queue not in reclaim_tried)
            if not ok:
                failed.add(shape)
                reclaim_tried.add(r.queue)  # one reclaim attempt per team per round

    def sample(t: float) -> None:
        use = tree.usage()
        run.t_h.append(round((t - base) / 3600, 3))
        alloc = {n: use[n].get("gpu_milli", 0) for n in names}
        demand = dict(alloc)
        for n in pending:
            demand[reqs[n].queue] += reqs[n].total_gpu_milli  # type: ignore[index]
        for n in names:
            run.share_pct[n].append(round(100 * alloc[n] / cap, 3))
        run.gpu_alloc_pct.append(round(100 * sum(alloc.values()) / cap, 3))
        fair = fair_shares(cap, demand, weight)
        run.jain.append(round(jain([alloc[n] / fair[n] for n in names if fair[n] > 0]), 4))

    while ev:
        now, kind, _, name = heapq.heappop(ev)
        while next_sample <= min(now, t_end):
            sample(next_sample)
            next_sample += step
        if kind == 0:
            key = reqs[name].key
            if key in state.assignments:
                sched.forget(key)
                retry(now)
            elif name in pending:  # its time in the trace ran out while it waited
                del pending[name]
                if name not in ever_placed:
                    run.never_placed[reqs[name].queue] += 1  # type: ignore[index]
        else:
            arrived[name] = now
            if not place(name, now, try_reclaim=True):
                pending[name] = None
    for n in pending:
        if n not in ever_placed:
            run.never_placed[reqs[n].queue] += 1  # type: ignore[index]
    for n in names:
        a = np.asarray(delays[n]) if delays[n] else np.zeros(1)
        run.delay_s[n] = {"mean": round(float(a.mean()), 2), "p50": round(float(np.percentile(a, 50)), 2),
                          "p99": round(float(np.percentile(a, 99)), 2), "placed": len(delays[n])}
    run.mean_gpu_alloc_pct = round(float(np.mean(run.gpu_alloc_pct)), 3) if run.gpu_alloc_pct else 0.0
    run.mean_jain = round(float(np.mean(run.jain)), 4) if run.jain else 1.0
    run.wall_s = round(time.perf_counter() - t0, 3)
    return run


def report_section(run: QueueReplayRun) -> list[tuple[str, str]]:
    """(heading, HTML body) pairs for ``simulator.report.plots.write_report``."""
    from ..report.plots import table_html, time_plot

    rows = [[n, run.quota_pct.get(n, ""), run.delay_s[n]["placed"], run.delay_s[n]["mean"], run.delay_s[n]["p99"],
             run.preemptions[n], run.never_placed[n], round(float(np.mean(run.share_pct[n])), 2) if run.share_pct[n] else 0.0]
            for n in run.teams]
    borrow = "no limit" if run.borrowing_limit_pct is None else f"{run.borrowing_limit_pct}% of the cluster"
    body = (f"<p class='note'>Teams by hash of pod name; quota = % of cluster GPUs; borrowing: {borrow}. "
            f"Mean GPU allocation {run.mean_gpu_alloc_pct:.2f}%, mean Jain's index {run.mean_jain:.3f}, "
            f"{sum(run.preemptions.values())} preemptions by reclaim.</p>")
    body += table_html(["queue", "quota %", "placed", "delay mean s", "delay p99 s", "preempted", "never placed",
                        "mean share %"], rows)
    series = {n: {"t_h": run.t_h, "share": run.share_pct[n]} for n in run.teams}
    series_all = {"GPU allocation": {"t_h": run.t_h, "v": run.gpu_alloc_pct}}
    series_j = {"Jain's index": {"t_h": run.t_h, "v": run.jain}}
    body += "<div class='grid'>" + time_plot(series, "share", "share of cluster GPUs (%)", "Queue shares over time")
    body += time_plot(series_all, "v", "allocated GPUs (%)", "GPU allocation")
    body += time_plot(series_j, "v", "Jain's index (vs. weighted fair share)", "Fairness") + "</div>"
    return [(f"Team queues ({run.policy}, seed {run.seed})", body)]


def report_html(run: QueueReplayRun) -> str:
    """One self-contained ``<section>`` (inline SVG plots) to paste into any report page."""
    return "".join(f"<section><h2>{html.escape(h)}</h2>{b}</section>" for h, b in report_section(run))


__all__ = ["QueueReplayRun", "fair_shares", "jain", "report_html", "report_section", "run_queue_replay", "team_of"]
