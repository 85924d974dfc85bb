"""One reclaim round: read pods, PDBs and utilisation, decide, act (or only say, in dry run), count.

Dry run is the default: every decision is logged and counted exactly as it
would be applied, with ``mode="dry-run"``, and nothing is written to the
cluster.  With ``apply`` the warnings, clears and evictions go through
``ReclaimKube``; what the API server answers (evicted, blocked by a PDB, gone)
is what gets counted.  One bad pod or one failed call is logged and counted
as an error; the round goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..engine.errors import GpufleetError
from .kube_actions import ReclaimKube, rfc3339
from ..engine.disruption import PodDisruptionBudget
from .reclaim import Action, ReclaimConfig, decide, pod_info_from_json, summarize
from .sources import Series, SourceError

log = logging.getLogger("gpufleet.reclaim")


class UtilSource(Protocol):
    def series(self, start_s: float, end_s: float) -> Series: ...


class ReclaimMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.actions = Counter("gpufleet_reclaim_actions_total", "Reclaim decisions by namespace, action and mode (dry-run/applied)",
                               ["namespace", "action", "mode"], registry=r)
        self.outcomes = Counter("gpufleet_reclaim_outcomes_total", "What the API server answered to applied actions",
                                ["namespace", "outcome"], registry=r)
        self.gpu_hours = Counter("gpufleet_reclaim_gpu_hours_returned_total",
                                 "Idle GPU-hours of pods evicted (or that would be, in dry run)", ["namespace", "mode"], registry=r)
        self.gpus = Counter("gpufleet_reclaim_gpus_returned_total", "GPUs freed by evictions (or that would be, in dry run)",
                            ["namespace", "mode"], registry=r)
        self.idle_gpus = Gauge("gpufleet_reclaim_idle_gpus", "GPUs held by pods idle for their namespace's window, last round",
                               ["namespace"], registry=r)
        self.errors = Counter("gpufleet_reclaim_errors_total", "Objects skipped or calls failed", ["kind"], registry=r)
        self.rounds = Counter("gpufleet_reclaim_rounds_total", "Reclaim rounds", ["result"], registry=r)


@dataclass
class RoundResult:
    actions: list[Action]
    outcomes: dict[str, str] = field(default_factory=dict)  # pod -> what happened (applied mode)
    summary: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # objects that could not be read

    def summary_line(self, applied: bool) -> str:
        s = self.summary
        mode = "applied" if applied else "dry run (nothing changed; --apply to act)"
        return (f"reclaim {mode}: {int(s['warn'])} warned, {int(s['evict'])} evicted ({s['gpus_evicted']:g} GPUs), "
                f"{int(s['report'])} reported, {int(s['clear'])} cleared, {int(s['protect'])} protected, "
                f"{len(self.skipped)} skipped; GPU-hours returned {s['gpu_hours_returned']:.1f}, "
                f"idle GPU-hours flagged {s['gpu_hours_idle_flagged']:.1f}")


class Reclaimer:
    def __init__(self, kube: ReclaimKube, source: UtilSource, config: ReclaimConfig, apply: bool = False,
                 metrics: ReclaimMetrics | None = None, clock: Callable[[], float] | None = None,
                 out: Callable[[str], Any] = print) -> None:
        self.kube, self.source, self.config, self.apply = kube, source, config, apply
        self.metrics = metrics or ReclaimMetrics()
        self.clock, self.out = clock or (lambda: time.time()), out

    def run_once(self) -> RoundResult:
        now = self.clock()
        m = self.metrics
        if hasattr(self.source, "scrape"):
            self.source.scrape(now)
        try:
            util = self.source.series(now - self.config.lookback_s(), now)
        except SourceError:
            m.rounds.labels("source-error").inc()
            raise
        pods, skipped = [], []
        for raw in self.kube.list_running_pods():
            try:
                info = pod_info_from_json(raw)
            except GpufleetError as exc:
                skipped.append(str(exc))
                m.errors.labels("bad-pod").inc()
                log.warning("skipping pod: %s", exc)
                continue
            if info is not None:
                pods.append(info)
        pdbs = []
        for raw in self.kube.list_pdbs():
            try:
                pdbs.append(PodDisruptionBudget.from_json(raw))
            except GpufleetError as exc:  # fail closed: it protects every pod of its namespace
                skipped.append(str(exc))
                m.errors.labels("bad-pdb").inc()
                log.warning("unreadable PodDisruptionBudget protects its whole namespace: %s", exc)
                pdbs.append(PodDisruptionBudget.fail_closed(raw, str(exc)))
        actions = decide(now, pods, util, self.config, pdbs)
        res = RoundResult(actions, skipped=skipped)
        mode = "applied" if self.apply else "dry-run"
        idle_by_ns: dict[str, float] = {}
        for a in actions:
            if a.action in ("report", "warn", "evict") or (a.action == "protect" and a.idle_s > 0):
                idle_by_ns[a.namespace] = idle_by_ns.get(a.namespace, 0.0) + a.gpus
            log.info("reclaim %s %s %s: %s", mode, a.action, a.pod, a.reason)
            self.out(f"{a.action:<8} {a.pod:<48} {a.reason}")
            m.actions.labels(a.namespace, a.action, mode).inc()
            outcome = self._apply(now, a) if self.apply else None
            if outcome is not None:
                res.outcomes[a.pod] = outcome
                m.outcomes.labels(a.namespace, outcome).inc()
            if a.action == "evict" and outcome in (None, "evicted"):
                m.gpu_hours.labels(a.namespace, mode).inc(a.gpu_hours)
                m.gpus.labels(a.namespace, mode).inc(a.gpus)
        for ns in set(idle_by_ns) | {s.labels.get("namespace") for s in _gauge_samples(m.idle_gpus)}:
            if ns:
                m.idle_gpus.labels(ns).set(idle_by_ns.get(ns, 0.0))
        # what the API refused is not returned
        evicted = [a for a in actions if a.action == "evict" and res.outcomes.get(a.pod, "evicted") == "evicted"]
        res.summary = summarize([a for a in actions if a.action != "evict"] + evicted)
        res.summary["evict"] = len(evicted)
        m.rounds.labels("ok").inc()
        line = res.summary_line(self.apply)
        log.info(line)
        self.out(line)
        return res

    def _apply(self, now: float, a: Action) -> str | None:
        ns, name = a.pod.split("/", 1)
        try:
            if a.action == "warn":
                return self.kube.warn(ns, name, rfc3339(now), f"gpufleet: {a.reason}")
            if a.action == "clear":
                return self.kube.clear(ns, name, f"gpufleet: {a.reason}")
            if a.action == "evict":
                out = self.kube.evict(ns, name, f"gpufleet evicted this idle pod: {a.reason}")
                if out == "blocked":
                    self.out(f"{'blocked':<8} {a.pod:<48} the API server refused the eviction (PodDisruptionBudget)")
                return out
        except Exception as exc:  # one failed call must not stop the round
            self.metrics.errors.labels(f"{a.action}-failed").inc()
            log.warning("%s %s failed: %s", a.action, a.pod, exc)
            return "error"
        return None


def _gauge_samples(g: Gauge):
    for fam in g.collect():
        yield from fam.samples
