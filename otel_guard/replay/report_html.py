"""The replay report as one self-contained HTML page, with plots drawn as inline SVG.

The page needs no server, no network and no JavaScript: each plot is SVG drawn here
(:mod:`otel_guard.replay.svg_plot`), and every value from the input is escaped with
:func:`html.escape`, plot labels and hover texts included. It shows:

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

Size: a few dozen kilobytes plus the report's own data (a plot's points, at most a few thousand),
where inlining plotly.js made it 4.8 MB (1.2 MB with plotly's smallest official partial bundle,
still over the 1 MB aimed at); ``tests/test_replay_report.py`` checks the size.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

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
from otel_guard.replay.svg_plot import (
    Axis,
    Panel,
    Series,
    date_ticks,
    integer_ticks,
    nice_ticks,
    render,
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


def render_html(document: Mapping[str, Any]) -> str:
    """The page for one replay report (a :func:`~otel_guard.replay.report.merge_reports` doc)."""
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
    largest = 0
    drawn = []
    for (label, decision), series in sorted(counts.items()):
        # Every step from the first to the last, None where nothing was decided: a gap.
        xs: list[float] = []
        ys: list[float | None] = []
        moment = first
        while moment <= last:
            xs.append(_ms(moment))
            ys.append(series.get(moment))
            moment += step
        largest = max(largest, *series.values())
        drawn.append(Series(f"{label}: {decision}", xs, ys, colour=_DECISION_COLOURS.get(decision)))
    hourly = step == datetime.timedelta(hours=1)
    half = _ms(first + step / 2) - _ms(first)
    x = Axis(
        "date",
        _ms(first) - half,
        _ms(last) + half,
        date_ticks(_ms(first), _ms(last), half * 2, hourly),
        "hour (UTC) of the batch" if hourly else "day (UTC) of the batch",
    )
    ticks = integer_ticks(largest)
    y = Axis("linear", 0, ticks[-1][0], ticks, "decisions")
    return render("decisions", x, [Panel(y, drawn)])


def _ms(moment: datetime.datetime) -> float:
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000


def _sweep_figure(document: Mapping[str, Any]) -> str | None:
    rows: Sequence[Mapping[str, Any]] = document.get("sweep") or []
    if not rows:
        return None
    thresholds = [row["threshold"] for row in rows]
    prompts = [
        Series(name, thresholds, [row[key] for row in rows])
        for key, name in (
            ("prompts_would_stop", "would_stop prompts"),
            ("prompts_stopped", "stopped prompts"),
            ("self_recovered_after_would_stop", "self-recovered after would_stop"),
        )
    ]
    calls = [
        Series(
            f"saved {key.replace('_', ' ')}",
            thresholds,
            [row["saved"][key] for row in rows],
            dash=True,
        )
        for key in ("tool_calls", "model_calls")
    ]
    live = document.get("threshold")
    marks = [float(live)] if isinstance(live, int) else []
    label = f"live threshold {live}" if marks else ""
    panels = []
    for title, series in (("prompts", prompts), ("calls saved after the stop point", calls)):
        largest = max((v for s in series for v in s.ys if v is not None), default=0)
        ticks = integer_ticks(largest)
        y = Axis("linear", 0, ticks[-1][0], ticks)
        panels.append(Panel(y, series, title, marks, label))
    batch_threshold = rows[0]["batch_threshold"]
    x = Axis(
        "linear",
        min(thresholds) - 0.5,
        max(thresholds) + 0.5,
        [(float(t), str(t)) for t in thresholds],
        f"threshold (failures; batch threshold {batch_threshold})",
    )
    return render("sweep", x, panels, panel_height=230)


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
    points: dict[str, tuple[list[float], list[float | None], list[str]]] = {}
    for entry in samples:
        stop = int(entry.get("time_unix_nano", 0))
        name = printable(entry.get("prompt_id"))[:60]
        if entry.get("self_recovered"):
            name += " (recovered)"
        row = names.setdefault(name, len(names))
        for time_ns, decision, failures, calls in entry.get("batches", []):
            xs, ys, texts = points.setdefault(str(decision), ([], [], []))
            seconds = (int(time_ns) - stop) / 1e9
            xs.append(seconds)
            ys.append(float(row))
            texts.append(f"{name} {seconds:.1f} s: {decision}: {failures} failures, {calls} calls")
    if not points:
        return None, note
    drawn = [
        Series(decision, xs, ys, colour=_DECISION_COLOURS.get(decision), lines=False, texts=texts)
        for decision, (xs, ys, texts) in points.items()
    ]
    every = [value for xs, _, _ in points.values() for value in xs]
    low, high = min(every), max(every)
    pad = max((high - low) * 0.05, 0.5)
    x = Axis(
        "linear",
        low - pad,
        high + pad,
        nice_ticks(low - pad, high + pad),
        "seconds from the stop decision",
    )
    y = Axis(
        "category",
        -0.5,
        len(names) - 0.5,
        [(float(row), name) for name, row in names.items()],
        reversed=True,
    )
    return render("stops", x, [Panel(y, drawn)], panel_height=max(150, 32 * len(names))), note
