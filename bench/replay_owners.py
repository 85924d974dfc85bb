"""Where the replay sweep's CPU time goes, by the part of the code that owns it: a py-spy profile split into the
engine's cycles, the round around them, the retry pass, the engine's observe/forget, the replay's own event loop and
books, its set-up, and start-up.

Why: the sweep (docs/replay.md, issue 39 deliverable 5) is the engine's work driven by the replay's shell; a change
to the shell can save at most the shell's share, so that share is measured first, on the sweep itself (both
workers, the parent), not on one run in a fresh process (which counts its start-up and set-up again).  Each sample
goes to the first of these, in this order, that its stack holds (so a part's figure leaves out what the parts above
it take): ``Scheduler.schedule``; ``SchedulingRound.try_pod`` (with, inside it, the could-fit screen and the replay's
``bind``/``placed`` listed apart); ``PendingGroups.retry``; ``Scheduler.observe``/``forget`` or
``ClusterState.unreserve``; ``replay_metrics.sample``; ``_Replay.run``; ``run_replay``; ``run_one``; the rest.

    py-spy record -r 100 --subprocesses -f raw -o sweep.raw -- python -m gpufleet simulate --experiment replay \\
        --load 0.6,0.8,1.0,1.2 --policy default,fgd,bestfit --jobs 2 --no-progress --json s.json
    python bench/replay_owners.py sweep.raw
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# (label, any of these frames in the stack); the first that matches takes the sample
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("engine's cycles (Scheduler.schedule)", ("Scheduler.schedule",)),
    ("round around the cycle: could-fit screen (engine/pending.py FitScreen)", ("FitScreen.__call__",)),
    ("round around the cycle: the replay's bind/placed/wait (replay.py; the queue's placed/failed inside)",
     ("_Replay.bind", "_Replay.wait")),
    ("round around the cycle: the rest (engine/round.py)", ("SchedulingRound.try_pod",)),
    ("retry pass outside its tries (engine/pending.py)", ("PendingGroups.retry",)),
    ("engine observe/forget (per arrival/departure)", ("Scheduler.observe", "Scheduler.forget", "ClusterState.unreserve")),
    ("samples over time (replay_metrics.sample)", ("sample",)),
    ("the replay's own event loop and books (replay.py)", ("_Replay.run",)),
    ("a run's set-up and summary (run_replay)", ("run_replay",)),
    ("a run's end (run_one: JSON, collection)", ("run_one",)),
]
REST = "start-up, trace, preparation, pool (parent and workers)"
_FRAME = re.compile(r"^(.*?) \(")


def owners(path: str) -> tuple[int, Counter[str]]:
    """Samples in a py-spy raw file (``frame;frame;... count`` lines) by part."""
    total, parts = 0, Counter[str]()
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        names = {m.group(1) if (m := _FRAME.match(f)) else f for f in stack.split(";")}
        total += int(n)
        parts[next((label for label, frames in PARTS if not names.isdisjoint(frames)), REST)] += int(n)
    return total, parts


def main() -> int:
    from gpufleet.cli.main import Parser

    ap = Parser(prog="replay_owners.py", description=__doc__.split("\n")[0])
    ap.add_argument("raw", help="a py-spy raw profile (py-spy record -f raw)")
    args = ap.parse_args()
    try:
        total, parts = owners(args.raw)
    except OSError as exc:  # a file not there or not readable: bad input
        print(f"replay_owners.py: {args.raw}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if not total:
        print(f"replay_owners.py: {args.raw}: no samples (not a py-spy raw file?)", file=sys.stderr)
        return 2
    print(f"{total} samples")
    for label, _frames in [*PARTS, (REST, ())]:
        print(f"{100.0 * parts[label] / total:5.1f}%  {label}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("replay_owners.py", main))
