"""What the guard emits (docs/contract.md section 5).

The only module that knows output metric and log names.

Every attribute value comes from a closed set, except the transition log's ``prompt_id``,
``candidate_ordinal`` and ``execution_error_type`` (already validated against a strict pattern by
the reducer). Tool names, arguments, results, raw errors and the failure key are never passed in.
Emission failures are swallowed and tallied: telemetry never changes a decision.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Final, Literal, NamedTuple, get_args

from opentelemetry import context as context_api
from opentelemetry import metrics, trace
from opentelemetry._logs import Logger, LoggerProvider, SeverityNumber, get_logger_provider
from opentelemetry.metrics import CallbackOptions, MeterProvider
from opentelemetry.metrics import Observation as MetricObservation
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_guard.reducer import RESET_REASONS, DecisionKind, Phase, ResetReason
from otel_guard.version import __version__

__all__ = [
    "BATCH_COUNT_BUCKETS",
    "DECISIONS_METRIC",
    "DECISION_ATTRIBUTE_VALUES",
    "DECISION_VALUES",
    "DIAGNOSTICS",
    "DIAGNOSTICS_METRIC",
    "DIAGNOSTIC_EVENT",
    "EXECUTION_STATUSES",
    "FAILURE_COUNT_BUCKETS",
    "LOOP_EVENT",
    "LOOP_TYPE",
    "METRIC_ATTRIBUTE_VALUES",
    "OBSERVATIONS_METRIC",
    "OBSERVATION_ATTRIBUTE_VALUES",
    "OBSERVATION_TOOL_TYPES",
    "ROUTE",
    "SCOPE_NAME",
    "TRANSITION_EVENT",
    "DecisionValue",
    "Diagnostic",
    "GuardTelemetry",
    "Transition",
    "batch_count_bucket",
    "decision_value",
    "failure_count_bucket",
]

_logger = logging.getLogger(__name__)

SCOPE_NAME: Final = "otel_guard"
DECISIONS_METRIC: Final = "acp.repeated_tool_failure_guard.decisions"
DIAGNOSTICS_METRIC: Final = "acp.repeated_tool_failure_guard.diagnostics"
OBSERVATIONS_METRIC: Final = "acp.repeated_tool_failure_guard.observations"
TRANSITION_EVENT: Final = "acp.repeated_tool_failure_guard.transition"
DIAGNOSTIC_EVENT: Final = "acp.repeated_tool_failure_guard.diagnostic"
LOOP_EVENT: Final = "acp.loop_detected"
LOOP_TYPE: Final = "repeated_tool_execution_failure"
ROUTE: Final = "acp_foreground"

DecisionValue = Literal["reset", "tracked", "would_warn", "warned", "would_stop", "stopped"]
Diagnostic = Literal[
    "invalid_mode",
    "late_span",
    "duplicate_span",
    "batch_overflow",
    "evicted",
    "expired",
    "internal_error",
    "telemetry_error",
    "contract_violation",
    "prompt_collision",
]

DECISION_VALUES: Final[tuple[DecisionValue, ...]] = get_args(DecisionValue)
DIAGNOSTICS: Final[tuple[Diagnostic, ...]] = get_args(Diagnostic)
FAILURE_COUNT_BUCKETS: Final = ("0", "1-2", "3-4", "5-7", "8+")
BATCH_COUNT_BUCKETS: Final = ("0", "1", "2", "3+")
EXECUTION_STATUSES: Final = ("success", "error", "cancelled", "not_started", "unknown")
OBSERVATION_TOOL_TYPES: Final = ("native", "mcp", "other")

_DECISION_VALUE: Final[dict[DecisionKind, DecisionValue]] = {
    "reset": "reset",
    "tracked": "tracked",
    "would_warn": "would_warn",
    "warn": "warned",
    "would_stop": "would_stop",
    "stop": "stopped",
}

DECISION_ATTRIBUTE_VALUES: Final[Mapping[str, frozenset[str]]] = {
    "route": frozenset({ROUTE}),
    "mode": frozenset({"shadow", "warn", "enforce"}),
    "phase_before": frozenset({"idle", "tracking", "warned", "latched"}),
    "phase_after": frozenset({"idle", "tracking", "warned", "latched"}),
    "decision": frozenset(DECISION_VALUES),
    "failure_count_bucket": frozenset(FAILURE_COUNT_BUCKETS),
    "batch_count_bucket": frozenset(BATCH_COUNT_BUCKETS),
    "reset_reason": frozenset(RESET_REASONS),
    "terminal_status": frozenset({"error"}),
    "execution_status": frozenset({"error"}),
    "tool_type": frozenset({"native", "mcp"}),
}
"""The decisions counter's attribute keys, with their closed sets of values."""

