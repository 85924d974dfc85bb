"""Offline bound for the packing experiment: how few GPUs *any* placement could leave idle.

At the moment the arrived GPU demand equals the cluster's capacity, a policy
has placed some subset of the pods that arrived so far; what it could not place
is the unallocated GPU %.  No placement of that same set of pods, made with
full knowledge, allocates more GPU than the optimum of this integer program
over node groups (nodes grouped by GPU model, GPU count, CPU and memory; pods
by shape, ``gpu_spec`` included):

    maximise   sum_s,k  x[s,k] * gpu_milli(s)                x[s,k] integer >= 0
    subject to sum_k x[s,k]                <= count(s)       every pod shape s
               group k's CPU, memory and GPU milli totals     (n_k nodes each)
               x[s,k] = 0 where shape s cannot run on one node of group k at all
               (more GPUs, CPU or memory than one node has, a GPU model its gpu_spec excludes)

plus how shares pack on one GPU, and per-node integrality cuts (both valid for
every real placement):

* **per-GPU packing patterns** (an arc-flow model, Valerio de Carvalho 1999):
  group k gives ``z[k]`` of its GPUs to shares and the rest whole
  (``whole GPUs + z[k] <= GPUs``); per GPU model, a flow of ``sum z[k]`` runs
  from 0 to 1000 milli through arcs "one share of size m from position p" and
  "the rest idle", and each share size needs as many arcs as shares of it are
  placed on that model.  A flow path is one GPU's pattern, so an 810-milli
  share cannot pool its 190 idle milli with another GPU's: without this the
  program placed 810s beside 470s and said 0.01% on the default trace, where
  every real placement leaves about 3%.  Arcs take shares in non-increasing
  size (every pattern has such an order) and sizes off the milli grid are
  rounded down: both only loosen the model, so the bound stays valid;
* per node, for CPU, memory and GPU count and j = 1..4: at most j pods larger
  than 1/(j+1) of the node (``sum_s [r(s) > R/(j+1)] x[s,k] <= j * n_k``);
  per GPU, at most j shares larger than 1000/(j+1) milli.

It is a relaxation (a group's nodes still pool their CPU and memory below
those cuts, and a GPU model's share patterns are pooled over its groups), so
its optimum is an upper bound on what any placement allocates, and
``100 - that`` a lower bound on unallocated GPU %.  HiGHS
(``scipy.optimize.milp``) solves it under a time limit; we report its dual
bound (valid even when it stops early) as the bound, its own optimality gap,
and which pods its best placement leaves out (``left_out``): where those are
pods that fit when they arrived, no scheduler that places what fits reaches the
bound.  The old LP relaxation (no integrality, no per-node cuts, no patterns)
is ``lp_bound``, kept for comparison.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...engine.model import GPU_MILLI, Node
from ..experiments.shared import memo, workload_order
from ..traces.trace import TracePod

Shape = tuple[int, int, int, int, frozenset | None]  # cpu, memory, GPU count, per-GPU milli, allowed models
NodeType = tuple[str, int, int, int]  # model, GPUs, cpu, memory


@dataclass
class BoundResult:
    seed: int
    unallocated_gpu_pct: float  # no placement of the arrived pods leaves fewer GPUs idle
    pods: int
    shapes: int
    node_groups: int
    method: str = "mip-node-groups+gpu-patterns"
    best_found_pct: float | None = None  # the MIP's best integer solution (the relaxed problem's optimum lies between)
    gap_pct: float | None = None  # the solver's own gap, best_found_pct - unallocated_gpu_pct, in points of capacity
    optimal: bool = False  # solved to optimality (within HiGHS's default relative gap)
    solve_s: float = 0.0
    lp_pct: float | None = None  # the LP relaxation's bound, for comparison
    left_out: dict[str, list[int]] = field(default_factory=dict)  # GPU request -> [left out, arrived] in the best placement found

    def to_json(self) -> dict:
        return dict(self.__dict__)


def arrived_pods(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int, tune: float) -> tuple[list[TracePod], int]:
    """The pods that have arrived when the arrived GPU demand reaches the cluster's capacity."""
    capacity = sum(len(n.gpus) for n in nodes) * GPU_MILLI
    arrived: list[TracePod] = []
    demand = 0
    # the order a packing run of this trace and seed in this process computes too (the same memo key where its
    # capacity, the usable GPUs', is this one)
    order: list[tuple[TracePod, str]] = memo((pods,), ("order", capacity, tune, seed),  # type: ignore[assignment]
                                             lambda: workload_order(pods, capacity, tune, seed))
    for p, _name in order:
        demand += p.total_gpu_milli
        if demand > capacity:
            break
        arrived.append(p)
    return arrived, capacity


