"""The engine benchmark's trace mix alone, several rounds in one process: decisions per CPU second of each round.

Why: ``bench_kube_loop.py --engine-only`` times both clusters once per process; to compare two commits on a
loaded machine, the best of many rounds (load only ever adds time) from alternating processes says more than one
median, and ``--rounds 0`` (the warm-up and the clusters only) is the baseline to subtract from an instruction
count (``valgrind --tool=cachegrind --cache-sim=no``) of a run with rounds.  The same clusters, pods, warm-up and
timed loop as ``bench_kube_loop.engine_bench``'s trace mix.

    python bench/engine_rounds.py [--nodes 5000] [--rounds 5] [--policy default] [--reference]

``--reference`` times issue 39's reference, ``sum(range(1000))`` as ``python -m timeit`` does (the best of five
repeats of enough loops for 0.2 s), in this process right before and right after each round, and scales the round
to a 20 us reference by the mean of the two: the issue's scaling, with the reference taken in the same seconds as
the round rather than once a sitting (the cores' speed moves by a third from one minute to the next).
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
    ap.add_argument("--reference", action="store_true", help="scale each round to a 20 us sum(range(1000))")
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
        before = reference_us() if args.reference else 0.0
        c0 = time.process_time()
        for r in tpods:
            s.schedule(r)
        rate = len(tpods) / max(time.process_time() - c0, 1e-9)
        print(f"trace mix, {args.nodes} nodes, {args.policy}: {rate:.0f} decisions per CPU second", flush=True)
        if args.reference:
            after = reference_us()
            ref = (before + after) / 2
            print(f"  reference {ref:.2f} us (before {before:.2f}, after {after:.2f}): {rate * ref / 20:.0f} at 20 us")
            print(f"FIGURE trace_mix_at_20us {rate * ref / 20:.1f}", flush=True)


def reference_us() -> float:
    """``python -m timeit "sum(range(1000))"``'s figure, in microseconds: the best of five repeats, each of the
    loop count (1, 2, 5, 10, 20, ...) that first takes 0.2 s."""
    import timeit

    t = timeit.Timer("sum(range(1000))")
    loops, _ = t.autorange()
    return min(t.repeat(repeat=5, number=loops)) / loops * 1e6


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("engine_rounds.py", main))
