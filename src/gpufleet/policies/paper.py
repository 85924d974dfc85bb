"""The six placement policies of the FGD paper, as engine plugins.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023.  The definitions follow the
paper's published simulator (github.com/hkust-adsl/kubernetes-scheduler-
simulator, ``pkg/simulator/plugin/*_score.go``, ``pkg/utils/frag.go``,
``pkg/type/resource.go``); each class names the file it mirrors.  Details that
change results are kept on purpose:

* scores are truncated to integers 0..100 as the Go plugins return them, so
  ties are frequent and are broken uniformly at random by the framework, as
  kube-scheduler's ``selectHost`` does;
* the paper's resource model is CPU + per-GPU milli-GPU; memory only filters.
  ``MAX_SPEC_CPU_MILLI``/``MAX_SPEC_GPU_MILLI`` are the simulator's
  normalisers (a 128-core, 8-GPU machine).

Everything is vectorised over candidate nodes (and, for FGD, over the GPUs of
each node) and declares a cache key, so the framework recomputes a node's
score only after that node changed.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields
from typing import Iterable, Sequence

import numpy as np

from ..engine.config import Registry
from ..engine.errors import ConfigError
from ..engine.framework import MAX_NODE_SCORE, Cycle, GpuChoice
from ..engine.model import GPU_MILLI, PodRequest
from ..engine.plugins.gpufit import eligible_gpus
from ..engine.plugins.gpuselect import BestFitGpu, pick_mig, select_with
from ..engine.state import ClusterState

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
# FGD's target workload: the most common task shapes covering this share of
# all tasks (the simulator's typicalPodsConfig: popularity 95%, step 1).
POPULARITY_THRESHOLD = 0.95


# --- shapes and the target workload ---------------------------------------------


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


def _distance(a: TargetWorkload, b: TargetWorkload) -> float:
    """L1 distance between two workloads' shape frequencies (shapes missing on one side count fully)."""
    def as_map(w: TargetWorkload) -> dict:
        return {(int(c), int(m), int(n), ms): float(f) for c, m, n, ms, f in zip(w.cpu_milli, w.gpu_milli, w.gpu_count, w.models, w.freq)}

    x, y = as_map(a), as_map(b)
    return sum(abs(x.get(k, 0.0) - y.get(k, 0.0)) for k in set(x) | set(y))


