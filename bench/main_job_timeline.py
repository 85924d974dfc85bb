"""The main job (``gpufleet simulate``) once, with each worker's tasks on a timeline: where its wall clock goes.

Why: the main job runs seven packing runs and the offline bound's MIP in worker processes, so its wall clock is
the parent's start-up (one core busy), the workers' makespan, and the parent's report after the last task.  Two
questions decide what to work on: is a core idle while the other works (the order the tasks go to the workers,
the last task's tail), or is the command simply its CPU seconds over the cores?  This script answers them for one
run: it times every task inside its worker (wall start and end from this process's start, CPU seconds) and
prints, per worker, its tasks in order, then

* the start-up: this process's start to the first task's start (Python, the imports, reading the trace; the
  interpreter's own start before this script's first line is not counted);
* the makespan: the first task's start to the last one's end, against the workers' CPU seconds over their number
  (what it would be with no core ever idle and no other process on the machine);
* the tail: the last task's end less the other workers' last ends (one core idle meanwhile; where the first offline
  bound has a process of its own, three workers share two cores: from when one worker is left);
* the end: the last task's end to the report written.

    PYTHONPATH=src python bench/main_job_timeline.py                 # the README's command, as main_job.py runs it
    PYTHONPATH=src python bench/main_job_timeline.py --seeds 42-43   # any other ``gpufleet simulate`` arguments
    PYTHONPATH=src python bench/main_job_timeline.py --mip-rel-gap 0.0015   # what if the MIP stopped at that gap

``--mip-rel-gap``: HiGHS's relative gap for every MIP of the run (its default: 1e-4), set in this process before
the workers fork; the bound printed stays the MIP's dual bound, the best placement found (its %, the gap and the
pods it leaves out) is whatever HiGHS has when it stops.  A question for a decision, not a setting of the command.

It patches ``gpufleet.cli.simulate``'s worker functions before the pool forks its workers, so it needs the ``fork``
start method (Linux's default); the output and the JSON are the command's own.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import json  # noqa: E402  after the clock starts: this script's start is the command's
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402


def _timeit() -> str:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(1000))"], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def _timed(fn: Callable[[dict], dict], what: str, log: str) -> Callable[[dict], dict]:
    """``fn`` with its wall span and CPU seconds appended to ``log`` (one JSON line per task, from its worker)."""

    def task(t: dict) -> dict:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(t)
        finally:
            line = {"pid": os.getpid(), "task": what if what == "bound" else t["policy"], "seed": t["seed"],
                    "start": start - _T0, "end": time.perf_counter() - _T0, "cpu": time.process_time() - cpu}
            with open(log, "a") as f:
                f.write(json.dumps(line) + "\n")

    # pickled by reference: the workers find this function under the original's name
    task.__name__ = task.__qualname__ = fn.__name__
    task.__module__ = fn.__module__
    return task


def _set_mip_rel_gap(gap: float) -> None:
    """Every HiGHS solve of this process and of the workers it forks gets ``mip_rel_gap = gap`` (LPs ignore it)."""
    from highspy import _core as h

    class Highs(h._Highs):
        def passOptions(self, options: Any) -> Any:
            options.mip_rel_gap = gap
            return super().passOptions(options)

    h._Highs = Highs  # bounds/bound.py looks it up at each solve


def main() -> int:
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=False) != "fork":
        print("main_job_timeline.py: needs the fork start method (the workers must inherit the timed tasks)",
              file=sys.stderr)
        return 2
    from gpufleet.cli import simulate
    from gpufleet.cli.main import main as cli_main

    args = sys.argv[1:]
    if "--mip-rel-gap" in args:
        i = args.index("--mip-rel-gap")
        try:
            gap = float(args[i + 1])
        except (IndexError, ValueError):
            print("main_job_timeline.py: --mip-rel-gap needs a number (HiGHS's mip_rel_gap, e.g. 0.0015)", file=sys.stderr)
            return 2
        del args[i:i + 2]
        _set_mip_rel_gap(gap)

    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "tasks.jsonl")
        Path(log).touch()
        simulate._run_one = _timed(simulate._run_one, "run", log)  # type: ignore[assignment]
        simulate._bound_one = _timed(simulate._bound_one, "bound", log)  # type: ignore[assignment]
        argv = ["simulate", "--no-progress", "--json", str(Path(tmp) / "out.json"),
                "--report", str(Path(tmp) / "report.html"), *args]
        rc = cli_main(argv)
        done = time.perf_counter() - _T0
        parent_cpu = time.process_time()
        tasks: list[dict[str, Any]] = [json.loads(x) for x in Path(log).read_text().splitlines()]
    if rc or not tasks:
        return rc or 1
    print("\ntimeit:", _timeit(), file=sys.stderr)
    for line in summary(tasks, done, parent_cpu):
        print(line, file=sys.stderr)
    return 0


def summary(tasks: list[dict[str, Any]], done_s: float, parent_cpu_s: float, cores: int | None = None) -> list[str]:
    """The timeline's lines: each worker's tasks (``pid``, ``task``, ``start``/``end`` wall seconds from the
    process's start, ``cpu`` seconds), then the start-up, the makespan against the CPU seconds over the workers (or
    the ``cores``, default this machine's, where there are more workers: the first offline bound has a process of its
    own), the tail (from the moment fewer workers than that are left) and the end (``done_s``: when the command
    returned)."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for t in sorted(tasks, key=lambda t: t["start"]):
        by_pid.setdefault(t["pid"], []).append(t)
    first = min(t["start"] for t in tasks)
    ends = sorted(ts[-1]["end"] for ts in by_pid.values())
    cpu = sum(t["cpu"] for t in tasks)
    out = []
    for n, ts in enumerate(by_pid.values(), start=1):
        row = ", ".join(f"{t['task']} {t['start']:.2f}-{t['end']:.2f} ({t['cpu']:.2f} CPU)" for t in ts)
        out.append(f"worker {n}: {sum(t['cpu'] for t in ts):.2f} CPU s: {row}")
    workers = min(len(by_pid), cores or os.cpu_count() or 1)
    out.append(f"start-up (this script's start to the first task): {first:.2f} s wall; the parent's CPU in all "
               f"{parent_cpu_s:.2f} s; the parent and the workers {parent_cpu_s + cpu:.2f} CPU s")
    out.append(f"makespan: {ends[-1] - first:.2f} s wall; the workers' CPU {cpu:.2f} s over {workers}: "
               f"{cpu / workers:.2f} s")
    out.append(f"tail: the last task ends {ends[-1] - ends[-workers]:.2f} s after "
               + ("the first worker's last" if workers == len(by_pid) else f"the first of the last {workers} workers to finish"))
    out.append(f"end (the last task to the command's return): {done_s - ends[-1]:.2f} s; all of it {done_s:.2f} s wall")
    return out


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("main_job_timeline.py", main))
