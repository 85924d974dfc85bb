"""The main job's packing runs alone, one after another in this process, each timed in CPU seconds.

Why: ``gpufleet simulate`` (issue 39, deliverable 3) spends most of its time in seven such runs spread over its
workers, and the whole command's time on shared cores swings more than a change to the engine moves them; timed
alone (the trace read and scipy imported first, not counted) they show it.  ``FIGURE <policy>_cpu_s`` lines (and
``<policy>_keep_first_cpu_s``, its keep-first LP bound's part; the first run's includes the LP every later run starts
from) for ``bench/side_by_side.py``; the other lines (each run's unallocated GPU %, failed pods and keep-first bound)
for ``--same-stdout``:

    PYTHONPATH=src python bench/packing_runs.py default bestfit
    python bench/side_by_side.py OLD NEW --rounds 3 --same-stdout -- python $PWD/bench/packing_runs.py default bestfit
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main() -> int:
    import scipy.optimize  # noqa: F401  every run's keep-first LP: imported before the clock starts

    from gpufleet.cli import simulate
    from gpufleet.cli.main import Parser
    from gpufleet.simulator.experiments import packing
    from gpufleet.simulator.traces import trace as tracemod

    ap = Parser(prog="packing_runs.py", description=__doc__.split("\n")[0])
    ap.add_argument("policies", nargs="+", help="policy names (each run seed 42, tune 1.3, as the main job's)")
    args = ap.parse_args()
    from gpufleet.simulator.bounds import bound

    nl, _read, tr, _bad = simulate._load_all(str(tracemod.bundled(tracemod.DEFAULT_NODES)),
                                            str(tracemod.bundled(tracemod.DEFAULT_PODS)), False)
    keep_first = bound.bound_placing_first
    lp_cpu = [0.0]

    def timed_keep_first(*a: Any, **kw: Any) -> Any:  # run_packing imports it from the module at each run
        t = time.process_time()
        try:
            return keep_first(*a, **kw)
        finally:
            lp_cpu[0] += time.process_time() - t

    bound.bound_placing_first = timed_keep_first
    try:  # on stderr: the old and new checkouts' stdout must match (side_by_side --same-stdout)
        from gpufleet import native
        print(native.describe(), file=sys.stderr)
    except ImportError:
        print("native: none in this checkout: numpy path", file=sys.stderr)
    for pol in args.policies:
        lp_cpu[0] = 0.0
        t = time.process_time()
        r = packing.run_packing(nl.nodes, tr.pods, pol, seed=42, tune=1.3, trace_name="openb_pod_list_default")
        spent = time.process_time() - t
        print(f"{pol}: unallocated GPU {r.unallocated_gpu_pct}%, failed pods {r.pods_failed}, "
              f"keep-first bound {r.idle.bound_placing_first_pct if r.idle else None}%")
        print(f"FIGURE {pol}_cpu_s {spent:.3f}")
        print(f"FIGURE {pol}_keep_first_cpu_s {lp_cpu[0]:.3f}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("packing_runs.py", main))
