"""Replay speed (issue 16's targets), on the bundled openb trace through the real CLI code path.

1) One run per policy at one load (default 1.0): the full bundled trace replayed through
   ``run_replay`` (the same code as ``gpufleet simulate --experiment replay --load``), wall time
   per run; target <= 30 s per policy on 2 cores.
2) The sweep: every default policy x 4 loads (0.6, 0.8, 1.0, 1.2) with ``--jobs 2`` through
   ``gpufleet simulate`` itself (JSON and HTML report written); target <= 5 minutes.

The machine is shared and noisy: run it under ``nice`` and read the single-run times beside the
sweep.  Prints the delay-versus-load table the sweep produced.

    nice -n 10 python bench/bench_replay.py [--load 1.0] [--policies default,fgd,bestfit] [--skip-sweep] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from gpufleet.cli.main import main as cli
from gpufleet.cli.simulate import default_policies
from gpufleet.simulator.traces import trace
from gpufleet.simulator.experiments.replay import run_replay
from gpufleet.simulator.traces.workload import workload_from_trace


def single(policies: list[str], load: float, rounds: int) -> dict[str, float]:
    nodes = trace.load_nodes(trace.bundled(trace.DEFAULT_NODES))
    pods = trace.load_pods(trace.bundled(trace.DEFAULT_PODS)).pods
    wl = workload_from_trace(pods)
    gpus = sum(len(n.gpus) for n in nodes)
    copies = wl.copies_for(1.2, gpus)  # the sweep's passes, so the timing is the sweep's
    out = {}
    for pol in policies:
        ts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            r = run_replay(nodes, wl, pol, load=load, copies=copies)
            ts.append(time.perf_counter() - t0)
        out[pol] = statistics.median(ts)
        print(f"single run  {pol:<10} load {load:g}: {out[pol]:6.1f} s  ({r.pods_arrived} pods, p99 wait {r.queue_delay_s['p99']:.0f} s, "
              f"GPU alloc {r.mean_gpu_alloc_pct:.1f}%)  target <= 30 s: {'ok' if out[pol] <= 30 else 'MISSED'}", flush=True)
    return out


def sweep(jobs: int) -> float:
    pols = default_policies()
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "sweep.json")
        t0 = time.perf_counter()
        rc = cli(["simulate", "--experiment", "replay", "--load", "0.6,0.8,1.0,1.2", "--policy", ",".join(pols), "--jobs", str(jobs),
                  "--json", js, "--report", os.path.join(d, "report.html"), "--no-progress"])
        wall = time.perf_counter() - t0
        assert rc == 0
        with open(js) as f:
            doc = json.load(f)
    for r in doc["summary"]:
        print(f"  {r['policy']:<10} load {r['load']:<4g} GPU alloc {r['gpu_alloc_pct']:5.1f}%  wait p50 {r['delay_p50_s']:7.1f} s  p99 {r['delay_p99_s']:7.1f} s  ({r['wall_s']:.1f} s)")
    print(f"sweep: {len(pols)} policies x 4 loads, --jobs {jobs}: {wall:.1f} s  target <= 300 s: {'ok' if wall <= 300 else 'MISSED'}")
    return wall


def main() -> None:
    from gpufleet.argtypes import float_range, int_range
    from gpufleet.cli.main import Parser

    ap = Parser(prog="bench_replay.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", type=float_range(0, lo_open=True), default=1.0)
    ap.add_argument("--policies", default="default,fgd,bestfit")
    ap.add_argument("--rounds", type=int_range(1), default=1)
    ap.add_argument("--jobs", type=int_range(1), default=2)
    ap.add_argument("--skip-sweep", action="store_true")
    a = ap.parse_args()
    single([p for p in a.policies.split(",") if p], a.load, a.rounds)
    if not a.skip_sweep:
        sweep(a.jobs)


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("bench_replay.py", main))
