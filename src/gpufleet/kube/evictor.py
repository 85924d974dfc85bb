"""Evictions for preemption and reclaim: one eviction per victim, tracked until the watch shows it gone.

Victims go through the Eviction API (``pods/eviction``), not a plain DELETE:
the API server then checks every PodDisruptionBudget atomically with the
eviction (it decrements ``status.disruptionsAllowed`` as it admits one), so two
plans made before the disruption controller caught up, another eviction
(``kubectl drain``, the reclaim tool) racing ours, or a stale snapshot can never
take a budget below its minimum.  The planners already leave protected pods out
(``engine.disruption.Budgets``); a refusal (429) means the snapshot was behind:
nothing was deleted, the victim is not in flight, and the pod plans again.
kube-scheduler deletes its victims and may break a budget when nothing else
fits; gpufleet never does.

Why: a victim stays in the snapshot until the watch reports it deleted (its
room is not free before that), so every plan made in the meantime -- one per
pending pod of a reclaiming queue, a gang's plan, ``gpufleet explain`` -- still
sees it and would choose it again.  Deleting it twice is harmless to the
cluster but not to what the scheduler reports: each repeated DELETE used to
count as an eviction, with its own ``Preempted`` event and nomination.

So an eviction is *in flight* from its request until the watch shows the pod
gone (``forget``), or until ``timeout_s`` (a lost delete: the pod may then be
chosen again); pods already terminating are on their way out too.  ``leaving``
is what every planner excludes.  Only an eviction the API admitted counts:
one ``Preempted`` event naming the pod it made room for, one count under its
kind; a 404 means the pod was already gone and is counted as such, silently.
This is kube-scheduler's split of responsibility: the cycle plans, this
carries out and remembers, the cache (the loop's snapshot) learns from the watch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engine.model import Assignment
from .api import EvictionRefused, NotFound, SchedulerApi

log = logging.getLogger(__name__)


class Evictions:
    def __init__(self, api: SchedulerApi, events: Any, stats: Any, clock: Callable[[], float],
                 grace_s: int | None = None, timeout_s: float | None = None) -> None:
        self.api = api
        self.events = events  # .send(pod, type, reason, message)
        self.stats = stats  # counters: preempted, reclaimed, already_gone
        self.clock = clock
        self.grace_s = grace_s
        # a graceful delete takes the pod's grace period (30 s unless set); then a minute more
        self.timeout_s = timeout_s if timeout_s is not None else 60.0 + (30.0 if grace_s is None else float(grace_s))
        self.in_flight: dict[str, float] = {}  # pod key -> until when it counts as leaving

    def forget(self, key: str) -> None:
        """The watch showed the pod gone (or terminal)."""
        self.in_flight.pop(key, None)

    def leaving(self, bound_pods: Mapping[str, dict]) -> set[str]:
        """Pods on their way out: evictions in flight (not timed out) and pods terminating anyway."""
        now = self.clock()
        for k in [k for k, until in self.in_flight.items() if until <= now]:
            log.warning("pod %s still there %.0f s after its eviction; it may be chosen again", k, self.timeout_s)
            del self.in_flight[k]
        out = set(self.in_flight)
        out.update(k for k, p in bound_pods.items() if (p.get("metadata") or {}).get("deletionTimestamp"))
        return out

    def evict(self, victims: Sequence[Assignment], bound_pods: Mapping[str, dict], reason: str, kind: str,
              for_: str) -> tuple[set[str], set[str]] | None:
        """Delete the victims through the API; None (nothing done) if any is not bound yet.

        Returns (evicted, already gone).  An evicted pod gets one ``Preempted`` event
        (``reason`` names ``for_``) and one count under ``kind``; a 404 counts as
        ``already_gone``; a refusal (a PodDisruptionBudget said no) counts as ``eviction_refused`` and
        leaves the pod where it is; a pod in flight is never evicted again; other errors are logged.
        """
        if any(v.pod_key not in bound_pods for v in victims):
            return None  # a victim is still being bound (or held by a gang): decide again next time
        evicted: set[str] = set()
        gone: set[str] = set()
        for v in victims:
            if v.pod_key in self.in_flight:
                continue  # planned around in-flight evictions; never evict twice
            p = bound_pods[v.pod_key]
            ns, name = v.pod_key.split("/", 1)
            try:
                self.api.evict_pod(ns, name, uid=(p.get("metadata") or {}).get("uid"), grace_period_s=self.grace_s)
            except EvictionRefused as exc:
                self.stats.eviction_refused += 1
                log.info("eviction of %s (to make room for %s) refused: %s", v.pod_key, for_, exc)
                continue
            except NotFound:
                gone.add(v.pod_key)
                self.stats.already_gone += 1
                self.in_flight[v.pod_key] = self.clock() + self.timeout_s  # the watch will say so
                continue
            except Exception as exc:  # noqa: BLE001 -- any API failure: log it, the pod plans again
                log.warning("could not delete %s to make room for %s: %s", v.pod_key, for_, exc)
                continue
            evicted.add(v.pod_key)
            self.in_flight[v.pod_key] = self.clock() + self.timeout_s
            self.events.send(p, "Normal", "Preempted", reason)
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        return evicted, gone


__all__ = ["Evictions"]
