"""SpotCapacity (filter + score + gang partitions): spot nodes only for pods that tolerate interruption.

Spot GPUs cost a fraction of on-demand ones and go away at a provider's notice, so the rules a platform
engineer expects are: work that checkpoints runs there and goes there first, work that does not never
lands there unless the cluster allows it, a distributed job does not straddle the two (a spot interruption
would stop the on-demand half too, which then pays for nothing), and no pod is placed on a node that
already has an interruption notice.  What counts as spot, as a notice and as interruptible is
``engine.capacity.SpotConfig`` (the plugin's arguments, validated when the profile is built)::

    pluginConfig:
      SpotCapacity:
        spot_labels: ["node.kubernetes.io/lifecycle=spot"]   # added to the providers' labels
        interruptible_priority_classes: [batch-spot]
        on_demand_pods_on_spot: never                          # or allow
        mixed_gangs: false

* filter: ``never`` pods skip spot nodes; a gang member skips nodes of the other capacity type once a
  member of its group runs (or is reserved) on one; every pod skips nodes with an interruption notice,
  also pods that tolerate every taint.
* score: ``prefer`` pods score spot nodes 100, ``allow`` pods on-demand nodes 100 (the rest 0); it has
  no opinion (``applies`` is false) in a cluster without spot nodes or for ``never`` pods.
* ``gang_partitions``: the node sets ``place_gang`` tries a whole gang in, spot first for a gang that
  prefers it, so a gang that does not fit on spot falls back to on-demand as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..capacity import ALLOW, NEVER, PREFER, SPOT, SpotConfig
from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ._common import MetaCache, passing

PLUGIN = "SpotCapacity"
R_SPOT = "node(s) are spot and the pod does not tolerate interruption (gpufleet.io/spot or an interruptible PriorityClass)"
R_NOTICE = "node(s) have an interruption notice"


@dataclass
class SpotCapacity:
    config: SpotConfig = field(default_factory=SpotConfig)
    name: str = PLUGIN
    _c: MetaCache = field(default_factory=MetaCache)
    _gstamp: tuple = ()
    _gmap: dict = field(default_factory=dict)

    # --- node metadata, cached per state epoch ----------------------------------------------------
    def spot_mask(self, state: ClusterState) -> np.ndarray:
        return self._c.get(("spot", id(self.config)), state,
                           lambda: np.array([self.config.is_spot(n.labels) for n in state.nodes], dtype=bool))

    def notice_mask(self, state: ClusterState) -> np.ndarray:
        return self._c.get(("notice", id(self.config)), state,
                           lambda: np.array([self.config.interruption(n.taints) is not None for n in state.nodes], dtype=bool))

    def _group_on(self, r: PodRequest, state: ClusterState) -> set[bool]:
        """Capacity types (True: spot) the pod's gang already runs or is reserved on."""
        if not r.pod_group or self.config.mixed_gangs:
            return set()
        return {on for key, on in self._groups(state).get((r.namespace, r.pod_group), {}).items() if key != r.key}

    def _groups(self, state: ClusterState) -> dict[tuple[str, str], dict[str, bool]]:
        """(namespace, pod group) -> {member: on spot} for the placed members, rebuilt when any node's pods changed."""
        stamp = (id(state), state.epoch, int(state.version.sum()), len(state.assignments))
        if self._gstamp != stamp:
            spot = self.spot_mask(state)
            out: dict[tuple[str, str], dict[str, bool]] = {}
            for a in state.assignments.values():
                if a.pod_group:
                    i = state.index.get(a.node)
                    if i is not None:
                        out.setdefault((a.pod_key.split("/", 1)[0], a.pod_group), {})[a.pod_key] = bool(spot[i])
            self._gmap, self._gstamp = out, stamp
        return self._gmap

    # --- filter -----------------------------------------------------------------------------------
    skip_fields = ()  # not a field: no request field matters

    def skip_stamp(self, state: ClusterState) -> int:
        """The masks are the config's (kept per epoch under its id, as ``spot_mask``)."""
        return id(self.config)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No spot node and no interruption notice in the cluster: nothing to check for any pod."""
        return not self._c.any(("spot", id(self.config)), state, self.spot_mask) and \
            not self._c.any(("notice", id(self.config)), state, self.notice_mask)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        any_spot = self._c.any(("spot", id(self.config)), state, self.spot_mask)
        any_notice = self._c.any(("notice", id(self.config)), state, self.notice_mask)
        if not any_spot and not any_notice:  # the common cluster: nothing to check
            return passing(len(state))
        spot, notice = self.spot_mask(state), self.notice_mask(state)
        never = self.config.pod_policy(r) == NEVER
        group = self._group_on(r, state) if any_spot else set()
        if not any_notice and not (never and any_spot) and len(group) != 1:
            return passing(len(state))
        reasons = [R_NOTICE, R_SPOT]
        ok = ~notice
        codes = np.zeros(len(state), dtype=np.int64)
        if never:
            codes[ok & spot] = 1
            ok = ok & ~spot
        if len(group) == 1:
            on_spot = next(iter(group))
            other = ~spot if on_spot else spot
            reasons.append(f"node(s) are {'on-demand' if on_spot else 'spot'} and pod group {r.namespace}/{r.pod_group} "
                           f"already runs on {SPOT if on_spot else 'on-demand'} nodes (a gang never spans both)")
            codes[ok & other] = 2
            ok = ok & ~other
        return FilterResult(ok, tuple(reasons), codes)

    # --- score ------------------------------------------------------------------------------------
    def applies(self, cycle: Cycle, state: ClusterState) -> bool:
        return self.config.pod_policy(cycle.request) != NEVER and self._c.any(("spot", id(self.config)), state, self.spot_mask)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        spot = self.spot_mask(state)[nodes]
        want = self.config.pod_policy(cycle.request) == PREFER
        return np.where(spot == want, 1.0, 0.0)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return 100.0 * raw

    def cache_key(self, cycle: Cycle) -> Any:
        return None

    # --- gangs ------------------------------------------------------------------------------------
    def gang_partitions(self, members: Sequence[PodRequest], state: ClusterState) -> list[np.ndarray] | None:
        """Node sets to place a whole gang in, in order; None: no restriction."""
        spot = self.spot_mask(state)
        if self.config.mixed_gangs or not members or not spot.any() or spot.all():
            return None
        policies = {self.config.pod_policy(m) for m in members}
        if NEVER in policies:
            return [~spot]
        return [spot, ~spot] if policies == {PREFER} else [~spot, spot]


def make(**args: Any) -> SpotCapacity:
    """The registry's factory: typed, validated arguments (``SpotConfig.from_args``)."""
    return SpotCapacity(SpotConfig.from_args(PLUGIN, **args))


__all__ = ["ALLOW", "NEVER", "PLUGIN", "PREFER", "SpotCapacity", "make"]
