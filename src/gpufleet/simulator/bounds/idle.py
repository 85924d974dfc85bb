"""Where the idle GPUs are when the arrived demand equals the cluster's capacity, and why.

Unallocated GPU % says *how much* a policy leaves idle at the 100%-arrived point of the packing
experiment; a platform engineer also needs *why*, because the causes call for different fixes.
This module records, from the packing run itself (no second simulation):

* ``saturation``: the arrived fraction (arrived GPU demand / capacity, the turned-away pod included)
  when the first pod is turned away, over the whole run (above 1 when the cluster takes every pod up to
  the 100% point; None when it never turns one away).  With a policy that packs well nearly every pod
  arriving after it fails too, so unallocated % at 100% is about ``1 - saturation``: what counts is how
  full the cluster is when it first says no (a careless policy, such as random, says no early and still
  places many pods after; so does the default, whose whole-GPU reserve turns 810-milli shares away on
  purpose while whole GPUs are scarce);
* the idle GPU milli per GPU model, split into ``whole`` idle GPUs and ``sliver`` (free milli on
  partly used GPUs); ``cpu_stranded`` (idle milli on nodes where some GPU shape of the arrived
  workload would fit the GPUs but not the node's CPU/memory) and ``unfillable`` (no arrived shape
  fits the free GPUs at all);
* ``holes``: the free milli on GPUs holding shares, by what is on them (a lone 810-milli pod leaves
  190 that nothing common fills: that hole is set by the trace more than by the policy);
* the repack yardstick: the GPUs the policy used for shares against an offline best-fit-decreasing
  packing of the very same shares (a real packing, so never below the optimum) and the arc-flow LP
  lower bound (no packing of them uses fewer GPUs).  The gap between the policy and the LP bound is
  all that any better share placement could win back at this point, for the same pods.

``run_packing`` feeds an :class:`IdleRecorder` every decision and takes the snapshot just before the
first pod whose GPU demand would take the arrived total over capacity (or at the end of a run that
never gets there); ``bench/idle_breakdown.py`` prints the same breakdown for the trace variants.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...engine.model import GPU_MILLI, PodRequest
from ...engine.state import ClusterState
from ...policies import arcflow

MODEL_FIELDS = ("gpus", "idle", "whole", "sliver", "cpu_stranded", "unfillable", "used_unpinned", "used_pinned")


def hole_name(content: tuple[int, ...]) -> str:
    """``(470, 460)`` -> ``"470+460"``: the shares on one GPU, largest first."""
    return "+".join(map(str, content))


@dataclass
class IdleBreakdown:
    """The idle GPUs at one point of a packing run; amounts in GPU milli."""

    capacity: int
    arrived: int
    allocated: int
    saturation: float | None
    failed: dict[str, int]  # "unpinned" / "pinned:<models>" -> GPU milli of pods turned away
    per_model: dict[str, dict[str, int]]  # model -> MODEL_FIELDS
    holes: dict[tuple[int, ...], tuple[int, int]]  # shares on a GPU (largest first) -> (GPUs, free milli)
    share_gpus: int  # GPUs holding shares
    repack_gpus: int  # best-fit decreasing of the same shares
    repack_lower: int  # arc-flow LP bound: no packing of the shares uses fewer GPUs
    bound_placing_first_pct: float | None = None  # no placement keeping the pods placed before the first refusal leaves less
    cpu_used_pct: float = 0.0  # the cluster's CPU held by pods: what the GPUs' gain costs where CPU binds
    cpu_only_failed: int = 0  # CPU-only pods turned away so far
    cpu_only_failed_cpu_milli: int = 0

    def total(self, key: str) -> int:
        return sum(row[key] for row in self.per_model.values())

    @property
    def unallocated_pct(self) -> float:
        return 100.0 * (self.capacity - self.allocated) / self.capacity if self.capacity else 0.0

    def to_json(self) -> dict[str, Any]:
        """GPU-equivalents (milli / 1000), holes largest first."""

        def g(milli: float) -> float:
            return round(milli / GPU_MILLI, 3)

        holes = sorted(self.holes.items(), key=lambda kv: (-kv[1][1], kv[0]))
        return {
            "arrived_fraction": round(self.arrived / self.capacity, 4) if self.capacity else None,
            "saturation": None if self.saturation is None else round(self.saturation, 4),
            "unallocated_gpu_pct": round(self.unallocated_pct, 4),
            "idle_gpus": g(self.total("idle")),
            "whole_idle_gpus": g(self.total("whole")),
            "sliver_gpus": g(self.total("sliver")),
            "cpu_stranded_gpus": g(self.total("cpu_stranded")),
            "unfillable_gpus": g(self.total("unfillable")),
            "holes": {hole_name(k): {"gpus": n, "idle_gpus": g(f)} for k, (n, f) in holes},
            "share_gpus": self.share_gpus,
            "repack_bfd_gpus": self.repack_gpus,
            "repack_lower_gpus": self.repack_lower,
            "repack_bfd_saves_gpus": self.share_gpus - self.repack_gpus,
            "repack_saves_at_most_gpus": self.share_gpus - self.repack_lower,
            "bound_placing_first_pct": self.bound_placing_first_pct,
            "cpu_used_pct": round(self.cpu_used_pct, 4),
            "cpu_only_pods_failed": self.cpu_only_failed,
            "cpu_only_cores_failed": round(self.cpu_only_failed_cpu_milli / 1000, 1),
            "failed_gpus": {k: g(v) for k, v in sorted(self.failed.items(), key=lambda kv: -kv[1])},
            "per_model": {m: {k: (v if k == "gpus" else g(v)) for k, v in row.items()}
                          for m, row in sorted(self.per_model.items(), key=lambda kv: -kv[1]["gpus"])},
        }


@dataclass(frozen=True)
class ArrivalFacts:
    """What :meth:`IdleRecorder.observe` reads of each arrival, as arrays: the same for every packing run of one trace
    and seed, so a run builds them once (``experiments.packing``) and records its arrivals in bulk
    (:meth:`IdleRecorder.observe_many`) instead of one call per pod (about 2 us each, 8,800 a run)."""

    milli: np.ndarray  # int64: GPU count x per-GPU milli
    gpu: np.ndarray  # bool: asks a GPU
    cpu_milli: np.ndarray  # int64
    pinned: np.ndarray  # int64 0/1: has a GPU model restriction (``used_by``'s column)
    fail_key: np.ndarray  # int64: index into ``fail_names`` ("unpinned" or "pinned:<models>")
    fail_names: tuple[str, ...]
    shape: np.ndarray  # int64: index into ``shapes`` (-1: no GPU)
    shapes: tuple[tuple, ...]

    @classmethod
    def of(cls, reqs: Sequence[PodRequest]) -> ArrivalFacts:
        names: dict[str, int] = {}
        shapes: dict[tuple, int] = {}
        milli, gpu, cpu, pinned, fail_key, shape = [], [], [], [], [], []
        for req in reqs:
            count = req.gpu_count
            allow = req.gpu_models_allow
            milli.append(count * req.gpu_milli)
            gpu.append(bool(count))
            cpu.append(req.cpu_milli)
            pinned.append(1 if allow else 0)
            fail_key.append(names.setdefault("pinned:" + "|".join(sorted(allow)) if allow else "unpinned", len(names)))
            shape.append(shapes.setdefault((req.cpu_milli, req.memory_mib, count, req.gpu_milli, allow), len(shapes))
                         if count else -1)
        return cls(np.array(milli, dtype=np.int64), np.array(gpu, dtype=bool), np.array(cpu, dtype=np.int64),
                   np.array(pinned, dtype=np.int64), np.array(fail_key, dtype=np.int64), tuple(names),
                   np.array(shape, dtype=np.int64), tuple(shapes))


@dataclass
class IdleRecorder:
    """Watches a packing run decision by decision; :meth:`snapshot` breaks the idle GPUs down."""

    capacity: int
    arrived: int = 0
    allocated: int = 0
    saturation: float | None = None
    first_refusal: int | None = None  # arrivals before the first pod turned away (all of them were placed)
    arrivals: int = 0
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    used_by: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # model -> [unpinned, pinned]
    shapes: set[tuple] = field(default_factory=set)  # GPU shapes of the arrived pods
    cpu_only_failed: int = 0  # CPU-only pods turned away
    cpu_only_failed_cpu_milli: int = 0

    def observe(self, state: ClusterState, req: PodRequest, node: int | None) -> None:
        """One arrival: ``node`` is the index it was placed on, or None when it was turned away."""
        count = req.gpu_count
        milli = count * req.gpu_milli  # req.total_gpu_milli
        self.arrived += milli
        self.arrivals += 1
        if count:
            self.shapes.add((req.cpu_milli, req.memory_mib, count, req.gpu_milli, req.gpu_models_allow))
        if node is not None:
            self.allocated += milli
            if milli:  # a node with no GPU holds no GPU milli: nothing to add to its model's row
                gpus = state.nodes[node].gpus
                if gpus:
                    self.used_by[gpus[0].model][1 if req.gpu_models_allow else 0] += milli
        else:
            if not req.gpu_count:
                self.cpu_only_failed += 1
                self.cpu_only_failed_cpu_milli += req.cpu_milli
            allow = req.gpu_models_allow
            self.failed["pinned:" + "|".join(sorted(allow)) if allow else "unpinned"] += milli
            if self.saturation is None:
                self.saturation = self.arrived / self.capacity if self.capacity else None
                self.first_refusal = self.arrivals - 1

    def observe_many(self, state: ClusterState, facts: ArrivalFacts, where: np.ndarray, start: int, stop: int) -> None:
        """:meth:`observe` of arrivals ``start`` to ``stop - 1`` in turn, ``facts`` saying what each asked and
        ``where[k]`` the node index arrival k went to (-1: turned away): the same counters, in a few numpy calls.
        (Sums of whole milli as float64 are exact; the failure keys enter ``failed`` in the order they first fail.)"""
        if stop <= start:
            return
        w, milli = where[start:stop], facts.milli[start:stop]
        placed = w >= 0
        arrived_before, arrivals_before = self.arrived, self.arrivals
        self.arrived += int(milli.sum())
        self.arrivals += stop - start
        sh = facts.shape[start:stop]
        self.shapes.update(facts.shapes[j] for j in np.unique(sh[sh >= 0]).tolist())
        self.allocated += int(milli[placed].sum())
        put = np.flatnonzero(placed & (milli > 0))
        if put.size:
            names, model_id = self._models(state)
            mid = model_id[w[put]]
            on_gpu = mid >= 0  # a node with no GPU holds no GPU milli: nothing to add to its model's row
            key = mid[on_gpu] * 2 + facts.pinned[start:stop][put[on_gpu]]
            sums = np.bincount(key, weights=milli[put[on_gpu]], minlength=2 * len(names)).tolist()
            for m, name in enumerate(names):
                if sums[2 * m] or sums[2 * m + 1]:
                    row = self.used_by[name]
                    row[0] += int(sums[2 * m])
                    row[1] += int(sums[2 * m + 1])
        refused = np.flatnonzero(~placed)
        if refused.size:
            cpu_only = refused[~facts.gpu[start:stop][refused]]
            self.cpu_only_failed += int(cpu_only.size)
            self.cpu_only_failed_cpu_milli += int(facts.cpu_milli[start:stop][cpu_only].sum())
            keys = facts.fail_key[start:stop][refused]
            firsts, at = np.unique(keys, return_index=True)
            sums = np.bincount(keys, weights=milli[refused], minlength=len(facts.fail_names)).tolist()
            for j in firsts[np.argsort(at, kind="stable")].tolist():
                self.failed[facts.fail_names[j]] += int(sums[j])
            if self.saturation is None:  # with no capacity it stays None, and observe keeps the last refusal
                j0 = int(refused[0] if self.capacity else refused[-1])
                if self.capacity:
                    self.saturation = (arrived_before + int(milli[:j0 + 1].sum())) / self.capacity
                self.first_refusal = arrivals_before + j0

    def _models(self, state: ClusterState) -> tuple[list[str], np.ndarray]:
        """(GPU model names, each node's index into them or -1 for a node with no GPU)."""
        names: dict[str, int] = {}
        ids = [names.setdefault(n.gpus[0].model, len(names)) if n.gpus else -1 for n in state.nodes]
        return list(names), np.array(ids, dtype=np.int64)

    def snapshot(self, state: ClusterState) -> IdleBreakdown:
        per_model = _per_model(state, self.shapes)
        for m, row in per_model.items():
            row["used_unpinned"], row["used_pinned"] = self.used_by.get(m, (0, 0))
        holes, items = share_holes(state)
        return IdleBreakdown(
            capacity=self.capacity, arrived=self.arrived, allocated=self.allocated, saturation=self.saturation,
            failed=dict(self.failed), per_model=per_model, holes=holes, share_gpus=sum(n for n, _ in holes.values()),
            repack_gpus=best_fit_decreasing(items), repack_lower=bins_lower_bound(items),
            cpu_used_pct=100.0 * (1.0 - float(state.cpu_free.sum()) / max(float(state.cpu_cap.sum()), 1.0)),
            cpu_only_failed=self.cpu_only_failed, cpu_only_failed_cpu_milli=self.cpu_only_failed_cpu_milli)


def _per_model(state: ClusterState, shapes: set[tuple]) -> dict[str, dict[str, int]]:
    """Idle milli per GPU model: whole / sliver, and CPU-stranded / unfillable against the arrived GPU shapes.

    A node's idle milli is CPU-stranded when some shape allowed on its model fits its free GPUs but no such
    shape also fits its free CPU and memory, unfillable when no allowed shape fits its free GPUs at all.
    """
    out: dict[str, dict[str, int]] = {}
    rows = [i for i, n in enumerate(state.nodes) if n.gpus]
    if not rows:
        return out
    idx = np.array(rows)
    ngpu = np.array([len(state.nodes[i].gpus) for i in rows])
    models = [state.nodes[i].gpus[0].model for i in rows]
    free = state.gpu_free_milli[idx].astype(np.int64)
    free[np.arange(free.shape[1])[None, :] >= ngpu[:, None]] = -1  # columns past a node's GPUs
    idle = np.where(free > 0, free, 0).sum(axis=1)
    whole = np.where(free == GPU_MILLI, free, 0).sum(axis=1)
    stranded = np.zeros(len(rows), dtype=bool)
    unfillable = idle > 0
    if shapes:
        sh = sorted(shapes, key=lambda t: (t[:4], sorted(t[4] or ())))
        cpu, mem, count, milli = (np.array([t[k] for t in sh], dtype=np.int64) for k in range(4))
        names = sorted(set(models))
        allowed = np.array([[t[4] is None or not t[4] or m in t[4] for t in sh] for m in names])  # model x shape
        allowed = allowed[[names.index(m) for m in models]]  # node x shape
        sizes, inv = np.unique(milli, return_inverse=True)
        fits = (free[:, :, None] >= sizes[None, None, :]).sum(axis=1)[:, inv] >= count[None, :]  # node x shape: GPUs fit
        gpu_fit = fits & allowed
        cpu_fit = gpu_fit & (state.cpu_free[idx][:, None] >= cpu[None, :]) & (state.mem_free[idx][:, None] >= mem[None, :])
        gpu_ok, cpu_ok = gpu_fit.any(axis=1), cpu_fit.any(axis=1)
        stranded = (idle > 0) & gpu_ok & ~cpu_ok
        unfillable = (idle > 0) & ~gpu_ok
    for k, m in enumerate(models):
        row = out.setdefault(m, dict.fromkeys(MODEL_FIELDS, 0))
        row["gpus"] += int(ngpu[k])
        row["idle"] += int(idle[k])
        row["whole"] += int(whole[k])
        row["sliver"] += int(idle[k] - whole[k])
        row["cpu_stranded"] += int(idle[k]) if stranded[k] else 0
        row["unfillable"] += int(idle[k]) if unfillable[k] else 0
    return out


def share_holes(state: ClusterState) -> tuple[dict[tuple[int, ...], tuple[int, int]], list[int]]:
    """(shares on a GPU, largest first -> (GPUs, free milli on them); every share's milli) over the GPUs holding shares.

    A share is a single-GPU pod of less than a whole GPU (MIG instances are not shares).
    """
    on_gpu: dict[tuple[str, int], list[int]] = defaultdict(list)
    for a in state.assignments.values():
        if 0 < a.gpu_milli < GPU_MILLI and len(a.gpu_indices) == 1 and not a.mig:
            on_gpu[(a.node, a.gpu_indices[0])].append(a.gpu_milli)
    holes: dict[tuple[int, ...], list[int]] = defaultdict(lambda: [0, 0])
    for v in on_gpu.values():
        h = holes[tuple(sorted(v, reverse=True))]
        h[0] += 1
        h[1] += GPU_MILLI - sum(v)
    return {k: (n, f) for k, (n, f) in holes.items()}, [m for v in on_gpu.values() for m in v]


def best_fit_decreasing(items: list[int], cap: int = GPU_MILLI) -> int:
    """Bins best-fit decreasing opens for ``items`` (a real packing: never fewer than the optimum)."""
    free: list[int] = []  # free space of the open bins, kept sorted
    for m in sorted(items, reverse=True):
        i = bisect.bisect_left(free, m)
        f = (free.pop(i) if i < len(free) else cap) - m
        bisect.insort(free, f)
    return len(free)


def bins_lower_bound(items: list[int], cap: int = GPU_MILLI) -> int:
    """No packing of ``items`` into bins of ``cap`` uses fewer bins: the arc-flow LP (Valerio de Carvalho), rounded up.

    Positions 0..cap in steps of the sizes' common divisor; a bin is a path from 0 to cap made of
    item arcs (i -> i + size) and loss arcs (i -> i + 1 step).  Minimise the flow out of 0 such that
    every size has as many arcs as items.  Its LP bound is known to be within one bin of the optimum
    on practically every instance, so it is the honest yardstick for "how much better could these
    shares be packed".
    """
    if not items:
        return 0
    step = math.gcd(cap, *items)
    lp = arcflow.solve(Counter(x // step for x in items), cap // step)
    if lp is None:  # pragma: no cover - the LP always has a solution (one bin per item)
        return -(-sum(items) // cap)
    return int(math.ceil(lp.bins - 1e-6))


SUMMARY_FIELDS = ("arrived_fraction", "saturation", "unallocated_gpu_pct", "idle_gpus", "whole_idle_gpus", "sliver_gpus",
                  "cpu_stranded_gpus", "unfillable_gpus", "share_gpus", "repack_bfd_gpus", "repack_lower_gpus",
                  "repack_bfd_saves_gpus", "repack_saves_at_most_gpus", "bound_placing_first_pct", "cpu_used_pct",
                  "cpu_only_pods_failed")


def summarize_idle(idles: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds of ``IdleBreakdown.to_json()`` dicts (``<field>_mean``; ``_std`` for saturation and idle GPUs).

    ``saturation`` is averaged over the seeds that turned a pod away (``saturation_runs`` says how many);
    ``holes_mean`` is the idle GPU-equivalents per GPU content, 0 for a seed without it, largest first.
    """
    out: dict[str, Any] = {}
    for k in SUMMARY_FIELDS:
        vals = [d[k] for d in idles if d.get(k) is not None]
        out[f"{k}_mean"] = round(float(np.mean(vals)), 4) if vals else None
        if k in ("saturation", "idle_gpus"):
            out[f"{k}_std"] = round(float(np.std(vals)), 4) if vals else None
    out["saturation_runs"] = sum(d.get("saturation") is not None for d in idles)
    holes: dict[str, float] = defaultdict(float)
    for d in idles:
        for name, h in d["holes"].items():
            holes[name] += h["idle_gpus"] / len(idles)
    out["holes_mean"] = {k: round(v, 3) for k, v in sorted(holes.items(), key=lambda kv: (-kv[1], kv[0]))}
    return out
