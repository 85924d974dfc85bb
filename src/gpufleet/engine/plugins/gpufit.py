"""GpuFit: whole GPUs, per-GPU shares and memory, MIG profiles, GPU model allow/deny lists, kubelet device slots.

``eligible_gpus`` is the per-GPU form of the same test, which the GPU selectors use to pick devices on the
chosen node, so a node the filter passes always has the devices the selector needs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import GPU_MILLI, PodRequest
from ..state import ClusterState
from ._common import passing


def model_mask(state: ClusterState, r: PodRequest) -> np.ndarray | None:
    """Per-model-id bool array of allowed GPU models, or None when all are allowed."""
    if r.gpu_models_allow is None and not r.gpu_models_deny:
        return None
    allowed = np.array(
        [
            (r.gpu_models_allow is None or m in r.gpu_models_allow) and m not in r.gpu_models_deny
            for m in state.model_names
        ]
        + [False],
        dtype=bool,
    )
    return allowed


def eligible_gpus(state: ClusterState, r: PodRequest, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """[nodes, gpus] mask of devices that could take one unit of the pod's GPU demand."""
    usable = state.gpu_usable[rows]
    mm = model_mask(state, r)
    if mm is not None:
        usable = usable & mm[state.gpu_model[rows]]
    if state.slots_limited:  # a GPU whose kubelet devices are all held takes no further pod
        usable = usable & (state.gpu_slots_free[rows] > 0)
    if r.gpu_milli >= GPU_MILLI:
        return usable & (state.gpu_free_milli[rows] >= GPU_MILLI) & (state.gpu_mem_free[rows] == state.gpu_mem_cap[rows])
    e = usable & (state.gpu_free_milli[rows] >= r.gpu_milli)
    if r.gpu_memory_mib:
        e &= state.gpu_mem_free[rows] >= r.gpu_memory_mib
    return e


def eligible_on(state: ClusterState, r: PodRequest, node: int) -> list[int]:
    """The GPUs of one node that ``eligible_gpus`` marks, in index order, computed in Python: a GPU selector asks it
    for the chosen node only, where numpy's per-call cost on an eight-GPU row is most of the work."""
    usable = state.gpu_usable[node].tolist()
    mm = model_mask(state, r)
    if mm is not None:
        allowed = mm.tolist()
        usable = [u and allowed[m] for u, m in zip(usable, state.gpu_model[node].tolist())]
    if state.slots_limited:
        usable = [u and s > 0 for u, s in zip(usable, state.gpu_slots_free[node].tolist())]
    free = state.gpu_free_milli[node].tolist()
    if r.gpu_milli >= GPU_MILLI:
        return [j for j, (u, f, m, c) in enumerate(zip(usable, free, state.gpu_mem_free[node].tolist(),
                                                       state.gpu_mem_cap[node].tolist())) if u and f >= GPU_MILLI and m == c]
    if r.gpu_memory_mib:
        return [j for j, (u, f, m) in enumerate(zip(usable, free, state.gpu_mem_free[node].tolist()))
                if u and f >= r.gpu_milli and m >= r.gpu_memory_mib]
    return [j for j, (u, f) in enumerate(zip(usable, free)) if u and f >= r.gpu_milli]


FIT_CACHE_SHAPES = 32  # GPU request shapes whose per-node verdicts GpuFit keeps


