"""Replay with team queues: quotas, borrowing, fair share and reclaim, on the simulated clock.

Pods of the trace are given to ``teams`` synthetic teams (by a stable hash of
the pod name); each team's queue gets an equal nominal share of the cluster's
GPUs and may borrow idle quota.  Waiting pods are served in dominant-resource-
fair order (``QueueTree.order``).  When a pod that is within its team's quota
cannot be placed, pods that *borrowed* (other teams over their quota) are
reclaimed -- preempted, lowest priority and youngest first -- until it fits;
they go back to waiting.  Reported per queue: queueing delay, share of the
cluster over time, preemptions; overall: GPU utilisation and Jain's fairness
index of the teams' quota-normalised shares while they have demand.
"""

from __future__ import annotations

import heapq
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ..engine.framework import Scheduler
from ..engine.model import Node
from ..engine.queues import Queue, QueueQuota, QueueTree
from ..engine.state import ClusterState
from ..policies import build_profile
from .trace import TracePod

SAMPLES = 300


def jain(x: Sequence[float]) -> float:
    a = np.asarray([v for v in x], dtype=float)
    if a.size == 0 or not a.any():
        return 1.0
    return float(a.sum() ** 2 / (a.size * (a ** 2).sum()))


@dataclass
class QueueReplayRun:
    policy: str
    teams: list[str]
    seed: int = 42
    t_h: list[float] = field(default_factory=list)
    share_pct: dict[str, list[float]] = field(default_factory=dict)
    gpu_alloc_pct: list[float] = field(default_factory=list)
    jain: list[float] = field(default_factory=list)
    delay_s: dict[str, dict[str, float]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    never_placed: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__, experiment="queues")


