"""A single self-contained HTML report: curves and bars a person would rather look at.

Plots are inline SVG written by ``svg.py`` (no plotting library), so the file opens in any browser with no
network and no other files, and writing it costs milliseconds.
"""

from __future__ import annotations

import html
import json
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from .svg import Axes, figure

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def _mean_curve(runs: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    arr = np.array([[np.nan if v is None else v for v in r[key]] for r in runs], dtype=float)
    with warnings.catch_warnings():  # bins no run reached are NaN: drawn as gaps
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(arr, axis=0), np.nanstd(arr, axis=0)


def curves_plot(by_policy: Mapping[str, list[Mapping[str, Any]]], key: str, ylabel: str, title: str) -> str:
    ax = Axes(title=title, xlabel="arrived GPU request (% of cluster GPU capacity)", ylabel=ylabel, legend_cols=2)
    for i, (pol, runs) in enumerate(by_policy.items()):
        x = [float(v) for v in runs[0]["arrived_pct"]]
        m, s = _mean_curve(runs, key)
        c = PALETTE[i % len(PALETTE)]
        if len(runs) > 1:
            ax.band(x, (m - s).tolist(), (m + s).tolist(), c)
        ax.line(x, m.tolist(), c, label=pol)
    return figure([ax], 720, 400)


def bars_plot(summary: Mapping[str, Mapping[str, Any]], published: Mapping[str, float], bound: float | None) -> str:
    pols = list(summary)
    ours = [summary[p]["unallocated_gpu_pct_mean"] for p in pols]
    several = any(summary[p].get("runs", 1) > 1 for p in pols)  # error bars only mean something over several seeds
    errs = [summary[p].get("unallocated_gpu_pct_std", 0.0) for p in pols] if several else [None] * len(pols)
    pub = [published.get(p, np.nan) for p in pols]
    ax = Axes(title="GPUs left unallocated when the workload equals cluster capacity (lower is better)",
              ylabel="unallocated GPU % at 100% arrived", xcats=pols, xcat_rotate=True, grid="y", legend="below", legend_cols=2)
    w = 0.38 if any(not np.isnan(v) for v in pub) else 0.6
    shift = w / 2 if w < 0.5 else 0.0
    for xi, (v, e) in enumerate(zip(ours, errs)):
        ax.bar(xi - shift, v, w, PALETTE[0], label="gpufleet", err=e)
    if w < 0.5:
        for xi, v in enumerate(pub):
            ax.bar(xi + shift, v, w, PALETTE[1], label="FGD paper (published)")
    top = max([v for v in ours + pub if not np.isnan(v)] + [bound or 0.0, 1.0])
    if bound is not None:  # can be ~0 (pods that all fit): lift the axis floor so the line is not hidden by the x axis
        ax.ylim = (-0.06 * top, top * 1.15)
        ax.hline(bound, "#d62728", label=f"offline bound ({bound:.2f}%)", width=2, dash="--")
        ax.text(-0.45, bound + 0.02 * top, f"offline bound {bound:.2f}%", color="#d62728", anchor="start", backdrop=True)
    keep = [(summary[p].get("idle") or {}).get("bound_placing_first_pct_mean") for p in pols]
    for xi, k in enumerate(keep):  # per policy: the least any placement keeping its first pods could leave
        if k is not None:
            c = xi - shift
            ax.hline(k, "black", label="bound keeping the policy's first pods", x0=c - w / 2, x1=c + w / 2, width=2, dash=":")
    best = int(np.nanargmin(ours)) if ours else -1
    for xi, v in enumerate(ours):
        ax.text(xi - shift, v + 0.01 * top, f"{v:.2f}" + (" best" if xi == best else ""), size=7, bold=xi == best, dy_px=-2)
    return figure([ax], 720, 420)


def time_plot(series: Mapping[str, Mapping[str, Sequence[float]]], key: str, ylabel: str, title: str) -> str:
    ax = Axes(title=title, xlabel="simulated time (hours)", ylabel=ylabel)
    for i, (pol, s) in enumerate(series.items()):
        ax.line([float(v) for v in s["t_h"]], [float(v) for v in s[key]], PALETTE[i % len(PALETTE)], label=pol, width=1.2)
    return figure([ax], 720, 384)


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