def node_view(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cpu left, per-GPU milli left [k, G] (0 for absent/unusable GPUs), node GPU model id)."""
    left = np.where(state.gpu_usable[nodes], state.gpu_free_milli[nodes], 0)
    model = state.gpu_model[nodes, 0] if state.gpu_model.shape[1] else np.full(nodes.size, -1)
    return state.cpu_free[nodes], left, model


DEDUPE_MIN_NODES = 32  # below this, grouping costs more than it saves


def state_groups(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group nodes whose free resources and GPU make-up are identical: (representatives, inverse).

    A fragmentation score depends only on these columns, so nodes in one group
    score alike; a large cluster has few distinct states (most nodes are idle or
    full), which turns a full re-score (a new epoch, a re-learned workload) from
    every node into a few dozen.
    """
    g = state.max_gpus
    cols = np.empty((nodes.size, 3 + 2 * g), dtype=np.int64)
    cols[:, 0] = _node_kinds(state)[nodes]
    cols[:, 1] = state.cpu_free[nodes]
    cols[:, 2] = state.mem_free[nodes]
    cols[:, 3 : 3 + g] = state.gpu_free_milli[nodes]
    cols[:, 3 + g :] = state.gpu_mem_free[nodes]
    # group by a 64-bit hash of each row (wrapping multiply-add), then check that every node
    # equals its representative; on a collision, fall back to comparing whole rows
    _, first, inverse = np.unique((cols * _hash_coeffs(cols.shape[1])).sum(axis=1), return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if not (cols == cols[first[inverse]]).all():
        rows = np.ascontiguousarray(cols).view(np.dtype((np.void, cols.itemsize * cols.shape[1]))).ravel()
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return nodes[first], inverse


_KINDS: OrderedDict[int, np.ndarray] = OrderedDict()


def _node_kinds(state: ClusterState) -> np.ndarray:
    """Per node, an id of its fixed GPU make-up (model, memory, usable), which changes only with the epoch."""
    kinds = _KINDS.get(state.epoch)
    if kinds is None or kinds.size != len(state):
        static = np.concatenate([state.gpu_usable, state.gpu_model, state.gpu_mem_cap], axis=1).astype(np.int64)
        _, kinds = np.unique(static, axis=0, return_inverse=True)
        kinds = kinds.ravel()
        _KINDS[state.epoch] = kinds
        while len(_KINDS) > 8:
            _KINDS.popitem(last=False)
    return kinds


@functools.lru_cache(maxsize=8)
def _hash_coeffs(width: int) -> np.ndarray:
    return np.random.default_rng(20231).integers(1, 2**62, width, dtype=np.int64) | 1


def distinct_placements(left: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) over (node, GPU) placements of one share: placing it on either of two GPUs
    of a node with the same free milli leaves the same multiset of free GPUs, which is all a
    fragmentation measure sees, so one placement stands for both (8 -> 1 on an idle node)."""
    _, first, inverse = np.unique(rows * (GPU_MILLI + 1) + left[rows, cols], return_index=True, return_inverse=True)
    return first, inverse.ravel()


def frag_amount(cpu_left: np.ndarray, gpu_left: np.ndarray, model: np.ndarray, tw: TargetWorkload, access: np.ndarray) -> np.ndarray:
    """Expected GPU fragment (milli-GPU) of node states, over the target workload.

    Mirrors ``NodeGpuShareFragAmount`` + ``FragAmountSumExceptQ3``: for each
    task shape, a node's idle GPU milli counts as fragment unless the task fits
    (Q3), in which case only the GPUs too small for it count.  CPU-only shapes
    count all idle GPU milli (classes XL/XR are not Q3).  ``cpu_left`` is [S],
    ``gpu_left`` [S, G], ``model`` [S]; returns [S].

    Instead of comparing every GPU with every shape ([S, T, G]), each GPU is
    binned once by how many of the shapes' distinct per-GPU sizes it can hold;
    per-state bin counts and sums then answer "how many GPUs fit shape t" and
    "how much idle milli is too small for it" for all shapes at once.
    """
    if len(tw) == 0:
        return np.zeros(cpu_left.shape[0])
    S, G = gpu_left.shape
    total = gpu_left.sum(axis=-1).astype(np.float64)  # [S]
    sizes, j = tw.size_index()
    nb = sizes.size + 1
    b = np.searchsorted(sizes, gpu_left.ravel(), side="right")  # GPU can hold sizes[:b]
    flat = np.repeat(np.arange(S), G) * nb + b
    hist = np.bincount(flat, minlength=S * nb).reshape(S, nb)
    sums = np.bincount(flat, weights=gpu_left.ravel(), minlength=S * nb).reshape(S, nb)
    ge = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # ge[:, k] = GPUs in bins >= k
    lt = np.cumsum(sums, axis=1)  # lt[:, k] = milli in bins <= k
    cnt_ok = ge[:, np.minimum(j + 1, nb - 1)]  # GPUs holding size j: bins > j
    small = lt[:, j]  # idle milli on GPUs that cannot hold it
    acc = access[model]  # [S, T]  (model -1 picks the last row)
    q3 = (tw.gpu_milli[None, :] > 0) & acc & (cnt_ok >= tw.gpu_count[None, :]) & (cpu_left[:, None] >= tw.cpu_milli[None, :])
    per = np.where(q3, small, total[:, None])
    return (per * tw.freq).sum(axis=1)  # row by row, so a node scores the same in any batch (matmul may not)


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


def _sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """int(sigmoid(delta/1000) * 100): FGD's score of a fragment decrease ``delta``."""
    return np.floor(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0)))


