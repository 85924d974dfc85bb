"""Where one replay of the sweep spends its CPU time: the engine's cycles, the retry passes around them, the
"could it fit" screen, the samples over time, the engine's observe/forget, the set-up outside the event loop, and
the rest (arrivals, departures, books).

Why: the replay sweep of docs/replay.md (issue 39, deliverable 5) is twelve such replays; what is not the
engine's cycles is the replay's own (``engine/pending.py``'s retry pass, ``simulator/experiments/replay.py``).
Each part is timed in CPU seconds by wrapping it (``time.process_time``), so the parts add up to a little more
than an unwrapped run; one replay at the sweep's copies (three passes of the bundled trace), ``FIGURE`` lines for
``bench/side_by_side.py``:

    PYTHONPATH=src python bench/replay_phases.py default 1.0
    PYTHONHASHSEED=0 PYTHONPATH=src valgrind --tool=cachegrind --cache-sim=no python3 bench/replay_phases.py default 1.0 --untimed
    python bench/side_by_side.py OLD NEW --rounds 3 --same-stdout -- python $PWD/bench/replay_phases.py bestfit 1.0

(the script by its full path: an old checkout may not have it; it times whichever checkout's code it is run with).
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main() -> int:
    from gpufleet.argtypes import float_range
    from gpufleet.cli import replay_cli
    from gpufleet.cli.main import Parser
    from gpufleet.engine import framework, pending

    ap = Parser(prog="replay_phases.py", description=__doc__.split("\n")[0])
    ap.add_argument("policy")
    ap.add_argument("load", type=float_range(0.01, 10))
    ap.add_argument("--untimed", action="store_true",
                    help="run the replay with no part wrapped (for an instruction count: valgrind --tool=cachegrind)")
    args = ap.parse_args()
    from gpufleet.simulator.experiments import replay, replay_metrics

    if args.untimed:
        return _untimed(args.policy, args.load)

    spent = {"schedule": 0.0, "retry": 0.0, "retry_tries": 0.0, "could_fit": 0.0, "samples": 0.0, "observe": 0.0,
             "forget": 0.0, "loop": 0.0}

    def timed(owner: Any, name: str, part: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return inner(*a, **kw)
            finally:
                spent[part] += time.process_time() - t
        setattr(owner, name, wrapper)

    timed(framework.Scheduler, "schedule", "schedule")
    timed(framework.Scheduler, "observe", "observe")
    timed(framework.Scheduler, "forget", "forget")
    timed(replay._Replay, "run", "loop")
    sample = replay_metrics.sample

    def sample_timed(*a: Any) -> None:
        t = time.process_time()
        try:
            sample(*a)
        finally:
            spent["samples"] += time.process_time() - t
    replay_metrics.sample = sample_timed  # type: ignore[assignment]
    replay.sample = sample_timed  # type: ignore[assignment]
    screen = getattr(pending, "FitScreen", None)  # older commits call pending.could_fit
    if screen is not None:
        timed(screen, "__call__", "could_fit")
    else:
        timed(replay, "could_fit", "could_fit")
    retry = pending.PendingGroups.retry

    def retry_timed(self: Any, rnd: Any, now: float, attempt: Any, *waited: Any) -> None:
        def tried(*a: Any) -> Any:
            t = time.process_time()
            try:
                return attempt(*a)
            finally:
                spent["retry_tries"] += time.process_time() - t
        t = time.process_time()
        try:
            retry(self, rnd, now, tried, *waited)
        finally:
            spent["retry"] += time.process_time() - t
    pending.PendingGroups.retry = retry_timed  # type: ignore[method-assign,assignment]

    task = _task(args.policy, args.load)
    copies = task["copies"]
    t0 = time.process_time()
    r = replay_cli.run_one(task)
    total = time.process_time() - t0
    print(f"{args.policy} at load {args.load:g}, {copies} passes: p50 {r['queue_delay_s']['p50']} s, p99 "
          f"{r['queue_delay_s']['p99']} s, GPU allocation {r['mean_gpu_alloc_pct']}%, never placed {r['pods_never_placed']}")
    print(f"FIGURE run_cpu_s {total:.3f}")
    print(f"FIGURE engine_cycles_cpu_s {spent['schedule']:.3f}")
    print(f"FIGURE retry_outside_cycles_cpu_s {spent['retry'] - spent['retry_tries']:.3f}")
    print(f"FIGURE could_fit_cpu_s {spent['could_fit']:.3f}")
    print(f"FIGURE samples_cpu_s {spent['samples']:.3f}")  # the curves over time (fragmentation: frag_amount)
    print(f"FIGURE observe_forget_cpu_s {spent['observe'] + spent['forget']:.3f}")  # the engine's, per arrival/departure
    print(f"FIGURE setup_cpu_s {total - spent['loop']:.3f}")  # pacing, groups, profile, summary: the run outside its loop
    return 0


def _task(policy: str, load: float) -> dict[str, Any]:
    """One run of the sweep as its worker gets it: the bundled trace at the sweep's copies."""
    from gpufleet.cli import replay_cli
    from gpufleet.simulator.traces import trace as tracemod
    from gpufleet.simulator.traces.workload import DEFAULT_WARMUP, workload_from_trace

    pods = str(tracemod.bundled(tracemod.DEFAULT_PODS))
    nodes, tr, _kind = replay_cli._load(None, pods, False, 1.0)
    ref = sum(len(n.gpus) for n in nodes)
    copies = workload_from_trace(tr.pods, tr.name).copies_for(1.2, ref, DEFAULT_WARMUP)  # the sweep's highest load
    return {"nodes": None, "pods": pods, "skip": False, "cluster_size": 1.0, "warmup": DEFAULT_WARMUP, "queues": None,
            "team_column": None, "priority_column": None, "no_preemption": False, "copies": copies, "speedup": 1.0,
            "policy": policy, "seed": 42, "load": load, "what_if": []}


def _untimed(policy: str, load: float) -> int:
    """The same replay, nothing wrapped: its figures and the process's CPU seconds."""
    from gpufleet.cli import replay_cli

    task = _task(policy, load)
    t0 = time.process_time()
    r = replay_cli.run_one(task)
    print(f"{policy} at load {load:g}, {task['copies']} passes: p50 {r['queue_delay_s']['p50']} s, p99 {r['queue_delay_s']['p99']} s")
    print(f"FIGURE run_cpu_s {time.process_time() - t0:.3f}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("replay_phases.py", main))
