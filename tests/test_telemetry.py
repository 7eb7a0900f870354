"""GuardTelemetry on its own: instrument identity, log severities, and failing providers counted
rather than raised (docs/contract.md section 5)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from opentelemetry._logs import NoOpLogger, NoOpLoggerProvider, SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanContext

from otel_guard.guard.telemetry import (
    DECISIONS_METRIC,
    DIAGNOSTIC_EVENT,
    DIAGNOSTICS_METRIC,
    LOOP_EVENT,
    OBSERVATIONS_METRIC,
    SCOPE_NAME,
    TRANSITION_EVENT,
    Decided,
    GuardTelemetry,
    Transition,
)
from otel_guard.reducer import Batch, GuardInput, GuardState, Observation, reduce
from otel_guard.version import __version__


def transition(decision: Any = "tracked", **fields: Any) -> Transition:
    values: dict[str, Any] = {
        "prompt_id": "p",
        "mode": "enforce",
        "phase_before": "idle",
        "phase_after": "tracking",
        "decision": decision,
        "failure_count": 4,
        "batch_count": 1,
        "candidate_ordinal": 1,
        "reset_reason": None,
        "tool_type": "native",
        "execution_error_type": "exit_code",
        "span_context": None,
    }
    values.update(fields)
    return Transition(**values)


class Pipeline:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.exporter))
        self.telemetry = GuardTelemetry(self.meter_provider, self.logger_provider, background=False)

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: (scope.scope, metric)
            for rm in data.resource_metrics
            for scope in rm.scope_metrics
            for metric in scope.metrics
        }

    def severities(self) -> list[tuple[str | None, SeverityNumber | None, str | None]]:
        return [
            (r.log_record.event_name, r.log_record.severity_number, r.log_record.severity_text)
            for r in self.exporter.get_finished_logs()
        ]


def test_instruments_are_named_described_and_scoped_to_the_package() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.transition(transition())
    pipeline.telemetry.diagnostic("late_span")
    found = pipeline.metrics()
    described = {
        name: (scope.name, scope.version, metric.unit, metric.description)
        for name, (scope, metric) in found.items()
    }
    assert described == {
        DECISIONS_METRIC: (
            SCOPE_NAME,
            __version__,
            "{decision}",
            "Repeated-tool-failure guard transitions.",
        ),
        DIAGNOSTICS_METRIC: (
            SCOPE_NAME,
            __version__,
            "{diagnostic}",
            "Repeated-tool-failure guard diagnostics.",
        ),
    }
    assert pipeline.telemetry.errors == 0


def test_logs_come_from_the_package_scope() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.diagnostic("late_span")
    (record,) = pipeline.exporter.get_finished_logs()
    scope = record.instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version) == (SCOPE_NAME, __version__)


def test_transitions_log_at_info_and_loops_and_diagnostics_at_warn() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.transition(transition("stopped", phase_after="latched"))
    pipeline.telemetry.diagnostic("evicted", "p")
    assert pipeline.severities() == [
        (TRANSITION_EVENT, SeverityNumber.INFO, "INFO"),
        (LOOP_EVENT, SeverityNumber.WARN, "WARN"),
        (DIAGNOSTIC_EVENT, SeverityNumber.WARN, "WARN"),
    ]


def test_reset_log_never_names_an_error_type_even_when_given_one() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.transition(transition("reset", reset_reason="success"))
    (record,) = pipeline.exporter.get_finished_logs()
    attributes = dict(record.log_record.attributes or {})
    assert "execution_error_type" not in attributes
    assert attributes["reset_reason"] == "success"


class _UnhashableMeterProvider(MeterProvider):
    """A provider that cannot key a weak dictionary: the guard keeps counts of its own."""

    __hash__ = None  # type: ignore[assignment]


def test_a_provider_that_cannot_be_shared_still_gets_counts() -> None:
    reader = InMemoryMetricReader()
    telemetry = GuardTelemetry(_UnhashableMeterProvider(metric_readers=[reader]), background=False)
    telemetry.transition(transition())
    assert telemetry.errors == 0
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        (metric.name, point.value)
        for rm in data.resource_metrics
        for scope in rm.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points  # type: ignore[attr-defined]
    ]
    assert points == [(DECISIONS_METRIC, 1)]


class _NoLoggerProvider(NoOpLoggerProvider):
    def get_logger(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no logger")


class _LoopFailingLogger(NoOpLogger):
    def emit(self, record: Any = None, **kwargs: Any) -> None:
        name = kwargs.get("event_name") if record is None else record.event_name
        if name == LOOP_EVENT:
            raise RuntimeError("loop sink down")


class _LoopFailingLoggerProvider(NoOpLoggerProvider):
    def get_logger(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _LoopFailingLogger(name)


def test_without_a_logger_transitions_are_counted_and_not_reported_as_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = InMemoryMetricReader()
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        telemetry = GuardTelemetry(
            MeterProvider(metric_readers=[reader]), _NoLoggerProvider(), background=False
        )
    assert telemetry.errors == 1
    telemetry.transition(transition())
    telemetry.diagnostic("late_span")
    assert telemetry.errors == 1
    assert [r.getMessage() for r in caplog.records] == [
        "otel_guard: telemetry emission failed (logger)"
    ]
    data = reader.get_metrics_data()
    assert data is not None
    diagnostics = [
        dict(point.attributes or {})
        for rm in data.resource_metrics
        for scope in rm.scope_metrics
        for metric in scope.metrics
        if metric.name == DIAGNOSTICS_METRIC
        for point in metric.data.data_points  # type: ignore[attr-defined]
    ]
    assert diagnostics == [{"diagnostic": "late_span"}]  # no telemetry_error


def test_a_failing_meter_provider_is_one_error_named_meter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class _NoMeterProvider(MeterProvider):
        def get_meter(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no meter")

    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        telemetry = GuardTelemetry(_NoMeterProvider(), NoOpLoggerProvider(), background=False)
        telemetry.transition(transition())
    assert telemetry.errors == 1
    (record,) = caplog.records
    assert record.getMessage() == "otel_guard: telemetry emission failed (meter)"
    assert record.levelno == logging.DEBUG
    assert not record.exc_info  # no traceback


def test_a_failing_loop_event_fails_its_transition_and_is_counted_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    telemetry = GuardTelemetry(MeterProvider(), _LoopFailingLoggerProvider(), background=False)
    stopped = transition("stopped", phase_after="latched")
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        telemetry.transition(transition())
        telemetry.transition(stopped)
        telemetry.transition(stopped)
    assert telemetry.errors == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"otel_guard: telemetry emission failed ({LOOP_EVENT})"
    ] * 2
    assert not any(r.exc_info for r in caplog.records)  # no traceback


def _points(pipeline: Pipeline, name: str) -> dict[tuple[tuple[str, Any], ...], int]:
    data = pipeline.reader.get_metrics_data()
    assert data is not None
    return {
        tuple(sorted((point.attributes or {}).items())): point.value  # type: ignore[attr-defined]
        for rm in data.resource_metrics
        for scope in rm.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points  # type: ignore[attr-defined]
    }


def _observed(execution: str | None, tool_type: str | None, count: int) -> list[Observation]:
    return [Observation(f"c{i}", "t", tool_type, "error", execution, None) for i in range(count)]


def test_observations_are_counted_by_closed_execution_status_and_tool_type() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.observations(
        _observed("error", "native", 2)
        + _observed("exploded", None, 1)
        + _observed(None, "mcp", 3)
        + _observed("success", "Native", 1)
    )
    pipeline.telemetry.observations(
        tuple(_observed("error", "native", 1) + _observed("cancelled", "mcp", 1))
    )
    assert _points(pipeline, OBSERVATIONS_METRIC) == {
        (("execution_status", "error"), ("tool_type", "native")): 3,
        (("execution_status", "unknown"), ("tool_type", "other")): 1,
        (("execution_status", "unknown"), ("tool_type", "mcp")): 3,
        (("execution_status", "success"), ("tool_type", "other")): 1,
        (("execution_status", "cancelled"), ("tool_type", "mcp")): 1,
    }
    (scope, metric) = pipeline.metrics()[OBSERVATIONS_METRIC]
    assert (scope.name, scope.version, metric.unit, metric.description) == (
        SCOPE_NAME,
        __version__,
        "{call}",
        "Tool calls observed in batches the repeated-tool-failure guard evaluated.",
    )


def test_a_diagnostic_carries_the_time_given_or_else_the_time_it_was_handed_over() -> None:
    pipeline = Pipeline()
    before = time.time_ns()
    pipeline.telemetry.diagnostic("late_span", "p")
    after = time.time_ns()
    pipeline.telemetry.diagnostic("late_span", "p", timestamp=1_234)
    first, second = (r.log_record.timestamp for r in pipeline.exporter.get_finished_logs())
    assert first is not None and before <= first <= after
    assert second == 1_234


class _LoopRefusing(LogRecordProcessor):
    """Accepts every record but the loop event, which it refuses by raising."""

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        if log_record.log_record.event_name == LOOP_EVENT:
            raise RuntimeError("loop sink down")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_failed_record_is_followed_by_a_telemetry_error_record_of_that_time() -> None:
    pipeline = Pipeline()
    pipeline.logger_provider.add_log_record_processor(_LoopRefusing())
    before = time.time_ns()
    pipeline.telemetry.transition(transition("stopped", phase_after="latched"), timestamp=7)
    after = time.time_ns()
    records = [r.log_record for r in pipeline.exporter.get_finished_logs()]
    assert [(r.event_name, (r.attributes or {}).get("diagnostic")) for r in records] == [
        (TRANSITION_EVENT, None),
        (LOOP_EVENT, None),
        (DIAGNOSTIC_EVENT, "telemetry_error"),
    ]
    assert [r.timestamp for r in records[:2]] == [7, 7]
    failure_time = records[2].timestamp
    assert failure_time is not None and before <= failure_time <= after
    assert pipeline.telemetry.errors == 1


def test_a_raising_failure_callback_is_one_more_error_named_on_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def on_failure() -> None:
        raise RuntimeError("callback broken")

    pipeline = Pipeline()
    pipeline.logger_provider.add_log_record_processor(_LoopRefusing())
    pipeline.telemetry = GuardTelemetry(
        pipeline.meter_provider, pipeline.logger_provider, background=False, on_failure=on_failure
    )
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        pipeline.telemetry.transition(transition("stopped", phase_after="latched"))
    assert [r.getMessage() for r in caplog.records] == [
        f"otel_guard: telemetry emission failed ({LOOP_EVENT})",
        "otel_guard: telemetry emission failed (on_failure)",
    ]
    assert pipeline.telemetry.errors == 2
    # The telemetry_error record is still emitted and counted.
    assert _points(pipeline, DIAGNOSTICS_METRIC) == {(("diagnostic", "telemetry_error"),): 1}


def test_a_transition_without_a_time_is_stamped_with_the_time_its_records_were_built() -> None:
    pipeline = Pipeline()
    before = time.time_ns()
    pipeline.telemetry.transition(transition("stopped", phase_after="latched"))
    after = time.time_ns()
    records = [r.log_record for r in pipeline.exporter.get_finished_logs()]
    assert [r.event_name for r in records] == [TRANSITION_EVENT, LOOP_EVENT]
    times = {(r.timestamp, r.observed_timestamp) for r in records}
    assert len(times) == 1  # both records, both times: the one moment they were built
    ((happened, observed),) = times
    assert happened is not None and before <= happened <= after
    assert observed == happened


def test_a_transition_time_is_the_argument_else_the_transitions_own() -> None:
    pipeline = Pipeline()
    pipeline.telemetry.transition(transition(timestamp=5))
    pipeline.telemetry.transition(transition(timestamp=5), timestamp=9)
    records = [r.log_record for r in pipeline.exporter.get_finished_logs()]
    assert [r.timestamp for r in records] == [5, 9]
    assert all(r.observed_timestamp not in (None, 5, 9) for r in records)


class _TransitionRefusing(LogRecordProcessor):
    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        if log_record.log_record.event_name == TRANSITION_EVENT:
            raise RuntimeError("transition sink down")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_failed_transition_record_is_reported_even_when_its_loop_event_is_emitted() -> None:
    failures: list[int] = []
    pipeline = Pipeline()
    pipeline.logger_provider.add_log_record_processor(_TransitionRefusing())
    pipeline.telemetry = GuardTelemetry(
        pipeline.meter_provider,
        pipeline.logger_provider,
        background=False,
        on_failure=lambda: failures.append(1),
    )
    pipeline.telemetry.transition(transition("stopped", phase_after="latched"))
    assert failures == [1]
    assert _points(pipeline, DIAGNOSTICS_METRIC) == {(("diagnostic", "telemetry_error"),): 1}


@pytest.mark.parametrize("max_pending", [0, -1])
def test_a_queue_that_holds_nothing_is_refused(max_pending: int) -> None:
    with pytest.raises(ValueError, match=r"^max_pending must be at least 1$"):
        GuardTelemetry(MeterProvider(), NoOpLoggerProvider(), max_pending=max_pending)


def test_an_emission_bug_is_one_error_named_flush_and_the_queue_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pipeline = Pipeline()
    telemetry = GuardTelemetry(pipeline.meter_provider, pipeline.logger_provider)
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        telemetry.transition(transition(failure_count=None))  # no bucket for it: a bug
        telemetry.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "otel_guard: telemetry emission failed (flush)"
    ]
    assert telemetry.errors == 1
    telemetry.diagnostic("late_span", "p")
    telemetry.flush()
    assert [r.log_record.event_name for r in pipeline.exporter.get_finished_logs()] == [
        DIAGNOSTIC_EVENT
    ]
    telemetry.close()


def test_a_decided_transition_carries_each_field_by_its_name() -> None:
    # transition() builds the named tuple from its fields in order: a field out of place would
    # show here under another name.
    calls = tuple(
        Observation(f"c{i}", "run_shell", "mcp", "error", "error", "exit_code", False)
        for i in range(4)
    )
    before = GuardState.initial()
    decision = reduce(before, GuardInput("enforce", Batch(True, calls), False, False, True))
    context = SpanContext(1, 2, False)
    decided = Decided("p", "enforce", before, decision.state, "tracked", None, calls, context, 9)
    made = decided.transition()
    assert type(made) is Transition
    assert made._asdict() == {
        "prompt_id": "p",
        "mode": "enforce",
        "phase_before": "idle",
        "phase_after": decision.state.phase,
        "decision": "tracked",
        "failure_count": decision.state.failure_count,
        "batch_count": decision.state.batch_count,
        "candidate_ordinal": decision.state.candidate_ordinal,
        "reset_reason": None,
        "tool_type": "mcp",
        "execution_error_type": "exit_code",
        "span_context": context,
        "timestamp": 9,
    }
    assert decision.state.phase == "tracking" and decision.state.failure_count == 4
