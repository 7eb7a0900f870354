"""Replaying recorded spans through the guard, and the report of what it decided.

:class:`GuardPipeline` is a :class:`~otel_guard.GuardSpanProcessor` wired to in-memory
telemetry providers and a :class:`GuardReport`; the demo and the replay both use it, so their
reports are computed the same way. :class:`Replayer` turns a stream of finished spans (in any
order) back into the start/end sequence the processor would have seen live:

* spans are buffered per trace; a trace is replayed once its root span has been read and a
  reorder window of further spans has passed (so lines written out of order still join their
  trace), or when the input ends; traces ready at the same time are replayed in the order they
  started; a span read twice while its trace is buffered (a retried export) is counted once;
* a replayed trace's starts and ends are merged in time order (a parent starts before its
  children, a child ends before its parent when both end at the same nanosecond);
* the replay acts as a host that reads the guard's action after every batch, so ``enforce``
  really issues stops.

Memory follows the open traces (bounded by ``max_open_traces``; beyond it the oldest is replayed
early) and the reorder window, not the input size.
"""

from __future__ import annotations

import re
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes.deployment_attributes import (
    DEPLOYMENT_ENVIRONMENT,
    DEPLOYMENT_ENVIRONMENT_NAME,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_VERSION

from otel_guard import attributes as attr
from otel_guard.genai_profile import Coverage
from otel_guard.processor import BatchEvaluation, GuardSpanProcessor, Profile
from otel_guard.reducer import RESET_REASONS, Mode, Observation
from otel_guard.sensitive import is_sensitive
from otel_guard.telemetry import (
    DECISION_VALUES,
    DIAGNOSTIC_EVENT,
    LOOP_EVENT,
    LOOP_TYPE,
    METRIC_ATTRIBUTE_VALUES,
    TRANSITION_EVENT,
)

__all__ = [
    "DEFAULT_MAX_OPEN_TRACES",
    "DEFAULT_REORDER_WINDOW",
    "GROUP_KEYS",
    "INVARIANTS",
    "GuardPipeline",
    "GuardReport",
    "Replayer",
    "TelemetryAudit",
]

DEFAULT_REORDER_WINDOW: Final = 10_000
"""Spans read after a trace's root before the trace is replayed."""

DEFAULT_MAX_OPEN_TRACES: Final = 100_000
"""Traces buffered at once; beyond it the oldest is replayed without waiting for its root."""

GROUP_KEYS: Final = (DEPLOYMENT_ENVIRONMENT_NAME, SERVICE_VERSION)
"""Resource attributes the report groups by: rollouts compare environments and versions."""

INVARIANTS: Final[Mapping[str, str]] = {
    "cancelled_counted": "cancelled calls counted as eligible failures",
    "ineligible_counted": "not_started, unknown or post-execution outcomes counted as failures",
    "incomplete_batch_decision": "decisions based on incomplete batches",
    "enforcement_after_unreliable_input": "enforcement after an unreliable input drain",
    "stop_without_warning": "would_stop/stopped without would_warn/warned (same prompt, candidate)",
    "sensitive_telemetry": "guard telemetry fields outside the closed sets (sensitive data)",
}
"""The design document's required invariants that a replay can check, by report key.

The remaining one (the existing total tool-call and duplicate-ID protections stay unchanged) is
a property of the agent, not of its traces.
"""

SAMPLE_LIMIT: Final = 100
"""Warned and stopped prompt IDs listed in the report, for manual review."""

_ADVANCING: Final = frozenset({"tracked", "would_warn", "warn", "would_stop", "stop"})
_WARNINGS: Final = frozenset({"would_warn", "warned"})
_STOPS: Final = frozenset({"would_stop", "stopped"})
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

Group = tuple[str | None, str | None]


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


@dataclass
class Tally:
    """Counts for one group of the report (or all of it)."""

    spans: int = 0
    prompts: int = 0
    batches: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    reset_reasons: Counter[str] = field(default_factory=Counter)
    prompts_warned: int = 0
    prompts_stopped: int = 0
    tool_calls_saved: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "spans": self.spans,
            "prompts": self.prompts,
            "batches": self.batches,
            "decisions": {value: self.decisions[value] for value in DECISION_VALUES},
            "reset_reasons": {reason: self.reset_reasons[reason] for reason in RESET_REASONS},
            "prompts_warned": self.prompts_warned,
            "prompts_stopped": self.prompts_stopped,
            "tool_calls_saved": self.tool_calls_saved,
        }


