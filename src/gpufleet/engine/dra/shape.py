"""What a pod's unallocated claims ask for, in the GPU fields every placement policy reads.

Why: the default policy, FGD and best fit judge a placement by ``PodRequest.gpu_count``,
``gpu_milli``, ``gpu_memory_mib``, ``mig_profile`` and ``gpu_models_allow``; queues count GPU demand
from the same fields.  For a pod that asks by ResourceClaim (``PodRequest.dra``) they must describe
what its claims would take, or DRA pods would be placed (and counted) as CPU pods.  The simulator
writes them from the trace; a live pod's come from here: each request's candidate devices (its class's
and its own selectors, on the catalog's device table) decide what kind of GPU demand it is:

* devices that are whole GPUs of the snapshot, no capacity requested: ``count`` whole GPUs;
* a capacity request on a device that takes several claims (consumable capacity): one share of
  ``gpuMilli`` and ``memory`` (as the allocator would consume them);
* MIG devices of one profile: ``count`` instances of it;
* the models a request's candidates are narrower than the cluster's: ``gpu_models_allow``.

Requests whose candidates are not GPUs (NICs, ...) add nothing: DynamicResources alone decides them.
Claims already allocated (shared by a pod placed before) take nothing more.  A pod mixing several
kinds gets the whole GPUs if it asks for any, else its share or MIG slice; DynamicResources still
allocates every request exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..gpu_models import mig_profile_memory_mib
from ..model import GPU_MILLI
from .allocator import AllocationError, Allocator
from .objects import ExactRequest, ResourceClaim

if TYPE_CHECKING:
    from ..state import ClusterState


@dataclass(frozen=True)
class GpuShape:
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    gpu_models_allow: frozenset[str] | None = None


def claims_gpu_shape(claims: Sequence[ResourceClaim], state: "ClusterState") -> GpuShape:
    """The GPU demand of ``claims`` (the pod's claims that still need an allocation) on ``state``."""
    if state.dra is None or not claims:
        return GpuShape()
    cat = state.dra.catalog
    table = cat.table(state)
    whole = 0
    share: tuple[int, int] | None = None
    mig: tuple[str, int] | None = None
    models: set[str] | None = None
    for c in claims:
        got = table.need_cache.get(("shape-of", id(c.spec)))  # claims of one template share their spec object
        if got is not None and got[0] is c.spec:
            parts = got[1]
        else:  # what each request asks depends on the spec and the devices only: once per spec and device table
            key = ("shape", c.spec)
            parts = table.need_cache.get(key)
            if parts is None:
                parts = table.need_cache[key] = _request_parts(c, state, table)
            table.need_cache[("shape-of", id(c.spec))] = (c.spec, parts)
        for kind, count, extra, names in parts:
            if names is not None:
                models = set(names) if models is None else models & names
            if kind == "whole":
                whole += count
            elif kind == "share" and share is None:
                share = extra
            elif kind == "mig" and mig is None:
                mig = (extra, count)
    allow = frozenset(models) if models is not None else None
    if whole:
        return GpuShape(whole, GPU_MILLI, 0, None, allow)
    if share is not None:
        return GpuShape(1, share[0], share[1], None, allow)
    if mig is not None:
        return GpuShape(mig[1], 0, mig_profile_memory_mib(mig[0]) or 0, mig[0], allow)  # as parse_pod models MIG
    return GpuShape()


def _request_parts(c: ResourceClaim, state: "ClusterState", table) -> tuple:
    """Per request of a claim: (whole | share | mig, count, share (milli, MiB) or MIG profile, models or None)."""
    from .plugin import _gpu_need  # one definition of what a request takes of a GPU device

    assert state.dra is not None
    cat = state.dra.catalog
    alloc = Allocator(cat.inventory, cat.classes, state.dra.allocated, cat.selectors)
    out = []
    for req in c.spec.requests:
        alts = req.alternatives()
        if not alts:
            continue
        spec: ExactRequest = alts[0]  # firstAvailable: the preferred subrequest
        cls = cat.classes.get(spec.device_class_name)
        if cls is None or spec.admin_access:
            continue
        try:
            mask, _ = cat.match_mask(table, cls, spec, c, alloc)
        except AllocationError:
            continue
        k = np.flatnonzero(mask & (table.gpu >= 0) & (table.node >= 0))
        if k.size == 0:
            continue
        ids = np.unique(state.gpu_model[table.node[k], table.gpu[k]])
        names = frozenset(state.model_names[int(i)] for i in ids if i >= 0)
        narrower = names if names and names != frozenset(state.model_names) else None
        count = spec.count if spec.allocation_mode == "ExactCount" else 1
        if table.is_mig[k].all():
            profiles = {table.mig[int(i)][0] for i in k.tolist()}
            if len(profiles) == 1:
                out.append(("mig", count, next(iter(profiles)), narrower))
            continue
        need = _gpu_need(table.refs[int(k[0])], spec) if spec.capacity_requests else None
        if need is None or need[0] >= GPU_MILLI:
            out.append(("whole", count, None, narrower))
        else:
            out.append(("share", 1, (need[0], need[1]), narrower))
    return tuple(out)


__all__ = ["GpuShape", "claims_gpu_shape"]
