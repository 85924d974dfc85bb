"""Offline bound for the packing experiment: how few GPUs *any* policy could leave idle.

At the moment the arrived GPU demand equals the cluster's capacity, a policy
has placed some subset of the pods that arrived so far.  No online policy can
place more GPU demand than the best *offline* placement of that same set of
pods, and no offline placement can beat the linear-programming relaxation:

    maximise   sum_s,k  x[s,k] * gpu_milli(s)
    subject to sum_k x[s,k]               <= count(s)          every pod shape s
               sum_s x[s,k] * cpu(s)       <= cpu capacity of node group k
               sum_s x[s,k] * memory(s)    <= memory of node group k
               sum_s x[s,k] * gpu_milli(s) <= GPU milli of node group k
               x[s,k] = 0 where the shape cannot run on the group at all
               (more GPUs than one node has, a GPU model it may not use)
               x >= 0

and, per group, the per-GPU cuts "a GPU holds at most j shared pods larger than
1000/(j+1) milli-GPU, and nothing else once it is given whole" (j = 1..4),
with nodes grouped by identical (GPU model, GPU count, CPU, memory).  Splitting
pods fractionally and pooling a group's nodes only adds freedom, so the LP
optimum is an upper bound on allocation: ``100 - LP%`` is a lower bound on
unallocated GPU %.  It ignores per-node and per-GPU integrality, so it is
optimistic; the report states it as such.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..engine.model import GPU_MILLI, Node
from .packing import workload_order
from .trace import TracePod


@dataclass
class BoundResult:
    seed: int
    unallocated_gpu_pct: float
    pods: int
    shapes: int
    node_groups: int

    def to_json(self) -> dict:
        return dict(self.__dict__, method="lp-relaxation")


def offline_bound(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int = 42, tune: float = 1.3) -> BoundResult:
    from scipy.optimize import linprog

    capacity = sum(len(n.gpus) for n in nodes) * GPU_MILLI
    arrived: list[TracePod] = []
    demand = 0
    for p, _name in workload_order(pods, capacity, tune, seed):
        demand += p.request().total_gpu_milli
        if demand > capacity:
            break
        arrived.append(p)
    shapes: Counter[tuple[int, int, int, int, frozenset[str] | None]] = Counter()
    for p in arrived:
        q = p.request()
        shapes[(q.cpu_milli, q.memory_mib, q.gpu_count, q.gpu_milli, q.gpu_models_allow)] += 1
    groups: Counter[tuple[str, int, int, int]] = Counter()
    for n in nodes:
        model = n.gpus[0].model if n.gpus else ""
        groups[(model, len(n.gpus), n.cpu_milli, n.memory_mib)] += 1
    S, K = list(shapes), list(groups)
    ns, nk = len(S), len(K)
    allowed = np.zeros((ns, nk), dtype=bool)
    for i, (cpu, mem, cnt, _milli, models) in enumerate(S):
        for k, (model, ngpu, ncpu, nmem) in enumerate(K):
            allowed[i, k] = cnt <= ngpu and cpu <= ncpu and mem <= nmem and (not models or model in models) and (cnt == 0 or ngpu > 0)
    var = np.argwhere(allowed)  # (shape, group) pairs
    nv = len(var)
    gpu_of = np.array([s[2] * (s[3] if s[2] == 1 else GPU_MILLI) if s[2] else 0 for s in S], dtype=float)
    c = -gpu_of[var[:, 0]]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b: list[float] = []

    def add_row(idx: np.ndarray, coeffs: list[float], bound: float) -> None:
        rows.extend([len(b)] * len(idx))
        cols.extend(idx.tolist())
        vals.extend(coeffs)
        b.append(bound)

    for i in range(ns):  # shape counts
        idx = np.flatnonzero(var[:, 0] == i)
        add_row(idx, [1.0] * len(idx), shapes[S[i]])
    for k in range(nk):
        idx = np.flatnonzero(var[:, 1] == k)
        model, ngpu, ncpu, nmem = K[k]
        cnt = groups[K[k]]
        for per_pod, cap in ((np.array([S[i][0] for i in var[idx, 0]], float), ncpu * cnt),
                             (np.array([S[i][1] for i in var[idx, 0]], float), nmem * cnt),
                             (gpu_of[var[idx, 0]], ngpu * GPU_MILLI * cnt)):
            add_row(idx, per_pod.tolist(), cap)
        # per-GPU integrality cuts: a GPU holds at most j shared pods larger than 1000/(j+1),
        # and a GPU given whole to a pod holds nothing else
        for j in (1, 2, 3, 4):
            w = np.array([
                (1.0 if S[i][3] * (j + 1) > GPU_MILLI else 0.0) if S[i][2] == 1 and S[i][3] < GPU_MILLI
                else (float(j * S[i][2]) if S[i][2] else 0.0)
                for i in var[idx, 0]
            ])
            if w.any():
                add_row(idx, w.tolist(), j * ngpu * cnt)
    from scipy.sparse import csr_matrix

    A = csr_matrix((vals, (rows, cols)), shape=(len(b), nv))
    res = linprog(c, A_ub=A, b_ub=np.array(b, float), bounds=(0, None), method="highs")
    if not res.success:  # pragma: no cover - the LP is always feasible (x = 0)
        raise RuntimeError(f"offline bound LP failed: {res.message}")
    alloc = -res.fun
    return BoundResult(seed=seed, unallocated_gpu_pct=round(100.0 - 100.0 * alloc / capacity, 4), pods=len(arrived), shapes=ns, node_groups=nk)
