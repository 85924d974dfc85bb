"""The default's descent score (and GPU selector): how much a placement lowers FGD's expected fragment plus
the GPU that CPU or memory cannot feed and the slivers no share size fills.

Why these terms (measured on the Alibaba traces, see docs/policy.md): what FGD leaves idle at 100%
arrived demand is mostly GPUs on nodes whose CPU is gone, and slivers of shared GPUs that no task size
fills.  The measure of a node state, all in milli-GPU so the terms add up:

* FGD's expected fragment over the learned target workload (``paper.workload.frag_amount``);
* stranded GPU: ``max(0, gpu_left - cpu_left / rho)`` at the workload's CPU per GPU milli ``rho`` (and the
  same for memory); where CPU binds first (``quantile_tight`` <= CPU tightness < ``quantile_tight_max``)
  averaged over ``strand_quantiles`` quantiles of the pods' ratio, taken over the demand the CPU can feed
  (``quantile_trim``);
* unfillable sliver: per GPU, the part of its free milli that no sum of the shapes' GPU sizes fills.

A placement scores the measure's decrease, quantised to ``quant_milli`` steps (ties go to the first node of
a fixed seeded order: the profile's ``tieBreak: ordered``).  A single-GPU share is scored per GPU, with two
more per-GPU terms: the share patterns (``patterns.SharePatterns``, off where CPU binds first) and, among
equals, the GPU left with the least free milli (``share_fit``); the node's score is its best GPU's, which is
also the GPU chosen.  Where the whole-GPU reserve keeps a node's whole GPUs (``reserves.WHOLE_KEPT``), a
share is scored and placed only on its GPUs in use.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from ... import native
from ...engine.args import PluginArgs, arg
from ...engine.framework import Cycle, GpuChoice
from ...engine.model import GPU_MILLI, PodRequest
from ...engine.state import ClusterState
from ..paper._common import take_packed
from ..paper.fgd import IDS_PY_MAX, FragDescent, eligible_mask
from ..paper.workload import frag_amount, node_view
from .patterns import SharePatterns, patterns_of
from .reserves import WHOLE_KEPT
from .workload import WorkloadModel, model_of

NAME = "DescentScore"


@dataclass(frozen=True)
class DescentArgs(PluginArgs):
    strand_weight: float = arg(16.0)  # weight of GPU milli left unfed by CPU (or memory)
    sliver_weight: float = arg(8.0)  # weight of free GPU milli no share size fills
    memory_strand: bool = arg(True)  # memory strands GPUs too
    quant_milli: float = arg(40.0)  # the score's step: decreases within one step tie
    quantile_tight: float = arg(1.0)  # ratio quantiles once CPU demand / CPU capacity at full GPU demand >= this
    quantile_tight_max: float = arg(1.2)  # ... and below this (CPU this short does better with the mean ratio)
    quantile_trim: bool = arg(True)  # quantiles only over the GPU demand the cluster's CPU can feed
    strand_quantiles: int = arg(4)  # > 0: stranding averaged over this many quantiles of the CPU-per-GPU ratio; 0: the mean ratio
    share_fit: float = arg(0.5)  # < 1: ties between share placements go to the GPU left with the least free milli


def reachable_sums(sizes: list[int], top: int) -> np.ndarray:
    """reach[x] for x in 0..top: x is a sum of any number of ``sizes`` (each > 0; 0 is the empty sum).

    As a bit set in one Python int: adding a size to every reachable sum is a shift, and doubling the shift
    (s, 2s, 4s, ...) takes any count of that size in log steps, instead of a loop over every x and size."""
    full = (1 << (top + 1)) - 1
    bits = 1
    for s in sizes:
        step = s
        while step <= top:
            bits |= (bits << step) & full
            step *= 2
    raw = np.frombuffer(bits.to_bytes((top + 8) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[: top + 1].astype(bool)


class DescentScore(FragDescent):
    """Score and GPU selector: see the module docstring.  Reads the profile's ``WorkloadModel`` and ``SharePatterns``."""

    name = NAME
    _UNFIT = -1e9

    def __init__(self, args: DescentArgs | None = None, model: WorkloadModel | None = None,
                 patterns: SharePatterns | None = None) -> None:
        self.args = args or DescentArgs()
        self.learner = self.model = model or WorkloadModel()
        self.patterns = patterns or SharePatterns()
        self._gsel = OrderedDict()
        self._rhos: tuple | None = None
        self._sliver: tuple | None = None
        self._bcache: tuple | None = None
        self._rates: tuple | None = None
        self._q_rhos: np.ndarray | None = None  # this cycle's ratio quantiles, None: the mean ratio
        self._tables: tuple | None = None  # (workload version, {(share milli, patterns on): per-free-milli terms})
        self._table: tuple | None = None  # (target workload, version, per-free-milli table, shape columns): _gpu_table
        self._shape_acc: tuple | None = None  # (access, target workload, GPU shapes & access): _measure

    @classmethod
    def from_config(cls, handle: Any = None, **cfg: Any) -> DescentScore:
        return cls(DescentArgs.from_config(NAME, cfg), model_of(handle), patterns_of(handle))

    # the packing experiment primes a policy that does not learn online with the whole trace
    @property
    def learn_online(self) -> bool:
        return self.model.learn_online

    def prime(self, requests) -> None:
        self.model.prime(requests)

    # --- the measure -------------------------------------------------------------------
    def _rho_quantiles(self, state: ClusterState) -> np.ndarray:
        """CPU milli per GPU milli at the mid-points of ``strand_quantiles`` equal slices of GPU demand.

        With ``quantile_trim``, only over the GPU demand the CPU can feed: when CPU demand at full GPU
        demand exceeds the cluster's CPU, the CPU-hungriest GPU demand (by ratio) cannot all run, so
        keeping CPU for it strands GPUs that leaner pods would have used.
        """
        m, a = self.model, self.args
        key = (m.version, state.epoch)
        if self._rhos is None or self._rhos[0] != key:
            items = sorted(m.ratios.items()) or [(0.0, 1)]
            r = np.array([k for k, _ in items], dtype=float)
            g = np.array([v for _, v in items], dtype=float)
            if a.quantile_trim:
                scale = float(state.gpu_milli_cap.sum()) / max(m.sums[0], 1.0)
                excess = m.cpu_all - float(state.cpu_cap.sum()) / scale  # CPU milli seen beyond what fits
                cpu = r * g
                for i in range(len(g) - 1, 0, -1):  # drop from the top ratio down
                    if excess <= 0:
                        break
                    cut = min(cpu[i], excess)
                    g[i] -= cut / max(r[i], 1e-9)
                    excess -= cut
            w = np.cumsum(g)
            q = (np.arange(a.strand_quantiles) + 0.5) / a.strand_quantiles * w[-1]
            self._rhos = (key, np.maximum(r[np.minimum(np.searchsorted(w, q), len(r) - 1)], 1e-3))
        return self._rhos[1]

    def _sliver_table(self) -> np.ndarray:
        """w[L]: milli of a GPU with L free that no sum of known task sizes fills."""
        version = self.model.version
        if self._sliver is not None and self._sliver[0] == version:
            return self._sliver[1]
        tw = self.model.workload
        sizes = sorted({int(m) for m in tw.gpu_milli if 0 < m}) if tw is not None else []
        reach = reachable_sums(sizes, GPU_MILLI)
        fill = np.maximum.accumulate(np.where(reach, np.arange(GPU_MILLI + 1), 0))
        w = np.arange(GPU_MILLI + 1) - fill
        self._sliver = (version, w)
        return w

    def _penalty(self, cpu: np.ndarray, gpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
        """Stranded + sliver GPU milli of node states ([S], [S, G], [S])."""
        a = self.args
        out = np.zeros(cpu.shape[0])
        _, g_milli, c_milli, m_mib = self._workload_rates()
        total = np.add.reduce(gpu, axis=-1)  # ``gpu.sum(axis=-1)`` without its Python wrapper
        if a.strand_weight and g_milli > 0:
            out += a.strand_weight * self._stranded(cpu, total, mem, g_milli, c_milli, m_mib)
        if a.sliver_weight:
            out += a.sliver_weight * np.add.reduce(self._sliver_table()[np.minimum(np.maximum(gpu, 0), GPU_MILLI)], axis=-1)  # np.clip, without its overhead
        return out

    def _workload_rates(self) -> tuple:
        """(workload version, GPU milli, CPU milli, memory MiB) the workload asks in all: they change with the
        workload, not per pod, so they are kept per version."""
        if self._rates is None or self._rates[0] != self.model.version:
            self._rates = (self.model.version, *self.model.sums)
        return self._rates

    def _gpu_shape_access(self, tw, acc) -> np.ndarray:
        """Per GPU model, the target workload's shapes that ask GPUs and may use it ([models, T] bool), kept while
        the workload and the access table are the same objects."""
        c = self._shape_acc
        if c is None or c[0] is not acc or c[1] is not tw:
            c = self._shape_acc = (acc, tw, (tw.gpu_milli > 0) & acc)
        return c[2]

    def _measure(self, cpu, gpu, mem, model, tw, acc) -> np.ndarray:
        """``frag_amount + _penalty`` of node states ([S], [S, G], [S], [S]), the same bits.

        Why: with a few node states per call, numpy's per-call cost is most of the measure, and binning (or the
        [S, T, G] compare) and the penalty each walk the GPUs again.  Here one lookup per GPU in a table over
        its free milli (``_gpu_table``: the milli itself, per shape the milli where the shape fits and whether it
        fits, and the sliver) and one sum over the GPUs give every per-state sum both need; all are whole
        numbers, exact in any order, and the last steps are those of ``frag_amount`` and ``_penalty``.  States
        with free milli outside 0..GPU_MILLI, and configurations where a weight is not positive (where adding
        the terms to zeros could matter), take the two functions themselves.
        """
        a = self.args
        if (not len(tw) or gpu.dtype.kind not in "iu" or not gpu.size or not (a.strand_weight > 0 and a.sliver_weight > 0)):
            return frag_amount(cpu, gpu, model, tw, acc) + self._penalty(cpu, gpu, mem)
        if native.measure is not None and type(a.strand_weight) is float and type(a.sliver_weight) is float:
            # the same operations in C (gpufleet/_native.c); False: an input it does not take (then numpy, below)
            table, count, cpu_t = self._gpu_table(tw)
            gpu_acc = self._gpu_shape_access(tw, acc)
            _, g_milli, c_milli, m_mib = self._workload_rates()
            out = np.empty(cpu.shape[0])
            if native.measure(out, cpu, gpu, mem, model, gpu_acc, table, count, cpu_t, tw.freq, self._q_rhos,
                              g_milli / max(c_milli, 1.0), g_milli / m_mib if m_mib > 0 else 0.0, g_milli > 0,
                              a.memory_strand and m_mib > 0, a.strand_weight, a.sliver_weight):
                return out
        return self._measure_numpy(cpu, gpu, mem, model, tw, acc)

    def _measure_numpy(self, cpu, gpu, mem, model, tw, acc) -> np.ndarray:
        """``_measure`` in numpy: the path without the C extension, and its reference (tests/policies)."""
        a = self.args
        if (not len(tw) or gpu.dtype.kind not in "iu" or not gpu.size or not (a.strand_weight > 0 and a.sliver_weight > 0)
                or np.minimum.reduce(gpu, axis=None) < 0):
            return frag_amount(cpu, gpu, model, tw, acc) + self._penalty(cpu, gpu, mem)
        table, count, cpu_t = self._gpu_table(tw)
        gpu_acc = self._gpu_shape_access(tw, acc)
        try:
            # [S, 2T + 2]; IndexError: a GPU above GPU_MILLI.  Taken GPU-major ([G, S, columns]) so the sum over GPUs
            # adds whole [S, columns] slabs (whole numbers: the same sums in any order)
            sums = np.add.reduce(table.take(gpu.T, axis=0), axis=0)
        except IndexError:
            return frag_amount(cpu, gpu, model, tw, acc) + self._penalty(cpu, gpu, mem)
        t = count.size
        total = sums[:, 0]
        tot = total[:, None]
        # frag_amount: idle milli on GPUs too small for a shape where it fits (Q3), all idle milli otherwise
        q3 = gpu_acc[model] & (sums[:, 1 + t : 1 + 2 * t] >= count) & (cpu[:, None] >= cpu_t)
        per = np.where(q3, tot - sums[:, 1 : 1 + t], tot)  # whole milli: times freq, as float64 (exact) times freq
        frag = np.add.reduce(per * tw.freq, axis=1)  # row by row, as frag_amount
        _, g_milli, c_milli, m_mib = self._workload_rates()
        if g_milli > 0:  # _penalty's stranded GPU milli (>= 0: adding it to zeros is the same number)
            stranded = self._stranded(cpu, total, mem, g_milli, c_milli, m_mib)
            return frag + (a.strand_weight * stranded + a.sliver_weight * sums[:, -1])
        return frag + (0.0 + a.sliver_weight * sums[:, -1])

    def _gpu_table(self, tw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per free milli L in 0..GPU_MILLI (``_measure``): [L, per shape L if the shape's per-GPU milli fits in L
        else 0, per shape whether it fits, the sliver of L]; with each shape's GPU count and CPU.
        Kept per target workload and workload version (the sliver table's)."""
        c = self._table
        version = self.model.version
        if c is None or c[0] is not tw or c[1] != version:
            every = np.arange(GPU_MILLI + 1, dtype=np.int64)[:, None]
            fits = every >= tw.gpu_milli[None, :]
            table = np.concatenate([every, every * fits, fits, self._sliver_table()[:, None]], axis=1).astype(np.int64)
            c = self._table = (tw, version, table, tw.gpu_count, tw.cpu_milli)
        return c[2], c[3], c[4]

    def _stranded(self, cpu, total, mem, g_milli, c_milli, m_mib) -> np.ndarray:
        """GPU milli that CPU (or memory) cannot feed, per state (``total``: free GPU milli)."""
        a = self.args
        if self._q_rhos is not None:  # the mean over the quantiles' ratios, all rows [Q, S] in one go
            # np.mean(..., axis=0) is this sum divided by the count, without its Python wrapper
            stranded = np.add.reduce(np.maximum(0.0, total - np.maximum(cpu, 0) / self._q_rhos[:, None]), axis=0) / self._q_rhos.shape[0]
        else:
            stranded = np.maximum(0.0, total - np.maximum(cpu, 0) * (g_milli / max(c_milli, 1.0)))
        if a.memory_strand and m_mib > 0:
            stranded = np.maximum(stranded, total - np.maximum(mem, 0) * (g_milli / m_mib))
        return stranded

    def _before_cache(self, state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        """The measure of nodes as they are, per node version (shared by every pod shape)."""
        c = self._bcache
        key = (self.model.version, state.epoch)
        if c is None or c[0] != key or c[1].size != len(state):
            c = (key, np.zeros(len(state)), np.full(len(state), -1, dtype=np.int64))
            self._bcache = c
        return c[1], c[2]

    def _quantise(self, delta: np.ndarray) -> np.ndarray:
        q = self.args.quant_milli
        return np.floor(delta / q) if q > 0 else delta

    def _descent(self, state: ClusterState, nodes: np.ndarray, rows: np.ndarray, r: PodRequest, gpu_after: np.ndarray,
                 view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Quantised measure decrease from node ``nodes[rows]`` as it is to its state with pod ``r`` placed: CPU and
        memory less the pod's, GPUs as ``gpu_after`` (``view``: ``node_view`` of ``nodes`` where the caller has it).

        The stale before-states and all after-states go through ``_measure`` in
        one call: with one changed node per cycle, numpy's per-call cost is most
        of the work.  Both are gathered by one index (the stale rows, then ``rows``).
        """
        a = self.args
        tw, acc = self._tw(state)
        tight = self.model.cpu_tight(state)
        use_q = a.strand_quantiles > 0 and a.quantile_tight <= tight < a.quantile_tight_max
        self._q_rhos = self._rho_quantiles(state) if use_q else None
        vals, vers = self._before_cache(state)
        if nodes.size <= IDS_PY_MAX:  # a few nodes: Python scalars (numpy's per-call cost is most of the work)
            version = state.version
            stale = np.array([j for j, i in enumerate(nodes.tolist()) if vers[i] != version[i]], dtype=np.intp)
        else:
            stale = (vers.take(nodes) != state.version.take(nodes)).nonzero()[0]  # .take: what [nodes] gives, faster
        cpu, left, model = view if view is not None else node_view(state, nodes)
        k = stale.size
        idx = np.concatenate((stale, rows)) if k else rows
        at = nodes.take(idx)
        cpu_s = cpu.take(idx)
        cpu_s[k:] -= r.cpu_milli
        mem_s = state.mem_free.take(at)
        mem_s[k:] -= r.memory_mib
        gpu_s = np.concatenate((left.take(stale, axis=0), gpu_after)) if k else gpu_after
        m = self._measure(cpu_s, gpu_s, mem_s, model.take(idx), tw, acc)
        if not k:  # every before-state known (the measure is row by row: the same values as in one batch)
            return self._quantise(vals.take(at) - m)
        changed = at[:k]
        vals[changed] = m[:k]
        vers[changed] = state.version.take(changed)
        return self._quantise(vals.take(at[k:]) - m[k:])

    _placement_scores = _descent  # FragDescent._gpu_scores enumerates the placements; this measure scores them

    def _native_scores(self, state: ClusterState, nodes: np.ndarray, r: PodRequest, elig: np.ndarray | None, count: int,
                       term: np.ndarray | None, fit: np.ndarray | None) -> np.ndarray | None:
        """``_node_scores`` (``elig`` None; ``count``: the whole GPUs ``take_packed`` takes, 0 for none) or
        ``_gpu_scores`` (``elig``: ``eligible_gpus`` of ``nodes``; ``term``, ``fit``: ``_share_tables``') in one C call
        (gpufleet._native.descent), the same bits; None where the extension is off or declines (the Python path then).

        Why: a cached key recomputes one to a few dozen nodes per decision, and around the C measure the node view,
        the placements, the before-cache, the quantising and the per-GPU terms were ~40 numpy calls of about a
        microsecond each on arrays of a few rows.  The C does the same operations in the same order: the before-states
        of the stale nodes first (written to the before-cache), the after-states of the same distinct placements (one
        per free milli per node: the batch size the measure's quantile mean depends on), each quantised."""
        a = self.args
        if (native.descent is None or type(a.strand_weight) is not float or type(a.sliver_weight) is not float
                or not (a.strand_weight > 0 and a.sliver_weight > 0) or not nodes.size):
            return None
        tw, acc = self._tw(state)
        if not len(tw):
            return None
        tight = self.model.cpu_tight(state)
        use_q = a.strand_quantiles > 0 and a.quantile_tight <= tight < a.quantile_tight_max
        self._q_rhos = self._rho_quantiles(state) if use_q else None
        vals, vers = self._before_cache(state)
        table, count_t, cpu_t = self._gpu_table(tw)
        gpu_acc = self._gpu_shape_access(tw, acc)
        _, g_milli, c_milli, m_mib = self._workload_rates()
        out = np.empty(nodes.size if elig is None else (nodes.size, state.gpu_free_milli.shape[1]))
        if native.descent(out, nodes, state.cpu_free, state.mem_free, state.gpu_free_milli, state.gpu_usable,
                          state.node_model, vals, vers, state.version, elig, r.cpu_milli, r.memory_mib, r.gpu_milli, count,
                          a.quant_milli, term, fit, gpu_acc, table, count_t, cpu_t, tw.freq, self._q_rhos,
                          g_milli / max(c_milli, 1.0), g_milli / m_mib if m_mib > 0 else 0.0, g_milli > 0,
                          a.memory_strand and m_mib > 0, a.strand_weight, a.sliver_weight):
            return out
        return None

    def _node_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if native.descent is not None:
            out = self._native_scores(state, nodes, r, None, r.gpu_count if r.gpu_count and not r.mig_profile else 0,
                                      None, None)
            if out is not None:
                return out
        view = node_view(state, nodes)
        left = view[1]
        new_left = take_packed(left, r.gpu_milli, r.gpu_count) if r.gpu_count and not r.mig_profile else left
        return self._descent(state, nodes, np.arange(nodes.size), r, new_left, view)

    def _gpu_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray,
                    view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        milli = cycle.request.gpu_milli
        patterns = self.patterns.on and self.model.cpu_tight(state) < self.args.quantile_tight
        if native.descent is not None and nodes.size:
            r = cycle.request
            elig = eligible_mask(state, r, nodes)
            term, fit = self._share_tables(milli, patterns)
            got = self._native_scores(state, nodes, r, elig, 0, term, fit)
            if got is not None:
                return got
        view = view if view is not None else node_view(state, nodes)
        out = super()._gpu_scores(cycle, state, nodes, view)
        left = view[1]
        if left.size and 0 <= np.minimum.reduce(left, axis=None):
            term, fit = self._share_tables(milli, patterns)  # per free milli: the same values as computed per GPU
            try:  # ``out`` is this call's own array: added to in place; IndexError: a GPU above GPU_MILLI
                if term is not None:
                    add = term.take(left)
                if fit is not None:
                    sub = fit.take(left)
            except IndexError:
                pass
            else:
                if term is not None:
                    out += add
                if fit is not None:
                    out -= sub
                return out
        if patterns:
            term = self.patterns.term(self.model.version, self.model.share_sizes, milli, left)
            if term is not None:
                out = out + term
        if self.args.share_fit:
            out = out - self._share_fit(milli, left)
        return out

    def _share_fit(self, milli: int, left: np.ndarray) -> np.ndarray:
        return self.args.share_fit * np.minimum(np.maximum(left - milli, 0), GPU_MILLI) / GPU_MILLI

    def _share_tables(self, milli: int, patterns: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(the share-pattern term, the share-fit term) of a share of ``milli`` on a GPU with L free, for every L in
        0..GPU_MILLI: the per-GPU terms depend on nothing else, so a lookup gives the values computing them gives
        (elementwise, the same operations).  Kept per workload version."""
        version = self.model.version
        t = self._tables
        if t is None or t[0] != version:
            t = self._tables = (version, {})
        key = (milli, patterns)
        hit = t[1].get(key)
        if hit is None:
            every = np.arange(GPU_MILLI + 1, dtype=np.int64)
            term = self.patterns.term(version, self.model.share_sizes, milli, every) if patterns else None
            fit = self._share_fit(milli, every) if self.args.share_fit else None
            hit = t[1][key] = (term, fit)
        return hit

    # --- where the whole-GPU reserve keeps a node's whole GPUs ---------------------------------------
    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        kept = cycle.read(WHOLE_KEPT)
        if kept is None:
            return super().score(cycle, state, nodes)
        s = self._kept_off_whole(self._shared_scores(cycle, state, nodes), state, nodes, kept).max(axis=1)
        return np.where(np.isfinite(s), s, self._UNFIT)

    def _shape_key(self, r: PodRequest) -> Hashable:
        """FGD's key, plus the pod's memory where memory strands GPUs (``_penalty`` reads it then)."""
        a = self.args
        key = super()._shape_key(r)
        if a.memory_strand and a.strand_weight and self.model.sums[2] > 0:  # sums only grow or fade: > 0 once learned
            return (key, r.memory_mib)
        return key

    def cache_key(self, cycle: Cycle):
        key = super().cache_key(cycle)
        return key if cycle.read(WHOLE_KEPT) is None else (key, WHOLE_KEPT)

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        """The best-scoring GPU for a share, best fit otherwise (``FragDescent``); off whole GPUs where kept."""
        kept = cycle.read(WHOLE_KEPT)
        if kept is None:
            return super().select_gpus(cycle, state, node)
        at = np.array([node])
        s = self._kept_off_whole(self._shared_scores(cycle, state, at), state, at, kept)[0]
        return GpuChoice((int(np.argmax(s)),)) if np.isfinite(s).any() else None

    @staticmethod
    def _kept_off_whole(scores: np.ndarray, state: ClusterState, nodes: np.ndarray, kept: np.ndarray) -> np.ndarray:
        return np.where(kept[nodes][:, None] & (state.gpu_free_milli[nodes] >= GPU_MILLI), -np.inf, scores)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw


__all__ = ["DescentArgs", "DescentScore", "NAME"]
