"""``gpufleet top``: a refreshing terminal view of GPU allocation and utilisation."""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig")
    p.add_argument("--prometheus", help="Prometheus base URL for utilisation (optional)")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--once", action="store_true")


def snapshot(api, prometheus: str | None):
    from ..engine.inventory import assignment_from_json
    from ..engine.podspec import effective_requests, pod_key
    from ..kube.convert import node_from_json
    from .top import NodeRow

    nodes_json, _ = api.list_nodes()
    pods_json, _ = api.list_pods()
    util_node: dict[str, float] = {}
    util_ns: dict[str, float] = {}
    if prometheus:
        import urllib.parse
        import urllib.request

        for q, target, label in (("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", util_node, "Hostname"),
                                 ('avg by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!=""})', util_ns, "namespace")):
            with urllib.request.urlopen(f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=10) as r:
                for s in json.loads(r.read())["data"]["result"]:
                    target[s["metric"].get(label, "")] = float(s["value"][1])
    alloc: dict[str, int] = {}
    ns_gpus: dict[str, float] = {}
    for p in pods_json:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        a = (p.get("metadata") or {}).get("annotations") or {}
        if "gpufleet.io/assignment" in a:
            asg = assignment_from_json(pod_key(p), a["gpufleet.io/assignment"])
            milli = len(asg.gpu_indices) * asg.gpu_milli
        else:
            milli = effective_requests(p).get("nvidia.com/gpu", 0) * 1000
        alloc[node] = alloc.get(node, 0) + milli
        ns = (p.get("metadata") or {}).get("namespace", "default")
        ns_gpus[ns] = ns_gpus.get(ns, 0.0) + milli / 1000
    rows = []
    for n in nodes_json:
        node = node_from_json(n)
        if node.gpus:
            rows.append(NodeRow(node.name, node.gpus[0].model, len(node.gpus), alloc.get(node.name, 0), util_node.get(node.name)))
    return rows, {ns: (g, util_ns.get(ns)) for ns, g in ns_gpus.items() if g}


def run(args: argparse.Namespace) -> int:
    from ..kube.api import KubernetesApi
    from .top import render

    api = KubernetesApi(args.kubeconfig, component="gpufleet-top")
    while True:
        rows, ns = snapshot(api, args.prometheus)
        out = render(rows, ns)
        if args.once:
            print(out)
            return 0
        print("\x1b[2J\x1b[H" + time.strftime("%H:%M:%S ") + "gpufleet top\n" + out, flush=True)
        time.sleep(args.interval)
