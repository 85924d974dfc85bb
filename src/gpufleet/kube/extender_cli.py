"""``gpufleet extender``: the scheduler-extender HTTP server (see docs/kubernetes.md for the wiring)."""

from __future__ import annotations

import argparse
import queue
import signal
import threading


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("--policy", default="default")
    p.add_argument("--addr", default="0.0.0.0:8888", help="listen address (default 0.0.0.0:8888)")


def run(args: argparse.Namespace) -> int:
    from ..policies import build_profile
    from .api import KubernetesApi
    from .cli import watcher
    from .extender import Extender, serve
    from .loop import SchedulerLoop

    api = KubernetesApi(args.kubeconfig, args.context, component="gpufleet-extender")
    # the extender never binds on its own: no scheduler name matches
    loop = SchedulerLoop(api, build_profile(args.policy), scheduler_name="\x00none")
    loop.resync()
    ext = Extender(loop)
    serve(ext, args.addr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    q: queue.Queue = queue.Queue()
    for kind in ("node", "pod"):
        threading.Thread(target=watcher, args=(api, kind, loop.rv, q, stop), daemon=True).start()
    while not stop.is_set():
        try:
            kind, type_, obj = q.get(timeout=0.5)
        except queue.Empty:
            continue
        with ext.lock:
            if kind == "relist":
                loop.resync()
            else:
                loop.handle(kind, type_, obj)
    return 0
