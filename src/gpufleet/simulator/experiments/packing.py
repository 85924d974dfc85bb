"""The FGD paper's packing experiment, driven through the real scheduling engine.

Pods arrive one by one in a seeded shuffled order and never leave; the
workload is inflated by resampling pods until the arrived GPU demand reaches
``tune`` x the cluster's GPU capacity.  After every pod we record the GPU
demand that arrived so far (failed pods included), the GPU milli allocated and
the cluster's fragmentation; the curves are then sampled at each integer
"arrived %" like the paper's analysis scripts do (``merge_alloc_discrete.py``:
mean of the samples whose rounded arrived % equals x, else within +-1).

Each pod goes through ``Scheduler.schedule`` -- the same prefilter, filter,
score, GPU selection and reserve as the live scheduler -- synchronously, with
no API server in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ...engine.framework import Scheduler
from ...engine.model import Node, PodRequest
from ...engine.state import ClusterState
from ...policies import build_profile
from ...policies.paper.workload import TargetWorkload, frag_amount, node_view
from ..bounds.idle import IdleBreakdown, IdleRecorder
from ..traces.trace import TracePod
from .shared import memo, workload_order

ARRIVED_POINTS = np.arange(0, 131)


@dataclass
class PackingRun:
    policy: str
    seed: int
    trace: str
    tune: float
    total_gpus: int
    arrived_pct: list[float] = field(default_factory=list)
    allocation_pct: list[float | None] = field(default_factory=list)
    frag_amount_pct: list[float | None] = field(default_factory=list)
    frag_rate_pct: list[float | None] = field(default_factory=list)
    unallocated_gpu_pct: float | None = None
    pods_arrived: int = 0
    pods_failed: int = 0
    failed_reasons: dict[str, int] = field(default_factory=dict)
    mig_pods: int = 0  # pods asking a MIG instance (they take no GPU milli: the GPU figures leave them out)
    mig_pods_failed: int = 0
    decision_ms: list[float] = field(default_factory=list, repr=False)
    wall_s: float = 0.0
    idle: IdleBreakdown | None = field(default=None, repr=False)  # where the idle GPUs are at the 100%-arrived point

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "policy", "seed", "trace", "tune", "total_gpus", "arrived_pct", "allocation_pct", "frag_amount_pct",
            "frag_rate_pct", "unallocated_gpu_pct", "pods_arrived", "pods_failed", "failed_reasons", "wall_s")}
        d["experiment"] = "packing"
        if self.idle is not None:
            d["idle"] = self.idle.to_json()
        if self.decision_ms:
            a = np.asarray(self.decision_ms)
            d["decision_ms_p50"] = float(np.percentile(a, 50))
            d["decision_ms_p99"] = float(np.percentile(a, 99))
        return d


def discretize(arrived_pct: np.ndarray, values: np.ndarray) -> list[float | None]:
    """Mean of ``values`` per integer arrived %, like the paper's merge scripts."""
    key = np.round(arrived_pct)
    if key.size and not (key[1:] < key[:-1]).any():  # arrivals only add: each x's samples are one run of them
        return _discretize_sorted(key, values)
    return discretize_by_masks(key, values)


def discretize_by_masks(key: np.ndarray, values: np.ndarray) -> list[float | None]:
    """``discretize`` for any order of the rounded arrived % ``key``: two masks over every sample per x."""
    out: list[float | None] = []
    for x in ARRIVED_POINTS:
        m = key == x
        if not m.any():
            m = (key >= x - 1) & (key <= x + 1)
        out.append(round(float(values[m].mean()), 4) if m.any() else None)
    return out


def _discretize_sorted(key: np.ndarray, values: np.ndarray) -> list[float | None]:
    """``discretize`` where ``key`` never decreases: the samples of each x are a slice, found by bisection instead of
    two masks over every sample per x, and copied (the masks' result is a new array: the same mean, bit for bit)."""
    out: list[float | None] = []
    lo = np.searchsorted(key, ARRIVED_POINTS, side="left").tolist()
    hi = np.searchsorted(key, ARRIVED_POINTS, side="right").tolist()
    wide_lo = np.searchsorted(key, ARRIVED_POINTS - 1, side="left").tolist()
    wide_hi = np.searchsorted(key, ARRIVED_POINTS + 1, side="right").tolist()
    for a, b, wa, wb in zip(lo, hi, wide_lo, wide_hi):
        if b <= a:
            a, b = wa, wb
        out.append(round(float(values[a:b].copy().mean()), 4) if b > a else None)
    return out


