"""``gpufleet reclaim``: find idle GPUs and act on them (dry run unless --apply)."""

from __future__ import annotations

import argparse
import json
import logging
import time

log = logging.getLogger("gpufleet.reclaim")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://prometheus:9090")
    p.add_argument("--kubeconfig")
    p.add_argument("--policy-file", help='JSON {"namespace": {"action": "warn", "idle_util_pct": 5, "window_s": 3600, "grace_s": 1800}}')
    p.add_argument("--apply", action="store_true", help="really annotate/evict (default: dry run, report only)")


def query_util(base: str, window_s: float, now: float) -> dict[str, list[tuple[float, float]]]:
    """Per-pod GPU utilisation series from dcgm-exporter/gpufleet metrics via Prometheus' HTTP API."""
    import urllib.parse
    import urllib.request

    q = 'max by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'
    url = f"{base.rstrip('/')}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": q, "start": now - window_s, "end": now, "step": "60"})
    with urllib.request.urlopen(url, timeout=30) as r:
        data = json.loads(r.read())
    out: dict[str, list[tuple[float, float]]] = {}
    for s in data.get("data", {}).get("result", []):
        m = s["metric"]
        out[f"{m.get('namespace')}/{m.get('pod')}"] = [(float(t), float(v)) for t, v in s["values"]]
    return out


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    from ..engine import annotations as ann
    from ..engine.podspec import effective_requests
    from .reclaim import NamespacePolicy, PodInfo, decide

    config.load_kube_config(args.kubeconfig) if args.kubeconfig else config.load_incluster_config()
    core = client.CoreV1Api()
    pols = {}
    if args.policy_file:
        with open(args.policy_file) as f:
            pols = {ns: NamespacePolicy(**v) for ns, v in json.load(f).items()}
    now = time.time()
    window = max([p.window_s for p in pols.values()] + [3600.0])
    util = query_util(args.prometheus, window, now)
    pods = []
    for p in core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items:
        raw = core.api_client.sanitize_for_serialization(p)
        req = effective_requests(raw)
        a = (p.metadata.annotations or {})
        gpus = req.get("nvidia.com/gpu", 0)
        if ann.GPU_MILLI in a and gpus:
            gpus = int(a[ann.GPU_MILLI]) / 1000
        if not gpus:
            continue
        pods.append(PodInfo(p.metadata.namespace, p.metadata.name, float(gpus), p.metadata.creation_timestamp.timestamp(),
                            p.spec.priority or 0, a))
    actions = decide(now, pods, util, pols)
    returned = 0.0
    for act in actions:
        print(f"{act.action:<8} {act.pod:<50} {act.reason}")
        if not args.apply or act.action not in ("warn", "evict"):
            continue
        ns, name = act.pod.split("/", 1)
        if act.action == "warn":
            core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {ann.IDLE_WARNING: str(int(now))}}})
        else:
            core.create_namespaced_pod_eviction(name, ns, client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns)))
            returned += act.gpu_hours
    mode = "applied" if args.apply else "dry run"
    print(f"{mode}: {sum(a.action == 'warn' for a in actions)} warned, {sum(a.action == 'evict' for a in actions)} to evict, "
          f"{sum(a.action == 'protect' for a in actions)} protected; GPU-hours returned: {returned:.1f}")
    return 0
