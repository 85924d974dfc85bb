"""The default's two reserves, as filters: CPU kept for free GPUs where CPU binds first, whole GPUs kept
for pods that fill them where GPUs bind first.

Why filters and not score terms: where CPU binds first, what decides the idle GPUs is not where pods go but
which pods get the CPU (no score moved it: a CPU-only pod takes a GPU node's CPU whenever it is the node
left); where GPUs bind first, what stays idle is the 190 milli beside each 810-milli share that took a
whole GPU while they were scarce.  Both keep room for pods not yet here, so both step aside for a pod that
has waited ``reserve_max_wait_s`` and for one that would otherwise evict running pods (``cycle.take_held``:
room kept for pods that have not come is never worth a running pod; ``schedqueue.plan_room`` plans it).
Both judge each node by itself (``requeue_on = "room"``); the whole-GPU reserve's scarcity is cluster-wide, so
it gives a queueing hint too (``may_pass``: its verdict now, ``schedqueue.QueueingHint``): a pod it kept out with
room on a freed node stays asleep only while no node with its room passes it.  The figures are in docs/policy.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...engine.args import PluginArgs, arg
from ...engine.framework import Cycle, FilterResult, SharedObserver, StateKey
from ...engine.model import GPU_MILLI, PodRequest
from ...engine.plugins._common import passing
from ...engine.plugins.gpufit import eligible_gpus, model_mask
from ...engine.state import ClusterState
from .patterns import pattern_units
from .workload import WorkloadModel, model_of

# this cycle's share may only join a GPU in use on these nodes (bool per node): read by DescentScore
WHOLE_KEPT: StateKey[np.ndarray] = StateKey("WholeGpuReserve/kept")


@dataclass(frozen=True)
class CpuReserveArgs(PluginArgs):
    cpu_reserve: float = arg(1.0)  # share of the CPU a node's free GPUs need (mean ratio) kept from CPU-only pods; 0: off
    reserve_tight: float = arg(1.0)  # "CPU binds first": CPU demand / CPU capacity at full GPU demand >= this
    reserve_max_wait_s: float = arg(600.0)  # a pod that has waited this long may use the reserve (live, replay)


class CpuReserve(SharedObserver):
    """Filter: once CPU binds first, a CPU-only pod may not take the CPU a node's free GPUs need.

    Need = ``cpu_reserve`` x free GPU milli x the mean CPU per GPU milli of the GPU pods seen.  Off until a
    workload is learned (``refresh_every`` GPU pods) and while CPU demand, scaled to fill the GPUs, stays
    under ``reserve_tight`` x the cluster's CPU.  A pod that waits is told so (``REASON``)."""

    name = "CpuReserve"
    requeue_on = "room"  # per node: its free GPUs' need against its free CPU
    REASON = "node(s) kept their CPU for their free GPUs (CPU is short cluster-wide)"

    def __init__(self, args: CpuReserveArgs | None = None, model: WorkloadModel | None = None) -> None:
        self.args = args or CpuReserveArgs()
        self.model = model or WorkloadModel()

    @classmethod
    def from_config(cls, handle: Any = None, **cfg: Any) -> CpuReserve:
        return cls(CpuReserveArgs.from_config(cls.name, cfg), model_of(handle))

    def on(self, state: ClusterState) -> bool:
        m = self.model
        return m.learned() and m.sums[0] > 0 and m.cpu_tight(state) >= self.args.reserve_tight

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r, a = cycle.request, self.args
        n = len(state)
        if (cycle.take_held or cycle.waited_s >= a.reserve_max_wait_s or r.gpu_count or not a.cpu_reserve
                or r.cpu_milli <= 0 or not self.on(state)):
            return passing(n)
        free_gpu = np.where(state.gpu_usable, state.gpu_free_milli, 0).sum(axis=1)
        need = a.cpu_reserve * self.model.cpu_per_gpu_milli() * free_gpu
        ok = (free_gpu == 0) | (state.cpu_free - r.cpu_milli >= need)
        return FilterResult(ok, (self.REASON,), passes_all=bool(np.logical_and.reduce(ok)))  # ok.all(), unwrapped


