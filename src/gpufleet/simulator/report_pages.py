"""Assembles ``report.html`` for ``gpufleet simulate`` from run results."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from .report import bars_plot, curves_plot, table_html, time_plot, write_report


def _by_policy(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["policy"], []).append(r)
    return out


def write_simulation_report(
    path: str,
    experiment: str,
    runs: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Mapping[str, Any]],
    published: Mapping[str, float],
    bound: float | None,
    params: Mapping[str, Any],
    extra_sections: Sequence[tuple[str, str]] = (),
    bound_note: str = "",
) -> None:
    by = _by_policy(runs)
    sections: list[tuple[str, str]] = []
    if experiment == "packing":
        rows = []
        for pol, s in summary.items():
            pub = published.get(pol)
            rows.append([
                pol, s["runs"], f"{s['unallocated_gpu_pct_mean']:.2f}" if s["unallocated_gpu_pct_mean"] is not None else "-",
                f"{s['unallocated_gpu_pct_std']:.2f}" if s["unallocated_gpu_pct_std"] is not None else "-",
                f"{pub:.2f}" if pub is not None else "-", f"{s['pods_failed_mean']:.0f}", f"{s['wall_s_mean']:.1f}",
            ])
        if bound is not None:
            rows.append(["offline bound", "", f"{bound:.2f}", "", "", "", ""])
        note = ("<p class='note'>Unallocated GPU % = 100 &minus; GPU allocation ratio when the arrived GPU demand equals "
                "the cluster's GPU capacity (the FGD paper's headline metric; lower is better). "
                "'published' is the FGD paper's figure for the same trace and seeds, where the trace matches.</p>")
        if bound_note:
            note += f"<p><b>{html.escape(bound_note)}</b></p>"
        sections.append(("Summary", note + table_html(
            ["policy", "runs", "unallocated GPU %", "± std", "published", "failed pods", "wall s / run"], rows)))
        sections.append(("Unallocated GPUs", bars_plot(
            {p: s for p, s in summary.items() if s["unallocated_gpu_pct_mean"] is not None}, published, bound)))
        grid = "<div class='grid'>" + curves_plot(by, "allocation_pct", "GPU allocation ratio (%)", "Allocated GPUs vs arrived demand") \
            + curves_plot(by, "frag_amount_pct", "fragmented GPUs (% of capacity)", "Fragmentation amount") \
            + curves_plot(by, "frag_rate_pct", "fragmented / idle GPUs (%)", "Fragmentation rate") + "</div>"
        sections.append(("Curves (mean over seeds, band = ±1 std)", grid))
    else:
        rows = [[p, s["runs"], f"{s['mean_gpu_alloc_pct']:.2f}", f"{s['queue_delay_s_mean']:.1f}", f"{s['queue_delay_s_p99']:.1f}",
                 f"{s['pods_never_placed_mean']:.1f}"] for p, s in summary.items()]
        sections.append(("Summary", table_html(
            ["policy", "runs", "mean GPU allocation %", "queueing delay mean (s)", "p99 (s)", "pods never placed"], rows)))
        first = {p: rs[0] for p, rs in by.items()}
        sections.append(("Over time (first seed)", "<div class='grid'>"
                         + time_plot(first, "gpu_alloc_pct", "allocated GPUs (%)", "GPU allocation over time")
                         + time_plot(first, "pending_pods", "pods waiting", "Pending pods over time") + "</div>"))
    sections.extend(extra_sections)
    write_report(path, f"gpufleet simulate: {experiment} experiment", sections, params)