def run_queue_replay(nodes: Sequence[Node], pods: Sequence[TracePod], policy: str = "default", teams: int = 3,
                     speedup: float = 1.0, seed: int = 42) -> QueueReplayRun:
    t0 = time.perf_counter()
    names = [f"team-{chr(97 + i)}" for i in range(teams)]
    state = ClusterState(nodes)
    cap = max(state.total_gpu_milli(), 1)
    tree = QueueTree([Queue(n, {"gpu_milli": cap // teams}) for n in names], state)
    prof = build_profile(policy)
    prof.pre_filters = [QueueQuota(tree)] + list(prof.pre_filters)
    sched = Scheduler(prof, state, seed=seed)
    base = min(int(p.creation_time or 0) for p in pods)
    team_of = {p.name: names[zlib.crc32(p.name.encode()) % teams] for p in pods}

    def squeeze(p: TracePod) -> TracePod:
        c = base + int((int(p.creation_time or 0) - base) / speedup)
        d = None if p.deletion_time is None else c + (int(p.deletion_time) - int(p.creation_time or 0))
        return replace(p, creation_time=c, deletion_time=d)

    pods = [squeeze(p) for p in pods]
    reqs = {p.name: replace(p.request(), queue=team_of[p.name]) for p in pods}
    ev: list[tuple[int, int, int, str]] = [(int(p.creation_time or 0), 1, i, p.name) for i, p in enumerate(pods)]
    heapq.heapify(ev)
    end_of = {p.name: p.deletion_time for p in pods}
    arrived: dict[str, int] = {}
    run_ends: dict[str, int] = {}  # name -> scheduled end (for evicted pods re-queued)
    pending: list[str] = []
    delays: dict[str, list[float]] = {n: [] for n in names}
    run = QueueReplayRun(policy, names, seed, share_pct={n: [] for n in names}, preemptions={n: 0 for n in names},
                         never_placed={n: 0 for n in names})
    t_end = max(int(p.creation_time or 0) for p in pods)
    step = max((t_end - base) / SAMPLES, 1.0)
    next_sample = float(base)
    seq = len(pods)

    def place(name: str, now: int) -> bool:
        nonlocal seq
        r = reqs[name]
        d = sched.schedule(r)
        if not d.ok:
            if "QueueQuota" in (d.status.plugin or "") or r.gpu_count == 0:
                return False
            # within quota but no room: reclaim from teams that borrowed
            if tree.admit(r).ok and tree.usage()[r.queue].get("gpu_milli", 0) + r.total_gpu_milli <= tree.queues[r.queue].quota["gpu_milli"]:
                for victim in tree.borrowed():
                    if victim.queue == r.queue:
                        continue
                    sched.forget(victim.pod_key)
                    vname = victim.pod_key.split("/", 1)[1]
                    run.preemptions[victim.queue] += 1  # type: ignore[index]
                    pending.append(vname)
                    if sched.schedule(r).ok:
                        break
                else:
                    return False
                if r.key not in state.assignments:
                    return False
            else:
                return False
        delays[r.queue].append(float(now - arrived[name]))  # type: ignore[index]
        end = end_of[name]
        if end is not None:
            seq += 1
            heapq.heappush(ev, (max(int(end), now), 0, seq, name))
        return True

    def retry(now: int) -> None:
        if not pending:
            return
        order = tree.order([reqs[n] for n in pending])
        keep = []
        failed = set()
        for r in order:
            n = r.name
            if end_of[n] is not None and int(end_of[n]) <= now:
                run.never_placed[r.queue] += 1  # type: ignore[index]
                continue
            shape = (r.queue, r.shape())
            if shape in failed or not place(n, now):
                failed.add(shape)
                keep.append(n)
        pending[:] = keep

    while ev:
        now, kind, _, name = heapq.heappop(ev)
        while next_sample <= min(now, t_end):
            use = tree.usage()
            run.t_h.append(round((next_sample - base) / 3600, 3))
            shares = []
            for n in names:
                u = use[n].get("gpu_milli", 0)
                run.share_pct[n].append(round(100 * u / cap, 3))
                if u or any(reqs[p].queue == n for p in pending):
                    shares.append(u / tree.queues[n].quota["gpu_milli"])
            run.gpu_alloc_pct.append(round(100 * sum(use[n].get("gpu_milli", 0) for n in names) / cap, 3))
            run.jain.append(round(jain(shares), 4))
            next_sample += step
        if kind == 0:
            key = reqs[name].key
            if key in state.assignments:
                sched.forget(key)
                retry(now)
        else:
            arrived[name] = now
            if not place(name, now):
                pending.append(name)
    for n in pending:
        run.never_placed[reqs[n].queue] += 1  # type: ignore[index]
    for n in names:
        a = np.asarray(delays[n]) if delays[n] else np.zeros(1)
        run.delay_s[n] = {"mean": round(float(a.mean()), 2), "p50": round(float(np.percentile(a, 50)), 2),
                          "p99": round(float(np.percentile(a, 99)), 2), "placed": len(delays[n])}
    run.wall_s = round(time.perf_counter() - t0, 3)
    return run


def report_section(run: QueueReplayRun) -> list[tuple[str, str]]:
    from .report import table_html, time_plot

    rows = [[n, run.delay_s[n]["placed"], run.delay_s[n]["mean"], run.delay_s[n]["p99"], run.preemptions[n], run.never_placed[n]]
            for n in run.teams]
    series = {n: {"t_h": run.t_h, "share": run.share_pct[n]} for n in run.teams}
    series_all = {"GPU allocation": {"t_h": run.t_h, "v": run.gpu_alloc_pct}}
    series_j = {"Jain's index": {"t_h": run.t_h, "v": run.jain}}
    body = table_html(["queue", "placed", "delay mean s", "delay p99 s", "preempted", "never placed"], rows)
    body += "<div class='grid'>" + time_plot(series, "share", "share of cluster GPUs (%)", "Queue shares over time")
    body += time_plot(series_all, "v", "allocated GPUs (%)", "GPU allocation") + time_plot(series_j, "v", "Jain's index", "Fairness") + "</div>"
    return [(f"Team queues ({run.policy})", body)]
