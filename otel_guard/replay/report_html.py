"""The replay report as one self-contained HTML page, with plots (the ``html`` extra: plotly).

The page needs no server and no network: plotly's JavaScript is inlined once, each plot's data
is embedded, and every value from the input is escaped (HTML text through :func:`html.escape`,
plot data as JSON that cannot close its script element). It shows:

1. decisions over time (UTC hour of the batch), one line per environment/version and decision;
2. the threshold sweep: would-stop, stopped and self-recovered prompts, and the tool and model
   calls saved after the stop point, per threshold;
3. the timelines of the earliest would-stop and stopped prompts: each batch of the prompt, in
   seconds from its stop decision, coloured by decision;

above them, the totals and invariants as a table.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

from otel_guard.replay.report import GROUP_KEYS, INVARIANTS, SAVED_KEYS, printable

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
"""


def render_html(document: Mapping[str, Any]) -> str:
    """The page for one replay report (a :func:`~otel_guard.replay.report.merge_reports` doc)."""
    import plotly.graph_objects as go  # the html extra; imported only when a page is asked for

    figures = [
        ("Decisions over time, per environment and version", _decisions_figure(go, document)),
        ("Threshold sweep (what-if)", _sweep_figure(go, document)),
        ("Would-stop and stopped prompts: batch timelines", _stops_figure(go, document)),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>otel-guard replay report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>otel-guard replay report</h1>",
        _summary(document),
    ]
    first = True
    for title, figure in figures:
        parts.append(f"<h2>{html.escape(title)}</h2>")
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


def _decisions_figure(go: Any, document: Mapping[str, Any]) -> Any:
    series: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
    for entry in document.get("timeline", []):
        for decision, count in entry.get("decisions", {}).items():
            if count:
                hours, counts = series.setdefault((_label(entry), decision), ([], []))
                hours.append(entry["hour"].replace("Z", ""))
                counts.append(count)
    if not series:
        return None
    figure = go.Figure()
    for (label, decision), (hours, counts) in sorted(series.items()):
        figure.add_trace(
            go.Scatter(
                x=hours,
                y=counts,
                mode="lines+markers",
                name=f"{label}: {decision}",
                legendgroup=label,
                line={"color": _DECISION_COLOURS.get(decision)},
            )
        )
    figure.update_layout(xaxis_title="hour (UTC) of the batch", yaxis_title="decisions", height=450)
    return figure


def _sweep_figure(go: Any, document: Mapping[str, Any]) -> Any:
    rows: Sequence[Mapping[str, Any]] = document.get("sweep") or []
    if not rows:
        return None
    thresholds = [row["threshold"] for row in rows]
    figure = go.Figure()
    for key, name in (
        ("prompts_would_stop", "would_stop prompts"),
        ("prompts_stopped", "stopped prompts"),
        ("self_recovered_after_would_stop", "self-recovered after would_stop"),
    ):
        figure.add_trace(
            go.Scatter(x=thresholds, y=[row[key] for row in rows], mode="lines+markers", name=name)
        )
    for key in ("tool_calls", "model_calls"):
        figure.add_trace(
            go.Scatter(
                x=thresholds,
                y=[row["saved"][key] for row in rows],
                mode="lines+markers",
                name=f"saved {key.replace('_', ' ')}",
                yaxis="y2",
                line={"dash": "dot"},
            )
        )
    batch_threshold = rows[0]["batch_threshold"]
    figure.update_layout(
        xaxis_title=f"threshold (failures; batch threshold {batch_threshold})",
        yaxis={"title": {"text": "prompts"}},
        yaxis2={"title": {"text": "calls saved"}, "overlaying": "y", "side": "right"},
        height=450,
    )
    return figure


def _stops_figure(go: Any, document: Mapping[str, Any]) -> Any:
    samples = [
        *document.get("would_stop_prompts", []),
        *document.get("stopped_prompts", []),
    ]
    samples.sort(key=lambda entry: (entry.get("time_unix_nano", 0), str(entry.get("prompt_id"))))
    samples = samples[:TIMELINE_PROMPTS]
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
        return None
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
    return figure
