"""What a replay report read back from a file may hold, checked before ``merge`` adds it up.

A report is the output of ``otel-guard replay --format json`` (or of ``merge``); anything else,
including a report edited by hand, is refused with one line naming the file and the first field
that does not hold: every key the replay's report writer always writes is there (a missing
count would merge as 0, a missing setting would pass for another replay's), counts are integers
from 0 to :data:`COUNT_LIMIT` (no booleans, strings, floats or NaN), names are those of the
closed sets the replay writes, lists and tables are no longer than the bounds the replay keeps,
and the file is no larger than :data:`MAX_REPORT_BYTES` and nested no deeper than a report is.
So a forged or damaged report cannot make a merged count wrong, a merge run out of memory, or
the command end in a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from otel_guard.guard.telemetry import DECISION_VALUES
from otel_guard.reducer import RESET_REASONS
from otel_guard.replay.report import (
    BOUNDS,
    DAY_LIMIT,
    GENAI_SEEN,
    GROUP_KEYS,
    GROUP_LIMIT,
    HISTORY_LIMIT,
    INVARIANTS,
    OTHER_DAY,
    SAMPLE_LIMIT,
    SAMPLES,
    SAVED_KEYS,
    TIMELINE_LIMIT,
    empty_tally,
)
from otel_guard.spans.events import PROFILE_NAMES

__all__ = [
    "COUNT_LIMIT",
    "MAX_REPORT_BYTES",
    "REQUIRED_KEYS",
    "InvalidReport",
    "load_report",
    "validate_report",
]

COUNT_LIMIT: Final = 2**53
"""The largest count a report may carry: the largest integer every JSON reader keeps exact."""

MAX_REPORT_BYTES: Final = 64 * 1024 * 1024
"""The largest report file read: four times what the bounds of a replay let it write (about 16 MB,
indented, with every group, day and hour bucket full), far below what would strain a machine."""

_MODES: Final = frozenset({"off", "shadow", "warn", "enforce"})
_NAME_LIMIT: Final = 64
"""Names a report may add beyond the closed sets (``diagnostics``, ``skipped``)."""
_TEXT_LIMIT: Final = 1 << 20
_FILE_LIMIT: Final = 1 << 20
_SWEEP_LIMIT: Final = 1000
_DAY: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_HOUR: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:00Z")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


_TALLY_KEYS: Final = tuple(empty_tally())
"""The keys of every tally: the report's totals, each group's and each day's (as the report
writer makes a tally)."""
_TALLY_COUNTS: Final = tuple(key for key, value in empty_tally().items() if type(value) is int)

REQUIRED_KEYS: Final = (
    "mode",
    "threshold",
    "batch_threshold",
    "traces",
    "duplicate_spans",
    "skipped",
    *_TALLY_KEYS,
    "invariant_violations",
    "invariants",
    "diagnostics",
    "bounds",
    "profiles",
    "genai_seen",
    *SAMPLES,
    "groups",
    "by_day",
    "timeline",
)
"""The keys every replay report has (``GuardReport.to_json`` writes them all, and ``merge``
keeps them). Each is required: merging takes a missing count as 0 and a missing setting as
another replay's, so a report without one would make the merge wrong without a word. The keys
the command adds (``files``, ``error``, ``complete``, ``verdict``) stay optional: reports of
older versions lack some of them, and :func:`~otel_guard.replay.report.is_complete` judges
those by their ``error``."""

_SWEEP_ROW_KEYS: Final = (
    "threshold",
    "batch_threshold",
    "prompts",
    "prompts_would_warn",
    "prompts_warned",
    "prompts_would_stop",
    "prompts_stopped",
    "self_recovered_after_would_stop",
    "saved",
)
"""The keys of a sweep row (``GuardReport.sweep_row``), all printed by the text report."""


class InvalidReport(ValueError):
    """A report file that is not a replay report; ``str()`` names the field."""


def _reject_constant(name: str) -> Any:
    raise InvalidReport(f"{name} is not a count")


def load_report(path: str) -> dict[str, Any]:
    """The report in the file at ``path``, validated (:func:`validate_report`).

    Raises :class:`OSError` when it cannot be read and :class:`InvalidReport` when it is not a
    replay report; the message of the latter names no file (the caller adds it).
    """
    with open(path, "rb") as stream:
        data = stream.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise InvalidReport(f"larger than {MAX_REPORT_BYTES >> 20} MiB, the limit of a report")
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except InvalidReport:
        raise
    except UnicodeDecodeError:
        raise InvalidReport("not UTF-8 text") from None
    except RecursionError:
        raise InvalidReport("not a replay report (nested too deeply)") from None
    except json.JSONDecodeError as error:
        raise InvalidReport(f"not a JSON report ({error.msg} at line {error.lineno})") from None
    except ValueError as error:  # a number longer than Python converts
        raise InvalidReport(f"not a JSON report ({error})") from None
    validate_report(document)
    return document  # type: ignore[no-any-return]


def validate_report(document: object) -> None:
    """Raise :class:`InvalidReport` unless ``document`` has the shape and bounds of a report."""
    report = _object(document, "report")
    if "decisions" not in report:  # not even a try: some other JSON
        raise InvalidReport("not a replay report (no decisions)")
    mode = report.get("mode")
    if mode not in _MODES:
        raise InvalidReport(f"mode: expected one of {', '.join(sorted(_MODES))}")
    _require(report, REQUIRED_KEYS, "")
    for key in ("threshold", "batch_threshold"):
        if _count(report[key], key) < 1:
            raise InvalidReport(f"{key}: expected a positive integer")
    for key in ("traces", "duplicate_spans", "invariant_violations"):
        _count(report[key], key)
    _tally(report, "")
    _counts(report["invariants"], "invariants", INVARIANTS)
    _counts(report["bounds"], "bounds", BOUNDS)
    _counts(report["profiles"], "profiles", PROFILE_NAMES)
    _counts(report["genai_seen"], "genai_seen", GENAI_SEEN)
    _counts(report["diagnostics"], "diagnostics", None)
    _counts(report["skipped"], "skipped", None)
    if sum(report["invariants"].values()) != report["invariant_violations"]:
        # Merging re-adds the named counts: a total without them would vanish from the merge.
        raise InvalidReport("invariant_violations: not the sum of invariants")
    for name in SAMPLES:
        for index, entry in enumerate(_list(report[name], name, SAMPLE_LIMIT)):
            _sample(entry, f"{name}[{index}]")
    for index, group in enumerate(_list(report["groups"], "groups", GROUP_LIMIT + 1)):
        where = f"groups[{index}]"
        _group_names(_object(group, where), where)
        _require(group, _TALLY_KEYS, where)
        _tally(group, where)
    days = _object(report["by_day"], "by_day")
    if len(days) > DAY_LIMIT + 1:
        raise InvalidReport(f"by_day: more than {DAY_LIMIT + 1:,} days")
    for day, tally in days.items():
        if day != OTHER_DAY and not _DAY.fullmatch(day):
            raise InvalidReport(f"by_day: {day[:40]!r} is not a day (YYYY-MM-DD)")
        where = f"by_day[{day}]"
        _require(_object(tally, where), _TALLY_KEYS, where)
        _tally(tally, where)
    timeline = _list(report["timeline"], "timeline", TIMELINE_LIMIT)
    for index, bucket in enumerate(timeline):
        where = f"timeline[{index}]"
        _object(bucket, where)
        if not isinstance(bucket.get("hour"), str) or not _HOUR.fullmatch(bucket["hour"]):
            raise InvalidReport(f"{where}.hour: expected an hour (YYYY-MM-DDTHH:00Z)")
        _group_names(bucket, where)
        _require(bucket, ("decisions",), where)
        _counts(bucket["decisions"], f"{where}.decisions", DECISION_VALUES)
    if report.get("sweep") is not None:
        for index, row in enumerate(_list(report["sweep"], "sweep", _SWEEP_LIMIT)):
            where = f"sweep[{index}]"
            _require(_object(row, where), _SWEEP_ROW_KEYS, where)
            for key in ("threshold", "batch_threshold"):
                if _count(row.get(key), f"{where}.{key}") < 1:
                    raise InvalidReport(f"{where}.{key}: expected a positive integer")
            _tally(row, where)
    files = _list(report.get("files", []), "files", _FILE_LIMIT)
    if not all(isinstance(path, str) for path in files):
        raise InvalidReport("files: expected file names")
    error = report.get("error")
    if error is not None and not isinstance(error, str):
        raise InvalidReport("error: expected a message or null")
    if "complete" in report and not isinstance(report["complete"], bool):
        raise InvalidReport("complete: expected true or false")
    if "readable_prompt" in report and not isinstance(report["readable_prompt"], bool):
        raise InvalidReport("readable_prompt: expected true or false")
    for part in _list(report.get("parts", []), "parts", _FILE_LIMIT):
        if not isinstance(part, str) or not _DIGEST.fullmatch(part):
            raise InvalidReport("parts: expected report identities (64 hex digits)")
    for index, entry in enumerate(_list(report.get("left_out", []), "left_out", _FILE_LIMIT)):
        where = f"left_out[{index}]"
        _object(entry, where)
        _text(entry.get("report"), f"{where}.report")
        _text(entry.get("reason"), f"{where}.reason")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidReport(f"{where}: expected an object")
    return value


def _list(value: object, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidReport(f"{where}: expected a list")
    if len(value) > limit:
        raise InvalidReport(f"{where}: more than {limit:,} entries")
    return value


def _count(value: object, where: str) -> int:
    if type(value) is not int or not 0 <= value <= COUNT_LIMIT:
        raise InvalidReport(f"{where}: expected a count (an integer from 0 to 2**53)")
    return value


def _time(value: object, where: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise InvalidReport(f"{where}: expected a time (nanoseconds since 1970)")
    return value


def _counts(value: object, where: str, names: tuple[str, ...] | Mapping[str, str] | None) -> None:
    table = _object(value, where)
    if names is None and len(table) > _NAME_LIMIT:
        raise InvalidReport(f"{where}: more than {_NAME_LIMIT} names")
    for key, count in table.items():
        if names is not None and key not in names:
            raise InvalidReport(f"{where}: unknown name {key[:40]!r}")
        if len(key) > 200:
            raise InvalidReport(f"{where}: a name longer than 200 characters")
        _count(count, f"{where}.{key}")


def _require(entry: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key not in entry:
            raise InvalidReport(f"{_at(where, key)}: missing (every replay report has it)")


def _tally(tally: Mapping[str, Any], where: str) -> None:
    for key in _TALLY_COUNTS:
        if key in tally:
            _count(tally[key], _at(where, key))
    if "decisions" in tally:
        _counts(tally["decisions"], _at(where, "decisions"), DECISION_VALUES)
    if "reset_reasons" in tally:
        _counts(tally["reset_reasons"], _at(where, "reset_reasons"), RESET_REASONS)
    if "saved" in tally:
        _counts(tally["saved"], _at(where, "saved"), SAVED_KEYS)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _text(value: object, where: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or len(value) > _TEXT_LIMIT:
        raise InvalidReport(f"{where}: expected a string")


def _group_names(entry: Mapping[str, Any], where: str) -> None:
    for key in GROUP_KEYS:
        _text(entry.get(key), _at(where, key), optional=True)
    if "other" in entry and entry["other"] is not True:
        raise InvalidReport(f"{where}.other: expected true")


def _sample(value: object, where: str) -> None:
    entry = _object(value, where)
    _text(entry.get("prompt_id"), f"{where}.prompt_id")
    _text(entry.get("trace_id"), f"{where}.trace_id", optional=True)
    _time(entry.get("time_unix_nano"), f"{where}.time_unix_nano")
    if entry.get("decision") not in DECISION_VALUES:
        raise InvalidReport(f"{where}.decision: expected a decision value")
    _group_names(entry, where)
    if "tool_calls_after_stop" in entry:
        _count(entry["tool_calls_after_stop"], f"{where}.tool_calls_after_stop")
    if "self_recovered" in entry and not isinstance(entry["self_recovered"], bool):
        raise InvalidReport(f"{where}.self_recovered: expected true or false")
    if "batches" in entry:
        for index, moment in enumerate(_list(entry["batches"], f"{where}.batches", HISTORY_LIMIT)):
            spot = f"{where}.batches[{index}]"
            if not isinstance(moment, list) or len(moment) != 4:
                raise InvalidReport(f"{spot}: expected [time, decision, failures, calls]")
            _time(moment[0], spot)
            _text(moment[1], spot)
            _count(moment[2], spot)
            _count(moment[3], spot)
