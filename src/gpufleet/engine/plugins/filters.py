"""Filters: which nodes can run the pod at all.

Each works on every node at once and returns one reason string per failure
cause, worded like kube-scheduler's so the aggregated message reads familiar.
Label- and taint-based masks depend only on node metadata, so they are cached
per (pod constraint, state epoch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..framework import Cycle, FilterResult
from ..model import GPU_MILLI, PodRequest, Requirement, SelectorTerm, Taint
from ..state import ClusterState


def _req_matches(req: Requirement, labels: dict[str, str], node_name: str) -> bool:
    if req.key == "metadata.name":
        v: str | None = node_name
    else:
        v = labels.get(req.key)
    op = req.operator
    if op == "In":
        return v is not None and v in req.values
    if op == "NotIn":
        return v is None or v not in req.values
    if op == "Exists":
        return v is not None
    if op == "DoesNotExist":
        return v is None
    try:
        iv, lim = int(v), int(req.values[0])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return iv > lim if op == "Gt" else iv < lim


def term_matches(term: SelectorTerm, labels: dict[str, str], node_name: str) -> bool:
    # an empty term matches nothing (Kubernetes semantics)
    return bool(term.requirements) and all(_req_matches(r, labels, node_name) for r in term.requirements)


class _MetaCache:
    def __init__(self) -> None:
        self._cache: dict[tuple, np.ndarray] = {}

    def get(self, key: tuple, state: ClusterState, build) -> np.ndarray:
        k = (state.epoch, id(state)) + key
        m = self._cache.get(k)
        if m is None:
            if len(self._cache) > 1024:
                self._cache.clear()
            m = build()
            self._cache[k] = m
        return m




def node_affinity_rows(state: ClusterState, r: PodRequest) -> np.ndarray:
    """Per node: does it match the pod's nodeSelector and required node affinity (uncached)."""
    out = np.empty(len(state), dtype=bool)
    for i, n in enumerate(state.nodes):
        ok = all(n.labels.get(k) == v for k, v in r.node_selector)
        if ok and r.required_terms:
            ok = any(term_matches(t, n.labels, n.name) for t in r.required_terms)
        out[i] = ok
    return out

