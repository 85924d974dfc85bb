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

plus per-node and per-GPU integrality cuts (valid for every real placement,
since a bin holds at most j items larger than 1/(j+1) of it):

    per node, for CPU, memory and GPU count and j = 1..4:
        sum_s [r(s) > R/(j+1)] x[s,k] <= j * n_k
    per GPU: a GPU holds at most j shares larger than 1000/(j+1) milli, and
        nothing else once it is given whole to a pod.

It is a relaxation (a group's nodes still pool their leftovers below those
cuts), so its optimum is an upper bound on what any placement allocates, and
``100 - that`` a lower bound on unallocated GPU %.  HiGHS (``scipy.optimize.milp``)
solves it under a time limit; we report its dual bound (valid even when it
stops early) as the bound, and its own optimality gap.  The old LP relaxation
(no integrality, no per-node cuts) is ``lp_bound``, kept for comparison.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engine.model import GPU_MILLI, Node
from .packing import workload_order
from .trace import TracePod

Shape = tuple[int, int, int, int, frozenset | None]  # cpu, memory, GPU count, per-GPU milli, allowed models
NodeType = tuple[str, int, int, int]  # model, GPUs, cpu, memory


@dataclass
class BoundResult:
    seed: int
    unallocated_gpu_pct: float  # no placement of the arrived pods leaves fewer GPUs idle
    pods: int
    shapes: int
    node_groups: int
    method: str = "mip-node-groups"
    best_found_pct: float | None = None  # the MIP's best integer solution (the relaxed problem's optimum lies between)
    gap_pct: float | None = None  # the solver's own gap, best_found_pct - unallocated_gpu_pct, in points of capacity
    optimal: bool = False  # solved to optimality (within HiGHS's default relative gap)
    solve_s: float = 0.0
    lp_pct: float | None = None  # the LP relaxation's bound, for comparison

    def to_json(self) -> dict:
        return dict(self.__dict__)


def arrived_pods(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int, tune: float) -> tuple[list[TracePod], int]:
    """The pods that have arrived when the arrived GPU demand reaches the cluster's capacity."""
    capacity = sum(len(n.gpus) for n in nodes) * GPU_MILLI
    arrived: list[TracePod] = []
    demand = 0
    for p, _name in workload_order(pods, capacity, tune, seed):
        demand += p.request().total_gpu_milli
        if demand > capacity:
            break
        arrived.append(p)
    return arrived, capacity


def _shapes(arrived: Sequence[TracePod]) -> Counter:
    shapes: Counter = Counter()
    for p in arrived:
        r = p.request()
        if r.gpu_count:  # CPU-only pods add no GPU allocation; leaving them out only loosens the bound
            shapes[(r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_models_allow)] += 1
    return shapes


def _node_types(nodes: Sequence[Node]) -> Counter:
    groups: Counter = Counter()
    for n in nodes:
        if n.gpus:
            groups[(n.gpus[0].model, len(n.gpus), n.cpu_milli, n.memory_mib)] += 1
    return groups


def _program(nodes: Sequence[Node], arrived: Sequence[TracePod], node_cuts: bool):
    """(objective, A, b, shapes, groups) of the node-group program; variables are allowed (shape, group) pairs."""
    from scipy.sparse import csr_matrix

    counts = _shapes(arrived)
    groups = _node_types(nodes)
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
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    b: list[float] = []

    def add(idx: np.ndarray, coef: np.ndarray, cap: float) -> None:
        if idx.size and np.any(coef):
            rows.append(np.full(idx.size, len(b)))
            cols.append(idx)
            vals.append(np.asarray(coef, float))
            b.append(float(cap))

    for i in range(len(S)):
        add(np.flatnonzero(var[:, 0] == i), np.ones(int((var[:, 0] == i).sum())), counts[S[i]])
    for k, (_model, ngpu, ncpu, nmem) in enumerate(K):
        idx = np.flatnonzero(var[:, 1] == k)
        si = var[idx, 0]
        nk = groups[K[k]]
        add(idx, cpu_of[si], ncpu * nk)
        add(idx, mem_of[si], nmem * nk)
        add(idx, gpu_of[si], ngpu * GPU_MILLI * nk)
        for j in (1, 2, 3, 4):
            # per GPU: at most j shares larger than 1000/(j+1); a GPU given whole holds nothing else
            w = np.where(share[si], (milli_of[si] * (j + 1) > GPU_MILLI).astype(float), j * cnt_of[si])
            add(idx, w, j * ngpu * nk)
            if node_cuts:  # per node: at most j pods larger than 1/(j+1) of its CPU, memory or GPUs
                for req, cap in ((cpu_of[si], ncpu), (mem_of[si], nmem), (cnt_of[si], ngpu)):
                    add(idx, (req * (j + 1) > cap).astype(float), j * nk)
    if not b:
        return np.zeros(0), csr_matrix((0, 0)), np.zeros(0), S, K
    A = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(b), len(var)))
    return gpu_of[var[:, 0]], A, np.array(b), S, K


def offline_bound(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int = 42, tune: float = 1.3,
                  time_limit_s: float = 30.0, lp: bool = False) -> BoundResult:
    """The node-group MIP bound at the 100%-arrived point (see the module docstring), within ``time_limit_s``."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    arrived, capacity = arrived_pods(nodes, pods, seed, tune)
    val, A, b, S, K = _program(nodes, arrived, node_cuts=True)
    if val.size == 0:  # no arrived GPU pod fits any node at all
        return BoundResult(seed=seed, unallocated_gpu_pct=100.0, pods=len(arrived), shapes=len(S), node_groups=len(K),
                           best_found_pct=100.0, gap_pct=0.0, optimal=True, solve_s=round(time.perf_counter() - t0, 2))
    res = milp(-val, constraints=LinearConstraint(A, -np.inf, b), integrality=np.ones(val.size), bounds=Bounds(0, np.inf),
               options={"time_limit": float(time_limit_s), "disp": False})
    dual = getattr(res, "mip_dual_bound", None)
    if dual is None or not np.isfinite(dual):  # pragma: no cover - HiGHS always has the root LP's bound
        raise RuntimeError(f"offline bound: no bound from the MIP: {res.message}")
    ub = min(float(-dual), float(capacity))
    found = float(val @ np.round(res.x)) if res.x is not None else None
    def pct(alloc):
        return round(100.0 - 100.0 * alloc / capacity, 4)
    out = BoundResult(seed=seed, unallocated_gpu_pct=max(0.0, pct(ub)), pods=len(arrived), shapes=len(S), node_groups=len(K),
                      best_found_pct=None if found is None else pct(found), optimal=res.status == 0,
                      solve_s=round(time.perf_counter() - t0, 2))
    if out.best_found_pct is not None:
        out.gap_pct = round(out.best_found_pct - out.unallocated_gpu_pct, 4)
    if lp:
        out.lp_pct = lp_bound(nodes, pods, seed, tune).unallocated_gpu_pct
    return out


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
