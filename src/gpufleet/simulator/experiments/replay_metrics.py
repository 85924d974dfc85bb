"""The replay's figures: what a run reports (``ReplayRun``), the curves sampled over time, and the summary over
the busy window (see ``replay``'s module docstring for what is measured and why over that window).

Why apart from the shell: the replay's event loop feeds the scheduling round and keeps its books; what is
computed from those books for the report is not part of the loop, and the spot replay summarizes the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...engine.model import GPU_MILLI, PodRequest
from ...policies.paper.workload import frag_amount, node_view
from ..traces.workload import DEFAULT_WARMUP

if TYPE_CHECKING:
    from .replay import _Replay

SAMPLES = 200
BOUNDED_SLOWDOWN_TAU_S = 10.0  # bounded slowdown: (wait + run) / max(run, tau)


def request_class(r: PodRequest) -> str:
    """``cpu`` (no GPU), ``shares`` (part of one GPU), ``1``/``2``/``4``/``8`` GPUs, or ``N`` GPUs."""
    if r.gpu_count == 0:
        return "cpu"
    if r.gpu_count == 1 and r.gpu_milli < GPU_MILLI:
        return "shares"
    return str(r.gpu_count)


def pinned_class(r: PodRequest) -> str | None:
    """``<class>@<models>`` for a pod pinned to GPU models, else None."""
    if r.gpu_count == 0 or not r.gpu_models_allow:
        return None
    return f"{request_class(r)}@{'|'.join(sorted(r.gpu_models_allow))}"


def stats(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"n": int(a.size), "mean": round(float(a.mean()), 2), "p50": round(float(p50), 2),
            "p95": round(float(p95), 2), "p99": round(float(p99), 2), "max": round(float(a.max()), 2)}


@dataclass
class ReplayRun:
    policy: str
    seed: int
    trace: str
    load: float | None = None  # target offered load (None: the trace's own clock x speedup)
    offered_load: float = 0.0  # offered GPU load actually replayed (reference capacity)
    arrival_scale: float = 1.0  # factor applied to the gaps between arrivals
    copies: int = 1  # passes of the trace, back to back
    what_if: str = ""
    nodes: int = 0
    gpus: int = 0
    warmup: float = DEFAULT_WARMUP
    busy_window_h: list[float] = field(default_factory=list)  # [start, end], hours from the first arrival
    t_h: list[float] = field(default_factory=list)
    gpu_alloc_pct: list[float] = field(default_factory=list)
    pending_pods: list[int] = field(default_factory=list)
    frag_pct: list[float] = field(default_factory=list)  # fragmented GPUs (FGD's measure), % of capacity
    queue_delay_s: dict[str, float] = field(default_factory=dict)
    delay_by_class: dict[str, dict[str, float]] = field(default_factory=dict)
    bounded_slowdown: dict[str, float] = field(default_factory=dict)
    production_delay_s: dict[str, float] = field(default_factory=dict)  # same pods, what production had
    pods_arrived: int = 0
    pods_measured: int = 0
    pods_placed: int = 0
    pods_never_placed: int = 0
    preemptions: int = 0
    reclaims: int = 0
    held_taken: int = 0  # pods placed in room a policy holds for pods not yet here rather than evicting anyone
    mean_gpu_alloc_pct: float = 0.0  # over the busy window
    mean_frag_pct: float = 0.0
    teams: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["experiment"] = "replay"
        return d


def sample(rp: _Replay, t: float) -> None:
    """One point of the curves over time: allocation, pending pods, fragmentation, each team's share and borrowing."""
    run, tree = rp.result, rp.tree
    run.t_h.append(round((t - rp.t_first) / 3600.0, 4))
    run.gpu_alloc_pct.append(round(rp.used_milli / rp.capacity * 100.0, 3))
    run.pending_pods.append(len(rp.pending))
    if rp.tw is not None:
        run.frag_pct.append(round(float(fragment_by_node(rp).sum()) / rp.capacity * 100.0, 3))
    if tree is not None:
        use = tree.usage()
        for q in rp.team_names:
            g = use[q].get("gpu_milli", 0)
            rp.team_share[q].append(round(100.0 * g / rp.capacity, 3))
            nom = tree.nominal(q, "gpu_milli")
            rp.team_borrow[q].append(round(100.0 * max(0, g - nom) / rp.capacity, 3) if nom is not None else 0.0)


