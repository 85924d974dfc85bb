"""``gpufleet scheduler``: the secondary scheduler process.

Threads: one watch per kind (nodes, pods) feeding a queue, with reconnect and
a full relist on 410 Gone; a small HTTP server for ``/metrics``, ``/healthz``
and ``/readyz``; the main thread applies events and runs scheduling cycles
while it holds the leader lease.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("gpufleet.scheduler")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--scheduler-name", default="gpufleet", help="schedule pods whose spec.schedulerName is this (default gpufleet)")
    p.add_argument("--policy", default="default", help="policy profile name (default: default)")
    p.add_argument("--config", help="scheduler config YAML with a profile (overrides --policy)")
    p.add_argument("--metrics-addr", default="0.0.0.0:10251", help="address for /metrics, /healthz, /readyz")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lease-name", default="gpufleet-scheduler")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "kube-system"))
    p.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()))


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.attempts = Counter("gpufleet_schedule_attempts_total", "Scheduling attempts by result", ["result"], registry=self.registry)
        self.latency = Histogram("gpufleet_scheduling_attempt_duration_seconds", "One scheduling attempt",
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1), registry=self.registry)
        self.e2e = Histogram("gpufleet_pod_scheduling_duration_seconds", "First seen to bound", registry=self.registry,
                             buckets=(0.01, 0.1, 0.5, 1, 5, 15, 60, 300, 1800))
        self.pending = Gauge("gpufleet_pending_pods", "Pods waiting for gpufleet", registry=self.registry)
        self.binds = Counter("gpufleet_binds_total", "Pods bound", registry=self.registry)
        self.leader = Gauge("gpufleet_leader", "1 while this replica holds the lease", registry=self.registry)


def serve_http(addr: str, metrics: Metrics, ready: threading.Event) -> ThreadingHTTPServer:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/metrics":
                body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
            elif self.path == "/healthz":
                body, ctype, code = b"ok", "text/plain", 200
            elif self.path == "/readyz":
                ok = ready.is_set()
                body, ctype, code = (b"ok" if ok else b"not synced"), "text/plain", 200 if ok else 503
            else:
                body, ctype, code = b"not found", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):  # quiet
            pass

    srv = ThreadingHTTPServer((host, int(port)), H)
    threading.Thread(target=srv.serve_forever, daemon=True, name="http").start()
    return srv


def watcher(api, kind: str, loop_rv: dict, q: "queue.Queue", stop: threading.Event) -> None:
    from .api import Gone

    delay = 1.0
    while not stop.is_set():
        try:
            for type_, obj in api.watch(kind, loop_rv[kind], timeout_s=60):
                q.put((kind, type_, obj))
                if stop.is_set():
                    return
            delay = 1.0
        except Gone:
            q.put(("relist", kind, {}))
            time.sleep(0.5)
        except Exception as exc:  # lost connection: back off and reconnect
            log.warning("%s watch failed: %s; reconnecting in %.0fs", kind, exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 30.0)


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from ..policies import build_profile
    from .api import KubernetesApi
    from .leader import KubernetesLeaseStore, LeaseElector
    from .loop import SchedulerLoop

    try:
        if args.config:
            from ..engine.config import load_config
            from ..policies import registry

            profile = next(iter(load_config(args.config, registry()).values()))
        else:
            profile = build_profile(args.policy)
    except (ConfigError, KeyError) as exc:
        log.error("bad scheduler configuration: %s", exc)
        print(f"gpufleet scheduler: {exc}")
        return 2
    api = KubernetesApi(args.kubeconfig, args.context)
    metrics = Metrics()
    ready = threading.Event()
    serve_http(args.metrics_addr, metrics, ready)
    loop = SchedulerLoop(api, profile, scheduler_name=args.scheduler_name,
                         on_attempt=lambda r, s: (metrics.attempts.labels(r).inc(), metrics.latency.observe(s)))
    elector = LeaseElector(KubernetesLeaseStore(api.api, args.lease_name, args.lease_namespace), args.identity) if args.leader_elect else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    q: queue.Queue = queue.Queue()
    loop.resync()
    ready.set()
    for kind in ("node", "pod"):
        threading.Thread(target=watcher, args=(api, kind, loop.rv, q, stop), daemon=True, name=f"watch-{kind}").start()
    next_renew = 0.0
    binds_seen = 0
    while not stop.is_set():
        if elector and time.monotonic() >= next_renew:
            try:
                elector.step()
            except Exception as exc:
                log.warning("lease renewal failed: %s", exc)
                elector.is_leader = False
            next_renew = time.monotonic() + 5.0
            metrics.leader.set(1 if elector.is_leader else 0)
        leading = elector is None or elector.is_leader
        try:
            kind, type_, obj = q.get(timeout=0.2)
            while True:
                if kind == "relist":
                    loop.resync()
                else:
                    loop.handle(kind, type_, obj)
                kind, type_, obj = q.get_nowait()
        except queue.Empty:
            pass
        if leading:
            loop.schedule_due()
        metrics.pending.set(len(loop.pending))
        if loop.stats.binds > binds_seen:
            metrics.binds.inc(loop.stats.binds - binds_seen)
            binds_seen = loop.stats.binds
        for s in loop.stats.e2e_s:
            metrics.e2e.observe(s)
        loop.stats.e2e_s.clear()
    if elector:
        elector.release()
    return 0
