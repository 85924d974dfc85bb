"""``gpufleet extender``: the scheduler-extender HTTP server (see docs/kubernetes.md for the wiring)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

log = logging.getLogger("gpufleet.extender")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import host_port
    from .cli import add_common, add_log_level

    add_common(p)
    p.add_argument("--addr", type=host_port, default="0.0.0.0:8888", help="listen address for the verbs and /metrics (default 0.0.0.0:8888)")
    p.add_argument("--reservation-ttl", type=float, default=30.0, metavar="S",
                   help="release a node+GPUs chosen at filter if no bind claims them within S seconds (default 30)")
    add_log_level(p)


def _log_level(args: argparse.Namespace) -> None:
    """gpufleet's own loggers at the command's level (INFO: start, every bind and refusal; DEBUG: every call)."""
    explicit = getattr(args, "log_level", None)  # the same rule as the gpufleet command's: this flag wins over -v
    level = getattr(logging, explicit) if explicit else (logging.DEBUG if getattr(args, "verbose", 0) else logging.INFO)
    logging.getLogger("gpufleet").setLevel(level)


def run(args: argparse.Namespace) -> int:
    from .cli import start
    from .extender import Extender, ExtenderLoop, ExtenderMetrics, serve
    from .runner import Runner, wait_until

    if args.reservation_ttl <= 0:
        print(f"gpufleet extender: --reservation-ttl must be > 0, got {args.reservation_ttl:g}", file=sys.stderr)
        return 2
    started = start(args, "extender", "gpufleet-extender")
    _log_level(args)
    if isinstance(started, int):
        return started
    profile, api = started
    # kube-scheduler does queueing and preemption in this mode; gpufleet picks nodes and GPUs
    loop = ExtenderLoop(api, profile, reservation_ttl_s=args.reservation_ttl)
    lock = threading.Lock()
    runner = Runner(api, loop, lock=lock)
    metrics = ExtenderMetrics(loop, heard=lambda: max(runner.last_heard, loop.last_heard))
    ext = Extender(loop, lock, runner.ready, metrics)
    try:
        srv = serve(ext, args.addr, runner.ready)
    except OSError as exc:
        print(f"gpufleet extender: cannot listen on --addr {args.addr}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    host, port = srv.server_address[:2]
    log.info("gpufleet extender listening on %s:%s (verbs /filter /prioritize /bind; /metrics /healthz /readyz); "
             "profile %s (%s), reservation TTL %gs, log level %s", host, port, profile.name,
             args.config or f"--policy {args.policy}", args.reservation_ttl, logging.getLevelName(logging.getLogger("gpufleet").level))
    try:
        runner.run(stop)
    finally:
        srv.shutdown()  # no new connections; binds already in flight finish on their own threads
        if not wait_until(lambda: not loop.binder.binding, 10.0, 0.05):
            log.warning("stopping with %d bind(s) still in flight", len(loop.binder.binding))
        log.info("gpufleet extender stopped: %d bind(s), %d reservation(s) still held", loop.stats.binds, len(loop.reservations))
    return 0