def _named(r: PodRequest, name: str) -> PodRequest:
    """``r`` under another name: what ``TracePod.request(name)`` builds, without running the frozen dataclass's
    ``__init__`` again for every arrival (a resampled pod is its row's request under a new name)."""
    out = object.__new__(PodRequest)
    out.__dict__.update(r.__dict__)
    out.__dict__["name"] = name
    return out


def _requests(pods: Sequence[TracePod]) -> list[PodRequest]:
    """Each trace pod's ``request()``: built once for each row shape (151 in the default trace's 8,152 rows), the
    other pods of the shape its copy under their own names (``_named``: what ``request()`` makes of them)."""
    made: dict[tuple, PodRequest] = {}
    out = []
    for p in pods:
        k = (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec, p.mig_profile)  # what request() reads
        r = made.get(k)
        if r is None:
            r = made[k] = p.request()
        else:
            r = _named(r, p.name)
        out.append(r)
    return out


def _arrivals(pods: Sequence[TracePod], requests: list[PodRequest], order: list[tuple[TracePod, str]]
              ) -> list[tuple[PodRequest, int, bool]]:
    """(request under its arrival name, its GPU milli, whether it asks a MIG instance) of each arrival in ``order``."""
    by_pod = {id(p): r for p, r in zip(pods, requests)}
    out = []
    for tp, name in order:
        r = by_pod[id(tp)]
        if name != r.name:  # a resampled pod: its row's request under a new name (the trace's own rows keep theirs)
            r = _named(r, name)
        out.append((r, r.total_gpu_milli, bool(r.mig_profile)))
    return out


def _shared(pods: Sequence[TracePod], capacity: int, tune: float, seed: int
            ) -> tuple[list[PodRequest], list[tuple[TracePod, str]], list[tuple[PodRequest, int, bool]], TargetWorkload]:
    """What every run of this trace and seed reads alike, from ``memo``: the pods' requests, the arrival order, each
    arrival's request under its arrival name with its GPU milli and whether it asks a MIG instance (requests are
    frozen, and no plugin keys anything on their identity), and the trace's target workload (fragmentation is
    measured against it, whatever the policy)."""
    base_requests: list[PodRequest] = memo((pods,), ("requests",), lambda: _requests(pods))  # type: ignore[assignment]
    order: list[tuple[TracePod, str]] = memo((pods,), ("order", capacity, tune, seed),  # type: ignore[assignment]
                                             lambda: workload_order(pods, capacity, tune, seed))
    arrivals: list[tuple[PodRequest, int, bool]] = memo(  # type: ignore[assignment]
        (pods,), ("arrivals", capacity, tune, seed), lambda: _arrivals(pods, base_requests, order))
    tw: TargetWorkload = memo((pods,), ("target workload",),  # type: ignore[assignment]
                              lambda: TargetWorkload.from_requests(base_requests))
    return base_requests, order, arrivals, tw


def _full_at(arrivals: Sequence[tuple[PodRequest, int, bool]], capacity: int) -> int:
    """The index of the first arrival past the 100%-arrived point (``len(arrivals)``: none): the arrived pods before
    it are what the keep-first LP places (its program is the same for every policy of one trace and seed)."""
    arrived_milli = 0
    for k, (_req, milli, _mig) in enumerate(arrivals):
        if arrived_milli + milli > capacity:
            return k
        arrived_milli += milli
    return len(arrivals)


def prepare(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int = 42, tune: float = 1.3,
            placing_bound: bool = True) -> None:
    """Build now, in this process's ``memo``, what each ``run_packing`` of this trace and seed would build on its
    first run here (about 0.2 CPU s on the default trace: the requests, the arrival order, the arrivals, the target
    workload, and the keep-first LP's program and optimal basis).  ``gpufleet simulate`` calls it in the parent while
    the first offline bound's MIP has a core to itself, so that the workers it forks next start with it instead of
    each building it; the runs read exactly what they would have built (same functions, same memo keys)."""
    capacity = ClusterState(nodes).total_gpu_milli()
    _base, order, arrivals, _tw = _shared(pods, capacity, tune, seed)
    if placing_bound:
        from ..bounds.bound import prepare_placing_first

        prepare_placing_first(nodes, [tp for tp, _ in order[:_full_at(arrivals, capacity)]])


