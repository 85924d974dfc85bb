"""Property: the arc-flow LP's patterns carry its whole solution, and the default policy's share-pattern table is
their partial sums, whatever the sizes seen.

Every share size seen is in some pattern (so a share alone on a GPU is on course), a load the table accepts
holds the share and is never past a whole GPU, and where one size is all there is, the LP's one pattern is as
many of it as a GPU holds, so the accepted loads are exactly its multiples up to that.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.policies import arcflow
from gpufleet.policies.default import pattern_loads

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SIZES = st.dictionaries(st.integers(min_value=1, max_value=99), st.integers(min_value=1, max_value=40), min_size=1, max_size=12)


@SETTINGS
@given(SIZES)
def test_every_size_seen_is_on_course_alone_and_no_load_passes_a_gpu(sizes):
    table = pattern_loads(Counter(sizes))
    assert set(table) == set(sizes)
    for w, ok in table.items():
        assert ok.shape == (101,)
        assert ok[w], f"size {w} alone is not a partial sum of any pattern"
        loads = np.flatnonzero(ok)
        assert loads.min() >= w and loads.max() <= 100


@SETTINGS
@given(SIZES, st.integers(min_value=1, max_value=99))
def test_a_load_is_accepted_only_with_the_share_in_it(sizes, w):
    table = pattern_loads(Counter(sizes))
    if w in table:
        assert not table[w][:w].any()  # the share's own size is part of every accepted load


@SETTINGS
@given(st.integers(min_value=1, max_value=99), st.integers(min_value=1, max_value=500))
def test_one_size_packs_as_many_per_gpu_as_fit(w, count):
    ok = pattern_loads(Counter({w: count}))[w]
    assert set(np.flatnonzero(ok)) == {i * w for i in range(1, 100 // w + 1)}


@SETTINGS
@given(SIZES)
def test_the_patterns_carry_the_whole_lp_and_each_fits_a_bin(sizes):
    lp = arcflow.solve(sizes, 100)
    assert lp is not None
    found = lp.patterns()
    assert abs(sum(f for _, f in found) - lp.bins) < 1e-6
    assert all(sum(p) <= 100 for p, _ in found)
    for w, c in sizes.items():  # every item is covered by the patterns' flow
        assert sum(f * p.count(w) for p, f in found) >= c - 1e-6
