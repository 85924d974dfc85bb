"""Decisions/s for pods that ask by ResourceClaim, beside the same pods asking ``nvidia.com/gpu`` (device plugin).

5,000 nodes of 8 A100 (``--nodes``), 4,000 pods (one whole GPU, 250 and 500 milli shares in turn: the live benchmark's
shapes), one process, the paths alternating per round:

* ``device-plugin``: ``Scheduler.schedule`` on the pods as the device-plugin path sees them (``nvidia.com/gpu: 1``
  plus ``gpufleet.io/gpu-milli``);
* ``claims``: the same pods, each with its own ResourceClaim (from a template) of gpufleet's driver's class: whole GPU
  with no capacity request, a share by consumable capacity (``gpuMilli`` and that fraction of the GPU's memory);
  the nodes publish ResourceSlices as ``gpufleet agent --dra`` does.  Per pod, what the live scheduler does: the
  claims resolved from the pod's JSON (``kube/dra``: the claim named in ``status.resourceClaimStatuses``, the GPU
  fields from its selectors), then the engine with DynamicResources (CEL on the catalog, the allocator on the chosen
  node, the claim holding its device).

The ratio ``device-plugin / claims`` is the issue's figure (target: at most 1.5).  Rates are decisions per second of
this process's CPU time (``time.process_time``), the two paths pod by pod in turn, so other work on a shared machine
weighs on both alike.

    python bench/bench_dra.py [--nodes 5000] [--pods 4000] [--rounds 3] [--policies default,bestfit] [--json out.json]
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "src"))

from gpufleet.engine.framework import Scheduler  # noqa: E402
from gpufleet.engine.model import Gpu, Node, PodRequest  # noqa: E402
from gpufleet.engine.state import ClusterState  # noqa: E402
from gpufleet.kube.dra.cache import DraCache  # noqa: E402
from gpufleet.kube.dra.live import with_dra  # noqa: E402
from gpufleet.policies import build_profile  # noqa: E402
from gpufleet.simulator.traces.dra import DRIVER, classes_json, node_slice_json  # noqa: E402

SHARES = (1000, 250, 500)


def cluster(n: int) -> list[Node]:
    return [Node(f"n{i:05d}", 128_000, 1_048_576, tuple(Gpu(j, f"GPU-{i:05d}-{j}", "NVIDIA A100-SXM4-80GB", 81920) for j in range(8)),
                 max_pods=110) for i in range(n)]


def requests(n: int) -> list[PodRequest]:
    """The same demand both ways: a share states its memory (a DRA share must: an unstated memory is the whole GPU's)."""
    return [PodRequest(name=f"p{i:06d}", namespace="bench", uid=f"uid-{i}", cpu_milli=2000, memory_mib=8192, gpu_count=1,
                       gpu_milli=SHARES[i % 3], gpu_memory_mib=0 if SHARES[i % 3] == 1000 else SHARES[i % 3] * 81920 // 1000)
            for i in range(n)]


def claim_json(r: PodRequest) -> dict:
    ex: dict = {"deviceClassName": DRIVER}
    if r.gpu_milli < 1000:
        ex["capacity"] = {"requests": {"gpuMilli": str(r.gpu_milli), "memory": f"{r.gpu_milli * 81920 // 1000}Mi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{r.name}-gpu", "namespace": r.namespace, "uid": f"claim-{r.name}",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": r.name, "uid": r.uid, "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ex}]}}}


def pod_json(r: PodRequest) -> dict:
    return {"metadata": {"name": r.name, "namespace": r.namespace, "uid": r.uid, "resourceVersion": "1"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "claims": [{"name": "gpu"}]}}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{r.name}-gpu"}]}}