OBSERVATION_ATTRIBUTE_VALUES: Final[Mapping[str, frozenset[str]]] = {
    "execution_status": frozenset(EXECUTION_STATUSES),
    "tool_type": frozenset(OBSERVATION_TOOL_TYPES),
}
"""The observations counter's attribute keys, with their closed sets of values."""

METRIC_ATTRIBUTE_VALUES: Final[Mapping[str, frozenset[str]]] = {
    **DECISION_ATTRIBUTE_VALUES,
    "execution_status": DECISION_ATTRIBUTE_VALUES["execution_status"]
    | OBSERVATION_ATTRIBUTE_VALUES["execution_status"],
    "tool_type": DECISION_ATTRIBUTE_VALUES["tool_type"] | OBSERVATION_ATTRIBUTE_VALUES["tool_type"],
    "diagnostic": frozenset(DIAGNOSTICS),
}
"""Every metric attribute key the guard can emit, over all its counters, with its closed set of
values (per counter: :data:`DECISION_ATTRIBUTE_VALUES`, :data:`OBSERVATION_ATTRIBUTE_VALUES`,
and ``diagnostic`` from :data:`DIAGNOSTICS`)."""

_TOOL_TYPES: Final = frozenset({"native", "mcp"})
_KNOWN_EXECUTION_STATUSES: Final = frozenset(EXECUTION_STATUSES)


def decision_value(kind: DecisionKind) -> DecisionValue | None:
    """The ``decision`` attribute value of a reducer kind; ``None`` for ``none``."""
    return _DECISION_VALUE.get(kind)


def failure_count_bucket(count: int) -> str:
    if count <= 0:
        return "0"
    if count <= 2:
        return "1-2"
    if count <= 4:
        return "3-4"
    if count <= 7:
        return "5-7"
    return "8+"


def batch_count_bucket(count: int) -> str:
    if count <= 0:
        return "0"
    if count <= 2:
        return str(count)
    return "3+"


class Transition(NamedTuple):
    """One guard transition, reduced to what may leave the process.

    ``failure_count``/``batch_count``/``candidate_ordinal`` describe the candidate after the
    transition, or for a reset the candidate just reset.
    """

    prompt_id: str
    mode: Literal["shadow", "warn", "enforce"]
    phase_before: Phase
    phase_after: Phase
    decision: DecisionValue
    failure_count: int
    batch_count: int
    candidate_ordinal: int
    reset_reason: ResetReason | None
    tool_type: str | None
    execution_error_type: str | None
    span_context: SpanContext | None
    # When the transition happened: the end time of its batch span (ns since the epoch).
    timestamp: int | None = None

    def metric_attributes(self) -> dict[str, str]:
        attributes = {
            "route": ROUTE,
            "mode": self.mode,
            "phase_before": self.phase_before,
            "phase_after": self.phase_after,
            "decision": self.decision,
            "failure_count_bucket": failure_count_bucket(self.failure_count),
            "batch_count_bucket": batch_count_bucket(self.batch_count),
        }
        if self.decision == "reset":
            if self.reset_reason is not None:
                attributes["reset_reason"] = self.reset_reason
        else:
            attributes["terminal_status"] = "error"
            attributes["execution_status"] = "error"
            if self.tool_type in _TOOL_TYPES:
                attributes["tool_type"] = self.tool_type
        return attributes


