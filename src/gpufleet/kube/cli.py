"""``gpufleet scheduler``: the secondary scheduler process (see runner.py for its threads)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..argtypes import float_range, host_port, int_range

log = logging.getLogger("gpufleet.scheduler")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    from ..policies import policy_names_with_aliases

    p.add_argument("--policy", default="default",
                   help="policy profile name (default: default); one of " + ", ".join(policy_names_with_aliases()))
    p.add_argument("--config", help="scheduler config YAML with a 'profiles' list (overrides --policy)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--scheduler-name", default="gpufleet", help="schedule pods whose spec.schedulerName is this (default gpufleet)")
    p.add_argument("--metrics-addr", type=host_port, default="0.0.0.0:10251", help="HOST:PORT for /metrics, /healthz, /readyz")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="run only while holding a Lease, so replicas fail over (default on)")
    p.add_argument("--lease-name", default="gpufleet-scheduler", help="the Lease's name (default gpufleet-scheduler)")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "kube-system"),
                   help="the Lease's namespace (default: $POD_NAMESPACE, else kube-system)")
    p.add_argument("--lease-duration", type=int_range(3, 3600), default=8, metavar="S",
                   help="seconds a leader holds the Lease without renewing it, 3-3600 (default 8: a crashed leader is "
                        "replaced in about 10 s; renew deadline 2/3 of it, retry 1/7.5; docs/safety.md)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME", socket.gethostname()),
                   help="this replica's name in the Lease (default: $POD_NAME, else the host name)")
    p.add_argument("--bind-workers", type=int_range(1, 256), default=16, help="parallel Binding calls, 1-256 (default 16)")
    p.add_argument("--kube-api-qps", type=float_range(0), default=0.0, metavar="QPS",
                   help="calls per second to the API server, as kube-scheduler's clientConnection.qps (default 0: no "
                        "limit; watches not counted)")
    p.add_argument("--kube-api-burst", type=int_range(1, 100000), default=None, metavar="N",
                   help="calls allowed at once above --kube-api-qps (default: the QPS figure)")
    p.add_argument("--preemption", action=argparse.BooleanOptionalAction, default=True,
                   help="delete lower-priority or borrowed pods to make room (default on)")
    p.add_argument("--recreate-refused-pods", action=argparse.BooleanOptionalAction, default=True,
                   help="create a copy of a bare pod kubelet refused because the node's GPU device plugin was down "
                        "(needs pods create: deploy/overlays/recreate-refused-pods; default on)")
    p.add_argument("--recreate-other-schedulers-pods", action=argparse.BooleanOptionalAction, default=False,
                   help="also re-create such a pod another scheduler placed (kube-scheduler's, where GPU pods are not "
                        "routed to gpufleet: Kubernetes 1.35), once the node's plugin is back (default off)")
    p.add_argument("--eviction-grace-period", type=int_range(0, 86400), default=None, metavar="S",
                   help="grace period for pods deleted by preemption/reclaim (default: each pod's own)")
    p.add_argument("--queues", action=argparse.BooleanOptionalAction, default=True,
                   help="watch Namespaces, Queues, PodGroups and PodDisruptionBudgets (default on)")
    add_log_level(p)


def add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=None, type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="DEBUG, INFO, WARNING or ERROR (default INFO, DEBUG with gpufleet -v; this flag wins over -v)")


def load_profile(policy: str, config: str | None):
    """A profile from --config YAML, else by policy name; 'default' falls back to a builtin that exists."""
    from ..engine.config import load_config
    from ..engine.errors import ConfigError
    from ..policies import build_profile, policy_names, registry

    if config:
        return next(iter(load_config(config, registry()).values()))
    names = policy_names()
    if policy == "default" and "default" not in names:
        fallback = next((n for n in ("strandfrag", "fgd", "bestfit") if n in names), names[0] if names else None)
        if fallback is None:
            raise ConfigError("no policy profiles installed")
        log.warning("policy 'default' is not installed; using %r", fallback)
        policy = fallback
    return build_profile(policy)


def start(args: argparse.Namespace, command: str, component: str, pool_size: int = 32, qps: float = 0.0, burst: int = 0):
    """Logging, the profile and the API client for a long-running command; (profile, api) or an exit code."""
    from ..engine.errors import ConfigError
    from .api import KubernetesApi

    logging.basicConfig(level=getattr(logging, str(args.log_level or "INFO").upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # a no-op under cli.main, which configured it
    try:
        profile = load_profile(args.policy, args.config)
    except (ConfigError, OSError) as exc:
        print(f"gpufleet {command}: bad configuration: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    # bad --kubeconfig/--context: UsageError (2); no cluster configured: RuntimeFailure (1); cli.main prints it
    return profile, KubernetesApi(args.kubeconfig, args.context, component=component, pool_size=pool_size, qps=qps, burst=burst)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.attempts = Counter("gpufleet_schedule_attempts_total", "Scheduling attempts by result", ["result"], registry=self.registry)
        self.latency = Histogram("gpufleet_scheduling_attempt_duration_seconds", "One scheduling attempt, decision to bind reply",
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5), registry=self.registry)
        self.e2e = Histogram("gpufleet_pod_scheduling_duration_seconds", "End to end: pod first seen pending to bound",
                             registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800))
        self.pending = Gauge("gpufleet_pending_pods", "Pods waiting for gpufleet", registry=self.registry)
        self.binds = Counter("gpufleet_binds_total", "Pods bound (rate() gives binds/s)", registry=self.registry)
        self.leader = Gauge("gpufleet_leader", "1 while this replica holds the lease", registry=self.registry)
        self.evictions = Counter("gpufleet_evictions_total", "Pods evicted to make room, by reason (preempted, reclaimed; "
                                 "already_gone: the eviction found the victim gone; eviction_refused: a "
                                 "PodDisruptionBudget said no, nothing deleted)",
                                 ["reason"], registry=self.registry)
        self.held_room = Counter("gpufleet_held_room_placements_total", "Pods placed in room the policy held for pods not "
                                 "yet here (the default's CPU reserve) rather than evict lower-priority pods", registry=self.registry)
        self.queue_pending_pods = Gauge("gpufleet_queue_pending_pods", "Pods waiting for gpufleet, per team queue (0 when none)",
                                        ["queue"], registry=self.registry)
        self.queue_pending_gpus = Gauge("gpufleet_queue_pending_gpus", "GPUs the pods waiting in a team queue ask for (a "
                                        "500-milli share 0.5, a MIG instance its slices of 7; 0 when none)", ["queue"],
                                        registry=self.registry)

    def on_attempt(self, result: str, seconds: float) -> None:
        self.attempts.labels(result).inc()
        self.latency.observe(seconds)


def serve_http(addr: str, metrics: Metrics, ready: threading.Event) -> ThreadingHTTPServer:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = addr.rsplit(":", 1)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
            elif path == "/healthz":
                body, ctype, code = b"ok", "text/plain", 200
            elif path == "/readyz":
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

    srv = ThreadingHTTPServer((host.strip("[]"), int(port)), H)
    threading.Thread(target=srv.serve_forever, daemon=True, name="http").start()
    return srv


def run(args: argparse.Namespace) -> int:
    from .leader import KubernetesLeaseStore, LeaseElector
    from .loop import SchedulerLoop
    from .runner import Runner

    started = start(args, "scheduler", "gpufleet-scheduler", pool_size=max(10, args.bind_workers + 4), qps=args.kube_api_qps,
                    burst=args.kube_api_burst or 0)
    if isinstance(started, int):
        return started
    profile, api = started
    metrics = Metrics()
    loop = SchedulerLoop(api, profile, scheduler_name=args.scheduler_name, on_attempt=metrics.on_attempt,
                         bind_workers=args.bind_workers, event_thread=True, policy_kinds=args.queues,
                         preemption=args.preemption, eviction_grace_s=args.eviction_grace_period,
                         recreate_refused=args.recreate_refused_pods,
                         recreate_foreign=args.recreate_other_schedulers_pods and args.recreate_refused_pods)
    elector = None
    if args.leader_elect:
        lease_s = max(3, args.lease_duration)
        elector = LeaseElector(KubernetesLeaseStore(api.api, args.lease_name, args.lease_namespace), args.identity,
                               lease_s=lease_s, renew_deadline_s=lease_s * 2 / 3, retry_s=lease_s / 7.5)
    runner = Runner(api, loop, elector, metrics)
    srv = serve_http(args.metrics_addr, metrics, runner.ready)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("gpufleet scheduler %s: scheduling pods with schedulerName=%s, profile %s", args.identity, args.scheduler_name, profile.name)
    try:
        runner.run(stop)
    finally:
        srv.shutdown()
    return 0
