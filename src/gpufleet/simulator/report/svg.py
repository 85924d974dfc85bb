"""Hand-written SVG charts for the reports: lines, bands, bars, dots, reference lines and legends.

Why not matplotlib: the reports need a few plain chart kinds, and drawing them through matplotlib cost the
main job (``gpufleet simulate``) about 1.7 CPU s of its ~10 s (importing it, laying out six figures, turning
every glyph into a path), all of it after the runs, when no worker shares the time.  Writing the SVG
elements directly takes milliseconds and keeps the report one self-contained file: the text stays text
(searchable, copyable), and nothing is fetched when it opens.

An ``Axes`` collects what to draw in data coordinates; a ``Figure`` lays out one or more axes side by side
and returns the ``<svg>`` element.  Limits follow the data with a small margin (as matplotlib's do), ticks
fall on 1, 2, 2.5 and 5 times a power of ten; ``ylog`` is a symmetric log scale, linear within +-1 (for
delays that are 0 at low load and hours at high load).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FONT = "system-ui,-apple-system,Segoe UI,Roboto,sans-serif"
CHAR_W = 0.58  # average glyph width in ems, for laying out labels without measuring them


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _text_w(s: str, size: float) -> float:
    return max((len(line) for line in s.split("\n")), default=0) * size * CHAR_W


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Ticks on 1, 2, 2.5 or 5 times a power of ten covering [lo, hi], about ``target`` of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(target - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 10) + 0.0)
        v += step
    return out


def tick_label(v: float, ticks: Sequence[float]) -> str:
    """``v`` with as many decimals as the ticks' step needs (2.5 -> one, 0.25 -> two, 1,000 -> none)."""
    step = min((abs(b - a) for a, b in zip(ticks, ticks[1:])), default=1.0) or 1.0
    digits = next((d for d in range(7) if abs(round(step, d) - step) < 1e-9 * max(step, 1e-12)), 6)
    s = f"{(0.0 if abs(v) < step * 1e-9 else v):,.{digits}f}"
    return s


def _symlog(v: float) -> float:
    return v if abs(v) <= 1.0 else math.copysign(1.0 + math.log10(abs(v)), v)


@dataclass
class _Item:
    kind: str
    args: dict[str, Any]
    label: str | None = None


