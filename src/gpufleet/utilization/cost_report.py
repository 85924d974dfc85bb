"""``gpufleet cost --report``: the cost report as one self-contained HTML page, in the simulator report's style."""

from __future__ import annotations

import html
from typing import Any, Mapping

from .cost import COLUMNS, Figures, Report, _cells, _when, check_identities

DEFINITIONS = [
    ("allocated GPU-h", "GPU-hours the pods held: each sample of each GPU counts the share of it a pod held (1 = the "
                        "whole GPU, 0.25 for a 250-milli share, 3/7 for a 3g MIG slice) times the step."),
    ("used GPU-h", "of those, the GPU-hours the pod's own processes kept the GPU busy (DCGM_FI_DEV_GPU_UTIL / 100, per "
                   "process on shared GPUs), plus its share of utilisation no holder explains, at most its share."),
    ("idle GPU-h", "allocated minus used: held and not used."),
    ("cost", "allocated GPU-hours times the GPU's price per hour (price file: node, instance type, model; spot or "
             "on-demand by the node's labels)."),
    ("idle cost", "idle GPU-hours times that price: what holding GPUs without using them cost."),
    ("spot GPU-h", "allocated GPU-hours on spot nodes."),
    ("unallocated", "GPU-hours (and their cost) no pod held: the cluster's own idle capacity, charged to nobody."),
]


def _table(report: Report, level: str) -> str:
    from ..simulator.report.plots import table_html

    rows = [[r.key] + _cells(r.figures) for r in report.rows[level]]
    total = Figures()
    for r in report.rows[level]:
        total.add(r.figures)
    rows.append(["total"] + _cells(total))
    return table_html((level,) + COLUMNS, rows, marked=[len(rows) - 1])


def _bars(report: Report) -> str:
    from ..simulator.report.plots import PALETTE
    from ..simulator.report.svg import Axes, figure

    rows = report.rows["namespace"][:15]
    if not rows:
        return ""
    names = [r.key for r in rows][::-1]
    used = [r.figures.cost - r.figures.idle_cost for r in rows][::-1]
    idle = [r.figures.idle_cost for r in rows][::-1]
    ax = Axes(title="GPU cost per namespace", xlabel=f"cost ({report.currency})", ycats=names, grid="x")
    for i, (u, d) in enumerate(zip(used, idle)):
        ax.barh(float(i), float(u), 0.0, PALETTE[0], label="cost of GPU-hours used", height=0.8)
        ax.barh(float(i), float(d), float(u), PALETTE[1], label="idle cost (held, not used)", height=0.8)
    return figure([ax], 720, 60 + 34 * len(rows))


def write_cost_report(path: str, report: Report, params: Mapping[str, Any]) -> None:
    from ..simulator.report.plots import definitions_html, write_report

    c = report.cluster
    known = not c.unpriced_gpu_h
    money = (lambda v: f"{v:,.2f} {report.currency}") if known else (lambda v: "unknown")
    summary = (f"<p>{html.escape(_when(report.start_s))} to {html.escape(_when(report.end_s))}, step {report.step_s:g} s; "
               f"{c.gpus} GPU(s), data in {c.steps_with_data} of {c.steps_in_window} steps.</p>"
               f"<p>Capacity <b>{c.capacity_gpu_h:.3f}</b> GPU-h ({money(c.capacity_cost)}) = allocated "
               f"<b>{c.allocated_gpu_h:.3f}</b> ({money(c.allocated_cost)}) + unallocated <b>{c.unallocated_gpu_h:.3f}</b> "
               f"({money(c.unallocated_cost)})"
               + (f"; {c.oversubscribed_gpu_h:.3f} GPU-h oversubscribed, split in proportion" if c.oversubscribed_gpu_h else "")
               + (f"; {c.spot_gpu_h:.3f} GPU-h on spot nodes" if c.spot_gpu_h else "") + ".</p>")
    broken = check_identities(report)
    summary += ("<p class='note'>Checked: per pod used + idle = allocated; every namespace, queue and workload is the sum "
                "of its pods; the cluster's allocated GPU-hours are the sum over its pods; capacity = allocated + "
                "unallocated.</p>" if not broken else "<p><b>Figures that do not add up:</b> "
                + html.escape("; ".join(broken)) + "</p>")
    if report.unpriced:
        summary += "<p><b>Unpriced</b> (cost unknown, not zero): " + html.escape("; ".join(report.unpriced)) + "</p>"
    sections = [("Summary", summary), ("Cost per namespace", _bars(report) + _table(report, "namespace")),
                ("Per team queue", _table(report, "queue")), ("Per workload", _table(report, "workload")),
                ("Per pod", _table(report, "pod")),
                ("Prices used", "<ul>" + "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>"
                                               for k, v in report.price_sources.items()) + "</ul>"),
                ("What the numbers mean", definitions_html(DEFINITIONS))]
    write_report(path, "gpufleet GPU cost", sections, params)
