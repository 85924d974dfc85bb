"""``gpufleet recommend``: right-sized GPU requests per workload, from Prometheus and the API server."""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, help="Prometheus base URL")
    p.add_argument("--kubeconfig")
    p.add_argument("--window-h", type=float, default=24.0)
    p.add_argument("--json", action="store_true", help="JSON output")


def _series(base: str, query: str, window_s: float, now: float) -> dict[tuple[str, str], list[float]]:
    import urllib.parse
    import urllib.request

    url = f"{base.rstrip('/')}/api/v1/query_range?" + urllib.parse.urlencode({"query": query, "start": now - window_s, "end": now, "step": "300"})
    with urllib.request.urlopen(url, timeout=60) as r:
        data = json.loads(r.read())
    out: dict[tuple[str, str], list[float]] = {}
    for s in data.get("data", {}).get("result", []):
        m = s["metric"]
        out.setdefault((m.get("namespace", ""), m.get("pod", "")), []).extend(float(v) for _, v in s["values"])
    return out


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    from ..engine.podspec import effective_requests
    from .recommend import WorkloadUsage, owner_of, recommend

    config.load_kube_config(args.kubeconfig) if args.kubeconfig else config.load_incluster_config()
    core, apps, api = client.CoreV1Api(), client.AppsV1Api(), client.ApiClient()
    now, win = time.time(), args.window_h * 3600
    util = _series(args.prometheus, 'DCGM_FI_DEV_GPU_UTIL{pod!=""}', win, now)
    mem = _series(args.prometheus, 'sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{pod!=""})', win, now)
    owners = {}
    for rs in apps.list_replica_set_for_all_namespaces().items:
        d = api.sanitize_for_serialization(rs)
        owners[(rs.metadata.namespace, "ReplicaSet", rs.metadata.name)] = d
    groups: dict[str, dict] = {}
    for p in core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items:
        raw = api.sanitize_for_serialization(p)
        gpus = effective_requests(raw).get("nvidia.com/gpu", 0)
        if not gpus:
            continue
        w = owner_of(raw, owners)
        g = groups.setdefault(w, {"pods": 0, "gpus": gpus, "util": [], "mem": []})
        g["pods"] += 1
        key = (p.metadata.namespace, p.metadata.name)
        g["util"] += util.get(key, [])
        g["mem"] += mem.get(key, [])
    recs = [recommend(WorkloadUsage(w, g["pods"], g["gpus"], 81920, g["util"], g["mem"], args.window_h)) for w, g in groups.items()]
    recs.sort(key=lambda r: -r.gpu_hours_freed)
    if args.json:
        print(json.dumps([r.__dict__ for r in recs], indent=1))
        return 0
    print(f"{'workload':<48} {'req':>4} {'p50%':>5} {'p95%':>5} {'mem p95':>8}  {'recommended':<60} {'GPU-h freed':>11}")
    for r in recs:
        print(f"{r.workload:<48} {r.requested_gpus:>4g} {r.util_p50:>5.0f} {r.util_p95:>5.0f} {r.mem_p95_mib:>7.0f}M  {r.request_text():<60} {r.gpu_hours_freed:>11.1f}")
    return 0
