"""``gpufleet explain NAMESPACE/POD``: why a pod is pending, node by node."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pod", help="NAMESPACE/NAME (or NAME in the default namespace)")
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("--policy", default="default")
    p.add_argument("--scheduler-name", default="gpufleet")


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import GpufleetError
    from ..engine.podspec import pod_key
    from ..policies import build_profile
    from .api import KubernetesApi
    from .loop import SchedulerLoop

    key = args.pod if "/" in args.pod else f"default/{args.pod}"
    api = KubernetesApi(args.kubeconfig, args.context, component="gpufleet-explain")
    loop = SchedulerLoop(api, build_profile(args.policy), scheduler_name=args.scheduler_name)
    loop.resync()
    pods, _ = api.list_pods()
    pod = next((p for p in pods if pod_key(p) == key), None)
    if pod is None:
        print(f"gpufleet explain: pod {key} not found", file=sys.stderr)
        return 1
    if (pod.get("spec") or {}).get("nodeName"):
        print(f"{key} is bound to {pod['spec']['nodeName']}")
        return 0
    try:
        summary, by_node = loop.explain(pod)
    except GpufleetError as exc:
        print(f"{key}: invalid pod spec: {exc}")
        return 1
    print(f"{key}: {summary}")
    width = max((len(n) for n in by_node), default=4)
    for n, reason in sorted(by_node.items(), key=lambda kv: (kv[1] != "fits", kv[0])):
        print(f"  {n:<{width}}  {reason}")
    return 0
