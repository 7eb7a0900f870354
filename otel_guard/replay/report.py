"""The replay report as a document: merged from shards, and rendered for people.

A report is one JSON-ready object (:meth:`otel_guard.replay.replayer.GuardReport.to_json` builds
it). Every count in it is a sum over prompts, and a prompt is replayed whole by one process, so the
reports of shards that split the prompts between them add up to the report of one process:
:func:`merge_reports` adds them. Merging is associative and a single report merges to itself;
samples keep the earliest entries by time, so they merge exactly too. The one exception is a
report bound: groups beyond :data:`GROUP_LIMIT` are counted under one ``other`` group, and which
groups keep their name can then depend on how the input was split (totals stay exact).

:func:`render_text` prints a report for a terminal: every value that came from the input
(prompt IDs, resource values) is escaped, so the input can neither forge a report line nor send
terminal control sequences.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.semconv._incubating.attributes.deployment_attributes import (
    DEPLOYMENT_ENVIRONMENT_NAME,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_VERSION

from otel_guard.guard.telemetry import DECISION_VALUES
from otel_guard.reducer import BATCH_THRESHOLD, RESET_REASONS, THRESHOLD
from otel_guard.spans.events import PROFILE_NAMES

__all__ = [
    "BOUNDS",
    "DAY_LIMIT",
    "EXIT_INCOMPLETE",
    "EXIT_INVARIANTS",
    "EXIT_LEFT_OUT",
    "EXIT_NOT_WRITTEN",
    "EXIT_NO_PROMPTS",
    "EXIT_NO_SPANS",
    "GENAI_SEEN",
    "GROUP_KEYS",
    "GROUP_LIMIT",
    "INVARIANTS",
    "OTHER_DAY",
    "SAMPLES",
    "SAMPLE_LIMIT",
    "SAVED_KEYS",
    "SIGNALS",
    "TIMELINE_LIMIT",
    "ReportMismatch",
    "Verdict",
    "add_counts",
    "day_of",
    "empty_tally",
    "false_stop_text",
    "group_order",
    "hour_of",
    "inputs_text",
    "is_complete",
    "merge_reports",
    "printable",
    "render_text",
    "report_identity",
    "report_parts",
    "sweeps_match",
    "unreadable",
    "verdict",
    "verdict_line",
    "verdict_text",
]

GROUP_KEYS: Final = (DEPLOYMENT_ENVIRONMENT_NAME, SERVICE_VERSION)
"""Resource attributes the report groups by: rollouts compare environments and versions."""

GROUP_LIMIT: Final = 1000
"""Environment/version groups reported by name; the rest are counted under one ``other`` group."""

DAY_LIMIT: Final = 3660
"""Days reported: the earliest ones; spans and batches of later days are counted under
:data:`OTHER_DAY`. The earliest, not the first read, so that the days named do not depend on
how the input was split: shards keep each the earliest of theirs, which hold the earliest of all,
and a merge names the same days as one process."""

OTHER_DAY: Final = "other"

GENAI_SEEN: Final = ("prompts", "model_calls", "tool_calls", "orphan_tool_calls")
"""Keys of the report's ``genai_seen``: what the GenAI-conventions profile saw."""

TIMELINE_LIMIT: Final = 20_000
"""Hour-and-group buckets of the decision timeline (the HTML report's first plot): the earliest
ones (by hour, then group), for the same reason as :data:`DAY_LIMIT`."""

SAMPLE_LIMIT: Final = 100
"""Prompt IDs listed per sample (warned, would_stop, stopped), the earliest first."""

HISTORY_LIMIT: Final = 32
"""Batches kept in a stop sample's timeline."""

SAMPLES: Final = ("warned_prompts", "would_stop_prompts", "stopped_prompts")

SAVED_KEYS: Final = ("tool_calls", "model_calls", "input_tokens", "output_tokens")

SIGNALS: Final = ("logs", "metrics", "profiles")
"""Other signals whose requests (lines or frames) a replay skips and counts (``skipped``)."""

