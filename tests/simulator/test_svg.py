"""The reports' hand-written SVG charts (simulator/report/svg.py): well-formed, gaps kept, ticks and legends."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gpufleet.simulator.report.svg import Axes, figure, nice_ticks, tick_label

NS = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


@pytest.mark.parametrize("lo,hi,want", [
    (0.0, 100.0, [0, 20, 40, 60, 80, 100]),
    (-0.06, 15.9, [0, 5, 10, 15]),
    (0.0, 12.0, [0, 2.5, 5, 7.5, 10]),
    (3.1, 3.6, [3.1, 3.2, 3.3, 3.4, 3.5, 3.6]),
])
def test_nice_ticks_fall_on_round_numbers(lo, hi, want):
    assert nice_ticks(lo, hi) == pytest.approx(want)


def test_tick_labels_show_the_digits_the_step_needs():
    assert [tick_label(t, [0, 2.5, 5]) for t in (0, 2.5, 5)] == ["0.0", "2.5", "5.0"]
    assert [tick_label(t, [0, 1000, 2000]) for t in (0, 1000, 2000)] == ["0", "1,000", "2,000"]


def test_a_line_breaks_where_values_are_missing_and_text_is_escaped():
    ax = Axes(title="a <b> & c", xlabel="x", ylabel="y")
    ax.line([0, 1, 2, 3, 4], [1.0, 2.0, None, float("nan"), 5.0], "#123456", label="p<1>")
    ax.line([0, 1], [2.0, 3.0], "#654321", label="p<1>")  # same label: one legend entry
    root = _parse(figure([ax]))
    lines = root.findall(f".//{NS}polyline")
    assert [len(pl.get("points", "").split()) for pl in lines] == [2, 1, 2]
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "a <b> & c" in texts and texts.count("p<1>") == 1


def test_bars_errors_reference_lines_and_a_legend_below():
    ax = Axes(xcats=["random", "default"], xcat_rotate=True, legend="below", legend_cols=2, ylim=(-1, 20))
    ax.bar(0, 13.8, 0.4, "#111111", label="ours", err=0.5)
    ax.bar(1, 3.6, 0.4, "#111111", label="ours")
    ax.hline(3.11, "#d62728", label="offline bound", dash="--")
    ax.hline(3.5, "black", x0=0.8, x1=1.2, dash=":")
    ax.text(1, 3.6, "3.60 best", bold=True)
    root = _parse(figure([ax], 720, 400))
    rects = [r for r in root.iter(f"{NS}rect") if r.get("fill") == "#111111"]
    assert len(rects) == 3  # two bars and the legend's swatch
    assert {t.text for t in root.iter(f"{NS}text")} >= {"random", "default", "3.60 best", "ours", "offline bound"}
    tall, short = sorted(rects[:2], key=lambda r: -float(r.get("height", 0)))
    assert float(tall.get("height", 0)) / float(short.get("height", 1)) == pytest.approx(13.8 / 3.6, rel=1e-3)


def test_symlog_axis_ticks_powers_of_ten_and_panels_share_one_svg():
    a = Axes(ylog=True)
    a.line([0.6, 0.8, 1.0, 1.2], [0.0, 0.0, 15.0, 1800.0], "#000000", marker="o")
    b = Axes(ycats=["x", "y"], show_yticks=False)
    b.dot(1.0, 0.0, "#ff0000", xerr=0.2)
    b.barh(1.0, 2.0, 0.5, "#00ff00", label="held")
    svg = figure([a, b], 800, 300, title="two panels")
    root = _parse(svg)
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert {"0", "1", "10", "100", "1,000"} <= set(texts) and "two panels" in texts
    assert "x" not in texts and "held" in texts  # the second panel's y labels are the first's
    assert svg.count("<svg") == 1 and len(root.findall(f".//{NS}circle")) == 5
