"""Replay experiment: pods arrive at ``creation_time`` and leave at ``deletion_time``.

A discrete-event loop on a simulated clock (no sleeping, no polling): at each
arrival the pod gets one scheduling cycle; if it does not fit it waits and is
retried, in arrival order, whenever a pod leaves -- like kube-scheduler's
unschedulable queue, which is flushed on cluster events.  A waiting pod whose
time in the trace is up leaves the queue unplaced.  Within one retry round a
shape that failed is not tried again: resources only shrink while the round
places pods, so it would fail again.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..engine.framework import Scheduler
from ..engine.model import Node
from ..engine.state import ClusterState
from ..policies import build_profile
from .packing import prime_policy
from .trace import TracePod, TraceError

SAMPLES = 400


@dataclass
class ReplayRun:
    policy: str
    seed: int
    trace: str
    t_h: list[float] = field(default_factory=list)
    gpu_alloc_pct: list[float] = field(default_factory=list)
    pending_pods: list[int] = field(default_factory=list)
    queue_delay_s: dict[str, float] = field(default_factory=dict)
    pods_arrived: int = 0
    pods_placed: int = 0
    pods_never_placed: int = 0
    mean_gpu_alloc_pct: float = 0.0
    wall_s: float = 0.0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["experiment"] = "replay"
        return d


def run_replay(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str,
    seed: int = 42,
    trace_name: str = "",
    progress: Callable[[int], None] | None = None,
    speedup: float = 1.0,
) -> ReplayRun:
    """``speedup`` > 1 compresses the gaps between arrivals (not the pods' run times) to raise the load."""
    t0 = time.perf_counter()
    for p in pods:
        if p.creation_time is None:
            raise TraceError(trace_name or "trace", 0, "creation_time", f"pod {p.name} has no creation_time; the replay experiment needs the 11-column trace")
    if speedup <= 0:
        raise ValueError("speedup must be > 0")
    if speedup != 1.0 and pods:
        from dataclasses import replace

        base = min(int(p.creation_time) for p in pods)  # type: ignore[arg-type]

        def squeeze(p: TracePod) -> TracePod:
            c = base + int((int(p.creation_time) - base) / speedup)  # type: ignore[arg-type]
            d = None if p.deletion_time is None else c + (int(p.deletion_time) - int(p.creation_time))  # type: ignore[arg-type]
            return replace(p, creation_time=c, deletion_time=d)

        pods = [squeeze(p) for p in pods]
    state = ClusterState(nodes)
    sched = Scheduler(build_profile(policy), state, seed=seed)
    prime_policy(sched, [p.request() for p in pods])
    capacity = max(state.total_gpu_milli(), 1)

    # events: (time, kind, seq, pod index); kind 0 = departure before 1 = arrival at equal times
    ev: list[tuple[int, int, int, int]] = []
    for i, p in enumerate(pods):
        heapq.heappush(ev, (int(p.creation_time), 1, i, i))  # type: ignore[arg-type]
    t_start = min(int(p.creation_time) for p in pods) if pods else 0  # type: ignore[arg-type]
    t_end = max(int(p.creation_time) for p in pods) if pods else 0  # type: ignore[arg-type]  # report the arrival window
    sample_every = max((t_end - t_start) / SAMPLES, 1.0)
    next_sample = float(t_start)

    pending: deque[int] = deque()
    placed_at: dict[int, int] = {}
    delays: list[float] = []
    never = 0
    used = 0
    run = ReplayRun(policy=policy, seed=seed, trace=trace_name)
    seq = len(pods)

    def try_place(i: int, now: int) -> bool:
        nonlocal used, seq
        req = pods[i].request()
        dec = sched.schedule(req)
        if not dec.ok:
            return False
        used += req.total_gpu_milli
        placed_at[i] = now
        delays.append(float(now - int(pods[i].creation_time)))  # type: ignore[arg-type]
        end = pods[i].deletion_time
        if end is not None:
            seq += 1
            heapq.heappush(ev, (max(int(end), now), 0, seq, i))
        return True

    def retry(now: int) -> None:
        nonlocal never
        failed_shapes: set = set()
        keep: deque[int] = deque()
        while pending:
            i = pending.popleft()
            p = pods[i]
            if p.deletion_time is not None and int(p.deletion_time) <= now:
                never += 1  # its time in the trace ran out while it waited
                continue
            shape = p.request().shape()
            if shape in failed_shapes or not try_place(i, now):
                failed_shapes.add(shape)
                keep.append(i)
        pending.extend(keep)

    while ev:
        now, kind, _, i = heapq.heappop(ev)
        while next_sample <= min(now, t_end):
            run.t_h.append(round((next_sample - t_start) / 3600.0, 3))
            run.gpu_alloc_pct.append(round(used / capacity * 100.0, 3))
            run.pending_pods.append(len(pending))
            next_sample += sample_every
        if kind == 0:
            req = pods[i].request()
            sched.forget(req.key)
            used -= req.total_gpu_milli
            if pending:
                retry(now)
        else:
            run.pods_arrived += 1
            if not try_place(i, now):
                pending.append(i)  # waits; retried in arrival order when a pod leaves
            if progress is not None:
                progress(1)
    never += len(pending)
    a = np.asarray(delays) if delays else np.zeros(1)
    run.queue_delay_s = {
        "mean": round(float(a.mean()), 3),
        "p50": round(float(np.percentile(a, 50)), 3),
        "p99": round(float(np.percentile(a, 99)), 3),
    }
    run.pods_placed = len(placed_at)
    run.pods_never_placed = never
    run.mean_gpu_alloc_pct = round(float(np.mean(run.gpu_alloc_pct)) if run.gpu_alloc_pct else 0.0, 3)
    run.wall_s = round(time.perf_counter() - t0, 3)
    return run
