"""TaintToleration: untolerated NoSchedule/NoExecute taints filter, PreferNoSchedule ones lower the score."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import PodRequest
from ..state import ClusterState
from ._common import MetaCache, passing


@dataclass
class TaintToleration:
    """NoSchedule/NoExecute taints filter; PreferNoSchedule taints lower the score."""

    name: str = "TaintToleration"
    requeue_on = "nodes"  # judges what only node changes change: a pod leaving never helps (schedqueue.may_fit_after)
    _c: MetaCache = field(default_factory=MetaCache)

    skip_fields = ("tolerations",)

    def skips(self, r: PodRequest, state: ClusterState) -> bool:
        """No node with a NoSchedule/NoExecute taint the pod does not tolerate (the filter's verdict, kept per epoch)."""
        return self._verdict(r.tolerations, state).passes_all

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        return self._verdict(cycle.request.tolerations, state)

    def _verdict(self, tols: tuple, state: ClusterState) -> FilterResult:
        def build():
            ok = np.ones(len(state), dtype=bool)
            codes = np.zeros(len(state), dtype=np.int64)
            reasons: list[str] = []
            for i, n in enumerate(state.nodes):
                for t in n.taints:
                    if t.effect not in ("NoSchedule", "NoExecute"):
                        continue
                    if not any(x.tolerates(t) for x in tols):
                        ok[i] = False
                        text = f"node(s) had untolerated taint {{{t.key}: {t.value}}}" if t.value else f"node(s) had untolerated taint {{{t.key}}}"
                        if text not in reasons:
                            reasons.append(text)
                        codes[i] = reasons.index(text)
                        break
            return ok, codes, tuple(reasons) or ("node(s) had untolerated taint",)

        def verdict() -> FilterResult:  # kept per epoch (it reads node metadata only): no new result per cycle
            ok, codes, reasons = build()
            return passing(len(state)) if ok.all() else FilterResult(ok, reasons, codes)

        return self._c.get((tols, "result"), state, verdict)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        tols = cycle.request.tolerations
        out = np.zeros(nodes.size)
        for k, i in enumerate(nodes):
            out[k] = -sum(
                1 for t in state.nodes[int(i)].taints if t.effect == "PreferNoSchedule" and not any(x.tolerates(t) for x in tols)
            )
        return out

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        lo = raw.min() if raw.size else 0
        return 100.0 * (1 - raw / lo) if lo < 0 else np.full(raw.size, 100.0)

    def cache_key(self, cycle: Cycle):
        return None
