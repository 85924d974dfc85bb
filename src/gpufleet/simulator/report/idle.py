"""The "Where the idle GPUs are" section of the packing report: saturation point against unallocated %,
idle GPU-equivalents by hole kind, and the repack yardstick per policy (from ``simulator.bounds.idle``).
Self-contained (inline SVG)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import numpy as np

from .plots import PALETTE, definitions_html, table_html
from .svg import Axes, figure

IDLE_METRICS = [
    ("first pod turned away", "the arrived GPU demand, as % of the cluster's GPU capacity, when the policy first turned a pod "
                              "away (the saturation point; above 100% when it took every pod up to the 100% point). With a policy "
                              "that packs well nearly every pod arriving after it fails too, so unallocated % at 100% is about "
                              "100 minus this; a careless one (random) says no early and still places many pods after, and so does "
                              "one that turns some pods away on purpose (the default's whole-GPU reserve keeps the last whole "
                              "GPUs from 810-milli shares)."),
    ("idle GPUs", "GPU-equivalents (free milli / 1000) idle just before the arrived demand passes the cluster's capacity."),
    ("whole idle", "idle GPUs with nothing on them."),
    ("slivers", "free milli on GPUs that are partly used, by the pods on them: '810' is a GPU holding one 810-milli pod, "
                "whose 190 free milli only a rare pod of 190 or less can use."),
    ("CPU-stranded", "idle GPU milli on nodes where some GPU shape of the arrived pods would fit the free GPUs but not the "
                     "node's free CPU/memory."),
    ("repack", "the GPUs holding shares (pods of less than one GPU) against an offline best-fit-decreasing packing of the same "
               "shares (a real packing) and the arc-flow LP bound (no packing of them needs fewer GPUs), GPU milli only."),
    ("bound keeping its first pods", "the least unallocated GPU % of any placement of the arrived pods that places every GPU pod "
                                     "this policy placed before it first turned one away (the offline bound's program, LP "
                                     "relaxation). A scheduler places what fits, so this is how far a better packing could have "
                                     "gone from the same start; the offline bound above may leave out pods that fit when they came."),
]


def _num(v: float | None, several: bool, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if several else f"{v:,.0f}"


def saturation_plot(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """Two panels sharing the policy axis: where the first pod was turned away, and unallocated % at 100%."""
    pols = list(summary)
    idle = [summary[p]["idle"] for p in pols]
    sat = np.array([np.nan if d["saturation_mean"] is None else 100.0 * d["saturation_mean"] for d in idle])
    sat_err = np.array([0.0 if d.get("saturation_std") is None else 100.0 * d["saturation_std"] for d in idle])
    una = np.array([np.nan if summary[p]["unallocated_gpu_pct_mean"] is None else summary[p]["unallocated_gpu_pct_mean"] for p in pols])
    una_err = np.array([summary[p].get("unallocated_gpu_pct_std") or 0.0 for p in pols])
    several = any(summary[p].get("runs", 1) > 1 for p in pols)
    y = np.arange(len(pols))[::-1]
    panels: list[Axes] = []
    for vals, err, color, xlabel in (
        (sat, sat_err, PALETTE[0], "arrived GPU demand when the first pod\nwas turned away (% of capacity)"),
        (una, una_err, PALETTE[3], "unallocated GPU % at 100% arrived"),
    ):
        ax = Axes(xlabel=xlabel, label_size=8, ycats=pols[::-1], grid="x", legend="", show_yticks=not panels)
        for v, e, yi in zip(vals, err, y):
            if not np.isnan(v):
                ax.dot(float(v), float(yi), color, xerr=float(e) if several else None)
                ax.text(float(v), float(yi), f"{v:.1f}", size=7, dy_px=-7)
        ok = ~np.isnan(vals)
        if ok.any():
            spread = err[ok] if several else 0.0
            lo, hi = float((vals[ok] - spread).min()), float((vals[ok] + spread).max())
            pad = max(0.5, 0.12 * (hi - lo))
            ax.xlim = (lo - pad, hi + pad)
        ax.ylim = (-0.7, len(pols) - 0.3)
        panels.append(ax)
    title = ("When each policy first turned a pod away, and what it left unallocated at 100% arrived"
             + (" (mean ± std over seeds)" if several else ""))
    return figure(panels, 816, 43 * len(pols) + 154, title=title)


def hole_kinds(summary: Mapping[str, Mapping[str, Any]], top: int = 5) -> list[str]:
    """The GPU contents with the most idle GPU-equivalents over all policies, largest first."""
    tot: dict[str, float] = {}
    for s in summary.values():
        for k, v in s["idle"]["holes_mean"].items():
            tot[k] = tot.get(k, 0.0) + v
    return [k for k, v in sorted(tot.items(), key=lambda kv: (-kv[1], kv[0])) if v > 0][:top]


def holes_plot(summary: Mapping[str, Mapping[str, Any]], top: int = 5) -> str:
    """Stacked bars per policy: whole idle GPUs, the ``top`` hole kinds, everything else."""
    pols = list(summary)
    kinds = hole_kinds(summary, top)
    rows = []
    for p in pols:
        d = summary[p]["idle"]
        whole = d["whole_idle_gpus_mean"] or 0.0
        holes = [d["holes_mean"].get(k, 0.0) for k in kinds]
        rows.append([whole, *holes, max(0.0, (d["idle_gpus_mean"] or 0.0) - whole - sum(holes))])
    labels = ["whole idle GPUs", *[f"GPUs holding {k}" for k in kinds], "other partly used GPUs"]
    colors = ["#4d4d4d", *[PALETTE[i % len(PALETTE)] for i in range(len(kinds))], "#c7c7c7"]
    data = np.array(rows)
    y = np.arange(len(pols))[::-1]
    ax = Axes(title="Where the idle GPUs are: whole idle GPUs and free milli by what the GPU holds", title_size=9,
              xlabel="idle GPU-equivalents at 100% arrived", ycats=pols[::-1], grid="x", legend="below",
              legend_cols=min(4, len(labels)))
    left = np.zeros(len(pols))
    for j, (lab, c) in enumerate(zip(labels, colors)):
        for yi, w, lft in zip(y, data[:, j], left):
            ax.barh(float(yi), float(w), float(lft), c, label=lab)
        left += data[:, j]
    for yi, tot in zip(y, left):
        ax.text(float(tot), float(yi), f" {tot:.0f}" if left.max() >= 100 else f" {tot:.1f}", size=7, anchor="start",
                baseline="middle")
    ax.xlim = (0, max(float(left.max()) * 1.1, 1.0))
    return figure([ax], 816, 43 * len(pols) + 192)


def repack_sentence(policy: str, d: Mapping[str, Any], several: bool) -> str:
    """'fgd: of the 1,963 GPUs holding shares, best-fit decreasing of the same shares would save 39 GPUs; ...'."""
    if not d.get("share_gpus_mean"):
        return f"{policy}: no GPU holds shares at this point; nothing to repack."
    keep = d.get("bound_placing_first_pct_mean")
    sat = d.get("saturation_mean")
    kept = ("" if keep is None else
            f" Keeping every pod it placed before it first turned one away{'' if sat is None else f' (at {100 * sat:.1f}% arrived)'}, "
            f"no placement leaves fewer than {keep:.2f}% unallocated.")
    saves = d["repack_bfd_saves_gpus_mean"]
    bfd = (f"best-fit decreasing of the same shares would save {_num(saves, several)} GPUs" if saves >= 0 else
           f"best-fit decreasing of the same shares would need {_num(-saves, several)} more GPUs than this placement")
    return (f"{policy}: of the {_num(d['share_gpus_mean'], several)} GPUs holding shares, {bfd}; no packing of them saves "
            f"more than {_num(d['repack_saves_at_most_gpus_mean'], several)} (arc-flow LP bound).{kept}")


def idle_section(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """HTML for the policies whose summary has ``idle``; empty when none has."""
    summ = {p: s for p, s in summary.items() if s.get("idle")}
    if not summ:
        return ""
    several = any(s.get("runs", 1) > 1 for s in summ.values())
    kinds = hole_kinds(summ, 1)
    lead = ("<p class='note'>Two questions per policy" + (" (means over seeds)" if several else "") + ": how full was the "
            "cluster when the policy first turned a pod away (the saturation point, first plot), and what is idle at the "
            "moment the arrived GPU demand reaches the cluster's capacity: whole GPUs, or slivers beside the pods on partly "
            "used GPUs (second plot)"
            + (f"; the largest kind of sliver here is the one beside <b>{html.escape(kinds[0])}</b>" if kinds else "") + ".</p>")
    rows = []
    for p, s in summ.items():
        d = s["idle"]
        top = next(iter(d["holes_mean"].items()), None)
        rows.append([p, "-" if d["saturation_mean"] is None else f"{100 * d['saturation_mean']:.1f}%",
                     "-" if s["unallocated_gpu_pct_mean"] is None else f"{s['unallocated_gpu_pct_mean']:.2f}",
                     _num(d["idle_gpus_mean"], True), _num(d["whole_idle_gpus_mean"], True), _num(d["sliver_gpus_mean"], True),
                     _num(d["cpu_stranded_gpus_mean"], True),
                     f"{top[0]}: {top[1]:.1f}" if top else "-",
                     _num(d["share_gpus_mean"], several), _num(d["repack_bfd_gpus_mean"], several), _num(d["repack_lower_gpus_mean"], several),
                     "-" if d.get("bound_placing_first_pct_mean") is None else f"{d['bound_placing_first_pct_mean']:.2f}"])
    table = table_html(["policy", "first pod turned away", "unallocated GPU %", "idle GPUs", "whole idle", "slivers", "CPU-stranded",
                        "largest sliver kind", "GPUs holding shares", "BFD repack", "LP bound", "bound keeping its first pods %"], rows)
    sentences = "<ul>" + "".join(f"<li>{html.escape(repack_sentence(p, s['idle'], several))}</li>" for p, s in summ.items()) + "</ul>"
    return (lead + saturation_plot(summ) + holes_plot(summ)
            + "<p><b>Repack yardstick</b> (could a better placement of the same shares free GPUs?)</p>" + sentences
            + table + definitions_html(IDLE_METRICS))


__all__ = ["hole_kinds", "holes_plot", "idle_section", "repack_sentence", "saturation_plot"]
