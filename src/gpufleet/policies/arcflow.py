"""The arc-flow LP for packing sizes into bins (Valerio de Carvalho), and the per-bin patterns in its solution.

Two places need the same program: the default policy reads the patterns of the LP that packs the share
sizes it has seen into the fewest GPUs (``default.pattern_loads``), and the simulator's repack yardstick
uses its value as a lower bound on the GPUs any packing of the placed shares needs
(``simulator.bounds.idle.bins_lower_bound``).  Positions run 0..n in units of the sizes' grid; a bin is a path
from 0 to n of item arcs (u -> u + size) and idle arcs (u -> u + 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArcFlow:
    """An optimal LP solution: bins used (the objective), and the flow on each arc (src -> dst, item size or 0)."""

    bins: float
    src: np.ndarray
    dst: np.ndarray
    size: np.ndarray
    flow: np.ndarray

    def patterns(self, eps: float = 1e-9) -> list[tuple[tuple[int, ...], float]]:
        """The flow peeled into paths from 0 to n: (sizes on the path, ascending; its flow), heaviest arc first."""
        n = int(self.dst.max())
        out_arcs: dict[int, list[list]] = {}
        used = np.flatnonzero(self.flow > eps)
        for k in used:
            out_arcs.setdefault(int(self.src[k]), []).append([int(self.dst[k]), int(self.size[k]), float(self.flow[k])])
        found: list[tuple[tuple[int, ...], float]] = []
        for _ in range(used.size):  # each peel empties an arc
            path, u = [], 0
            while u < n and out_arcs.get(u):
                arc = max(out_arcs[u], key=lambda a: a[2])
                path.append((u, arc))
                u = arc[0]
            if u < n:  # nothing left from 0, or a rounding leftover that leads nowhere
                break
            f = min(a[2] for _, a in path)
            for v, a in path:
                a[2] -= f
                if a[2] <= eps:
                    out_arcs[v] = [b for b in out_arcs[v] if b is not a]
            found.append((tuple(sorted(a[1] for _, a in path if a[1])), f))
        return found


def solve(count: Mapping[int, int], n: int) -> ArcFlow | None:
    """Fewest bins of ``n`` units that hold exactly ``count[size]`` items of each size (0 < size <= n), as an LP.

    Exactly, not at least: with "at least" the LP may fill idle space with items nobody asked for at no
    cost, and its patterns then show pairings that never occur (an 810 with a 50 and a 140 on 967 GPUs,
    with seven 50s in all).  The optimum is the same either way.  None when HiGHS finds no solution (it
    always should).
    """
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    ws = np.array(sorted(w for w, c in count.items() if 0 < w <= n and c > 0), dtype=np.int64)
    src = np.concatenate([np.arange(n - w + 1) for w in ws] + [np.arange(n)])  # item arcs, then idle arcs
    size = np.concatenate([np.full(n - w + 1, w) for w in ws] + [np.zeros(n, dtype=np.int64)])
    dst = src + np.maximum(size, 1)
    j = np.arange(src.size)
    inner_out, inner_in = (src > 0) & (src < n), (dst > 0) & (dst < n)
    a_eq = csr_matrix((np.r_[-np.ones(inner_out.sum()), np.ones(inner_in.sum())],  # conservation at 1..n-1
                       (np.r_[src[inner_out] - 1, dst[inner_in] - 1], np.r_[j[inner_out], j[inner_in]])), shape=(n - 1, src.size))
    item = size > 0
    a_items = csr_matrix((np.ones(item.sum()), (np.searchsorted(ws, size[item]), j[item])), shape=(ws.size, src.size))
    cost = np.where(src == 0, 1.0, 0.0)
    res = linprog(cost, A_eq=vstack([a_eq, a_items]), b_eq=np.r_[np.zeros(n - 1), [count[int(w)] for w in ws]],
                  bounds=(0, None), method="highs")
    if res.status != 0:
        return None
    return ArcFlow(bins=float(np.sum(res.x[src == 0])), src=src, dst=dst, size=size, flow=res.x)
