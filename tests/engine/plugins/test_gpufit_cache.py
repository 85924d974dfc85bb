"""GpuFit keeps each GPU request shape's per-node verdicts and recomputes only nodes whose version moved: the
verdicts must always be what a fresh computation says, also on a copied snapshot (which shares the original's
epoch and versions)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpufleet.engine.framework import Cycle, FilterResult
from gpufleet.engine.model import Assignment, Gpu, Node, PodRequest
from gpufleet.engine.plugins.gpufit import GpuFit, eligible_gpus, eligible_on, model_mask
from gpufleet.engine.state import ClusterState


def _cluster() -> ClusterState:
    nodes = [Node(f"n{i}", 64_000, 256_000, tuple(Gpu(j, f"g{i}-{j}", "T4" if i % 3 else "V100", 16_000)
                                                  for j in range(1 + i % 4)), gpu_slots=(2 if i % 5 == 0 else 0))
             for i in range(40)]
    return ClusterState(nodes)


SHAPES = [PodRequest("a", gpu_count=1, gpu_milli=500), PodRequest("b", gpu_count=2, gpu_milli=1000),
          PodRequest("c", gpu_count=1, gpu_milli=300, gpu_memory_mib=9000),
          PodRequest("d", gpu_count=1, gpu_milli=1000, gpu_models_allow=frozenset({"V100"})),
          PodRequest("e", gpu_count=3, gpu_milli=250)]


def _reasons(res: FilterResult) -> list[str]:
    """The reason of each node the verdict turns away, in node order (a verdict with one reason gives no codes)."""
    codes = res.reason_codes()
    return [res.reasons[0 if codes is None else int(codes[i])] for i in (~res.ok).nonzero()[0]]


def _check(plugin: GpuFit, state: ClusterState) -> None:
    for r in SHAPES + PLAIN:
        got = plugin.filter(Cycle(r, np.random.default_rng(0)), state)
        want = GpuFit().filter(Cycle(r, np.random.default_rng(0)), state)
        assert (got.ok == want.ok).all() and _reasons(got) == _reasons(want), r.name
        every = eligible_gpus(state, r)  # the selectors' per-node form, in Python, as the vectorised one
        assert all(eligible_on(state, r, i) == every[i].nonzero()[0].tolist() for i in range(len(state))), r.name


def _walk(state: ClusterState, check: Callable[[ClusterState], None], seed: int, steps: int, release_p: float,
          copy_every: int, memory_mib: Callable[[np.random.Generator], int]) -> None:
    """Random reservations and releases of one-GPU shares on ``state``, ``check`` after each step; every
    ``copy_every`` steps a what-if copy moves on alone (some pods released) and both are checked: the original must
    not see the copy's verdicts."""
    rng = np.random.default_rng(seed)
    placed: list[str] = []
    for step in range(steps):
        check(state)
        if placed and rng.random() < release_p:
            state.unreserve(placed.pop(int(rng.integers(len(placed)))))
            continue
        node = state.nodes[int(rng.integers(len(state)))]
        if not node.gpus:
            continue
        j = int(rng.integers(len(node.gpus)))
        milli = int(rng.choice([250, 500, 1000]))
        a = Assignment(pod_key=f"p/{step}", node=node.name, cpu_milli=1000, memory_mib=1000, gpu_indices=(j,), gpu_milli=milli,
                       gpu_memory_mib=(memory_mib(rng),))
        if state.check(a) is None:
            state.reserve(a)
            placed.append(a.pod_key)
        if step % copy_every == copy_every - 1:
            c = state.copy()
            for k in list(placed)[:5]:
                c.unreserve(k)
            check(c)
            check(state)


def test_cached_verdicts_follow_reservations_and_copies() -> None:
    plugin = GpuFit()
    _walk(_cluster(), lambda st: _check(plugin, st), seed=7, steps=300, release_p=0.35, copy_every=50,
          memory_mib=lambda rng: 0)


def _plain_cluster() -> ClusterState:
    """No kubelet slot or device limits: whole-GPU pods and single-GPU shares take GpuFit's per-node room figures."""
    nodes = [Node(f"n{i}", 64_000, 256_000, tuple(Gpu(j, f"g{i}-{j}", "T4" if i % 3 else "V100", 16_000, healthy=(i + j) % 7 != 3)
                                                  for j in range(i % 5)))
             for i in range(40)]
    return ClusterState(nodes)


PLAIN = [PodRequest("w1", gpu_count=1, gpu_milli=1000), PodRequest("w2", gpu_count=2, gpu_milli=1000),
         PodRequest("w4", gpu_count=4, gpu_milli=1000), PodRequest("s1", gpu_count=1, gpu_milli=250),
         PodRequest("s2", gpu_count=1, gpu_milli=500), PodRequest("s3", gpu_count=1, gpu_milli=999),
         PodRequest("z", gpu_count=1, gpu_milli=0)]


def _check_plain(plugin: GpuFit, state: ClusterState) -> None:
    for r in PLAIN + SHAPES:
        got = plugin.filter(Cycle(r, np.random.default_rng(0)), state)
        ok, codes = GpuFit()._fit_rows(state, r, model_mask(state, r), slice(None))  # the general computation, uncached
        assert (got.ok == ok).all() and _reasons(got) == [GpuFit.REASONS[c] for c in codes[~ok]], r.name


def test_room_figures_follow_reservations_and_copies() -> None:
    state = _plain_cluster()
    assert not state.slots_limited and not state.devices_limited
    plugin = GpuFit()
    _walk(state, lambda st: _check_plain(plugin, st), seed=11, steps=400, release_p=0.3, copy_every=60,
          memory_mib=lambda rng: int(rng.choice([0, 4000])))
