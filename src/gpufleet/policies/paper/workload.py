"""FGD's target workload (task shapes and frequencies) and the expected GPU fragment of a node over it.

The simulator measures every policy's fragmentation with ``frag_amount`` over the trace's own workload, so this
module is the yardstick as well as FGD's score.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ... import native
from ...engine.model import GPU_MILLI, PodRequest
from ...engine.state import ClusterState


# FGD's target workload: the most common task shapes covering this share of
# all tasks (the simulator's typicalPodsConfig: popularity 95%, step 1).
POPULARITY_THRESHOLD = 0.95


def shape_of(r: PodRequest) -> tuple[int, int, int, frozenset[str] | None]:
    """(cpu_milli, per-GPU milli, GPU count, allowed models): the paper's PodResource."""
    if r.gpu_count == 0:
        return (r.cpu_milli, 0, 0, None)
    return (r.cpu_milli, r.gpu_milli, r.gpu_count, r.gpu_models_allow)


@dataclass
class TargetWorkload:
    """Task shapes and their frequencies: FGD's 'target workload'.

    ``from_requests`` follows ``GetTypicalPods`` in ``pkg/utils/frag.go``:
    count tasks per shape (CPU-only tasks included), take shapes in decreasing
    count until they cover ``threshold`` of all tasks, renormalise.
    """

    cpu_milli: np.ndarray
    gpu_milli: np.ndarray  # per GPU; 0 for CPU-only shapes
    gpu_count: np.ndarray
    freq: np.ndarray
    models: tuple[frozenset[str] | None, ...]

    @classmethod
    def from_counts(cls, counts: Counter, threshold: float = POPULARITY_THRESHOLD) -> "TargetWorkload":
        total = float(sum(counts.values()))
        if total <= 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), ())

        def order(item):  # decreasing count; ties: larger cpu, milli, count first (Go's Less, reversed)
            (cpu, milli, n, models), c = item
            return (-c, -cpu, -milli, -n, tuple(sorted(models)) if models else ())

        items = sorted(counts.items(), key=order)
        chosen, cum = [], 0.0
        for shape, c in items:
            if cum >= threshold * total:
                break
            chosen.append((shape, c))
            cum += c
        f = np.array([c for _, c in chosen], dtype=np.float64)
        f /= f.sum()
        return cls(
            cpu_milli=np.array([s[0] for s, _ in chosen], dtype=np.int64),
            gpu_milli=np.array([s[1] for s, _ in chosen], dtype=np.int64),
            gpu_count=np.array([s[2] for s, _ in chosen], dtype=np.int64),
            freq=f,
            models=tuple(s[3] for s, _ in chosen),
        )

    @classmethod
    def from_requests(cls, requests: Iterable[PodRequest], threshold: float = POPULARITY_THRESHOLD) -> "TargetWorkload":
        return cls.from_counts(Counter(shape_of(r) for r in requests), threshold)

    def __len__(self) -> int:
        return int(self.freq.size)

    def size_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct per-GPU sizes (ascending) and each shape's index into them (0 for CPU-only shapes)."""
        cached = getattr(self, "_sizes", None)
        if cached is None:
            sizes = np.unique(self.gpu_milli[self.gpu_milli > 0])
            if sizes.size == 0:
                sizes = np.array([GPU_MILLI + 1])
            j = np.searchsorted(sizes, np.maximum(self.gpu_milli, sizes[0]))
            cached = (sizes, j)
            object.__setattr__(self, "_sizes", cached)
        return cached

    def access(self, model_names: Sequence[str]) -> np.ndarray:
        """[model id, shape] -> may this shape run on that GPU model."""
        out = np.ones((len(model_names) + 1, len(self)), dtype=bool)  # last row: no GPU model (-1)
        for t, allowed in enumerate(self.models):
            if allowed:
                for m, name in enumerate(model_names):
                    out[m, t] = name in allowed
                out[-1, t] = False
        return out


def workload_distance(a: TargetWorkload, b: TargetWorkload) -> float:
    """L1 distance between two workloads' shape frequencies (shapes missing on one side count fully)."""
    def as_map(w: TargetWorkload) -> dict:
        return {(int(c), int(m), int(n), ms): float(f) for c, m, n, ms, f in zip(w.cpu_milli, w.gpu_milli, w.gpu_count, w.models, w.freq)}

    x, y = as_map(a), as_map(b)
    return sum(abs(x.get(k, 0.0) - y.get(k, 0.0)) for k in set(x) | set(y))


