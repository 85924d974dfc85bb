"""Live-scheduler throughput against the in-process fake API server, and engine decisions/s at 5,000 nodes.

1) 1,000 fake nodes x 8 GPUs, 3,000 pending pods (single-GPU and fractional):
   time from the first list to the last bind through ``SchedulerLoop`` (the
   same code as ``gpufleet scheduler``, minus the network), once with inline
   binds and once with 16 bind workers against a fake API that takes
   ``--latency-ms`` per call (a round trip to a real apiserver).
   ``bench_kube_apiserver.py`` measures the real thing.
2) The engine alone at 5,000 nodes: decisions/s of default, fgd and bestfit,
   side by side, on uniform A100 nodes and on the Alibaba node mix (see
   ``engine_bench``), and the memory it took (``--engine-nodes 15000`` for the 15,000-node figure).

    python bench/bench_kube_loop.py [--nodes 1000] [--pods 3000] [--policy default] [--engine-only] [--rounds 3]
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet import native
from gpufleet.kube.loop import SchedulerLoop
from gpufleet.policies import build_profile
from gpufleet.simulator.traces import trace
from gpufleet.simulator.experiments.packing import prime_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: the fake API server lives in its tests
from tests.kube.fake_api import FakeApi  # noqa: E402

def node(i: int) -> dict:
    return {"metadata": {"name": f"node-{i:05d}", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}},
            "spec": {}, "status": {"allocatable": {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"}}}


def pod(i: int) -> dict:
    ann = {"gpufleet.io/gpu-milli": str([250, 500, 300][i % 3])} if i % 2 else {}
    return {"metadata": {"name": f"p{i:06d}", "namespace": "bench", "annotations": ann},
            "spec": {"schedulerName": "gpufleet", "containers": [{"name": "c", "resources": {
                "requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}}]}}


def main() -> None:
    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_kube_loop.py")
    ap.add_argument("--nodes", type=int_range(1), default=1000)
    ap.add_argument("--pods", type=int_range(1), default=3000)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--engine-nodes", type=int_range(1), default=5000)
    ap.add_argument("--latency-ms", type=float_range(0), default=1.5)
    ap.add_argument("--engine-policies", default="default,fgd,bestfit")
    ap.add_argument("--rounds", type=int_range(1), default=3)
    ap.add_argument("--engine-only", action="store_true")
    ap.add_argument("--figures", action="store_true", help="also print FIGURE lines (bench/side_by_side.py reads them)")
    args = ap.parse_args()
    for workers, latency_s in (() if args.engine_only else ((0, 0.0), (16, args.latency_ms / 1000))):
        api = FakeApi()
        for i in range(args.nodes):
            api.add_node(node(i))
        for i in range(args.pods):
            api.add_pod(pod(i))
        api.call_latency_s = latency_s
        t0 = time.perf_counter()
        loop = SchedulerLoop(api, build_profile(args.policy), bind_workers=workers, event_thread=workers > 0)
        loop.resync()
        while loop.queue.pending or loop.binder.binding:
            loop.binder.drain()
            if loop.schedule_due() == 0 and not loop.binder.binding:
                break
        loop.close()
        dt = time.perf_counter() - t0
        mode = f"{workers} bind workers, {latency_s * 1000:.1f} ms per API call" if workers else "inline binds, no latency"
        print(f"loop: {len(api.binds)} of {args.pods} pods bound on {args.nodes} nodes in {dt:.2f} s = {len(api.binds) / dt:.0f} pods/s ({args.policy}; {mode})")
        if args.figures:
            print(f"FIGURE loop-{'workers' if workers else 'inline'}-pods-per-s {len(api.binds) / dt:.1f}")

    engine_bench(args.engine_nodes, [p for p in args.engine_policies.split(",") if p], args.rounds, args.figures)


def engine_bench(n_nodes: int, policies: list[str], rounds: int, figures: bool = False) -> None:
    """Decisions/s of ``Scheduler.schedule`` at ``n_nodes`` nodes, policies alternating in one process.

    Two clusters: ``uniform`` (8 x A100 nodes, single-GPU and fractional pods:
    the live benchmark's shapes) and ``trace`` (the Alibaba node list repeated
    to ``n_nodes``, mixed models and sizes, the first 4,000 trace pods in order,
    CPU-only and multi-GPU ones included).
    """
    tnodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    tpods = [p.request() for p in trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods[:4000]]
    clusters = {
        "uniform": ([Node(f"n{i}", 128_000, 1_048_576, tuple(Gpu(j, f"g{i}-{j}", "A100", 81920) for j in range(8)), max_pods=110)
                     for i in range(n_nodes)],
                    [PodRequest(name=f"e{i}", cpu_milli=2000, memory_mib=8192, gpu_count=1, gpu_milli=[1000, 250, 500][i % 3]) for i in range(4000)]),
        "trace": ([replace(tnodes[i % len(tnodes)], name=f"t{i}") for i in range(n_nodes)], tpods),
    }
    for pol in policies:  # warm-up, not timed: imports, scipy, numpy's first calls
        s = Scheduler(build_profile(pol), ClusterState(clusters["trace"][0][:200]), seed=0)
        for r in tpods[:200]:
            s.schedule(r)
    rates: dict[tuple[str, str], list[float]] = {}
    cpu_rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for cname, (nodes, reqs) in clusters.items():
            for pol in policies:
                s = Scheduler(build_profile(pol), ClusterState(nodes), seed=0)
                prime_policy(s, reqs)  # the paper's FGD is given its target workload; default learns online
                t0, c0 = time.perf_counter(), time.process_time()
                for r in reqs:
                    s.schedule(r)
                rates.setdefault((cname, pol), []).append(len(reqs) / (time.perf_counter() - t0))
                cpu_rates.setdefault((cname, pol), []).append(len(reqs) / max(time.process_time() - c0, 1e-9))
    print(f"engine at {n_nodes} nodes, 4,000 decisions per run, median of {rounds} round(s); per CPU second: "
          f"this process's CPU time, which other processes on the cores do not take")
    print(f"  {native.describe()}")  # the C extension or the numpy paths
    for (cname, pol), v in rates.items():
        c = cpu_rates[(cname, pol)]
        print(f"  {cname:<8} {pol:<8} {statistics.median(v):7.0f} decisions/s, {statistics.median(c):7.0f} per CPU second"
              f"  (runs: {', '.join(f'{x:.0f}' for x in v)})")
        if figures:
            print(f"FIGURE {cname}-{pol}-dps {statistics.median(v):.1f}")
            print(f"FIGURE {cname}-{pol}-cpu-dps {statistics.median(c):.1f}")
    snap = ClusterState(clusters["uniform"][0])
    arrays = sum(v.nbytes for v in vars(snap).values() if isinstance(v, np.ndarray))
    print(f"memory: the uniform cluster's snapshot arrays {arrays / 2**20:.1f} MiB; this process's peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (every cluster, policy and cache above)")
    if figures:
        print(f"FIGURE peak-rss-mib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")

if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_kube_loop.py", main))
