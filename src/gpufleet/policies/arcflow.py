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


def _columns(src: np.ndarray, dst: np.ndarray, size: np.ndarray, ws: np.ndarray, n: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The constraint matrix by columns (start, row index, value), each column's rows ascending: arc j leaves
    position src (row src - 1, -1, where 0 < src), enters dst (row dst - 1, +1, where dst < n) and, an item arc,
    counts once in its size's row (n - 1 + the size's rank).  The same entries, in the same order, as
    ``scipy.sparse.csc_array`` makes of the conservation rows stacked over the item rows."""
    has_out, has_in, item = src > 0, dst < n, size > 0
    start = np.zeros(src.size + 1, dtype=np.int32)
    np.cumsum(has_out.astype(np.int32) + has_in + item, out=start[1:])
    index = np.empty(int(start[-1]), dtype=np.int32)
    value = np.empty(index.size, dtype=np.float64)
    pos = start[:-1].copy()
    for mask, row, v in ((has_out, src - 1, -1.0), (has_in, dst - 1, 1.0), (item, None, 1.0)):
        j = np.flatnonzero(mask)
        index[pos[j]] = row[j] if row is not None else n - 1 + np.searchsorted(ws, size[j])
        value[pos[j]] = v
        pos[j] += 1
    return start, index, value


def solve(count: Mapping[int, int], n: int) -> ArcFlow | None:
    """Fewest bins of ``n`` units that hold exactly ``count[size]`` items of each size (0 < size <= n), as an LP.

    Exactly, not at least: with "at least" the LP may fill idle space with items nobody asked for at no
    cost, and its patterns then show pairings that never occur (an 810 with a 50 and a 140 on 967 GPUs,
    with seven 50s in all).  The optimum is the same either way.  None when HiGHS finds no solution (it
    always should).

    HiGHS is called through its own package (``highspy``), with the options ``scipy.optimize.linprog(method=
    "highs")`` passes it: the same program reaches the same solver, without linprog's checks and result
    packing (a third of a solve here, 14 solves per few thousand pods in the default policy).  Which optimal
    vertex HiGHS returns depends on its release (the LP has many optima; the patterns, and so placements, follow
    the vertex), so ``highspy`` is pinned in pyproject.toml.
    """
    import highspy

    ws = np.array(sorted(w for w, c in count.items() if 0 < w <= n and c > 0), dtype=np.int64)
    src = np.concatenate([np.arange(n - w + 1) for w in ws] + [np.arange(n)])  # item arcs, then idle arcs
    size = np.concatenate([np.full(n - w + 1, w) for w in ws] + [np.zeros(n, dtype=np.int64)])
    dst = src + np.maximum(size, 1)
    start, index, value = _columns(src, dst, size, ws, n)
    rhs = np.r_[np.zeros(n - 1), [float(count[int(w)]) for w in ws]]  # conservation at 1..n-1, then each size's count
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = src.size, rhs.size
    lp.col_cost_ = np.where(src == 0, 1.0, 0.0)
    lp.col_lower_, lp.col_upper_ = np.zeros(src.size), np.full(src.size, highspy.kHighsInf)
    lp.row_lower_, lp.row_upper_ = rhs, rhs
    a = lp.a_matrix_
    a.format_ = highspy.MatrixFormat.kColwise
    a.num_col_, a.num_row_ = src.size, rhs.size
    a.start_, a.index_, a.value_ = start, index, value
    h = highspy.Highs()
    for option, v in _LINPROG_OPTIONS:
        h.setOptionValue(option, v)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = np.array(h.getSolution().col_value)
    return ArcFlow(bins=float(np.sum(x[src == 0])), src=src, dst=dst, size=size, flow=x)


# what linprog(method="highs") sets with its defaults (scipy's _linprog_highs): presolve on, dual simplex, quiet
_LINPROG_OPTIONS = (("presolve", "on"), ("simplex_strategy", 1), ("highs_debug_level", 0), ("output_flag", False),
                    ("log_to_console", False))
