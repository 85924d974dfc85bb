# mypy: disable-error-code="misc"
# (methods take ``self: SchedulerLoop``, the class that mixes them in; mypy wants a supertype there)
"""WaitForFirstConsumer volume binding, as kube-scheduler's VolumeBinding PreBind: before the
pod's Binding goes out, its unbound claims get their PV (``claimRef``) or a selected node to
provision on; the pod is bound once the claims are, or fails (and the plan is reverted) after
``volume_bind_timeout_s``.

Why a module of its own: it is a step of the bind pipeline with its own state (claims waited
for, PVs assumed) and its own API writes.  A mixin of ``SchedulerLoop`` because it hands off to
the binder (``Binder.send`` / ``Binder.done``) and reads the snapshot's volume catalog.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..engine.model import Assignment
from ..engine.volumes import (
    SELECTED_NODE,
    matches_node,
    plan_bindings,
)

if TYPE_CHECKING:
    from .loop import SchedulerLoop

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


class VolumeBindingMixin:
    """Methods of ``SchedulerLoop``; see the module docstring."""

    # --- volume binding (WaitForFirstConsumer) -----------------------------------------------
    def _bind_volumes(self: SchedulerLoop, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> bool:
        """Start binding the pod's unbound WaitForFirstConsumer claims for its node, as kube-scheduler's
        VolumeBinding PreBind does: a chosen PV gets the claim as ``claimRef`` (the PV controller completes
        the bind), a claim to provision gets ``volume.kubernetes.io/selected-node``.  True when the pod
        must wait (or has failed) instead of being bound now."""
        t = a.terms
        cat = self.state.volumes
        if t is None or not t.claims or cat is None:
            return False
        node = self.state.nodes[self.state.index[a.node]]
        plan = plan_bindings(cat, t.namespace, t.claims, node)
        if plan is not None and not plan:
            return False
        if plan is None:
            self.binder.done(key, "failed", f"no volume can be bound for its claims on {a.node} any more", None, annotations)
            return True
        try:
            for claim, pv in plan:
                ck = f"{claim.namespace}/{claim.name}"
                if pv:
                    ref = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": claim.namespace, "name": claim.name}
                    if claim.uid:
                        ref["uid"] = claim.uid
                    self.api.patch_object("pv", "", pv, {"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
                                                          "spec": {"claimRef": ref}})
                    self._assumed_pvs[pv] = ck
                    cat.assumed[pv] = ck
                else:
                    self.api.patch_object("pvc", claim.namespace, claim.name,
                                          {"metadata": {"annotations": {SELECTED_NODE: a.node}}})
        except Exception as exc:  # noqa: BLE001 - any API failure sends the pod back to the queue
            self.binder.done(key, "failed", f"binding its volumes failed: {exc}", None, annotations)
            return True
        claims = [f"{c.namespace}/{c.name}" for c, _ in plan]
        self._volume_plans[key] = [(f"{c.namespace}/{c.name}", pv) for c, pv in plan]
        self._volume_wait[key] = (claims, self.clock() + self.volume_bind_timeout_s, annotations)
        log.info("pod %s waits for volume binding on %s: %s", key, a.node,
                 ", ".join(f"{c.name} -> {pv or 'provisioned'}" for c, pv in plan))
        return True

    def _release_assumed(self: SchedulerLoop, claims: list[str]) -> None:
        for pv, ck in list(self._assumed_pvs.items()):
            if ck in claims:
                del self._assumed_pvs[pv]
        if self.state.volumes is not None:
            self.state.volumes.assumed = dict(self._assumed_pvs)

    def _revert_volume_plan(self: SchedulerLoop, key: str) -> None:
        """A volume bind that failed or timed out: take back the claimRef / selected-node of claims still unbound."""
        cat = self.state.volumes
        for ck, pv in self._volume_plans.pop(key, []):
            claim = cat.claims.get(ck) if cat is not None else None
            if claim is None or claim.volume_name:
                continue
            try:
                if pv:
                    self.api.patch_object("pv", "", pv, {"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": None}},
                                                          "spec": {"claimRef": None}})
                else:
                    self.api.patch_object("pvc", claim.namespace, claim.name, {"metadata": {"annotations": {SELECTED_NODE: None}}})
            except Exception as exc:  # noqa: BLE001 - best effort, as kube-scheduler's revert
                log.info("could not revert volume binding of %s for %s: %s", ck, key, exc)

    def _check_volume_waits(self: SchedulerLoop) -> None:
        """Bind pods whose claims are now bound (to volumes usable on their node); fail those past the timeout."""
        if not self._volume_wait:
            return
        cat = self.state.volumes
        now = self.clock()
        for key, (claims, deadline, bind_ann) in list(self._volume_wait.items()):
            entry = self.binder.binding.get(key)
            if entry is None or cat is None:
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._volume_plans.pop(key, None)
                continue
            pod, a, _ = entry
            infos = [cat.claims.get(c) for c in claims]
            pvs = [cat.volumes.get(i.volume_name) if i is not None and i.volume_name else None for i in infos]
            if all(pv is not None for pv in pvs):
                node = self.state.nodes[self.state.index[a.node]]
                bad = next((pv for pv in pvs if pv is not None and not matches_node(pv.node_affinity, node)), None)
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._volume_plans.pop(key, None)
                if bad is not None:
                    self.binder.done(key, "failed", f"volume {bad.name} was bound but cannot be used on {a.node}", None, bind_ann)
                else:
                    self.binder.send(key, pod, a, bind_ann)
            elif now >= deadline:
                self._volume_wait.pop(key, None)
                self._release_assumed(claims)
                self._revert_volume_plan(key)
                self.binder.done(key, "failed", f"timed out after {self.volume_bind_timeout_s:.0f} s waiting for "
                                f"PersistentVolumeClaims {', '.join(claims)} to be bound", None, bind_ann)
