"""The target workload a fragmentation score judges placements against, learned online from the pods seen.

Why a module of its own: FGD (``fgd.FGDScore``) and gpufleet's default policy (``policies.default``,
whose plugins share one ``WorkloadModel`` built on this) learn the same way -- task shapes and their
frequencies, refreshed often while little is known and then on growth, older pods fading -- and a
score, a filter and a GPU selector of one profile must all see one learned workload.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

import numpy as np

from ...engine.framework import Cycle, StateKey
from ...engine.model import PodRequest
from ...engine.state import ClusterState
from .workload import POPULARITY_THRESHOLD, TargetWorkload, shape_of, workload_distance

SEEN_KEYS_MAX = 200_000  # pod keys remembered for de-duplication (a retried pod is learned once)
FORGET_BELOW = 0.01  # pods: a learned shape weighing less is dropped (see OnlineWorkload._forget)


def fade(weights: dict, keep: float, below: float) -> None:
    """Scale learned weights by ``keep``, dropping those that fall under ``below``."""
    for k in list(weights):
        w = weights[k] * keep
        if w < below:
            del weights[k]
        else:
            weights[k] = w


class OnlineWorkload:
    """Task shapes and their frequencies, from the pods seen (``observe_pod``) or given (``prime``).

    ``workload`` is the target (the most common shapes covering ``threshold`` of the tasks); ``version``
    is bumped whenever it changes (part of every score cache key).  Refreshed at 1, 2, 4, ... pods, then
    every ``refresh_every`` up to 8x that, then on ``refresh_growth`` growth, at most ``refresh_max_pods``
    apart; at a refresh, pods beyond ``memory_pods`` fade.  ``learn_online`` False: only ``prime`` sets it.
    """

    def __init__(self, learn_online: bool = False, refresh_every: int = 64, refresh_growth: float = 0.1,
                 refresh_max_pods: int = 8192, memory_pods: int = 16384, min_change: float = 0.0,
                 threshold: float = POPULARITY_THRESHOLD, include_cpu_pods: bool = True) -> None:
        self.learn_online = learn_online
        self.refresh_every = refresh_every
        self.refresh_growth = refresh_growth
        self.refresh_max_pods = refresh_max_pods
        self.memory_pods = memory_pods
        self.min_change = min_change
        self.threshold = threshold
        self.include_cpu_pods = include_cpu_pods
        self.workload: TargetWorkload | None = None
        self.version = 0
        self._counts: Counter = Counter()
        self._seen = 0
        self._next_refresh = 0
        self._access: tuple | None = None
        self._keys: OrderedDict = OrderedDict()  # pod keys already learned from
        self._observed: StateKey[bool] = StateKey(f"{type(self).__name__}/observed")  # this cycle's pod was learned from

    def prime(self, requests: Iterable[PodRequest]) -> None:
        """Fix the target workload from a known task population (the paper's setting)."""
        reqs = [r for r in requests if self.include_cpu_pods or r.gpu_count]
        self.workload = TargetWorkload.from_requests(reqs, self.threshold)
        self._access = None
        self.version += 1

    def observe(self, r: PodRequest) -> None:
        if not (self.include_cpu_pods or r.gpu_count):
            return
        self._counts[shape_of(r)] += 1
        self._seen += 1
        # refresh often while little is known, then every ~10% growth: each refresh re-scores all nodes
        if self.workload is None or self._seen >= self._next_refresh:
            weight = float(sum(self._counts.values()))
            if self.memory_pods and weight > self.memory_pods:
                self._forget(self.memory_pods / weight)
            new = TargetWorkload.from_counts(self._counts, self.threshold)
            if self.workload is None or workload_distance(self.workload, new) > self.min_change:
                self.workload = new
                self._access = None
                self.version += 1  # every cached score is stale now
            if self._seen < self.refresh_every:  # at 1, 2, 4, ... pods: a target learned from the first pod alone
                self._next_refresh = 2 * self._seen  # misjudged every placement of a fresh scheduler (real node)
            else:
                grow = self.refresh_every if self._seen < 8 * self.refresh_every else int(self._seen * self.refresh_growth)
                step = max(self.refresh_every, grow)
                self._next_refresh = self._seen + (min(step, self.refresh_max_pods) if self.refresh_max_pods > 0 else step)

    def _forget(self, keep: float) -> None:
        """Weigh everything learned so far by ``keep`` (< 1): a long-running scheduler's old pods fade.

        Shapes left weighing under a hundredth of a pod are dropped, so the learned state stays bounded
        however many distinct shapes a cluster sees over its life.
        """
        fade(self._counts, keep, FORGET_BELOW)

    def tw(self, state: ClusterState) -> tuple[TargetWorkload, np.ndarray]:
        """The target workload and which of the cluster's GPU models each of its shapes may use."""
        tw = self.workload or TargetWorkload.from_counts(Counter())
        key = (self.version, len(state.model_names))
        if self._access is None or self._access[0] != key:
            self._access = (key, tw.access(state.model_names))
        return tw, self._access[1]

    def learns_from(self, r: PodRequest) -> bool:
        """Would ``observe_pod`` learn from a cycle of ``r``?  (Not once it has: a retried pod is learned once.)"""
        if not self.learn_online:
            return False
        key = r.uid or r.key
        return not key or key not in self._keys

    def observe_pod(self, cycle: Cycle) -> None:
        """Learn from this cycle's pod once, and from each pod once however often it is retried."""
        if not self.learn_online or cycle.data.get(self._observed):  # cycle.read / write, without the method calls
            return
        cycle.data[self._observed] = True
        key = cycle.request.uid or cycle.request.key  # a pod recreated under the same name is a new pod
        if key:
            if key in self._keys:
                return
            self._keys[key] = None
            if len(self._keys) > SEEN_KEYS_MAX:
                self._keys.popitem(last=False)
        self.observe(cycle.request)


__all__ = ["FORGET_BELOW", "OnlineWorkload", "SEEN_KEYS_MAX", "fade"]
