"""What the guard emits (docs/contract.md section 5).

The only module that knows output metric and log names.

Every attribute value comes from a closed set, except the transition log's ``prompt_id``,
``candidate_ordinal`` and ``execution_error_type`` (already validated against a strict pattern by
the reducer). Tool names, arguments, results, raw errors and the failure key are never passed in.
Emission failures are swallowed and tallied: telemetry never changes a decision.

Records and counts leave the agent's thread: :class:`GuardTelemetry` queues what the processor
decided (a few tuples) and a worker thread builds the log records and counts them, so
``span.end()`` pays for a queue append instead of an SDK log record. The queue is bounded and
never blocks: what does not fit is dropped and counted as ``telemetry_error`` (the records of
one span's end are queued or dropped together, :meth:`GuardTelemetry.together`). ``flush()`` (the
processor's ``force_flush()`` and ``shutdown()``) delivers everything pending on the caller's
thread, and so does every collection of the guard's counters, so a metric reader never sees a
count behind its records.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal, NamedTuple, get_args

from opentelemetry import context as context_api
from opentelemetry import metrics, trace
from opentelemetry._logs import (
    Logger,
    LoggerProvider,
    LogRecord,
    SeverityNumber,
    get_logger_provider,
)
from opentelemetry.metrics import CallbackOptions, MeterProvider
from opentelemetry.metrics import Observation as MetricObservation
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_guard.reducer import (
    RESET_REASONS,
    DecisionKind,
    GuardState,
    Mode,
    Observation,
    Phase,
    ResetReason,
    effective_mode,
)
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
    "QueueItem",
    "Transition",
    "batch_count_bucket",
    "decision_value",
    "emitted_by_guard",
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
    "long_prompt_id",
    "missing_attribute",
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


# Builds a named tuple from a tuple of its fields without a Python-level call.
_new = tuple.__new__


class Decided(NamedTuple):
    """A transition as the processor hands it over, under its lock: a tuple of what it already
    has. The telemetry builds the :class:`Transition` (and its records) from it, on the worker.

    ``mode`` is the configured mode (never ``off`` here); ``observations`` are the batch's.
    """

    prompt_id: str
    mode: Mode
    before: GuardState
    after: GuardState
    decision: DecisionValue
    reset_reason: ResetReason | None
    observations: tuple[Observation, ...]
    span_context: SpanContext | None
    timestamp: int | None

    def transition(self) -> Transition:
        """The transition's record fields: the candidate after it (for a reset, the candidate
        reset), the effective mode, and the tool type of the candidate's failing calls."""
        before, after, value = self.before, self.after, self.decision
        candidate = before if value == "reset" else after
        key = after.key
        tool_type = None
        if value != "reset" and key is not None:
            tool_type = next(
                (
                    o.tool_type
                    for o in self.observations
                    if o.policy_tool_name == key.policy_tool_name
                    and o.execution_error_type == key.execution_error_type
                    and not o.provider_duplicate
                ),
                None,
            )
        # Every field in order, through tuple.__new__: the named tuple's keyword constructor is
        # a Python call, about a microsecond of each record.
        fields = (
            self.prompt_id,  # prompt_id
            effective_mode(self.mode, after.enforcement_disabled),  # mode
            before.phase,  # phase_before
            after.phase,  # phase_after
            value,  # decision
            candidate.failure_count,  # failure_count
            candidate.batch_count,  # batch_count
            candidate.candidate_ordinal,  # candidate_ordinal
            self.reset_reason,  # reset_reason
            tool_type,  # tool_type
            None if key is None else key.execution_error_type,  # execution_error_type
            self.span_context,  # span_context
            self.timestamp,  # timestamp
        )
        return _new(Transition, fields)


