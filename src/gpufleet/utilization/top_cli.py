"""``gpufleet top``: a refreshing terminal view of GPU allocation and use per node and namespace."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
import urllib.parse

log = logging.getLogger("gpufleet.top")

# "GPUs busy": per GPU first (a shared GPU has one series per sharer), then summed
USED_BY_NODE = "sum by (Hostname) (sum by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)) / 100"
USED_BY_NAMESPACE = 'sum by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!=""}) / 100'


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import float_range

    p.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL for the USED columns (optional)")
    p.add_argument("--interval", type=float_range(0.5, 86400), default=5.0, help="refresh every N seconds, 0.5-86400 (default 5)")
    p.add_argument("--once", action="store_true", help="print once and exit")


def instant(prometheus: str, query: str, label: str, fetch=None) -> dict[str, float]:
    from .sources import SourceError, http_get

    body = (fetch or http_get)(f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query}), 10.0)
    try:
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise SourceError(f"query {query!r}: {doc.get('error')}")
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in doc["data"]["result"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SourceError(f"query {query!r}: unreadable answer: {exc}") from None


def snapshot(api, prometheus: str | None, fetch=None):
    """One view from a SchedulerApi-like object (list_nodes/list_pods) and optional Prometheus."""
    from ..engine.errors import GpufleetError
    from ..kube.convert import node_from_json
    from .sources import SourceError
    from .top import build_view

    nodes_json, _ = api.list_nodes()
    pods_json, _ = api.list_pods()
    nodes, skipped = [], []
    for n in nodes_json:
        try:
            nodes.append(node_from_json(n))
        except GpufleetError as exc:
            skipped.append(str(exc))
    by_node = by_ns = None
    if prometheus:
        try:
            by_node = instant(prometheus, USED_BY_NODE, "Hostname", fetch)
            by_ns = instant(prometheus, USED_BY_NAMESPACE, "namespace", fetch)
        except SourceError as exc:
            skipped.append(f"metrics: {exc}")
    view = build_view(nodes, pods_json, by_node, by_ns)
    view.skipped = skipped + view.skipped
    return view


def run(args: argparse.Namespace) -> int:
    from ..kube.api import KubernetesApi
    from .top import render

    if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
        print(f"gpufleet top: --prometheus {args.prometheus}: must start with http:// or https://", file=sys.stderr)
        return 2
    api = KubernetesApi(args.kubeconfig, args.context, component="gpufleet-top")  # typed errors: cli.main, exit 1 or 2
    while True:
        try:
            rows = max(5, (shutil.get_terminal_size((120, 40)).lines - 12) // 2)
            out = render(snapshot(api, args.prometheus), max_rows=None if args.once else rows)
        except Exception as exc:  # API away for a moment: say so and keep refreshing
            if args.once:
                raise  # cli.main: one line, exit 1
            out = f"(refresh failed: {' '.join(str(exc).split())[:300]})"
        if args.once:
            print(out)
            return 0
        print("\x1b[2J\x1b[H" + time.strftime("%H:%M:%S ") + f"gpufleet top (every {args.interval:g}s, Ctrl-C quits)\n" + out, flush=True)
        time.sleep(args.interval)
