"""``gpufleet explain NAMESPACE/POD``: why a pod is pending, node by node (the engine's own statuses)."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli import add_common

    p.add_argument("pod", help="NAMESPACE/NAME (or NAME in the default namespace)")
    add_common(p)
    p.add_argument("--scheduler-name", default="gpufleet", help="the scheduler whose view to explain (default gpufleet)")
    p.add_argument("--json", action="store_true", help="print {pod, summary, nodes} as JSON")


def explain(api, profile, key: str, scheduler_name: str = "gpufleet") -> tuple[int, str]:
    """(exit code, text) for one pod against a fresh snapshot; changes nothing."""
    from ..engine.errors import GpufleetError
    from ..engine.gang import PodGroupNotReady
    from .loop import SchedulerLoop
    from .plugin_down import asks_gpu

    ns, name = key.split("/", 1)
    pod = api.get_pod(ns, name)
    if pod is None:
        return 1, f"pod {key} not found"
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        from .interruption import moved_line

        a = ((pod.get("metadata") or {}).get("annotations") or {}).get("gpufleet.io/assignment")
        moved = moved_line(pod)
        return 0, f"{key} is bound to {node}" + (f"; assignment {a}" if a else "") + (f"\n  {moved}" if moved else "")
    loop = SchedulerLoop(api, profile, scheduler_name=scheduler_name)
    loop.resync()
    loop.learn_waiting()  # rooms kept for preemptors (status.nominatedNodeName), as the scheduler keeps them
    # nodes the scheduler holds GPU pods off (kubelet refused one for a dead device plugin), read back from the API by
    # the scheduler's own rule: this process saw no refusal itself
    holds = loop.plugin_down.restore(api.list_failed_pods()[0]) if asks_gpu(pod) else []
    loop.replay_gangs()  # what the scheduler's gang round holds now (a hold may be what keeps the pod out)
    try:
        summary, by_node = loop.explain(pod)
    except PodGroupNotReady as exc:  # its scheduling.k8s.io PodGroup is missing: the pod waits, as kube-scheduler's
        return 0, f"{key}: {exc}"
    except GpufleetError as exc:
        return 1, f"{key}: invalid pod spec: {exc}"
    gates = [str(g.get("name")) for g in (pod.get("spec") or {}).get("schedulingGates") or [] if isinstance(g, dict)]
    if gates:  # nobody schedules it before the gates go (kube-scheduler's SchedulingGates); say what happens then
        summary = f"waiting for its scheduling gates to be removed ({', '.join(gates)}); once they are: {summary}"
    lines = [f"{key}: {summary}"] + [f"  held: {loop.plugin_down.describe(n)}" for n in holds]
    width = max((len(n) for n in by_node), default=4)
    for n, reason in sorted(by_node.items(), key=lambda kv: (kv[1] != "fits", kv[0])):
        lines.append(f"  {n:<{width}}  {reason}")
    return 0, "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from .api import KubernetesApi
    from .cli import load_profile

    key = args.pod if "/" in args.pod else f"default/{args.pod}"
    if key.count("/") != 1 or not all(key.split("/")):
        print(f"gpufleet explain: pod {args.pod!r}: expected NAMESPACE/NAME or NAME", file=sys.stderr)
        return 2
    try:
        profile = load_profile(args.policy, args.config)
    except (ConfigError, OSError) as exc:
        print(f"gpufleet explain: bad configuration: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    # credentials and an unreachable API server raise typed/urllib3 errors: cli.main makes them one line, exit 1 or 2
    api = KubernetesApi(args.kubeconfig, args.context, component="gpufleet-explain")
    code, text = explain(api, profile, key, args.scheduler_name)
    if args.json:
        print(json.dumps({"pod": key, "exit": code, "text": text}))
    else:
        print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code