class _Counts:
    """Decision and diagnostic counts of every guard that reports through one meter provider.

    Reported through observable counters: on the wire they are the same monotonic sums a
    synchronous counter gives, but a transition costs a dictionary increment instead of an SDK
    measurement inside the agent's ``span.end()``. Keys come from closed sets, so the table stays
    small. Guards sharing a provider share the table, as they would share a counter.
    """

    __slots__ = ("decisions", "diagnostics", "lock", "observations", "sources")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decisions: dict[tuple[tuple[str, str], ...], int] = {}
        self.diagnostics: dict[str, int] = {}
        # (execution_status, tool_type) -> observations
        self.observations: dict[tuple[str, str], int] = {}
        # Telemetry whose pending counts are delivered before each collection.
        self.sources: weakref.WeakSet[GuardTelemetry] = weakref.WeakSet()

    def _deliver_pending(self) -> None:
        for source in list(self.sources):
            source.flush()

    def observe_decisions(self, options: CallbackOptions) -> list[MetricObservation]:
        self._deliver_pending()
        with self.lock:
            counts = list(self.decisions.items())
        return [MetricObservation(value, dict(key)) for key, value in counts]

    def observe_diagnostics(self, options: CallbackOptions) -> list[MetricObservation]:
        self._deliver_pending()
        with self.lock:
            counts = list(self.diagnostics.items())
        return [MetricObservation(value, {"diagnostic": name}) for name, value in counts]

    def observe_observations(self, options: CallbackOptions) -> list[MetricObservation]:
        self._deliver_pending()
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


# What the processor hands over: a transition with its batch's end time, or a diagnostic with its
# prompt ID, span context and the time it was seen; and a flush's mark, set once the worker has
# emitted everything queued before it.
QueueItem = (
    tuple[Literal["transition"], Transition, int | None]
    | tuple[Literal["decided"], Decided]
    | tuple[Literal["observations"], Sequence[Observation]]
    | tuple[Literal["diagnostic"], Diagnostic, str | None, SpanContext | None, int]
    | tuple[Literal["mark"], threading.Event]
)
"""What the queue holds: a record to build, observations to count, or a flush's mark."""

DEFAULT_MAX_PENDING: Final = 4096
"""Records the queue holds before it drops (and counts) new ones."""
_WAKE_AT: Final = 512  # a queue this long wakes the worker before its interval ends
_INTERVAL_SECONDS: Final = 0.5
_QUIET_ROUNDS: Final = 20  # intervals with nothing queued before the worker waits untimed


