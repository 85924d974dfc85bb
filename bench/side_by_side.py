"""Time one command in two checkouts side by side: alternating rounds, medians, new / old ratios.

Why: the machines this project is measured on (2 shared cores) change speed by a factor of two and more from
one minute to the next, so a time means something only beside another taken in the same minutes.  Each round
runs the command once in each checkout (the order alternates), with ``PYTHONPATH=<checkout>/src`` and the
checkout as working directory, and records the CPU seconds of the whole process tree (``RUSAGE_CHILDREN``:
workers included; other processes on the cores do not count), the wall seconds, and every ``FIGURE name
value`` line the command prints.  ``python -m timeit "sum(range(1000))"`` is printed before and after, as
issue 39 asks for beside every time.

    python bench/side_by_side.py /tmp/old /tmp/new --rounds 3 -- gpufleet simulate
    python bench/side_by_side.py /tmp/old /tmp/new -- python bench/bench_kube_loop.py --engine-only \\
        --engine-policies default --rounds 1 --figures

(``git worktree add --detach /tmp/old <commit>`` makes a checkout of an older commit; the command runs with
the ``python`` found first on PATH, so ``gpufleet`` and ``python -m gpufleet`` both work.)
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _timeit() -> str:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(1000))"], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def timed(cmd: list[str], checkout: Path, cwd: Path | str) -> tuple[subprocess.CompletedProcess, float, float, float]:
    """Run ``cmd`` with ``checkout``'s code: (the process, its tree's CPU seconds, wall seconds, the peak RSS in
    MiB of the largest child so far); RuntimeError naming the checkout and the last stderr line when it fails."""
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{checkout}: {' '.join(cmd)} exited {p.returncode}: {tail}")
    return p, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), wall, r1.ru_maxrss / 1024.0


def _run(checkout: Path, cmd: list[str]) -> tuple[dict[str, float], str]:
    """(figures, stdout) of one run of ``cmd`` in ``checkout``."""
    if cmd[0] == "gpufleet":  # the checkout's code, not whatever is installed
        cmd = [sys.executable, "-m", "gpufleet.cli.main", *cmd[1:]]
    p, cpu_s, wall, _ = timed(cmd, checkout, checkout)
    out = {"process_cpu_s": cpu_s, "process_wall_s": wall}
    for name, val in re.findall(r"^FIGURE (\S+) (\S+)$", p.stdout, re.M):
        out[name] = float(val)
    return out, re.sub(r"^FIGURE \S+ \S+\n?", "", p.stdout, flags=re.M)  # the rest: results, compared by --same-stdout


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser
    from gpufleet.engine.errors import UsageError

    argv = sys.argv[1:]
    if "--" not in argv:
        raise UsageError("give the command after --, e.g. side_by_side.py OLD NEW -- gpufleet simulate")
    cut = argv.index("--")
    cmd = argv[cut + 1 :]
    ap = Parser(prog="side_by_side.py", description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path, help="checkout of the old commit")
    ap.add_argument("new", type=Path, help="checkout of the new commit")
    ap.add_argument("--rounds", type=int_range(1), default=3)
    ap.add_argument("--same-stdout", action="store_true",
                    help="every run must print what the old checkout's first run printed, FIGURE lines aside (a "
                         "speed-up that changes a result is reported as DIFFERS, exit 1); for commands whose other "
                         "output has no timings")
    args = ap.parse_args(argv[:cut])
    if not cmd:
        raise UsageError("no command after --")
    for c in (args.old, args.new):
        if not (c / "src" / "gpufleet").is_dir():
            raise UsageError(f"{c}: not a gpufleet checkout (no src/gpufleet)")
    print("timeit before:", _timeit(), flush=True)
    res: dict[Path, dict[str, list[float]]] = {args.old: {}, args.new: {}}
    first: str | None = None
    differs: list[str] = []
    for i in range(args.rounds):
        for c in (args.old, args.new) if i % 2 == 0 else (args.new, args.old):
            figures, stdout = _run(c, cmd)
            for name, v in figures.items():
                res[c].setdefault(name, []).append(v)
            if c == args.old and first is None:
                first = stdout
            elif args.same_stdout and first is not None and stdout != first:
                differs.append(f"round {i + 1}, {c}")
    print("timeit after:", _timeit())
    print(f"{'figure':<28} {'old':>10} {'new':>10} {'new/old':>8}   medians of {args.rounds} round(s); runs old | new")
    for name, a in res[args.old].items():
        b = res[args.new].get(name, [])
        if not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = f"{mb / ma:8.3f}" if ma else "       -"
        print(f"{name:<28} {ma:10.3f} {mb:10.3f} {ratio}   {[round(x, 2) for x in a]} | {[round(x, 2) for x in b]}")
    if args.same_stdout:
        print(f"output: DIFFERS from the old checkout's first run ({'; '.join(differs)})" if differs else
              f"output: identical in every run ({2 * args.rounds} runs)")
        if first is not None:
            print("old checkout's output, first run:\n" + first.rstrip())
    return 1 if differs else 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("side_by_side.py", main))
