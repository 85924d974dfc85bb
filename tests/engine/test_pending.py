"""Pending pods by decision group (``engine.pending``): one list per group in queue order, the cheap "could it fit"
tests, and a retry pass that tries only what a change may let fit."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.engine.model import Assignment, PodRequest
from gpufleet.engine.pending import PendingGroups, could_fit

from tests.builders import T4, make_node, state_of


def req(name: str, gpu_milli: int = 1000, gpu_count: int = 1, cpu_milli: int = 1000, priority: int = 0) -> PodRequest:
    return PodRequest(name, "t", cpu_milli=cpu_milli, memory_mib=1024, gpu_count=gpu_count, gpu_milli=gpu_milli, priority=priority)


def test_a_group_is_kept_in_queue_order_and_dropped_when_empty():
    reqs = [req("c"), req("a"), req("b"), req("share", gpu_milli=500)]
    w = PendingGroups(reqs, {})
    assert len(w.group_list) == 2  # the three whole-GPU pods decide alike
    w.add(0, 1.0)
    w.add(1, 5.0)
    w.add(2, 1.0)
    w.add(2, 0.0)  # already waiting: keeps its place
    group = w.group_of[0]
    assert [i for _, i in w.groups[group]] == [2, 0, 1]  # first seen, then name
    assert w.head(group) == 2 and 2 in w and len(w) == 3
    assert w.count.tolist() == [3, 0]  # per group id: what the retry round skips when 0
    assert [q.key for q in w.first(group, 2)] == ["t/b", "t/c"]
    for i in (2, 0, 1):
        w.remove(i)
    assert w.head(group) is None and group not in w.groups and len(w) == 0
    w.remove(1)  # not waiting: nothing happens
    assert w.count.tolist() == [0, 0]


def test_priority_splits_groups():
    w = PendingGroups([req("low"), req("high", priority=100)], {})
    assert w.group_of[0] != w.group_of[1]


@pytest.mark.parametrize("used, pod, fits", [
    ((0, 0), req("whole"), True),
    ((1000, 1000), req("whole"), False),
    ((600, 1000), req("share", gpu_milli=400), True),
    ((700, 1000), req("share", gpu_milli=400), False),
    ((0, 600), req("two", gpu_count=2), False),
    ((0, 0), req("cpu", cpu_milli=20_000), False),
])
def test_room_tests_agree_with_each_other(used, pod, fits):
    st = state_of(make_node("n", 2, T4, cpu_milli=16_000))
    for g, m in enumerate(used):
        if m:
            st.reserve(Assignment(f"t/u{g}", "n", 0, 0, gpu_indices=(g,), gpu_milli=m, gpu_memory_mib=(0,)))
    w = PendingGroups([pod], {})
    assert w.with_room(st, [0]).tolist() == [fits]
    assert w.fits_on(0, st, [0]) is fits
    assert could_fit(st, pod) is fits
    assert w.with_room(st, []).tolist() == [False]  # no node gained room: nothing to try


def test_every_arrival_is_counted_once_in_the_progress_bar_also_when_it_preempts():
    """A pod placed by preempting used to skip its progress tick: the bar stopped short of the pods replayed."""
    from gpufleet.simulator.experiments.replay import run_replay
    from gpufleet.simulator.traces.workload import Workload

    from tests.builders import make_node as node

    nodes = [node("n0", 4, T4, cpu_milli=32_000)]
    reqs = [req(f"be{i}") for i in range(4)] + [req(f"ls{i}", priority=100) for i in range(2)]
    wl = Workload(reqs, np.array([0.0, 1, 2, 3, 100, 101]), np.array([10_000.0] * 4 + [100.0] * 2), np.full(6, np.nan))
    ticks: list[int] = []
    r = run_replay(nodes, wl, "bestfit", warmup=0.0, frag=False, progress=ticks.append)
    assert r.preemptions == 2 and r.pods_arrived == 6
    assert sum(ticks) == 6
