"""What the extender's /metrics shows: the scheduler's names where they mean the same (binds, e2e), the rest
under ``gpufleet_extender_``."""

from __future__ import annotations

import time
from collections.abc import Callable

from .reservations import RELEASE_REASONS, ExtenderLoop

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)


class ExtenderMetrics:
    """/metrics of the extender: the scheduler's names where they mean the same (binds, e2e), the rest
    under ``gpufleet_extender_``."""

    def __init__(self, loop: ExtenderLoop, heard: Callable[[], float] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("gpufleet_extender_requests_total", "Extender calls by verb and result", ["verb", "result"], registry=r)
        self.latency = Histogram("gpufleet_extender_request_duration_seconds", "Time to answer one extender call, by verb",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=r)
        self.binds = Counter("gpufleet_binds_total", "Pods bound (rate() gives binds/s)", registry=r)
        self.refusals = Counter("gpufleet_extender_refusals_total",
                                "Pods turned away: filter found no node (unschedulable, invalid, not_synced) or bind failed",
                                ["verb", "reason"], registry=r)
        self.e2e = Histogram("gpufleet_pod_scheduling_duration_seconds", "End to end: the pod's first filter to bound",
                             buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800), registry=r)
        self.bind_call = Histogram("gpufleet_extender_bind_api_duration_seconds", "The Binding API call alone",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.held = Gauge("gpufleet_extender_reservations", "Reservations held: chosen at filter, not bound yet", registry=r)
        self.held.set_function(lambda: len(loop.reservations))
        self.made = Counter("gpufleet_extender_reservations_made_total", "Reservations made at filter", registry=r)
        self.retries = Counter("gpufleet_extender_retries_requested_total",
                               "Pods kube-scheduler parked after failing to reach the extender, annotated so it retries them",
                               registry=r)
        self.released = Counter("gpufleet_extender_reservations_released_total",
                                "Reservations dropped without a bind, by reason", ["reason"], registry=r)
        self.age = Gauge("gpufleet_snapshot_age_seconds",
                         "Seconds since the snapshot last heard from the API server (list, watch event or bookmark)", registry=r)
        last = heard or (lambda: loop.last_heard)
        self.age.set_function(lambda: max(0.0, time.monotonic() - last()))
        for verb, results in (("filter", ("fit", "unschedulable", "passthrough", "invalid", "not_synced", "error")),
                              ("prioritize", ("ok", "error")), ("bind", ("bound", "refused", "error"))):
            for res in results:
                self.requests.labels(verb, res)
            self.latency.labels(verb)
        for reason in RELEASE_REASONS:
            self.released.labels(reason)
        self.refusals.labels("filter", "unschedulable")
        self.refusals.labels("bind", "failed")

    def observe(self, verb: str, result: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.requests.labels(verb, result).inc()
        self.latency.labels(verb).observe(dt)
        return dt
