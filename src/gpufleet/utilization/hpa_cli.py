"""``gpufleet explain-hpa NAMESPACE/NAME``: why a HorizontalPodAutoscaler on GPU metrics does (not) scale."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("hpa", help="NAMESPACE/NAME of the HorizontalPodAutoscaler (or NAME in the default namespace)")
    p.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus the adapter reads: find which input series are missing")
    p.add_argument("--json", action="store_true", help="print {hpa, lines} as JSON")


def run(args: argparse.Namespace) -> int:
    from .hpa_explain import ClientKube, diagnose, gather, prometheus_query

    key = args.hpa if "/" in args.hpa else f"default/{args.hpa}"
    if key.count("/") != 1 or not all(key.split("/")):
        print(f"gpufleet explain-hpa: {args.hpa!r}: expected NAMESPACE/NAME or NAME", file=sys.stderr)
        return 2
    if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
        print(f"gpufleet explain-hpa: --prometheus {args.prometheus}: must start with http:// or https://", file=sys.stderr)
        return 2
    ns, name = key.split("/")
    kube = ClientKube(args.kubeconfig, args.context)  # typed errors: cli.main makes them one line, exit 1 or 2
    facts = gather(kube, ns, name, prometheus_query(args.prometheus) if args.prometheus else None, args.prometheus or "")
    lines = diagnose(facts)
    if args.json:
        print(json.dumps({"hpa": key, "lines": lines}))
    else:
        print("\n".join(lines))
    return 0 if facts.hpa is not None else 1