class _Counts:
    """Decision and diagnostic counts of every guard that reports through one meter provider.

    Reported through observable counters: on the wire they are the same monotonic sums a
    synchronous counter gives, but a transition costs a dictionary increment instead of an SDK
    measurement inside the agent's ``span.end()``. Keys come from closed sets, so the table stays
    small. Guards sharing a provider share the table, as they would share a counter.
    """

    __slots__ = ("decisions", "diagnostics", "lock", "observations")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decisions: dict[tuple[tuple[str, str], ...], int] = {}
        self.diagnostics: dict[str, int] = {}
        # (execution_status, tool_type) -> observations
        self.observations: dict[tuple[str, str], int] = {}

    def observe_decisions(self, options: CallbackOptions) -> list[MetricObservation]:
        with self.lock:
            counts = list(self.decisions.items())
        return [MetricObservation(value, dict(key)) for key, value in counts]

    def observe_diagnostics(self, options: CallbackOptions) -> list[MetricObservation]:
        with self.lock:
            counts = list(self.diagnostics.items())
        return [MetricObservation(value, {"diagnostic": name}) for name, value in counts]

    def observe_observations(self, options: CallbackOptions) -> list[MetricObservation]:
        with self.lock:
            counts = list(self.observations.items())
        return [
            MetricObservation(value, {"execution_status": status, "tool_type": tool_type})
            for (status, tool_type), value in counts
        ]


_SHARED_COUNTS: weakref.WeakKeyDictionary[MeterProvider, _Counts] = weakref.WeakKeyDictionary()
_SHARED_COUNTS_LOCK = threading.Lock()


def _register(counts: _Counts, meter_provider: MeterProvider) -> None:
    meter = meter_provider.get_meter(SCOPE_NAME, __version__)
    meter.create_observable_counter(
        DECISIONS_METRIC,
        callbacks=[counts.observe_decisions],
        unit="{decision}",
        description="Repeated-tool-failure guard transitions.",
    )
    meter.create_observable_counter(
        DIAGNOSTICS_METRIC,
        callbacks=[counts.observe_diagnostics],
        unit="{diagnostic}",
        description="Repeated-tool-failure guard diagnostics.",
    )
    meter.create_observable_counter(
        OBSERVATIONS_METRIC,
        callbacks=[counts.observe_observations],
        unit="{call}",
        description="Tool calls observed in batches the repeated-tool-failure guard evaluated.",
    )


def _counts_for(meter_provider: MeterProvider) -> _Counts:
    """The provider's shared counts, registering its instruments the first time."""
    with _SHARED_COUNTS_LOCK:
        try:
            counts = _SHARED_COUNTS.get(meter_provider)
        except TypeError:  # a provider that cannot be weakly referenced: counts of its own
            counts = None
            shareable = False
        else:
            shareable = True
        if counts is None:
            counts = _Counts()
            _register(counts, meter_provider)
            if shareable:
                _SHARED_COUNTS[meter_provider] = counts
        return counts