def _take_packed(left: np.ndarray, milli: int, count: int) -> np.ndarray:
    """``NodeResource.Sub``: take ``count`` GPUs of ``milli``, least sufficient first."""
    out = left.copy()
    k = out.shape[0]
    order = np.argsort(out, axis=1, kind="stable")
    srt = np.take_along_axis(out, order, axis=1)
    ok = srt >= milli
    take = ok & (np.cumsum(ok, axis=1) <= count)
    srt = srt - take * milli
    np.put_along_axis(out, order, srt, axis=1)
    del k
    return out


# --- the policies ------------------------------------------------------------------


class _Plugin:
    name = ""

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        return raw

    def cache_key(self, cycle: Cycle):
        return shape_of(cycle.request)


@dataclass
class RandomScore(_Plugin):
    """Random-fit (``random_score.go``): one random feasible node gets the top score."""

    name: str = "RandomScore"

    def cache_key(self, cycle: Cycle):
        return None

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        out = np.zeros(nodes.size)
        out[int(cycle.rng.integers(nodes.size))] = MAX_NODE_SCORE
        return out


@dataclass
class RandomGpu:
    """Random GPU among those that fit (``allocateGpuIdBasedOnRandomFit``)."""

    name: str = "RandomGpu"

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        return select_with(cycle, state, node, lambda idx, n: [idx[int(i)] for i in np.atleast_1d(cycle.rng.choice(len(idx), size=n, replace=False))])


@dataclass
class DotProductScore(_Plugin):
    """Dot-product (``dot_product_score.go``, dimension 'merge', norm 'max').

    Node free vector (CPU, total GPU milli) dotted with the request, both
    normalised by the largest machine; the smaller the product, the higher the
    score (it avoids nodes whose free resources align with the request).
    """

    name: str = "DotProductScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        cpu, left, _ = node_view(state, nodes)
        dot = (cpu / MAX_SPEC_CPU_MILLI) * (r.cpu_milli / MAX_SPEC_CPU_MILLI) + (left.sum(axis=1) / MAX_SPEC_GPU_MILLI) * (
            r.total_gpu_milli / MAX_SPEC_GPU_MILLI
        )
        s = np.floor(MAX_NODE_SCORE * (1.0 - dot / 2.0))
        return np.where(cpu >= r.cpu_milli, s, 0.0)


def _affinity_tag(gpu_count: int, gpu_milli: int) -> str | None:
    if gpu_count == 0:
        return None
    if gpu_milli < GPU_MILLI:
        return "share"
    return f"{gpu_count}-gpu"


@dataclass
class GpuClusteringScore(_Plugin):
    """GPU clustering (``gpu_clustering_score.go``): keep tasks of one kind together.

    Nodes running only tasks of the pod's kind (shared, 1-GPU, 2-GPU, ...) score
    highest, then mixed nodes that include it, then empty nodes, then nodes of
    other kinds; within a band, fuller nodes first.
    """

    name: str = "GpuClusteringScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        tag = _affinity_tag(r.gpu_count, r.gpu_milli)
        if tag is None:
            return np.zeros(nodes.size)
        _, left, _ = node_view(state, nodes)
        base = (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU_MILLI - left.sum(axis=1)) // MAX_SPEC_GPU_MILLI
        out = np.empty(nodes.size)
        for k, i in enumerate(nodes):
            tags = set()
            for key in state.pods_on_node.get(state.nodes[int(i)].name, ()):
                a = state.assignments[key]
                t = _affinity_tag(len(a.gpu_indices), a.gpu_milli)
                if t:
                    tags.add(t)
            if tag in tags:
                band = 3 if len(tags) == 1 else 2
            else:
                band = 1 if not tags else 0
            out[k] = base[k] + band * MAX_NODE_SCORE // 4
        return out


