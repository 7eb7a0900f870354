"""The few plot types of the HTML replay report, drawn as inline SVG: no JavaScript at all.

Lines with markers (a ``None`` value is a gap: the line breaks there), markers alone, panels
stacked on one shared x axis, a dashed vertical mark with its label. Axes are linear, dates (UTC,
milliseconds) or categories. A point's text shows on hover (an SVG ``<title>``). Every text is
escaped with :func:`html.escape`, so a value from the input stays text.

Each element the report's browser test reads is marked: a plot is ``div.plot``, a series
``g.trace`` with ``data-name``, a marker ``.point``, an axis ``g.xaxis`` / ``g.yaxis`` with
``data-type``, ``data-ticks`` (JSON) and, for y, ``data-domain`` (the panel's share of the
height, 0 at the bottom), a vertical mark ``line.shape`` with ``data-x``, a label
``text.annotation``.
"""

from __future__ import annotations

import datetime
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = ["Axis", "Panel", "Series", "date_ticks", "integer_ticks", "nice_ticks", "render"]

WIDTH: Final = 960
_LEFT: Final = 70
_RIGHT: Final = 20
_TOP: Final = 30
_BOTTOM: Final = 50
_GAP: Final = 45
MARKERS_UP_TO: Final = 200
"""Points of a line drawn with a marker each (and its hover text); a longer line is drawn as a
line alone, so that two weeks of hourly lines per group stay a small page."""
_PALETTE: Final = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")

AxisType = Literal["linear", "date", "category"]


@dataclass
class Axis:
    """An axis from ``low`` to ``high`` (categories: indices), ticks as (value, label)."""

    type: AxisType
    low: float
    high: float
    ticks: list[tuple[float, str]]
    title: str = ""
    reversed: bool = False


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    colour: str | None = None
    lines: bool = True
    dash: bool = False
    texts: Sequence[str] = ()


@dataclass
class Panel:
    y: Axis
    series: list[Series]
    title: str = ""
    marks: list[float] = field(default_factory=list)
    """x values marked by a dashed vertical line."""
    mark_label: str = ""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def integer_ticks(largest: float) -> list[tuple[float, str]]:
    """Whole-number ticks from 0, at most about eight."""
    step = max(1, math.ceil(max(largest, 1) / 8))
    magnitude = 10 ** max(0, len(str(step)) - 1)
    step = math.ceil(step / magnitude) * magnitude
    top = max(step, math.ceil(max(largest, 1) / step) * step)
    return [(float(v), f"{v:,}") for v in range(0, top + 1, step)]


def nice_ticks(low: float, high: float, count: int = 8) -> list[tuple[float, str]]:
    """Round ticks covering ``low`` to ``high``."""
    span = high - low or 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step / 2:
        ticks.append((value, _fmt(value)))
        value += step
    return ticks


def date_ticks(
    first_ms: float, last_ms: float, step_ms: float, hourly: bool
) -> list[tuple[float, str]]:
    """Ticks on whole steps (hours or days), at most about twelve, labelled in UTC."""
    steps = max(1, round((last_ms - first_ms) / step_ms))
    every = max(1, math.ceil((steps + 1) / 12))
    form = "%Y-%m-%d %H:00" if hourly else "%Y-%m-%d"
    ticks = []
    value = first_ms
    while value <= last_ms:
        moment = datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
        ticks.append((value, moment.strftime(form)))
        value += step_ms * every
    return ticks


