"""A single self-contained HTML report: curves and bars a person would rather look at.

Plots are drawn with matplotlib into inline SVG, so the file opens in any
browser with no network and no other files.
"""

from __future__ import annotations

import html
import io
import json
import warnings
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    s = buf.getvalue()
    return s[s.find("<svg"):]


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, legend_cols: int = 1) -> str:
    """Every plot's labels, light grid and small legend, as SVG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=legend_cols)
    return _svg(fig)


def _mean_curve(runs: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    arr = np.array([[np.nan if v is None else v for v in r[key]] for r in runs], dtype=float)
    with warnings.catch_warnings():  # bins no run reached are NaN: drawn as gaps
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(arr, axis=0), np.nanstd(arr, axis=0)


def curves_plot(by_policy: Mapping[str, list[Mapping[str, Any]]], key: str, ylabel: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (pol, runs) in enumerate(by_policy.items()):
        x = np.array(runs[0]["arrived_pct"], dtype=float)
        m, s = _mean_curve(runs, key)
        c = PALETTE[i % len(PALETTE)]
        ax.plot(x, m, label=pol, color=c, lw=1.6)
        if len(runs) > 1:
            ax.fill_between(x, m - s, m + s, color=c, alpha=0.15, lw=0)
    return _finish(fig, ax, "arrived GPU request (% of cluster GPU capacity)", ylabel, title, legend_cols=2)


def bars_plot(summary: Mapping[str, Mapping[str, Any]], published: Mapping[str, float], bound: float | None) -> str:
    pols = list(summary)
    ours = [summary[p]["unallocated_gpu_pct_mean"] for p in pols]
    several = any(summary[p].get("runs", 1) > 1 for p in pols)  # error bars only mean something over several seeds
    errs = [summary[p].get("unallocated_gpu_pct_std", 0.0) for p in pols] if several else None
    pub = [published.get(p, np.nan) for p in pols]
    x = np.arange(len(pols))
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    w = 0.38 if any(not np.isnan(v) for v in pub) else 0.6
    ax.bar(x - (w / 2 if w < 0.5 else 0), ours, w, yerr=errs, label="gpufleet", color=PALETTE[0])
    if w < 0.5:
        ax.bar(x + w / 2, pub, w, label="FGD paper (published)", color=PALETTE[1])
    top = max([v for v in ours + pub if not np.isnan(v)] + [bound or 0.0, 1.0])
    if bound is not None:  # can be ~0 (pods that all fit): lift the axis floor so the line is not hidden by the x axis
        ax.set_ylim(-0.06 * top, top * 1.15)
        ax.axhline(bound, color="#d62728", ls="--", lw=2, label=f"offline bound ({bound:.2f}%)", zorder=5)
        ax.text(-0.45, bound + 0.02 * top, f"offline bound {bound:.2f}%", color="#d62728", ha="left", va="bottom", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    keep = [(summary[p].get("idle") or {}).get("bound_placing_first_pct_mean") for p in pols]
    labelled = False
    for xi, k in zip(x, keep):  # per policy: the least any placement keeping its first pods could leave
        if k is not None:
            c = xi - (w / 2 if w < 0.5 else 0)
            ax.hlines(k, c - w / 2, c + w / 2, colors="black", lw=2, linestyles=":", zorder=6,
                      label="_nolegend_" if labelled else "bound keeping the policy's first pods")
            labelled = True
    best = int(np.nanargmin(ours)) if ours else -1
    for xi, v in zip(x, ours):
        ax.text(xi - (w / 2 if w < 0.5 else 0), v + 0.01 * top, f"{v:.2f}" + (" best" if xi == best else ""), ha="center",
                va="bottom", fontsize=7, fontweight="bold" if xi == best else "normal")
    ax.set_xticks(x, pols, rotation=20)
    ax.set_ylabel("unallocated GPU % at 100% arrived")
    ax.set_title("GPUs left unallocated when the workload equals cluster capacity (lower is better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)  # below: bars stay readable
    return _svg(fig)


def time_plot(series: Mapping[str, Mapping[str, Sequence[float]]], key: str, ylabel: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for i, (pol, s) in enumerate(series.items()):
        ax.plot(np.array(s["t_h"]), np.array(s[key]), label=pol, color=PALETTE[i % len(PALETTE)], lw=1.2)
    return _finish(fig, ax, "simulated time (hours)", ylabel, title)


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], marked: Sequence[int] = ()) -> str:
    """A table; rows whose index is in ``marked`` are highlighted (the best policy)."""
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(("<tr class='best'>" if i in marked else "<tr>") + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for i, r in enumerate(rows))
    return f"<div class='wide'><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>"


def definitions_html(defs: Sequence[tuple[str, str]]) -> str:
    """One line per metric: what the number means."""
    return "<dl class='defs'>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in defs) + "</dl>"


def provenance_html(prov: Mapping[str, Any]) -> str:
    rows = [(k, str(v)) for k, v in prov.items() if k != "inputs"]
    for f in prov.get("inputs", []):
        rows.append((f"input: {f['role']}", f"{f['file']}, sha256 {f['sha256']}"))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(v)}</code></td></tr>" for k, v in rows)
    return f"<div class='wide'><table class='prov'><tbody>{body}</tbody></table></div>"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1em} .grid svg{width:100%;height:auto}
.note{color:#555;font-size:.9em} pre{background:#f7f7f7;padding:.6em;overflow:auto;white-space:pre-wrap}
.wide{overflow-x:auto;max-width:100%} tr.best td{font-weight:bold;background:#eef7ee}
.defs{font-size:.9em;display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em} .defs dt{font-weight:bold} .defs dd{margin:0}
svg{max-width:100%;height:auto} body{padding:0 1em}
table.prov td,table.prov th{text-align:left} table.prov th{white-space:nowrap} table.prov td{word-break:break-all}
@media (max-width:900px){.grid{grid-template-columns:1fr} .defs{grid-template-columns:1fr} .defs dd{margin-left:1em}}
"""


def write_report(path: str, title: str, sections: Sequence[tuple[str, str]], params: Mapping[str, Any],
                 provenance: Mapping[str, Any] | None = None) -> None:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width, initial-scale=1'>"
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    if provenance:
        parts.append("<h2>Provenance</h2>" + provenance_html(provenance))
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    parts.append("<h2>Run parameters</h2><pre>" + html.escape(json.dumps(params, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>")
    with open(path, "w") as f:
        f.write("\n".join(parts))