@dataclass
class NodeUnschedulable:
    name: str = "NodeUnschedulable"
    _c: _MetaCache = field(default_factory=_MetaCache)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        tols = cycle.request.tolerations
        tolerated = any(t.tolerates(Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")) for t in tols)
        ok = self._c.get(
            (tolerated,), state, lambda: np.array([tolerated or not n.unschedulable for n in state.nodes], dtype=bool)
        )
        return FilterResult(ok, ("node(s) were unschedulable",))


@dataclass
class NodeAffinity:
    """nodeSelector and required node affinity (filter); preferred affinity (score)."""

    name: str = "NodeAffinity"
    _c: _MetaCache = field(default_factory=_MetaCache)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        if not r.node_selector and not r.required_terms:
            return FilterResult(np.ones(len(state), dtype=bool), passes_all=True)

        ok = self._c.get((r.node_selector, r.required_terms), state, lambda: node_affinity_rows(state, r))
        return FilterResult(ok, ("node(s) didn't match Pod's node affinity/selector",))

    # score: preferred terms
    def score(self, cycle: Cycle, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        r = cycle.request
        if not r.preferred_terms:
            return np.zeros(nodes.size)
        out = np.zeros(nodes.size)
        for k, i in enumerate(nodes):
            n = state.nodes[int(i)]
            out[k] = sum(p.weight for p in r.preferred_terms if term_matches(p.term, n.labels, n.name))
        return out

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        m = raw.max() if raw.size else 0
        return raw * (100.0 / m) if m > 0 else raw

    def cache_key(self, cycle: Cycle):
        return None


@dataclass
class TaintToleration:
    """NoSchedule/NoExecute taints filter; PreferNoSchedule taints lower the score."""

    name: str = "TaintToleration"
    _c: _MetaCache = field(default_factory=_MetaCache)

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        tols = cycle.request.tolerations

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

        ok, codes, reasons = self._c.get((tols,), state, build)
        return FilterResult(ok, reasons, codes)

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


@dataclass
class NodeResourcesFit:
    """CPU, memory, pod count and every other scalar resource the pod requests (GPUs: GpuFit)."""

    name: str = "NodeResourcesFit"

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        cpu = state.cpu_free >= r.cpu_milli
        mem = state.mem_free >= r.memory_mib
        pods = state.pods_free >= 1
        ok = cpu & mem & pods
        if not r.scalars:
            if ok.all():
                return FilterResult(ok, passes_all=True)
            return FilterResult(ok, ("Too many pods", "Insufficient cpu", "Insufficient memory"), np.where(~pods, 0, np.where(~cpu, 1, 2)))
        codes = np.where(~pods, 0, np.where(~cpu, 1, 2))
        reasons = ["Too many pods", "Insufficient cpu", "Insufficient memory"]
        for name, amount in r.scalars:
            free = state.scalar_free.get(name)
            fits = free >= amount if free is not None else np.zeros(len(state), dtype=bool)
            codes = np.where(ok & ~fits, len(reasons), codes)
            reasons.append(f"Insufficient {name}")
            ok &= fits
        return FilterResult(ok, tuple(reasons), codes)


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


@dataclass
class GpuFit:
    """Whole GPUs, per-GPU share and memory, MIG profiles, GPU model allow/deny."""

    name: str = "GpuFit"

    REASONS = (
        "Insufficient nvidia.com/gpu",
        "Insufficient GPU milli",
        "Insufficient GPU memory",
        "node(s) had no GPU of an allowed model",
        "no free MIG instance of the requested profile",
        ("no free kubelet device for a GPU here (kubelet admits one pod per nvidia.com/gpu device: "
         "nvidia.com/gpu.replicas or the agent's sharesPerGpu per GPU, and only what it advertises)"),
    )

    def filter(self, cycle: Cycle, state: ClusterState) -> FilterResult:
        r = cycle.request
        n = len(state)
        if r.gpu_count == 0:
            return FilterResult(np.ones(n, dtype=bool), passes_all=True)
        k = r.gpu_count
        mm = model_mask(state, r)
        if r.mig_profile:
            count = state.mig_free_count(r.mig_profile)
            ok = count >= k
            codes = np.zeros(n, dtype=np.int64)
            if mm is not None:  # count only instances on GPUs of an allowed model
                for i in np.flatnonzero(ok):
                    free = state.mig_free[i].get(r.mig_profile, [])
                    allowed = sum(1 for g, _ in free if mm[state.gpu_model[i, g]])
                    if allowed < k:
                        ok[i] = False
                        codes[i] = 1
            return FilterResult(ok, (f"Insufficient nvidia.com/mig-{r.mig_profile}", self.REASONS[3]), codes)
        usable = state.gpu_usable
        codes = np.zeros(n, dtype=np.int64)
        no_devices = None
        if state.devices_limited:  # kubelet's count of free nvidia.com/gpu devices on the node
            no_devices = state.gpu_dev_free < k
            usable = usable & ~no_devices[:, None]
        if mm is not None:
            usable = usable & mm[state.gpu_model]
            model_ok = usable.sum(axis=1) >= k
            codes[~model_ok] = 3
        if r.gpu_milli >= GPU_MILLI:
            e = usable & (state.gpu_free_milli >= GPU_MILLI) & (state.gpu_mem_free == state.gpu_mem_cap)
            if state.slots_limited:
                e &= state.gpu_slots_free > 0
            ok = e.sum(axis=1) >= k  # too few devices: code 0, kube-scheduler's "Insufficient nvidia.com/gpu"
            return FilterResult(ok, self.REASONS, codes)
        if state.slots_limited:
            slotted = usable & (state.gpu_slots_free > 0)
            share0 = usable & (state.gpu_free_milli >= r.gpu_milli)
            if r.gpu_memory_mib:
                share0 &= state.gpu_mem_free >= r.gpu_memory_mib
            # the share would fit by milli/memory but every such GPU's kubelet devices are taken
            no_slot = (share0.sum(axis=1) >= k) & ((share0 & slotted).sum(axis=1) < k) & (codes != 3)
            usable = slotted
        else:
            no_slot = None
        share = usable & (state.gpu_free_milli >= r.gpu_milli)
        share_ok = share.sum(axis=1) >= k
        if r.gpu_memory_mib:
            e = share & (state.gpu_mem_free >= r.gpu_memory_mib)
            ok = e.sum(axis=1) >= k
            codes = np.where(codes == 3, 3, np.where(share_ok, 2, 1))
        else:
            ok = share_ok
            codes = np.where(codes == 3, 3, 1)
        if no_slot is not None:
            codes = np.where(no_slot & ~ok, 5, codes)
        if no_devices is not None:
            codes = np.where(no_devices & ~ok & (codes != 3), 5, codes)
        return FilterResult(ok, self.REASONS, codes)


DEFAULT_FILTERS = ("NodeUnschedulable", "NodeAffinity", "TaintToleration", "NodeResourcesFit", "NodePorts",
                   "VolumeBinding", "NodeVolumeLimits", "InterPodAffinity", "PodTopologySpread", "GpuFit")
