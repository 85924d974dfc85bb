"""Engine decisions/s at 5,000 nodes with kube-scheduler's pod-to-pod constraints.

Side by side in one process, rounds alternating (quote medians and ratios):

* ``plain/without``: the default profile minus the pod-to-pod plugins (main
  before issue 13), pods with labels but no terms;
* ``plain/with``: the shipped default profile, same pods: what pods without
  such terms pay for the new plugins (goal: nothing; >= 2,000 decisions/s);
* ``required-anti``: replicas of 10 apps, each with required hostname
  anti-affinity to its own app (goal >= 300 decisions/s);
* ``preferred-anti``: the same with preferred anti-affinity (weight 100);
* ``spread``: replicas of 10 apps spread over 3 zones with maxSkew 1.

    python bench/bench_pod_constraints.py [--nodes 5000] [--pods 2000] [--rounds 3] [--policy default]
"""

from __future__ import annotations

import statistics
import sys
import time

from gpufleet.engine.constraints import (
    LabelSelector,
    PodAffinityTerm,
    PodTerms,
    SpreadConstraint,
)
from gpufleet.engine.framework import Scheduler
from gpufleet.engine.model import Gpu, Node, PodRequest
from gpufleet.engine.state import ClusterState
from gpufleet.kube.loop import KUBE_SCHEDULER_HANDLES, without_plugins
from gpufleet.policies import build_profile
from gpufleet.simulator.experiments.packing import prime_policy

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def nodes(n: int) -> list[Node]:
    return [Node(f"n{i}", 128_000, 1_048_576, tuple(Gpu(j, f"g{i}-{j}", "A100", 81920) for j in range(8)),
                 labels={HOST: f"n{i}", ZONE: f"zone-{i % 3}"}, max_pods=110) for i in range(n)]


def pods(kind: str, count: int) -> list[PodRequest]:
    out = []
    for i in range(count):
        app = f"app-{i % 10}"
        sel = LabelSelector((("app", app),))
        term = PodAffinityTerm(sel, HOST, frozenset(("default",)))
        t = PodTerms(labels={"app": app})
        if kind == "required-anti":
            t = PodTerms(labels={"app": app}, anti_affinity=(term,))
        elif kind == "preferred-anti":
            t = PodTerms(labels={"app": app}, preferred_anti_affinity=(PodAffinityTerm(sel, HOST, frozenset(("default",)), weight=100),))
        elif kind == "spread":
            t = PodTerms(labels={"app": app}, spread=(SpreadConstraint(1, ZONE, "DoNotSchedule", sel),))
        out.append(PodRequest(name=f"{kind}-{i}", cpu_milli=2000, memory_mib=8192, gpu_count=1,
                              gpu_milli=[1000, 250, 500][i % 3], labels=(("app", app),), terms=t))
    return out


def main() -> None:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_pod_constraints.py")
    ap.add_argument("--nodes", type=int_range(1), default=5000)
    ap.add_argument("--pods", type=int_range(1), default=2000)
    ap.add_argument("--rounds", type=int_range(1), default=3)
    ap.add_argument("--policy", default="default")
    a = ap.parse_args()
    cluster = nodes(a.nodes)
    full = build_profile(a.policy)
    runs = {
        "plain/without": (without_plugins(build_profile(a.policy), KUBE_SCHEDULER_HANDLES), "plain"),
        "plain/with": (full, "plain"),
        "required-anti": (full, "required-anti"),
        "preferred-anti": (full, "preferred-anti"),
        "spread": (full, "spread"),
    }
    reqs = {k: pods(k, a.pods) for k in ("plain", "required-anti", "preferred-anti", "spread")}
    rates: dict[str, list[float]] = {}
    placed: dict[str, int] = {}
    for _ in range(a.rounds):
        for name, (profile, kind) in runs.items():
            s = Scheduler(profile, ClusterState(cluster), seed=0)
            prime_policy(s, reqs[kind])
            t0 = time.perf_counter()
            ok = sum(1 for r in reqs[kind] if s.schedule(r).ok)
            rates.setdefault(name, []).append(len(reqs[kind]) / (time.perf_counter() - t0))
            placed[name] = ok
    print(f"engine at {a.nodes} nodes, policy {a.policy}, {a.pods} decisions per run, median of {a.rounds} round(s):")
    for name, v in rates.items():
        print(f"  {name:<15} {statistics.median(v):7.0f} decisions/s  placed {placed[name]}/{a.pods}"
              f"  (runs: {', '.join(f'{x:.0f}' for x in v)})")
    base = statistics.median(rates["plain/without"])
    print(f"  plain/with vs plain/without: {statistics.median(rates['plain/with']) / base:.2f}x")


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_pod_constraints.py", main))
