"""Assembles ``report.html`` for ``gpufleet simulate`` from run results."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from .plots import bars_plot, curves_plot, definitions_html, table_html, write_report
from .idle import idle_section

PACKING_METRICS = [
    ("unallocated GPU %", "100 minus the share of the cluster's GPUs (in milli-GPU) allocated at the moment the arrived GPU "
                          "demand equals the cluster's GPU capacity; the FGD paper's headline metric, lower is better."),
    ("± std", "standard deviation of that figure over the seeds (shown only with several seeds)."),
    ("keep-first bound %", "the least unallocated GPU % of any placement that keeps every pod this policy placed before it "
                           "first turned one away (LP; a scheduler places what fits, so this is how far its own start "
                           "allowed; see \"Where the idle GPUs are\")."),
    ("CPU in use %", "the share of the cluster's CPU held by pods at that same moment: where CPU runs out before the GPUs, "
                     "a policy that keeps CPU for free GPUs (the default) allocates more GPUs and less CPU."),
    ("published", "the FGD paper's figure for the same trace (mean over the same seeds where published)."),
    ("failed pods", "pods (of all arrivals, up to the --tune x capacity demand) for which no node had room when they arrived."),
    ("wall s / run", "seconds one run took on this machine."),
    ("GPU allocation ratio", "allocated GPU milli as a share of the cluster's GPU capacity, against the arrived demand."),
    ("fragmentation amount", "free GPU capacity that the typical task sizes (the target workload) could not use, "
                             "as a share of the cluster's GPU capacity (the FGD paper's fragmentation measure)."),
    ("fragmentation rate", "that fragmented capacity as a share of all free (idle) GPU capacity."),
    ("offline bound", "the solver's lower bound of a MIP over node groups (integral pods, each GPU's shares packed within "
                      "its 1000 milli, per-node CPU/memory/GPU cuts, gpu_spec honoured): no placement of the arrived pods, "
                      "even one knowing the future, leaves fewer GPUs unallocated; the solver's own gap is in the headline, "
                      "and which pods its best placement leaves out (a scheduler that places every pod that fits cannot "
                      "leave those out)."),
]


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
    provenance: Mapping[str, Any] | None = None,
    problems: Mapping[str, Sequence[str]] | None = None,
    bound_note: str = "",
) -> None:
    by = _by_policy(runs)
    sections: list[tuple[str, str]] = []
    if problems and any(problems.values()):
        sections.append(("Input problems", _problems_html(problems)))
    if experiment == "packing":
        several = any(s["runs"] > 1 for s in summary.values())
        means = {p: s["unallocated_gpu_pct_mean"] for p, s in summary.items() if s["unallocated_gpu_pct_mean"] is not None}
        best = min(means, key=means.__getitem__) if means else None
        rows = []
        for pol, s in summary.items():
            pub = published.get(pol)
            keep = (s.get("idle") or {}).get("bound_placing_first_pct_mean")
            cpu = (s.get("idle") or {}).get("cpu_used_pct_mean")
            rows.append([
                pol + (" (best)" if pol == best else ""), s["runs"],
                f"{s['unallocated_gpu_pct_mean']:.2f}" if s["unallocated_gpu_pct_mean"] is not None else "-",
                *([f"{s['unallocated_gpu_pct_std']:.2f}" if s["unallocated_gpu_pct_std"] is not None else "-"] if several else []),
                f"{keep:.2f}" if keep is not None else "-", f"{cpu:.1f}" if cpu is not None else "-",
                f"{pub:.2f}" if pub is not None else "-", f"{s['pods_failed_mean']:.0f}", f"{s['wall_s_mean']:.1f}",
            ])
        bound_status = "offline bound: not computed (--no-bound)"
        if bound is not None:
            rows.append(["offline bound", "", f"{bound:.2f}", *([""] if several else []), "", "", "", "", ""])
            bound_status = f"offline bound: {bound:.2f}% (no placement of the arrived pods can leave fewer GPUs unallocated)"
        seeds = sorted({r["seed"] for r in runs})
        note = (f"<p class='note'>{'Mean over ' + str(len(seeds)) + ' seeds' if several else 'One seed (' + str(seeds[0]) + ')'}; "
                f"{html.escape(bound_status)}. Lower is better; the best policy is marked."
                + ("" if several else " One seed's figures differ from a mean over seeds by a few tenths: "
                   "<code>gpufleet simulate --seeds 42-51</code> gives the README's table.") + "</p>")
        headers = ["policy", "runs", "unallocated GPU %", *(["± std"] if several else []), "keep-first bound %", "CPU in use %", "published",
                   "failed pods", "wall s / run"]
        marked = [i for i, p in enumerate(summary) if p == best]
        defs = [d for d in PACKING_METRICS if several or d[0] != "± std"]
        if bound_note:
            note += f"<p><b>{html.escape(bound_note)}</b></p>"
        sections.append(("Summary", note + table_html(headers, rows, marked) + definitions_html(defs)))
        sections.append(("Unallocated GPUs", bars_plot(
            {p: s for p, s in summary.items() if s["unallocated_gpu_pct_mean"] is not None}, published, bound)))
        idle = idle_section(summary)
        if idle:
            sections.append(("Where the idle GPUs are", idle))
        grid = "<div class='grid'>" + curves_plot(by, "allocation_pct", "GPU allocation ratio (%)", "Allocated GPUs vs arrived demand") \
            + curves_plot(by, "frag_amount_pct", "fragmented GPUs (% of capacity)", "Fragmentation amount") \
            + curves_plot(by, "frag_rate_pct", "fragmented / idle GPUs (%)", "Fragmentation rate") + "</div>"
        sections.append((f"Curves (mean over {len(seeds)} seeds, band = ±1 std)" if several else f"Curves (seed {seeds[0]})", grid))
    sections.extend(extra_sections)
    write_report(path, f"gpufleet simulate: {experiment} experiment", sections, params, provenance)


def _problems_html(problems: Mapping[str, Sequence[str]], shown: int = 10) -> str:
    """Skipped rows and pods no node can hold: counts and the first few, so nothing changes the experiment silently."""
    titles = {"skipped_node_rows": "node rows skipped (--skip-bad-rows)", "skipped_pod_rows": "pod rows skipped (--skip-bad-rows)",
              "unplaceable_pods": "pods no node of this cluster can hold even when empty (left out of every run)"}
    out = []
    for key, items in problems.items():
        if not items:
            continue
        lis = "".join(f"<li>{html.escape(x)}</li>" for x in items[:shown])
        more = f"<li>... and {len(items) - shown} more</li>" if len(items) > shown else ""
        out.append(f"<p><b>{len(items)} {html.escape(titles.get(key, key))}</b></p><ul class='note'>{lis}{more}</ul>")
    return "".join(out)
