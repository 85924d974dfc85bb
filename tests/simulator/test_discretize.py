"""``packing.discretize``: the mean of the samples at each integer arrived %, else within +-1 (the paper's merge
scripts).  Arrivals only add, so the samples of one x are a run of them, which the fast path finds by bisection: it
must give the masks' means bit for bit, and the masks' answer where the arrived % is not sorted."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.simulator.experiments.packing import discretize, discretize_by_masks


def by_masks(arrived_pct: np.ndarray, values: np.ndarray) -> list[float | None]:
    return discretize_by_masks(np.round(arrived_pct), values)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(steps=st.lists(st.integers(0, 4000), min_size=1, max_size=3000), capacity=st.integers(1000, 400_000),
       seed=st.integers(0, 2**32 - 1), shuffle=st.booleans())
def test_discretize_as_by_masks(steps: list[int], capacity: int, seed: int, shuffle: bool) -> None:
    rng = np.random.default_rng(seed)
    arrived = np.cumsum(steps) / capacity * 100.0
    if shuffle:  # not sorted: the general path
        arrived = rng.permutation(arrived)
    values = rng.random(arrived.size) * 100.0
    assert discretize(arrived, values) == by_masks(arrived, values)


def test_gaps_and_the_end() -> None:
    arrived = np.array([0.2, 0.4, 3.0, 3.4, 7.6, 130.4])  # nothing at 1, 2 (+-1 around them), 5, 6, 9..129
    values = np.array([1.0, 2.0, 3.0, 5.0, 7.0, 9.0])
    got = discretize(arrived, values)
    assert got[0] == 1.5 and got[1] == 1.5 and got[2] == 4.0 and got[3] == 4.0 and got[4] == 4.0
    assert got[5] is None and got[8] == 7.0 and got[9] == 7.0 and got[10] is None and got[130] == 9.0