def node_view(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cpu left, per-GPU milli left [k, G] (0 for absent/unusable GPUs), node GPU model id)."""
    # .take: what [nodes] gives, without fancy indexing's per-item checks (4x faster on thousands of [G] rows)
    left = np.where(state.gpu_usable.take(nodes, axis=0), state.gpu_free_milli.take(nodes, axis=0), 0)
    # the node's first GPU's model (-1: none): ``node_model``, a contiguous column (a take from the [n, G] column's view
    # copied the whole column first, every call)
    model = state.node_model.take(nodes)
    return state.cpu_free.take(nodes), left, model


def frag_amount(cpu_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray, tw: TargetWorkload, access: np.ndarray) -> np.ndarray:
    """Expected GPU fragment (milli-GPU) of node states, over the target workload.

    Mirrors ``NodeGpuShareFragAmount`` + ``FragAmountSumExceptQ3``: for each
    task shape, a node's idle GPU milli counts as fragment unless the task fits
    (Q3), in which case only the GPUs too small for it count.  CPU-only shapes
    count all idle GPU milli (classes XL/XR are not Q3).  ``cpu_left`` is [S],
    ``gpu_left`` [S, G], ``model`` [S]; returns [S].

    Instead of comparing every GPU with every shape ([S, T, G]), each GPU's free
    milli picks a row of a per-workload table (``_gpu_table``), and the rows
    summed per state answer "how many GPUs fit shape t" and "how much idle milli
    is too small for it" for all shapes at once (two numpy calls for the GPUs,
    whatever S).  Many states (the yardstick's thousands) are binned instead: each
    GPU once by how many of the shapes' distinct per-GPU sizes it can hold, then
    per-state bin counts and sums.  Every path gives the same bits.  Where the C extension is in use
    (``gpufleet.native``), the table path is computed there (``_native.c``: the same operations in the same order,
    property-tested bit for bit) unless an input is of a type or range it does not take; ``_frag_amount_numpy`` is
    the path without it, and the reference.
    """
    if len(tw) == 0:
        return np.zeros(cpu_left.shape[0])
    S = gpu_left.shape[0]
    if 0 < S <= TABLE_MAX_ROWS and native.frag_amount is not None:
        out = np.empty(S)
        if native.frag_amount(out, cpu_left, gpu_left, model, access, _direct_consts(tw)[1], _gpu_table(tw),
                              tw.gpu_count, tw.cpu_milli, tw.freq):
            return out
    return _frag_amount_numpy(cpu_left, gpu_left, model, tw, access)


def _frag_amount_numpy(cpu_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray, tw: TargetWorkload,
                       access: np.ndarray) -> np.ndarray:
    """``frag_amount`` in numpy: the path without the C extension (or for inputs it does not take), its reference."""
    if len(tw) == 0:
        return np.zeros(cpu_left.shape[0])
    S, G = gpu_left.shape
    whole = gpu_left.dtype.kind in "iu"  # whole milli: exact sums in any order
    if whole and 0 < S <= TABLE_MAX_ROWS and G and np.minimum.reduce(gpu_left, axis=None) >= 0:
        try:  # per GPU, a row of the table by its free milli; IndexError: a GPU above GPU_MILLI (then binned below)
            sums = _sum(_gpu_table(tw).take(gpu_left.T, axis=0), axis=0)  # GPU-major: whole [S, columns] slabs added
        except IndexError:
            pass
        else:
            return _frag_from_sums(cpu_left, sums, model, tw, access)
    if S <= DIRECT_MAX_ROWS and whole:
        return _frag_amount_direct(cpu_left, gpu_left, model, tw, access)
    # numpy's methods and ufuncs called directly (what np.searchsorted, np.repeat, np.cumsum and .sum call,
    # without their Python wrappers: the same results)
    total = _sum(gpu_left, axis=-1).astype(np.float64)  # [S]
    sizes, j, above, gpu_shape = _bins(tw)
    nb = sizes.size + 1
    flat_left = gpu_left.ravel()
    b = sizes.searchsorted(flat_left, side="right")  # GPU can hold sizes[:b]
    flat = np.arange(S).repeat(G) * nb + b
    hist = np.bincount(flat, minlength=S * nb).reshape(S, nb)
    sums = np.bincount(flat, weights=flat_left, minlength=S * nb).reshape(S, nb)
    ge = hist[:, ::-1].cumsum(axis=1)[:, ::-1]  # ge[:, k] = GPUs in bins >= k
    lt = sums.cumsum(axis=1)  # lt[:, k] = milli in bins <= k
    cnt_ok = ge[:, above]  # GPUs holding size j: bins > j
    small = lt[:, j]  # idle milli on GPUs that cannot hold it
    acc = access[model]  # [S, T]  (model -1 picks the last row)
    q3 = gpu_shape & acc & (cnt_ok >= tw.gpu_count) & (cpu_left[:, None] >= tw.cpu_milli)
    per = np.where(q3, small, total[:, None])
    return _sum(per * tw.freq, axis=1)  # row by row, so a node scores the same in any batch (matmul may not)


def _bins(tw: TargetWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``size_index`` and what ``frag_amount`` derives from it, once per workload."""
    c = tw.__dict__.get("_bins")
    if c is None:
        sizes, j = tw.size_index()
        c = tw.__dict__["_bins"] = (sizes, j, np.minimum(j + 1, sizes.size), tw.gpu_milli > 0)
    return c


TABLE_MAX_ROWS = 2048  # node states up to which frag_amount looks each GPU up in _gpu_table (above: binning, less memory)


def _gpu_table(tw: TargetWorkload) -> np.ndarray:
    """Per free milli L in 0..GPU_MILLI: [L, per shape L if the shape's per-GPU milli fits in L else 0, per shape
    whether it fits], once per workload.  Summed over a node's GPUs, the row gives its idle milli, per shape the idle
    milli on GPUs that hold the shape's share and how many GPUs hold it: all ``frag_amount`` needs of the GPUs."""
    c = tw.__dict__.get("_table")
    if c is None:
        every = np.arange(GPU_MILLI + 1, dtype=np.int64)[:, None]
        fits = every >= tw.gpu_milli[None, :]
        c = tw.__dict__["_table"] = np.concatenate([every, every * fits, fits], axis=1).astype(np.int64)
    return c


def _frag_from_sums(cpu_left: np.ndarray, sums: np.ndarray, model: np.ndarray, tw: TargetWorkload,
                    access: np.ndarray) -> np.ndarray:
    """``frag_amount`` from the per-state sums of ``_gpu_table`` rows ([S, 1 + 2T]): the direct form's whole numbers,
    times the frequencies as float64 (numpy converts the integers first) and summed row by row: the same bits."""
    _, gpu_shape, count, cpu = _direct_consts(tw)
    t = count.size
    total = sums[:, :1]
    q3 = gpu_shape & access[model] & (sums[:, 1 + t :] >= count) & (cpu_left[:, None] >= cpu)
    return _sum(np.where(q3, total - sums[:, 1 : 1 + t], total) * tw.freq, axis=1)


def _direct_consts(tw: TargetWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per workload, once: the shapes' per-GPU milli as [1, T, 1], whether each asks GPUs, GPU counts, CPU."""
    c = tw.__dict__.get("_direct")
    if c is None:
        c = tw.__dict__["_direct"] = (tw.gpu_milli[None, :, None], tw.gpu_milli > 0, tw.gpu_count, tw.cpu_milli)
    return c


DIRECT_MAX_ROWS = 4  # up to this many node states, comparing every GPU with every shape is cheaper than binning


def _frag_amount_direct(cpu_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray, tw: TargetWorkload,
                        access: np.ndarray) -> np.ndarray:
    """``frag_amount`` for a few node states, [S, T, G] at once.  Every amount before the last sum is a whole
    number of milli (exact in any order), and the last sum is the same row by row: the same bits as binning."""
    milli3, gpu_shape, count, cpu = _direct_consts(tw)
    # ufunc reductions called directly (what ``.sum``/``count_nonzero`` call, without their Python wrappers)
    total = _sum(gpu_left, axis=-1)  # [S]
    g3 = gpu_left[:, None, :]
    ge = g3 >= milli3  # [S, T, G]: the GPU holds the shape's share
    small = total[:, None] - _sum(g3 * ge, axis=-1)  # idle milli on GPUs too small for it
    q3 = gpu_shape & access[model] & (_sum(ge, axis=-1, dtype=np.intp) >= count) & (cpu_left[:, None] >= cpu)
    per = np.where(q3, small, total[:, None]).astype(np.float64)
    return _sum(per * tw.freq, axis=1)


_sum = np.add.reduce


def _frag_amount_reference(cpu_left, gpu_left, model, tw, access):
    """The direct [S, T, G] form of ``frag_amount``, kept for the tests."""
    total = gpu_left.sum(axis=-1).astype(np.float64)
    milli = tw.gpu_milli
    ge = gpu_left[:, None, :] >= milli[None, :, None]
    cnt_ok = ge.sum(axis=-1)
    small = np.where(ge, 0, gpu_left[:, None, :]).sum(axis=-1)
    acc = access[model]
    q3 = (milli[None, :] > 0) & acc & (cnt_ok >= tw.gpu_count[None, :]) & (cpu_left[:, None] >= tw.cpu_milli[None, :])
    return np.where(q3, small, total[:, None]) @ tw.freq


def cluster_frag(state: ClusterState, tw: TargetWorkload) -> np.ndarray:
    """Per-node fragment amount (milli-GPU) of the whole cluster."""
    nodes = np.arange(len(state))
    cpu, left, model = node_view(state, nodes)
    return frag_amount(cpu, left, model, tw, tw.access(state.model_names))
