"""``gpufleet extender``: the scheduler-extender HTTP server (see docs/kubernetes.md for the wiring)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

log = logging.getLogger("gpufleet.extender")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli import add_common

    add_common(p)
    p.add_argument("--addr", default="0.0.0.0:8888", help="listen address (default 0.0.0.0:8888)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR (default INFO, DEBUG with gpufleet -v)")


def run(args: argparse.Namespace) -> int:
    from .cli import start
    from .extender import Extender, serve
    from .loop import SchedulerLoop
    from .runner import Runner

    started = start(args, "extender", "gpufleet-extender")
    if isinstance(started, int):
        return started
    profile, api = started
    # the extender never schedules on its own: kube-scheduler drives it, so no pod is "ours" to queue
    # kube-scheduler does queueing and preemption in this mode; gpufleet picks nodes and GPUs
    loop = SchedulerLoop(api, profile, scheduler_name="\x00gpufleet-extender-none", policy_kinds=False, preemption=False)
    lock = threading.Lock()
    runner = Runner(api, loop, lock=lock)
    ext = Extender(loop, lock, runner.ready)
    srv = serve(ext, args.addr, runner.ready)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("gpufleet extender on %s, profile %s", args.addr, profile.name)
    try:
        runner.run(stop)
    finally:
        srv.shutdown()
    return 0
