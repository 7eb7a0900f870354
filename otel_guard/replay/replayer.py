"""Replaying recorded spans through the guard, and the report of what it decided.

:class:`GuardPipeline` is a :class:`~otel_guard.GuardSpanProcessor` wired to in-memory
telemetry providers and a :class:`GuardReport`; the demo and the replay both use it, so their
reports are computed the same way. :class:`Replayer` turns a stream of finished spans (in any
order) back into the start/end sequence the processor would have seen live:

* spans are buffered per trace; a trace is replayed once its root span has been read and a
  reorder window of further spans has passed (so lines written out of order still join their
  trace), or when the input ends; traces ready at the same time are replayed in the order they
  started;
* a span read twice (same trace and span ID: a retried or overlapping export) is replayed once,
  whether its trace is still buffered or was replayed recently;
* a replayed trace's starts and ends are merged in time order (a parent starts before its
  children, a child ends before its parent when both end at the same nanosecond); a start is
  replayed only for spans the guard's ``START_INTEREST`` names, as the fused dispatch calls it
  live, since its ``on_start`` does nothing for the others;
* the replay acts as a host that reads the guard's action after every batch, so ``enforce``
  really issues stops.

Memory follows the open traces, not the input size: at most ``max_open_traces`` are buffered
(beyond it the oldest is replayed early) and at most ``max_trace_spans`` spans of one trace
(beyond it the trace is replayed in parts); both count in the report's ``bounds``.

A replayer can own one shard of the prompts (``shard=(index, count)``): it replays only the
traces whose prompt hashes to its index, and tells a reader which traces those are (it is an
:class:`~otel_guard.replay.otlp_json.Router`), so the spans of the others are not even built.
Shards replayed apart add up to one replay (``docs/design.md``, "Replay report, what-if and
shards").
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import heapq
import re
import time
import zlib
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, cast

from opentelemetry._logs import Logger
from opentelemetry._logs import LoggerProvider as ApiLoggerProvider
from opentelemetry._logs import LogRecord as APILogRecord
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes.deployment_attributes import (
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_NAME,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_VERSION
from opentelemetry.trace import SpanContext

from otel_guard.guard.processor import ANY_VALUE, BatchEvaluation, GuardSpanProcessor, Profile
from otel_guard.guard.telemetry import (
    DIAGNOSTIC_EVENT,
    LOOP_EVENT,
    LOOP_TYPE,
    METRIC_ATTRIBUTE_VALUES,
    TRANSITION_EVENT,
)
from otel_guard.privacy.sensitive import is_sensitive
from otel_guard.reducer import (
    BATCH_THRESHOLD,
    THRESHOLD,
    Decision,
    GuardInput,
    GuardState,
    Mode,
    Observation,
    reduce,
    reduce_with_thresholds,
)
from otel_guard.replay.otlp_json import Skipped
from otel_guard.replay.recorded import Attributes, bound_ids, bounded_id
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
    TIMELINE_LIMIT,
    add_counts,
    day_of,
    empty_tally,
    group_order,
    hour_of,
    merge_reports,
    render_text,
)
from otel_guard.spans import attributes as attr
from otel_guard.spans.assembly import PROFILES
from otel_guard.spans.events import bounded_id as guard_key
from otel_guard.spans.openinference import PROFILE as OPENINFERENCE

__all__ = [
    "DEFAULT_MAX_OPEN_TRACES",
    "DEFAULT_MAX_TRACE_SPANS",
    "DEFAULT_REORDER_WINDOW",
    "GROUP_KEYS",
    "INVARIANTS",
    "SWEEP_THRESHOLDS",
    "GuardPipeline",
    "GuardReport",
    "Replayer",
    "TelemetryAudit",
]

DEFAULT_REORDER_WINDOW: Final = 10_000
"""Spans read after a trace's root before the trace is replayed."""

DEFAULT_MAX_OPEN_TRACES: Final = 100_000
"""Traces buffered at once; beyond it the oldest is replayed without waiting for its root."""

DEFAULT_MAX_TRACE_SPANS: Final = 50_000
"""Spans buffered for one trace; beyond it the trace is replayed in parts (about 50 MB)."""

SWEEP_THRESHOLDS: Final = (2, 3, 4, 6, 8, 10, 12, 16, 24, 32)
"""Thresholds ``--sweep`` replays, each with the batch threshold in force."""

REMEMBERED_SPANS: Final = 200_000
"""Span IDs of recently replayed traces kept to recognise a late duplicate ..."""

REMEMBERED_TRACES: Final = 20_000
"""... of at most this many traces."""

_FORGOTTEN_BITS: Final = 1 << 24
"""Bits of the filter of traces replayed and forgotten (2 MiB): one of 100,000 such traces is
taken for another about once in three million new traces; one of a million, once in 500."""

_ADVANCING: Final = frozenset({"tracked", "would_warn", "warn", "would_stop", "stop"})
_ERROR_TYPE: Final = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_LOG_KEYS: Final = frozenset(METRIC_ATTRIBUTE_VALUES) | {
    "prompt_id",
    "candidate_ordinal",
    "execution_error_type",
    "loop_type",
}
_LOG_ALLOWED: Final = frozenset(key for key in _LOG_KEYS if not is_sensitive(key))
_EVENTS: Final = frozenset({TRANSITION_EVENT, LOOP_EVENT, DIAGNOSTIC_EVENT})
_MAX_PROMPT_AUDITS: Final = 200_000
_MAX_RESOURCES: Final = 4096
_NANOS_PER_DAY: Final = 24 * 3600 * 10**9
_NANOS_PER_HOUR: Final = 3600 * 10**9

Group = tuple[str | None, str | None]
_OTHER: Final[Group] = ("\0other", "\0other")  # never a resource's value: the folded groups
_Bucket = tuple[int, Group]
"""A timeline bucket: the hour (since 1970) and the group."""


def _first(entry: tuple[Any, Any]) -> Any:
    return entry[0]


def group_of(resource: Resource) -> Group:
    """The resource's (deployment environment, service version)."""
    attributes = resource.attributes
    environment = attributes.get(
        DEPLOYMENT_ENVIRONMENT_NAME, attributes.get(DEPLOYMENT_ENVIRONMENT)
    )
    version = attributes.get(SERVICE_VERSION)
    return (
        None if environment is None else str(environment),
        None if version is None else str(version),
    )


