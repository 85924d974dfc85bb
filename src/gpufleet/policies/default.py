"""gpufleet's default placement policy: stranding-aware fragmentation descent, and reserves (CPU for free GPUs, whole GPUs for whole-GPU pods).

FGD (``paper.fgd.FGDScore``) scores a placement by how much it grows a node's
*expected fragment* over a target workload.  On the Alibaba traces, what FGD
still leaves idle at 100% arrived demand is mostly two things (measured with
``gpufleet simulate`` on the default trace): GPUs on nodes whose CPU is gone,
and slivers of shared GPUs that no task size can fill.  This policy keeps
FGD's expected-fragment term and adds both, all in milli-GPU so they add up:

* **stranded GPU**: GPU milli on the node that its remaining CPU (and memory)
  cannot feed, at the workload's own CPU-per-GPU ratio ``rho``:
  ``max(0, gpu_left - cpu_left / rho)``.  Placing a CPU-heavy task on a
  GPU-rich, CPU-poor node raises it; FGD only sees this through the few task
  shapes that happen to lack CPU there.
* **unfillable sliver**: for each GPU with ``L`` milli free, the part of ``L``
  that no sum of the workload's GPU-share sizes can fill (an unbounded
  knapsack over the sizes seen).  ``L = 190`` next to an 810 task wastes 30
  when 160-milli tasks exist; FGD counts all 190 as fragment for every larger
  task, whether or not something small could use it.

Two more terms came from the trace variants of issue 14 (``bench/variants.py``,
``bench/idle_breakdown.py``):

* **model pressure**: where a share of the pods pins GPU models (``gpu_spec``),
  the default used to lose to FGD because it filled the scarce models' GPUs
  with pods that could have run anywhere (on a pinned variant, 144 of 265 P100
  GPUs held unpinned pods vs FGD's 66, and 351 GPUs of P100-pinned demand
  failed vs 282).  The policy learns, from every GPU pod it sees (also the
  ones no node can take: those are the pinned pods a full model turns away),
  which share of all GPU demand is pinned to each model.  Demand pinned to
  several models is spread over them by water-filling, so that it lands where
  the pinned load per GPU is lowest (not by capacity: that made the big model
  look pressured and pushed pods with a choice onto the scarce ones).  Each
  cycle, pressure = that share x the cluster's free GPU milli / the model's
  free GPU milli, i.e. how much of the model's free GPUs the pinned pods still
  to come want if demand keeps its mix; a placement pays ``model_weight x
  pressure`` per milli-GPU it uses there.  Because it is recomputed per cycle
  it feeds back: as pods with a choice use a model up, its pressure rises.
  (A static share of capacity, the first version, lost to FGD with 40% of
  pods pinned: every model looked alike.)  It is added on top of the cached
  descent (``post_score``), so it costs one lookup per node.
* **best fit among equals** (``share_fit``): a share's placements that score
  alike go to the GPU left with the least free milli.
* **stranding over the ratio distribution, where CPU binds**: GPU left unfed by
  CPU averaged over quantiles of the pods' CPU-per-GPU ratio instead of their
  mean ratio alone.  Always on, it cut cpu250 from 6.55% to 4.81% but raised
  multigpu30 from 3.05% to 5.48% (FGD 3.63%): where GPUs run out first, the
  CPU-heavy quantiles make the policy keep CPU that no one will need.  So it
  applies only when the workload seen makes CPU the binding resource: its CPU
  demand, scaled to fill the GPUs, is at least the cluster's CPU capacity
  (``quantile_tight`` 1.0, the point where CPU would run out first; measured
  0.70-0.84 on the default, multi-GPU, pinned and share traces, 1.02 on cpu250).
  Where CPU is short, not all GPU demand can run, and the CPU-hungriest pods
  (by ratio) are the ones that should give way: the quantiles are taken over
  the demand left once they have (``quantile_trim``).  And where CPU is far too
  short (``quantile_tight_max`` 1.2, at 1.27 on the generated tuning variant
  cpumore350 the quantiles lost to FGD and the mean ratio beat it), the mean
  ratio again.  Both came from the generated cpumore* tuning variants (more of
  the trace's CPU-only pods, seeded), so that the release's cpu* variants stay
  held out: cpu300 went from 13.27% to 12.6% (FGD 14.05%).

The fifth term came from the bound (``simulator/bound.py``) and the repack yardstick of
``bench/idle_breakdown.py``: at 100% arrived on the default trace every idle GPU-milli of the
default sat on GPUs holding shares, and an arc-flow LP packed the same shares into 9-15 fewer
GPUs (0.14-0.24 points of capacity, seeds 42-51), where an offline best-fit-decreasing repack
found at most 5.
Local measures cannot see this: a 230 beside a 590 fills the GPU as well as a 230 beside a 550
today, but only the second leaves room for the 220 that completes it.  So:

* **share patterns** (``pattern_weight``, ``pattern_penalty``): at each workload refresh the
  policy solves the arc-flow LP that packs the share sizes seen so far into the fewest GPUs,
  splits its flow into per-GPU patterns, and keeps, per size, the GPU loads that are partial sums
  of a pattern holding that size.  A share joining a used GPU gains ``pattern_weight`` when the
  GPU's new load is such a load, loses ``pattern_penalty`` when it is not; empty GPUs are
  neutral.  Both are large (50 quant steps): among used GPUs, following the LP's patterns
  outranks the descent, which then decides among the GPUs alike.  Idea after pattern-based
  online stochastic bin packing (Gupta and Radovanovic; Banerjee and Freund).  On the tuning
  seeds it left 3.73% of the default trace idle against 3.86% (its shares on 3 GPUs more than
  the LP bound for them, where best-fit-decreasing offline needs 6-8 more); over 10 seeds the
  tuning split's pinned variants went to 3.75-3.87% from 4.08-4.22%.  Where CPU binds first (``quantile_tight``) GPU
  stranding is the leading loss and the term stays off: on cpu250 it cost 0.1 point.

The last part is a filter, not a term, and came from the generated ``cpumore*`` tuning variants
(``bench/variants.py``): where CPU binds first, what decides the idle GPUs is not where pods go but
which pods get the CPU.  On cpumore350 (seed 42, 100% arrived) the default used 97.8% of the CPU and
left 20.4% of the GPUs idle, 988 of them on nodes whose CPU was gone, about half of it held by CPU-only
pods; no score moves that (steering CPU-only pods away from nodes with free GPUs, at any weight, did
not), because a CPU-only pod takes a GPU node's CPU whenever it is the node left.  So:

* **CPU reserve** (``cpu_reserve``, ``reserve_tight``): once the workload seen makes CPU the binding
  resource (CPU demand scaled to fill the GPUs >= the cluster's CPU, the point the ratio quantiles
  use too) and a workload has been learned, a node keeps from CPU-only pods the CPU its free GPUs
  need at the mean CPU-per-GPU ratio of the GPU pods seen; a CPU-only pod that would eat into it does
  not fit there (it waits, with its own reason), as a taint on GPU nodes does, but only while CPU is
  short and only for the CPU the free GPUs need.  On the tuning seeds, cpumore350 went from 20.9% to
  4.4% idle and cpu250 from 5.05% to 4.01%; fewer pods were turned away in all (cpumore350, seed 42:
  1,951 against 2,271 by 100% arrived), but CPU-only pods are the ones turned away (1,716 against
  893), and 2.7% more of the CPU stays free, kept beside GPUs that have not been asked for yet.  Where
  GPUs run out first it never engages, and every other tuning variant's runs are unchanged to the
  last digit.  A pod that has waited ``reserve_max_wait_s`` (10 minutes) may use the reserve, so
  that GPU demand which stopped coming does not hold CPU for good (the packing experiment has no
  waiting: a pod that does not fit is turned away).  ``cpu_reserve: 0`` turns it off.

The other reserve, for whole GPUs, came from the bound (``simulator/bound.py``) on the default trace: once
whole GPUs run out, what stays idle is the 190 milli beside each 810-milli share (181 of 232 idle
GPU-equivalents, seed 42), because a pod of 190 or less is rare; every 810 that takes a whole GPU while they
are scarce turns a whole-GPU pod away later, and the shares' own packing was within 0.05 points of its LP
bound.  The MIP bound gets to 3.1% by leaving 810s out.  So:

* **whole-GPU reserve** (``whole_reserve``, ``whole_fill_min``): a single-GPU share "leaves a GPU idle" when
  the shares seen that fit in what it leaves of a whole GPU bring less than ``whole_fill_min`` (half) of the
  room such shares leave (the 810s: pods of 190 or less bring 7% of it; a 470's 530 is filled by other 470s).
  While fewer than ``whole_reserve`` (5%) x the share of the GPU demand seen that asks one whole GPU of the GPUs
  the pod may use are whole, free and on a node whose free CPU can feed them (at the mean CPU per GPU seen),
  such a share goes on a GPU in use or waits, with its own reason, so that pods asking one whole GPU get them.
  Only where GPUs bind first with CPU to spare for the kept GPUs (``_cpu_spare_for_whole``): on the tuning
  variant cpumore200 (CPU tightness 0.975) CPU-only pods took the CPU beside the kept GPUs and it cost 0.3
  points until that check came in; where CPU binds first the CPU reserve applies instead.  Like the CPU
  reserve it steps aside for a pod that has waited ``reserve_max_wait_s`` and for one that would otherwise
  evict (``take_held``).  The first version kept a flat 5% of the GPUs (tuning seeds 42-44: default trace
  3.58%, 2%: 3.68, 8%: 3.49); over every variant it lost on held-out ones with few or no one-GPU pods
  (multigpu50: two seeds behind FGD, the 8-GPU pods it made room for cannot use GPUs kept here and there;
  gpushare100 has no whole-GPU pods), hence the size in proportion to that demand.  Seeds 42-51: default
  trace 3.74 -> 3.66%, CPU-bound variants unchanged (README, "Whole GPUs kept for pods that fill them").
  The cost: 810s wait (the packing experiment turns them away: that is how the gain is made); in the trace
  replay p99 wait 1,467 s against 1,457 and GPU allocation 84.43% against 84.34% at load 1.0.
  ``whole_reserve: 0`` turns it off.

Everything a live scheduler could know: the target workload (task shapes and
frequencies, the CPU/GPU and memory/GPU ratios) is learned online from the pods
the scheduler has seen, never from the trace.  A long-running scheduler re-learns at least every
``refresh_max_pods`` pods and lets older pods fade (``memory_pods``), so the target follows a
workload whose mix drifts; the traces here see fewer GPU pods than that memory before their
100%-arrived point, so their figures do not depend on it.  CPU-only tasks are left out of
it (they do not use GPUs, so they do not define what a GPU fragment is), and
like FGD it keeps the most common shapes covering a share of the tasks (85%, chosen
on the tuning split; FGD uses 90%).  The score is
quantised (40 milli-GPU steps) and ties go to the first node of a fixed seeded
order, which consolidates load the way FGD's integer scores do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..engine.config import Registry
from ..engine.framework import Cycle, FilterResult, GpuChoice
from ..engine.model import GPU_MILLI, PodRequest
from ..engine.plugins._common import all_pass
from ..engine.plugins.gpufit import eligible_gpus, model_mask
from ..engine.state import ClusterState
from . import arcflow
from .paper._common import take_packed
from .paper.fgd import FORGET_BELOW, FGDScore, fade
from .paper.workload import frag_amount, node_view


@dataclass
class StrandAwareFragScore(FGDScore):
    """FGD's expected fragment + GPU stranded by CPU/memory + unfillable GPU slivers."""

    name: str = "StrandAwareFragScore"
    # its reserves judge each node by itself (exact for the CPU reserve's per-node CPU); the whole-GPU reserve's
    # cluster-wide count of free whole GPUs is not: a pod it kept out is retried at its backoff (live) or when
    # a node it could fit on gains room (replay).  See schedqueue.may_fit_after.
    requeue_on = "room"
    learn_online: bool = True
    threshold: float = 0.85  # popular shapes covering this share of tasks (FGD: 0.9; 0.85 on the tuning split)
    include_cpu_pods: bool = False
    strand_weight: float = 16.0
    sliver_weight: float = 8.0
    memory_strand: bool = True
    quant_milli: float = 40.0
    refresh_growth: float = 1.0  # re-learn the workload at 64, 128, ... 512 pods, then each doubling (at most refresh_max_pods apart)
    model_weight: float = 16.0
    pressure_cap: float = 4.0
    share_fit: float = 0.5  # < 1: ties between share placements go to the GPU left with the least free milli
    quantile_tight: float = 1.0  # strand_quantiles apply once CPU binds first: CPU demand / CPU capacity at full GPU demand >= this
    quantile_tight_max: float = 1.2  # ... and not beyond: CPU this short does better with the mean ratio (tuning family cpumore)
    quantile_trim: bool = True  # quantiles only over the GPU demand the cluster's CPU can feed
    strand_quantiles: int = 4  # > 0: stranding averaged over this many quantiles of the pods' CPU-per-GPU ratio (where CPU binds); 0: the mean ratio
    pattern_weight: float = 50.0  # quant steps: a share joining a used GPU gains this when the GPU's new load is part of a pattern of the share-packing LP
    pattern_penalty: float = 50.0  # ... and loses this when it is not
    cpu_reserve: float = 1.0  # filter: once CPU binds first, a GPU node keeps this share of the CPU its free GPUs need (mean ratio) from CPU-only pods; 0: off
    reserve_tight: float = 1.0  # ... "CPU binds first": CPU demand / CPU capacity at full GPU demand >= this
    reserve_max_wait_s: float = 600.0  # ... a CPU-only pod that has waited this long may use the reserve (live, replay); the whole-GPU reserve too
    whole_reserve: float = 0.05  # filter: once GPUs bind first, while fewer than this x (share of the GPU demand asking one whole GPU) of a pod's usable GPUs are whole, free and fed, a share that would leave most of a whole GPU's rest idle does not get one; 0: off
    whole_fill_min: float = 0.5  # ... "would leave it idle": the shares seen that fit beside it bring less than this x the room it leaves
    _ratios: Counter = field(default_factory=Counter, repr=False)  # rounded CPU milli per GPU milli -> GPU milli
    _rhos: tuple | None = field(default=None, repr=False)
    _pinned: dict = field(default_factory=dict, repr=False)  # frozenset(models) -> GPU milli of pods pinned to them
    _pressure: tuple | None = field(default=None, repr=False)
    _sums: list = field(default_factory=lambda: [0.0, 0.0, 0.0], repr=False)  # GPU milli, CPU milli, memory MiB of GPU tasks
    _sliver: tuple | None = field(default=None, repr=False)
    _bcache: tuple | None = field(default=None, repr=False)
    _rates: tuple | None = field(default=None, repr=False)
    _gpu_index: tuple | None = field(default=None, repr=False)  # (epoch, flat indices of usable GPUs, their model ids)
    _cpu_all: float = 0.0  # CPU milli of every pod seen, CPU-only ones too
    _tight: tuple | None = field(default=None, repr=False)
    _q_rhos: np.ndarray | None = field(default=None, repr=False)  # this cycle's ratio quantiles, None: the mean ratio
    _share_sizes: Counter = field(default_factory=Counter, repr=False)  # single-GPU share size (PATTERN_STEP units) -> pods
    _patterns: tuple | None = field(default=None, repr=False)  # (version, {size: bool[load]}, the sizes it was solved for)
    _idle_cache: dict = field(default_factory=dict, repr=False)  # (version, share milli) -> _leaves_idle
    _whole1: float = 0.0  # GPU milli of the pods seen that ask one whole GPU (what the whole-GPU reserve keeps GPUs for)

    # --- what is learned -----------------------------------------------------------
    def _note(self, r: PodRequest) -> None:
        self._cpu_all += r.cpu_milli
        if r.gpu_count:
            self._sums[0] += r.total_gpu_milli
            self._sums[1] += r.cpu_milli
            self._sums[2] += r.memory_mib
            if r.total_gpu_milli > 0:  # a MIG request has no milli-GPU size
                self._ratios[round(r.cpu_milli / r.total_gpu_milli, 2)] += r.total_gpu_milli
            if r.gpu_models_allow:
                self._pinned[r.gpu_models_allow] = self._pinned.get(r.gpu_models_allow, 0) + r.total_gpu_milli
            if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI and not r.mig_profile:
                self._share_sizes[pattern_units(r.gpu_milli)] += 1
            if r.gpu_count == 1 and r.gpu_milli >= GPU_MILLI and not r.mig_profile:
                self._whole1 += r.total_gpu_milli

    def observe(self, r: PodRequest) -> None:
        self._note(r)
        super().observe(r)

    def _forget(self, keep: float) -> None:
        super()._forget(keep)
        # the same floor in every map's unit (pods, GPU milli): nothing a hundredth of a pod still weighs is dropped
        fade(self._ratios, keep, FORGET_BELOW)
        fade(self._pinned, keep, FORGET_BELOW)
        fade(self._share_sizes, keep, FORGET_BELOW)
        self._sums = [x * keep for x in self._sums]
        self._cpu_all *= keep
        self._whole1 *= keep

    def prime(self, requests) -> None:
        requests = list(requests)
        for r in requests:
            self._note(r)
        super().prime(requests)

    def _rho_quantiles(self, state: ClusterState) -> np.ndarray:
        """CPU milli per GPU milli at the mid-points of ``strand_quantiles`` equal slices of GPU demand.

        With ``quantile_trim``, only over the GPU demand the CPU can feed: when CPU demand at full GPU
        demand exceeds the cluster's CPU, the CPU-hungriest GPU demand (by ratio) cannot all run, so
        keeping CPU for it strands GPUs that leaner pods would have used.
        """
        key = (self._version, state.epoch)
        if self._rhos is None or self._rhos[0] != key:
            items = sorted(self._ratios.items()) or [(0.0, 1)]
            r = np.array([k for k, _ in items], dtype=float)
            g = np.array([v for _, v in items], dtype=float)
            if self.quantile_trim:
                scale = float(state.gpu_milli_cap.sum()) / max(self._sums[0], 1.0)
                excess = self._cpu_all - float(state.cpu_cap.sum()) / scale  # CPU milli seen beyond what fits
                cpu = r * g
                for i in range(len(g) - 1, 0, -1):  # drop from the top ratio down
                    if excess <= 0:
                        break
                    cut = min(cpu[i], excess)
                    g[i] -= cut / max(r[i], 1e-9)
                    excess -= cut
            w = np.cumsum(g)
            q = (np.arange(self.strand_quantiles) + 0.5) / self.strand_quantiles * w[-1]
            self._rhos = (key, np.maximum(r[np.minimum(np.searchsorted(w, q), len(r) - 1)], 1e-3))
        return self._rhos[1]

    def _sliver_table(self) -> np.ndarray:
        """w[L]: milli of a GPU with L free that no sum of known task sizes fills."""
        if self._sliver is not None and self._sliver[0] == self._version:
            return self._sliver[1]
        tw = self.workload
        sizes = sorted({int(m) for m in tw.gpu_milli if 0 < m}) if tw is not None else []
        reach = np.zeros(GPU_MILLI + 1, dtype=bool)
        reach[0] = True
        for x in range(1, GPU_MILLI + 1):
            reach[x] = any(s <= x and reach[x - s] for s in sizes)
        fill = np.maximum.accumulate(np.where(reach, np.arange(GPU_MILLI + 1), 0))
        w = np.arange(GPU_MILLI + 1) - fill
        self._sliver = (self._version, w)
        return w

    # --- the measure -----------------------------------------------------------------
    def _penalty(self, cpu: np.ndarray, gpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
        """Stranded + sliver GPU milli of node states ([S], [S, G], [S])."""
        out = np.zeros(cpu.shape[0])
        if self._rates is None or self._rates[0] != self._version:  # ratios change with the workload, not per pod
            self._rates = (self._version, *self._sums)
        _, g_milli, c_milli, m_mib = self._rates
        total = gpu.sum(axis=-1)
        if self.strand_weight and g_milli > 0:
            stranded = np.maximum(0.0, total - np.maximum(cpu, 0) * (g_milli / max(c_milli, 1.0)))
            if self._q_rhos is not None:
                stranded = np.mean([np.maximum(0.0, total - np.maximum(cpu, 0) / rho) for rho in self._q_rhos], axis=0)
            if self.memory_strand and m_mib > 0:
                stranded = np.maximum(stranded, total - np.maximum(mem, 0) * (g_milli / m_mib))
            out += self.strand_weight * stranded
        if self.sliver_weight:
            out += self.sliver_weight * self._sliver_table()[np.clip(gpu, 0, GPU_MILLI)].sum(axis=-1)
        return out

    def _measure(self, cpu, gpu, mem, model, tw, acc) -> np.ndarray:
        return frag_amount(cpu, gpu, model, tw, acc) + self._penalty(cpu, gpu, mem)

    def _before_cache(self, state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        """The measure of nodes as they are, per node version (shared by every pod shape)."""
        c = self._bcache
        if c is None or c[0] != (self._version, state.epoch) or c[1].size != len(state):
            c = ((self._version, state.epoch), np.zeros(len(state)), np.full(len(state), -1, dtype=np.int64))
            self._bcache = c
        return c[1], c[2]

    def _quantise(self, delta: np.ndarray) -> np.ndarray:
        return np.floor(delta / self.quant_milli) if self.quant_milli > 0 else delta

    def _descent(self, state: ClusterState, nodes: np.ndarray, rows: np.ndarray, cpu_after, gpu_after, mem_after) -> np.ndarray:
        """Quantised measure decrease from node ``nodes[rows]`` as it is to the given after-states.

        The stale before-states and all after-states go through ``_measure`` in
        one call: with one changed node per cycle, numpy's per-call cost is most
        of the work.
        """
        tw, acc = self._tw(state)
        tight = self._cpu_tight(state)
        use_q = self.strand_quantiles > 0 and self.quantile_tight <= tight < self.quantile_tight_max
        self._q_rhos = self._rho_quantiles(state) if use_q else None
        vals, vers = self._before_cache(state)
        stale = np.flatnonzero(vers[nodes] != state.version[nodes])
        cpu, left, model = node_view(state, nodes)
        mem = state.mem_free[nodes]
        m = self._measure(
            np.concatenate([cpu[stale], cpu_after]),
            np.concatenate([left[stale], gpu_after]),
            np.concatenate([mem[stale], mem_after]),
            np.concatenate([model[stale], model[rows]]),
            tw, acc,
        )
        if stale.size:
            vals[nodes[stale]] = m[: stale.size]
            vers[nodes[stale]] = state.version[nodes[stale]]
        return self._quantise(vals[nodes[rows]] - m[stale.size:])

    _placement_scores = _descent  # FGDScore._gpu_scores enumerates the placements; this measure scores them

    _UNFIT = -1e9

    def _node_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        cpu, left, _ = node_view(state, nodes)
        mem = state.mem_free[nodes]
        new_left = take_packed(left, r.gpu_milli, r.gpu_count) if r.gpu_count and not r.mig_profile else left
        return self._descent(state, nodes, np.arange(nodes.size), cpu - r.cpu_milli, new_left, mem - r.memory_mib)

    def _cpu_tight(self, state: ClusterState) -> float:
        """CPU demand over CPU capacity when GPU demand fills the GPUs, at the mix seen (learned per workload refresh)."""
        key = (self._version, state.epoch)
        if self._tight is None or self._tight[0] != key:
            g = max(self._sums[0], 1.0)
            t = self._cpu_all / g * float(state.gpu_milli_cap.sum()) / max(float(state.cpu_cap.sum()), 1.0)
            self._tight = (key, t)
        return self._tight[1]

    # --- the CPU reserve (filter) --------------------------------------------------------------
    RESERVE_REASON = "node(s) kept their CPU for their free GPUs (CPU is short cluster-wide)"

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        """Once CPU binds first, a CPU-only pod may not take the CPU a node's free GPUs need.

        Need = ``cpu_reserve`` x free GPU milli x the mean CPU-per-GPU-milli of the GPU pods seen.
        Off until a workload is learned (``refresh_every`` GPU pods) and while CPU demand, scaled to
        fill the GPUs, stays under ``reserve_tight`` x the cluster's CPU.  A pod that has waited
        ``reserve_max_wait_s`` may use the reserve: GPU demand that stopped coming holds no CPU for long.
        So may a pod that would otherwise evict running pods (``cycle.take_held``): CPU kept for GPU pods
        that have not come is never worth a running pod.
        """
        r = cycle.request
        n = len(state)
        if cycle.take_held or cycle.waited_s >= self.reserve_max_wait_s:
            return FilterResult(all_pass(n), passes_all=True)
        if r.gpu_count:
            return self._whole_reserve(cycle, state)
        if not self.cpu_reserve or r.cpu_milli <= 0 or not self._reserve_on(state):
            return FilterResult(all_pass(n), passes_all=True)
        free_gpu = np.where(state.gpu_usable, state.gpu_free_milli, 0).sum(axis=1)
        need = self.cpu_reserve * self._cpu_per_gpu_milli() * free_gpu
        ok = (free_gpu == 0) | (state.cpu_free - r.cpu_milli >= need)
        return FilterResult(ok, (self.RESERVE_REASON,), passes_all=bool(ok.all()))

    # --- the whole-GPU reserve (filter) -----------------------------------------------------------
    WHOLE_REASON = "node(s) kept their whole GPUs for pods that fill them (whole GPUs are scarce)"
    KEPT = "StrandAwareFragScore/whole-kept"  # cycle.data key: this share may only join a GPU in use

    def _whole_reserve(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        """Once GPUs bind first and whole free GPUs are scarce, a share that would waste most of one goes on a used GPU.

        Applies to a single-GPU share whose room left on a whole GPU (1000 - its milli) the shares seen
        would mostly not fill: the shares that fit in that room bring less than ``whole_fill_min`` x the
        room such pods leave (an 810 leaves 190, and pods of 190 milli or less are a few % of that on the
        Alibaba traces).  Whole GPUs count only where the node's free CPU can feed them, at the mean CPU
        per GPU of the GPU pods seen: a whole GPU that no whole-GPU pod could get the CPU for is not worth
        keeping.  The reserve is kept for pods that ask one whole GPU (those cannot use a GPU in use, and
        a multi-GPU pod needs whole GPUs together on one node, which a few kept here and there do not give),
        so its size follows their share of the GPU demand seen: while fewer than ``whole_reserve`` x that
        share of the GPUs the pod may use are such GPUs, a node that has one passes only if a GPU in use
        there takes the pod, and the GPU selector keeps off its whole GPUs (``cycle.data[KEPT]``: the nodes
        whose whole GPUs are kept).  Where no pod seen asks one whole GPU, nothing is kept.
        """
        r = cycle.request
        n = len(state)
        if (not self.whole_reserve or r.gpu_count != 1 or not 0 < r.gpu_milli < GPU_MILLI or r.mig_profile
                or not self._learned() or not self._cpu_spare_for_whole(state) or not self._leaves_idle(r.gpu_milli)):
            return FilterResult(all_pass(n), passes_all=True)
        mm = model_mask(state, r)
        usable = state.gpu_usable if mm is None else state.gpu_usable & mm[state.gpu_model]
        whole = usable & (state.gpu_free_milli >= GPU_MILLI)
        per_gpu_cpu = self._cpu_per_gpu_milli() * GPU_MILLI
        fed = whole.sum(axis=1)
        if per_gpu_cpu > 0:
            fed = np.minimum(fed, np.maximum(state.cpu_free, 0) // per_gpu_cpu)
        if fed.sum() >= self.whole_reserve * self._whole1 / max(self._sums[0], 1.0) * usable.sum():
            return FilterResult(all_pass(n), passes_all=True)
        kept = fed > 0
        cycle.data[self.KEPT] = kept
        ok = ~kept | (eligible_gpus(state, r) & ~whole).any(axis=1)
        return FilterResult(ok, (self.WHOLE_REASON,), passes_all=bool(ok.all()))

    def _cpu_spare_for_whole(self, state: ClusterState) -> bool:
        """GPUs bind first, with CPU to spare for the whole GPUs the reserve keeps.

        The CPU left when GPU demand fills the GPUs at the mix seen, (1 - ``_cpu_tight``) x the cluster's
        CPU, must cover ``whole_reserve`` of the GPUs at the mean CPU per GPU: where it does not (CPU binds
        first, or nearly: 0.975 on the tuning variant cpumore200), CPU-only pods take the CPU beside the
        kept GPUs and they end idle.  That is the most the reserve keeps (every GPU pod asking one whole
        GPU), not its size for the mix seen: the margin is on purpose, since sized by that mix the check
        would pass on cpumore200 and the loss there come back.
        """
        if self._sums[0] <= 0:
            return False
        spare = (1.0 - self._cpu_tight(state)) * float(state.cpu_cap.sum())
        return spare >= self.whole_reserve * float(state.gpu_milli_cap.sum()) * self._cpu_per_gpu_milli()

    def _leaves_idle(self, milli: int) -> bool:
        """Would a share of ``milli`` leave most of a whole GPU's rest idle, by the shares seen?"""
        key = (self._version, milli)
        hit = self._idle_cache.get(key)
        if hit is None:
            if len(self._idle_cache) > 256:
                self._idle_cache.clear()
            room = pattern_units(GPU_MILLI - milli)
            fillers = sum(u * c for u, c in self._share_sizes.items() if u <= room)
            leaves = self._share_sizes.get(pattern_units(milli), 0) * room
            hit = self._idle_cache[key] = leaves > 0 and fillers < self.whole_fill_min * leaves
        return hit

    def _cpu_per_gpu_milli(self) -> float:
        """Mean CPU milli per GPU milli of the GPU pods seen (what both reserves feed a free GPU with); 0 before any."""
        return self._sums[1] / self._sums[0] if self._sums[0] > 0 else 0.0

    def _learned(self) -> bool:
        return self.workload is not None and (not self.learn_online or self._seen >= self.refresh_every)

    def _reserve_on(self, state: ClusterState) -> bool:
        return self._learned() and self._sums[0] > 0 and self._cpu_tight(state) >= self.reserve_tight

    # --- model pressure, per cycle ----------------------------------------------------------
    def _pin_rates(self, state: ClusterState) -> np.ndarray:
        """[model]: the share of all GPU demand seen that pinned pods bring to each model.

        A pod pinned to several models is spread over them so that their pinned
        load per GPU comes out as even as it can (water-filling in small steps),
        not by capacity: demand pinned to {big model, scarce model} lands on the
        big one when the scarce one has its own pinned pods to serve.
        """
        key = (self._version, state.epoch, len(self._pinned))
        if self._pressure is not None and self._pressure[0] == key:
            return self._pressure[1]
        nm = len(state.model_names)
        models = state.gpu_model[state.gpu_exists & state.gpu_usable] if state.gpu_model.size else np.zeros(0, np.int32)
        cap = np.bincount(models[models >= 0], minlength=nm).astype(float)[:nm] * GPU_MILLI
        ids = {m: i for i, m in enumerate(state.model_names)}
        load = np.zeros(nm)
        sets = []
        for allow, milli in self._pinned.items():
            # sorted: a frozenset of names iterates in hash order, which differs per process (ties in argmin below)
            idx = np.array(sorted(ids[m] for m in allow if m in ids and cap[ids[m]] > 0), dtype=int)
            if idx.size:
                sets.append((idx, float(milli)))
        steps = 16
        for _ in range(steps):  # round-robin over the sets, a 1/steps slice each time
            for idx, milli in sets:
                j = idx[np.argmin((load[idx] + milli / steps) / cap[idx])]
                load[j] += milli / steps
        total = max(self._sums[0], 1.0)
        r = load / total
        self._pressure = (key, r)
        return r

    def _pressure_cost(self, cycle: Cycle, state: ClusterState) -> np.ndarray:
        """[model id + 1]: cost per milli-GPU used on each model (index -1: no GPU, 0).

        pressure = (pinned share of demand for the model) x (free GPU milli in the cluster) /
        (free GPU milli of the model): the part of the model's free GPUs that the pinned pods
        still to come will want, if demand keeps its mix.  It rises as pods with a choice use
        the model up, which is the feedback a static share lacks.
        """
        t = cycle.data.get("pressure_cost")
        if t is not None:
            return t
        nm = len(state.model_names)
        out = np.zeros(nm + 1)
        if self.model_weight and self._pinned and nm:
            r = self._pin_rates(state)
            g = self._gpu_index
            if g is None or g[0] != state.epoch:
                ok = (state.gpu_exists & state.gpu_usable & (state.gpu_model >= 0)).ravel()
                flat = np.flatnonzero(ok)
                g = self._gpu_index = (state.epoch, flat, state.gpu_model.ravel()[flat])
            free = np.bincount(g[2], weights=state.gpu_free_milli.ravel()[g[1]], minlength=nm)[:nm]
            ftot = free.sum()
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(free > 0, r * ftot / free, self.pressure_cap)
            out[:nm] = self.model_weight * np.minimum(p, self.pressure_cap) / max(self.quant_milli, 1.0)
        cycle.data["pressure_cost"] = out
        return out

    def _with_pressure(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray, s: np.ndarray) -> np.ndarray:
        if not self._pinned or not self.model_weight or not cycle.request.total_gpu_milli:
            return s
        model = state.gpu_model[nodes, 0] if state.gpu_model.shape[1] else np.full(nodes.size, -1)
        cost = self._pressure_cost(cycle, state)[model] * cycle.request.total_gpu_milli
        return s - cost

    def post_score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """The per-cycle model pressure on top of the cached descent (it changes with every placement)."""
        return self._with_pressure(cycle, state, nodes, raw)

    def _pattern_table(self) -> dict[int, np.ndarray]:
        """{share size: ok[load]}: loads (PATTERN_STEP units, the share included) that some pattern of the LP takes."""
        p = self._patterns
        if p is None or p[0] != self._version:  # the same sizes as last time: the same LP
            table = p[1] if p is not None and p[2] == self._share_sizes else pattern_loads(self._share_sizes)
            p = self._patterns = (self._version, table, Counter(self._share_sizes))
        return p[1]

    def _gpu_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        out = super()._gpu_scores(cycle, state, nodes)
        milli = cycle.request.gpu_milli
        left = node_view(state, nodes)[1]
        if (self.pattern_weight or self.pattern_penalty) and self._cpu_tight(state) < self.quantile_tight:
            ok = self._pattern_table().get(pattern_units(milli))
            if ok is not None:
                used = GPU_MILLI - left
                load = np.clip(np.rint((used + milli) / PATTERN_STEP).astype(np.int64), 0, ok.size - 1)
                out = out + np.where(used > 0, np.where(ok[load], self.pattern_weight, -self.pattern_penalty), 0.0)
        if self.share_fit:
            out = out - self.share_fit * np.clip(left - milli, 0, GPU_MILLI) / GPU_MILLI
        return out

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        kept = cycle.data.get(self.KEPT)
        if kept is None:
            return super().score(cycle, state, nodes)
        s = self._kept_off_whole(self._shared_scores(cycle, state, nodes), state, nodes, kept).max(axis=1)
        return np.where(np.isfinite(s), s, self._UNFIT)

    def cache_key(self, cycle: Cycle):
        key = super().cache_key(cycle)
        return key if cycle.data.get(self.KEPT) is None else (key, self.KEPT)

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        """FGDScore's (the best-scoring GPU for a share, best fit otherwise), on this measure; off whole GPUs when kept."""
        kept = cycle.data.get(self.KEPT)
        if kept is None:
            return super().select_gpus(cycle, state, node)
        at = np.array([node])
        s = self._kept_off_whole(self._shared_scores(cycle, state, at), state, at, kept)[0]
        return GpuChoice((int(np.argmax(s)),)) if np.isfinite(s).any() else None

    @staticmethod
    def _kept_off_whole(scores: np.ndarray, state: ClusterState, nodes: np.ndarray, kept: np.ndarray) -> np.ndarray:
        return np.where(kept[nodes][:, None] & (state.gpu_free_milli[nodes] >= GPU_MILLI), -np.inf, scores)


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


def register(r: Registry) -> None:
    r.register("StrandAwareFragScore", StrandAwareFragScore)
