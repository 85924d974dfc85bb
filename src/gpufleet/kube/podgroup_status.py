"""The ``PodGroupInitiallyScheduled`` condition of Kubernetes' own PodGroups, as kube-scheduler 1.37 writes it.

Why: ``kubectl get podgroups`` and workload controllers read a scheduling.k8s.io PodGroup's status to learn
whether its gang was placed; a gang gpufleet places must say so the same way.  After a gang round the
condition is ``True`` (reason ``Scheduled``) once the gang's minimum is placed, else ``False`` (reason
``Unschedulable``, the engine's message); once ``True`` it never goes back (kube-scheduler's rule: later
members do not regress it).  A gang still waiting for its members gets nothing, as kube-scheduler's
PreEnqueue writes nothing.  Only conditions that change are written, with a merge patch of
``status.conditions`` that keeps the group's other conditions (``DisruptionTarget``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from ..engine.gang import SCHEDULING_API, GangResult
from ..engine.status import Code
from .api import SchedulerApi
from .policy_objects import PolicyObjects

log = logging.getLogger(__name__)

CONDITION = "PodGroupInitiallyScheduled"
KIND = "schedpodgroup"
MAX_MESSAGE = 32768  # metav1.Condition's limit


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def report(api: SchedulerApi, objects: PolicyObjects, res: GangResult) -> bool:
    """Write the condition a gang round's result means for a scheduling.k8s.io PodGroup; True if written."""
    g = objects.groups.get(res.group)
    if g is None or g.api != SCHEDULING_API:
        return False
    if res.ok and res.placed:
        status, reason, message = "True", "Scheduled", f"{len(res.placed)} pod(s) of the gang placed"
    elif res.status.code in (Code.UNSCHEDULABLE, Code.UNRESOLVABLE):
        status, reason, message = "False", "Unschedulable", res.status.message
    else:
        return False  # waiting for members (or a hold): nothing to say yet
    obj = objects.raw[KIND].get(res.group) or {}
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
    old = next((c for c in conds if c.get("type") == CONDITION), None)
    if old is not None and (old.get("status") == "True" or (old.get("status"), old.get("reason"), old.get("message")) == (status, reason, message)):
        return False
    new = {"type": CONDITION, "status": status, "reason": reason, "message": message[:MAX_MESSAGE],
           "lastTransitionTime": old["lastTransitionTime"] if old is not None and old.get("status") == status and old.get("lastTransitionTime") else _now(),
           "observedGeneration": int((obj.get("metadata") or {}).get("generation") or 0)}
    body = {"status": {"conditions": [c for c in conds if c.get("type") != CONDITION] + [new]}}
    try:
        api.patch_object(KIND, g.namespace, g.name, body, subresource="status")
    except Exception as exc:  # a status write must not stop scheduling
        log.warning("PodGroup %s: writing its %s condition failed: %s", res.group, CONDITION, exc)
        return False
    return True


__all__ = ["CONDITION", "report"]
