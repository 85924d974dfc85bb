"""A pod's ResourceClaims as the engine sees them, resolved by the adapter.

The adapter (live cache, simulator) finds each of ``spec.resourceClaims``: a named claim, or the claim
the resourceclaim controller created from a template (named in ``status.resourceClaimStatuses``, owned
by the pod).  What it cannot find yet is a ``problem``: kube-scheduler keeps such a pod out of the
scheduling queue (PreEnqueue) until the claim exists; gpufleet keeps it pending with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..model import PodRequest, request_copy
from .objects import ResourceClaim

if TYPE_CHECKING:
    from .extended import ExtendedClaim


@dataclass(frozen=True)
class PodClaim:
    name: str  # the pod's name for it (spec.resourceClaims[].name)
    claim: ResourceClaim | None
    problem: str = ""  # why it cannot be used yet ("waiting for ResourceClaim ns/x from template t")


@dataclass(frozen=True)
class PodClaims:
    pod_uid: str
    claims: tuple[PodClaim, ...]
    extended: ExtendedClaim | None = None  # DRA-backed extended resources (nvidia.com/gpu on a DRA node), extended.py

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.claim.key for c in self.claims if c.claim is not None)

    def keys_on(self, dra_way: bool) -> tuple[str, ...]:
        """The claims the pod uses on a node: its own, and its extended-resource claim where DRA serves those."""
        return self.keys + ((self.extended.key,) if self.extended is not None and dra_way else ())

    def on_node(self, state, i: int) -> bool:
        """Whether DRA holds the pod's devices on node ``i`` (else a device plugin's GPUs, as for any pod)."""
        if any(c.claim is not None for c in self.claims) or self.extended is None:
            return True
        from .extended import dra_way

        return bool(dra_way(state, self.extended)[0][i])


_REQUEST_FIELDS = frozenset(f.name for f in fields(PodRequest))


def request_with(r: PodRequest, **changes: Any) -> PodRequest:
    """``dataclasses.replace(r, **changes)`` without running ``__init__`` over PodRequest's forty fields (a fifth of
    what resolving a DRA pod cost): PodRequest is a frozen dataclass without ``__post_init__``, so the copy is the
    same object ``replace`` makes."""
    bad = changes.keys() - _REQUEST_FIELDS
    if bad:
        raise TypeError(f"PodRequest has no field(s) {sorted(bad)}")
    return request_copy(r, **changes)
