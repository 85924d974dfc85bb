"""FGD, fragmentation gradient descent: the node and GPU whose expected fragment grows least.

Also the score machinery gpufleet's default builds on: a per-GPU score cache for shares, grouping of nodes in
identical states so that a full re-score costs a few dozen evaluations, and learning the target workload online.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Hashable, Iterable, cast

import numpy as np

from ... import native
from ...engine.errors import ConfigError
from ...engine.framework import MAX_NODE_SCORE, Cycle, GpuChoice, SharedObserver
from ...engine.model import GPU_MILLI, PodRequest
from ...engine.plugins.gpufit import eligible_gpus, eligible_on
from ...engine.plugins.gpuselect import BestFitGpu, pick_mig
from ...engine.state import ClusterState
from ._common import PaperPlugin, take_packed
from .learning import FORGET_BELOW, SEEN_KEYS_MAX, OnlineWorkload, fade
from .workload import POPULARITY_THRESHOLD, TargetWorkload, _direct_consts, _gpu_table, frag_amount, node_view, shape_of


DEDUPE_MIN_NODES = 32  # below this, grouping costs more than it saves
MEMO_MAX_STATES = 100_000  # node states whose scores are remembered per workload version (see FragDescent._remembered)


def state_groups(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group nodes whose free resources and GPU make-up are identical: (representatives, inverse).

    A fragmentation score depends only on these columns, so nodes in one group
    score alike; a large cluster has few distinct states (most nodes are idle or
    full), which turns a full re-score (a new epoch, a re-learned workload) from
    every node into a few dozen.  The groups are those of ``state_ids``: exact,
    and kept per node between cycles, so grouping costs O(nodes) integer work.
    """
    reps, inverse, _ = state_groups_ids(state, nodes)
    return reps, inverse


