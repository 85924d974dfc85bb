"""``gpufleet recommend``: right-sized GPU requests per workload, from Prometheus and the API server."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..files import replace_atomically


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..argtypes import float_range

    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL (DCGM_FI_DEV_GPU_UTIL / FB_USED by pod)")
    p.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    p.add_argument("--window", default="24h", help="look-back window, e.g. 24h, 7d (default 24h)")
    p.add_argument("--step", default="5m", help="sample step (default 5m)")
    p.add_argument("--headroom", type=float_range(1, 10), default=1.2, help="multiply p95 use by this, 1-10 (default 1.2)")
    p.add_argument("--namespace", help="only this namespace")
    p.add_argument("--json", action="store_true", help="JSON output (with the patch, or why none, per workload)")
    p.add_argument("--patches", metavar="DIR", help="write one strategic-merge patch per workload to change into DIR "
                   "(<namespace>.<kind>.<name>.yaml) and print the kubectl patch commands that apply them")


def gather(kube, prom, window_s: float, step_s: float, now: float, namespace: str | None = None):
    """Pods, owners and series -> WorkloadUsage list (+ skipped objects)."""
    from ..engine.errors import GpufleetError
    from ..kube.convert import node_from_json
    from .recommend import workloads

    util = prom.query_range('max by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})', now - window_s, now, step_s)
    mem = prom.query_range('max by (namespace, pod) (DCGM_FI_DEV_FB_USED{pod!=""})', now - window_s, now, step_s)
    pods = [p for p in kube.pods() if not namespace or (p.get("metadata") or {}).get("namespace") == namespace]
    owners = {}
    for o in kube.owners():
        m = o.get("metadata") or {}
        owners[(m.get("namespace") or "default", o.get("kind") or "", m.get("name") or "")] = o
    gpu_mem, skipped = {}, []
    for n in kube.nodes():
        try:
            node = node_from_json(n)
        except GpufleetError as exc:
            skipped.append(str(exc))
            continue
        if node.gpus:
            gpu_mem[node.name] = node.gpus[0].memory_mib
    return workloads(pods, owners, util, mem, gpu_mem, step_s, skipped), skipped


class KubeReader:
    """Running pods, their ReplicaSet/Job owners and nodes, as JSON, through the official client."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client

        from .kube_actions import load_client_config

        load_client_config(kubeconfig)
        self.core, self.apps, self.batch = client.CoreV1Api(), client.AppsV1Api(), client.BatchV1Api()
        self.ser = client.ApiClient().sanitize_for_serialization

    def pods(self) -> list[dict]:
        return [self.ser(p) for p in self.core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items]

    def owners(self) -> list[dict]:
        out = []
        for kind, items in (("ReplicaSet", self.apps.list_replica_set_for_all_namespaces().items),
                            ("Job", self.batch.list_job_for_all_namespaces().items)):
            for x in items:
                d = self.ser(x)
                d["kind"] = kind
                out.append(d)
        return out

    def nodes(self) -> list[dict]:
        return [self.ser(n) for n in self.core.list_node().items]


def run(args: argparse.Namespace) -> int:
    from ..engine.errors import ConfigError
    from .patches import Patch, patch_for
    from .reclaim import parse_duration
    from .recommend import recommend, render_table
    from .sources import PrometheusSource, SourceError

    if args.patches is not None and not _writable_dir(args.patches):
        print(f"gpufleet recommend: --patches {args.patches}: not a directory this user can write", file=sys.stderr)
        return 2
    try:
        window_s, step_s = parse_duration("--window", args.window), parse_duration("--step", args.step)
        if not 0 < step_s <= window_s:
            raise ConfigError(f"--step {args.step}: must be > 0 and at most --window {args.window}")
        prom = PrometheusSource(args.prometheus, step_s=step_s)
    except (ConfigError, SourceError) as exc:
        print(f"gpufleet recommend: {exc}", file=sys.stderr)
        return 2
    kube = KubeReader(args.kubeconfig)  # typed errors: cli.main makes them one line, exit 1 or 2
    try:
        usage, skipped = gather(kube, prom, window_s, step_s, time.time(), args.namespace)
    except SourceError as exc:
        print(f"gpufleet recommend: {exc}", file=sys.stderr)
        return 1
    example = {w.workload: w.example_pod for w in usage}
    recs = sorted((recommend(w, headroom=args.headroom) for w in usage), key=lambda r: (-r.gpu_hours_freed, r.workload))
    patches = {r.workload: patch_for(r, example[r.workload] or {}) for r in recs}
    commands = []
    if args.patches is not None:
        import os

        import yaml

        for p in patches.values():
            if isinstance(p, Patch):
                path = os.path.join(args.patches, p.file_name)
                replace_atomically(path, f"# gpufleet recommend: {p.kind} {p.namespace}/{p.name}\n# {p.kubectl(path)}\n"
                                   + yaml.safe_dump(p.body, sort_keys=False))
                commands.append(p.kubectl(path))
    if args.json:
        out = []
        for r in recs:
            d = r.to_json()
            p = patches[r.workload]
            d["patch"], d["patch_skipped"] = (p.to_json(), None) if isinstance(p, Patch) else (None, p)
            out.append(d)
        print(json.dumps({"window_s": window_s, "recommendations": out, "skipped": skipped}, indent=1))
    else:
        print(render_table(recs))
        for s in skipped:
            print(f"skipped: {s}")
        if args.patches is not None:
            print(f"{len(commands)} patch(es) in {args.patches}; apply with:" if commands else f"no workload to patch ({args.patches} unchanged)")
            for c in commands:
                print("  " + c)
            for w, p in sorted(patches.items()):
                if not isinstance(p, Patch) and not p.startswith("no change"):
                    print(f"  no patch for {w}: {p}")
    return 0


def _writable_dir(path: str) -> bool:
    import os

    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
