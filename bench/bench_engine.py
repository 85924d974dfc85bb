"""Engine benchmark: per-pod decision time per policy on the real Alibaba cluster.

Builds the 1,213-node / 6,212-GPU cluster of the bundled trace, then schedules
the default pod list (8,152 pods, in trace order, nothing leaves) with each
policy through ``Scheduler.schedule`` and prints the median and p99 time of one
scheduling cycle (filter + score + GPU selection + reserve).  It also times one
full packing run (tune 1.3, seed 42) per policy, the issue's <= 20 s target.

Policies run side by side in one process, alternating, so machine noise hits
them alike; quote ratios and medians.

    python bench/bench_engine.py [--policies fgd,bestfit] [--repeat 3] [--no-packing]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from gpufleet.engine.framework import Scheduler
from gpufleet.engine.state import ClusterState
from gpufleet.policies import build_profile, policy_names
from gpufleet.simulator.traces import trace
from gpufleet.simulator.experiments.packing import prime_policy, run_packing


def decision_times(policy: str, nodes, pods) -> np.ndarray:
    state = ClusterState(nodes)
    sched = Scheduler(build_profile(policy), state, seed=42)
    reqs = [p.request() for p in pods]
    prime_policy(sched, reqs)
    out = np.empty(len(reqs))
    for i, r in enumerate(reqs):
        t0 = time.perf_counter()
        sched.schedule(r)
        out[i] = (time.perf_counter() - t0) * 1000.0
    return out


def main() -> None:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser
    from gpufleet.cli.simulate import parse_policies

    ap = Parser(prog="bench_engine.py", description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(policy_names()))
    ap.add_argument("--repeat", type=int_range(1), default=3, help="rounds; each round runs every policy once (default 3)")
    ap.add_argument("--no-packing", action="store_true", help="skip the full packing-run timing")
    ap.add_argument("--pods", help="pod list CSV instead of the bundled default (e.g. one written by bench/variants.py write)")
    args = ap.parse_args()
    pols = parse_policies(args.policies)  # gpufleet simulate's check: one line, exit 2 (run_script)
    if args.pods and not Path(args.pods).is_file():
        ap.error(f"--pods: {args.pods}: no such file")
    nodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    pods = trace.load_pods(args.pods or trace.bundled(trace.DEFAULT_PODS)).pods
    print(f"cluster: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs; {len(pods)} pods; {args.repeat} round(s)")
    times: dict[str, list[np.ndarray]] = {p: [] for p in pols}
    walls: dict[str, list[float]] = {p: [] for p in pols}
    for _ in range(args.repeat):
        for p in pols:
            times[p].append(decision_times(p, nodes, pods))
            if not args.no_packing:
                walls[p].append(run_packing(nodes, pods, p, seed=42, tune=1.3).wall_s)
    ref = "fgd" if "fgd" in pols else pols[0]
    ref_med = float(np.median([np.median(t) for t in times[ref]]))
    print(f"{'policy':<12} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} {'vs ' + ref:>8} {'packing run s':>14}")
    for p in pols:
        med = float(np.median([np.median(t) for t in times[p]]))
        p99 = float(np.median([np.percentile(t, 99) for t in times[p]]))
        mx = float(np.median([t.max() for t in times[p]]))
        wall = f"{np.median(walls[p]):.1f}" if walls[p] else "-"
        print(f"{p:<12} {med:>10.3f} {p99:>8.3f} {mx:>8.1f} {med / ref_med:>7.2f}x {wall:>14}")


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_engine.py", main))