def _shapes(arrived: Sequence[TracePod], cpu_only: bool = False) -> Counter:
    """Pod shapes and their counts; CPU-only pods only with ``cpu_only`` (they allocate no GPU: an optional
    pod of theirs never changes the optimum, one that must be placed takes CPU)."""
    shapes: Counter = Counter()
    for p in arrived:
        if p.num_gpu or cpu_only:
            shapes[_shape(p)] += 1
    return shapes


def _shape(p: TracePod) -> Shape:
    """The pod's request as (cpu, memory, GPU count, per-GPU milli, models), without building it."""
    count, milli = (0, 0) if p.num_gpu == 0 else (1, p.gpu_milli) if p.num_gpu == 1 else (p.num_gpu, GPU_MILLI)
    return (p.cpu_milli, p.memory_mib, count, milli, frozenset(p.gpu_spec) if p.gpu_spec else None)


def _node_types(nodes: Sequence[Node], cpu_only: bool = False) -> Counter:
    groups: Counter = Counter()
    for n in nodes:
        if n.gpus or cpu_only:
            groups[(n.gpus[0].model if n.gpus else "", len(n.gpus), n.cpu_milli, n.memory_mib)] += 1
    return groups


@dataclass
class _Program:
    """The MIP: columns are the (shape, group) pairs ``var`` (integer) and then continuous pattern columns."""

    obj: np.ndarray  # GPU milli each column allocates (0 for the pattern columns)
    A: Sparse
    lo: np.ndarray
    hi: np.ndarray
    integrality: np.ndarray
    S: list[Shape]
    K: list[NodeType]
    var: np.ndarray  # (shape, group) per integer column
    counts: Counter
    count_rows: np.ndarray  # each shape's row "placed <= count(s)"; -1 for a shape no group can hold (no columns)