def prime_policy(sched: Scheduler, requests: list[PodRequest]) -> None:
    """Give target-workload policies the whole trace when they are configured that way (the paper's FGD)."""
    for p, _ in sched.profile.scores:
        if hasattr(p, "prime") and not getattr(p, "learn_online", False):
            p.prime(requests)
    sel = sched.profile.gpu_selector
    if sel is not None and hasattr(sel, "prime") and not getattr(sel, "learn_online", False) and all(sel is not p for p, _ in sched.profile.scores):
        sel.prime(requests)


def run_packing(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: str | Mapping,
    seed: int = 42,
    tune: float = 1.3,
    trace_name: str = "",
    progress: Callable[[int], None] | None = None,
    time_decisions: bool = False,
    placing_bound: bool = True,
    dra: str | None = None,
) -> PackingRun:
    """The FGD paper's packing experiment: pods arrive until ``tune`` x capacity, each placed or turned away.

    ``placing_bound``: also the LP bound for placements that keep every pod this run placed before its first
    refusal (``idle.bound_placing_first_pct``, 0.05 to 0.07 s a run on the default trace, after 0.2 s once per process).
    ``dra``: "claims" or "constrained" asks every GPU pod's devices by ResourceClaim (``simulator/traces/dra.py``)."""
    t0 = time.perf_counter()
    state = ClusterState(nodes)
    profile = build_profile(policy)
    shape = None
    if dra is not None:
        from ...engine.dra.plugin import ensure_dra
        from ..traces.dra import ClaimShaper, catalog

        if dra not in ("claims", "constrained"):
            raise ValueError(f"dra must be 'claims' or 'constrained', not {dra!r}")
        state.dra = catalog(nodes)
        ensure_dra(profile)
        shape = ClaimShaper(nodes, constrained=dra == "constrained")
    if not isinstance(policy, str):  # an inline profile config
        policy = profile.name
    sched = Scheduler(profile, state, seed=seed)
    capacity = state.total_gpu_milli()
    total_gpus = capacity // 1000
    base_requests, order, arrivals, tw = _shared(pods, capacity, tune, seed)
    prime_policy(sched, base_requests)
    acc = tw.access(state.model_names)
    all_nodes = np.arange(len(state))
    cpu, left, model = node_view(state, all_nodes)
    node_frag = frag_amount(cpu, left, model, tw, acc)
    idle = left.sum(axis=1).astype(np.float64)

    n = len(order)
    arrived = np.zeros(n)
    used = np.zeros(n)
    frag = np.zeros(n)
    idle_total = np.zeros(n)
    arrived_milli = 0
    used_milli = 0
    failed = 0
    mig_pods = mig_failed = 0
    reasons: dict[str, int] = {}
    dms: list[float] = []
    rec = IdleRecorder(capacity)
    snap: IdleBreakdown | None = None
    snap_at = len(order)
    frag_sum = float(node_frag.sum())
    idle_sum = float(idle.sum())
    # the yardstick of each placement's node, computed for all of them at once after the run (frag_amount
    # scores row by row, so a node's fragment is the same in any batch): node, its CPU, GPUs and model then
    placed_at: list[int] = []
    placed_node = np.zeros(n, dtype=np.int64)
    placed_cpu = np.zeros(n, dtype=state.cpu_free.dtype)
    placed_left = np.zeros((n, left.shape[1]), dtype=left.dtype)
    placed_model = np.zeros(n, dtype=model.dtype)
    gpu_usable, gpu_free, cpu_free = state.gpu_usable, state.gpu_free_milli, state.cpu_free
    model_of = state.gpu_model[:, 0] if state.gpu_model.shape[1] else np.full(len(state), -1)
    index = state.index
    schedule = sched.schedule
    observe = rec.observe
    for k, (req, milli, mig) in enumerate(arrivals):
        if shape is not None:
            req = shape(req)
            milli, mig = req.total_gpu_milli, bool(req.mig_profile)
        if snap is None and arrived_milli + milli > capacity:  # the 100%-arrived point
            snap = rec.snapshot(state)
            snap_at = k
        arrived_milli += milli
        if time_decisions:
            t1 = time.perf_counter()
            dec = schedule(req)
            dms.append((time.perf_counter() - t1) * 1000.0)
        else:
            dec = schedule(req)
        ok = dec.ok
        if mig:
            mig_pods += 1
            mig_failed += not ok
        if ok:
            used_milli += milli
            i = index[dec.assignment.node]  # type: ignore[union-attr]
            row = len(placed_at)
            placed_node[row] = i
            placed_cpu[row] = cpu_free[i]
            placed_left[row] = gpu_free[i]  # times gpu_usable after the run (node_view's np.where(usable, free, 0))
            placed_model[row] = model_of[i]
            placed_at.append(k)
            observe(state, req, i)
        else:
            observe(state, req, None)
            failed += 1
            diag = dec.diagnosis
            if diag is not None and diag.counts:
                r = max(diag.counts, key=diag.counts.__getitem__)
            else:
                msg = dec.status.message if hasattr(dec.status, "message") else str(dec.status)
                r = msg.split(":", 1)[-1].strip() if diag is None else msg
            reasons[r] = reasons.get(r, 0) + 1
        arrived[k] = arrived_milli
        used[k] = used_milli
        if progress is not None:
            progress(1)
    # the running sums, in the order the run changed them (same floating-point sums as node by node)
    p = len(placed_at)
    if state.gpu_usable is not gpu_usable:  # pragma: no cover - a packing run never changes its nodes
        raise RuntimeError("packing run: the cluster's nodes changed during the run")
    placed_left[:p] *= gpu_usable[placed_node[:p]]
    new_frag = frag_amount(placed_cpu[:p], placed_left[:p], placed_model[:p], tw, acc).tolist()
    new_idle = placed_left[:p].sum(axis=1).tolist()
    node_frag_l, idle_l = node_frag.tolist(), idle.tolist()
    last = 0
    for row, k in enumerate(placed_at):
        frag[last:k] = frag_sum
        idle_total[last:k] = idle_sum
        i, f, li = int(placed_node[row]), new_frag[row], float(new_idle[row])
        frag_sum += f - node_frag_l[i]
        node_frag_l[i] = f
        idle_sum += li - idle_l[i]
        idle_l[i] = li
        last = k
    frag[last:] = frag_sum
    idle_total[last:] = idle_sum

    arrived_pct = arrived / capacity * 100.0
    run = PackingRun(policy=policy, seed=seed, trace=trace_name, tune=tune, total_gpus=int(total_gpus))
    run.arrived_pct = [float(x) for x in ARRIVED_POINTS]
    run.allocation_pct = discretize(arrived_pct, used / capacity * 100.0)
    run.frag_amount_pct = discretize(arrived_pct, frag / capacity * 100.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(idle_total > 0, frag / np.maximum(idle_total, 1e-9) * 100.0, 0.0)
    run.frag_rate_pct = discretize(arrived_pct, rate)
    a100 = run.allocation_pct[100]
    run.unallocated_gpu_pct = None if a100 is None else round(100.0 - a100, 4)
    run.pods_arrived = n
    run.pods_failed = failed
    run.mig_pods, run.mig_pods_failed = mig_pods, mig_failed
    run.failed_reasons = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
    run.decision_ms = dms
    run.idle = snap if snap is not None else rec.snapshot(state)
    run.idle.saturation = rec.saturation  # the first pod turned away may come after the 100% point
    if placing_bound:
        from ..bounds.bound import bound_placing_first  # imported at the first run that asks (the LP's solver)

        arrived100 = [tp for tp, _ in order[:snap_at]]
        placed = arrived100 if rec.first_refusal is None else arrived100[:rec.first_refusal]
        run.idle.bound_placing_first_pct = bound_placing_first(nodes, arrived100, placed, capacity)
    run.wall_s = round(time.perf_counter() - t0, 3)
    return run
