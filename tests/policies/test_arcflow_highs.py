"""Property: ``arcflow.solve`` calls HiGHS directly (``highspy``) with the program and options that
``scipy.optimize.linprog(method="highs")`` gave it before, so its solution is linprog's, bit for bit, where both
carry the same HiGHS release (the vertex HiGHS returns among the LP's many optima depends on the release), and its
optimum is linprog's whatever the releases.
"""

from __future__ import annotations

import highspy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from scipy.sparse import csr_matrix, vstack

from gpufleet.policies import arcflow

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SIZES = st.dictionaries(st.integers(min_value=1, max_value=99), st.integers(min_value=1, max_value=300), min_size=1, max_size=18)


def _scipy_highs_release() -> tuple[int, int, int] | None:
    """The HiGHS release scipy carries (read from its private module; None where this scipy lays it out otherwise)."""
    try:
        from scipy.optimize._highspy import _core as scipy_highs
    except ImportError:
        return None
    return scipy_highs.HIGHS_VERSION_MAJOR, scipy_highs.HIGHS_VERSION_MINOR, scipy_highs.HIGHS_VERSION_PATCH


SAME_RELEASE = _scipy_highs_release() == (highspy.Highs().versionMajor(), highspy.Highs().versionMinor(),
                                          highspy.Highs().versionPatch())


def linprog_flow(count: dict[int, int], n: int):
    """The program as it was solved before: scipy.sparse rows, linprog(method="highs")."""
    ws = np.array(sorted(w for w, c in count.items() if 0 < w <= n and c > 0), dtype=np.int64)
    src = np.concatenate([np.arange(n - w + 1) for w in ws] + [np.arange(n)])
    size = np.concatenate([np.full(n - w + 1, w) for w in ws] + [np.zeros(n, dtype=np.int64)])
    dst = src + np.maximum(size, 1)
    j = np.arange(src.size)
    inner_out, inner_in = (src > 0) & (src < n), (dst > 0) & (dst < n)
    a_eq = csr_matrix((np.r_[-np.ones(inner_out.sum()), np.ones(inner_in.sum())],
                       (np.r_[src[inner_out] - 1, dst[inner_in] - 1], np.r_[j[inner_out], j[inner_in]])), shape=(n - 1, src.size))
    item = size > 0
    a_items = csr_matrix((np.ones(item.sum()), (np.searchsorted(ws, size[item]), j[item])), shape=(ws.size, src.size))
    res = linprog(np.where(src == 0, 1.0, 0.0), A_eq=vstack([a_eq, a_items]),
                  b_eq=np.r_[np.zeros(n - 1), [count[int(w)] for w in ws]], bounds=(0, None), method="highs")
    assert res.status == 0
    return res


@SETTINGS
@given(SIZES)
def test_the_optimum_is_linprogs(sizes):
    lp = arcflow.solve(sizes, 100)
    assert lp is not None
    assert abs(lp.bins - linprog_flow(sizes, 100).fun) < 1e-9


@pytest.mark.skipif(not SAME_RELEASE, reason="scipy and highspy carry different HiGHS releases (or scipy's is unknown)")
@SETTINGS
@given(SIZES)
def test_the_solution_is_linprogs_bit_for_bit(sizes):
    assert np.array_equal(arcflow.solve(sizes, 100).flow, linprog_flow(sizes, 100).x)


@pytest.mark.skipif(not SAME_RELEASE, reason="scipy and highspy carry different HiGHS releases (or scipy's is unknown)")
def test_the_simulators_grid_too():
    """The repack bound's grid (the sizes' common divisor: 1,000 positions at 1-milli shares) is solved alike."""
    count = {7: 40, 130: 25, 333: 9, 501: 3, 999: 1}
    assert np.array_equal(arcflow.solve(count, 1000).flow, linprog_flow(count, 1000).x)
