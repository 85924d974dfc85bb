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
from ...engine.model import Node, PodRequest, request_copy
from ...engine.state import ClusterState
from ...policies import build_profile
from ...policies.paper.workload import TargetWorkload, frag_amount, node_view
from ..bounds.idle import ArrivalFacts, IdleBreakdown, IdleRecorder
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
    return request_copy(r, name=name)


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


def _arrival_facts(pods: Sequence[TracePod], capacity: int, tune: float, seed: int,
                   arrivals: Sequence[tuple[PodRequest, int, bool]]) -> ArrivalFacts:
    """What the idle recorder reads of each arrival (``ArrivalFacts``), from ``memo``: the same for every run."""
    return memo((pods,), ("arrival facts", capacity, tune, seed),  # type: ignore[return-value]
                lambda: ArrivalFacts.of([r for r, _milli, _mig in arrivals]))


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
    workload, the empty cluster's fragment, what the idle recorder reads of each arrival, and the keep-first LP's
    program and optimal basis).  ``gpufleet simulate`` calls it in the parent while
    the first offline bound's MIP has a core to itself, so that the workers it forks next start with it instead of
    each building it; the runs read exactly what they would have built (same functions, same memo keys)."""
    state = ClusterState(nodes)
    capacity = state.total_gpu_milli()
    _base, order, arrivals, tw = _shared(pods, capacity, tune, seed)
    _empty_cluster(nodes, pods, state, tw)
    _arrival_facts(pods, capacity, tune, seed, arrivals)
    if placing_bound:
        from ..bounds.bound import prepare_placing_first

        prepare_placing_first(nodes, [tp for tp, _ in order[:_full_at(arrivals, capacity)]])


@dataclass(frozen=True)
class _EmptyCluster:
    """What every run of one cluster and trace computes alike on the empty cluster: the GPU fragment and idle milli of
    each node against the trace's target workload (and their sums), the workload's access table and the node arrays'
    shapes; kept in ``memo`` (and built once in ``prepare``) instead of again by each run (about 0.01 CPU s a run)."""

    access: np.ndarray
    node_frag: np.ndarray  # [nodes] GPU fragment milli
    idle: np.ndarray  # [nodes] idle GPU milli (float64)
    frag_sum: float
    idle_sum: float
    gpus: int  # columns of the per-GPU arrays
    left_dtype: np.dtype
    model_of: np.ndarray  # [nodes] each node's GPU model id (-1: none), in node_view's dtype


def _empty_cluster(nodes: Sequence[Node], pods: Sequence[TracePod], state: ClusterState, tw: TargetWorkload
                   ) -> _EmptyCluster:
    """``_EmptyCluster`` of ``nodes`` (``state``: a fresh ``ClusterState`` of them) and the trace ``pods`` (``tw``: its
    target workload), from ``memo``."""

    def make() -> _EmptyCluster:
        acc = tw.access(state.model_names)
        cpu, left, model = node_view(state, np.arange(len(state)))
        node_frag = frag_amount(cpu, left, model, tw, acc)
        idle = left.sum(axis=1).astype(np.float64)
        model_of = state.gpu_model[:, 0] if state.gpu_model.shape[1] else np.full(len(state), -1)
        return _EmptyCluster(acc, node_frag, idle, float(node_frag.sum()), float(idle.sum()), left.shape[1], left.dtype,
                             model_of.astype(model.dtype))

    return memo((nodes, pods), ("empty cluster",), make)  # type: ignore[return-value]


def _running_frag(empty: _EmptyCluster, where: np.ndarray, placed_at: list[int], placed_cpu: np.ndarray,
                  placed_left: np.ndarray, gpu_usable: np.ndarray, tw: TargetWorkload) -> tuple[np.ndarray, np.ndarray]:
    """The cluster's GPU fragment and idle milli after each arrival, from each placement's node as it was then.

    A placement on node i changes the sums by (i's new figure - its figure before), the figure before being the one
    of the last placement on i, or the empty node's.  The sums run in the order of the placements (``np.cumsum`` adds
    left to right: the same floating-point sums as adding them one by one)."""
    n, p = where.size, len(placed_at)
    at = np.asarray(placed_at, dtype=np.int64)
    node = where[at]
    left = placed_left[:p]
    left *= gpu_usable[node]  # node_view's np.where(usable, free, 0)
    new_frag = frag_amount(placed_cpu[:p], left, empty.model_of[node], tw, empty.access)
    new_idle = left.sum(axis=1).astype(np.float64)
    order = np.argsort(node, kind="stable")  # each node's placements in the order they came
    on = node[order]
    first = np.ones(p, dtype=bool)
    first[1:] = on[1:] != on[:-1]

    def before(new: np.ndarray, initial: np.ndarray) -> np.ndarray:
        prev = np.empty(p)
        prev[1:] = new[order][:-1]
        prev[first] = initial[on[first]]
        out = np.empty(p)
        out[order] = prev
        return out

    frag_sums = np.cumsum(np.concatenate(([empty.frag_sum], new_frag - before(new_frag, empty.node_frag))))
    idle_sums = np.cumsum(np.concatenate(([empty.idle_sum], new_idle - before(new_idle, empty.idle))))
    placed = np.zeros(n, dtype=np.int64)
    placed[at] = 1
    count = np.cumsum(placed)  # placements up to and including each arrival
    return frag_sums[count], idle_sums[count]


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
    empty = _empty_cluster(nodes, pods, state, tw)

    n = len(order)
    arrived_milli = 0
    failed = 0
    mig_pods = mig_failed = 0
    reasons: dict[str, int] = {}
    dms: list[float] = []
    rec = IdleRecorder(capacity)
    facts = None if shape is not None else _arrival_facts(pods, capacity, tune, seed, arrivals)
    shaped: list[PodRequest] = []  # with ``dra``: each arrival's request as scheduled
    snap: IdleBreakdown | None = None
    snap_at = len(order)
    # each arrival's node (-1: turned away); the recorder reads them in bulk at the snapshot and at the end
    where = np.full(n, -1, dtype=np.int64)
    # the yardstick of each placement's node, computed for all of them at once after the run (frag_amount
    # scores row by row, so a node's fragment is the same in any batch): its CPU and GPUs then
    placed_at: list[int] = []
    placed_cpu = np.zeros(n, dtype=state.cpu_free.dtype)
    placed_left = np.zeros((n, empty.gpus), dtype=empty.left_dtype)
    gpu_usable, gpu_free, cpu_free = state.gpu_usable, state.gpu_free_milli, state.cpu_free
    index = state.index
    schedule = sched.schedule
    for k, (req, milli, mig) in enumerate(arrivals):
        if shape is not None:
            req = shape(req)
            milli, mig = req.total_gpu_milli, bool(req.mig_profile)
            shaped.append(req)
        if snap is None and arrived_milli + milli > capacity:  # the 100%-arrived point
            rec.observe_many(state, facts or ArrivalFacts.of(shaped[:k]), where, 0, k)
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
            i = index[dec.assignment.node]  # type: ignore[union-attr]
            where[k] = i
            row = len(placed_at)
            placed_cpu[row] = cpu_free[i]
            placed_left[row] = gpu_free[i]  # times gpu_usable after the run (node_view's np.where(usable, free, 0))
            placed_at.append(k)
        else:
            failed += 1
            diag = dec.diagnosis
            if diag is not None and diag.counts:
                r = max(diag.counts, key=diag.counts.__getitem__)
            else:
                msg = dec.status.message if hasattr(dec.status, "message") else str(dec.status)
                r = msg.split(":", 1)[-1].strip() if diag is None else msg
            reasons[r] = reasons.get(r, 0) + 1
        if progress is not None:
            progress(1)
    if facts is None:
        facts = ArrivalFacts.of(shaped)
    rec.observe_many(state, facts, where, 0 if snap is None else snap_at, n)
    if state.gpu_usable is not gpu_usable:  # pragma: no cover - a packing run never changes its nodes
        raise RuntimeError("packing run: the cluster's nodes changed during the run")
    # the arrived and allocated GPU milli after each arrival: running sums of whole numbers (exact in float64)
    arrived = np.cumsum(facts.milli).astype(np.float64)
    used = np.cumsum(np.where(where >= 0, facts.milli, 0)).astype(np.float64)
    frag, idle_total = _running_frag(empty, where, placed_at, placed_cpu, placed_left, gpu_usable, tw)

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
