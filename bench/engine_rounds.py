"""The engine benchmark's trace mix alone, several rounds in one process: decisions per CPU second of each round.

Why: ``bench_kube_loop.py --engine-only`` times both clusters once per process; to compare two commits on a
loaded machine, the best of many rounds (load only ever adds time) from alternating processes says more than one
median, and ``--rounds 0`` (the warm-up and the clusters only) is the baseline to subtract from an instruction
count (``valgrind --tool=cachegrind --cache-sim=no``) of a run with rounds.  The same clusters, pods, warm-up and
timed loop as ``bench_kube_loop.engine_bench``'s trace mix.

    python bench/engine_rounds.py [--nodes 5000] [--rounds 5] [--policy default]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile
from gpufleet.simulator.experiments.packing import prime_policy
from gpufleet.simulator.traces import trace


def main() -> None:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="engine_rounds.py")
    ap.add_argument("--nodes", type=int_range(1), default=5000)
    ap.add_argument("--rounds", type=int_range(0), default=5)
    ap.add_argument("--policy", default="default")
    args = ap.parse_args()
    tnodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    tpods = [p.request() for p in trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods[:4000]]
    nodes = [replace(tnodes[i % len(tnodes)], name=f"t{i}") for i in range(args.nodes)]
    warm = Scheduler(build_profile(args.policy), ClusterState(nodes[:200]), seed=0)  # imports, numpy's first calls
    for r in tpods[:200]:
        warm.schedule(r)
    for _ in range(args.rounds):
        s = Scheduler(build_profile(args.policy), ClusterState(nodes), seed=0)
        prime_policy(s, tpods)
        c0 = time.process_time()
        for r in tpods:
            s.schedule(r)
        print(f"trace mix, {args.nodes} nodes, {args.policy}: {len(tpods) / max(time.process_time() - c0, 1e-9):.0f} "
              "decisions per CPU second", flush=True)


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("engine_rounds.py", main))