def fed_sum(whole_n: np.ndarray, cpu_free: np.ndarray, per_gpu_cpu: float, max_gpus: int) -> float:
    """``np.minimum(whole_n, np.maximum(cpu_free, 0) // per_gpu_cpu).sum()``: whole free GPUs the nodes' free CPU
    can feed, the same number, with the floor division (slow for floats: fmod per node) only where it can bind.

    A node whose free CPU is at least (max_gpus + 2) x ``per_gpu_cpu`` has a quotient of at least max_gpus + 1 even
    after the float division's rounding, above any node's whole GPU count, so it counts all of them.  Every term is
    a whole number (exact in floats), so the sum is the same in any order."""
    cpu = np.maximum(cpu_free, 0)
    at = ((cpu < (max_gpus + 2) * per_gpu_cpu) & (whole_n > 0)).nonzero()[0]
    part = whole_n.take(at)
    return int(np.add.reduce(whole_n)) - int(np.add.reduce(part)) + float(np.add.reduce(np.minimum(part, cpu.take(at) // per_gpu_cpu)))


def fed_lower(whole_n: np.ndarray, cpu_free: np.ndarray, per_gpu_cpu: float, max_gpus: int) -> int:
    """The whole free GPUs of nodes with at least (max_gpus + 2) x ``per_gpu_cpu`` CPU free: the part of ``fed_sum``
    that counts all of a node's whole GPUs (see there; ``per_gpu_cpu`` > 0), so never above it.

    Why: whether whole GPUs are scarce is ``fed_sum(...) < need``; where this bound already reaches ``need`` the answer
    is no, known from one compare and one masked sum over the nodes instead of fed_sum's ten calls and its float floor
    division over every node with whole GPUs and less CPU (about 8 instead of 95 us a share pod at 5,000 nodes)."""
    return int(np.add.reduce(whole_n, where=cpu_free >= (max_gpus + 2) * per_gpu_cpu))


@dataclass(frozen=True)
class WholeGpuReserveArgs(PluginArgs):
    whole_reserve: float = arg(0.05)  # kept: this x (share of GPU demand asking one whole GPU) of a pod's usable GPUs; 0: off
    whole_fill_min: float = arg(0.5)  # a share "leaves a GPU idle": the shares seen that fit beside it bring less than this x its room
    reserve_max_wait_s: float = arg(600.0)  # a pod that has waited this long may use the reserve (live, replay)


class WholeGpuReserve(SharedObserver):
    """Filter: once GPUs bind first and whole free GPUs are scarce, a share that would waste most of one goes
    on a GPU in use (or waits).

    Applies to a single-GPU share whose room left on a whole GPU (1000 - its milli) the shares seen would
    mostly not fill: the shares that fit in that room bring less than ``whole_fill_min`` x the room such pods
    leave (an 810 leaves 190, and pods of 190 milli or less are a few % of that on the Alibaba traces).
    Whole GPUs count only where the node's free CPU can feed them, at the mean CPU per GPU of the GPU pods
    seen.  The reserve is kept for pods that ask one whole GPU (those cannot use a GPU in use, and a
    multi-GPU pod needs whole GPUs together on one node, which a few kept here and there do not give), so
    its size follows their share of the GPU demand seen: while fewer than ``whole_reserve`` x that share of
    the GPUs the pod may use are such GPUs, a node that has one passes only if a GPU in use there takes the
    pod, and the descent keeps off its whole GPUs (``WHOLE_KEPT``: the nodes whose whole GPUs are kept).
    Where no pod seen asks one whole GPU, nothing is kept."""

    name = "WholeGpuReserve"
    requeue_on = "room"  # per node, but "scarce" is cluster-wide: see the module docstring
    REASON = "node(s) kept their whole GPUs for pods that fill them (whole GPUs are scarce)"

    def __init__(self, args: WholeGpuReserveArgs | None = None, model: WorkloadModel | None = None) -> None:
        self.args = args or WholeGpuReserveArgs()
        self.model = model or WorkloadModel()
        self._idle_cache: dict = {}  # (version, share milli) -> leaves_idle
        self._whole: dict = {}  # see _whole_gpus
        self._caps: tuple | None = None  # (epoch, the cluster's CPU milli, its usable GPU milli)

    @classmethod
    def from_config(cls, handle: Any = None, **cfg: Any) -> WholeGpuReserve:
        return cls(WholeGpuReserveArgs.from_config(cls.name, cfg), model_of(handle))

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        kept_ok = self._verdict(cycle.request, cycle.waited_s, cycle.take_held, state)
        if kept_ok is None:
            return passing(len(state))
        kept, ok = kept_ok
        cycle.write(WHOLE_KEPT, kept)
        return FilterResult(ok, (self.REASON,), passes_all=bool(np.logical_and.reduce(ok)))  # ok.all(), unwrapped

    def may_pass(self, request: PodRequest, state: ClusterState, waited_s: float, rows: np.ndarray) -> np.ndarray | None:
        """The queueing hint (``schedqueue.QueueingHint``): of ``rows`` (node indices), [rows] covering every one where
        this filter passes ``request`` now in a try with no held room; None: it may pass on any.  The filter's rule,
        row by row first: a row with no whole GPU its CPU feeds, or with a GPU in use that takes the pod, passes
        whether whole GPUs are scarce or not (None); only when every row keeps its whole GPUs is the cluster-wide
        scarcity worked out, as the filter does (its size follows the pods seen, so a pod leaving one node can lift it
        on every node, or on none)."""
        if self._off(request, waited_s, False, state):
            return None
        m = self.model
        usable, whole_n, usable_n = self._whole_gpus(state, request)
        per_gpu_cpu = m.cpu_per_gpu_milli() * GPU_MILLI
        wn = whole_n.take(rows)
        fed = np.minimum(wn, np.maximum(state.cpu_free.take(rows), 0) // per_gpu_cpu) if per_gpu_cpu > 0 else wn
        whole = usable[rows] & (state.gpu_free_milli[rows] >= GPU_MILLI)
        ok = (fed <= 0) | (eligible_gpus(state, request, rows) & ~whole).any(axis=1)
        if np.logical_or.reduce(ok) or not self._scarce(whole_n, usable_n, per_gpu_cpu, state):
            return None
        return ok

    def _off(self, r: PodRequest, waited_s: float, take_held: bool, state: ClusterState) -> bool:
        """The reserve does not apply to this pod now (whatever the nodes)."""
        a, m = self.args, self.model
        return bool(take_held or waited_s >= a.reserve_max_wait_s or not r.gpu_count or not a.whole_reserve
                    or r.gpu_count != 1 or not 0 < r.gpu_milli < GPU_MILLI or r.mig_profile
                    or not m.learned() or not self.cpu_spare(state) or not self.leaves_idle(r.gpu_milli))

    def _scarce(self, whole_n: np.ndarray, usable_n: int, per_gpu_cpu: float, state: ClusterState) -> bool:
        """Fewer whole GPUs the nodes' free CPU can feed than the reserve keeps for the pods seen."""
        m = self.model
        need = self.args.whole_reserve * m.whole1 / max(m.sums[0], 1.0) * usable_n
        if per_gpu_cpu > 0:
            if fed_lower(whole_n, state.cpu_free, per_gpu_cpu, state.max_gpus) >= need:  # fed_sum is at least this
                return False
            return fed_sum(whole_n, state.cpu_free, per_gpu_cpu, state.max_gpus) < need
        return np.add.reduce(whole_n) < need

    def _verdict(self, r: PodRequest, waited_s: float, take_held: bool,
                 state: ClusterState) -> tuple[np.ndarray, np.ndarray] | None:
        """(kept: [nodes] whose whole GPUs are kept, ok: [nodes] the pod passes), or None: it passes every node."""
        if self._off(r, waited_s, take_held, state):
            return None
        usable, whole_n, usable_n = self._whole_gpus(state, r)
        per_gpu_cpu = self.model.cpu_per_gpu_milli() * GPU_MILLI
        if not self._scarce(whole_n, usable_n, per_gpu_cpu, state):
            return None
        fed = np.minimum(whole_n, np.maximum(state.cpu_free, 0) // per_gpu_cpu) if per_gpu_cpu > 0 else whole_n
        kept = fed > 0
        ok = ~kept
        at = kept.nonzero()[0]  # few: whole GPUs are scarce here
        whole = usable[at] & (state.gpu_free_milli[at] >= GPU_MILLI)
        ok[at] = (eligible_gpus(state, r, at) & ~whole).any(axis=1)
        return kept, ok

    def _whole_gpus(self, state: ClusterState, r: PodRequest) -> tuple[np.ndarray, np.ndarray, int]:
        """(usable [nodes, G], whole free usable GPUs per node, usable GPUs in all) for the pod's GPU models.

        The per-node counts are kept between cycles and taken again only for nodes whose version moved (one or
        two per cycle), not over every GPU of the cluster; per state object (copies share versions) and epoch."""
        key = (state.token, state.epoch, r.gpu_models_allow, r.gpu_models_deny)
        c = self._whole.get(key)
        if c is None or c[1].size != len(state):
            mm = model_mask(state, r)
            usable = state.gpu_usable if mm is None else state.gpu_usable & mm[state.gpu_model]
            counts = (usable & (state.gpu_free_milli >= GPU_MILLI)).sum(axis=1)
            c = self._whole[key] = (usable, counts, state.version.copy(), int(usable.sum()))
            while len(self._whole) > 8:
                self._whole.pop(next(iter(self._whole)))
        usable, counts, vers, usable_n = c
        stale = (vers != state.version).nonzero()[0]
        if stale.size:
            # .take and add.reduce: what [stale] and .sum(axis=1) give, faster over the hundreds of rows that can
            # change between two share pods
            whole = usable.take(stale, axis=0) & (state.gpu_free_milli.take(stale, axis=0) >= GPU_MILLI)
            counts[stale] = np.add.reduce(whole, axis=1, dtype=counts.dtype)
            vers[stale] = state.version.take(stale)
        return usable, counts, usable_n

    def cpu_spare(self, state: ClusterState) -> bool:
        """GPUs bind first, with CPU to spare for the whole GPUs the reserve keeps.

        The CPU left when GPU demand fills the GPUs at the mix seen, (1 - CPU tightness) x the cluster's
        CPU, must cover ``whole_reserve`` of the GPUs at the mean CPU per GPU: where it does not (CPU binds
        first, or nearly: 0.975 on the tuning variant cpumore200), CPU-only pods take the CPU beside the
        kept GPUs and they end idle.  That is the most the reserve keeps (every GPU pod asking one whole
        GPU), not its size for the mix seen: the margin is on purpose, since sized by that mix the check
        would pass on cpumore200 and the loss there come back.
        """
        m = self.model
        if m.sums[0] <= 0:
            return False
        caps = self._caps
        if caps is None or caps[0] != state.epoch:  # capacities change only with the epoch (copies share both)
            caps = self._caps = (state.epoch, float(state.cpu_cap.sum()), float(state.gpu_milli_cap.sum()))
        spare = (1.0 - m.cpu_tight(state)) * caps[1]
        return spare >= self.args.whole_reserve * caps[2] * m.cpu_per_gpu_milli()

    def leaves_idle(self, milli: int) -> bool:
        """Would a share of ``milli`` leave most of a whole GPU's rest idle, by the shares seen?"""
        m = self.model
        key = (m.version, milli)
        hit = self._idle_cache.get(key)
        if hit is None:
            if len(self._idle_cache) > 256:
                self._idle_cache.clear()
            room = pattern_units(GPU_MILLI - milli)
            fillers = sum(u * c for u, c in m.share_sizes.items() if u <= room)
            leaves = m.share_sizes.get(pattern_units(milli), 0) * room
            hit = self._idle_cache[key] = leaves > 0 and fillers < self.args.whole_fill_min * leaves
        return hit


__all__ = ["CpuReserve", "CpuReserveArgs", "WHOLE_KEPT", "fed_lower", "fed_sum", "WholeGpuReserve", "WholeGpuReserveArgs"]