@dataclass
class GpuFit:
    """Whole GPUs, per-GPU share and memory, MIG profiles, GPU model allow/deny."""

    name: str = "GpuFit"
    requeue_on = "room"  # judges each node by itself: a pod leaving helps only where the pod then has room (schedqueue.may_fit_after)
    _fit: OrderedDict = field(default_factory=OrderedDict, repr=False, compare=False)  # see filter
    _rooms: tuple | None = field(default=None, repr=False, compare=False)  # see _room

    REASONS = (
        "Insufficient nvidia.com/gpu",
        "Insufficient GPU milli",
        "Insufficient GPU memory",
        "node(s) had no GPU of an allowed model",
        "no free MIG instance of the requested profile",
        ("no free kubelet device for a GPU here (kubelet admits one pod per nvidia.com/gpu device: "
         "nvidia.com/gpu.replicas or the agent's sharesPerGpu per GPU, and only what it advertises)"),
    )

    _WHOLE = REASONS[:1]  # _plain's reasons
    _SHARE = REASONS[1:2]

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        n = len(state)
        if r.gpu_count == 0 or (r.dra is not None and (r.dra.extended is None or r.dra.keys)):
            return passing(n)  # a pod asking by ResourceClaim: DynamicResources decides
        res = self._filter(cycle, state)
        if state.any_plugin_down:
            res = _without_plugin_down(res, state)
        if r.dra is not None and r.dra.extended is not None:  # nvidia.com/gpu backed by DRA where no device plugin serves it
            from ..dra.extended import dra_way

            by_dra, _ = dra_way(state, r.dra.extended)
            return FilterResult(res.ok | by_dra, res.reasons, res.codes, codes_of=res.codes_of)
        return res

    def fused_gpu(self, cycle: Cycle, state: ClusterState) -> tuple[np.ndarray | None, int, tuple[str, ...]] | None:
        """What the framework's one-pass filter phase (``gpufleet._native.fit``) needs to give ``filter``'s verdict
        where it is one compare (``_plain``): the per-node figure, the pod's need and the one reason (figure None:
        passes every node); None where ``filter`` must run (claims, MIG, model lists, device or slot limits, a device
        plugin down, shares with memory or over several GPUs)."""
        r = cycle.request
        if r.gpu_count == 0:
            return None, 0, ()
        if (r.dra is not None or state.any_plugin_down or r.mig_profile or r.gpu_models_allow is not None
                or r.gpu_models_deny or state.devices_limited or state.slots_limited
                or not (r.gpu_milli >= GPU_MILLI or (r.gpu_count == 1 and not r.gpu_memory_mib))):
            return None
        room, whole = self._room(state)
        if r.gpu_milli >= GPU_MILLI:
            return whole, r.gpu_count, self._WHOLE
        return room, r.gpu_milli, self._SHARE

    def _filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        n = len(state)
        k = r.gpu_count
        if r.mig_profile:
            mm = model_mask(state, r)
            count = state.mig_free_count(r.mig_profile)
            ok = count >= k
            mig_codes = np.zeros(n, dtype=np.int64)
            if mm is not None:  # count only instances on GPUs of an allowed model
                for i in np.flatnonzero(ok):
                    free = state.mig_free[i].get(r.mig_profile, [])
                    allowed = sum(1 for g, _ in free if mm[state.gpu_model[i, g]])
                    if allowed < k:
                        ok[i] = False
                        mig_codes[i] = 1
            return FilterResult(ok, (f"Insufficient nvidia.com/mig-{r.mig_profile}", self.REASONS[3]), mig_codes)
        if (r.gpu_models_allow is None and not r.gpu_models_deny and not state.devices_limited and not state.slots_limited
                and (r.gpu_milli >= GPU_MILLI or (k == 1 and not r.gpu_memory_mib))):
            return self._plain(state, r)
        key = (state.token, state.epoch, k, r.gpu_milli, r.gpu_memory_mib, r.gpu_models_allow, r.gpu_models_deny)
        ent = self._fit.get(key)
        if ent is None:  # every node once, then only the nodes whose free devices changed (their version moved)
            ok, codes = self._fit_rows(state, r, model_mask(state, r), slice(None))
            ent = (ok, codes, state.version.copy())
            self._fit[key] = ent
            if len(self._fit) > FIT_CACHE_SHAPES:
                self._fit.popitem(last=False)
        else:
            self._fit.move_to_end(key)
            ok, codes, vers = ent
            stale = (vers != state.version).nonzero()[0]
            if stale.size:
                ok[stale], codes[stale] = self._fit_rows(state, r, model_mask(state, r), stale)
                vers[stale] = state.version[stale]
        # ok as it is (the framework only reads it, in this cycle); codes copied: a diagnosis may read them later
        return FilterResult(ok, self.REASONS, codes.copy())

    def _plain(self, state: ClusterState, r: PodRequest) -> FilterResult:
        """The verdict of ``_fit_rows`` for a pod of whole GPUs, or of a share of one GPU with no memory asked, on
        a cluster with no kubelet device or slot limits and no GPU model restriction (every pod of the bundled
        trace): one comparison against two per-node figures that hold for every such pod, kept for all nodes and
        refreshed only where a node's version moved, instead of a verdict per request shape."""
        room, whole = self._room(state)
        # every node it turns away has one reason (too few whole free GPUs; too little milli), given alone: a
        # diagnosis then counts them (``np.count_nonzero``) instead of gathering a code per node
        if r.gpu_milli >= GPU_MILLI:
            return FilterResult(np.greater_equal(whole, r.gpu_count), self._WHOLE)
        return FilterResult(np.greater_equal(room, r.gpu_milli), self._SHARE)

    def _room(self, state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the most free milli on one usable GPU (-1: none), and its usable GPUs wholly free (all their
        milli and memory); kept per snapshot and epoch, recomputed for the nodes whose version moved since the last
        call (``ClusterState.changed_since``: one or a few a cycle, found without comparing every node's version)."""
        key = (state.token, state.epoch)
        ent = self._rooms
        stale = state.changed_since(ent[3]) if ent is not None and ent[0] == key else None
        if stale is None:
            usable, free = state.gpu_usable, state.gpu_free_milli
            room = np.where(usable, free, -1).max(axis=1, initial=-1)
            whole = np.add.reduce(usable & (free >= GPU_MILLI) & (state.gpu_mem_free == state.gpu_mem_cap), axis=1,
                                  dtype=np.int64)
            self._rooms = (key, room, whole, state.change_mark(), {})
            return room, whole
        assert ent is not None
        _, room, whole, _mark, usable_on = ent
        if stale:
            free, mem_free, mem_cap = state.gpu_free_milli, state.gpu_mem_free, state.gpu_mem_cap
            for i in (stale if len(stale) == 1 else set(stale)):  # their few GPUs, in Python
                usable = usable_on.get(i)  # the node's usable GPUs (they change only with the epoch)
                if usable is None:
                    usable = usable_on[i] = state.gpu_usable[i].nonzero()[0].tolist()
                row = free[i].tolist()
                got = [row[j] for j in usable]
                best = max(got) if got else -1  # not max(..., default=-1): the keyword costs as much as the rest
                room[i] = best
                # wholly free: all its milli and all its memory (read only where some usable GPU has all its milli)
                whole[i] = 0 if best < GPU_MILLI else sum(
                    1 for j in usable if row[j] >= GPU_MILLI and mem_free.item(i, j) == mem_cap.item(i, j))
            self._rooms = (key, room, whole, state.change_mark(), usable_on)
        return room, whole

    def _fit_rows(self, state: ClusterState, r: PodRequest, mm: np.ndarray | None,
                  rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """(fits, reason code) of the nodes ``rows`` for a pod's whole GPUs or share; depends only on those nodes'
        devices and free amounts, so a node's verdict holds until its version changes."""
        k = r.gpu_count
        usable = state.gpu_usable[rows]
        n = usable.shape[0]
        codes = None  # every code 0 so far (no model restriction)
        no_devices = None
        if state.devices_limited:  # kubelet's count of free nvidia.com/gpu devices on the node
            no_devices = state.gpu_dev_free[rows] < k
            usable = usable & ~no_devices[:, None]
        if mm is not None:
            usable = usable & mm[state.gpu_model[rows]]
            model_ok = _at_least(usable, k)
            codes = np.zeros(n, dtype=np.int64)
            codes[~model_ok] = 3
        free_milli = state.gpu_free_milli[rows]
        if r.gpu_milli >= GPU_MILLI:
            e = usable & (free_milli >= GPU_MILLI) & (state.gpu_mem_free[rows] == state.gpu_mem_cap[rows])
            if state.slots_limited:
                e &= state.gpu_slots_free[rows] > 0
            ok = _at_least(e, k)  # too few devices: code 0, kube-scheduler's "Insufficient nvidia.com/gpu"
            return ok, codes if codes is not None else np.zeros(n, dtype=np.int64)
        mem_free = state.gpu_mem_free[rows] if r.gpu_memory_mib else None
        if state.slots_limited:
            slotted = usable & (state.gpu_slots_free[rows] > 0)
            share0 = usable & (free_milli >= r.gpu_milli)
            if mem_free is not None:
                share0 &= mem_free >= r.gpu_memory_mib
            # the share would fit by milli/memory but every such GPU's kubelet devices are taken
            no_slot = _at_least(share0, k) & ~_at_least(share0 & slotted, k)
            if codes is not None:
                no_slot &= codes != 3
            usable = slotted
        else:
            no_slot = None
        share = usable & (free_milli >= r.gpu_milli)
        if mem_free is not None:
            share_ok = _at_least(share, k)
            ok = _at_least(share & (mem_free >= r.gpu_memory_mib), k)
            c = np.where(share_ok, 2, 1)
        else:
            ok = _at_least(share, k)
            c = np.empty(n, dtype=np.int64)
            c.fill(1)  # np.ones, without its Python wrapper
        codes = c if codes is None else np.where(codes == 3, 3, c)
        if no_slot is not None:
            codes = np.where(no_slot & ~ok, 5, codes)
        if no_devices is not None:
            codes = np.where(no_devices & ~ok & (codes != 3), 5, codes)
        return ok, codes


PLUGIN_DOWN = ("GPU device plugin down (kubelet refused a pod here because gpufleet's agent was not serving it; "
               "GPU pods wait until the agent registers again)")


def _without_plugin_down(res: FilterResult, state: ClusterState) -> FilterResult:
    """No GPU pod on a node whose device plugin is down (``Node.gpu_plugin_down``), with that reason."""
    down = state.gpu_plugin_down
    codes = res.reason_codes()
    base = codes if codes is not None else np.zeros(len(down), dtype=np.int64)
    return FilterResult(res.ok & ~down, (*res.reasons, PLUGIN_DOWN), np.where(down, len(res.reasons), base))


def _at_least(mask: np.ndarray, k: int) -> np.ndarray:
    """Per row of a [nodes, GPUs] mask: at least ``k`` true."""
    # the ufuncs that .any(axis=1) and np.count_nonzero(axis=1) come to, without their Python wrappers
    if k == 1:
        return np.logical_or.reduce(mask, axis=1)
    return np.add.reduce(mask, axis=1, dtype=np.intp) >= k
