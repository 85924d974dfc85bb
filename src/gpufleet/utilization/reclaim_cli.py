"""``gpufleet reclaim``: find pods whose GPUs sit idle and report, warn or evict them (dry run unless --apply)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from ..argtypes import float_range, host_port, int_range

log = logging.getLogger("gpufleet.reclaim")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://prometheus:9090 (query_range of DCGM_FI_DEV_GPU_UTIL)")
    src.add_argument("--agents", metavar="URL,...", help="scrape these agents' /metrics directly (history kept in memory: needs --interval)")
    src.add_argument("--agents-from-nodes", action="store_true", help="scrape http://<node InternalIP>:PORT/metrics of every GPU node")
    p.add_argument("--agent-port", type=int_range(1, 65535), default=9400, help="the agents' metrics port (default 9400)")
    p.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    p.add_argument("--policy-file", help="YAML/JSON: default: {action, idleUtilPercent, window, grace, ...}, namespaces: {NS: {...}}")
    p.add_argument("--apply", action="store_true", help="really warn/evict (default: dry run, log and count only)")
    p.add_argument("--interval", type=float_range(0, 86400), default=0.0, help="run as a controller, one round every N seconds (default: one round)")
    p.add_argument("--metrics-addr", type=host_port, default="", help="with --interval: serve the reclaim counters on HOST:PORT")
    p.add_argument("--json", action="store_true", help="print the round's actions as JSON")


def run(args: argparse.Namespace) -> int:
    import yaml

    from ..engine.errors import ConfigError
    from .kube_actions import KubeReclaimClient
    from .reclaim import load_config
    from .reclaim_controller import ReclaimMetrics, Reclaimer
    from .sources import AgentScrapeSource, PrometheusSource, SourceError, agent_urls_from_nodes

    try:
        doc = None
        if args.policy_file:
            with open(args.policy_file) as f:
                doc = yaml.safe_load(f)
        config = load_config(doc)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError) as exc:
        print(f"gpufleet reclaim: --policy-file {args.policy_file}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    kube = KubeReclaimClient(args.kubeconfig)  # typed errors: cli.main makes them one line, exit 1 or 2
    source: PrometheusSource | AgentScrapeSource
    try:
        if args.prometheus:
            source = PrometheusSource(args.prometheus)
        else:
            if not args.interval:
                print("gpufleet reclaim: --agents/--agents-from-nodes keep history in memory; add --interval "
                      "(a pod is only judged after a whole window of scrapes)", file=sys.stderr)
            if args.agents:
                urls = [u.strip() for u in args.agents.split(",") if u.strip()]
                source = AgentScrapeSource(urls, config.lookback_s())
            else:
                from kubernetes import client

                ser = client.ApiClient().sanitize_for_serialization
                source = AgentScrapeSource(lambda: agent_urls_from_nodes([ser(n) for n in kube.core.list_node().items], args.agent_port),
                                           config.lookback_s())
    except SourceError as exc:
        print(f"gpufleet reclaim: {exc}", file=sys.stderr)
        return 2
    metrics = ReclaimMetrics()
    if args.interval and args.metrics_addr:
        from prometheus_client import start_http_server

        host, port = args.metrics_addr.rsplit(":", 1)
        start_http_server(int(port), addr=host or "0.0.0.0", registry=metrics.registry)
    rec = Reclaimer(kube, source, config, apply=args.apply, metrics=metrics,
                    out=(lambda s: None) if args.json else print)
    while True:
        try:
            res = rec.run_once()
            if args.json:
                print(json.dumps({"applied": args.apply, "summary": res.summary, "skipped": res.skipped,
                                  "actions": [{"pod": a.pod, "action": a.action, "reason": a.reason, "gpus": a.gpus,
                                               "idle_s": a.idle_s, "gpu_hours": a.gpu_hours,
                                               "outcome": res.outcomes.get(a.pod)} for a in res.actions]}, indent=1))
        except SourceError as exc:
            print(f"gpufleet reclaim: utilisation source: {exc}", file=sys.stderr)
            if not args.interval:
                return 1
        except Exception as exc:  # API server away: retry next round in controller mode
            if not args.interval:
                raise  # cli.main: one line, exit 1
            log.warning("reclaim round failed: %s", exc)
        if not args.interval:
            return 0
        time.sleep(args.interval)