def state_groups_ids(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``state_groups``, and each representative's ``state_ids`` number (ascending): what ``_remembered`` would
    number the representatives again."""
    ids = state_ids(state, nodes)
    m = int(np.maximum.reduce(ids)) + 1 if ids.size else 0
    if m > 4 * ids.size:  # sparse ids: sorting is cheaper than tables of every id
        distinct, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        return nodes[first], inverse.ravel(), distinct
    first = np.empty(m, dtype=np.int64)
    first.fill(-1)  # np.full, without its Python wrapper
    # each id's first node (any member stands for its group); the reversed ids copied first: a scatter through the
    # reversed view is twice as slow
    first[ids[::-1].copy()] = np.arange(ids.size - 1, -1, -1)
    present = (first >= 0).nonzero()[0]  # the ids present, ascending
    rank = np.empty(m, dtype=np.intp)
    rank[present] = np.arange(present.size)  # an id's group: its rank among those (what cumsum - 1 of the mask gives)
    # .take instead of boolean masks and fancy indexing: the same arrays, 3-4x faster over thousands of nodes
    return nodes.take(first.take(present)), rank.take(ids), present


IDS_MAX_STATES = 1_000_000  # distinct node states numbered per epoch before the numbering starts over
_IDS: OrderedDict[int, dict] = OrderedDict()  # epoch -> {"table": {state bytes: id}, "gen": int, token: (ids, versions)}
_ID_GEN = itertools.count(1)


IDS_PY_MAX = 4  # nodes up to which state_ids(as_list=True) reads and writes its columns by Python scalars


def state_ids(state: ClusterState, nodes: np.ndarray, as_list: bool = False) -> Any:
    """Per node, a number for its state (``memo_keys``): equal numbers, equal states, within an epoch and ``id_generation``
    (an array; ``as_list``: a list of ints, what ``_remembered`` reads).

    Each node's number is kept with the node version it was taken at (per state object: copies share versions)
    and taken again only when the version moved, so a cycle numbers the one or two nodes that changed, not all.
    """
    e = _IDS.get(state.epoch)
    if e is None:
        e = _IDS[state.epoch] = {"table": {}, "gen": next(_ID_GEN)}
        while len(_IDS) > 8:
            _IDS.popitem(last=False)
    else:
        _IDS.move_to_end(state.epoch)
    table = e["table"]
    if len(table) > IDS_MAX_STATES:
        e.clear()
        e.update(table={}, gen=next(_ID_GEN))
        table = e["table"]
    per = e.get(state.token)
    n = len(state)
    if per is None or per[0].size != n:
        per = e[state.token] = (np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    ids, vers = per
    if as_list and nodes.size <= IDS_PY_MAX:  # a few nodes (a cycle's changed ones): Python scalars, no numpy calls
        version = state.version
        at = nodes.tolist()
        stale_l = [i for i in at if vers[i] != version[i]]
        if stale_l:
            for i, k in zip(stale_l, memo_keys(state, np.array(stale_l, dtype=np.intp))):
                ids[i] = table.setdefault(k, len(table))
                vers[i] = version[i]
        return [int(ids[i]) for i in at]
    stale = nodes.take((vers.take(nodes) != state.version.take(nodes)).nonzero()[0])  # what nodes[mask] gives, faster
    if stale.size:
        # numbered in order (each new state the next number: len(table) is taken before its setdefault), written by
        # one assignment instead of one numpy item write per node
        ids[stale] = [table.setdefault(k, len(table)) for k in memo_keys(state, stale)]
        vers[stale] = state.version.take(stale)
    return ids.take(nodes).tolist() if as_list else ids.take(nodes)


def stale_nodes(vers: np.ndarray, version: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """``nodes[vers[nodes] != version[nodes]]``, in order: for a few nodes by Python scalars (numpy's per-call cost
    is most of the work on a cycle's one or two changed nodes)."""
    if nodes.size <= IDS_PY_MAX:
        return np.array([i for i in nodes.tolist() if vers[i] != version[i]], dtype=nodes.dtype)
    return nodes.take((vers.take(nodes) != version.take(nodes)).nonzero()[0])  # what nodes[mask] gives, faster


def id_generation(state: ClusterState) -> int:
    """Changes when ``state_ids`` starts numbering this epoch's states over (see IDS_MAX_STATES)."""
    state_ids(state, np.zeros(0, dtype=np.int64))
    return _IDS[state.epoch]["gen"]


_KINDS: OrderedDict[int, np.ndarray] = OrderedDict()


def _node_kinds(state: ClusterState) -> np.ndarray:
    """Per node, an id of its fixed GPU make-up (model, memory, usable), which changes only with the epoch."""
    kinds = _KINDS.get(state.epoch)
    if kinds is None or kinds.size != len(state):
        static = np.concatenate([state.gpu_usable, state.gpu_model, state.gpu_mem_cap], axis=1).astype(np.int64)
        # np.unique(static, axis=0, return_inverse=True)'s numbering (distinct rows in sorted order), without sorting
        # every node's row: a node's make-up by its bytes, then the few distinct make-ups sorted (40 ms -> 3 at 5,000)
        first: dict[bytes, int] = {}
        of = [first.setdefault(row.tobytes(), i) for i, row in enumerate(static)]
        reps = np.array(list(first.values()), dtype=np.int64)
        _, rank = np.unique(static[reps], axis=0, return_inverse=True)
        kind_of = dict(zip(reps.tolist(), rank.ravel().tolist()))
        kinds = np.array([kind_of[i] for i in of], dtype=np.int64)
        _KINDS[state.epoch] = kinds
        while len(_KINDS) > 8:
            _KINDS.popitem(last=False)
    return kinds


def memo_keys(state: ClusterState, nodes: np.ndarray) -> list[bytes]:
    """Per node, the bytes of everything a fragmentation score reads of it: the GPU make-up (``_node_kinds``), free
    CPU and memory, and per GPU free milli, free memory and (where kubelet devices are counted) free device slots."""
    g = state.max_gpus
    slots = state.slots_limited
    if nodes.size <= MEMO_KEYS_PY_MAX:  # a node or two (one changed per cycle): the same bytes, row by row
        kinds = _node_kinds(state)
        out = []
        for i in nodes.tolist():
            j = slice(i, i + 1)
            parts = [kinds[j], state.cpu_free[j], state.mem_free[j], state.gpu_free_milli[i], state.gpu_mem_free[i]]
            if slots:
                parts.append(state.gpu_slots_free[i])
            out.append(np.concatenate(parts, dtype=np.int64).tobytes())
        return out
    cols = np.empty((nodes.size, 3 + (3 if slots else 2) * g), dtype=np.int64)
    cols[:, 0] = _node_kinds(state)[nodes]
    cols[:, 1] = state.cpu_free[nodes]
    cols[:, 2] = state.mem_free[nodes]
    cols[:, 3 : 3 + g] = state.gpu_free_milli[nodes]
    cols[:, 3 + g : 3 + 2 * g] = state.gpu_mem_free[nodes]
    if slots:
        cols[:, 3 + 2 * g :] = state.gpu_slots_free[nodes]
    # each row as one void item: tolist gives its bytes (row.tobytes(), every byte kept), 4x faster than row by row
    return cast(list[bytes], cols.view(np.dtype((np.void, cols.shape[1] * cols.itemsize))).reshape(-1).tolist())


def eligible_mask(state: ClusterState, r: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """``eligible_gpus(state, r, nodes)``, by ``eligible_on`` node by node for a few nodes (no numpy calls over the
    table): the share's usable GPUs, as the C scores of FGD and of the default policy take them."""
    if nodes.size > GPU_SCORES_PY_MAX:
        return eligible_gpus(state, r, nodes)
    elig = np.zeros((nodes.size, state.gpu_free_milli.shape[1]), dtype=bool)
    for i, node in enumerate(nodes.tolist()):
        elig[i, eligible_on(state, r, node)] = True
    return elig


MEMO_KEYS_PY_MAX = 2  # nodes up to which memo_keys builds each key alone (fewer numpy calls than the [k, 19] table)
GPU_SCORES_PY_MAX = 2  # nodes up to which FragDescent._gpu_scores enumerates placements in Python (46.8 -> 42.8 us at one
# node, even at two, slower at four: best of 30 runs each)
DISTINCT_PY_MAX = 24  # placements up to which distinct_placements runs in plain Python


def distinct_placements(left: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) over (node, GPU) placements of one share: placing it on either of two GPUs
    of a node with the same free milli leaves the same multiset of free GPUs, which is all a
    fragmentation measure sees, so one placement stands for both (8 -> 1 on an idle node)."""
    key = rows * (GPU_MILLI + 1) + left[rows, cols]
    if key.size <= DISTINCT_PY_MAX:  # a node or two: the same in plain Python, without a dozen numpy calls
        first_l, inverse_l = _distinct_py(key.tolist())
        return np.array(first_l, dtype=np.intp), np.array(inverse_l, dtype=np.intp)
    # np.unique(key, return_index=True, return_inverse=True) without its wrapper's cost: a stable sort, the first
    # of each run of equal keys (its first occurrence), and each key's run number
    order = key.argsort(kind="stable")
    srt = key[order]
    new = np.empty(srt.size, dtype=bool)
    new[:1] = True
    np.not_equal(srt[1:], srt[:-1], out=new[1:])
    inverse = np.empty(key.size, dtype=np.intp)
    inverse[order] = new.cumsum() - 1
    return order[new], inverse


def _distinct_py(keys: list[int]) -> tuple[list[int], list[int]]:
    """``distinct_placements``' (first, inverse) of its placement keys, in plain Python: a stable sort, the first of each
    run of equal keys, each key's run number."""
    order_l = sorted(range(len(keys)), key=keys.__getitem__)  # stable, as argsort(kind="stable")
    first_l: list[int] = []
    inverse_l = [0] * len(keys)
    last = None
    for i in order_l:
        if keys[i] != last:
            first_l.append(i)
            last = keys[i]
        inverse_l[i] = len(first_l) - 1
    return first_l, inverse_l


def set_rows(dst: np.ndarray, at: np.ndarray, src: np.ndarray) -> None:
    """``dst[at] = src`` for a C-contiguous [n, G] ``dst``: each row moved as one G-item record (the same bytes;
    numpy's fancy row assignment copies item by item, 4x slower over thousands of rows)."""
    if dst.shape[1] == 0:
        return
    rec = np.dtype((np.void, dst.shape[1] * dst.itemsize))
    dst.view(rec).reshape(-1)[at] = np.ascontiguousarray(src, dtype=dst.dtype).view(rec).reshape(-1)


_BEST_FIT = BestFitGpu()  # stateless: one for every whole-GPU pod's selection


_NO_GPU = np.array([-np.inf])  # FGDScore._native_scores: the score read where no GPU takes the share (index -1)


def _sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """int(sigmoid(delta/1000) * 100): FGD's score of a fragment decrease ``delta``."""
    return np.floor(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0)))


class FragDescent(SharedObserver):
    """FGD's score machinery over a learned target workload (``learner``), for FGD and the default's descent.

    A share's score is its best GPU's, through a per-GPU score cache (``_shared_scores``) that the GPU
    selector reads too; other pods are scored per node, with nodes in identical states scored once
    (``state_groups``).  Subclasses say how a placement scores (``_placement_scores``, ``_node_scores``).
    """

    name = ""
    observed_attr = "learner"
    learner: OnlineWorkload
    _gsel: OrderedDict  # see _gpu_cache
    _memo: list | None = None  # see _remembered
    _ck: tuple | None = None  # (the last cycle cache_key saw, its pod's _shape_key): see _cycle_key

    def _tw(self, state: ClusterState) -> tuple[TargetWorkload, np.ndarray]:
        return self.learner.tw(state)

    def _shape_key(self, r: PodRequest) -> Hashable:
        """What of the pod its scores depend on: the paper's shape (FGD reads no node memory; the default adds it),
        and beyond the shape what decides which GPUs may take a share (``eligible_gpus``): per-GPU memory asked and
        models denied.  Left out where unset, so pods without them keep the paper's keys."""
        shape = shape_of(r)
        return (shape, r.gpu_memory_mib, r.gpu_models_deny) if r.gpu_memory_mib or r.gpu_models_deny else shape

    def _cycle_key(self, cycle: Cycle) -> Hashable:
        """``_shape_key`` of the cycle's pod as ``cache_key`` took it this cycle (after learning from the pod; the
        per-GPU cache and the GPU selector ask again), else taken now."""
        c = self._ck
        return c[1] if c is not None and c[0] is cycle else self._shape_key(cycle.request)

    def cache_key(self, cycle: Cycle):
        self.learner.observe_pod(cycle)
        self._ck = (cycle, self._shape_key(cycle.request))
        return (self._ck[1], self.learner.version)

    def cache_version(self) -> int:
        """The learned workload's version, in every key above: the framework drops older versions' scores."""
        return self.learner.version

    def _gpu_cache(self, cycle: Cycle, state: ClusterState) -> tuple[np.ndarray, np.ndarray, bool]:
        """Per-GPU scores of a shared pod's shape, [nodes, G], with the node version each was computed at, and
        whether the entry was made just now (every node stale; its rows not written yet, so not to be read).

        ``score`` fills it; ``select_gpus`` reads the chosen node's row instead of
        scoring that node a second time.
        """
        key = (self._cycle_key(cycle), self.learner.version, state.epoch)  # epochs are unique across states
        cache = self._gsel
        ent = cache.get(key)
        if ent is None or ent[0].shape != state.gpu_free_milli.shape:
            for old in [k for k in cache if k[1] != key[1]]:  # an older workload version's: never asked again
                del cache[old]
            # rows are read only where their version is the node's (written then): no fill needed
            ent = (np.empty(state.gpu_free_milli.shape), np.full(len(state), -1, dtype=np.int64))
            cache[key] = ent
            if len(cache) > 16:
                cache.popitem(last=False)
            return ent[0], ent[1], True
        cache.move_to_end(key)
        return ent[0], ent[1], False

    def _shared_fresh(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, tuple | None]:
        """Bring the per-GPU cache up to date for ``nodes``: (the cache's rows, and where every node was stale
        (stale is then ``nodes``, in order): (the rows just made for them, or None where grouped, the rows of their
        distinct states, each node's index into those or None where not grouped)), else None.  Where every node was
        stale and grouped, the cache is left as it was (see below)."""
        rows, vers, made = self._gpu_cache(cycle, state)
        stale = nodes if made else stale_nodes(vers, state.version, nodes)
        if not stale.size:
            return rows, None
        inv = None
        if stale.size >= DEDUPE_MIN_NODES:
            reps, inv, rep_ids = state_groups_ids(state, stale)
            got = self._remembered("gpu", cycle, state, reps, rep_ids.tolist())
            if stale.size == nodes.size:
                # every node stale (a new key: every candidate): the caller reads the distinct states' rows by ``inv``,
                # and the cache's rows stay stale rather than written for thousands of nodes of which the GPU selector
                # reads one (that node's row comes from the memo then: the same row)
                return rows, (None, got, inv)
            new = got.take(inv, axis=0)  # got[inv], a copy either way; take is 4x faster on [k, G]
            set_rows(rows, stale, new)
        else:
            new = got = self._remembered("gpu", cycle, state, stale)
            rows[stale] = new
        vers[stale] = state.version[stale]
        return rows, ((new, got, inv) if stale.size == nodes.size else None)

    def _shared_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """[k, G] per-GPU scores of ``nodes`` for a single shared GPU, through the per-GPU cache."""
        rows, fresh = self._shared_fresh(cycle, state, nodes)
        if fresh is None:
            return rows[nodes]
        new, got, inv = fresh
        return new if new is not None else got.take(inv, axis=0)

    def _shared_best(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """Each node's best GPU score for a single shared GPU: ``_shared_scores(...).max(axis=1)``, the same
        numbers; where every node was stale and grouped, the max of each distinct state's row, spread."""
        rows, fresh = self._shared_fresh(cycle, state, nodes)
        if fresh is None:
            return np.maximum.reduce(rows[nodes], axis=1)
        new, got, inv = fresh
        return np.maximum.reduce(new, axis=1) if inv is None else np.maximum.reduce(got, axis=1)[inv]

    def _remembered(self, what: str, cycle: Cycle, state: ClusterState, nodes: np.ndarray,
                    ids: list[int] | None = None) -> np.ndarray:
        """``_gpu_scores`` (``what`` "gpu") or ``_node_scores`` ("node") of ``nodes``, through a memo of node states.

        Why: a node's score for a pod depends only on the node's state (``memo_keys``), the pod's resources and what
        is fixed per workload version and epoch (the target workload, the ratios learned, the pattern table), and
        nodes keep going through the same states: nodes of one make-up are filled the same way, so the node that
        changed in the last cycle is often in a state some node was in before (``state_ids`` numbers the states).  A remembered row is the one that
        computing it again would give (the computation is row by row), so placements do not change.  The memo is
        dropped when the workload version or the epoch changes, and when it holds ``MEMO_MAX_STATES`` states.
        The first call in a version always computes, so whatever is learned lazily per version is learned at the
        same pod as without the memo.  ``ids``: the nodes' ``state_ids`` where the caller just took them
        (``state_groups_ids``' representatives), else taken here.
        """
        if nodes.size == 0:
            return self._gpu_scores(cycle, state, nodes) if what == "gpu" else self._node_scores(cycle, state, nodes)
        if ids is None:
            ids = state_ids(state, nodes, as_list=True)
        version = (self.learner.version, state.epoch, _IDS[state.epoch]["gen"], len(state.model_names), state.slots_limited)  # state_ids just numbered this epoch (id_generation)
        m = self._memo
        if m is None or m[0] != version or m[2] > MEMO_MAX_STATES:
            m = self._memo = [version, {}, 0]
        r = cycle.request
        table = m[1].setdefault((what, r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_memory_mib,
                                 r.mig_profile, r.gpu_models_allow, r.gpu_models_deny), {})
        miss = [i for i, k in enumerate(ids) if k not in table]
        if miss:
            at = nodes[miss]
            new = self._gpu_scores(cycle, state, at) if what == "gpu" else self._node_scores(cycle, state, at)
            for i, v in zip(miss, new):
                table[ids[i]] = v
            m[2] += len(miss)
            if len(miss) == len(ids):
                return new
        return np.array([table[k] for k in ids])

    def _node_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """Scores of placing a pod that is not a single shared GPU."""
        r = cycle.request
        tw, acc = self._tw(state)
        cpu, left, model = node_view(state, nodes)
        before = frag_amount(cpu, left, model, tw, acc)
        new_left = take_packed(left, r.gpu_milli, r.gpu_count) if r.gpu_count else left
        after = frag_amount(cpu - r.cpu_milli, new_left, model, tw, acc)
        return _sigmoid_score(before - after)

    def _gpu_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray,
                    view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """[k, G] scores of placing a shared pod on each GPU (-inf where it does not fit); ``view``: ``node_view`` of ``nodes``."""
        r = cycle.request
        cpu, left, model = view if view is not None else node_view(state, nodes)
        k, g = left.shape
        if k <= GPU_SCORES_PY_MAX and left.dtype.kind in "iu":
            return self._gpu_scores_py(state, nodes, r, (cpu, left, model))
        # eligible_gpus asks each usable GPU for the share's milli, and ``left`` is the free milli of usable GPUs: what
        # ``& (left >= r.gpu_milli)`` would add is already in it (a share asks 0 < milli)
        rows, cols = eligible_gpus(state, r, nodes).nonzero()
        out = np.empty((k, g))
        out.fill(-np.inf)  # np.full, without its Python wrapper
        if rows.size:
            first, inv = distinct_placements(left, rows, cols)
            ur, uc = rows[first], cols[first]
            new_left = left[ur]  # a copy (fancy indexing)
            new_left[np.arange(ur.size), uc] -= r.gpu_milli
            out[rows, cols] = self._placement_scores(state, nodes, ur, r, new_left, (cpu, left, model))[inv]
        return out

    def _gpu_scores_py(self, state: ClusterState, nodes: np.ndarray, r: PodRequest,
                       view: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """``_gpu_scores`` of a node or two, the placements enumerated in Python (numpy's per-call cost is most of the
        work on the one or two nodes a cached score usually recomputes): the GPUs ``eligible_on`` gives per node (what
        ``eligible_gpus`` marks, in index order: the row-major order of its nonzero), the same distinct placements
        and after-states, scored by the same ``_placement_scores`` call.  Property-tested against the array path."""
        left = view[1]
        k, g = left.shape
        left_l = left.tolist()
        rows_l: list[int] = []
        cols_l: list[int] = []
        for i, node in enumerate(nodes.tolist()):
            for j in eligible_on(state, r, node):
                rows_l.append(i)
                cols_l.append(j)
        out = np.empty((k, g))
        out.fill(-np.inf)  # np.full, without its Python wrapper
        if rows_l:
            first_l, inverse_l = _distinct_py([i * (GPU_MILLI + 1) + left_l[i][j] for i, j in zip(rows_l, cols_l)])
            after = []
            for f in first_l:
                row = list(left_l[rows_l[f]])
                row[cols_l[f]] -= r.gpu_milli
                after.append(row)
            ur = np.array([rows_l[f] for f in first_l], dtype=np.intp)
            scores = self._placement_scores(state, nodes, ur, r, np.array(after, dtype=left.dtype), view)
            out[rows_l, cols_l] = scores.take(inverse_l)
        return out

    def _placement_scores(self, state: ClusterState, nodes: np.ndarray, rows: np.ndarray, r: PodRequest,
                          gpu_after: np.ndarray, view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Score of placing pod ``r`` on node ``nodes[rows]`` (as it is now), leaving its GPUs as ``gpu_after`` (and
        its CPU and memory less the pod's); ``view``: ``node_view`` of ``nodes``."""
        tw, acc = self._tw(state)
        cpu, left, model = view if view is not None else node_view(state, nodes)
        cpu, left, model = cpu[rows], left[rows], model[rows]
        return _sigmoid_score(frag_amount(cpu, left, model, tw, acc) - frag_amount(cpu - r.cpu_milli, gpu_after, model, tw, acc))

    _UNFIT = 0.0  # score of a node where no GPU takes the share (the filters normally drop it)

    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if r.gpu_count == 1 and 0 < r.gpu_milli < GPU_MILLI and not r.mig_profile:
            s = self._shared_best(cycle, state, nodes)
            return np.where(np.isfinite(s), s, self._UNFIT)
        if nodes.size >= DEDUPE_MIN_NODES:
            reps, inv, rep_ids = state_groups_ids(state, nodes)
            if reps.size < nodes.size:
                return self._remembered("node", cycle, state, reps, rep_ids.tolist())[inv]
        return self._remembered("node", cycle, state, nodes)

    def select_gpus(self, cycle: Cycle, state: ClusterState, node: int) -> GpuChoice | None:
        r = cycle.request
        if r.mig_profile:
            return pick_mig(cycle, state, node)
        if r.gpu_count == 1 and r.gpu_milli < GPU_MILLI:
            rows, vers, _ = self._gpu_cache(cycle, state)
            # the node's cached row where it is fresh (scoring just brought it up to date), else scored now
            s = rows[node] if vers[node] == state.version[node] else self._shared_scores(cycle, state, np.array([node]))[0]
            if not np.logical_or.reduce(np.isfinite(s)):  # no GPU takes it (``.any()``, without its wrapper)
                return None
            return GpuChoice((int(s.argmax()),))  # first GPU with the best score, as the paper
        return _BEST_FIT.select_gpus(cycle, state, node)


@dataclass
class FGDScore(FragDescent, PaperPlugin):
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

    def __post_init__(self) -> None:
        """Check every numeric and boolean argument once, at start; then the learner they configure."""
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
        self.learner = OnlineWorkload(self.learn_online, self.refresh_every, self.refresh_growth, self.refresh_max_pods,
                                      self.memory_pods, self.min_change, self.threshold, self.include_cpu_pods)
        self._gsel = OrderedDict()

    def _native_scores(self, state: ClusterState, nodes: np.ndarray, r: PodRequest,
                       elig: np.ndarray | bool | None) -> np.ndarray | None:
        """``_node_scores`` (``elig`` None) or ``_gpu_scores`` (``elig``: ``eligible_gpus`` of ``nodes``, or True where
        that is the usable GPUs with the share's milli free: the pod asks no memory or models, no device slots) with the
        fragment decreases from one C call (gpufleet._native.fgd); None where the extension is off or declines (the
        Python path then).

        Why: a cached key recomputes one to a few nodes per decision, and around ``frag_amount``'s two C calls the
        node view, ``take_packed`` or the placements' enumeration and their after-states were ~15-25 numpy calls and
        Python loops on arrays of a few rows.  The C gives the decreases of the same states (for a share: one per
        distinct placement, in ``distinct_placements``' order); the sigmoid stays here, over the same array in the same
        order (``np.exp``'s SIMD bits are numpy's own), so every score is the same bits."""
        tw, acc = self._tw(state)
        if native.fgd is None or not len(tw) or r.mig_profile:
            return None
        args = (state.cpu_free, state.gpu_free_milli, state.gpu_usable, state.node_model)
        wl = (acc, _direct_consts(tw)[1], _gpu_table(tw), tw.gpu_count, tw.cpu_milli, tw.freq)
        if elig is None:
            out = np.empty(nodes.size)
            if native.fgd(out, None, nodes, *args, None, r.cpu_milli, r.gpu_milli, r.gpu_count, *wl) < 0:
                return None
            return _sigmoid_score(out)
        inv = np.empty((nodes.size, state.gpu_free_milli.shape[1]), dtype=np.int64)
        out = np.empty(inv.size)
        n = native.fgd(out, inv, nodes, *args, elig, r.cpu_milli, r.gpu_milli, 1, *wl)
        if n < 0:
            return None
        # each GPU's placement's score; -1 (no GPU): the -inf appended
        return np.concatenate((_sigmoid_score(out[:n]), _NO_GPU)).take(inv)

    def _node_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        if native.fgd is not None and nodes.size:
            got = self._native_scores(state, nodes, cycle.request, None)
            if got is not None:
                return got
        return super()._node_scores(cycle, state, nodes)

    def _gpu_scores(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray,
                    view: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        if native.fgd is not None and nodes.size:
            r = cycle.request
            elig: np.ndarray | bool
            if r.gpu_models_allow is None and not r.gpu_models_deny and not r.gpu_memory_mib and not state.slots_limited:
                elig = True  # eligible_gpus' mask is usable GPUs with the share's milli free: the C makes it
            else:
                elig = eligible_mask(state, r, nodes)
            got = self._native_scores(state, nodes, r, elig)
            if got is not None:
                return got
        return super()._gpu_scores(cycle, state, nodes, view)

    @property
    def workload(self) -> TargetWorkload | None:
        return self.learner.workload

    def prime(self, requests: Iterable[PodRequest]) -> None:
        """Fix the target workload from a known task population (the paper's setting)."""
        self.learner.prime(requests)

    def observe(self, r: PodRequest) -> None:
        self.learner.observe(r)


__all__ = ["DEDUPE_MIN_NODES", "FGDScore", "FORGET_BELOW", "FragDescent", "SEEN_KEYS_MAX", "fade", "memo_keys", "state_groups", "state_groups_ids",
           "state_ids"]