def render(name: str, x: Axis, panels: Sequence[Panel], *, panel_height: int = 360) -> str:
    """One plot: its SVG and its legend (the series' names, in the order given)."""
    height = _TOP + len(panels) * panel_height + (len(panels) - 1) * _GAP + _BOTTOM
    inner = height - _TOP - _BOTTOM
    plot_width = WIDTH - _LEFT - _RIGHT

    def to_x(value: float) -> float:
        share = (value - x.low) / ((x.high - x.low) or 1.0)
        return _LEFT + share * plot_width

    parts = [
        f'<svg class="main-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}"'
        f' width="100%" style="max-width:{WIDTH}px" role="img" aria-label="{_e(name)}"'
        ' font-family="system-ui, sans-serif" font-size="12">'
    ]
    legend: list[tuple[str, str, bool]] = []
    colour_index = 0
    bottom = 0.0
    for index, panel in enumerate(panels):
        top = _TOP + index * (panel_height + _GAP)
        bottom = top + panel_height
        y = panel.y

        def to_y(value: float, y: Axis = y, top: float = top, bottom: float = bottom) -> float:
            share = (value - y.low) / ((y.high - y.low) or 1.0)
            if y.reversed:
                share = 1 - share
            return bottom - share * (bottom - top)

        domain = [
            round((height - _BOTTOM - bottom) / inner, 4),
            round((height - _BOTTOM - top) / inner, 4),
        ]
        if panel.title:
            parts.append(
                f'<text x="{WIDTH / 2}" y="{top - 8}" text-anchor="middle"'
                f' font-size="13">{_e(panel.title)}</text>'
            )
        parts.append(
            f'<rect x="{_LEFT}" y="{top}" width="{plot_width}" height="{panel_height}"'
            ' fill="#fafafa" stroke="#ccc"/>'
        )
        # The y axis: grid lines and labels.
        ticks = json.dumps([value if y.type != "category" else label for value, label in y.ticks])
        parts.append(
            f'<g class="yaxis" data-type="{y.type}" data-ticks="{_e(ticks)}"'
            f' data-domain="{_e(json.dumps(domain))}">'
        )
        for value, label in y.ticks:
            at = to_y(value)
            parts.append(
                f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{at:.1f}" y2="{at:.1f}"'
                ' stroke="#e4e4e4"/>'
                f'<text x="{_LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">{_e(label[:40])}</text>'
            )
        if y.title:
            middle = (top + bottom) / 2
            parts.append(
                f'<text x="14" y="{middle:.1f}" text-anchor="middle"'
                f' transform="rotate(-90 14 {middle:.1f})">{_e(y.title)}</text>'
            )
        parts.append("</g>")
        for mark in panel.marks:
            at = to_x(mark)
            parts.append(
                f'<line class="shape" data-type="line" data-x="{_fmt(mark)}" x1="{at:.1f}"'
                f' x2="{at:.1f}" y1="{top}" y2="{bottom}" stroke="#555" stroke-dasharray="6 4"/>'
            )
            if index == 0 and panel.mark_label:
                parts.append(
                    f'<text class="annotation" x="{at:.1f}" y="{top - 8}"'
                    f' text-anchor="middle">{_e(panel.mark_label)}</text>'
                )
        for series in panel.series:
            colour = series.colour or _PALETTE[colour_index % len(_PALETTE)]
            colour_index += 1
            legend.append((series.name, colour, series.dash))
            parts.append(f'<g class="trace" data-name="{_e(series.name)}">')
            if series.lines:
                runs: list[list[str]] = [[]]
                for xv, yv in zip(series.xs, series.ys, strict=True):
                    if yv is None:
                        runs.append([])  # a gap: the line breaks
                    else:
                        runs[-1].append(f"{to_x(xv):.1f},{to_y(yv):.1f}")
                dash = ' stroke-dasharray="3 3"' if series.dash else ""
                for run in runs:
                    if len(run) > 1:
                        parts.append(
                            f'<polyline points="{" ".join(run)}" fill="none"'
                            f' stroke="{colour}" stroke-width="2"{dash}>'
                            f"<title>{_e(series.name)}</title></polyline>"
                        )
                    elif run and len(series.xs) > MARKERS_UP_TO:  # a lone point between gaps
                        cx, cy = run[0].split(",")
                        parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
                if len(series.xs) > MARKERS_UP_TO:
                    parts.append("</g>")
                    continue
            radius = 3.5 if series.lines else 5
            for i, (xv, yv) in enumerate(zip(series.xs, series.ys, strict=True)):
                if yv is None:
                    continue
                text = series.texts[i] if i < len(series.texts) else f"{series.name}: {_fmt(yv)}"
                parts.append(
                    f'<circle class="point" cx="{to_x(xv):.1f}" cy="{to_y(yv):.1f}"'
                    f' r="{radius}" fill="{colour}"><title>{_e(text)}</title></circle>'
                )
            parts.append("</g>")
    # The shared x axis, under the last panel.
    ticks = json.dumps([value for value, _ in x.ticks])
    parts.append(f'<g class="xaxis" data-type="{x.type}" data-ticks="{_e(ticks)}">')
    for value, label in x.ticks:
        at = to_x(value)
        parts.append(
            f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#555"/>'
            f'<text x="{at:.1f}" y="{bottom + 18}" text-anchor="middle">{_e(label)}</text>'
        )
    if x.title:
        parts.append(
            f'<text x="{_LEFT + plot_width / 2}" y="{height - 10}"'
            f' text-anchor="middle">{_e(x.title)}</text>'
        )
    parts.append("</g></svg>")
    items = "".join(
        f'<li><span style="color:{colour}">{"┄" if dash else "●"}</span> {_e(label)}</li>'
        for label, colour, dash in legend
    )
    svg = "".join(parts)
    return f'<div class="plot" data-plot="{_e(name)}">{svg}<ul class="legend">{items}</ul></div>'