@dataclass
class Axes:
    """One plot area; methods take data coordinates (categories: 0, 1, 2, ... as set by ``xcats``/``ycats``)."""

    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    ylog: bool = False
    xcats: list[str] | None = None  # category names on the x axis, at 0, 1, 2, ...
    ycats: list[str] | None = None  # category names on the y axis, at 0, 1, 2, ... (bottom up)
    xcat_rotate: bool = False
    grid: str = "both"  # "both", "x", "y"
    xlim: tuple[float, float] | None = None
    ylim: tuple[float, float] | None = None
    legend: str = "best"  # "best" (inside, upper left or right), "below", "" (none)
    legend_cols: int = 1
    show_yticks: bool = True  # off for a panel that shares the y axis of the one on its left
    title_size: float = 12.0
    label_size: float = 10.0
    items: list[_Item] = field(default_factory=list)

    def line(self, xs: Sequence[float], ys: Sequence[float | None], color: str, label: str | None = None, width: float = 1.6,
             dash: str = "", marker: str = "") -> None:
        """A polyline; None or NaN leaves a gap.  ``dash``: "--" or ":"; ``marker``: "o" or "."."""
        self.items.append(_Item("line", {"xs": list(xs), "ys": list(ys), "color": color, "width": width, "dash": dash,
                                         "marker": marker}, label))

    def band(self, xs: Sequence[float], lo: Sequence[float | None], hi: Sequence[float | None], color: str,
             opacity: float = 0.15) -> None:
        self.items.append(_Item("band", {"xs": list(xs), "lo": list(lo), "hi": list(hi), "color": color, "opacity": opacity}))

    def bar(self, x: float, height: float, width: float, color: str, label: str | None = None, err: float | None = None) -> None:
        self.items.append(_Item("bar", {"x": x, "h": height, "w": width, "color": color, "err": err}, label))

    def barh(self, y: float, width: float, left: float, color: str, label: str | None = None, height: float = 0.65) -> None:
        self.items.append(_Item("barh", {"y": y, "w": width, "left": left, "color": color, "h": height}, label))

    def dot(self, x: float, y: float, color: str, xerr: float | None = None, size: float = 4.0) -> None:
        self.items.append(_Item("dot", {"x": x, "y": y, "color": color, "xerr": xerr, "r": size}))

    def hline(self, y: float, color: str, label: str | None = None, x0: float | None = None, x1: float | None = None,
              width: float = 1.0, dash: str = "") -> None:
        """A horizontal line at ``y``: across the plot, or from ``x0`` to ``x1``."""
        self.items.append(_Item("hline", {"y": y, "x0": x0, "x1": x1, "color": color, "width": width, "dash": dash}, label))

    def vline(self, x: float, color: str, label: str | None = None, width: float = 1.0, dash: str = "") -> None:
        self.items.append(_Item("vline", {"x": x, "color": color, "width": width, "dash": dash}, label))

    def text(self, x: float, y: float, s: str, size: float = 8.0, anchor: str = "middle", color: str = "#222",
             bold: bool = False, dy_px: float = 0.0, dx_px: float = 0.0, backdrop: bool = False, baseline: str = "auto") -> None:
        self.items.append(_Item("text", {"x": x, "y": y, "s": s, "size": size, "anchor": anchor, "color": color,
                                         "bold": bold, "dy": dy_px, "dx": dx_px, "backdrop": backdrop, "baseline": baseline}))

    # --- layout -------------------------------------------------------------------------------

    def _extent(self) -> tuple[float, float, float, float]:
        xs: list[float] = []
        ys: list[float] = []
        for it in self.items:
            a = it.args
            if it.kind == "line":
                pts = [(x, y) for x, y in zip(a["xs"], a["ys"]) if _ok(y) and _ok(x)]
                xs += [p[0] for p in pts]
                ys += [p[1] for p in pts]
            elif it.kind == "band":
                for x, lo, hi in zip(a["xs"], a["lo"], a["hi"]):
                    if _ok(lo) and _ok(hi):
                        xs.append(x)
                        ys += [lo, hi]
            elif it.kind == "bar":
                xs += [a["x"] - a["w"] / 2, a["x"] + a["w"] / 2]
                if _ok(a["h"]):
                    ys += [0.0, a["h"] + (a["err"] or 0.0)]
            elif it.kind == "barh":
                ys += [a["y"] - a["h"] / 2, a["y"] + a["h"] / 2]
                if _ok(a["w"]):
                    xs += [a["left"], a["left"] + a["w"]]
            elif it.kind == "dot":
                if _ok(a["x"]):
                    e = a["xerr"] or 0.0
                    xs += [a["x"] - e, a["x"] + e]
                ys.append(a["y"])
            elif it.kind == "hline":
                ys.append(a["y"])
            elif it.kind == "vline":
                xs.append(a["x"])
        if self.ylog:
            ys = [_symlog(y) for y in ys]
        x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
        if x1 <= x0:
            x0, x1 = x0 - 0.5, x1 + 0.5
        if y1 <= y0:
            y0, y1 = y0 - 0.5, y1 + 0.5
        kinds = {it.kind for it in self.items}
        if self.xcats is None and self.xlim is None:
            m = 0.05 * (x1 - x0)
            x0, x1 = (x0 if x0 == 0 and "barh" in kinds else x0 - m), x1 + m  # bars stand on the axis
        if self.ycats is None and self.ylim is None:
            m = 0.05 * (y1 - y0)
            y0, y1 = (y0 if y0 == 0 and "bar" in kinds else y0 - m), y1 + m
        if self.xcats is not None:
            x0, x1 = min(x0, -0.5), max(x1, len(self.xcats) - 0.5)
        if self.ycats is not None:
            y0, y1 = min(y0, -0.5), max(y1, len(self.ycats) - 0.5)
        if self.xlim is not None:
            x0, x1 = self.xlim
        if self.ylim is not None:
            y0, y1 = (_symlog(self.ylim[0]), _symlog(self.ylim[1])) if self.ylog else self.ylim
        return x0, x1, y0, y1

    def _yticks(self, y0: float, y1: float) -> list[tuple[float, str]]:
        if self.ycats is not None:
            return [(float(i), c) for i, c in enumerate(self.ycats)]
        if self.ylog:  # powers of ten; with 2 and 5 times them too where the range spans few decades
            for mults in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7)):
                out: list[tuple[float, str]] = []
                for v in [0.0] + [m * 10.0 ** k for k in range(0, 12) for m in mults]:
                    for sv in ((v,) if v == 0 else (v, -v)):
                        t = _symlog(sv)
                        if y0 - 1e-9 <= t <= y1 + 1e-9:
                            out.append((t, f"{sv:,.0f}" if abs(sv) >= 1 or sv == 0 else f"{sv:g}"))
                if len(out) >= 4:
                    break
            return sorted(out)
        ticks = nice_ticks(y0, y1)
        return [(t, tick_label(t, ticks)) for t in ticks]

    def _xticks(self, x0: float, x1: float) -> list[tuple[float, str]]:
        if self.xcats is not None:
            return [(float(i), c) for i, c in enumerate(self.xcats)]
        ticks = nice_ticks(x0, x1)
        return [(t, tick_label(t, ticks)) for t in ticks]

    def margins(self) -> tuple[float, float, float, float]:
        """Pixels left, right, top, bottom around the plot area for ticks, labels, title and a legend below."""
        x0, x1, y0, y1 = self._extent()
        ticks = self._yticks(y0, y1)
        left = (10 + max((_text_w(s, 9) for _, s in ticks), default=0) if self.show_yticks else 12.0) + (18 if self.ylabel else 0)
        top = 8 + (self.title_size * 1.4 * (self.title.count("\n") + 1) if self.title else 0)
        xt = self._xticks(x0, x1)
        bottom = 22.0
        if self.xcats is not None and self.xcat_rotate:
            bottom = 10 + max((_text_w(s, 9) for _, s in xt), default=0) * 0.45 + 12
        bottom += self.label_size * 1.3 * (self.xlabel.count("\n") + 1) if self.xlabel else 0
        if self.legend == "below":
            bottom += 8 + 15 * math.ceil(len(self._legend_entries()) / max(self.legend_cols, 1))
        return left, 14.0, top, bottom

    def _legend_entries(self) -> list[_Item]:
        seen: set[str] = set()
        out = []
        for it in self.items:
            if it.label and it.label not in seen:
                seen.add(it.label)
                out.append(it)
        return out

    def render(self, ox: float, oy: float, w: float, h: float) -> list[str]:
        """SVG elements for this axes in the box (ox, oy, w, h) of the figure."""
        ml, mr, mt, mb = self.margins()
        px0, py0 = ox + ml, oy + mt
        pw, ph = max(w - ml - mr, 10.0), max(h - mt - mb, 10.0)
        x0, x1, y0, y1 = self._extent()

        def X(v: float) -> float:
            return px0 + (v - x0) / (x1 - x0) * pw

        def Y(v: float) -> float:
            t = _symlog(v) if self.ylog else v
            return py0 + ph - (t - y0) / (y1 - y0) * ph

        def Yt(t: float) -> float:  # an already transformed value (ticks)
            return py0 + ph - (t - y0) / (y1 - y0) * ph

        out = [f'<g font-family="{FONT}" fill="#222">']
        out.append(f'<clipPath id="c{id(self)}"><rect x="{_fmt(px0)}" y="{_fmt(py0)}" width="{_fmt(pw)}" height="{_fmt(ph)}"/></clipPath>')
        yt, xt = self._yticks(y0, y1), self._xticks(x0, x1)
        for t, s in yt:
            yy = Yt(t)
            if self.grid in ("both", "y"):
                out.append(f'<line x1="{_fmt(px0)}" x2="{_fmt(px0 + pw)}" y1="{_fmt(yy)}" y2="{_fmt(yy)}" stroke="#ccc" stroke-width="0.6"/>')
            if self.show_yticks:
                out.append(f'<text x="{_fmt(px0 - 5)}" y="{_fmt(yy)}" font-size="9" text-anchor="end" dominant-baseline="middle">{_esc(s)}</text>')
        for t, s in xt:
            xx = X(t)
            if self.grid in ("both", "x"):
                out.append(f'<line x1="{_fmt(xx)}" x2="{_fmt(xx)}" y1="{_fmt(py0)}" y2="{_fmt(py0 + ph)}" stroke="#ccc" stroke-width="0.6"/>')
            if self.xcats is not None and self.xcat_rotate:
                out.append(f'<text transform="translate({_fmt(xx)},{_fmt(py0 + ph + 8)}) rotate(-20)" font-size="9" '
                           f'text-anchor="end" dominant-baseline="hanging">{_esc(s)}</text>')
            else:
                out.append(f'<text x="{_fmt(xx)}" y="{_fmt(py0 + ph + 5)}" font-size="9" text-anchor="middle" '
                           f'dominant-baseline="hanging">{_esc(s)}</text>')
        clip = f' clip-path="url(#c{id(self)})"'
        for it in self.items:
            out += self._draw(it, X, Y, clip)
        out.append(f'<rect x="{_fmt(px0)}" y="{_fmt(py0)}" width="{_fmt(pw)}" height="{_fmt(ph)}" fill="none" stroke="#444" stroke-width="0.8"/>')
        if self.title:
            for i, line in enumerate(self.title.split("\n")):
                out.append(f'<text x="{_fmt(px0 + pw / 2)}" y="{_fmt(oy + 6 + self.title_size * (1.1 + 1.4 * i))}" '
                           f'font-size="{_fmt(self.title_size)}" text-anchor="middle">{_esc(line)}</text>')
        if self.ylabel:
            out.append(f'<text transform="translate({_fmt(ox + 12)},{_fmt(py0 + ph / 2)}) rotate(-90)" font-size="{_fmt(self.label_size)}" '
                       f'text-anchor="middle">{_esc(self.ylabel)}</text>')
        below = py0 + ph + (22 if not (self.xcats is not None and self.xcat_rotate)
                            else 10 + max((_text_w(s, 9) for _, s in xt), default=0) * 0.45 + 12)
        if self.xlabel:
            for line in self.xlabel.split("\n"):
                below += self.label_size * 1.3
                out.append(f'<text x="{_fmt(px0 + pw / 2)}" y="{_fmt(below - 3)}" font-size="{_fmt(self.label_size)}" '
                           f'text-anchor="middle">{_esc(line)}</text>')
        entries = self._legend_entries()
        if entries and self.legend:
            out += self._legend(entries, px0, py0, pw, ph, below + 8)
        out.append("</g>")
        return out

    def _draw(self, it: _Item, X, Y, clip: str) -> list[str]:
        a = it.args
        k = it.kind
        dash = {"--": ' stroke-dasharray="6,3"', ":": ' stroke-dasharray="1.5,2.5"'}.get(a.get("dash", ""), "")
        out: list[str] = []
        if k == "line":
            segs: list[list[str]] = []
            seg: list[str] = []
            pts = []
            for x, y in zip(a["xs"], a["ys"]):
                if _ok(y) and _ok(x):
                    seg.append(f"{_fmt(X(x))},{_fmt(Y(y))}")
                    pts.append((X(x), Y(y)))
                elif seg:
                    segs.append(seg)
                    seg = []
            if seg:
                segs.append(seg)
            svg = [f'<polyline points="{" ".join(s)}" fill="none" stroke="{a["color"]}" stroke-width="{_fmt(a["width"])}"'
                   f' stroke-linejoin="round"{dash}{clip}/>' for s in segs]
            r = {"o": 3.0, ".": 1.8}.get(a["marker"])
            if r:
                svg += [f'<circle cx="{_fmt(px)}" cy="{_fmt(py)}" r="{r}" fill="{a["color"]}"/>' for px, py in pts]
            return svg
        if k == "band":
            seg_lo: list[tuple[float, float]] = []
            seg_hi: list[tuple[float, float]] = []
            for x, lo, hi in [*zip(a["xs"], a["lo"], a["hi"]), (None, None, None)]:
                if x is not None and _ok(lo) and _ok(hi):
                    seg_lo.append((X(x), Y(lo)))
                    seg_hi.append((X(x), Y(hi)))
                elif seg_lo:
                    pts = seg_hi + seg_lo[::-1]
                    out.append(f'<polygon points="{" ".join(f"{_fmt(p)},{_fmt(q)}" for p, q in pts)}" fill="{a["color"]}" '
                               f'fill-opacity="{a["opacity"]}" stroke="none"{clip}/>')
                    seg_lo, seg_hi = [], []
            return out
        if k == "bar":
            if not _ok(a["h"]):
                return []
            xl, xr = X(a["x"] - a["w"] / 2), X(a["x"] + a["w"] / 2)
            yt, yb = Y(max(a["h"], 0.0)), Y(min(a["h"], 0.0))
            out.append(f'<rect x="{_fmt(xl)}" y="{_fmt(yt)}" width="{_fmt(xr - xl)}" height="{_fmt(yb - yt)}" fill="{a["color"]}"{clip}/>')
            if a["err"]:
                xc = X(a["x"])
                e0, e1 = Y(a["h"] - a["err"]), Y(a["h"] + a["err"])
                out.append(f'<path d="M{_fmt(xc)},{_fmt(e0)}V{_fmt(e1)}M{_fmt(xc - 3)},{_fmt(e0)}h6M{_fmt(xc - 3)},{_fmt(e1)}h6" '
                           f'stroke="#222" stroke-width="1" fill="none"/>')
            return out
        if k == "barh":
            if not _ok(a["w"]) or a["w"] <= 0:
                return []
            xl, xr = X(a["left"]), X(a["left"] + a["w"])
            yt, yb = Y(a["y"] + a["h"] / 2), Y(a["y"] - a["h"] / 2)
            return [f'<rect x="{_fmt(xl)}" y="{_fmt(yt)}" width="{_fmt(xr - xl)}" height="{_fmt(yb - yt)}" fill="{a["color"]}"{clip}/>']
        if k == "dot":
            if not _ok(a["x"]):
                return []
            cx, cy = X(a["x"]), Y(a["y"])
            if a["xerr"]:
                e0, e1 = X(a["x"] - a["xerr"]), X(a["x"] + a["xerr"])
                out.append(f'<path d="M{_fmt(e0)},{_fmt(cy)}H{_fmt(e1)}M{_fmt(e0)},{_fmt(cy - 3)}v6M{_fmt(e1)},{_fmt(cy - 3)}v6" '
                           f'stroke="{a["color"]}" stroke-width="1" fill="none"/>')
            out.append(f'<circle cx="{_fmt(cx)}" cy="{_fmt(cy)}" r="{_fmt(a["r"])}" fill="{a["color"]}"/>')
            return out
        if k == "hline":
            yy = Y(a["y"])  # across the plot (the clip ends it there), or from x0 to x1
            xa, xb = ("0%", "100%") if a["x0"] is None or a["x1"] is None else (_fmt(X(a["x0"])), _fmt(X(a["x1"])))
            return [f'<line x1="{xa}" x2="{xb}" y1="{_fmt(yy)}" y2="{_fmt(yy)}" stroke="{a["color"]}" '
                    f'stroke-width="{_fmt(a["width"])}"{dash}{clip}/>']
        if k == "vline":
            xx = X(a["x"])
            return [f'<line x1="{_fmt(xx)}" x2="{_fmt(xx)}" y1="0%" y2="100%" stroke="{a["color"]}" '
                    f'stroke-width="{_fmt(a["width"])}"{dash}{clip}/>']
        if k == "text":
            if not (_ok(a["x"]) and _ok(a["y"])):
                return []
            tx, ty = X(a["x"]) + a["dx"], Y(a["y"]) + a["dy"]
            weight = ' font-weight="bold"' if a["bold"] else ""
            base = "" if a["baseline"] == "auto" else f' dominant-baseline="{a["baseline"]}"'
            if a["backdrop"]:
                tw = _text_w(a["s"], a["size"])
                bx = tx - (tw / 2 if a["anchor"] == "middle" else tw if a["anchor"] == "end" else 0)
                out.append(f'<rect x="{_fmt(bx - 1)}" y="{_fmt(ty - a["size"])}" width="{_fmt(tw + 2)}" height="{_fmt(a["size"] * 1.25)}" '
                           f'fill="white" fill-opacity="0.8"/>')
            out.append(f'<text x="{_fmt(tx)}" y="{_fmt(ty)}" font-size="{_fmt(a["size"])}" text-anchor="{a["anchor"]}" '
                       f'fill="{a["color"]}"{weight}{base}>{_esc(a["s"])}</text>')
            return out
        raise ValueError(f"unknown chart item {k!r}")  # pragma: no cover - only the methods above add items

    def _legend(self, entries: list[_Item], px0: float, py0: float, pw: float, ph: float, below_y: float) -> list[str]:
        size = 8.0
        cols = max(1, self.legend_cols)
        col_w = max(_text_w(e.label or "", size) for e in entries) + 26
        rows = math.ceil(len(entries) / cols)
        box_w, box_h = col_w * cols + 6, rows * 14 + 6
        if self.legend == "below":
            bx, by = px0 + (pw - box_w) / 2, below_y
            frame = ""
        else:  # inside, in the upper corner the data leave emptier
            bx, by = self._corner(box_w, box_h, px0, py0, pw, ph), py0 + 6
            frame = (f'<rect x="{_fmt(bx)}" y="{_fmt(by)}" width="{_fmt(box_w)}" height="{_fmt(box_h)}" fill="white" '
                     f'fill-opacity="0.85" stroke="#ccc" stroke-width="0.6" rx="2"/>')
        out = [frame] if frame else []
        for i, e in enumerate(entries):
            cx, cy = bx + 4 + (i // rows) * col_w, by + 10 + (i % rows) * 14  # down each column first
            a = e.args
            if e.kind in ("bar", "barh"):
                out.append(f'<rect x="{_fmt(cx)}" y="{_fmt(cy - 5)}" width="16" height="8" fill="{a["color"]}"/>')
            else:
                dash = {"--": ' stroke-dasharray="6,3"', ":": ' stroke-dasharray="1.5,2.5"'}.get(a.get("dash", ""), "")
                out.append(f'<line x1="{_fmt(cx)}" x2="{_fmt(cx + 16)}" y1="{_fmt(cy - 1)}" y2="{_fmt(cy - 1)}" stroke="{a["color"]}" '
                           f'stroke-width="{_fmt(min(a.get("width", 1.6), 2.5))}"{dash}/>')
                if a.get("marker") == "o":
                    out.append(f'<circle cx="{_fmt(cx + 8)}" cy="{_fmt(cy - 1)}" r="2.5" fill="{a["color"]}"/>')
            out.append(f'<text x="{_fmt(cx + 21)}" y="{_fmt(cy + 2)}" font-size="{_fmt(size)}">{_esc(e.label or "")}</text>')
        return out

    def _corner(self, box_w: float, box_h: float, px0: float, py0: float, pw: float, ph: float) -> float:
        """x of the legend box: the upper corner (left or right) where fewer line points fall."""
        x0, x1, y0, y1 = self._extent()
        frac_w, frac_h = min(box_w / pw, 1.0), min((box_h + 6) / ph, 1.0)
        counts = [0, 0]
        for it in self.items:
            if it.kind != "line":
                continue
            for x, y in zip(it.args["xs"], it.args["ys"]):
                if not (_ok(x) and _ok(y)):
                    continue
                fx = (x - x0) / (x1 - x0)
                fy = ((_symlog(y) if self.ylog else y) - y0) / (y1 - y0)
                if fy >= 1 - frac_h:
                    counts[0] += fx <= frac_w
                    counts[1] += fx >= 1 - frac_w
        return px0 + 6 if counts[0] < counts[1] else px0 + pw - box_w - 6


def _ok(v: Any) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def figure(axes: Sequence[Axes], width: float = 720.0, height: float = 400.0, title: str = "") -> str:
    """One ``<svg>`` with ``axes`` side by side, ``title`` above them all."""
    top = 22.0 if title else 0.0
    n = len(axes)
    w = width / n
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_fmt(width)} {_fmt(height)}" width="{_fmt(width)}" '
             f'height="{_fmt(height)}" role="img"><rect width="100%" height="100%" fill="white"/>']
    if title:
        parts.append(f'<text x="{_fmt(width / 2)}" y="15" font-family="{FONT}" font-size="11" text-anchor="middle">{_esc(title)}</text>')
    for i, ax in enumerate(axes):
        parts += ax.render(i * w, top, w, height - top)
    parts.append("</svg>")
    return "".join(parts)
