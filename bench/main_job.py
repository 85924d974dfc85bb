"""The main job (``gpufleet simulate``, the README's first command) timed in two checkouts side by side,
and its output compared between them.

Why: issue 39 asks for the main job in at most 10 s on 2 cores (whole process, everything it prints, the
offline bound included), at a sitting where ``python -m timeit "sum(range(1000))"`` says 20 us.  The
machines measured here change speed by a factor of two from one minute to the next, so a time means
something only beside another taken in the same minutes.  Each round runs the command once in each checkout
(the order alternates) exactly as a user runs it (default ``--jobs``: one worker per CPU; the HTML report and
the JSON written), in a fresh process, with ``PYTHONPATH=<checkout>/src``, and records the wall seconds,
the CPU seconds of the whole process tree (workers included) and the peak RSS of the largest process.
``timeit`` is printed before and after, and the wall medians are scaled to the 20 us sitting.

The output is checked too: every round's printed table and ``--json`` output, less timings (the "wall s"
column, the MIP's solve time, ``wall_s`` fields, the commit and date), must equal the old checkout's first
round; a speed-up that changes a figure is reported as DIFFERS and the script exits 1.

    git worktree add --detach /tmp/old <old commit>
    python bench/main_job.py /tmp/old . --rounds 3
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.identity

REFERENCE_TIMEIT_US = 20.0  # issue 39's targets are for a sitting where timeit says this


def _timeit_us() -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-m", "timeit", "sum(range(1000))"], capture_output=True, text=True)
    text = out.stdout.strip() or out.stderr.strip()
    m = re.search(r"([\d.]+) (nsec|usec|msec) per loop", text)
    scale = {"nsec": 1e-3, "usec": 1.0, "msec": 1e3}
    return (float(m.group(1)) * scale[m.group(2)] if m else float("nan")), text


def _run(checkout: Path, extra: list[str]) -> tuple[dict[str, float], dict[str, Any]]:
    """One run of the main job in ``checkout``: (figures, cleaned output)."""
    from bench.identity import _clean, _clean_table
    from bench.side_by_side import timed

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gpufleet.cli.main", "simulate", "--no-progress", "--json", "out.json",
               "--report", "report.html", *extra]
        p, cpu_s, wall, peak_rss_mib = timed(cmd, checkout, tmp)
        doc = json.loads((Path(tmp) / "out.json").read_text())
        report_bytes = (Path(tmp) / "report.html").stat().st_size
    doc.pop("provenance", None)
    mip_stopped = not (doc.get("bound") or {}).get("all_optimal", True)
    figures = {"wall_s": wall, "cpu_s": cpu_s, "peak_rss_mib": peak_rss_mib}  # the largest process so far
    figures["mip_time_limit_hit"] = float(mip_stopped)
    return figures, {"json": _clean(doc), "table": _clean_table(p.stdout), "report": report_bytes > 0}


def main() -> int:
    from gpufleet.argtypes import int_range
    from gpufleet.cli.main import Parser
    from gpufleet.engine.errors import UsageError
    from bench.identity import _diff

    ap = Parser(prog="main_job.py", description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path, help="checkout of the old commit")
    ap.add_argument("new", type=Path, help="checkout of the new commit")
    ap.add_argument("--rounds", type=int_range(1, 50), default=3)
    ap.add_argument("--jobs", type=int_range(1, 256), default=None, help="passed to gpufleet simulate (default: its own)")
    args = ap.parse_args()
    for c in (args.old, args.new):
        if not (c / "src" / "gpufleet").is_dir():
            raise UsageError(f"{c}: not a gpufleet checkout (no src/gpufleet)")
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    before_us, before = _timeit_us()
    print("timeit before:", before, flush=True)
    res: dict[Path, dict[str, list[float]]] = {args.old: {}, args.new: {}}
    reference: dict[str, Any] | None = None
    differs: list[str] = []
    for i in range(args.rounds):
        for c in (args.old, args.new) if i % 2 == 0 else (args.new, args.old):
            figures, output = _run(c, extra)
            for name, v in figures.items():
                res[c].setdefault(name, []).append(v)
            if reference is None:
                reference = output
            else:
                out: list[str] = []
                _diff(reference, output, f"{'old' if c == args.old else 'new'} round {i + 1}", out)
                differs += out
            print(f"round {i + 1} {'old' if c == args.old else 'new'}: wall {figures['wall_s']:.2f} s, "
                  f"CPU {figures['cpu_s']:.2f} s", flush=True)
    after_us, after = _timeit_us()
    print("timeit after:", after)
    print(f"{'figure':<16} {'old':>9} {'new':>9} {'new/old':>8}   medians of {args.rounds} round(s); runs old | new")
    for name, a in res[args.old].items():
        if name == "mip_time_limit_hit":
            continue
        b = res[args.new][name]
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name:<16} {ma:9.2f} {mb:9.2f} {mb / ma if ma else float('nan'):8.3f}   "
              f"{[round(x, 2) for x in a]} | {[round(x, 2) for x in b]}")
    us = statistics.median([before_us, after_us])
    for label, c in (("old", args.old), ("new", args.new)):
        w = statistics.median(res[c]["wall_s"])
        print(f"{label}: wall {w:.2f} s at timeit {us:.1f} us = {w * REFERENCE_TIMEIT_US / us:.1f} s at the "
              f"{REFERENCE_TIMEIT_US:.0f} us sitting (issue 39's target: 10 s)")
    stopped = sum(sum(res[c]["mip_time_limit_hit"]) for c in (args.old, args.new))
    if stopped:  # HiGHS's limit is in wall seconds: on a loaded machine the MIP stops early, where it got to varies
        print(f"note: the offline bound's MIP stopped at its 30 s time limit in {stopped:.0f} run(s) (a loaded machine): "
              "its best placement (gap, pods left out) then depends on how far it got; compare on a quieter machine")
    if differs:
        print("output DIFFERS (table or --json, timings left out):")
        for line in differs[:20]:
            print("  " + line)
        return 1
    print(f"output identical in all {2 * args.rounds} runs (table and --json, timings left out)")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("main_job.py", main))