@dataclass
class _PromptAudit:
    group: Group
    trace_id: int
    warned_ordinals: set[int] = field(default_factory=set)
    unreliable: bool = False
    warned: bool = False
    stopped: dict[str, Any] | None = None


class GuardReport:
    """What the guard decided, batch by batch, and the invariants checked on the way.

    :meth:`observe` is a :class:`~otel_guard.GuardSpanProcessor` listener. Prompts are told apart
    by ID (unique per prompt, as ACP issues them) within a bounded table of recently active
    prompts (200,000): memory follows active prompts, not the input size.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.total = Tally()
        self.groups: dict[Group, Tally] = {}
        self.traces = 0
        self.duplicate_spans = 0
        self.violations: Counter[str] = Counter({name: 0 for name in INVARIANTS})
        self.diagnostics: dict[str, int] = {}
        self.warned_sample: list[dict[str, Any]] = []
        self.stopped_sample: list[dict[str, Any]] = []
        # Prompts by how the guard read them: batch spans (acp) or the GenAI conventions (genai).
        self.profiles: dict[Profile, int] = {"acp": 0, "genai": 0}
        self.genai_coverage = Coverage(0, 0, 0, 0)
        self._prompts: OrderedDict[str, _PromptAudit] = OrderedDict()
        self._resource_groups: dict[int, tuple[Resource, Group, Tally]] = {}

    # -- input -----------------------------------------------------------------------------

    def count_span(self, span: ReadableSpan) -> None:
        self.count_spans(span.resource, 1)

    def count_spans(self, resource: Resource, count: int) -> None:
        """Count ``count`` spans read with ``resource``."""
        self.total.spans += count
        self._resource_group(resource)[1].spans += count

    def _resource_group(self, resource: Resource) -> tuple[Group, Tally]:
        # Readers share one Resource object per distinct resource: look its group up once.
        cached = self._resource_groups.get(id(resource))
        if cached is None or cached[0] is not resource:
            if len(self._resource_groups) >= _MAX_RESOURCES:
                self._resource_groups.clear()
            group = group_of(resource)
            cached = self._resource_groups[id(resource)] = (resource, group, self._group(group))
        return cached[1], cached[2]

    def observe(self, evaluation: BatchEvaluation) -> None:
        """Record one evaluated batch (a processor listener)."""
        span_context = evaluation.span.context
        audit = self._prompts.get(evaluation.prompt_id)
        group, tally = self._resource_group(evaluation.span.resource)
        tallies = (self.total, tally)
        if audit is None:
            audit = _PromptAudit(group, span_context.trace_id if span_context else 0)
            self._prompts[evaluation.prompt_id] = audit
            if len(self._prompts) > _MAX_PROMPT_AUDITS:
                self._prompts.popitem(last=False)
            for tally in tallies:
                tally.prompts += 1
            self.profiles[evaluation.profile] += 1
        else:
            self._prompts.move_to_end(evaluation.prompt_id)
        calls = [o for o in evaluation.batch.observations if not o.provider_duplicate]
        value = evaluation.decision_value
        for tally in tallies:
            tally.batches += 1
            if value is not None:
                tally.decisions[value] += 1
            if value == "reset" and evaluation.decision.reason is not None:
                tally.reset_reasons[evaluation.decision.reason] += 1
        if audit.stopped is not None:
            # Calls made after the stop decision: what stopping would have saved.
            audit.stopped["tool_calls_after_stop"] += len(calls)
            for tally in tallies:
                tally.tool_calls_saved += len(calls)
        self._check(evaluation, audit, calls)
        ordinal = evaluation.decision.state.candidate_ordinal
        if value in _WARNINGS and not audit.warned:
            audit.warned = True
            for tally in tallies:
                tally.prompts_warned += 1
            self._sample(self.warned_sample, evaluation, audit, value)
        if value in _STOPS and audit.stopped is None:
            audit.stopped = self._sample(self.stopped_sample, evaluation, audit, value)
            audit.stopped["tool_calls_after_stop"] = 0
            for tally in tallies:
                tally.prompts_stopped += 1
        if value in _WARNINGS:
            audit.warned_ordinals.add(ordinal)

    def _check(
        self, evaluation: BatchEvaluation, audit: _PromptAudit, calls: Sequence[Observation]
    ) -> None:
        """The design document's invariants, re-derived from the batch, not from the reducer."""
        if not evaluation.input_reliable:
            audit.unreliable = True
        value = evaluation.decision_value
        stopping = value == "stopped" or (
            evaluation.action is not None and evaluation.action.kind == "stop"
        )
        if stopping and audit.unreliable:
            self.violations["enforcement_after_unreliable_input"] += 1
        if value in _STOPS and evaluation.decision.state.candidate_ordinal not in (
            audit.warned_ordinals
        ):
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
        admitted = (evaluation.span.attributes or {}).get(attr.BATCH_ADMITTED)
        call_ids = {o.call_id for o in calls}
        if (
            not evaluation.batch.complete
            or type(admitted) is not int
            or admitted != len(call_ids)
            or "" in call_ids
        ):
            self.violations["incomplete_batch_decision"] += 1

    def audit_log_record(self, record: ReadableLogRecord) -> None:
        """Check one guard log record against the closed output vocabulary."""
        log = record.log_record
        ok = log.event_name in _EVENTS and log.body is None
        attributes = log.attributes
        # The SDK's attribute store iterates in Python, a call per entry: read its dictionary.
        store = getattr(attributes, "_dict", None)
        for key, value in (store if type(store) is dict else attributes or {}).items():
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

    def unreadable(self) -> str | None:
        """Why spans were read but no prompt was, naming the missing attributes; else None."""
        if self.total.spans == 0 or self.total.prompts > 0 or self.mode == "off":
            return None  # in mode off the guard reads nothing by design
        seen = self.genai_coverage
        if seen.prompts and not seen.tool_calls:
            return (
                f"{seen.prompts} invoke_agent span(s) but no tool-call span below them: "
                f"missing {attr.OPERATION_NAME}={attr.EXECUTE_TOOL} "
                f"(or {attr.TOOL_NAME} with {attr.TOOL_CALL_ID})"
            )
        if seen.orphan_tool_calls:
            return (
                f"{seen.orphan_tool_calls} {attr.EXECUTE_TOOL} span(s) but none below a prompt: "
                f"missing an ancestor with {attr.OPERATION_NAME}={attr.INVOKE_AGENT}, "
                f"or a parent batch span with {attr.PROMPT_ID} and {attr.BATCH_ADMITTED}"
            )
        return (
            f"no span carries {attr.OPERATION_NAME}={attr.INVOKE_AGENT}/{attr.EXECUTE_TOOL}, "
            f"nor {attr.PROMPT_ID} with {attr.BATCH_ADMITTED}"
        )

    @property
    def invariant_violations(self) -> int:
        return sum(self.violations.values())

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON-ready object (SPEC section 7 fields, and more)."""
        document: dict[str, Any] = {
            "mode": self.mode,
            "traces": self.traces,
            "duplicate_spans": self.duplicate_spans,
        }
        document.update(self.total.to_json())
        document["profiles"] = dict(self.profiles)
        document["invariant_violations"] = self.invariant_violations
        document["invariants"] = {name: self.violations[name] for name in INVARIANTS}
        document["diagnostics"] = dict(sorted(self.diagnostics.items()))
        document["warned_prompts"] = self.warned_sample
        document["stopped_prompts"] = self.stopped_sample
        document["groups"] = [
            {GROUP_KEYS[0]: group[0], GROUP_KEYS[1]: group[1], **tally.to_json()}
            for group, tally in sorted(self.groups.items(), key=lambda g: _sort_key(g[0]))
        ]
        return document

    def render_text(self) -> str:
        """The report for people: per group, then totals, then the invariants."""
        lines: list[str] = []
        groups = sorted(self.groups.items(), key=lambda g: _sort_key(g[0]))
        for group, tally in groups:
            lines.append(
                f"{GROUP_KEYS[0]}={group[0] or '(unset)'}  {GROUP_KEYS[1]}={group[1] or '(unset)'}"
            )
            lines.extend(_tally_lines(tally))
            lines.append("")
        duplicates = (
            f", {self.duplicate_spans} duplicate spans ignored" if self.duplicate_spans else ""
        )
        lines.append(f"all ({self.traces} traces{duplicates}, mode {self.mode})")
        lines.extend(_tally_lines(self.total))
        lines.append(
            f"  prompts read from batch spans (acp) {self.profiles['acp']},"
            f" from GenAI conventions (genai) {self.profiles['genai']}"
        )
        for title, sample in (("warned", self.warned_sample), ("stopped", self.stopped_sample)):
            if sample:
                shown = ", ".join(_sample_text(entry) for entry in sample[:10])
                more = f" (+{len(sample) - 10} more)" if len(sample) > 10 else ""
                lines.append(f"  {title} prompts: {shown}{more}")
        if self.diagnostics:
            shown = "  ".join(f"{k} {v}" for k, v in sorted(self.diagnostics.items()))
            lines.append(f"  guard diagnostics: {shown}")
        lines.append("")
        lines.append("invariants (design document; each must be 0)")
        for name, description in INVARIANTS.items():
            lines.append(f"  {self.violations[name]:>6}  {description}")
        lines.append(f"invariant violations: {self.invariant_violations}")
        return "\n".join(lines)

    # -- helpers ---------------------------------------------------------------------------

    def _group(self, group: Group) -> Tally:
        tally = self.groups.get(group)
        if tally is None:
            tally = self.groups[group] = Tally()
        return tally

    def _sample(
        self,
        sample: list[dict[str, Any]],
        evaluation: BatchEvaluation,
        audit: _PromptAudit,
        value: str,
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "prompt_id": evaluation.prompt_id,
            "trace_id": f"{audit.trace_id:032x}",
            "decision": value,
            GROUP_KEYS[0]: audit.group[0],
            GROUP_KEYS[1]: audit.group[1],
        }
        if len(sample) < SAMPLE_LIMIT:
            sample.append(entry)
        return entry


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


def _sort_key(group: Group) -> tuple[str, str]:
    return (group[0] or "", group[1] or "")


def _counts_text(counts: Mapping[str, int], names: Sequence[str]) -> str:
    shown = [f"{name} {counts[name]}" for name in names if counts[name]]
    return "  ".join(shown) if shown else "none"


def _tally_lines(tally: Tally) -> list[str]:
    return [
        f"  spans {tally.spans}  prompts {tally.prompts}  batches {tally.batches}",
        f"  decisions: {_counts_text(tally.decisions, DECISION_VALUES)}",
        f"  reset reasons: {_counts_text(tally.reset_reasons, RESET_REASONS)}",
        f"  prompts warned {tally.prompts_warned}, stopped {tally.prompts_stopped}"
        " (would_warn and would_stop included)",
        f"  tool calls after the stop decision (saved by stopping, estimate): "
        f"{tally.tool_calls_saved}",
    ]


def _sample_text(entry: Mapping[str, Any]) -> str:
    after = entry.get("tool_calls_after_stop")
    return entry["prompt_id"] if after is None else f"{entry['prompt_id']} ({after} calls after)"


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


class GuardPipeline:
    """A guard with in-memory telemetry that is audited, and a report fed by its listener.

    ``listener`` also receives every evaluation. With ``host=True`` the pipeline takes the
    guard's action after every batch, like an agent host that applies reminders and stops (the
    replay's host); the demo takes its actions itself.
    """

    def __init__(
        self, mode: str, *, host: bool, listener: Callable[[BatchEvaluation], None] | None = None
    ) -> None:
        self.report = GuardReport(mode)
        self._listener = listener
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(
            SimpleLogRecordProcessor(TelemetryAudit(self.report))
        )
        self.now_ns = 0  # the replay's clock: span time, read by the guard in seconds
        self._host = host
        self.guard = GuardSpanProcessor(
            mode=mode,
            meter_provider=self.meter_provider,
            logger_provider=self.logger_provider,
            listener=self._observe,
            clock=self._clock if host else time.monotonic,
        )

    def _clock(self) -> float:
        return self.now_ns / 1e9

    def _observe(self, evaluation: BatchEvaluation) -> None:
        self.report.observe(evaluation)
        if self._listener is not None:
            self._listener(evaluation)
        if self._host:
            self.guard.take_action(evaluation.prompt_id)

    def close(self) -> GuardReport:
        """Finish the audit and shut the providers down; returns the report."""
        self.report.diagnostics = self.guard.diagnostics()
        self.report.genai_coverage = self.guard.genai_coverage()
        self.report.audit_metrics(self.metric_reader)
        self.guard.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()
        return self.report


# A buffered span: the span, its span ID (None without a context), its parent's span ID, and
# its start and end times, read once when it is buffered.
_Buffered = tuple[ReadableSpan, int | None, int | None, int, int]


class _Trace:
    __slots__ = ("spans", "start")

    def __init__(self, start: int) -> None:
        # Span ID -> span, in the order read: the replay's tie-break, and the parent look-up.
        self.spans: dict[int, _Buffered] = {}
        self.start = start  # the earliest start time read


class Replayer:
    """Feeds finished spans, in any order, through a guard in their live start/end order.

    ``add`` takes spans as they are read; ``finish`` replays what is still buffered and returns
    the report. The guard's clock follows the replayed span times, so its prompt TTL means the
    same as in the live process.
    """

    def __init__(
        self,
        mode: Mode | str = "shadow",
        *,
        reorder_window: int = DEFAULT_REORDER_WINDOW,
        max_open_traces: int = DEFAULT_MAX_OPEN_TRACES,
    ) -> None:
        self.pipeline = GuardPipeline(mode, host=True)
        self.report = self.pipeline.report
        self._window = reorder_window
        self._max_open = max_open_traces
        self._traces: dict[int, _Trace] = {}
        self._finished: deque[tuple[int, int]] = deque()
        self._read = 0

    def add(self, spans: Iterable[ReadableSpan]) -> None:
        report = self.report
        traces = self._traces
        finished = self._finished
        window = self._window
        read = self._read
        # Spans are counted per run of one resource: a line's spans usually share it.
        resource: Resource | None = None
        run = 0
        try:
            for span in spans:
                # The fields every ReadableSpan sets, read directly: each property is a call.
                if span._resource is not resource:
                    if resource is not None:
                        report.count_spans(resource, run)
                    resource, run = span._resource, 0
                run += 1
                read += 1
                context = span._context
                if context is None:
                    trace_id, span_id = 0, None
                else:
                    trace_id, span_id = context[0], context[1]
                start = span._start_time or 0
                trace = traces.get(trace_id)
                if trace is None:
                    if len(traces) >= self._max_open:
                        self._replay(next(iter(traces)))
                    trace = traces[trace_id] = _Trace(start)
                buffered = trace.spans
                key = span_id or 0
                if key in buffered:
                    # Export is at-least-once: a retried request repeats spans already read.
                    report.duplicate_spans += 1
                    continue
                if start < trace.start:
                    trace.start = start
                parent = span._parent
                buffered[key] = (
                    span,
                    span_id,
                    None if parent is None else parent[1],
                    start,
                    span._end_time or 0,
                )
                if parent is None:
                    finished.append((trace_id, read + window))
        finally:
            self._read = read
            if resource is not None:
                report.count_spans(resource, run)
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
        """Replay every buffered trace and close the pipeline; returns the report."""
        self._replay_in_start_order(list(self._traces))
        self._finished.clear()
        return self.pipeline.close()

    def _replay_in_start_order(self, trace_ids: Sequence[int]) -> None:
        # Traces ready together go in the order they started: a prompt whose batches are
        # separate traces then still sees its batches in order.
        traces = self._traces
        started = {trace_id: traces[trace_id].start for trace_id in trace_ids if trace_id in traces}
        for trace_id in sorted(started, key=started.__getitem__):
            self._replay(trace_id)

    def _replay(self, trace_id: int) -> None:
        trace = self._traces.pop(trace_id, None)
        if trace is None:
            return  # already replayed (a second root, or the open-trace bound)
        self.report.traces += 1
        pipeline = self.pipeline
        # on_start reads only what a ReadableSpan has: context, parent and attributes.
        on_start = cast(Callable[[ReadableSpan], None], pipeline.guard.on_start)
        on_end = pipeline.guard.on_end
        for time_ns, is_end, _, _, span in _events(list(trace.spans.values()), trace.spans):
            pipeline.now_ns = time_ns
            if is_end:
                on_end(span)
            else:
                on_start(span)


_UNPLACED: Final = (0, -1)  # where a span without a context goes


def _events(
    spans: Sequence[_Buffered], by_id: Mapping[int, _Buffered]
) -> list[tuple[int, int, int, int, ReadableSpan]]:
    """Start and end events of one trace, in the order a live process would have seen them.

    ``spans`` are the trace's spans in the order read, ``by_id`` the same by span ID. Each event
    is ``(time, is_end, tie-break, index in spans, span)``; no two agree on the first four, so a
    plain sort orders them (never comparing spans): by time, starts before ends, then parents
    start first and children end first, then in the order read.
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
        record, span_id, parent_id, start, end = span
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
        append((start, 0, depth, index, record))
        append((end if end > start else start, 1, -depth, index, record))
    events.sort()
    return events
