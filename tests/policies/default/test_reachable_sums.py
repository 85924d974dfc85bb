"""descent.reachable_sums (the sliver table's sums of share sizes) against the plain loop it replaced."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpufleet.policies.default.descent import reachable_sums


def _loop(sizes: list[int], top: int) -> np.ndarray:
    reach = np.zeros(top + 1, dtype=bool)
    reach[0] = True
    for x in range(1, top + 1):
        reach[x] = any(s <= x and reach[x - s] for s in sizes)
    return reach


@pytest.mark.parametrize("sizes", [[], [1000], [1], [999], [7, 13], [250, 500, 1000], [300, 470, 810]])
def test_known_sets(sizes: list[int]) -> None:
    assert np.array_equal(reachable_sums(sizes, 1000), _loop(sizes, 1000))


def test_random_sets() -> None:
    rng = random.Random(7)
    for _ in range(100):
        sizes = sorted({rng.randint(1, 1000) for _ in range(rng.randint(1, 20))})
        top = rng.choice([1, 8, 64, 1000])
        got = reachable_sums(sizes, top)
        assert got.dtype == bool and got.shape == (top + 1,)
        assert np.array_equal(got, _loop(sizes, top)), sizes


def test_only_sums_of_sizes() -> None:
    got = reachable_sums([300, 470], 1000)
    assert np.flatnonzero(got).tolist() == [0, 300, 470, 600, 770, 900, 940]
