"""``report.html`` for replay runs: delay-versus-load curves per policy (where each policy's
hockey stick bends), the table, delay per request class, fragmentation and allocation over time,
team queues, what-ifs and the capacity search.  Self-contained (inline SVG)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .plots import PALETTE, table_html, time_plot, write_report
from .svg import Axes, figure


def load_curves(runs: Sequence[Mapping[str, Any]], key: str, ylabel: str, title: str, log: bool = False) -> str:
    ax = Axes(title=title, xlabel="offered GPU load (fraction of cluster GPU capacity)", ylabel=ylabel, ylog=log, legend_cols=2)
    groups: dict[tuple[str, str], dict[float, list[float]]] = {}
    for r in runs:
        if r["load"] is None:
            continue
        g = groups.setdefault((r["policy"], r["what_if"] or ""), {})
        v = key.split(".")
        val = r[v[0]][v[1]] if len(v) == 2 else r[v[0]]
        g.setdefault(float(r["load"]), []).append(float(val))
    for i, ((pol, wi), pts) in enumerate(groups.items()):
        xs = sorted(pts)
        ys = [float(np.mean(pts[x])) for x in xs]
        ax.line(xs, ys, PALETTE[i % len(PALETTE)], label=pol + (f" ({wi})" if wi else ""), dash="--" if wi else "", marker="o")
    return figure([ax], 720, 400)


def search_plot(search: Mapping[str, Any]) -> str:
    ax = Axes(title="Capacity search", xlabel=f"{search['shape']} nodes added", ylabel="queueing delay (s)", ylog=True)
    pts = search["curve"]
    added = [float(p["added"]) for p in pts]
    ax.line(added, [float(p["p99_s"]) for p in pts], PALETTE[0], label="p99 wait", marker="o")
    ax.line(added, [float(p["p50_s"]) for p in pts], PALETTE[1], label="p50 wait", marker=".")
    ax.hline(float(search["target_p99_s"]), "black", label=f"target p99 {search['target_p99_s']:g} s", dash="--")
    if search.get("added") is not None:
        ax.vline(float(search["added"]), PALETTE[2], label=f"recommended: +{search['added']}", width=1.2, dash=":")
    return figure([ax], 720, 384)


def write_replay_report(path: str, runs: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
                        params: Mapping[str, Any], search: Mapping[str, Any] | None = None) -> None:
    sections: list[tuple[str, str]] = []
    r0 = runs[0]
    warm = params.get("warmup", 0.1)
    note = (f"<p class='note'>Metrics are over the <b>busy window</b>: the first {100 * warm:g}% of arrivals (warm-up) "
            f"and everything after the last arrival (drain) are left out; queueing delay counts the pods that arrive in "
            f"the window, wherever they are placed; GPU allocation is time-averaged over the window. Offered load = GPU "
            f"demand over the window if every pod ran on arrival (gpu x overlap of its run with the window), divided by "
            f"the reference cluster's GPUs x window length; arrival gaps are scaled to reach it, run times are kept"
            f"{'; the trace is replayed ' + str(params['copies']) + ' times back to back to offer the highest load' if (params.get('copies') or 1) > 1 else ''}. "
            f"Bounded slowdown = max(1, (wait + run) / max(run, 10 s)).</p>")
    head = ["policy", "load", "what-if", "GPU alloc %", "frag %", "delay mean s", "p50 s", "p95 s", "p99 s", "never placed",
            "bounded slowdown p99", "production p99 s"]
    trows = [[r["policy"], "trace" if r["load"] is None else r["load"], r["what_if"], r["gpu_alloc_pct"], r["frag_pct"],
              r["delay_mean_s"], r["delay_p50_s"], r["delay_p95_s"], r["delay_p99_s"], r["never_placed"],
              r["bounded_slowdown_p99"], "-" if r["production_p99_s"] is None else r["production_p99_s"]] for r in rows]
    sections.append(("Summary", note + table_html(head, trows)))
    if search is not None:
        sections.append(("Capacity search", f"<p><b>{html.escape(search['recommendation'])}</b></p>" + search_plot(search)
                         + table_html(["added", "p50 s", "p99 s", "GPU alloc %", "never placed"],
                                      [[p["added"], p["p50_s"], p["p99_s"], p["mean_gpu_alloc_pct"], p["never_placed"]] for p in search["curve"]])))
    if len({r["load"] for r in runs}) > 1:
        grid = "<div class='grid'>" + load_curves(runs, "queue_delay_s.p99", "p99 queueing delay (s)", "p99 wait vs load", log=True) \
            + load_curves(runs, "queue_delay_s.p50", "p50 queueing delay (s)", "p50 wait vs load", log=True) \
            + load_curves(runs, "mean_gpu_alloc_pct", "GPU allocation % (busy window)", "Allocation vs load") \
            + load_curves(runs, "bounded_slowdown.p99", "bounded slowdown p99", "Slowdown vs load", log=True) + "</div>"
        sections.append(("Delay versus load (the hockey stick)", grid))
    # per class
    crow = []
    for r in runs:
        for cls, s in r["delay_by_class"].items():
            crow.append([r["policy"], "trace" if r["load"] is None else r["load"], r["what_if"] or "-", cls, s["n"], s["mean"], s["p50"], s["p95"], s["p99"]])
    sections.append(("Queueing delay per request class", "<p class='note'>shares = part of one GPU; 1/2/4/8 = whole GPUs; "
                     "cpu = no GPU; class@model = pods pinned to GPU models.</p>"
                     + table_html(["policy", "load", "what-if", "class", "pods", "mean s", "p50 s", "p95 s", "p99 s"], crow)))
    # over time, at the highest load, first seed
    top = max((r["load"] or 0) for r in runs)
    sel = {f"{r['policy']}{' (' + r['what_if'] + ')' if r['what_if'] else ''}": r for r in runs
           if (r["load"] or 0) == top and r["seed"] == r0["seed"]}
    bw = r0["busy_window_h"]
    over = (f"<p class='note'>Load {top if top else 'of the trace clock'}; busy window {bw[0]:.2f} h .. {bw[1]:.2f} h after the first arrival.</p>"
            "<div class='grid'>" + time_plot(sel, "gpu_alloc_pct", "allocated GPUs (%)", "GPU allocation over time")
            + time_plot(sel, "pending_pods", "pods waiting", "Pending pods over time"))
    if any(r["frag_pct"] for r in sel.values()):
        over += time_plot({k: v for k, v in sel.items() if v["frag_pct"]}, "frag_pct", "fragmented GPUs (% of capacity)",
                          "Fragmentation over time (FGD's measure)")
    sections.append(("Over time", over + "</div>"))
    teams = [r for r in runs if r.get("teams")]
    if teams:
        body = ""
        for r in teams[:4]:
            tr = [[q, t.get("quota_gpus", "-"), t.get("weight", "-"), t.get("parent") or "-", t["delay_s"]["n"], t["delay_s"]["mean"],
                   t["delay_s"]["p99"], t.get("mean_share_pct", "-"), t.get("preempted", "-"), t.get("reclaimed_from", "-"),
                   t.get("never_placed", "-")] for q, t in r["teams"].items()]
            body += f"<h3>{html.escape(r['policy'])}, load {r['load']}</h3>" + table_html(
                ["queue", "quota GPUs", "weight", "parent", "pods", "delay mean s", "p99 s", "mean share %", "preempted",
                 "reclaimed", "never placed"], tr)
            series = {q: {"t_h": r["t_h"], "v": t["share_pct"]} for q, t in r["teams"].items() if "share_pct" in t}
            bor = {q: {"t_h": r["t_h"], "v": t["borrowed_pct"]} for q, t in r["teams"].items() if "borrowed_pct" in t}
            body += "<div class='grid'>" + time_plot(series, "v", "share of cluster GPUs (%)", "Team shares over time") \
                + time_plot(bor, "v", "GPUs over nominal quota (% of cluster)", "Borrowing over time") + "</div>"
        sections.append(("Team queues", body))
    write_report(path, "gpufleet simulate: replay", sections, params)


__all__ = ["load_curves", "write_replay_report"]
