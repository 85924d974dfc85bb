"""What every packing run of one trace and seed shares, in a module that imports no engine plugin or policy.

The arrival order (``workload_order``) and the per-process memo of what every run of one trace and seed computes
alike are read by the packing runs and by the offline bound's MIP (``bounds/bound.py``).  Kept apart from
``packing`` (which builds the policies' profiles) so that ``gpufleet simulate`` can start the MIP's process before it
imports the engine and the policies for the runs: the MIP needs the trace, numpy and HiGHS only.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..traces.trace import TracePod


def workload_order(pods: Sequence[TracePod], capacity_milli: int, tune: float, seed: int) -> list[tuple[TracePod, str]]:
    """Arrival order: the trace sorted by name and shuffled, then resampled pods.

    Follows the paper's simulator (``SortClusterPods`` + ``tuneUpPods``):
    resampled pods are appended until drawing one whose per-GPU milli would
    push the demand over ``tune`` x capacity.  Returns (pod, unique name).
    """
    rng = np.random.default_rng(seed)
    base = sorted(pods, key=lambda p: p.name)
    order = [(base[i], base[i].name) for i in rng.permutation(len(base))]
    if tune <= 0 or not any(p.num_gpu for p in base):  # no GPU pod: resampling could never reach the target
        return order
    target = tune * capacity_milli
    demand = sum(p.total_gpu_milli for p in base)
    if demand > target:  # tune down: drop random pods until under the target
        while demand > target and order:
            p, _ = order.pop(int(rng.integers(len(order))))
            demand -= p.total_gpu_milli
        return order
    i = 0
    while True:
        p = base[int(rng.integers(len(base)))]
        per_gpu = p.gpu_milli if p.num_gpu else 0
        if demand + per_gpu > target:
            break
        demand += p.total_gpu_milli
        order.append((p, f"{p.name}-tuned-{i}"))
        i += 1
    return order


# What every run of one trace and seed computes the same whatever the policy (the pods' requests, the arrival
# order), kept for the next run in this process: ``gpufleet simulate`` gives each worker several runs of the
# same trace.  Keyed by the objects themselves (held here, so an id is never reused while its entry lives).  The
# least recently used entry goes first; 32 entries hold about ten seeds of the default trace (three entries and
# about 6 MB a seed: the arrival order, the arrivals, the keep-first LP's program and basis), so the workers of a
# ten-seed ``gpufleet simulate`` build them once per seed instead of again for nearly every run.
_MEMO: dict[tuple, tuple] = {}
_MEMO_MAX = 32


def memo(key_objs: tuple, key: tuple, make: Callable[[], object]) -> object:
    """``make()``, or what it gave for the same ``key_objs`` (by identity) and ``key`` (by value) in this process."""
    k = (*map(id, key_objs), *key)
    hit = _MEMO.get(k)
    if hit is not None and all(a is b for a, b in zip(hit[0], key_objs)):
        _MEMO[k] = _MEMO.pop(k)  # now the most recently used
        return hit[1]
    value = make()
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[k] = (key_objs, value)
    return value
