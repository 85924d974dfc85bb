"""The main job's packing runs alone, one after another in this process, each timed in CPU seconds.

Why: ``gpufleet simulate`` (issue 39, deliverable 3) spends most of its time in seven such runs spread over its
workers, and the whole command's time on shared cores swings more than a change to the engine moves them; timed
alone (the trace read and scipy imported first, not counted) they show it.  ``FIGURE <policy>_cpu_s`` lines for
``bench/side_by_side.py``; the other lines (each run's unallocated GPU % and failed pods) for ``--same-stdout``:

    PYTHONPATH=src python bench/packing_runs.py default bestfit
    python bench/side_by_side.py OLD NEW --rounds 3 --same-stdout -- python $PWD/bench/packing_runs.py default bestfit
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import scipy.optimize  # noqa: F401  every run's keep-first LP: imported before the clock starts

    from gpufleet.cli import simulate
    from gpufleet.cli.main import Parser
    from gpufleet.simulator.experiments import packing
    from gpufleet.simulator.traces import trace as tracemod

    ap = Parser(prog="packing_runs.py", description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="policy names (each run seed 42, tune 1.3, as the main job's)")
    args = ap.parse_args()
    nl, _read, tr, _bad = simulate._load_all(str(tracemod.bundled(tracemod.DEFAULT_NODES)),
                                            str(tracemod.bundled(tracemod.DEFAULT_PODS)), False)
    for pol in args.policies:
        t = time.process_time()
        r = packing.run_packing(nl.nodes, tr.pods, pol, seed=42, tune=1.3, trace_name="openb_pod_list_default")
        spent = time.process_time() - t
        print(f"{pol}: unallocated GPU {r.unallocated_gpu_pct}%, failed pods {r.pods_failed}")
        print(f"FIGURE {pol}_cpu_s {spent:.3f}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("packing_runs.py", main))
