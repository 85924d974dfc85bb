"""The repack yardsticks of ``gpufleet.simulator.bounds.idle`` (in ``gpufleet simulate``'s report and
``bench/idle_breakdown.py``), against an exact bin count on small instances.

docs/results.md's "where the rest goes" leans on two numbers: best-fit decreasing (a real packing, so never
below the optimum) and the arc-flow LP bound (never above it).  Both are checked here on random small
instances whose optimum a brute force finds.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.simulator.bounds.idle import best_fit_decreasing, bins_lower_bound


def optimum(items: list[int], cap: int = 1000) -> int:
    """Fewest bins, by exhaustive search over bin contents (small instances only)."""
    items = sorted(items, reverse=True)

    @lru_cache(maxsize=None)
    def go(i: int, loads: tuple[int, ...]) -> int:
        if i == len(items):
            return len(loads)
        best = go(i + 1, tuple(sorted(loads + (items[i],))))
        for k, load in enumerate(loads):
            if load + items[i] <= cap and (k == 0 or loads[k - 1] != load):
                nxt = list(loads)
                nxt[k] += items[i]
                best = min(best, go(i + 1, tuple(sorted(nxt))))
        return best

    return go(0, ())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([160, 230, 320, 470, 460, 550, 590, 650, 810]), min_size=1, max_size=9))
def test_lp_bound_never_above_and_bfd_never_below_the_optimum(items):
    opt = optimum(items)
    assert bins_lower_bound(items) <= opt <= best_fit_decreasing(items)


def test_known_instances():
    assert bins_lower_bound([810, 810, 810, 160, 160, 160]) == 3
    assert bins_lower_bound([470, 470, 470, 470]) == 2
    assert bins_lower_bound([600, 600, 600]) == 3  # no two fit together: the LP knows (sum alone says 2)
    assert bins_lower_bound([]) == 0
