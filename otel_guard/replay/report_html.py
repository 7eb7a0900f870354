"""The replay report as one self-contained HTML page, with plots drawn by matplotlib as inline SVG.

The page needs no server, no network and no JavaScript: each plot is rendered here to SVG with
matplotlib's object-oriented :class:`~matplotlib.figure.Figure` (no pyplot state), text kept as
SVG text (``svg.fonttype = "none"``), and inlined. matplotlib escapes the text it writes into the
SVG and is told never to read a label as mathtext; everything else from the input is escaped with
:func:`html.escape`. It shows:

1. decisions over time (UTC hour of the batch), one line per environment/version and decision;
2. the threshold sweep: would-stop, stopped and self-recovered prompts, and the tool and model
   calls saved after the stop point, per threshold;
3. the timelines of the earliest would-stop and stopped prompts: each batch of the prompt, in
   seconds from its stop decision, coloured by decision;

above them, a verdict line (the exit status the report gates on, inputs complete or not, the
false-stop rate), the inputs read, a table per environment and version, and the totals and
invariants. Axes count in whole numbers; the sweep marks the live threshold and draws prompts
and saved calls on axes of their own; the time axis is in hours, or in days beyond two weeks,
and an hour (or day) without batches is a gap in the line, not a straight join. Every list cut
short for the page says how much was cut.

The SVG elements the browser test reads carry ids (matplotlib's ``gid``), each beginning with
the plot's name: ``NAME-trace-I`` a series and ``NAME-name-I`` its legend text, ``NAME-panel-P``
a panel's background, ``NAME-yaxis-P`` and ``NAME-ylabel-P`` its y axis and that axis' title,
``NAME-xaxis`` the shared x axis, ``NAME-mark-P`` the live threshold's line on a panel and
``NAME-annotation`` its label.

Size: a few dozen kilobytes plus the report's own data (a plot's points, at most a few thousand),
where inlining plotly.js made it 4.8 MB (1.19 MB with plotly's smallest official partial bundle,
still over the 1 MB aimed at); ``tests/test_report_html_size.py`` checks the size.
"""

from __future__ import annotations

import datetime
import html
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import matplotlib
from matplotlib import dates
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from otel_guard.replay.report import (
    GROUP_KEYS,
    INVARIANTS,
    SAMPLE_LIMIT,
    SAVED_KEYS,
    false_stop_text,
    inputs_text,
    printable,
    verdict,
    verdict_text,
)

__all__ = ["render_html"]

TIMELINE_PROMPTS: Final = 20
"""Stop samples drawn as timelines."""

_DECISION_COLOURS: Final[Mapping[str, str]] = {
    "none": "#9e9e9e",
    "reset": "#4caf50",
    "tracked": "#2196f3",
    "would_warn": "#ffb300",
    "warned": "#fb8c00",
    "would_stop": "#e53935",
    "stopped": "#8e24aa",
}

_STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.note { color: #666; }
.verdict { font-size: 1.2em; font-weight: bold; padding: 0.4em 0.6em; }
.pass { background: #e8f5e9; color: #1b5e20; }
.fail { background: #ffebee; color: #b71c1c; }
"""

HOURS_SHOWN: Final = 14 * 24
"""Hours the decisions plot shows hour by hour; a longer report is drawn day by day."""


WIDTH: Final = 11.0
"""Inches (at 72 points each: the SVG's width in points) of every plot, its legend included."""

MARKERS_UP_TO: Final = 200
"""Points of a line drawn with a marker each; a longer line is drawn as a line alone (its lone
points between gaps as small dots), so that two weeks of hourly lines per group stay a small
page."""


def render_html(document: Mapping[str, Any]) -> str:
    """The page for one replay report (a :func:`~otel_guard.replay.report.merge_reports` doc)."""
    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",  # text stays SVG text: small, and the browser's own font
            "svg.hashsalt": "otel-guard",  # the ids matplotlib derives: same report, same page
            "text.parse_math": False,  # a "$" from the input is a dollar sign, not mathtext
            "font.family": "sans-serif",
            "font.sans-serif": ["DejaVu Sans"],
            "font.size": 9,
            "axes.grid": True,
            "grid.color": "#e4e4e4",
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        stops, stops_note = _stops_figure(document)
        figures = [
            ("Decisions over time, per environment and version", _decisions_figure(document), ""),
            ("Threshold sweep (what-if)", _sweep_figure(document), ""),
            ("Would-stop and stopped prompts: batch timelines", stops, stops_note),
        ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>otel-guard replay report</title>",
        f"<style>{_STYLE}</style></head><body>",
        _verdict(document),
        "<h1>otel-guard replay report</h1>",
        f"<p>{html.escape(inputs_text(document))}</p>",
        _groups_table(document),
        _summary(document),
        _samples(document),
    ]
    for title, figure, note in figures:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if note:
            parts.append(f'<p class="note cut">{html.escape(note)}</p>')
        if figure is None:
            parts.append('<p class="note">Nothing to plot in this report.</p>')
            continue
        parts.append(figure)
    parts.append("</body></html>")
    return "\n".join(parts)


def _verdict(document: Mapping[str, Any]) -> str:
    result = verdict(document)
    gate = document.get("verdict")
    passed = gate.get("status") == 0 if isinstance(gate, Mapping) else result.passed
    kind = "pass" if passed else "fail"
    return f'<p class="verdict {kind}" id="verdict">{html.escape(verdict_text(document))}</p>'


def _cell(value: object) -> str:
    return f"<td>{html.escape(printable(value))}</td>"


def _groups_table(document: Mapping[str, Any]) -> str:
    groups = document.get("groups", [])
    if not groups:
        return '<p class="note">No environment or version group in this report.</p>'
    header = "".join(
        f"<th>{html.escape(name)}</th>"
        for name in (
            "environment",
            "version",
            "prompts",
            "would-warn",
            "warned",
            "would-stop",
            "stopped",
            "self-recovered (false-stop rate)",
            "saved tool calls",
            "saved model calls",
            "saved tokens (in + out)",
        )
    )
    rows = []
    for entry in groups:
        saved = entry["saved"]
        environment = "other groups" if entry.get("other") else entry.get(GROUP_KEYS[0])
        version = "" if entry.get("other") else entry.get(GROUP_KEYS[1])
        cells = [
            environment,
            version,
            entry["prompts"],
            entry["prompts_would_warn"],
            entry["prompts_warned"],
            entry["prompts_would_stop"],
            entry["prompts_stopped"],
            false_stop_text(entry),
            saved["tool_calls"],
            saved["model_calls"],
            saved["input_tokens"] + saved["output_tokens"],
        ]
        rows.append("<tr>" + "".join(_cell(value) for value in cells) + "</tr>")
    return (
        "<h2>Per environment and version</h2>"
        f'<table id="groups"><tr>{header}</tr>{"".join(rows)}</table>'
    )


_SHOWN_TRACES: Final = 20


def _samples(document: Mapping[str, Any]) -> str:
    """The would-stop and stopped prompts with their trace IDs, and how many were left out."""
    parts = []
    for name, title, total_key in (
        ("would_stop_prompts", "Would-stop prompts", "prompts_would_stop"),
        ("stopped_prompts", "Stopped prompts", "prompts_stopped"),
    ):
        sample = document.get(name, [])
        if not sample:
            continue
        total = max(int(document.get(total_key, 0)), len(sample))
        shown = sample[:_SHOWN_TRACES]
        items = "".join(
            f"<li>{html.escape(printable(entry.get('prompt_id')))}: trace "
            f"<code>{html.escape(printable(entry.get('trace_id')))}</code>"
            f"{' (recovered)' if entry.get('self_recovered') else ''}</li>"
            for entry in shown
        )
        parts.append(f"<h2>{title}</h2><ul>{items}</ul>")
        if total > len(shown):
            parts.append(
                f'<p class="note cut">{len(shown)} of {total} shown; {total - len(shown)} more'
                f" (the JSON report lists the earliest {SAMPLE_LIMIT}).</p>"
            )
    return "".join(parts)


def _summary(document: Mapping[str, Any]) -> str:
    saved = document.get("saved", {})
    rows: list[tuple[str, object]] = [
        ("mode", document.get("mode")),
        (
            "threshold / batch threshold",
            f"{document.get('threshold')} / {document.get('batch_threshold')}",
        ),
        ("spans", document.get("spans")),
        ("traces", document.get("traces")),
        ("prompts", document.get("prompts")),
        ("batches", document.get("batches")),
        (
            "prompts would_warn / warned",
            f"{document.get('prompts_would_warn')} / {document.get('prompts_warned')}",
        ),
        (
            "prompts would_stop / stopped",
            f"{document.get('prompts_would_stop')} / {document.get('prompts_stopped')}",
        ),
        ("self-recovered after would_stop", document.get("self_recovered_after_would_stop")),
        *((f"saved {key.replace('_', ' ')}", saved.get(key)) for key in SAVED_KEYS),
        ("invariant violations (docs/contract.md)", document.get("invariant_violations")),
    ]
    invariants = document.get("invariants", {})
    rows.extend((f"  {text}", invariants.get(name, 0)) for name, text in INVARIANTS.items())
    cells = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(printable(value))}</td></tr>"
        for name, value in rows
    )
    return f"<table>{cells}</table>"


def _label(entry: Mapping[str, Any]) -> str:
    if entry.get("other"):
        return "other groups"
    return f"{printable(entry.get(GROUP_KEYS[0]))} / {printable(entry.get(GROUP_KEYS[1]))}"


def _hour(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:00Z")


def _svg(name: str, figure: Figure) -> str:
    """The figure as inline SVG in its ``div.plot`` (the XML prologue and metadata left out)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    svg = buffer.getvalue()
    return f'<div class="plot" data-plot="{html.escape(name)}">{svg[svg.index("<svg") :]}</div>'


def _legend(
    name: str, axes: Axes, handles: Sequence[Line2D], labels: Sequence[str], first: int
) -> None:
    """The series' names right of the panel, each name's text marked ``NAME-name-I``."""
    legend = axes.legend(
        list(handles),
        list(labels),  # given, not read from the lines: a name starting with "_" is kept
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    for index, text in enumerate(legend.get_texts(), first):
        text.set_gid(f"{name}-name-{index}")


def _mark_axes(name: str, panels: Sequence[Axes], *, counts: bool = True) -> None:
    """Ids on the panels and axes; count axes from 0 in whole numbers."""
    for index, axes in enumerate(panels):
        axes.patch.set_gid(f"{name}-panel-{index}")
        axes.yaxis.set_gid(f"{name}-yaxis-{index}")
        axes.yaxis.label.set_gid(f"{name}-ylabel-{index}")
        if counts:
            axes.yaxis.set_major_locator(MaxNLocator(integer=True))
            axes.ticklabel_format(axis="y", style="plain", useOffset=False)
            axes.set_ylim(bottom=0)
    panels[-1].xaxis.set_gid(f"{name}-xaxis")
    panels[-1].xaxis.label.set_gid(f"{name}-xlabel")


def _decisions_figure(document: Mapping[str, Any]) -> str | None:
    counts: dict[tuple[str, str], dict[datetime.datetime, int]] = {}
    for entry in document.get("timeline", []):
        for decision, count in entry.get("decisions", {}).items():
            if count:
                series = counts.setdefault((_label(entry), decision), {})
                hour = _hour(entry["hour"])
                series[hour] = series.get(hour, 0) + count
    if not counts:
        return None
    moments = [moment for series in counts.values() for moment in series]
    first, last = min(moments), max(moments)
    step = datetime.timedelta(hours=1)
    if (last - first) / step > HOURS_SHOWN:  # day by day
        step = datetime.timedelta(days=1)
        for key, series in counts.items():
            days: dict[datetime.datetime, int] = {}
            for moment, count in series.items():
                day = moment.replace(hour=0)
                days[day] = days.get(day, 0) + count
            counts[key] = days
        first = first.replace(hour=0)
    steps = [first + step * index for index in range(int((last - first) / step) + 1)]
    xs = [dates.date2num(moment) for moment in steps]
    figure = Figure(figsize=(WIDTH, 4.5))
    axes = figure.subplots()
    handles, labels = [], []
    for index, ((label, decision), series) in enumerate(sorted(counts.items())):
        # Every step from the first to the last, NaN where nothing was decided: a gap.
        ys = [float(series[moment]) if moment in series else math.nan for moment in steps]
        many = len(ys) > MARKERS_UP_TO
        (line,) = axes.plot(
            xs,
            ys,
            color=_DECISION_COLOURS.get(decision),
            marker=None if many else "o",
            markersize=3.5,
            linewidth=1.5,
            gid=f"decisions-trace-{index}",
        )
        if many:
            # A point between two gaps has no line to show it: a dot of its own.
            lone = [
                (x, y)
                for i, (x, y) in enumerate(zip(xs, ys, strict=True))
                if not math.isnan(y)
                and (i == 0 or math.isnan(ys[i - 1]))
                and (i == len(ys) - 1 or math.isnan(ys[i + 1]))
            ]
            if lone:
                axes.plot(
                    [x for x, _ in lone],
                    [y for _, y in lone],
                    linestyle="none",
                    marker="o",
                    markersize=2,
                    color=line.get_color(),
                    gid=f"decisions-lone-{index}",
                )
        handles.append(line)
        labels.append(f"{label}: {decision}")
    hourly = step == datetime.timedelta(hours=1)
    every = max(1, math.ceil(len(steps) / 12))
    axes.xaxis.set_major_locator(
        dates.HourLocator(interval=every) if hourly else dates.DayLocator(interval=every)
    )
    axes.xaxis.set_major_formatter(dates.DateFormatter("%Y-%m-%d %H:00" if hourly else "%Y-%m-%d"))
    axes.tick_params(axis="x", labelrotation=20)
    half = (xs[1] - xs[0]) / 2 if len(xs) > 1 else step / datetime.timedelta(days=2)
    axes.set_xlim(xs[0] - half, xs[-1] + half)
    axes.set_xlabel("hour (UTC) of the batch" if hourly else "day (UTC) of the batch")
    axes.set_ylabel("decisions")
    _mark_axes("decisions", [axes])
    _legend("decisions", axes, handles, labels, 0)
    return _svg("decisions", figure)


def _sweep_figure(document: Mapping[str, Any]) -> str | None:
    rows: Sequence[Mapping[str, Any]] = document.get("sweep") or []
    if not rows:
        return None
    thresholds = [row["threshold"] for row in rows]
    prompts = [
        (name, [row[key] for row in rows])
        for key, name in (
            ("prompts_would_stop", "would_stop prompts"),
            ("prompts_stopped", "stopped prompts"),
            ("self_recovered_after_would_stop", "self-recovered after would_stop"),
        )
    ]
    calls = [
        (f"saved {key.replace('_', ' ')}", [row["saved"][key] for row in rows])
        for key in ("tool_calls", "model_calls")
    ]
    live = document.get("threshold")
    figure = Figure(figsize=(WIDTH, 5.5))
    panels = figure.subplots(2, 1, sharex=True)
    index = 0
    for panel, (axes, title, series, dashed) in enumerate(
        (
            (panels[0], "prompts", prompts, False),
            (panels[1], "calls saved after the stop point", calls, True),
        )
    ):
        handles, labels, first = [], [], index
        for name, ys in series:
            (line,) = axes.plot(
                thresholds,
                ys,
                marker="o",
                markersize=4,
                linestyle="--" if dashed else "-",
                gid=f"sweep-trace-{index}",
            )
            handles.append(line)
            labels.append(name)
            index += 1
        axes.set_title(title, loc="left")
        if isinstance(live, int):
            axes.axvline(live, color="#555", linestyle=(0, (6, 4)), gid=f"sweep-mark-{panel}")
        _legend("sweep", axes, handles, labels, first)
    if isinstance(live, int):
        panels[0].annotate(
            f"live threshold {live}",
            xy=(live, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            gid="sweep-annotation",
        )
    panels[1].set_xticks(thresholds)
    panels[1].set_xlim(min(thresholds) - 0.5, max(thresholds) + 0.5)
    batch_threshold = rows[0]["batch_threshold"]
    panels[1].set_xlabel(f"threshold (failures; batch threshold {batch_threshold})")
    _mark_axes("sweep", list(panels))
    return _svg("sweep", figure)


def _stops_figure(document: Mapping[str, Any]) -> tuple[str | None, str]:
    total = int(document.get("prompts_would_stop", 0)) + int(document.get("prompts_stopped", 0))
    samples = [
        *document.get("would_stop_prompts", []),
        *document.get("stopped_prompts", []),
    ]
    samples.sort(key=lambda entry: (entry.get("time_unix_nano", 0), str(entry.get("prompt_id"))))
    samples = samples[:TIMELINE_PROMPTS]
    total = max(total, len(samples))
    note = (
        f"{len(samples)} of {total} would-stop and stopped prompts drawn (the earliest);"
        f" {total - len(samples)} more not drawn."
        if total > len(samples)
        else ""
    )
    names: dict[str, int] = {}  # the prompts drawn, top to bottom
    points: dict[str, tuple[list[float], list[float]]] = {}
    for entry in samples:
        stop = int(entry.get("time_unix_nano", 0))
        name = printable(entry.get("prompt_id"))[:60]
        if entry.get("self_recovered"):
            name += " (recovered)"
        row = names.setdefault(name, len(names))
        for time_ns, decision, _failures, _calls in entry.get("batches", []):
            xs, ys = points.setdefault(str(decision), ([], []))
            xs.append((int(time_ns) - stop) / 1e9)
            ys.append(float(row))
    if not points:
        return None, note
    figure = Figure(figsize=(WIDTH, max(2.2, 0.3 * len(names) + 1.2)))
    axes = figure.subplots()
    handles, labels = [], []
    for index, (decision, (xs, ys)) in enumerate(points.items()):
        (line,) = axes.plot(
            xs,
            ys,
            linestyle="none",
            marker="o",
            markersize=6,
            color=_DECISION_COLOURS.get(decision),
            gid=f"stops-trace-{index}",
        )
        handles.append(line)
        labels.append(decision)
    axes.set_yticks(range(len(names)), list(names))
    axes.set_ylim(len(names) - 0.5, -0.5)  # the first prompt on top
    axes.grid(False, axis="y")
    axes.set_xlabel("seconds from the stop decision")
    _mark_axes("stops", [axes], counts=False)
    _legend("stops", axes, handles, labels, 0)
    return _svg("stops", figure), note