def fragment_by_node(rp: _Replay) -> np.ndarray:
    """[node]: ``frag_amount`` of each node now.  Each node's amount is kept with the ``version`` (and the state's
    ``epoch``) it was worked out at, and only the nodes that changed since are worked out again: ``frag_amount``
    scores a node alike in any batch (row by row), so the amounts, and their sum, are those of all nodes at once."""
    st, tw = rp.state, rp.tw
    assert tw is not None and rp.acc is not None
    kept = rp.frag_kept
    if kept is None or kept[0] != st.epoch:
        per = frag_amount(*node_view(st, rp.all_nodes), tw, rp.acc)
        if len(rp.all_nodes) == len(st):  # (the same nodes: what a version says holds for them)
            rp.frag_kept = (st.epoch, per, st.version.copy())
        return per
    _, per, versions = kept
    changed = (st.version != versions).nonzero()[0]
    if changed.size:
        per[changed] = frag_amount(*node_view(st, changed), tw, rp.acc)
        versions[changed] = st.version[changed]
    return per


def summarize(rp: _Replay) -> None:
    """The replay's metrics, over the pods that arrived in the busy window (see ``replay``'s module docstring)."""
    run, reqs, delays, tree = rp.result, rp.reqs, rp.delays, rp.tree
    arrival = rp.wl.arrival_s
    in_window = rp.measured & (arrival >= rp.w_start) & (arrival <= rp.w_end)
    run.pods_never_placed = int(sum(1 for i in rp.pending.queued if in_window[i]) + sum(1 for i in rp.gang_waiting if in_window[i]))
    run.pods_placed = int(np.count_nonzero(~np.isnan(delays)))
    w = np.flatnonzero(in_window & ~np.isnan(delays))
    run.pods_measured = int(in_window.sum())
    d = delays[w]
    run.queue_delay_s = stats(d)
    by: dict[str, list[float]] = {}
    for iw in w.tolist():
        by.setdefault(request_class(reqs[iw]), []).append(float(delays[iw]))
        pc = pinned_class(reqs[iw])
        if pc:
            by.setdefault(pc, []).append(float(delays[iw]))
    order_cls = {"shares": 0, "1": 1, "2": 2, "4": 4, "8": 8, "cpu": 100}
    run.delay_by_class = {k: stats(v) for k, v in sorted(by.items(), key=lambda kv: (order_cls.get(kv[0], 50 if "@" not in kv[0] else 200), kv[0]))}
    rt = rp.wl.run_s[w]
    run.bounded_slowdown = stats(np.maximum(1.0, (d + rt) / np.maximum(rt, BOUNDED_SLOWDOWN_TAU_S)))
    prod = rp.wl.production_delay_s[w]
    run.production_delay_s = stats(prod[~np.isnan(prod)])
    if rp.w_end > rp.w_start:
        run.mean_gpu_alloc_pct = round(rp.alloc_integral / (rp.w_end - rp.w_start) / rp.capacity * 100.0, 3)
    else:
        run.mean_gpu_alloc_pct = run.gpu_alloc_pct[-1] if run.gpu_alloc_pct else 0.0
    inw = [k for k, t in enumerate(run.t_h) if run.busy_window_h[0] <= t <= run.busy_window_h[1]]
    if run.frag_pct and inw:
        run.mean_frag_pct = round(float(np.mean([run.frag_pct[k] for k in inw])), 3)
    if tree is not None:
        for q in rp.team_names:
            dq = [float(delays[i]) for i in w if reqs[i].queue == q]
            mean_share = float(np.mean([rp.team_share[q][k] for k in inw])) if inw else 0.0
            nom = tree.nominal(q, "gpu_milli")
            run.teams[q] = {
                "quota_gpus": None if nom is None else nom / GPU_MILLI, "weight": tree.queues[q].weight,
                "parent": tree.queues[q].parent, "delay_s": stats(dq), "mean_share_pct": round(mean_share, 3),
                "share_pct": rp.team_share[q], "borrowed_pct": rp.team_borrow[q],
                "preempted": rp.team_preempted[q], "reclaimed_from": rp.team_reclaimed[q],
                "never_placed": int(sum(1 for i in rp.pending.queued if in_window[i] and reqs[i].queue == q)),
            }
        unq = [float(delays[i]) for i in w if reqs[i].queue not in tree.queues]
        if unq:
            run.teams["(no queue)"] = {"delay_s": stats(unq)}


__all__ = ["BOUNDED_SLOWDOWN_TAU_S", "ReplayRun", "SAMPLES", "fragment_by_node", "pinned_class", "request_class", "sample", "stats", "summarize"]
