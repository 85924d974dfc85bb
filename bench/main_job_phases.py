"""Where the main job's time goes: its parts one after another in this process, CPU and wall seconds each.

``gpufleet simulate`` runs these parts in worker processes, so its whole-process time is about the parent's
start-up, plus the sum of the runs and the bound's MIP over the workers, plus the report; this script times
each part alone (one process, nothing in parallel), with ``python -m timeit "sum(range(1000))"`` beside it:

    PYTHONPATH=src python bench/main_job_phases.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, Callable

_T0 = (time.process_time(), time.perf_counter())


def _timeit() -> str:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(1000))"], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def main() -> int:
    rows: list[tuple[str, float, float]] = []

    def timed(label: str, fn: Callable[[], Any]) -> Any:
        c, w = time.process_time(), time.perf_counter()
        out = fn()
        rows.append((label, time.process_time() - c, time.perf_counter() - w))
        return out

    def start_up() -> Any:
        from gpufleet.cli import main as cli

        cli.build_parser("simulate")
        from gpufleet.cli import simulate

        return simulate

    simulate = timed("start-up: the CLI, numpy, the engine", start_up)
    timed("import: scipy.optimize, the experiment, the bounds", lambda: simulate._import_for_workers("packing"))
    from gpufleet.simulator.traces import trace as tracemod

    nl, _read, tr, _bad = timed("read the trace", lambda: simulate._load_all(
        str(tracemod.bundled(tracemod.DEFAULT_NODES)), str(tracemod.bundled(tracemod.DEFAULT_PODS)), False))
    from gpufleet.simulator.bounds import bound as boundmod
    from gpufleet.simulator.experiments import packing

    keep_first = boundmod.bound_placing_first
    lp = [0.0, 0.0]

    def timed_lp(*a: Any, **kw: Any) -> Any:
        c, w = time.process_time(), time.perf_counter()
        try:
            return keep_first(*a, **kw)
        finally:
            lp[0] += time.process_time() - c
            lp[1] += time.perf_counter() - w

    boundmod.bound_placing_first = timed_lp
    runs = []
    for pol in simulate.default_policies():
        lp[:] = [0.0, 0.0]
        def one(pol: str = pol) -> dict:
            return packing.run_packing(nl.nodes, tr.pods, pol, seed=42, tune=1.3, trace_name="openb_pod_list_default").to_json()

        runs.append(timed(f"run {pol}", one))
        rows.append(("  of which its keep-first LP bound", lp[0], lp[1]))
    boundmod.bound_placing_first = keep_first
    b = timed("offline bound (the MIP)", lambda: boundmod.offline_bound(nl.nodes, tr.pods, seed=42, tune=1.3).to_json())

    def report() -> None:
        import tempfile
        from pathlib import Path

        summary = simulate.summarize(runs)
        with tempfile.TemporaryDirectory() as tmp:
            rp = timed("  import the report", lambda: __import__("gpufleet.simulator.report.packing",
                                                                                fromlist=["x"]))
            rp.write_simulation_report(str(Path(tmp) / "r.html"), "packing", runs, summary, {}, b["unallocated_gpu_pct"],
                                       {}, bound_note="")

    timed("report (summary, plots, HTML)", report)
    print("timeit before:", _timeit())
    print(f"{'part':<52} {'CPU s':>7} {'wall s':>7}")
    for label, c, w in rows:
        print(f"{label:<52} {c:7.2f} {w:7.2f}")
    total = (time.process_time() - _T0[0], time.perf_counter() - _T0[1])
    print(f"{'all of it, one after another':<52} {total[0]:7.2f} {total[1]:7.2f}")
    print("timeit after:", _timeit())
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("main_job_phases.py", main))