class _PromptAudit:
    __slots__ = (
        "day",
        "group",
        "history",
        "recovered",
        "serial",
        "stop",
        "stop_ns",
        "stop_span",
        "stop_tool",
        "trace_id",
        "unreliable",
        "warn_kinds",
        "warned",
        "warned_ordinals",
    )

    def __init__(self, group: Group, trace_id: int) -> None:
        self.group = group
        self.trace_id = trace_id
        self.serial = 0  # the evaluation's prompt_serial
        self.warned_ordinals: set[int] = set()
        self.unreliable = False
        self.warned = False
        self.warn_kinds: set[str] = set()
        self.stop: dict[str, Any] | None = None  # the stop sample entry, once stopped
        self.stop_ns = 0
        # The span that settled the stopped batch: for an inferred batch, the next model call,
        # whose request a stop is there to prevent.
        self.stop_span: int | None = None
        self.stop_tool: str | None = None
        self.recovered = False
        # The current streak's batches: (time, decision, failure count, calls).
        self.history: deque[list[Any]] = deque(maxlen=HISTORY_LIMIT // 2)


class _Sample:
    """The earliest :data:`SAMPLE_LIMIT` entries by (time, prompt ID); entries stay mutable."""

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []

    def offer(self, entry: dict[str, Any]) -> None:
        self._entries.append(entry)
        if len(self._entries) >= 2 * SAMPLE_LIMIT:
            self._entries = self.entries()

    def entries(self) -> list[dict[str, Any]]:
        return sorted(self._entries, key=_sample_order)[:SAMPLE_LIMIT]


def _sample_order(entry: Mapping[str, Any]) -> tuple[int, str]:
    return (entry["time_unix_nano"], entry["prompt_id"])


class GuardReport:
    """What the guard decided, batch by batch, and the invariants checked on the way.

    :meth:`observe` is a :class:`~otel_guard.GuardSpanProcessor` listener. Prompts are told apart
    by ID (unique per prompt, as ACP issues them) within a bounded table of recently active
    prompts (200,000): memory follows active prompts, not the input size. Groups, days and the
    timeline are bounded too (``otel_guard.replay.report``).
    """

    def __init__(
        self, mode: str, threshold: int = THRESHOLD, batch_threshold: int = BATCH_THRESHOLD
    ) -> None:
        self.mode = mode
        self.threshold = threshold
        self.batch_threshold = batch_threshold
        self.total = empty_tally()
        self.groups: dict[Group, dict[str, Any]] = {}
        self.days: dict[int, dict[str, Any]] = {}
        self.timeline: dict[tuple[int, Group], Counter[str]] = {}
        # The days named and the timeline's buckets, in report order: the latest is the one to
        # fold (a day) or leave out (a bucket) when an earlier one comes past the bound.
        self._named_days: list[int] = []
        self._buckets: list[tuple[tuple[int, tuple[bool, str, str, bool, bool]], _Bucket]] = []
        self.traces = 0
        self.duplicate_spans = 0
        self.skipped: Counter[str] = Counter()
        """Requests of other signals skipped by the reader, by signal (set by the caller)."""
        self.violations: Counter[str] = Counter({name: 0 for name in INVARIANTS})
        self.diagnostics: dict[str, int] = {}
        self.bounds: Counter[str] = Counter({name: 0 for name in BOUNDS})
        self.samples = {name: _Sample() for name in SAMPLES}
        self.sweep: list[dict[str, Any]] | None = None
        # Prompts by how the guard read them: batch spans (acp) or the GenAI conventions (genai).
        self.profiles: dict[Profile, int] = {"acp": 0, "genai": 0, "openinference": 0}
        # What the GenAI profile saw, for saying why a file gave no readable prompt.
        self.genai_seen: dict[str, int] = dict.fromkeys(GENAI_SEEN, 0)
        self._prompts: OrderedDict[str, _PromptAudit] = OrderedDict()  # the latest, by ID
        # Prompts started by a prompt span, by ID and that span's ID (the evaluation's serial).
        self._instances: OrderedDict[tuple[str, int], _PromptAudit] = OrderedDict()
        self._resource_groups: dict[int, tuple[Resource, Group, dict[str, Any]]] = {}

    # -- input -----------------------------------------------------------------------------

    def count_span(self, span: ReadableSpan) -> None:
        self.count_spans(span.resource, 1, span.start_time or 0)

    def count_spans(self, resource: Resource, count: int, time_ns: int | None = None) -> None:
        """Count ``count`` spans read with ``resource``, on the day of ``time_ns`` if given."""
        self.total["spans"] += count
        self._resource_group(resource)[1]["spans"] += count
        if time_ns is not None:
            self._day(time_ns)["spans"] += count

    def _resource_group(self, resource: Resource) -> tuple[Group, dict[str, Any]]:
        # Readers share one Resource object per distinct resource: look its group up once.
        cached = self._resource_groups.get(id(resource))
        if cached is None or cached[0] is not resource:
            if len(self._resource_groups) >= _MAX_RESOURCES:
                self._resource_groups.clear()
            group = group_of(resource)
            if group not in self.groups and len(self.groups) >= GROUP_LIMIT:
                self.bounds["report_groups"] += 1
                group = _OTHER
            cached = self._resource_groups[id(resource)] = (resource, group, self._group(group))
        return cached[1], cached[2]

    def _day(self, time_ns: int) -> dict[str, Any]:
        """The tally of a day: the earliest :data:`DAY_LIMIT` days are named, the rest counted
        under day ``other`` (index -1); a day named until an earlier one came is folded there
        (its counts add up), and is never named again, since the days named only get earlier."""
        index = time_ns // _NANOS_PER_DAY
        tally = self.days.get(index)
        if tally is None:
            named = self._named_days
            if len(named) >= DAY_LIMIT:
                if index > named[-1]:
                    return self._other_day()
                add_counts(self._other_day(), self.days.pop(named.pop()))
            bisect.insort(named, index)
            tally = self.days[index] = empty_tally()
        return tally

    def _other_day(self) -> dict[str, Any]:
        tally = self.days.get(-1)
        if tally is None:
            tally = self.days[-1] = empty_tally()
        return tally

    def observe(self, evaluation: BatchEvaluation) -> None:
        """Record one evaluated batch (a processor listener)."""
        span = evaluation.span
        end_ns = span.end_time or 0
        audit = self._prompts.get(evaluation.prompt_id)
        group, tally = self._resource_group(span.resource)
        tallies = (self.total, tally, self._day(end_ns))
        serial = evaluation.prompt_serial
        if audit is None or (serial and audit.serial != serial):
            # A prompt not seen yet, or a new prompt span with an ID seen before (a new turn
            # of one conversation): a prompt of its own. A state rebuilt after a loss (serial
            # 0) stays with the prompt it was part of.
            span_context = span.context
            audit = _PromptAudit(group, span_context.trace_id if span_context else 0)
            audit.serial = serial
            self._prompts[evaluation.prompt_id] = audit
            self._prompts.move_to_end(evaluation.prompt_id)
            if len(self._prompts) > _MAX_PROMPT_AUDITS:
                self._prompts.popitem(last=False)
            if serial:
                instances = self._instances
                instances[(evaluation.prompt_id, serial)] = audit
                if len(instances) > _MAX_PROMPT_AUDITS:
                    instances.popitem(last=False)
            for counts in tallies:
                counts["prompts"] += 1
            self.profiles[evaluation.profile] += 1
        else:
            self._prompts.move_to_end(evaluation.prompt_id)
        observations = evaluation.batch.observations
        calls: Sequence[Observation] = observations
        for o in observations:  # a provider duplicate is rare: the batch's tuple serves as is
            if o.provider_duplicate:
                calls = [o for o in observations if not o.provider_duplicate]
                break
        value = evaluation.decision_value
        for counts in tallies:
            counts["batches"] += 1
        if value is not None:  # most batches decide nothing
            reason = evaluation.decision.reason
            for counts in tallies:
                counts["decisions"][value] += 1
                if value == "reset" and reason is not None:
                    counts["reset_reasons"][reason] += 1
            self._timeline(end_ns, group, value)
        self._check(evaluation, audit, calls)
        state = evaluation.decision.state
        moment = [end_ns, value or "none", state.failure_count, len(calls)]
        stop = audit.stop
        if stop is not None:
            # Calls made after the stop decision: what stopping would have saved.
            stop["tool_calls_after_stop"] += len(calls)
            if len(stop["batches"]) < HISTORY_LIMIT:
                stop["batches"].append(moment)
            for counts in tallies:
                counts["saved"]["tool_calls"] += len(calls)
            if not audit.recovered and stop["decision"] == "would_stop":
                tool = audit.stop_tool
                if any(
                    o.policy_tool_name == tool
                    and o.terminal_status == "success"
                    and o.execution_status == "success"
                    for o in calls
                ):
                    audit.recovered = stop["self_recovered"] = True
                    for counts in tallies:
                        counts["self_recovered_after_would_stop"] += 1
            return
        if value == "reset" or evaluation.before.key != state.key:
            audit.history.clear()
        if value is not None or state.phase != "idle":
            audit.history.append(moment)
        if value in ("would_warn", "warned"):
            if not audit.warned:
                audit.warned = True
                self.samples["warned_prompts"].offer(self._entry(evaluation, audit, value, end_ns))
            if value not in audit.warn_kinds:
                audit.warn_kinds.add(value)
                for counts in tallies:
                    counts[f"prompts_{value}"] += 1
            audit.warned_ordinals.add(state.candidate_ordinal)
        if value in ("would_stop", "stopped"):
            entry = self._entry(evaluation, audit, value, end_ns)
            entry["tool_calls_after_stop"] = 0
            if value == "would_stop":
                entry["self_recovered"] = False
            entry["batches"] = list(audit.history)
            audit.stop = entry
            audit.stop_ns = end_ns
            audit.stop_span = None if span.context is None else span.context.span_id
            audit.stop_tool = None if state.key is None else state.key.policy_tool_name
            audit.history.clear()
            self.samples[f"{value}_prompts"].offer(entry)
            for counts in tallies:
                counts[f"prompts_{value}"] += 1

    def observe_model_call(self, prompt_id: str, span: ReadableSpan, serial: int = 0) -> None:
        """Count a model call of ``prompt_id`` as saved work if it started after a stop, or is
        the model call that settled the stopped batch (sections 3b, 3c). ``serial``: the span ID
        of the prompt span whose prompt it belongs to, when known (0: the latest with the ID)."""
        audit = self._instances.get((prompt_id, serial)) if serial else self._prompts.get(prompt_id)
        if audit is None or audit.stop is None:
            return
        start = span.start_time or 0
        if start < audit.stop_ns and (
            span.context is None or span.context.span_id != audit.stop_span
        ):
            return
        attributes = span.attributes or {}
        input_tokens = attributes.get(attr.USAGE_INPUT_TOKENS)
        output_tokens = attributes.get(attr.USAGE_OUTPUT_TOKENS)
        tallies = (self.total, self._group(audit.group), self._day(start))
        for counts in tallies:
            saved = counts["saved"]
            saved["model_calls"] += 1
            if type(input_tokens) is int and input_tokens > 0:
                saved["input_tokens"] += input_tokens
            if type(output_tokens) is int and output_tokens > 0:
                saved["output_tokens"] += output_tokens

    def _check(
        self, evaluation: BatchEvaluation, audit: _PromptAudit, calls: Sequence[Observation]
    ) -> None:
        """The required invariants, re-derived from the batch, not from the reducer."""
        if not evaluation.input_reliable:
            audit.unreliable = True
        value = evaluation.decision_value
        stopping = value == "stopped" or (
            evaluation.action is not None and evaluation.action.kind == "stop"
        )
        if stopping and audit.unreliable:
            self.violations["enforcement_after_unreliable_input"] += 1
        if value in (
            "would_stop",
            "stopped",
        ) and evaluation.decision.state.candidate_ordinal not in (audit.warned_ordinals):
            self.violations["stop_without_warning"] += 1
        if evaluation.decision.kind not in _ADVANCING:
            return
        cancelled = ineligible = False
        for o in calls:
            if o.terminal_status == "cancelled" or o.execution_status == "cancelled":
                cancelled = True
            if _ineligible(o):
                ineligible = True
        if cancelled:
            self.violations["cancelled_counted"] += 1
        if ineligible:
            self.violations["ineligible_counted"] += 1
        call_ids = {o.call_id for o in calls}
        incomplete = not evaluation.batch.complete or "" in call_ids
        if evaluation.profile == "acp":
            # A batch span proves completeness by its admitted count.
            # The attribute store itself: the public property wraps it in a new proxy per call.
            admitted = _attributes_of(evaluation.span).get(attr.BATCH_ADMITTED)
            incomplete = incomplete or type(admitted) is not int or admitted != len(call_ids)
        # An inferred batch (sections 3b, 3c) has no admitted count: it is complete when every
        # call of its window had ended when it settled, each with its own ID.
        if incomplete:
            self.violations["incomplete_batch_decision"] += 1

    def audit_log_record(self, record: ReadableLogRecord) -> None:
        """Check one guard log record against the closed output vocabulary."""
        log = record.log_record
        attributes = log.attributes
        # The SDK's attribute store iterates in Python, a call per entry: read its dictionary.
        store = getattr(attributes, "_dict", None)
        self.audit_record(log.event_name, log.body, store if type(store) is dict else attributes)

    def audit_record(
        self, event_name: str | None, body: object, attributes: Mapping[str, Any] | None
    ) -> None:
        """Check one guard record (its event name, body and attributes) against the closed
        output vocabulary."""
        ok = event_name in _EVENTS and body is None
        for key, value in (attributes or {}).items():
            if key not in _LOG_ALLOWED:
                ok = False
            elif key in METRIC_ATTRIBUTE_VALUES:
                ok = ok and value in METRIC_ATTRIBUTE_VALUES[key]
            elif key == "prompt_id":
                ok = ok and isinstance(value, str)
            elif key == "candidate_ordinal":
                ok = ok and type(value) is int
            elif key == "execution_error_type":
                ok = ok and isinstance(value, str) and _ERROR_TYPE.fullmatch(value) is not None
            elif key == "loop_type":
                ok = ok and value == LOOP_TYPE
        if not ok:
            self.violations["sensitive_telemetry"] += 1

    def audit_metrics(self, reader: InMemoryMetricReader) -> None:
        """Check every guard metric point's attributes against the closed sets."""
        data = reader.get_metrics_data()
        if data is None:
            return
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        for key, value in (point.attributes or {}).items():
                            allowed = METRIC_ATTRIBUTE_VALUES.get(key)
                            if allowed is None or value not in allowed or is_sensitive(key):
                                self.violations["sensitive_telemetry"] += 1

    # -- output ----------------------------------------------------------------------------

    @property
    def invariant_violations(self) -> int:
        return sum(self.violations.values())

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON-ready object (``docs/contract.md`` section 7 fields, and more),
        in the canonical form :func:`~otel_guard.replay.report.merge_reports` gives."""
        document: dict[str, Any] = {
            "mode": self.mode,
            "threshold": self.threshold,
            "batch_threshold": self.batch_threshold,
            "traces": self.traces,
            "duplicate_spans": self.duplicate_spans,
            "skipped": dict(self.skipped),
        }
        document.update(self.total)
        document["invariants"] = {name: self.violations[name] for name in INVARIANTS}
        document["diagnostics"] = dict(self.diagnostics)
        document["bounds"] = dict(self.bounds)
        document["profiles"] = dict(self.profiles)
        document["genai_seen"] = dict(self.genai_seen)
        for name, sample in self.samples.items():
            document[name] = sample.entries()
        document["groups"] = [
            {
                GROUP_KEYS[0]: None if group == _OTHER else group[0],
                GROUP_KEYS[1]: None if group == _OTHER else group[1],
                **({"other": True} if group == _OTHER else {}),
                **tally,
            }
            for group, tally in self.groups.items()
        ]
        document["by_day"] = {
            OTHER_DAY if index < 0 else day_of(index * _NANOS_PER_DAY): tally
            for index, tally in self.days.items()
        }
        document["timeline"] = [
            {
                "hour": hour_of(index * _NANOS_PER_HOUR),
                GROUP_KEYS[0]: None if group == _OTHER else group[0],
                GROUP_KEYS[1]: None if group == _OTHER else group[1],
                **({"other": True} if group == _OTHER else {}),
                "decisions": dict(counts),
            }
            for (index, group), counts in self.timeline.items()
        ]
        if self.sweep is not None:
            document["sweep"] = self.sweep
        return merge_reports([document])

    def render_text(self) -> str:
        """The report for people (:func:`otel_guard.replay.report.render_text`)."""
        return render_text(self.to_json())

    # -- helpers ---------------------------------------------------------------------------

    def _group(self, group: Group) -> dict[str, Any]:
        tally = self.groups.get(group)
        if tally is None:
            tally = self.groups[group] = empty_tally()
        return tally

    def _timeline(self, time_ns: int, group: Group, value: str) -> None:
        """Count a decision in its hour-and-group bucket: the earliest :data:`TIMELINE_LIMIT`
        buckets (in report order) are kept, as for days; a later one's decisions are left out,
        and counted as left out by the report (``bounds.timeline``)."""
        hour = time_ns // _NANOS_PER_HOUR
        key = (hour, group)
        counts = self.timeline.get(key)
        if counts is None:
            order = (hour, group_order((True, None, None) if group == _OTHER else (False, *group)))
            kept = self._buckets
            if len(kept) >= TIMELINE_LIMIT:
                if order > kept[-1][0]:
                    return
                del self.timeline[kept.pop()[1]]
            bisect.insort(kept, (order, key), key=_first)
            counts = self.timeline[key] = Counter()
        counts[value] += 1

    def _entry(
        self, evaluation: BatchEvaluation, audit: _PromptAudit, value: str, time_ns: int
    ) -> dict[str, Any]:
        return {
            "prompt_id": evaluation.prompt_id,
            "trace_id": f"{audit.trace_id:032x}",
            "decision": value,
            "time_unix_nano": time_ns,
            GROUP_KEYS[0]: None if audit.group == _OTHER else audit.group[0],
            GROUP_KEYS[1]: None if audit.group == _OTHER else audit.group[1],
        }

    def sweep_row(self) -> dict[str, Any]:
        """This report's totals as one row of a what-if sweep."""
        total = self.total
        return {
            "threshold": self.threshold,
            "batch_threshold": self.batch_threshold,
            "prompts": total["prompts"],
            "prompts_would_warn": total["prompts_would_warn"],
            "prompts_warned": total["prompts_warned"],
            "prompts_would_stop": total["prompts_would_stop"],
            "prompts_stopped": total["prompts_stopped"],
            "self_recovered_after_would_stop": total["self_recovered_after_would_stop"],
            "saved": dict(total["saved"]),
        }


def _ineligible(observation: Observation) -> bool:
    execution = observation.execution_status
    if execution is None or execution == "unknown":
        return True
    if observation.terminal_status != "error":
        return False
    if execution in ("not_started", "success"):
        return True  # a validation/permission failure, or a post-execution failure
    error_type = observation.execution_error_type
    return execution == "error" and (not error_type or error_type == "unknown")


class TelemetryAudit(LogRecordExporter):
    """A log record exporter that checks each guard record and keeps none of them."""

    def __init__(self, report: GuardReport) -> None:
        self._report = report

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        for record in batch:
            self._report.audit_log_record(record)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _AuditLogger(Logger):
    """Checks each record as the guard emits it (:meth:`GuardReport.audit_record`) and keeps
    none: the replay's logger.

    It sees what an SDK logger would hand :class:`TelemetryAudit`, without the SDK's record:
    the SDK copies and validates each record's attributes, about 150,000 instructions a record
    and a tenth of a replay's CPU, for a record nothing exports.
    """

    def __init__(self, report: GuardReport, name: str) -> None:
        super().__init__(name)
        self._report = report

    def emit(
        self,
        record: object = None,
        *,
        timestamp: int | None = None,
        observed_timestamp: int | None = None,
        context: object = None,
        severity_number: object = None,
        severity_text: str | None = None,
        body: object = None,
        attributes: Mapping[str, Any] | None = None,
        event_name: str | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if record is not None:  # the guard's records: an API LogRecord, not yet the SDK's
            fields = cast(APILogRecord, record)
            event_name, body, attributes = fields.event_name, fields.body, fields.attributes
        self._report.audit_record(event_name, body, attributes)

    def enabled(self, **_: object) -> bool:
        return True


class _AuditLoggerProvider(ApiLoggerProvider):
    """The logger provider of a :class:`GuardPipeline`: every logger audits into one report."""

    def __init__(self, report: GuardReport) -> None:
        self._report = report

    def get_logger(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: object = None,
    ) -> Logger:
        return _AuditLogger(self._report, name)

    def shutdown(self) -> None:
        """Nothing is kept, so nothing is flushed."""


class GuardPipeline:
    """A guard with in-memory telemetry that is audited, and a report fed by its listener.

    ``listener`` also receives every evaluation. With ``host=True`` the pipeline takes the
    guard's action after every batch, like an agent host that applies reminders and stops (the
    replay's host); the demo takes its actions itself. ``threshold`` and ``batch_threshold``
    other than the live constants replay what-if decisions (analysis only).
    """

    def __init__(
        self,
        mode: str,
        *,
        host: bool,
        listener: Callable[[BatchEvaluation], None] | None = None,
        threshold: int = THRESHOLD,
        batch_threshold: int = BATCH_THRESHOLD,
    ) -> None:
        self.report = GuardReport(mode, threshold, batch_threshold)
        self._listener = listener
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        self.logger_provider = _AuditLoggerProvider(self.report)
        self.now_ns = 0  # the replay's clock: span time, read by the guard in seconds
        self._host = host
        reducer: Callable[[GuardState, GuardInput], Decision] = reduce
        if (threshold, batch_threshold) != (THRESHOLD, BATCH_THRESHOLD):
            reducer = functools.partial(
                reduce_with_thresholds, threshold=threshold, batch_threshold=batch_threshold
            )
        self.guard = GuardSpanProcessor(
            mode=mode,
            meter_provider=self.meter_provider,
            logger_provider=self.logger_provider,
            listener=self._observe,
            clock=self._clock if host else time.monotonic,
            reducer=reducer,
            # One thread reads the file and runs the guard: a worker would only add hand-offs.
            background_telemetry=False,
        )

    def _clock(self) -> float:
        return self.now_ns / 1e9

    def _observe(self, evaluation: BatchEvaluation) -> None:
        self.report.observe(evaluation)
        if self._listener is not None:
            self._listener(evaluation)
        if self._host and evaluation.action is not None:
            # The guard holds a pending action only when this batch decided one (it sets it to
            # the evaluation's, and the replay's one thread runs nothing in between): reading
            # it after any other batch would return None and change nothing.
            self.guard.take_action(evaluation.prompt_id)

    def close(self) -> GuardReport:
        """Finish the audit and shut the providers down; returns the report."""
        self.report.diagnostics = self.guard.diagnostics()
        seen = self.guard.genai_coverage()
        self.report.genai_seen = {name: getattr(seen, name) for name in GENAI_SEEN}
        self.report.audit_metrics(self.metric_reader)
        self.guard.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()
        return self.report


# A buffered span: the span, its span ID (None without a context), its parent's span ID, its
# start and end times, and whether the guard's on_start can matter for it, read once when it is
# buffered.
_Buffered = tuple[ReadableSpan, int | None, int | None, int, int, bool]
_Event = tuple[int, int, int, int, ReadableSpan]
"""A start or end event: time, whether an end, tie-break, index in its trace, the span."""
_Prepared = tuple[list[_Event], dict[int, str], list[tuple[ReadableSpan, str, int]]]
"""A trace ready to replay: its events in order, its section 3 prompts' model calls (by span
object ID), and its inferred prompts' model calls."""


class _Trace:
    __slots__ = ("duplicates", "late", "model_calls", "spans", "start")

    def __init__(self, start: int) -> None:
        # Span ID -> span, in the order read: the replay's tie-break, and the parent look-up.
        self.spans: dict[int, _Buffered] = {}
        self.start = start  # the earliest start time read
        self.duplicates: list[tuple[Resource, int]] = []  # spans read again: resource, start
        self.model_calls: list[ReadableSpan] = []  # its model-call spans, in the order read
        self.late = False  # a part read after the trace was replayed (the late_spans bound)

    def spans_read(self) -> Iterator[ReadableSpan]:
        return (buffered[0] for buffered in self.spans.values())


_START_KEYS: Final = frozenset(
    key for key, value in GuardSpanProcessor.START_INTEREST if value is ANY_VALUE
)
_START_VALUES: Final = tuple(
    (key, value) for key, value in GuardSpanProcessor.START_INTEREST if value is not ANY_VALUE
)
_MISSING: Final = object()


def _start_value_matches(attributes: Mapping[str, Any]) -> bool:
    """Whether a span carries one of the keys the guard's
    :attr:`~GuardSpanProcessor.START_INTEREST` wants with one value only, with that value (none
    today). With a key it wants with any value (:data:`_START_KEYS`), this is the test the fused
    dispatch makes live before ``on_start``; the replay leaves out the start of other spans."""
    return any(attributes.get(key, _MISSING) == value for key, value in _START_VALUES)


def _attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    store = getattr(span, "_attributes", None)
    if isinstance(store, dict):  # spans read from files hold a plain dictionary
        return store
    return span.attributes or {}


def prompt_key(span: ReadableSpan) -> str | None:
    """The prompt ID a span names for routing: ``acp.prompt.id``, or the conversation ID of an
    agent invocation without one."""
    attributes = _attributes_of(span)
    prompt_id = attributes.get(attr.PROMPT_ID)
    if isinstance(prompt_id, str):
        return prompt_id
    if attributes.get(attr.OPERATION_NAME) == attr.INVOKE_AGENT:
        conversation = attributes.get(attr.CONVERSATION_ID)
        if isinstance(conversation, str):
            return conversation
    return None


_PROMPT_DEPTH: Final = 64  # spans looked at, the model call included, for its prompt


def _prompt_of(
    span: ReadableSpan, by_id: Mapping[int, _Buffered], above: dict[int, tuple[str, int] | None]
) -> tuple[str, int] | None:
    """The prompt whose saved work a model-call span counts for, as the guard named it, and
    the span ID of an inferred prompt's span (0 for a section 3 prompt).

    The nearest of the span and its ancestors naming a section 3 prompt (``acp.prompt.id``);
    else the outermost ancestor a profile reads as a prompt (sections 3b, 3c: the assembly's
    prompt is the outermost), by its conversation or session ID, else its span ID. The walk
    stops at a remote parent (the process's local root) and after :data:`_PROMPT_DEPTH` spans.
    ``above`` keeps, by parent span ID, what the walk from that parent found (within one
    trace): the model calls of a turn share their parent."""
    own = _section_3_prompt(span)
    if own is not None:
        return own, 0
    parent = span.parent
    if parent is None or parent.is_remote:
        return None
    parent_id = parent.span_id
    if parent_id not in above:
        found = by_id.get(parent_id)
        above[parent_id] = (
            None if found is None else _prompt_above(found[0], by_id, _PROMPT_DEPTH - 1)
        )
    return above[parent_id]


def _section_3_prompt(span: ReadableSpan) -> str | None:
    prompt_id = _attributes_of(span).get(attr.PROMPT_ID)
    return guard_key(prompt_id) if isinstance(prompt_id, str) else None


def _prompt_above(
    span: ReadableSpan, by_id: Mapping[int, _Buffered], depth: int
) -> tuple[str, int] | None:
    """:func:`_prompt_of` for ``span`` and its ancestors, looking at ``depth`` spans at most."""
    current = span
    outermost: tuple[str, int] | None = None
    for _ in range(depth):
        attributes = _attributes_of(current)
        key = attributes.get(attr.PROMPT_ID)
        if isinstance(key, str):
            return guard_key(key), 0
        parent = current.parent
        local_root = parent is None or parent.is_remote
        for profile in PROFILES:
            claim = profile.read(current, attributes, local_root)
            if claim is not None:
                context = current.context
                if claim.kind == "prompt" and context is not None:
                    outermost = (
                        guard_key(claim.prompt_id or f"{context.span_id:016x}"),
                        context.span_id,
                    )
                break
        if parent is None or local_root:
            return outermost
        found = by_id.get(parent.span_id)
        if found is None:
            return outermost
        current = found[0]
    return outermost


_NONE_SENT: Final[Iterator[Any]] = iter(())
"""The spans of :meth:`Replayer.add` given apart when none are."""


class Replayer:
    """Feeds finished spans, in any order, through a guard in their live start/end order.

    ``add`` takes spans as they are read; ``finish`` replays what is still buffered and returns
    the report. The guard's clock follows the replayed span times, so its prompt TTL means the
    same as in the live process. ``threshold``/``batch_threshold`` replay with other constants
    and ``sweep`` replays, beside it, one guard per threshold given (analysis only). ``shard``
    ``(index, count)`` replays only the traces whose prompt hashes to ``index``.
    """

    def __init__(
        self,
        mode: Mode | str = "shadow",
        *,
        reorder_window: int = DEFAULT_REORDER_WINDOW,
        max_open_traces: int = DEFAULT_MAX_OPEN_TRACES,
        max_trace_spans: int = DEFAULT_MAX_TRACE_SPANS,
        threshold: int = THRESHOLD,
        batch_threshold: int = BATCH_THRESHOLD,
        sweep: Iterable[int] = (),
        shard: tuple[int, int] | None = None,
    ) -> None:
        if shard is not None and not 0 <= shard[0] < shard[1]:
            raise ValueError("shard must be (index, count) with 0 <= index < count")
        self.pipeline = GuardPipeline(
            mode, host=True, threshold=threshold, batch_threshold=batch_threshold
        )
        self.report = self.pipeline.report
        self._sweep = sorted(set(sweep))
        self._pipelines = [self.pipeline] + [
            GuardPipeline(mode, host=True, threshold=t, batch_threshold=batch_threshold)
            for t in self._sweep
            if t != threshold
        ]
        self._window = reorder_window
        self._max_open = max_open_traces
        self._max_spans = max(max_trace_spans, 1)
        self._shard = shard
        self._traces: dict[int, _Trace] = {}
        self._finished: deque[tuple[int, int]] = deque()
        self._read = 0
        # Recently replayed traces: whether this replayer owned them, and their span IDs.
        self._replayed: OrderedDict[int, tuple[bool, set[int]]] = OrderedDict()
        self._remembered = 0
        # Those of them replayed in parts at a bound (trace_spans, open_traces), whose later
        # spans that bound has counted already: not late for the window.
        self._cut: set[int] = set()
        # Traces this replayer owned, replayed and then forgotten: a fixed-size filter, so that
        # spans of one coming back (a file given twice, a trace exported in far-apart parts)
        # are said to be replayed apart (the replayed_traces bound), not silently.
        self._forgotten = bytearray(_FORGOTTEN_BITS // 8)
        # Shards: owners decided by a prompt key before the trace was replayed (Router).
        self._decided: dict[int, bool] = {}

    def add(
        self, spans: Iterable[ReadableSpan | Skipped], sent: Iterator[ReadableSpan] = _NONE_SENT
    ) -> None:
        """Buffer spans as read; a :data:`~otel_guard.replay.otlp_json.Skipped` placeholder (a span
        of a trace another shard replays, not built) only takes its place in the read order.

        A ``0`` in ``spans`` (never a trace ID) stands for the next span of ``sent``: a line
        whose spans were built in two places (:mod:`otel_guard.replay.shards`) is added in one
        pass, without a list of it put together first."""
        traces = self._traces
        finished = self._finished
        window = self._window
        max_spans = self._max_spans
        read = self._read
        # Most spans name neither ID: bound_ids is called only for those that do.
        prompt_id, conversation_id = attr.PROMPT_ID, attr.CONVERSATION_ID
        operation_name, model_operations = attr.OPERATION_NAME, attr.MODEL_OPERATIONS
        span_kind, openinference_model_call = attr.OPENINFERENCE_SPAN_KIND, OPENINFERENCE.model_call
        # Whether the guard's on_start can matter, the keys' test written out: once per span.
        start_keys, start_values = _START_KEYS, _START_VALUES
        try:
            for span in spans:
                # The fields every ReadableSpan sets, read directly: each property is a call.
                read += 1
                if span is None:
                    continue
                if isinstance(span, int):
                    if span:  # the root of a trace another shard replays
                        finished.append((span, read + window))
                        continue
                    span = next(sent)
                context = span._context
                if context is None:
                    trace_id, span_id = 0, None
                else:
                    trace_id, span_id = context[0], context[1]
                key = span_id or 0
                start = span._start_time or 0
                trace = traces.get(trace_id)
                if trace is None:
                    replayed = self._replayed.get(trace_id)
                    if replayed is not None and key in replayed[1]:
                        # Export is at-least-once: a retried request repeats spans already read.
                        if replayed[0]:
                            self.report.duplicate_spans += 1
                            self.report.count_spans(span._resource, 1, start)
                        continue
                    if replayed is None and self._was_forgotten(trace_id):
                        self.report.bounds["replayed_traces"] += 1
                    if len(traces) >= self._max_open:
                        self._replay(next(iter(traces)), bound="open_traces")
                    trace = traces[trace_id] = _Trace(start)
                    # Its trace was replayed when its root's reorder window passed: this part
                    # comes too late for it, and is replayed apart (a part cut at a bound is
                    # that bound's). Only the owner of the trace counts its spans.
                    trace.late = replayed is not None and replayed[0] and trace_id not in self._cut
                buffered = trace.spans
                if key in buffered:
                    trace.duplicates.append((span._resource, start))
                    continue
                if trace.late:
                    self.report.bounds["late_spans"] += 1
                if start < trace.start:
                    trace.start = start
                store = span._attributes
                if type(store) is Attributes:
                    if (prompt_id in store or conversation_id in store) and bound_ids(store):
                        # Buffered spans keep a fixed-size digest of an over-long ID, not the ID.
                        self.report.bounds["prompt_ids"] += 1
                    attributes: Mapping[str, Any] = store
                else:
                    attributes = _attributes_of(span)
                if attributes.get(operation_name) in model_operations or (
                    span_kind in attributes and openinference_model_call(attributes)
                ):
                    trace.model_calls.append(span)
                parent = span._parent
                buffered[key] = (
                    span,
                    span_id,
                    None if parent is None else parent[1],
                    start,
                    span._end_time or 0,
                    not start_keys.isdisjoint(attributes)
                    or bool(start_values and _start_value_matches(attributes)),
                )
                if parent is None or parent[2]:  # a root, or a local root (remote parent)
                    finished.append((trace_id, read + window))
                if len(buffered) >= max_spans:
                    self._replay(trace_id, bound="trace_spans")
        finally:
            self._read = read
        if finished and finished[0][1] <= self._read:
            ready = []
            while finished and finished[0][1] <= self._read:
                ready.append(finished.popleft()[0])
            self._replay_in_start_order(ready)

    @property
    def open_traces(self) -> int:
        """Traces buffered and not yet replayed."""
        return len(self._traces)

    def finish(self) -> GuardReport:
        """Replay every buffered trace and close the pipelines; returns the report."""
        self._replay_in_start_order(list(self._traces))
        self._finished.clear()
        reports = {p.report.threshold: p.close() for p in self._pipelines}
        if self._sweep:
            self.report.sweep = [reports[t].sweep_row() for t in self._sweep]
        return self.report

    def _replay_in_start_order(self, trace_ids: Sequence[int]) -> None:
        """Replay traces ready together as one stream of events, in the order of their times:
        a section 3 prompt span and batch spans that are traces of their own (a host that
        starts each batch span without a parent) are then seen as live, the prompt span's start
        (and its opt-out) before its batches and its end after them. Trace by trace, even in the
        order they started, the prompt span would start and end before its batches settled."""
        traces = self._traces
        started = {trace_id: traces[trace_id].start for trace_id in trace_ids if trace_id in traces}
        order = sorted(started, key=started.__getitem__)
        if _share_span_ids(traces[trace_id] for trace_id in order):
            # Copies of one trace under other trace IDs (generated input): the guard tells open
            # spans apart by span ID, as a process that makes them does, so these go one by one.
            for trace_id in order:
                self._replay(trace_id)
            return
        prepared = [self._prepare(trace_id) for trace_id in order]
        self._feed([part for part in prepared if part is not None])

    # -- shards: the Router of the reader (otel_guard.replay.otlp_json) ---------------------------

    def owner_of(self, trace_id: int) -> bool | None:
        """Whether this replayer replays the trace, if that is decided already."""
        if self._shard is None:
            return True
        remembered = self._replayed.get(trace_id)
        if remembered is not None:
            return remembered[0]
        return self._decided.get(trace_id)

    def owns_key(self, key: str) -> bool:
        """Whether this replayer replays the prompt named ``key`` (as the spans of it name it once
        buffered: an over-long ID by its digest)."""
        return self._owns_bytes(bounded_id(key).encode("utf-8", "replace"))

    def decide(self, trace_id: int, owned: bool) -> None:
        """Record the owner of a trace not yet replayed, decided by its first prompt key."""
        if self._shard is not None and trace_id not in self._replayed:
            self._decided.setdefault(trace_id, owned)

    def owns_shard(self, shard: int) -> bool:
        """Whether this replayer replays shard ``shard`` (the index of a prompt key's shard)."""
        return self._shard is None or self._shard[0] == shard

    def _owns_bytes(self, key: bytes) -> bool:
        if self._shard is None:
            return True
        index, count = self._shard
        return zlib.crc32(key) % count == index

    def _owns(self, trace_id: int, trace: _Trace) -> bool:
        if self._shard is None:
            return True
        remembered = self._replayed.get(trace_id)
        if remembered is not None:
            return remembered[0]  # a later part of a trace goes where its first part went
        decided = self._decided.pop(trace_id, None)
        if decided is not None:
            return decided  # by the first prompt key the reader found for it
        # The first prompt named in read order: the same in every process, found early.
        named = next((k for k in map(prompt_key, trace.spans_read()) if k is not None), None)
        if named is not None:
            return self.owns_key(named)
        return self._owns_bytes(trace_id.to_bytes(16, "big"))

    def _remember(self, trace_id: int, owner: bool, span_ids: Iterable[int]) -> None:
        ids = set(span_ids)
        entry = self._replayed.get(trace_id)
        if entry is None:
            self._replayed[trace_id] = (owner, ids)
        else:
            entry[1].update(ids)
            self._replayed.move_to_end(trace_id)
        self._remembered += len(ids)
        replayed = self._replayed
        while (self._remembered > REMEMBERED_SPANS or len(replayed) > REMEMBERED_TRACES) and (
            replayed
        ):
            old_id, (old_owner, old_ids) = replayed.popitem(last=False)
            self._remembered -= len(old_ids)
            self._cut.discard(old_id)
            if old_id == trace_id:
                # Larger than the memory alone: keep where it went, forget its span IDs.
                replayed[trace_id] = (old_owner, set())
                break
            if old_owner:
                self._forget(old_id)

    @staticmethod
    def _filter_bits(trace_id: int) -> tuple[int, ...]:
        # Four 24-bit positions from a digest: trace IDs need not be random (tests, replays of
        # generated traffic), so their own bits are not used.
        digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), digest_size=12).digest()
        return tuple(int.from_bytes(digest[i : i + 3], "big") for i in range(0, 12, 3))

    def _forget(self, trace_id: int) -> None:
        forgotten = self._forgotten
        for bit in self._filter_bits(trace_id):
            forgotten[bit >> 3] |= 1 << (bit & 7)

    def _was_forgotten(self, trace_id: int) -> bool:
        forgotten = self._forgotten
        return all(forgotten[bit >> 3] & (1 << (bit & 7)) for bit in self._filter_bits(trace_id))

    def _replay(self, trace_id: int, bound: str | None = None) -> None:
        prepared = self._prepare(trace_id, bound)
        if prepared is not None:
            self._feed([prepared])

    def _prepare(self, trace_id: int, bound: str | None = None) -> _Prepared | None:
        """Count a trace's spans in the report and order its events; None when this replayer
        does not replay it (another shard's, or replayed already)."""
        trace = self._traces.pop(trace_id, None)
        if trace is None:
            decided = self._decided.pop(trace_id, None)
            if decided is not None:
                # A trace of another shard, none of whose spans was built: a later part of it
                # goes there too.
                self._remember(trace_id, decided, ())
            return None  # already replayed (a second root, or a bound)
        owner = self._owns(trace_id, trace)
        self._remember(trace_id, owner, trace.spans)
        if not owner:
            return None
        report = self.report
        if bound is not None:
            report.bounds[bound] += 1
            self._cut.add(trace_id)
        report.traces += 1
        # Spans are counted per run of one resource and UTC day (of the span's start): a
        # trace's spans usually share both.
        resource: Resource | None = None
        day = -1
        run = 0
        for buffered in trace.spans.values():
            here = buffered[3] // _NANOS_PER_DAY
            if buffered[0]._resource is not resource or here != day:
                if resource is not None:
                    report.count_spans(resource, run, day * _NANOS_PER_DAY)
                resource, day, run = buffered[0]._resource, here, 0
            run += 1
        if resource is not None:
            report.count_spans(resource, run, day * _NANOS_PER_DAY)
        for duplicate, start in trace.duplicates:
            report.duplicate_spans += 1
            report.count_spans(duplicate, 1, start)
        by_id = trace.spans
        if bound != "trace_spans":
            # A trace replayed in parts as read: a parent missing now may be in a later part.
            _root_orphans(by_id, self._replayed[trace_id][1])
        events = _events(list(by_id.values()), by_id)
        # Model calls of section 3 prompts count when they end, as live; those of inferred
        # prompts once the trace is replayed: such a prompt is decided when it ends.
        model_calls: dict[int, str] = {}
        inferred_calls: list[tuple[ReadableSpan, str, int]] = []
        above: dict[int, tuple[str, int] | None] = {}
        for record in trace.model_calls:
            found = _prompt_of(record, by_id, above)
            if found is not None:
                if found[1]:
                    inferred_calls.append((record, *found))
                else:
                    model_calls[id(record)] = found[0]
        return events, model_calls, inferred_calls

    def _feed(self, prepared: Sequence[_Prepared]) -> None:
        """Run the events of prepared traces through every pipeline, merged by time when there
        are several (each trace's own order kept, and the earlier-started trace first on a tie)."""
        if not prepared:
            return
        if len(prepared) == 1:
            events, model_calls, inferred_calls = prepared[0]
        else:
            model_calls = {}
            inferred_calls = []
            for _, calls, inferred in prepared:
                model_calls.update(calls)
                inferred_calls.extend(inferred)
            events = [
                (event[0], event[1], event[2], event[4], event[5])
                for event in heapq.merge(
                    *(
                        [(*event[:3], order, *event[3:]) for event in part[0]]
                        for order, part in enumerate(prepared)
                    )
                )
            ]
        for pipeline in self._pipelines:
            # on_start reads only what a ReadableSpan has: context, parent and attributes.
            on_start = cast(Callable[[ReadableSpan], None], pipeline.guard.on_start)
            on_end = pipeline.guard.on_end
            observe_model_call = pipeline.report.observe_model_call
            for time_ns, is_end, _, _, span in events:
                pipeline.now_ns = time_ns
                if is_end:
                    on_end(span)
                    if model_calls:
                        prompt = model_calls.get(id(span))
                        if prompt is not None:
                            observe_model_call(prompt, span)
                else:
                    on_start(span)
            for record, prompt, serial in inferred_calls:
                observe_model_call(prompt, record, serial)


def _share_span_ids(traces: Iterable[_Trace]) -> bool:
    """Whether two of ``traces`` hold a span with the same span ID."""
    seen: set[int] = set()
    count = 0
    for trace in traces:
        seen.update(trace.spans)
        count += len(trace.spans)
        if len(seen) < count:
            return True
    return False


def _root_orphans(by_id: Mapping[int, _Buffered], replayed: set[int]) -> None:
    """Read a span whose parent is in no part of its trace the replay has read as a local root
    under a remote parent, as a live process saw it.

    A parent the input lacks was never this process's local span: it ran in a caller whose
    spans went elsewhere (another service's export, a filter of the Collector) or were never
    exported. Live, such a parent arrives propagated and marked remote; writers that predate
    the OTLP span flags' remote bits (or a parent lost on the way) leave the mark out. Without
    it the prompt below would wait for its ancestors to end, which never happens: the replay
    would decide nothing where the live guard decided. The span's recorded parent is replaced
    by the same IDs marked remote (the replay owns its spans); ``replayed`` holds the span IDs
    of this trace read so far, parts replayed earlier included, whose spans are not orphans'
    parents. Not for a part of a trace cut at the ``trace_spans`` bound, whose later parts may
    hold the parent; a trace replayed at the ``open_traces`` bound has waited while as many
    other traces were read, and its missing parents are taken as lost (a nested prompt whose
    parent comes after all is then read as its own prompt, on a bound the report names)."""
    for record, _, parent_id, _, _, _ in by_id.values():
        if parent_id is None or parent_id in by_id or parent_id in replayed:
            continue
        parent = record._parent
        if parent is not None and not parent.is_remote:
            record._parent = SpanContext(
                parent.trace_id, parent.span_id, is_remote=True, trace_flags=parent.trace_flags
            )


_UNPLACED: Final = (0, -1)  # where a span without a context goes


def _events(
    spans: Sequence[_Buffered], by_id: Mapping[int, _Buffered]
) -> list[tuple[int, int, int, int, ReadableSpan]]:
    """Start and end events of one trace, in the order a live process would have seen them.

    ``spans`` are the trace's spans in the order read, ``by_id`` the same by span ID. Each event
    is ``(time, is_end, tie-break, index in spans, span)``; no two agree on the first four, so a
    plain sort orders them (never comparing spans): by time, starts before ends, then parents
    start first and children end first, then in the order read. A span whose start cannot
    matter to the guard has its end event only: leaving an event out leaves the others in the
    same order, and most spans (tool and model calls) are of that kind.
    """
    placed: dict[int, tuple[int, int]] = {}  # span ID -> (effective start, depth)

    def parent_of(span: _Buffered) -> _Buffered | None:
        found = None if span[2] is None else by_id.get(span[2])
        return found if found is not None and found[1] is not None else None

    def place(span: _Buffered) -> tuple[int, int]:
        chain: list[_Buffered] = []
        current: _Buffered | None = span
        base = _UNPLACED
        seen: set[int] = set()
        while current is not None and current[1] is not None:
            span_id = current[1]
            if span_id in placed:
                base = placed[span_id]
                break
            if span_id in seen:
                break  # a parent cycle: malformed, but never loop forever
            seen.add(span_id)
            chain.append(current)
            current = parent_of(current)
        start, depth = base
        for item in reversed(chain):
            # A child cannot start before its parent; clock skew between hosts can say it did.
            start = max(start, item[3])
            depth += 1
            if item[1] is not None:
                placed[item[1]] = (start, depth)
        return start, depth

    events: list[tuple[int, int, int, int, ReadableSpan]] = []
    append = events.append
    for index, span in enumerate(spans):
        record, span_id, parent_id, start, end, starts = span
        # The common cases of place() without its walk: the span is placed already, or its
        # parent is (spans are read children first, so siblings find their parent placed).
        if span_id is None:
            start, depth = _UNPLACED
        else:
            here = placed.get(span_id)
            if here is None:
                above = None if parent_id is None else placed.get(parent_id)
                if above is not None:
                    here = (above[0] if above[0] > start else start, above[1] + 1)
                    placed[span_id] = here
                elif parent_of(span) is None:
                    here = placed[span_id] = (start if start > 0 else 0, 0)
                else:
                    here = place(span)
            start, depth = here
        if starts:
            append((start, 0, depth, index, record))
        append((end if end > start else start, 1, -depth, index, record))
    events.sort()
    return events
