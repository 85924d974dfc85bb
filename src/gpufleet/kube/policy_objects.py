"""The cluster objects that shape scheduling besides nodes and pods: namespaces,
Queues, PodGroups (gpufleet.io's and scheduling.k8s.io's) and PodDisruptionBudgets, kept from list+watch.

They only become engine inputs here (``Queue``, ``NamespaceQueues``,
``PodGroup``, ``PodDisruptionBudget``), so the loop stays a thin adapter.  A
malformed object is reported once, by name and field, and left out; it never
stops the others.  A PodDisruptionBudget that cannot be read is not left out:
it protects every pod of its namespace until it is fixed (leaving it out would
leave its pods unprotected).  A kind the API does not serve (the CRDs not
installed) is simply empty: the scheduler then behaves as if there were no
queues or groups.
"""

from __future__ import annotations

import logging
from typing import Iterable

from ..engine.errors import ConfigError
from ..engine.gang import PodGroup
from ..engine.disruption import PodDisruptionBudget
from ..engine.queues import NamespaceQueues, Queue, load_queues
from .api import POLICY_KINDS, object_key

log = logging.getLogger(__name__)


class PolicyObjects:
    def __init__(self) -> None:
        self.raw: dict[str, dict[str, dict]] = {k: {} for k in POLICY_KINDS}
        self.unserved: set[str] = set()
        self.errors: dict[str, str] = {}  # object -> why it is left out
        self._queues: list[Queue] | None = None
        self._ns: NamespaceQueues | None = None
        self._groups: dict[str, PodGroup] | None = None
        self._pdbs: list[PodDisruptionBudget] | None = None

    # --- updates -------------------------------------------------------------------------
    def handle(self, kind: str, type_: str, obj: dict) -> None:
        key = object_key(obj)
        if type_ == "DELETED":
            self.raw[kind].pop(key, None)
        else:
            self.raw[kind][key] = obj
        self._dirty(kind)

    def replace(self, kind: str, items: Iterable[dict]) -> None:
        self.raw[kind] = {object_key(o): o for o in items}
        self._dirty(kind)

    def _dirty(self, kind: str) -> None:
        if kind == "queue":
            self._queues = None
            self._ns = None
        elif kind == "namespace":
            self._ns = None
        elif kind in ("podgroup", "schedpodgroup"):
            self._groups = None
        elif kind == "pdb":
            self._pdbs = None

    def report(self, what: str, why: str) -> None:
        """Log why an object is left out, once per distinct reason; kept in ``errors``."""
        if self.errors.get(what) != why:
            log.warning("leaving %s out: %s", what, why)
        self.errors[what] = why

    # --- engine inputs ---------------------------------------------------------------------
    @property
    def queues(self) -> list[Queue]:
        if self._queues is None:
            qs, errors = load_queues(self.raw["queue"].values())
            for e in errors:
                self.report(e.split(":", 1)[0], e)
            self._queues = qs
        return self._queues

    @property
    def namespace_queues(self) -> NamespaceQueues:
        if self._ns is None:
            self._ns = NamespaceQueues(self.queues, self.raw["namespace"].values())
        return self._ns

    @property
    def groups(self) -> dict[str, PodGroup]:
        """PodGroup objects by namespace/name: gpufleet.io's, and scheduling.k8s.io's (Kubernetes' own gangs,
        which win when both kinds name the same group: pods name those in their spec)."""
        if self._groups is None:
            out: dict[str, PodGroup] = {}
            for kind, parse in (("podgroup", PodGroup.from_json), ("schedpodgroup", PodGroup.from_scheduling_json)):
                for k, o in self.raw[kind].items():
                    try:
                        g = parse(o)
                    except ConfigError as exc:
                        self.report(f"PodGroup {k}", str(exc))
                        continue
                    if g.key in out:
                        self.report(f"PodGroup {k} ({out[g.key].api})", f"a {g.api} PodGroup has the same name; "
                                    f"pods naming {g.key} in spec.schedulingGroup use that one")
                    out[g.key] = g
            self._groups = out
        return self._groups

    @property
    def pdbs(self) -> list[PodDisruptionBudget]:
        """Every PodDisruptionBudget; one that cannot be read protects its whole namespace (fail closed)."""
        if self._pdbs is None:
            out = []
            for k, o in self.raw["pdb"].items():
                try:
                    out.append(PodDisruptionBudget.from_json(o))
                except ConfigError as exc:
                    self.report(f"PodDisruptionBudget {k}", f"{exc}; until it is fixed it protects every pod of its namespace")
                    out.append(PodDisruptionBudget.fail_closed(o, str(exc)))
            self._pdbs = out
        return self._pdbs


__all__ = ["PolicyObjects"]