def setup(nodes: list[Node], reqs: list[PodRequest], policy: str, slices: list[dict], claims: list[dict]):
    """Both schedulers on fresh snapshots: (device-plugin scheduler, claims scheduler, its DraCache, its state)."""
    dp = Scheduler(build_profile(policy), ClusterState(nodes), seed=0)
    dra = DraCache()
    dra.replace("deviceclass", classes_json())
    dra.replace("resourceslice", slices)
    dra.replace("resourceclaim", claims)
    state = ClusterState(nodes)
    dra.attach(state)
    cl = Scheduler(with_dra(build_profile(policy)), state, seed=0)
    return dp, cl, dra, state


def run(nodes: list[Node], reqs: list[PodRequest], policy: str, slices: list[dict], claims: list[dict]) -> dict[str, tuple[float, int]]:
    """Both paths pod by pod in turn (the same moments of a shared machine for both): CPU seconds and pods placed."""
    dp, cl, dra, state = setup(nodes, reqs, policy, slices, claims)
    base = [replace(r, gpu_count=0, gpu_milli=0, gpu_memory_mib=0) for r in reqs]  # parse_pod of a pod asking by claim only
    pods = [pod_json(r) for r in reqs]
    dra.resolve(pods[0], base[0], state)  # the device table and the class's selector over every device, once
    gc.collect()
    gc.freeze()  # what both paths start from is long-lived (the live scheduler freezes its snapshot likewise)
    t_dp = t_cl = 0.0
    n_dp = n_cl = 0
    clock = time.process_time
    for r, p, b in zip(reqs, pods, base):
        t0 = clock()
        n_dp += dp.schedule(r).ok
        t1 = clock()
        n_cl += cl.schedule(dra.resolve(p, b, state)).ok
        t2 = clock()
        t_dp += t1 - t0
        t_cl += t2 - t1
    gc.unfreeze()
    return {"device-plugin": (t_dp, n_dp), "claims": (t_cl, n_cl)}


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_dra.py")
    ap.add_argument("--nodes", type=int_range(1), default=5000)
    ap.add_argument("--pods", type=int_range(1), default=4000)
    ap.add_argument("--rounds", type=int_range(1), default=3)
    ap.add_argument("--policies", default="default")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args()
    nodes = cluster(args.nodes)
    reqs = requests(args.pods)
    slices = [node_slice_json(n) for n in nodes]
    claims = [claim_json(r) for r in reqs]
    rates: dict[tuple[str, str], list[float]] = {}
    placed: dict[tuple[str, str], int] = {}
    for pol in [p for p in args.policies.split(",") if p]:  # warm-up: imports, the policy's first LP, CEL compiles
        run(nodes[:50], reqs[:300], pol, slices[:50], claims[:300])
    for _ in range(args.rounds):
        for pol in [p for p in args.policies.split(",") if p]:
            for path, (dt, n) in run(nodes, reqs, pol, slices, claims).items():
                rates.setdefault((pol, path), []).append(len(reqs) / dt)
                placed[(pol, path)] = n
    print(f"{args.nodes} nodes x 8 A100, {args.pods} pods (whole, 250m, 500m in turn), median of {args.rounds} round(s):")
    out = []
    for pol in dict.fromkeys(p for p, _ in rates):
        dp, cl = statistics.median(rates[(pol, "device-plugin")]), statistics.median(rates[(pol, "claims")])
        print(f"  {pol:<8} device-plugin {dp:7.0f} decisions/s   claims {cl:7.0f} decisions/s   ratio {dp / cl:.2f}x"
              f"   (placed {placed[(pol, 'device-plugin')]} / {placed[(pol, 'claims')]}; runs dp "
              + ", ".join(f"{x:.0f}" for x in rates[(pol, 'device-plugin')]) + "; claims " + ", ".join(f"{x:.0f}" for x in rates[(pol, 'claims')]) + ")")
        out.append({"policy": pol, "device_plugin_per_s": dp, "claims_per_s": cl, "ratio": dp / cl,
                    "runs": {k[1]: v for k, v in rates.items() if k[0] == pol}})
    if args.json:
        Path(args.json).write_text(json.dumps({"nodes": args.nodes, "pods": args.pods, "rounds": args.rounds, "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_dra.py", main))