@dataclass
class GpuPackingScore(_Plugin):
    """GPU packing (``gpu_packing_score.go``): fill partly used GPUs, then partly
    used nodes, and open an idle node last."""

    name: str = "GpuPackingScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if r.gpu_count == 0:
            return np.zeros(nodes.size)
        _, left, _ = node_view(state, nodes)
        n_gpus = state.gpu_n[nodes]
        full = (left == GPU_MILLI).sum(axis=1)
        out = np.zeros(nodes.size)
        idle = full == n_gpus
        out[idle] = np.maximum(MAX_NODE_SCORE // 3 - full[idle], full[idle])
        srt = np.sort(np.where(state.gpu_exists[nodes], left, -1), axis=1)  # ascending; absent GPUs first (never fit)
        ok = srt >= r.gpu_milli
        use = ok & (np.cumsum(ok, axis=1) <= r.gpu_count)
        full_used = (use & (srt == GPU_MILLI)).sum(axis=1)
        pct = np.where(use, srt * 100 // GPU_MILLI, 0).sum(axis=1)
        partial = ~idle
        a = partial & (full_used > 0)
        out[a] = np.maximum(MAX_NODE_SCORE // 2 - full_used[a], MAX_NODE_SCORE // 3)
        b = partial & (full_used == 0)
        out[b] = np.maximum(MAX_NODE_SCORE - pct[b] // 10, MAX_NODE_SCORE // 2)
        return out


@dataclass
class BestFitScore(_Plugin):
    """Best-fit (``best_fit_score.go``): least weighted free CPU + GPU left after placing."""

    name: str = "BestFitScore"

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        cpu, left, _ = node_view(state, nodes)
        rest = 0.5 * (cpu - r.cpu_milli) / MAX_SPEC_CPU_MILLI + 0.5 * (left.sum(axis=1) - r.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        return np.floor((1.0 - rest) * MAX_NODE_SCORE)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        lo, hi = raw.min(), raw.max()
        if hi == lo:
            return np.zeros(raw.size)
        return np.floor((raw - lo) * MAX_NODE_SCORE / (hi - lo))


SEEN_KEYS_MAX = 200_000  # pod keys remembered for de-duplication (a retried pod is learned once)
FORGET_BELOW = 0.01  # pods: a learned shape weighing less is dropped (see FGDScore._forget)


def fade(weights: dict, keep: float, below: float) -> None:
    """Scale learned weights by ``keep``, dropping those that fall under ``below``."""
    for k in list(weights):
        w = weights[k] * keep
        if w < below:
            del weights[k]
        else:
            weights[k] = w


@dataclass
class FGDScore(_Plugin):
    """Fragmentation gradient descent (``fgd_score.go``).

    Score = how much the node's expected fragment (``frag_amount`` over the
    target workload) *decreases* when the pod is placed, squashed through a
    sigmoid; for a shared pod, the best GPU of the node counts, and that GPU
    is also the one chosen.  The target workload is given (the paper uses the
    whole trace) or learned online from the pods seen (``learn_online``).
    """

    name: str = "FGDScore"
    learn_online: bool = False
    refresh_every: int = 64
    refresh_growth: float = 0.1  # after refresh_every * 8 pods, refresh when the count grew by this fraction
    refresh_max_pods: int = 8192  # ... but at least every this many pods (0: no limit)
    memory_pods: int = 16384  # at a refresh, older pods fade so that the pods seen weigh this many: the target follows a drifting mix (0: never forget)
    min_change: float = 0.0  # keep the current workload unless shape frequencies moved more than this (L1)
    threshold: float = POPULARITY_THRESHOLD
    include_cpu_pods: bool = True
    workload: TargetWorkload | None = None
    _counts: Counter = field(default_factory=Counter, repr=False)
    _seen: int = 0
    _next_refresh: int = 0
    _access: tuple | None = field(default=None, repr=False)
    _version: int = 0  # bumped whenever the target workload changes (part of the score cache key)
    _gsel: OrderedDict = field(default_factory=OrderedDict, repr=False)  # see _gpu_cache
    _keys: OrderedDict = field(default_factory=OrderedDict, repr=False)  # pod keys already learned from

    def __post_init__(self) -> None:
        """Check every numeric and boolean argument (this class's and a subclass's) once, at start."""
        ranges = {"refresh_every": (1, math.inf), "min_change": (0.0, 2.0), "threshold": (0.0, 1.0)}
        for f in fields(self):
            if f.name.startswith("_") or not isinstance(f.default, (bool, int, float)):
                continue
            v = getattr(self, f.name)
            if isinstance(f.default, bool):
                if not isinstance(v, bool):
                    raise ConfigError(f"plugin {self.name!r}: {f.name} must be true or false, got {v!r}")
                continue
            whole = isinstance(f.default, int)
            lo, hi = ranges.get(f.name, (0, math.inf))
            if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)) or not lo <= v <= hi:
                what = f"an integer >= {lo}" if whole else (f"a number in [{lo}, {hi}]" if hi < math.inf else f"a number >= {lo}")
                raise ConfigError(f"plugin {self.name!r}: {f.name} must be {what}, got {v!r}")

    # the target workload
    def prime(self, requests: Iterable[PodRequest]) -> None:
        """Fix the target workload from a known task population (the paper's setting)."""
        reqs = [r for r in requests if self.include_cpu_pods or r.gpu_count]
        self.workload = TargetWorkload.from_requests(reqs, self.threshold)
        self._access = None
        self._version += 1

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
            if self.workload is None or _distance(self.workload, new) > self.min_change:
                self.workload = new
                self._access = None
                self._version += 1  # every cached score is stale now
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

    def _tw(self, state: ClusterState) -> tuple[TargetWorkload, np.ndarray]:
        tw = self.workload or TargetWorkload.from_counts(Counter())
        key = (self._version, len(state.model_names))
        if self._access is None or self._access[0] != key:
            self._access = (key, tw.access(state.model_names))
        return tw, self._access[1]

    def observe_pod(self, cycle: Cycle) -> None:
        """Learn from this cycle's pod once, and from each pod once however often it is retried."""
        if not self.learn_online or cycle.data.get("fgd_observed"):
            return
        cycle.data["fgd_observed"] = True
        key = cycle.request.uid or cycle.request.key  # a pod recreated under the same name is a new pod
        if key:
            if key in self._keys:
                return
            self._keys[key] = None
            if len(self._keys) > SEEN_KEYS_MAX:
                self._keys.popitem(last=False)
        self.observe(cycle.request)

    def cache_key(self, cycle: Cycle):
        self.observe_pod(cycle)
        return (shape_of(cycle.request), self._version)

    def _gpu_cache(self, cycle: Cycle, state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        """Per-GPU scores of a shared pod's shape, [nodes, G], with the node version each was computed at.

        ``score`` fills it; ``select_gpus`` reads the chosen node's row instead of
        scoring that node a second time.
        """
        key = (shape_of(cycle.request), self._version, state.epoch)  # epochs are unique across states
        cache = self._gsel
        ent = cache.get(key)
        if ent is None or ent[0].shape != state.gpu_free_milli.shape:
            ent = (np.full(state.gpu_free_milli.shape, -np.inf), np.full(len(state), -1, dtype=np.int64))
            cache[key] = ent
            if len(cache) > 16:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return ent

    def _shared_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """[k, G] per-GPU scores of ``nodes`` for a single shared GPU, through the per-GPU cache."""
        rows, vers = self._gpu_cache(cycle, state)
        stale = nodes[vers[nodes] != state.version[nodes]]
        if stale.size:
            if stale.size >= DEDUPE_MIN_NODES:
                reps, inv = state_groups(state, stale)
                rows[stale] = self._gpu_scores(cycle, state, reps)[inv]
            else:
                rows[stale] = self._gpu_scores(cycle, state, stale)
            vers[stale] = state.version[stale]
        return rows[nodes]

    def _node_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """Scores of placing a pod that is not a single shared GPU."""
        r = cycle.request
        tw, acc = self._tw(state)
        cpu, left, model = node_view(state, nodes)
        before = frag_amount(cpu, left, model, tw, acc)
        new_left = _take_packed(left, r.gpu_milli, r.gpu_count) if r.gpu_count else left
        after = frag_amount(cpu - r.cpu_milli, new_left, model, tw, acc)
        return _sigmoid_score(before - after)

    def _gpu_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """[k, G] scores of placing a shared pod on each GPU (-inf where it does not fit)."""
        r = cycle.request
        cpu, left, _ = node_view(state, nodes)
        k, g = left.shape
        rows, cols = np.nonzero(eligible_gpus(state, r, nodes) & (left >= r.gpu_milli))
        out = np.full((k, g), -np.inf)
        if rows.size:
            first, inv = distinct_placements(left, rows, cols)
            ur, uc = rows[first], cols[first]
            new_left = left[ur].copy()
            new_left[np.arange(ur.size), uc] -= r.gpu_milli
            mem_after = state.mem_free[nodes[ur]] - r.memory_mib
            out[rows, cols] = self._placement_scores(state, nodes, ur, cpu[ur] - r.cpu_milli, new_left, mem_after)[inv]
        return out

    def _placement_scores(self, state: ClusterState, nodes: np.ndarray, rows: np.ndarray, cpu_after: np.ndarray,
                          gpu_after: np.ndarray, mem_after: np.ndarray) -> np.ndarray:
        """Score of turning node ``nodes[rows]`` (as it is now) into each given after-state."""
        tw, acc = self._tw(state)
        cpu, left, model = node_view(state, nodes[rows])
        return _sigmoid_score(frag_amount(cpu, left, model, tw, acc) - frag_amount(cpu_after, gpu_after, model, tw, acc))

    _UNFIT = 0.0  # score of a node where no GPU takes the share (the filters normally drop it)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI and not r.mig_profile:
            s = self._shared_scores(cycle, state, nodes).max(axis=1)
            return np.where(np.isfinite(s), s, self._UNFIT)
        if nodes.size >= DEDUPE_MIN_NODES:
            reps, inv = state_groups(state, nodes)
            if reps.size < nodes.size:
                return self._node_scores(cycle, state, reps)[inv]
        return self._node_scores(cycle, state, nodes)

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        r = cycle.request
        if r.mig_profile:
            return pick_mig(cycle, state, node)
        if r.gpu_count == 1 and r.gpu_milli < GPU_MILLI:
            s = self._shared_scores(cycle, state, np.array([node]))[0]
            if not np.isfinite(s).any():
                return None
            return GpuChoice((int(np.argmax(s)),))  # first GPU with the best score, as the paper
        return BestFitGpu().select_gpus(cycle, state, node)


def cluster_frag(state: ClusterState, tw: TargetWorkload) -> np.ndarray:
    """Per-node fragment amount (milli-GPU) of the whole cluster."""
    nodes = np.arange(len(state))
    cpu, left, model = node_view(state, nodes)
    return frag_amount(cpu, left, model, tw, tw.access(state.model_names))


def register(r: Registry) -> None:
    r.register("RandomScore", RandomScore)
    r.register("RandomGpu", RandomGpu)
    r.register("DotProductScore", DotProductScore)
    r.register("GpuClusteringScore", GpuClusteringScore)
    r.register("GpuPackingScore", GpuPackingScore)
    r.register("BestFitScore", BestFitScore)
    r.register("FGDScore", FGDScore)


__all__ = [
    "BestFitScore", "DotProductScore", "FGDScore", "GpuClusteringScore", "GpuPackingScore", "RandomGpu",
    "RandomScore", "TargetWorkload", "cluster_frag", "frag_amount", "math", "register", "shape_of",
]
