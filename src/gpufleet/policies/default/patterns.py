"""The share-pattern term: GPU loads that keep a GPU on course to one of the share-packing LP's patterns.

Why: at 100% arrived on the default trace every idle GPU-milli of the default sat on GPUs holding shares,
and an arc-flow LP packed the same shares into 9-15 fewer GPUs; local measures cannot see this (a 230
beside a 590 fills the GPU as well as a 230 beside a 550 today, but only the second leaves room for the
220 that completes it).  At each workload refresh the LP (``policies.arcflow``) packs the share sizes seen
into the fewest GPUs; its flow splits into per-GPU patterns, and per size the GPU loads that are partial
sums of a pattern holding that size are kept.  A share joining a used GPU gains ``pattern_weight`` when
the GPU's new load is such a load and loses ``pattern_penalty`` when it is not; empty GPUs are neutral.

A term of the descent's per-GPU score (``descent.DescentScore``), not a node score of its own: a node's
score is its best GPU's, and the pattern decides which GPU that is (the best of a sum is not the sum of
the bests).  A shared component of the profile (``pluginConfig: {SharePatterns: {...}}``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...engine.args import PluginArgs, arg
from ...engine.model import GPU_MILLI
from .. import arcflow

NAME = "SharePatterns"
PATTERN_STEP = 10  # milli-GPU grid of the share-packing LP


def pattern_units(milli: int) -> int:
    """A share's size on the LP's grid (at least one step): what is learned and what is looked up."""
    return max(1, round(milli / PATTERN_STEP))


def pattern_loads(sizes: Counter) -> dict[int, np.ndarray]:
    """{size: ok[load]} from the arc-flow LP that packs ``sizes`` (size -> count) into the fewest GPUs.

    The LP's flow splits into per-GPU patterns (multisets of sizes summing to at most a GPU).
    ``ok[size][load]`` is True when some pattern has a sub-multiset holding ``size`` whose sizes
    sum to ``load``: a share of that size that brings a GPU to that load keeps the GPU on course
    to become one of the LP's patterns.
    """
    n = GPU_MILLI // PATTERN_STEP
    ws = sorted(w for w in sizes if 0 < w < n)
    lp = arcflow.solve({w: sizes[w] for w in ws}, n) if ws else None
    if lp is None:
        return {}
    ok = {w: np.zeros(n + 1, dtype=bool) for w in ws}
    for pattern in {p for p, _ in lp.patterns()}:
        for i, w in enumerate(pattern):  # sub-multisets holding pattern[i]: sums of it and any subset of the rest
            sums = {0}
            for x in pattern[:i] + pattern[i + 1:]:
                sums |= {t + x for t in sums}
            for t in sums:
                ok[w][t + w] = True
    return ok


@dataclass(frozen=True)
class SharePatternArgs(PluginArgs):
    pattern_weight: float = arg(50.0)  # quant steps gained by a share whose GPU's new load is part of a pattern
    pattern_penalty: float = arg(50.0)  # ... and lost when it is not


class SharePatterns:
    """The LP's patterns for the share sizes a ``WorkloadModel`` has seen, re-solved when they change."""

    def __init__(self, args: SharePatternArgs | None = None) -> None:
        self.args = args or SharePatternArgs()
        self._patterns: tuple | None = None  # (version, {size: bool[load]}, the sizes it was solved for)

    @classmethod
    def from_config(cls, **cfg) -> SharePatterns:
        return cls(SharePatternArgs.from_config(NAME, cfg))

    @property
    def on(self) -> bool:
        return bool(self.args.pattern_weight or self.args.pattern_penalty)

    def table(self, version: int, share_sizes: Counter) -> dict[int, np.ndarray]:
        """{share size: ok[load]}: loads (PATTERN_STEP units, the share included) that some pattern of the LP takes."""
        p = self._patterns
        if p is None or p[0] != version:  # the same sizes as last time: the same LP
            table = p[1] if p is not None and p[2] == share_sizes else pattern_loads(share_sizes)
            p = self._patterns = (version, table, Counter(share_sizes))
        return p[1]

    def term(self, version: int, share_sizes: Counter, milli: int, left: np.ndarray) -> np.ndarray | None:
        """Per GPU (``left``: free milli, [k, G]), what a share of ``milli`` gains or loses there; None: no pattern holds it."""
        ok = self.table(version, share_sizes).get(pattern_units(milli))
        if ok is None:
            return None
        used = GPU_MILLI - left
        load = np.minimum(np.maximum(np.rint((used + milli) / PATTERN_STEP).astype(np.int64), 0), ok.size - 1)  # np.clip, without its overhead
        return np.where(used > 0, np.where(ok[load], self.args.pattern_weight, -self.args.pattern_penalty), 0.0)


def patterns_of(handle) -> SharePatterns:
    return handle.shared(NAME) if handle is not None else SharePatterns()


__all__ = ["NAME", "PATTERN_STEP", "SharePatternArgs", "SharePatterns", "pattern_loads", "pattern_units", "patterns_of"]
