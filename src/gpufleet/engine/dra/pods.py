"""A pod's ResourceClaims as the engine sees them, resolved by the adapter.

The adapter (live cache, simulator) finds each of ``spec.resourceClaims``: a named claim, or the claim
the resourceclaim controller created from a template (named in ``status.resourceClaimStatuses``, owned
by the pod).  What it cannot find yet is a ``problem``: kube-scheduler keeps such a pod out of the
scheduling queue (PreEnqueue) until the claim exists; gpufleet keeps it pending with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from .objects import ResourceClaim


@dataclass(frozen=True)
class PodClaim:
    name: str  # the pod's name for it (spec.resourceClaims[].name)
    claim: ResourceClaim | None
    problem: str = ""  # why it cannot be used yet ("waiting for ResourceClaim ns/x from template t")


@dataclass(frozen=True)
class PodClaims:
    pod_uid: str
    claims: tuple[PodClaim, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.claim.key for c in self.claims if c.claim is not None)