BOUNDS: Final[Mapping[str, str]] = {
    "trace_spans": "a trace was replayed in parts: more of its spans buffered than the bound",
    "open_traces": "a trace was replayed before its root: more traces open than the bound",
    "report_groups": "a resource was counted under group 'other': more environment/version "
    "groups than the bound",
    "report_days": "spans and batches counted under day 'other' (later than the days named): "
    "more days than the bound",
    "timeline": "decisions left out of the timeline (later than the hour buckets kept): more "
    "hour buckets than the bound",
    "prompt_ids": "a span's prompt or conversation ID was kept as its digest (its first 64 "
    "characters and SHA-256): longer than the bound",
    "replayed_traces": "spans of a trace came after it was replayed and forgotten (more traces "
    "replayed since than the bound): replayed apart from it, repeats among them again",
    "late_spans": "spans came after their trace was replayed (more spans read since its root "
    "than the reorder window): replayed apart from it, its decisions may differ",
}
"""Bounds that keep a replay's memory independent of its input, by report key.

``report_days`` and ``timeline`` are not counted as the replay goes but worked out from the report
(:func:`merge_reports`): the spans and batches of day ``other``, and the decisions that no
timeline bucket holds. So they are the same for one process, ``--jobs`` and a merge of shards,
whose reports keep the same days and buckets; a count of the moments the bound was met would
depend on how the input was split."""

INVARIANTS: Final[Mapping[str, str]] = {
    "cancelled_counted": "cancelled calls counted as eligible failures",
    "ineligible_counted": "not_started, unknown or post-execution outcomes counted as failures",
    "incomplete_batch_decision": "decisions based on incomplete batches",
    "enforcement_after_unreliable_input": "enforcement after an unreliable input drain",
    "stop_without_warning": "would_stop/stopped without would_warn/warned (same prompt, candidate)",
    "sensitive_telemetry": "guard telemetry fields outside the closed sets (sensitive data)",
}
"""The required invariants (``docs/contract.md``) that a replay can check, by report key.

The remaining one (the existing total tool-call and duplicate-ID protections stay unchanged) is
a property of the agent, not of its traces.
"""

_NANOS_PER_HOUR: Final = 3600 * 10**9
_NANOS_PER_DAY: Final = 24 * _NANOS_PER_HOUR
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


EXIT_INCOMPLETE: Final = 1
"""Exit status: an input could not be read whole (unreadable, malformed, truncated, interrupted)."""

EXIT_NO_SPANS: Final = 3
"""Exit status: the inputs held no span at all (an empty file, a glob that matched the wrong
files)."""

EXIT_NO_PROMPTS: Final = 4
"""Exit status: spans were read, but none of a prompt the guard can read."""

EXIT_INVARIANTS: Final = 5
"""Exit status: at least one required invariant was violated."""

EXIT_LEFT_OUT: Final = 6
"""Exit status of ``merge``: a report was left out of the merge, the others merged: it was
replayed with another mode or other constants, or it was given twice (itself, a copy, or a
report merged into another one given)."""

EXIT_NOT_WRITTEN: Final = 7
"""Exit status: the report was judged to pass, but a file it was to be written to (``--html``)
could not be written."""


class ReportMismatch(ValueError):
    """Reports that cannot be merged: replayed with another mode or other constants."""


