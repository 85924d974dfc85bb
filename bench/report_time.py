"""The main job's report alone: import the report module, then write ``report.html`` from a ``--json`` output.

Why: the report is written after the last run, when no worker shares the time, so every CPU second of it is a
second of the main job's wall clock.  Run it in two checkouts on the same JSON, alternating:

    gpufleet simulate --json out.json
    for co in OLD NEW OLD NEW; do PYTHONPATH=$co/src python bench/report_time.py out.json; done
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main() -> int:
    from gpufleet.cli.main import Parser

    ap = Parser(prog="report_time.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a gpufleet simulate --json output (the packing experiment)")
    a = ap.parse_args()
    with open(a.json) as f:
        doc = json.load(f)
    from gpufleet.cli.simulate import summarize

    t = time.process_time()
    from gpufleet.simulator.report.packing import write_simulation_report

    imported = time.process_time() - t
    runs = doc["runs"]
    summary = summarize(runs)
    bound = doc.get("bound") or {}
    t = time.process_time()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.html")
        write_simulation_report(path, "packing", runs, summary, doc.get("published", {}), bound.get("unallocated_gpu_pct_mean"),
                                doc["params"], bound_note=bound.get("headline", ""))
        size = os.path.getsize(path)
    written = time.process_time() - t
    print(f"FIGURE import_s {imported:.3f}\nFIGURE write_s {written:.3f}\nFIGURE bytes {size}")
    return 0


if __name__ == "__main__":
    from gpufleet.cli.main import run_script

    sys.exit(run_script("report_time.py", main))
