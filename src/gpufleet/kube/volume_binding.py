"""WaitForFirstConsumer volume binding, as kube-scheduler's VolumeBinding PreBind: before the
pod's Binding goes out, its unbound claims get their PV (``claimRef``) or a selected node to
provision on; the pod is bound once the claims are, or fails (and the plan is reverted) after
``volume_bind_timeout_s``.

Why a module of its own: it is a step of the bind pipeline with its own state and its own API
writes.  ``VolumeBinder`` owns the pods waiting for their claims (claims, deadline, Binding
annotations), the PVs it assumed (PV -> claim it set the claimRef for, until the claim is bound;
the cache copies them into the snapshot's volume catalog) and the plans to revert on failure.  It
reads the snapshot's volume catalog (``ClusterView``) and hands off to the ``Binder`` (``send`` /
``done``), whose binds in flight say which waits are still wanted.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..engine.model import Assignment
from ..engine.volumes import (
    SELECTED_NODE,
    matches_node,
    plan_bindings,
)
from .api import SchedulerApi
from .binder import Binder
from .view import ClusterView

log = logging.getLogger("gpufleet.kube.loop")  # the loop's logger, as before the split


class VolumeBinder:
    """WaitForFirstConsumer claims before the Binding; see the module docstring.  Runs on the loop's thread."""

    def __init__(self, api: SchedulerApi, cache: ClusterView, binder: Binder, clock: Callable[[], float],
                 timeout_s: float = 600.0) -> None:
        self.api = api
        self.cache = cache
        self.binder = binder
        self.clock = clock
        self.timeout_s = timeout_s
        self._wait: dict[str, tuple[list[str], float, dict[str, str]]] = {}  # pod -> claims, deadline, annotations
        self._assumed_pvs: dict[str, str] = {}  # PV -> claim we set its claimRef for, until the claim is bound
        self._plans: dict[str, list[tuple[str, str]]] = {}  # pod -> (claim, PV or "" = provision) it asked for

    def assumed_pvs(self) -> dict[str, str]:
        """PV -> claim whose claimRef we set and the PV controller has not completed yet (a copy)."""
        return dict(self._assumed_pvs)

    def deadlines(self) -> list[float]:
        """When each pod waiting for its claims times out."""
        return [w[1] for w in self._wait.values()]

    def forget(self, key: str) -> None:
        """The pod was deleted: stop waiting for its claims and revert what was asked for it."""
        w = self._wait.pop(key, None)
        if w is not None:  # deleted while its volumes were being bound
            self._release_assumed(w[0])
            self._revert_plan(key)

    def prebind(self, key: str, pod: dict, a: Assignment, annotations: dict[str, str]) -> bool:
        """Start binding the pod's unbound WaitForFirstConsumer claims for its node, as kube-scheduler's
        VolumeBinding PreBind does: a chosen PV gets the claim as ``claimRef`` (the PV controller completes
        the bind), a claim to provision gets ``volume.kubernetes.io/selected-node``.  True when the pod
        must wait (or has failed) instead of being bound now."""
        t = a.terms
        cat = self.cache.state.volumes
        if t is None or not t.claims or cat is None:
            return False
        node = self.cache.state.nodes[self.cache.state.index[a.node]]
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
        self._plans[key] = [(f"{c.namespace}/{c.name}", pv) for c, pv in plan]
        self._wait[key] = (claims, self.clock() + self.timeout_s, annotations)
        log.info("pod %s waits for volume binding on %s: %s", key, a.node,
                 ", ".join(f"{c.name} -> {pv or 'provisioned'}" for c, pv in plan))
        return True

    def _release_assumed(self, claims: list[str]) -> None:
        for pv, ck in list(self._assumed_pvs.items()):
            if ck in claims:
                del self._assumed_pvs[pv]
        if self.cache.state.volumes is not None:
            self.cache.state.volumes.assumed = dict(self._assumed_pvs)

    def _revert_plan(self, key: str) -> None:
        """A volume bind that failed or timed out: take back the claimRef / selected-node of claims still unbound."""
        cat = self.cache.state.volumes
        for ck, pv in self._plans.pop(key, []):
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

    def check_waits(self) -> None:
        """Bind pods whose claims are now bound (to volumes usable on their node); fail those past the timeout."""
        if not self._wait:
            return
        cat = self.cache.state.volumes
        now = self.clock()
        for key, (claims, deadline, bind_ann) in list(self._wait.items()):
            entry = self.binder.binding.get(key)
            if entry is None or cat is None:
                self._wait.pop(key, None)
                self._release_assumed(claims)
                self._plans.pop(key, None)
                continue
            pod, a, _ = entry
            infos = [cat.claims.get(c) for c in claims]
            pvs = [cat.volumes.get(i.volume_name) if i is not None and i.volume_name else None for i in infos]
            if all(pv is not None for pv in pvs):
                node = self.cache.state.nodes[self.cache.state.index[a.node]]
                bad = next((pv for pv in pvs if pv is not None and not matches_node(pv.node_affinity, node)), None)
                self._wait.pop(key, None)
                self._release_assumed(claims)
                self._plans.pop(key, None)
                if bad is not None:
                    self.binder.done(key, "failed", f"volume {bad.name} was bound but cannot be used on {a.node}", None, bind_ann)
                else:
                    self.binder.send(key, pod, a, bind_ann)
            elif now >= deadline:
                self._wait.pop(key, None)
                self._release_assumed(claims)
                self._revert_plan(key)
                self.binder.done(key, "failed", f"timed out after {self.timeout_s:.0f} s waiting for "
                                f"PersistentVolumeClaims {', '.join(claims)} to be bound", None, bind_ann)