def day_of(time_unix_nano: int) -> str:
    """The UTC day of a time, as ``YYYY-MM-DD``."""
    day = _EPOCH + datetime.timedelta(days=max(time_unix_nano, 0) // _NANOS_PER_DAY)
    return day.strftime("%Y-%m-%d")


def hour_of(time_unix_nano: int) -> str:
    """The UTC hour of a time, as ``YYYY-MM-DDTHH:00Z``."""
    hour = _EPOCH + datetime.timedelta(hours=max(time_unix_nano, 0) // _NANOS_PER_HOUR)
    return hour.strftime("%Y-%m-%dT%H:00Z")


def empty_tally() -> dict[str, Any]:
    """The counts of one report section, all zero, in their report order."""
    return {
        "spans": 0,
        "prompts": 0,
        "batches": 0,
        "decisions": {value: 0 for value in DECISION_VALUES},
        "reset_reasons": {reason: 0 for reason in RESET_REASONS},
        "prompts_would_warn": 0,
        "prompts_warned": 0,
        "prompts_would_stop": 0,
        "prompts_stopped": 0,
        "self_recovered_after_would_stop": 0,
        "saved": {key: 0 for key in SAVED_KEYS},
    }


_TALLY_KEYS: Final = tuple(empty_tally())


def add_counts(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add the counts of ``other`` into ``into``, key by key, nested dictionaries included."""
    for key, value in other.items():
        if isinstance(value, Mapping):
            add_counts(into.setdefault(key, {}), value)
        elif type(value) is int:
            into[key] = into.get(key, 0) + value


def _tally_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    tally = empty_tally()
    add_counts(tally, {key: entry[key] for key in _TALLY_KEYS if key in entry})
    return tally


def _group_key(entry: Mapping[str, Any]) -> tuple[bool, str | None, str | None]:
    return (bool(entry.get("other")), entry.get(GROUP_KEYS[0]), entry.get(GROUP_KEYS[1]))


def group_order(key: tuple[bool, str | None, str | None]) -> tuple[bool, str, str, bool, bool]:
    """The order of groups in a report, by (folded into ``other``, environment, version): unset
    sorts before any value, and the ``other`` group last."""
    return (key[0], key[1] or "", key[2] or "", key[1] is not None, key[2] is not None)


def _sample_order(entry: Mapping[str, Any]) -> tuple[int, str]:
    return (int(entry.get("time_unix_nano", 0)), str(entry.get("prompt_id", "")))


_NOT_IDENTITY: Final = frozenset({"verdict", "parts", "left_out"})


def report_identity(document: Mapping[str, Any]) -> str:
    """What tells a report apart: the SHA-256 of its content, written canonically (key order and
    spacing do not count, nor its ``verdict``, which depends on how it was judged). Two replays
    of the same input with the same options have the same identity; shards of one input do not.
    """
    content = {key: value for key, value in document.items() if key not in _NOT_IDENTITY}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def report_parts(document: Mapping[str, Any]) -> list[str]:
    """The identities of the replay reports a report adds up: its ``parts`` when it is the
    output of ``otel-guard merge`` (which lists them there), else its own identity."""
    parts = document.get("parts")
    return list(parts) if parts else [report_identity(document)]


def _sweep_rows(document: Mapping[str, Any]) -> tuple[tuple[int, int], ...] | None:
    sweep = document.get("sweep")
    if sweep is None:
        return None
    return tuple(sorted((int(row["threshold"]), int(row["batch_threshold"])) for row in sweep))


def sweeps_match(documents: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the reports all have a sweep of the same thresholds, or none has one: only then
    does the merged report have a sweep (of one shard, it would pass for the whole)."""
    return len({_sweep_rows(document) for document in documents}) <= 1


def merge_reports(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from reports of disjoint shards of prompts (see the module docstring).

    It has a ``sweep`` only when every report has one of the same thresholds (:func:`sweeps_match`).
    Raises :class:`ReportMismatch` when the reports were replayed with different modes or
    constants, or when there is nothing to merge.
    """
    if not documents:
        raise ReportMismatch("no reports to merge")
    first = documents[0]
    settings = ("mode", "threshold", "batch_threshold")
    for document in documents[1:]:
        for key in settings:
            if document.get(key) != first.get(key):
                raise ReportMismatch(
                    f"reports differ in {key}: {first.get(key)!r} and {document.get(key)!r}"
                )
    merged: dict[str, Any] = {key: first.get(key) for key in settings}
    merged["traces"] = sum(int(d.get("traces", 0)) for d in documents)
    merged["duplicate_spans"] = sum(int(d.get("duplicate_spans", 0)) for d in documents)
    skipped = {signal: 0 for signal in SIGNALS}
    for document in documents:
        add_counts(skipped, document.get("skipped", {}))
    # The known signals in their order, then any other a newer reader counted, by name.
    merged["skipped"] = {
        signal: skipped[signal] for signal in (*SIGNALS, *sorted(set(skipped) - set(SIGNALS)))
    }
    total = empty_tally()
    for document in documents:
        add_counts(total, _tally_of(document))
    merged.update(total)
    invariants = {name: 0 for name in INVARIANTS}
    diagnostics: dict[str, int] = {}
    bounds = {name: 0 for name in BOUNDS}
    for document in documents:
        add_counts(invariants, document.get("invariants", {}))
        add_counts(diagnostics, document.get("diagnostics", {}))
        add_counts(bounds, document.get("bounds", {}))
    merged["invariant_violations"] = sum(invariants.values())
    merged["invariants"] = invariants
    merged["diagnostics"] = dict(sorted(diagnostics.items()))
    merged["bounds"] = bounds
    merged["profiles"] = dict.fromkeys(PROFILE_NAMES, 0)
    merged["genai_seen"] = dict.fromkeys(GENAI_SEEN, 0)
    for document in documents:
        add_counts(merged["profiles"], document.get("profiles", {}))
        add_counts(merged["genai_seen"], document.get("genai_seen", {}))
    for name in SAMPLES:
        entries = [entry for document in documents for entry in document.get(name, [])]
        merged[name] = sorted(entries, key=_sample_order)[:SAMPLE_LIMIT]
    folded: set[tuple[bool, str | None, str | None]] = set()
    merged["groups"] = _merge_groups(documents, bounds, folded)
    merged["by_day"] = _merge_days(documents)
    merged["timeline"] = _merge_timeline(documents, folded)
    # Worked out from the merged report, not added up (see BOUNDS).
    other_day = merged["by_day"].get(OTHER_DAY)
    bounds["report_days"] = other_day["spans"] + other_day["batches"] if other_day else 0
    in_timeline = sum(sum(entry["decisions"].values()) for entry in merged["timeline"])
    bounds["timeline"] = max(0, sum(merged["decisions"].values()) - in_timeline)
    sweeps = [document["sweep"] for document in documents if document.get("sweep") is not None]
    if sweeps and sweeps_match(documents):
        merged["sweep"] = _merge_sweeps(sweeps)
    if any("files" in document for document in documents):
        merged["files"] = [path for document in documents for path in document.get("files", [])]
        errors = [document["error"] for document in documents if document.get("error")]
        merged["error"] = "; ".join(dict.fromkeys(errors)) if errors else None
        merged["complete"] = all(is_complete(document) for document in documents)
    if any("readable_prompt" in document for document in documents):
        merged["readable_prompt"] = any(d.get("readable_prompt", True) for d in documents)
    left_out = [entry for document in documents for entry in document.get("left_out", [])]
    if left_out:
        merged["left_out"] = left_out
    return merged


def _merge_groups(
    documents: Sequence[Mapping[str, Any]],
    bounds: dict[str, int],
    folded: set[tuple[bool, str | None, str | None]],
) -> list[dict[str, Any]]:
    """The merged groups; ``folded`` receives those the merge folds into ``other``."""
    groups: dict[tuple[bool, str | None, str | None], dict[str, Any]] = {}
    for document in documents:
        for entry in document.get("groups", []):
            key = _group_key(entry)
            add_counts(groups.setdefault(key, empty_tally()), _tally_of(entry))
    named = [key for key in groups if not key[0]]
    if len(named) > GROUP_LIMIT:
        # Keep the busiest groups by name; the rest join "other".
        named.sort(key=lambda k: (-groups[k]["spans"], group_order(k)))
        other = groups.setdefault((True, None, None), empty_tally())
        for key in named[GROUP_LIMIT:]:
            add_counts(other, groups.pop(key))
            folded.add(key)
            bounds["report_groups"] += 1
    entries = []
    for key in sorted(groups, key=group_order):
        group: dict[str, Any] = {GROUP_KEYS[0]: key[1], GROUP_KEYS[1]: key[2]}
        if key[0]:
            group["other"] = True
        group.update(groups[key])
        entries.append(group)
    return entries


def _merge_days(documents: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    days: dict[str, dict[str, Any]] = {}
    for document in documents:
        for day, tally in document.get("by_day", {}).items():
            add_counts(days.setdefault(day, empty_tally()), _tally_of(tally))
    named = sorted(day for day in days if day != OTHER_DAY)
    if len(named) > DAY_LIMIT:
        other = days.setdefault(OTHER_DAY, empty_tally())
        for day in named[DAY_LIMIT:]:
            add_counts(other, days.pop(day))
    return {day: days[day] for day in sorted(days, key=lambda d: (d == OTHER_DAY, d))}


def _merge_timeline(
    documents: Sequence[Mapping[str, Any]], folded: set[tuple[bool, str | None, str | None]]
) -> list[dict[str, Any]]:
    """The timeline of the merged report: the decisions of a group that the merge folded into
    ``other`` are counted under ``other``, as one process counts them, and the earliest
    :data:`TIMELINE_LIMIT` buckets are kept."""
    buckets: dict[tuple[str, tuple[bool, str | None, str | None]], dict[str, int]] = {}
    for document in documents:
        for entry in document.get("timeline", []):
            group = _group_key(entry)
            if group in folded:
                group = (True, None, None)
            key = (str(entry["hour"]), group)
            counts = buckets.setdefault(key, {value: 0 for value in DECISION_VALUES})
            add_counts(counts, entry.get("decisions", {}))
    entries = []
    for hour, group in sorted(buckets, key=lambda k: (k[0], group_order(k[1])))[:TIMELINE_LIMIT]:
        bucket: dict[str, Any] = {"hour": hour, GROUP_KEYS[0]: group[1], GROUP_KEYS[1]: group[2]}
        if group[0]:
            bucket["other"] = True
        bucket["decisions"] = buckets[hour, group]
        entries.append(bucket)
    return entries


def _merge_sweeps(sweeps: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for sweep in sweeps:
        for row in sweep:
            key = (int(row["threshold"]), int(row["batch_threshold"]))
            merged = rows.setdefault(key, {"threshold": key[0], "batch_threshold": key[1]})
            add_counts(
                merged, {k: v for k, v in row.items() if k not in ("threshold", "batch_threshold")}
            )
    return [rows[key] for key in sorted(rows)]


# -- text ------------------------------------------------------------------------------------


def printable(value: object) -> str:
    """``value`` as text that prints as one line of itself: control, format and separator
    characters (newlines and terminal escapes among them) and backslashes are escaped."""
    text = "(unset)" if value is None else str(value)
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _counts_text(counts: Mapping[str, int], names: Iterable[str]) -> str:
    shown = [f"{name} {counts.get(name, 0)}" for name in names if counts.get(name, 0)]
    return "  ".join(shown) if shown else "none"


def _tally_lines(tally: Mapping[str, Any]) -> list[str]:
    saved = tally["saved"]
    return [
        f"  spans {tally['spans']}  prompts {tally['prompts']}  batches {tally['batches']}",
        f"  decisions: {_counts_text(tally['decisions'], DECISION_VALUES)}",
        f"  reset reasons: {_counts_text(tally['reset_reasons'], RESET_REASONS)}",
        f"  prompts: would_warn {tally['prompts_would_warn']}  warned {tally['prompts_warned']}"
        f"  would_stop {tally['prompts_would_stop']}  stopped {tally['prompts_stopped']}",
        "  self-recovered after would_stop (false-stop estimate): "
        f"{tally['self_recovered_after_would_stop']}",
        f"  saved after the stop point (estimate): tool calls {saved['tool_calls']}"
        f"  model calls {saved['model_calls']}  input tokens {saved['input_tokens']}"
        f"  output tokens {saved['output_tokens']}",
    ]


def _group_title(entry: Mapping[str, Any]) -> str:
    if entry.get("other"):
        return f"other groups (beyond the first {GROUP_LIMIT:,})"
    return (
        f"{GROUP_KEYS[0]}={printable(entry.get(GROUP_KEYS[0]))}"
        f"  {GROUP_KEYS[1]}={printable(entry.get(GROUP_KEYS[1]))}"
    )


def _sample_text(entry: Mapping[str, Any]) -> str:
    text = printable(entry.get("prompt_id"))
    after = entry.get("tool_calls_after_stop")
    if after is None:
        return text
    recovered = ", then recovered" if entry.get("self_recovered") else ""
    return f"{text} ({after} calls after{recovered})"


def _sweep_lines(sweep: Sequence[Mapping[str, Any]]) -> list[str]:
    header = (
        f"  {'threshold':>9} {'batches':>7} {'would_stop':>10} {'stopped':>7} {'recovered':>9}"
        f" {'tool calls':>10} {'model calls':>11} {'in tokens':>11} {'out tokens':>11}"
    )
    lines = ["what-if sweep (prompts, and work saved after the stop point)", header]
    for row in sweep:
        saved = row["saved"]
        lines.append(
            f"  {row['threshold']:>9} {row['batch_threshold']:>7} {row['prompts_would_stop']:>10}"
            f" {row['prompts_stopped']:>7} {row['self_recovered_after_would_stop']:>9}"
            f" {saved['tool_calls']:>10} {saved['model_calls']:>11}"
            f" {saved['input_tokens']:>11} {saved['output_tokens']:>11}"
        )
    return lines


_DROPS: Final = ("batch_overflow", "evicted", "expired")
"""Diagnostics of state the guard dropped at a bound: with no prompt read, the likely reason."""


def unreadable(
    document: Mapping[str, Any], *, opted_out: int = 0, seen: Mapping[str, int] | None = None
) -> str | None:
    """Why spans were read but no prompt was, naming the missing attributes; else ``None``.

    ``opted_out`` counts the prompts the input names but opts out of the guard (their routes
    or channels); ``seen`` replaces the report's ``genai_seen`` (in mode ``off``, where the
    guard sees nothing, what a shadow replay saw)."""
    if not document.get("spans") or not _no_prompt(document):
        return None
    if opted_out:
        return (
            f"the {opted_out} prompt(s) named (acp.prompt.id) are all opted out of the guard "
            "(acp.prompt.route other than interactive, or acp.prompt.channel true)"
        )
    diagnostics = document.get("diagnostics", {})
    dropped = {name: diagnostics.get(name, 0) for name in _DROPS if diagnostics.get(name, 0)}
    if dropped:
        named = ", ".join(f"{name} {count}" for name, count in dropped.items())
        return (
            f"no prompt was read to its end: the guard's memory bounds dropped what it held "
            f"({named}), as when one trace holds more tool-call data than the bound (prompts "
            "below one long-lived span are decided when that span ends)"
        )
    if seen is None:
        seen = document.get("genai_seen", {})
    if seen.get("prompts") and not seen.get("tool_calls"):
        return (
            f"{seen['prompts']} invoke_agent span(s) but no tool-call span below them: missing "
            "gen_ai.operation.name=execute_tool (or gen_ai.tool.name with gen_ai.tool.call.id)"
        )
    if seen.get("orphan_tool_calls"):
        return (
            f"{seen['orphan_tool_calls']} execute_tool span(s) but none below a prompt: missing "
            "an ancestor with gen_ai.operation.name=invoke_agent, or a parent batch span with "
            "acp.prompt.id and acp.batch.admitted"
        )
    return (
        "no span carries gen_ai.operation.name=invoke_agent/execute_tool, "
        "nor acp.prompt.id with acp.batch.admitted"
    )


@dataclass(frozen=True)
class Verdict:
    """Whether a report may gate a rollout step: its exit status (0 when it may) and, for each
    failed condition, one line saying which (as data: file names and input text in it are not
    escaped; :func:`printable` them to print)."""

    status: int
    reasons: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.status == 0


def _no_prompt(document: Mapping[str, Any]) -> bool:
    """Whether no prompt the guard can read was found. In mode ``off`` the guard reads none by
    design: ``readable_prompt`` says whether a shadow replay beside it found one (reports of
    older versions, without it, are taken to have one)."""
    if document.get("mode") == "off":
        return document.get("readable_prompt", True) is False
    return not document.get("prompts")


def is_complete(document: Mapping[str, Any]) -> bool:
    """Whether every input of the report was read to its end (reports of older versions, without
    ``complete``, are judged by their ``error``)."""
    complete = document.get("complete")
    if isinstance(complete, bool):
        return complete and not document.get("error")
    return not document.get("error")


def verdict(document: Mapping[str, Any], *, allow_empty: bool = False) -> Verdict:
    """The gate of ``docs/contract.md`` section 7: the exit status of a replay or merge of this
    report. Several failures give the status of the first in the order incomplete input,
    reports left out of a merge, invariant violations, no spans, no prompts; ``allow_empty``
    accepts the last two."""
    failed: list[tuple[int, str]] = []
    if not is_complete(document):
        error = document.get("error")
        failed.append((EXIT_INCOMPLETE, f"input stopped early: {error or 'unknown'}"))
    left_out = document.get("left_out")
    if left_out:
        shown = "; ".join(f"{entry.get('report')}: {entry.get('reason')}" for entry in left_out)
        failed.append((EXIT_LEFT_OUT, f"left out of the merge: {shown}"))
    violations = document.get("invariant_violations", 0)
    if violations:
        failed.append((EXIT_INVARIANTS, f"invariant violations: {violations}"))
    if not allow_empty:
        if not document.get("spans"):
            failed.append((EXIT_NO_SPANS, "no spans read"))
        elif _no_prompt(document):
            failed.append((EXIT_NO_PROMPTS, "no prompt the guard can read"))
    if not failed:
        return Verdict(0, ())
    return Verdict(failed[0][0], tuple(reason for _, reason in failed))


def verdict_line(document: Mapping[str, Any], *, allow_empty: bool = False) -> str:
    """One line: whether the report passes the gate, and the false-stop rate it rests on."""
    result = verdict(document, allow_empty=allow_empty)
    inputs = "inputs read completely" if is_complete(document) else "input stopped early"
    rate = false_stop_text(document)
    if result.passed:
        return f"verdict: PASS (invariants 0, {inputs}, false-stop estimate {rate})"
    reasons = printable("; ".join(result.reasons))
    return f"verdict: FAIL, exit {result.status} ({reasons}); false-stop estimate {rate}"


def false_stop_text(tally: Mapping[str, Any]) -> str:
    """The self-recovered share of would-stop prompts, as ``R% (n of m)``; ``-`` for none."""
    # Only a would-stop can be followed by a recovery: a stopped prompt ends there.
    stops = int(tally.get("prompts_would_stop", 0))
    recovered = int(tally.get("self_recovered_after_would_stop", 0))
    if not stops:
        return "n/a (no would-stop prompt)"
    return f"{100 * recovered / stops:.1f}% ({recovered} of {stops})"


SAMPLE_SHOWN: Final = 10
"""Prompts named per sample in the text report; the rest are counted."""


def verdict_text(document: Mapping[str, Any]) -> str:
    """The verdict line of a report: as the command judged it, when it did."""
    gate = document.get("verdict")
    if isinstance(gate, Mapping):  # as the command judged it (it knows --allow-empty)
        rate = false_stop_text(document)
        if gate.get("status") == 0:
            return verdict_line(document, allow_empty=True)
        reasons = "; ".join(str(r) for r in gate.get("reasons", []))
        return (
            f"verdict: FAIL, exit {gate.get('status')} ({printable(reasons)});"
            f" false-stop estimate {rate}"
        )
    return verdict_line(document)


def inputs_text(document: Mapping[str, Any]) -> str:
    """The inputs of a report, and whether they were read whole."""
    files = [printable(path) for path in document.get("files", [])]
    shown = ", ".join(files[:5]) + (f" (+{len(files) - 5} more)" if len(files) > 5 else "")
    if is_complete(document):
        return f"inputs: {shown or '(none named)'}, read completely"
    error = printable(document.get("error"))
    return f"inputs: {shown or '(none named)'}; input stopped early: {error}"


def _group_table(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per environment and version: what a rollout decides on."""
    header = (
        f"  {'environment':<16} {'version':<12} {'prompts':>7} {'would_warn':>10} {'warned':>6}"
        f" {'would_stop':>10} {'stopped':>7} {'self-recovered':>20}"
        f" {'saved calls':>11} {'saved tokens':>12}"
    )
    lines = ["per environment and version", header]
    for entry in groups:
        if entry.get("other"):
            environment, version = "(other groups)", ""
        else:
            environment = printable(entry.get(GROUP_KEYS[0]))
            version = printable(entry.get(GROUP_KEYS[1]))
        saved = entry["saved"]
        calls = saved["tool_calls"] + saved["model_calls"]
        tokens = saved["input_tokens"] + saved["output_tokens"]
        lines.append(
            f"  {environment:<16} {version:<12} {entry['prompts']:>7}"
            f" {entry['prompts_would_warn']:>10} {entry['prompts_warned']:>6}"
            f" {entry['prompts_would_stop']:>10} {entry['prompts_stopped']:>7}"
            f" {false_stop_text(entry):>20} {calls:>11} {tokens:>12}"
        )
    return lines


_SAMPLE_TITLES: Final = {
    "would_warn": "would-warn prompts (not warned)",
    "warned": "warned prompts",
    "would_stop": "would-stop prompts",
    "stopped": "stopped prompts",
}


def _sample_lines(document: Mapping[str, Any]) -> list[str]:
    """The sampled prompts, by the decision they reached, with trace IDs for the stops and how
    many more the report counted than it names."""
    lines = []
    by_decision: dict[str, list[Mapping[str, Any]]] = {}
    for name in SAMPLES:
        for entry in document.get(name, []):
            by_decision.setdefault(str(entry.get("decision")), []).append(entry)
    for decision, title in _SAMPLE_TITLES.items():
        sample = by_decision.get(decision, [])
        if not sample:
            continue
        total = max(int(document.get(f"prompts_{decision}", 0)), len(sample))
        if decision in ("would_stop", "stopped"):
            shown = ", ".join(
                f"{_sample_text(entry)} trace {printable(entry.get('trace_id'))}"
                for entry in sample[:SAMPLE_SHOWN]
            )
        else:
            shown = ", ".join(_sample_text(entry) for entry in sample[:SAMPLE_SHOWN])
        named = min(len(sample), SAMPLE_SHOWN)
        more = f" (+{total - named} more)" if total > named else ""
        lines.append(f"  {title}, {total}: {shown}{more}")
    return lines


def render_text(document: Mapping[str, Any]) -> str:
    """The report for people: verdict and inputs, the per-group table, per group, per day,
    totals, samples, sweep, bounds, invariants."""
    lines: list[str] = []
    if "files" in document:  # a replay's or merge's report, not the demo's
        lines.extend([verdict_text(document), inputs_text(document), ""])
    groups = document.get("groups", [])
    if groups:
        lines.extend(_group_table(groups))
        lines.append("")
    for entry in groups:
        lines.append(_group_title(entry))
        lines.extend(_tally_lines(entry))
        lines.append("")
    days = document.get("by_day", {})
    if days:
        lines.append("by day (UTC, day of the batch)")
        for day, tally in days.items():
            lines.append(
                f"  {printable(day)}  batches {tally['batches']}  prompts {tally['prompts']}"
                f"  would_stop {tally['prompts_would_stop']}  stopped {tally['prompts_stopped']}"
                f"  recovered {tally['self_recovered_after_would_stop']}"
                f"  decisions: {_counts_text(tally['decisions'], DECISION_VALUES)}"
            )
        lines.append("")
    duplicates = document.get("duplicate_spans", 0)
    duplicates_text = f", {duplicates} duplicate spans ignored" if duplicates else ""
    constants = ""
    if (document.get("threshold"), document.get("batch_threshold")) not in (
        (None, None),
        (THRESHOLD, BATCH_THRESHOLD),
    ):
        constants = (
            f", what-if threshold {document['threshold']}"
            f" batch threshold {document['batch_threshold']}"
        )
    lines.append(
        f"all ({document.get('traces', 0)} traces{duplicates_text},"
        f" mode {printable(document.get('mode'))}{constants})"
    )
    lines.extend(_tally_lines(document))
    profiles = document.get("profiles", {})
    lines.append(
        f"  prompts read from batch spans (acp) {profiles.get('acp', 0)},"
        f" from GenAI conventions (genai) {profiles.get('genai', 0)},"
        f" from OpenInference (openinference) {profiles.get('openinference', 0)}"
    )
    skipped = document.get("skipped", {})
    if any(skipped.values()):
        shown = _counts_text(skipped, skipped)
        lines.append(f"  requests of other signals skipped (not traces): {printable(shown)}")
    lines.extend(_sample_lines(document))
    diagnostics = document.get("diagnostics", {})
    if diagnostics:
        shown = "  ".join(f"{printable(k)} {v}" for k, v in diagnostics.items())
        lines.append(f"  guard diagnostics: {shown}")
    if document.get("sweep"):
        lines.append("")
        lines.extend(_sweep_lines(document["sweep"]))
    bounds = document.get("bounds", {})
    if any(bounds.values()):
        lines.append("")
        lines.append("bounds hit (memory stays bounded; totals stay exact)")
        for name, description in BOUNDS.items():
            if bounds.get(name):
                lines.append(f"  {bounds[name]:>6}  {description}")
    lines.append("")
    lines.append("invariants (docs/contract.md; each must be 0)")
    invariants = document.get("invariants", {})
    for name, description in INVARIANTS.items():
        lines.append(f"  {invariants.get(name, 0):>6}  {description}")
    lines.append(f"invariant violations: {document.get('invariant_violations', 0)}")
    return "\n".join(lines)
