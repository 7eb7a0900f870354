"""The replay report as one self-contained HTML page, with plots (the ``html`` extra: plotly).

The page needs no server and no network: plotly's JavaScript is inlined once, each plot's data
is embedded, and every value from the input is escaped (HTML text through :func:`html.escape`,
plot data as JSON that cannot close its script element). It shows:

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

Size: plotly's JavaScript, inlined once so the page opens offline, is most of the page (about
4.7 MB with plotly 6); the report's own data adds little. The Python package ships only the full
bundle, so the page is that size whatever the report.
"""

from __future__ import annotations

import datetime
import html
import math
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
    import plotly.graph_objects as go  # the html extra; imported only when a page is asked for
    from plotly.subplots import make_subplots

    stops, stops_note = _stops_figure(go, document)
    figures = [
        ("Decisions over time, per environment and version", _decisions_figure(go, document), ""),
        ("Threshold sweep (what-if)", _sweep_figure(make_subplots, go, document), ""),
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
    first = True
    for title, figure, note in figures:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if note:
            parts.append(f'<p class="note cut">{html.escape(note)}</p>')
        if figure is None:
            parts.append('<p class="note">Nothing to plot in this report.</p>')
            continue
        parts.append(
            figure.to_html(
                full_html=False,
                include_plotlyjs=first,  # inlined once: the page opens offline
                config={"displaylogo": False, "responsive": True},
            )
        )
        first = False
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


def _integer_axis(largest: float) -> dict[str, Any]:
    """A y axis of whole numbers from 0, with at most about eight ticks."""
    step = max(1, math.ceil(max(largest, 1) / 8))
    magnitude = 10 ** max(0, len(str(step)) - 1)
    step = math.ceil(step / magnitude) * magnitude
    return {"rangemode": "tozero", "tick0": 0, "dtick": step, "tickformat": ",d"}


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


def _decisions_figure(go: Any, document: Mapping[str, Any]) -> Any:
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
    figure = go.Figure()
    largest = 0
    for (label, decision), series in sorted(counts.items()):
        # Every step from the first to the last, None where nothing was decided: a gap.
        xs, ys = [], []
        moment = first
        while moment <= last:
            xs.append(moment)
            ys.append(series.get(moment))
            moment += step
        largest = max(largest, *series.values())
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                connectgaps=False,
                name=f"{label}: {decision}",
                legendgroup=label,
                line={"color": _DECISION_COLOURS.get(decision)},
            )
        )
    hourly = step == datetime.timedelta(hours=1)
    figure.update_layout(
        xaxis={
            "title": {"text": "hour (UTC) of the batch" if hourly else "day (UTC) of the batch"},
            "type": "date",
            "tickformat": "%Y-%m-%d %H:00" if hourly else "%Y-%m-%d",
            "dtick": 3_600_000 * max(1, math.ceil(len(xs) / 12))
            if hourly
            else 86_400_000 * max(1, math.ceil(len(xs) / 12)),
            "range": [first - step / 2, last + step / 2],
        },
        yaxis={"title": {"text": "decisions"}, **_integer_axis(largest)},
        height=450,
    )
    return figure


def _sweep_figure(make_subplots: Any, go: Any, document: Mapping[str, Any]) -> Any:
    rows: Sequence[Mapping[str, Any]] = document.get("sweep") or []
    if not rows:
        return None
    thresholds = [row["threshold"] for row in rows]
    figure = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("prompts", "calls saved after the stop point"),
    )
    prompts_largest = calls_largest = 0
    for key, name in (
        ("prompts_would_stop", "would_stop prompts"),
        ("prompts_stopped", "stopped prompts"),
        ("self_recovered_after_would_stop", "self-recovered after would_stop"),
    ):
        values = [row[key] for row in rows]
        prompts_largest = max(prompts_largest, *values)
        figure.add_trace(
            go.Scatter(x=thresholds, y=values, mode="lines+markers", name=name), row=1, col=1
        )
    for key in ("tool_calls", "model_calls"):
        values = [row["saved"][key] for row in rows]
        calls_largest = max(calls_largest, *values)
        figure.add_trace(
            go.Scatter(
                x=thresholds,
                y=values,
                mode="lines+markers",
                name=f"saved {key.replace('_', ' ')}",
                line={"dash": "dot"},
            ),
            row=2,
            col=1,
        )
    live = document.get("threshold")
    if isinstance(live, int):
        for row in (1, 2):
            figure.add_vline(x=live, line={"color": "#555", "dash": "dash"}, row=row, col=1)
        figure.add_annotation(
            x=live,
            y=1.0,
            xref="x",
            yref="paper",
            yanchor="bottom",
            text=f"live threshold {live}",
            showarrow=False,
            name="live-threshold",
        )
    batch_threshold = rows[0]["batch_threshold"]
    figure.update_xaxes(tickmode="array", tickvals=thresholds, tickformat="d")
    figure.update_xaxes(
        title_text=f"threshold (failures; batch threshold {batch_threshold})", row=2, col=1
    )
    figure.update_yaxes(**_integer_axis(prompts_largest), row=1, col=1)
    figure.update_yaxes(**_integer_axis(calls_largest), row=2, col=1)
    figure.update_layout(height=600, margin={"t": 60})
    return figure


def _stops_figure(go: Any, document: Mapping[str, Any]) -> tuple[Any, str]:
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
    points: dict[str, tuple[list[float], list[str], list[str]]] = {}
    for entry in samples:
        stop = int(entry.get("time_unix_nano", 0))
        name = printable(entry.get("prompt_id"))[:60]
        if entry.get("self_recovered"):
            name += " (recovered)"
        for time_ns, decision, failures, calls in entry.get("batches", []):
            xs, ys, texts = points.setdefault(str(decision), ([], [], []))
            xs.append((int(time_ns) - stop) / 1e9)
            ys.append(name)
            texts.append(f"{decision}: {failures} failures, {calls} calls")
    if not points:
        return None, note
    figure = go.Figure()
    for decision, (xs, ys, texts) in points.items():
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                text=texts,
                mode="markers",
                name=decision,
                marker={"size": 10, "color": _DECISION_COLOURS.get(decision)},
                hovertemplate="%{y}<br>%{x:.1f} s: %{text}<extra></extra>",
            )
        )
    figure.update_layout(
        xaxis_title="seconds from the stop decision",
        height=max(300, 40 * len(samples) + 150),
        yaxis={"type": "category", "autorange": "reversed"},
    )
    return figure, note