class _Rows:
    """Sparse constraint rows ``lo <= a.x <= hi``, appended one at a time."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, idx, coef, hi: float, lo: float = -np.inf) -> None:
        idx = np.asarray(idx, dtype=np.int64)
        coef = np.broadcast_to(np.asarray(coef, float), idx.shape)
        if idx.size and np.any(coef):
            self.rows.append(np.full(idx.size, len(self.hi)))
            self.cols.append(idx)
            self.vals.append(coef)
            self.lo.append(float(lo))
            self.hi.append(float(hi))

    def matrix(self, ncols: int) -> Sparse:
        if not self.hi:
            return Sparse(0, ncols, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        return Sparse(len(self.hi), ncols, np.concatenate(self.rows), np.concatenate(self.cols), np.concatenate(self.vals))


@dataclass(frozen=True)
class Sparse:
    """A constraint matrix as (row, column, value) entries (explicit zeros kept), handed to HiGHS column-wise."""

    nrows: int
    ncols: int
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray

    def stacked(self, below: Sparse) -> Sparse:
        """This matrix with ``below``'s rows after its own."""
        return Sparse(self.nrows + below.nrows, self.ncols, np.concatenate([self.rows, below.rows + self.nrows]),
                      np.concatenate([self.cols, below.cols]), np.concatenate([self.vals, below.vals]).astype(float))

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(column starts, row indices, values): what ``scipy.sparse.csc_array`` of the same entries holds, which is
        what ``scipy.optimize.milp`` passed HiGHS before (rows in increasing order within a column, entries at the
        same place summed -- all of them whole numbers here, so in any order -- and explicit zeros kept)."""
        key = self.cols.astype(np.int64) * max(self.nrows, 1) + self.rows
        order = np.argsort(key, kind="stable")
        key, vals = key[order], self.vals[order].astype(np.float64)
        if key.size > 1 and not (first := np.r_[True, key[1:] != key[:-1]]).all():
            vals = np.add.reduceat(vals, np.flatnonzero(first))
            key = key[first]
        col = key // max(self.nrows, 1)
        start = np.searchsorted(col, np.arange(self.ncols + 1))
        return start.astype(np.int32), (key - col * max(self.nrows, 1)).astype(np.int32), vals


@dataclass
class _Solved:
    status: Any  # HighsModelStatus
    optimal: bool
    x: np.ndarray | None
    fun: float | None
    mip_dual_bound: float | None
    message: str
    basis: tuple[list, list] | None = None  # the optimal LP's basis, when asked (``_solve``'s keep_basis)


def _solve(c: np.ndarray, a: Sparse, lo: np.ndarray, hi: np.ndarray, integrality: np.ndarray,
           time_limit_s: float | None = None, basis: tuple[list, list] | None = None, keep_basis: bool = False,
           primal: bool = False) -> _Solved:
    """``min c.x, lo <= a.x <= hi, x >= 0`` (integer where ``integrality``) by HiGHS through ``highspy``, the program
    and options ``scipy.optimize.milp`` passed it (highspy pinned in pyproject.toml at 1.12.0, the release scipy 1.17
    bundles): the same path, so the same answer (tests/simulator/test_bound.py checks it against milp), without
    importing scipy.optimize (0.4 s before a main job's workers fork).  ``basis``: an LP's starting basis (the
    columns' and rows' ``HighsBasisStatus``), which HiGHS's simplex starts from instead of presolving.  ``primal``: an
    LP by the primal simplex (HiGHS's default is the dual)."""
    from highspy import _core as h

    lp = h.HighsLp()
    lp.num_col_, lp.num_row_ = c.size, a.nrows
    am = lp.a_matrix_
    am.num_col_, am.num_row_ = c.size, a.nrows
    am.format_ = h.MatrixFormat.kColwise
    lp.col_cost_ = np.asarray(c, dtype=np.float64)
    lp.col_lower_, lp.col_upper_ = np.zeros(c.size), np.full(c.size, np.inf)
    lp.row_lower_, lp.row_upper_ = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    am.start_, am.index_, am.value_ = a.csc()
    lp.integrality_ = [h.HighsVarType(int(i)) for i in np.asarray(integrality, dtype=np.uint8)]
    solver = h._Highs()
    options = h.HighsOptions()
    options.log_to_console = False
    if time_limit_s is not None:
        options.time_limit = float(time_limit_s)
    if primal:
        options.simplex_strategy = 4  # kSimplexStrategyPrimal
    solver.passOptions(options)
    solver.passModel(lp)
    if basis is not None:
        b = h.HighsBasis()
        b.col_status, b.row_status = basis
        b.valid = True
        solver.setBasis(b)
    solver.run()
    status = solver.getModelStatus()
    info = solver.getInfo()
    is_mip = bool(np.any(integrality))
    limits = (h.HighsModelStatus.kTimeLimit, h.HighsModelStatus.kIterationLimit, h.HighsModelStatus.kSolutionLimit)
    failed = (status not in (h.HighsModelStatus.kOptimal, *limits) or
              (status in limits and info.objective_function_value == h.kHighsInf)) if is_mip else \
        status != h.HighsModelStatus.kOptimal
    message = solver.modelStatusToString(status)
    if failed:
        return _Solved(status, False, None, None, None, message)
    optimal = status == h.HighsModelStatus.kOptimal
    kept = None
    if keep_basis and optimal and not is_mip:
        hb = solver.getBasis()
        kept = (list(hb.col_status), list(hb.row_status))
    return _Solved(status, optimal, np.array(solver.getSolution().col_value), info.objective_function_value,
                   info.mip_dual_bound if is_mip else None, message, kept)


PATTERN_STEPS = 200  # positions of the per-GPU arc-flow graph at most (sizes rounded down to 1000/200 = 5 milli)


def _arcs(sizes: Sequence[int]) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Arc-flow graph of one GPU (0 -> 1000 milli): (tail, head, share size; 0 for the idle rest), and its positions.

    Shares are taken in non-increasing size, so a position only gets arcs of sizes up to the largest share
    that can end there.  ``sizes``: largest first; positions step by their common divisor with 1000."""
    best_last = {0: GPU_MILLI}  # position -> the largest share that can be the last one to reach it
    arcs: list[tuple[int, int, int]] = []
    for p in range(0, GPU_MILLI + 1, _step(sizes)):
        last = best_last.get(p)
        if last is None:
            continue
        for m in sizes:
            if m <= last and p + m <= GPU_MILLI:
                arcs.append((p, p + m, m))
                best_last[p + m] = max(best_last.get(p + m, 0), m)
    positions = sorted(best_last)
    arcs += [(p, GPU_MILLI, 0) for p in positions if p < GPU_MILLI]  # the rest of this GPU stays idle
    return arcs, positions


def _step(sizes: Sequence[int]) -> int:
    """The sizes' common divisor with 1000 milli, at least 1000 / PATTERN_STEPS."""
    from math import gcd

    g = GPU_MILLI
    for m in sizes:
        g = gcd(g, m)
    return max(g, GPU_MILLI // PATTERN_STEPS)


def _program(nodes: Sequence[Node], arrived: Sequence[TracePod], node_cuts: bool, patterns: bool = True,
             cpu_only: bool = False) -> _Program:
    """The node-group program of the module docstring (``patterns``: with the per-GPU arc-flow columns;
    ``cpu_only``: with the CPU-only pods and nodes too)."""
    counts = _shapes(arrived, cpu_only)
    groups = _node_types(nodes, cpu_only)
    S, K = list(counts), list(groups)
    allowed = np.zeros((len(S), len(K)), dtype=bool)
    for i, (cpu, mem, cnt, _milli, models) in enumerate(S):
        for k, (model, ngpu, ncpu, nmem) in enumerate(K):
            allowed[i, k] = cnt <= ngpu and cpu <= ncpu and mem <= nmem and (not models or model in models)
    var = np.argwhere(allowed)  # (shape, group) pairs
    gpu_of = np.array([s[2] * s[3] if s[2] == 1 else s[2] * GPU_MILLI for s in S], dtype=float)
    cpu_of = np.array([s[0] for s in S], float)
    mem_of = np.array([s[1] for s in S], float)
    cnt_of = np.array([s[2] for s in S], float)
    share = (cnt_of == 1) & (np.array([s[3] for s in S]) < GPU_MILLI)
    milli_of = np.array([s[3] for s in S], float)
    rows = _Rows()
    nx = len(var)
    count_rows = np.full(len(S), -1, dtype=np.int64)
    for i in range(len(S)):
        idx = np.flatnonzero(var[:, 0] == i)
        if idx.size:
            count_rows[i] = len(rows.hi)
        rows.add(idx, 1.0, counts[S[i]])
    for k, (_model, ngpu, ncpu, nmem) in enumerate(K):
        idx = np.flatnonzero(var[:, 1] == k)
        si = var[idx, 0]
        nk = groups[K[k]]
        rows.add(idx, cpu_of[si], ncpu * nk)
        rows.add(idx, mem_of[si], nmem * nk)
        rows.add(idx, gpu_of[si], ngpu * GPU_MILLI * nk)
        for j in (1, 2, 3, 4):
            # per GPU: at most j shares larger than 1000/(j+1); a GPU given whole holds nothing else
            w = np.where(share[si], (milli_of[si] * (j + 1) > GPU_MILLI).astype(float), j * cnt_of[si])
            rows.add(idx, w, j * ngpu * nk)
            if node_cuts:  # per node: at most j pods larger than 1/(j+1) of its CPU, memory or GPUs (shares: no GPU of their own)
                for req, cap in ((cpu_of[si], ncpu), (mem_of[si], nmem), (np.where(share[si], 0.0, cnt_of[si]), ngpu)):
                    rows.add(idx, (req * (j + 1) > cap).astype(float), j * nk)
    ncols = nx
    if patterns and share.any():
        ncols = _pattern_rows(rows, S, K, groups, var, share, cnt_of)
    obj = np.concatenate([gpu_of[var[:, 0]], np.zeros(ncols - nx)])
    integrality = np.concatenate([np.ones(nx), np.zeros(ncols - nx)])
    return _Program(obj, rows.matrix(ncols), np.array(rows.lo), np.array(rows.hi), integrality, S, K, var, counts,
                    count_rows)


def _pattern_rows(rows: _Rows, S: list[Shape], K: list[NodeType], groups: Counter, var: np.ndarray, share: np.ndarray,
                  cnt_of: np.ndarray) -> int:
    """Add the per-GPU arc-flow columns and rows (module docstring); returns the number of columns in all."""
    nx = len(var)
    z = {k: nx + k for k in range(len(K))}  # GPUs of group k given to shares
    ncols = nx + len(K)
    for k, (_model, ngpu, _cpu, _mem) in enumerate(K):
        idx = np.flatnonzero(var[:, 1] == k)
        whole = idx[~share[var[idx, 0]]]
        rows.add(np.append(whole, z[k]), np.append(cnt_of[var[whole, 0]], 1.0), ngpu * groups[K[k]])
        sh = idx[share[var[idx, 0]]]
        rows.add(np.append(sh, z[k]), np.append([S[s][3] for s in var[sh, 0]], -GPU_MILLI), 0.0)
    for model in sorted({k[0] for k in K}):
        ks = [k for k in range(len(K)) if K[k][0] == model]
        on = np.flatnonzero(np.isin(var[:, 1], ks) & share[var[:, 0]])
        if not on.size:
            continue
        raw = sorted({S[s][3] for s in var[on, 0]}, reverse=True)
        step = _step(raw)
        rounded = {m: m // step * step for m in raw}  # rounded down: a looser model, still a valid bound
        sizes = sorted({m for m in rounded.values() if m > 0}, reverse=True)
        if not sizes:
            continue
        arcs, positions = _arcs(sizes)
        base = ncols
        ncols += len(arcs)
        tail = np.array([a[0] for a in arcs])
        head = np.array([a[1] for a in arcs])
        size = np.array([a[2] for a in arcs])
        for p in positions:  # flow conservation; out of 0 flow the GPUs given to shares
            if p == GPU_MILLI:
                continue
            out_, in_ = np.flatnonzero(tail == p), np.flatnonzero(head == p)
            cols = np.concatenate([base + out_, base + in_] + ([np.array([z[k] for k in ks])] if p == 0 else []))
            coef = np.concatenate([np.ones(out_.size), -np.ones(in_.size)] + ([-np.ones(len(ks))] if p == 0 else []))
            rows.add(cols, coef, 0.0, 0.0)
        for m in sizes:  # each share placed on this model rides one arc of its (rounded) size
            placed = on[[rounded[S[s][3]] == m for s in var[on, 0]]]
            arc = base + np.flatnonzero(size == m)
            rows.add(np.concatenate([placed, arc]), np.concatenate([np.ones(placed.size), -np.ones(arc.size)]), 0.0)
    return ncols


def offline_bound(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int = 42, tune: float = 1.3,
                  time_limit_s: float = 30.0, lp: bool = False) -> BoundResult:
    """The node-group MIP bound at the 100%-arrived point (see the module docstring), within ``time_limit_s``."""
    t0 = time.perf_counter()
    arrived, capacity = arrived_pods(nodes, pods, seed, tune)
    prog = _program(nodes, arrived, node_cuts=True)
    S, K = prog.S, prog.K
    if prog.obj.size == 0:  # no arrived GPU pod fits any node at all
        return BoundResult(seed=seed, unallocated_gpu_pct=100.0, pods=len(arrived), shapes=len(S), node_groups=len(K),
                           best_found_pct=100.0, gap_pct=0.0, optimal=True, solve_s=round(time.perf_counter() - t0, 2))
    with _quiet_solver():
        res = _solve(-prog.obj, prog.A, prog.lo, prog.hi, prog.integrality, time_limit_s)
    dual = res.mip_dual_bound
    if dual is None or not np.isfinite(dual):  # pragma: no cover - HiGHS always has the root LP's bound
        raise RuntimeError(f"offline bound: no bound from the MIP: {res.message}")
    ub = min(float(-dual), float(capacity))
    x = None if res.x is None else np.round(res.x[:len(prog.var)])
    found = None if x is None else float(prog.obj[:len(prog.var)] @ x)

    def pct(alloc):
        return round(100.0 - 100.0 * alloc / capacity, 4)
    out = BoundResult(seed=seed, unallocated_gpu_pct=max(0.0, pct(ub)), pods=len(arrived), shapes=len(S), node_groups=len(K),
                      best_found_pct=None if found is None else pct(found), optimal=res.optimal,
                      solve_s=round(time.perf_counter() - t0, 2))
    if out.best_found_pct is not None:
        out.gap_pct = round(out.best_found_pct - out.unallocated_gpu_pct, 4)
    if x is not None:
        out.left_out = _left_out(prog, x)
    if lp:
        out.lp_pct = lp_bound(nodes, pods, seed, tune).unallocated_gpu_pct
    return out


def bound_placing_first(nodes: Sequence[Node], arrived: Sequence[TracePod], placed: Sequence[TracePod],
                        capacity_milli: int) -> float | None:
    """Least unallocated GPU % of any placement of ``arrived`` that places every pod of ``placed`` (a prefix).

    A scheduler places what fits: every pod that arrives before its first refusal is placed, so among
    placements that keep those pods, this says how few GPUs it could have left idle (the offline bound
    may leave out pods a scheduler had to take, CPU-only ones included, whose CPU then feeds GPU pods).  The
    LP relaxation of the program above with the CPU-only pods and nodes, plus ``sum_k x[s,k] >= placed(s)``:
    0.05 to 0.07 s a run on the default trace (``_KeepFirst``).  None where the solver finds no solution (it always should:
    the run itself placed those pods)."""
    kf = _keep_first(nodes, arrived)
    prog = kf.prog
    if len(placed) <= len(arrived) and all(a is b for a, b in zip(placed, arrived)):
        must = Counter(kf.keys[:len(placed)])  # a prefix, as a run's: its shapes counted from the arrived pods' keys
    else:
        must = _shapes(placed, cpu_only=True)
    if prog.obj.size == 0:
        return 100.0
    # "at least must(s) placed" is the lower side of each shape's count row: the same LP as that row and a keep row,
    # with the rows of the program without keeps, so its optimal basis is a start as it is
    lo = prog.lo.copy()
    for i, s in enumerate(prog.S):
        n = must.get(s)
        if n:
            if prog.count_rows[i] < 0:  # a kept pod no node group can hold: no placement keeps it
                return None
            lo[prog.count_rows[i]] = float(n)
    with _quiet_solver():
        res = _solve(-prog.obj, prog.A, lo, prog.hi, np.zeros(prog.obj.size), basis=kf.basis())
    if not res.optimal or res.fun is None:
        return None
    return max(0.0, round(100.0 - 100.0 * min(-float(res.fun), float(capacity_milli)) / capacity_milli, 4))


def _keep_first(nodes: Sequence[Node], arrived: Sequence[TracePod]) -> _KeepFirst:
    """The same for every policy's run of one trace and seed (``arrived`` is the arrival order's prefix)."""
    return memo((nodes, *arrived), ("keep-first",), lambda: _KeepFirst(nodes, arrived))  # type: ignore[return-value]


def prepare_placing_first(nodes: Sequence[Node], arrived: Sequence[TracePod]) -> None:
    """Build and solve now, in this process's memo, the program every ``bound_placing_first`` of these arrived pods
    starts from (``experiments.packing.prepare``)."""
    _keep_first(nodes, arrived).basis()


class _KeepFirst:
    """What every run's keep-first LP of one trace and seed shares: the program, each arrived pod's shape, and the
    optimal basis of the program with no pod kept, which each run's LP (the same rows, the kept counts as their
    lower bounds) starts from instead of from scratch: 0.05-0.07 CPU s instead of 0.14 on the default trace."""

    def __init__(self, nodes: Sequence[Node], arrived: Sequence[TracePod]) -> None:
        self.prog = _program(nodes, arrived, node_cuts=True, cpu_only=True)
        self.keys = [_shape(p) for p in arrived]
        self._basis: tuple[list, list] | None = None
        self._solved = False

    def basis(self) -> tuple[list, list] | None:
        """Solved on first use (None if HiGHS finds no optimum)."""
        if not self._solved:
            prog = self.prog
            with _quiet_solver():
                # by the primal simplex: 0.07 CPU s instead of the dual's 0.17 on the default trace, and the runs' LPs
                # (the dual simplex from here) take 0.03 s instead of 0.06 from its optimal basis
                self._basis = _solve(-prog.obj, prog.A, prog.lo, prog.hi, np.zeros(prog.obj.size), keep_basis=True,
                                     primal=True).basis
            self._solved = True
        return self._basis


@contextmanager
def _quiet_solver() -> Iterator[None]:
    """Keep HiGHS's stray debug line ("...transformNewIntegerFeasibleSolution tmpSolver.run();", printed by the
    C++ code even with ``disp`` off, about once in a hundred solves) off the user's terminal."""
    saved: list[tuple[int, int]] = []
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        for fd in (1, 2):  # the C++ code writes to the process's descriptors, whatever sys.stdout is
            try:
                copy = os.dup(fd)
            except OSError:  # closed: nothing to protect
                continue
            saved.append((fd, copy))
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        yield
    finally:
        for fd, copy in reversed(saved):
            os.dup2(copy, fd)
            os.close(copy)


def request_label(gpu_count: int, gpu_milli: int) -> str:
    """'810 milli', '1 GPU', '8 GPUs': what a pod asks of the GPUs, for reports."""
    if gpu_count == 1 and gpu_milli < GPU_MILLI:
        return f"{gpu_milli} milli"
    return f"{gpu_count} GPU" + ("s" if gpu_count > 1 else "")


def _left_out(prog: _Program, x: np.ndarray) -> dict[str, list[int]]:
    """GPU request -> [pods the best placement leaves out, pods of it arrived], most GPU left out first."""
    placed: Counter = Counter()
    arrived: Counter = Counter()
    for j, (s, _k) in enumerate(prog.var):
        placed[request_label(prog.S[s][2], prog.S[s][3])] += int(x[j])
    for shape, n in prog.counts.items():
        arrived[request_label(shape[2], shape[3])] += n
    gone = {label: [arrived[label] - placed[label], arrived[label]] for label in arrived if arrived[label] > placed[label]}
    return dict(sorted(gone.items(), key=lambda kv: -kv[1][0] * label_milli(kv[0])))


def label_milli(label: str) -> int:
    """The GPU milli a ``request_label`` asks for."""
    n, unit = label.split()
    return int(n) if unit == "milli" else int(n) * GPU_MILLI


def lp_bound(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int = 42, tune: float = 1.3) -> BoundResult:
    """The aggregate LP relaxation: node groups pooled, pods split fractionally (optimistic)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    arrived, capacity = arrived_pods(nodes, pods, seed, tune)
    shapes: Counter = Counter()
    for p in arrived:
        req = p.request()
        shapes[(req.cpu_milli, req.memory_mib, req.gpu_count, req.gpu_milli, req.gpu_models_allow)] += 1
    groups: Counter = Counter()
    for nd in nodes:
        model = nd.gpus[0].model if nd.gpus else ""
        groups[(model, len(nd.gpus), nd.cpu_milli, nd.memory_mib)] += 1
    S, K = list(shapes), list(groups)
    ns, nk = len(S), len(K)
    allowed = np.zeros((ns, nk), dtype=bool)
    for i, (cpu, mem, cnt, _milli, models) in enumerate(S):
        for k, (model, ngpu, ncpu, nmem) in enumerate(K):
            allowed[i, k] = cnt <= ngpu and cpu <= ncpu and mem <= nmem and (not models or model in models) and (cnt == 0 or ngpu > 0)
    var = np.argwhere(allowed)
    nv = len(var)
    gpu_of = np.array([s[2] * (s[3] if s[2] == 1 else GPU_MILLI) if s[2] else 0 for s in S], dtype=float)
    c = -gpu_of[var[:, 0]]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b: list[float] = []
    r = 0
    for i in range(ns):
        idx = np.flatnonzero(var[:, 0] == i)
        rows += [r] * len(idx)
        cols += list(idx)
        vals += [1.0] * len(idx)
        b.append(shapes[S[i]])
        r += 1
    for k in range(nk):
        idx = np.flatnonzero(var[:, 1] == k)
        model, ngpu, ncpu, nmem = K[k]
        cnt = groups[K[k]]
        for per_pod, cap in ((np.array([S[i][0] for i in var[idx, 0]], float), ncpu * cnt),
                             (np.array([S[i][1] for i in var[idx, 0]], float), nmem * cnt),
                             (gpu_of[var[idx, 0]], ngpu * GPU_MILLI * cnt)):
            rows += [r] * len(idx)
            cols += list(idx)
            vals += list(per_pod)
            b.append(cap)
            r += 1
        for j in (1, 2, 3, 4):
            w = np.array([
                (1.0 if S[i][3] * (j + 1) > GPU_MILLI else 0.0) if S[i][2] == 1 and S[i][3] < GPU_MILLI
                else (float(j * S[i][2]) if S[i][2] else 0.0)
                for i in var[idx, 0]
            ])
            if w.any():
                rows += [r] * len(idx)
                cols += list(idx)
                vals += list(w)
                b.append(j * ngpu * cnt)
                r += 1
    A = csr_matrix((vals, (rows, cols)), shape=(r, nv))
    res = linprog(c, A_ub=A, b_ub=np.array(b, float), bounds=(0, None), method="highs")
    if not res.success:  # pragma: no cover - the LP is always feasible (x = 0)
        raise RuntimeError(f"offline bound LP failed: {res.message}")
    alloc = -res.fun
    return BoundResult(seed=seed, unallocated_gpu_pct=round(100.0 - 100.0 * alloc / capacity, 4), pods=len(arrived), shapes=ns,
                       node_groups=nk, method="lp-relaxation", optimal=True)