class GuardTelemetry:
    """Emits the decisions counter, transition and loop logs, and diagnostics.

    ``meter_provider``/``logger_provider`` default to the global providers. Nothing here raises:
    a failing provider is tallied in :attr:`errors`, reported to ``on_failure`` and as a
    ``telemetry_error`` diagnostic, and otherwise ignored.

    With ``background`` (the default), :meth:`transition` and :meth:`diagnostic` only queue and
    a daemon worker emits; with ``background=False`` they emit on the caller's thread (the replay,
    which has no agent thread to spare). Either way :meth:`flush` returns once everything handed
    over so far is emitted.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        *,
        background: bool = True,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.errors = 0
        self.dropped = 0
        self._background = background
        self._max_pending = max_pending
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._log: Logger | None = None
        self._pending: deque[QueueItem] = deque()
        self._dropped_unreported = 0
        # Held while records are emitted, so that records leave in the order they were queued.
        self._emitting = threading.Lock()
        # The thread emitting now: a log pipeline that collects the guard's metrics while it
        # exports re-enters flush() through the counters' callback, on that thread.
        self._emitter: int | None = None
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        # Set by a worker that found nothing queued for a while and now waits without a
        # timeout: the next hand-over wakes it (one Event.set, then the flag is down again).
        self._idle = False
        self._closed = False
        try:
            self._counts = _counts_for(meter_provider or metrics.get_meter_provider())
        except Exception:
            self._failed("meter")
        self._counts.sources.add(self)
        try:
            self._log = (logger_provider or get_logger_provider()).get_logger(
                SCOPE_NAME, __version__
            )
        except Exception:
            self._failed("logger")
        _LIVE.add(self)

    # -- handing over (the agent's thread) ---------------------------------------------------

    def transition(self, transition: Transition, timestamp: int | None = None) -> None:
        """Count one transition and emit its log record (and the loop event for ``stopped``).

        ``timestamp`` (nanoseconds since the epoch) is the batch's own time, normally its
        span's end; the record carries it however late the worker emits it.
        """
        self._put(("transition", transition, timestamp))

    def decided(self, decided: Decided) -> None:
        """:meth:`transition` for a transition the processor handed over as a :class:`Decided`:
        the worker builds it."""
        self._put(("decided", decided))

    def diagnostic(
        self,
        diagnostic: Diagnostic,
        prompt_id: str | None = None,
        span_context: SpanContext | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Count one diagnostic and emit its log record.

        ``timestamp`` is when it happened (ns since the epoch); now when omitted.
        """
        self._put(
            (
                "diagnostic",
                diagnostic,
                prompt_id,
                span_context,
                time.time_ns() if timestamp is None else timestamp,
            )
        )

    @staticmethod
    def diagnostic_item(
        diagnostic: Diagnostic, prompt_id: str | None, span_context: SpanContext | None
    ) -> QueueItem:
        """What :meth:`diagnostic` queues, happening now, for :meth:`together`."""
        return ("diagnostic", diagnostic, prompt_id, span_context, time.time_ns())

    def _put(self, item: QueueItem) -> None:
        if not self._background or self._closed:
            self._emit_now(item)
            return
        pending = self._pending
        if len(pending) >= self._max_pending:
            self.dropped += 1  # read and reset by the worker under no lock: a count may be late
            self._dropped_unreported += 1
            return
        pending.append(item)
        if self._worker is None:
            self._start_worker()
        elif len(pending) == _WAKE_AT or self._idle:
            self._idle = False
            self._wake.set()

    def together(self, items: Sequence[QueueItem]) -> None:
        """Queue the records of one span's end together: all of them while the queue is not
        full, even past its bound, else none (each dropped and counted, observations counted
        here instead, as :meth:`observations` does).

        One span's end can decide many batches at once (an inferred prompt's, when it ends),
        more than the queue holds; item by item, the last of them would be dropped although the
        queue was nearly empty. Their number is bounded by the state the guard kept for them,
        so the queue passes its bound by at most one span's records."""
        if not self._background or self._closed:
            for item in items:
                self._emit_now(item)
            return
        pending = self._pending
        if len(pending) >= self._max_pending:
            for item in items:
                if item[0] == "observations":
                    self._count_observations(item[1])
                else:
                    self.dropped += 1
                    self._dropped_unreported += 1
            return
        pending.extend(items)
        if self._worker is None:
            self._start_worker()
        elif len(pending) >= _WAKE_AT or self._idle:
            self._idle = False
            self._wake.set()

    def _start_worker(self) -> None:
        with self._lock:
            if self._worker is not None or self._closed:
                return
            wake = self._wake
            worker = threading.Thread(
                target=_work,
                args=(weakref.ref(self), wake),
                name="otel_guard telemetry",
                daemon=True,
            )
            self._worker = worker
            # An idle worker waits with no timeout: the telemetry's collection wakes it to end.
            weakref.finalize(self, wake.set)
        try:
            worker.start()
        except RuntimeError:  # no new threads (the interpreter is exiting): emit here instead
            self._background = False
            self.flush()

    # -- emitting (the worker, or the caller of flush) ---------------------------------------

    def _emit_now(self, item: QueueItem) -> None:
        me = threading.get_ident()
        if self._emitter == me:  # handed over from inside an emission on this thread
            self._emit_item(item)
            return
        with self._emitting:
            self._emitter = me
            try:
                self._emit_item(item)
            finally:
                self._emitter = None

    def flush(self, timeout_millis: float | None = None) -> bool:
        """Emit what was handed over before this call, on the caller's thread.

        Records handed over meanwhile (agent threads keep ending spans) are left to the worker,
        so a flush under load ends. With ``timeout_millis`` it gives up at that deadline and
        returns False, like the SDK's processors; True when everything it was to emit is out.
        With a timeout and a running worker, the worker emits and the caller waits for it, so a
        log pipeline that hangs cannot hold the caller past its timeout.
        Called again from inside an emission on the same thread, it returns True at once: the
        outer call delivers the rest.
        """
        me = threading.get_ident()
        if self._emitter == me:
            return True
        worker = self._worker
        if timeout_millis is not None and worker is not None and worker.is_alive():
            # The worker emits, so an exporter that hangs holds it, not the caller: a mark
            # behind what is queued now says when all of that is out.
            mark = threading.Event()
            self._pending.append(("mark", mark))
            self._wake.set()
            return mark.wait(max(0.0, timeout_millis / 1000))
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        # The records queued now are the first ``due`` of the queue from now on: the worker only
        # takes from its front, and new ones join its back.
        due = len(self._pending)
        try:
            if deadline is None:
                self._emitting.acquire()
            elif not self._emitting.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            try:
                self._emitter = me
                pending = self._pending
                while due and pending:
                    if deadline is not None and time.monotonic() >= deadline:
                        return False
                    self._emit_item(pending.popleft())
                    due -= 1
                dropped, self._dropped_unreported = self._dropped_unreported, 0
                if dropped:
                    self._report_dropped(dropped)
            finally:
                self._emitter = None
                self._emitting.release()
        except Exception:  # an emission bug must not kill the worker or the caller
            self._failed("flush")
            return False
        return True

    def _drain(self) -> None:
        """Emit everything queued, however much (``close``, when no more is handed over)."""
        if self._emitter == threading.get_ident():
            return  # inside an emission on this thread: the outer call delivers the rest
        while self._pending and self.flush():
            pass

    def close(self) -> None:
        """Deliver everything pending and stop the worker; later hand-overs emit directly.

        Idempotent.
        """
        self._closed = True
        self._wake.set()
        self._drain()
        worker = self._worker
        me = threading.get_ident()
        # A worker that never started needs no wait, a thread cannot wait for itself, and while
        # this thread emits the worker waits for it.
        if worker is not None and worker.is_alive() and worker.ident != me and self._emitter != me:
            worker.join(timeout=5.0)

    def _after_fork_in_child(self) -> None:
        # The worker thread does not exist in the child, and the parent delivers what it had
        # queued: start afresh, with locks nobody can be holding.
        self._pending = deque()
        self._dropped_unreported = 0
        self._emitting = threading.Lock()
        self._emitter = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._worker = None
        self._idle = False

    def _emit_item(self, item: QueueItem) -> None:
        if item[0] == "observations":
            self._count_observations(item[1])
        elif item[0] == "decided":
            self._emit_transition(item[1].transition(), None)
        elif item[0] == "transition":
            self._emit_transition(item[1], item[2])
        elif item[0] == "mark":
            item[1].set()
        else:
            _, name, prompt_id, span_context, seen = item
            self._emit_diagnostic(name, prompt_id, span_context, seen)

    def _emit_transition(self, transition: Transition, timestamp: int | None) -> None:
        # Building the attributes each time is measured at about 0.9 us of a record's 13 us; a
        # cache of them per transition shape saved under 1% of the process's CPU, so there is none.
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
        observed = time.time_ns()
        if timestamp is None:
            timestamp = transition.timestamp if transition.timestamp is not None else observed
        ok = self._emit(
            TRANSITION_EVENT, log_attributes, transition.span_context, timestamp, observed
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
                    timestamp,
                    observed,
                    SeverityNumber.WARN,
                )
                and ok
            )
        if not ok:
            self._report_failure()

    def observations(self, observations: Sequence[Observation]) -> None:
        """Count the observations of one evaluated batch (the execution SLI's denominator),
        provider duplicates left out.

        Each is counted once by ``execution_status`` (a value outside the closed set, or none,
        is ``unknown``) and ``tool_type`` (``other`` unless ``native`` or ``mcp``). Queued like
        a record: the worker counts them, and a metric collection delivers what is queued
        first. A full queue never drops them: they are counted here instead."""
        if not self._background or self._closed or len(self._pending) >= self._max_pending:
            self._count_observations(observations)
            return
        self._put(("observations", observations))

    def _count_observations(self, observations: Sequence[Observation]) -> None:
        # A batch holds a few calls: each is counted straight into the table, with no tally of
        # its own first.
        table_counts = self._counts
        with table_counts.lock:
            table = table_counts.observations
            for observation in observations:
                if observation[6]:
                    # A provider duplicate is no execution: the reducer drops it (section 2,
                    # step 4), and the SLI's denominator counts executions.
                    continue
                status, tool_type = observation[4], observation[2]  # execution status, tool type
                key = (
                    status if status in _KNOWN_EXECUTION_STATUSES else "unknown",
                    tool_type if tool_type in _TOOL_TYPES else "other",
                )
                table[key] = table.get(key, 0) + 1

    def _emit_diagnostic(
        self,
        diagnostic: Diagnostic,
        prompt_id: str | None,
        span_context: SpanContext | None,
        seen: int,
    ) -> bool:
        counts = self._counts
        with counts.lock:
            counts.diagnostics[diagnostic] = counts.diagnostics.get(diagnostic, 0) + 1
        attributes: dict[str, str | int] = {"diagnostic": diagnostic}
        if prompt_id is not None:
            attributes["prompt_id"] = prompt_id
        ok = self._emit(
            DIAGNOSTIC_EVENT, attributes, span_context, seen, time.time_ns(), SeverityNumber.WARN
        )
        if not ok and diagnostic != "telemetry_error":
            self._report_failure()
        return ok

    def _report_failure(self) -> None:
        """A record could not be emitted: tell the processor and record ``telemetry_error``."""
        if self._on_failure is not None:
            try:
                self._on_failure()
            except Exception:
                self._failed("on_failure")
        self._emit_diagnostic("telemetry_error", None, None, time.time_ns())

    def _report_dropped(self, dropped: int) -> None:
        """Records dropped at a full queue: each counts as a ``telemetry_error``; one record
        says so."""
        counts = self._counts
        with counts.lock:
            counts.diagnostics["telemetry_error"] = (
                counts.diagnostics.get("telemetry_error", 0) + dropped - 1
            )
        for _ in range(dropped):
            if self._on_failure is not None:
                try:
                    self._on_failure()
                except Exception:
                    self._failed("on_failure")
        self._emit_diagnostic("telemetry_error", None, None, time.time_ns())

    def _emit(
        self,
        event_name: str,
        attributes: dict[str, str | int],
        span_context: SpanContext | None,
        timestamp: int,
        observed_timestamp: int,
        severity: SeverityNumber = SeverityNumber.INFO,
    ) -> bool:
        """Emit one log record with both of its times set.

        ``timestamp`` is when the event happened: for a transition, the end time of the batch
        span that settled it, so the record sorts beside its batch in any backend (and a
        replayed trace keeps its own times) even when emission comes later or from another
        thread. ``observed_timestamp`` is when the guard built the record.
        """
        if self._log is None:
            return True
        try:
            ctx = (
                trace.set_span_in_context(NonRecordingSpan(span_context))
                if span_context is not None
                else context_api.Context()
            )
            self._log.emit(
                _GuardRecord(
                    timestamp=timestamp,
                    observed_timestamp=observed_timestamp,
                    context=ctx,
                    severity_number=severity,
                    severity_text=severity.name,
                    attributes=attributes,
                    event_name=event_name,
                )
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


class _GuardRecord(LogRecord):
    """A log record this module emitted. Its class is the mark by which the guard's own records
    are told from a host's: a scope or event name can be chosen by any code, this class is only
    instantiated here. The SDK's processors keep the record object (the batch processor a
    shallow copy of it, of the same class); no encoder writes the class, so the mark never
    reaches the wire."""


def emitted_by_guard(record: LogRecord) -> bool:
    """True when the guard's telemetry emitted ``record`` (a transition, loop event or
    diagnostic): records named like the guard's by other code are not."""
    return type(record) is _GuardRecord


def _work(ref: weakref.ref[GuardTelemetry], wake: threading.Event) -> None:
    """The worker's loop. It holds its telemetry only weakly: a guard dropped without
    ``shutdown()`` is still collected, and its worker then ends.

    After :data:`_QUIET_ROUNDS` intervals in which nothing was queued it waits with no timeout
    until something is handed over (or the telemetry is closed or collected): an idle agent's
    process, or one holding many guards that no longer see spans, is not woken twice a second
    by each of them. The flag is raised before the queue's last look, and a hand-over appends
    before it reads the flag, so an item queued meanwhile is either seen here or wakes it."""
    quiet = 0
    idle = False
    while True:
        wake.wait(None if idle else _INTERVAL_SECONDS)
        telemetry = ref()
        if telemetry is None:
            return
        wake.clear()
        if telemetry._pending or telemetry._dropped_unreported:
            quiet = 0
            telemetry.flush()  # what was queued at its wake-up; newer records wait for the next
        else:
            quiet += 1
        if telemetry._closed:
            return
        idle = False
        if quiet >= _QUIET_ROUNDS:
            telemetry._idle = True
            if telemetry._pending or telemetry._closed:
                telemetry._idle = False
            else:
                idle = True
        del telemetry


_LIVE: weakref.WeakSet[GuardTelemetry] = weakref.WeakSet()


def _reset_after_fork() -> None:
    global _SHARED_COUNTS_LOCK
    # Locks another thread of the parent may have held at the fork are made anew: the shared
    # table's, each table's, then each telemetry's own.
    _SHARED_COUNTS_LOCK = threading.Lock()
    tables = {id(counts): counts for counts in list(_SHARED_COUNTS.values())}
    for telemetry in list(_LIVE):
        tables[id(telemetry._counts)] = telemetry._counts
    for counts in tables.values():
        counts.lock = threading.Lock()
    for telemetry in list(_LIVE):
        telemetry._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_after_fork)