class GuardTelemetry:
    """Emits the decisions counter, transition and loop logs, and diagnostics.

    ``meter_provider``/``logger_provider`` default to the global providers. Nothing here raises:
    a failing provider is tallied in :attr:`errors` and otherwise ignored.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
    ) -> None:
        self.errors = 0
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._log: Logger | None = None
        try:
            self._counts = _counts_for(meter_provider or metrics.get_meter_provider())
        except Exception:
            self._failed("meter")
        try:
            self._log = (logger_provider or get_logger_provider()).get_logger(
                SCOPE_NAME, __version__
            )
        except Exception:
            self._failed("logger")

    def transition(self, transition: Transition) -> bool:
        """Count one transition and emit its log record (and the loop event for ``stopped``).

        Returns False if an emission failed.
        """
        attributes = transition.metric_attributes()
        key = tuple(attributes.items())
        counts = self._counts
        with counts.lock:
            counts.decisions[key] = counts.decisions.get(key, 0) + 1
        log_attributes: dict[str, str | int] = attributes  # type: ignore[assignment]
        log_attributes["prompt_id"] = transition.prompt_id
        log_attributes["candidate_ordinal"] = transition.candidate_ordinal
        if transition.decision != "reset" and transition.execution_error_type is not None:
            log_attributes["execution_error_type"] = transition.execution_error_type
        ok = self._emit(
            TRANSITION_EVENT,
            log_attributes,
            transition.span_context,
            timestamp=transition.timestamp,
        )
        if transition.decision == "stopped":
            loop_attributes: dict[str, str | int] = {
                "loop_type": LOOP_TYPE,
                "prompt_id": transition.prompt_id,
            }
            ok = (
                self._emit(
                    LOOP_EVENT,
                    loop_attributes,
                    transition.span_context,
                    SeverityNumber.WARN,
                    timestamp=transition.timestamp,
                )
                and ok
            )
        return ok

    def observations(self, counts: Mapping[tuple[str | None, str | None], int]) -> bool:
        """Count the observations of one evaluated batch (the execution SLI's denominator).

        ``counts`` maps each (execution status, tool type) pair as the spans carried them to
        its number of observations. Each is counted once by ``execution_status`` (a value
        outside the closed set, or none, is ``unknown``) and ``tool_type`` (``other`` unless
        ``native`` or ``mcp``). The caller tallies raw pairs, so the closed sets are applied
        here once per distinct pair rather than once per call.
        """
        table_counts = self._counts
        with table_counts.lock:
            table = table_counts.observations
            for (status, tool_type), value in counts.items():
                key = (
                    status if status in _KNOWN_EXECUTION_STATUSES else "unknown",
                    tool_type if tool_type in _TOOL_TYPES else "other",
                )
                table[key] = table.get(key, 0) + value
        return True

    def diagnostic(
        self,
        diagnostic: Diagnostic,
        prompt_id: str | None = None,
        span_context: SpanContext | None = None,
        timestamp: int | None = None,
    ) -> bool:
        """Count one diagnostic and emit its log record; False if the emission failed.

        ``timestamp`` is when it happened (ns since the epoch); now when omitted.
        """
        counts = self._counts
        with counts.lock:
            counts.diagnostics[diagnostic] = counts.diagnostics.get(diagnostic, 0) + 1
        attributes: dict[str, str | int] = {"diagnostic": diagnostic}
        if prompt_id is not None:
            attributes["prompt_id"] = prompt_id
        return self._emit(
            DIAGNOSTIC_EVENT, attributes, span_context, SeverityNumber.WARN, timestamp=timestamp
        )

    def _emit(
        self,
        event_name: str,
        attributes: dict[str, str | int],
        span_context: SpanContext | None,
        severity: SeverityNumber = SeverityNumber.INFO,
        *,
        timestamp: int | None = None,
    ) -> bool:
        """Emit one log record with both of its times set.

        ``timestamp`` is when the event happened: for a transition, the end time of the batch
        span that settled it, so the record sorts beside its batch in any backend (and a
        replayed trace keeps its own times) even when emission comes later or from another
        thread. ``observed_timestamp`` is when the guard emitted the record. Without a
        ``timestamp`` the two are the same moment: a backend that orders by ``timestamp``
        would otherwise place the record at 0, the Unix epoch.
        """
        if self._log is None:
            return True
        try:
            observed = time.time_ns()
            ctx = (
                trace.set_span_in_context(NonRecordingSpan(span_context))
                if span_context is not None
                else context_api.Context()
            )
            self._log.emit(
                timestamp=observed if timestamp is None else timestamp,
                observed_timestamp=observed,
                context=ctx,
                severity_number=severity,
                severity_text=severity.name,
                attributes=attributes,
                event_name=event_name,
            )
        except Exception:
            return self._failed(event_name)
        return True

    def _failed(self, what: str) -> bool:
        with self._lock:
            self.errors += 1
        # Only the failing component is named, never the data: this text may reach a log file.
        _logger.debug("otel_guard: telemetry emission failed (%s)", what, exc_info=False)
        return False
