"""``force_flush(timeout_millis)`` keeps its timeout while agent threads keep producing records,
and delivers what was queued before it was called."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from harness import failing_loop
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import Tracer

from otel_guard import GuardSpanProcessor, install_guard
from otel_guard.guard.dispatch import guarded_tracer_provider
from otel_guard.guard.telemetry import TRANSITION_EVENT

THREADS = 4
TIMEOUT_MILLIS = 1000
# Generous: the promise is "about the timeout", not a tight timing on a loaded machine.
BOUND_SECONDS = TIMEOUT_MILLIS / 1000 + 9


class _Load:
    """Agent threads ending looping prompts until stopped."""

    def __init__(self, tracer: Tracer) -> None:
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(tracer, n), daemon=True)
            for n in range(THREADS)
        ]

    def _produce(self, tracer: Tracer, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            failing_loop(tracer, f"load-{n}-{i % 100}", batches=3, calls=4)

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _marker_decisions(records: Sequence[ReadableLogRecord]) -> list[str]:
    return [
        str((r.log_record.attributes or {}).get("decision"))
        for r in records
        if r.log_record.event_name == TRANSITION_EVENT
        and (r.log_record.attributes or {}).get("prompt_id") == "marker"
    ]


def test_processor_flush_under_load_returns_within_its_timeout_with_what_was_queued() -> None:
    out = InMemoryLogRecordExporter()
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(out))
    guard = GuardSpanProcessor(mode="shadow", meter_provider=MeterProvider(), logger_provider=logs)
    provider = guarded_tracer_provider(guard)
    tracer = provider.get_tracer("agent")
    with _Load(tracer):
        failing_loop(tracer, "loop-warm-up", batches=3, calls=4)
        failing_loop(tracer, "marker", batches=3, calls=4)
        started = time.monotonic()
        flushed = guard.force_flush(TIMEOUT_MILLIS)
        elapsed = time.monotonic() - started
        if flushed:
            delivered = _marker_decisions(out.get_finished_logs())
    assert elapsed < BOUND_SECONDS
    assert flushed
    assert delivered == ["tracked", "would_warn", "would_stop"]
    provider.shutdown()


class _Stuck(LogRecordExporter):
    """A log exporter whose export hangs until released (a collector that stopped reading)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        self.entered.set()
        self.release.wait()
        return LogRecordExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        self.release.set()


def test_processor_flush_with_a_hung_log_pipeline_returns_false_within_its_timeout() -> None:
    stuck = _Stuck()
    logs = LoggerProvider()
    logs.add_log_record_processor(SimpleLogRecordProcessor(stuck))  # emits block the emitter
    guard = GuardSpanProcessor(mode="shadow", meter_provider=MeterProvider(), logger_provider=logs)
    provider = guarded_tracer_provider(guard)
    tracer = provider.get_tracer("agent")
    try:
        with _Load(tracer):
            failing_loop(tracer, "marker", batches=3, calls=4)
            started = time.monotonic()
            result = list(_in_thread(guard.force_flush, TIMEOUT_MILLIS))
            elapsed = time.monotonic() - started
            stuck.release.set()  # before the load stops: its threads may wait on the emitter
        assert result == [False]
        assert elapsed < BOUND_SECONDS
    finally:
        stuck.release.set()
        provider.shutdown()


@pytest.fixture
def no_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")


def _in_thread(flush: object, timeout_millis: int) -> Iterator[object]:
    result: list[object] = []
    helper = threading.Thread(
        target=lambda: result.append(flush(timeout_millis)),  # type: ignore[operator]
        daemon=True,
    )
    helper.start()
    helper.join(BOUND_SECONDS)
    yield from result


@pytest.mark.usefixtures("no_exporters")
def test_installation_flush_with_a_hung_log_exporter_returns_false_within_its_timeout() -> None:
    otel = install_guard(mode="shadow", set_global=False)
    stuck = _Stuck()
    otel.logger_provider.add_log_record_processor(BatchLogRecordProcessor(stuck))
    tracer = otel.tracer_provider.get_tracer("agent")
    try:
        with _Load(tracer):
            failing_loop(tracer, "marker", batches=3, calls=4)
            otel.guard.force_flush()
            # The log pipeline's worker is stuck inside an export, holding its export lock.
            assert stuck.entered.wait(BOUND_SECONDS)
            started = time.monotonic()
            # On a helper thread, so that a flush that ignores its timeout fails, not hangs.
            result = list(_in_thread(otel.force_flush, TIMEOUT_MILLIS))
            elapsed = time.monotonic() - started
        assert result == [False]
        assert elapsed < BOUND_SECONDS
    finally:
        stuck.release.set()
        otel.shutdown()


@pytest.mark.usefixtures("no_exporters")
def test_installation_flush_under_load_delivers_the_records_queued_before_it() -> None:
    otel = install_guard(mode="shadow", set_global=False)
    out = InMemoryLogRecordExporter()
    otel.logger_provider.add_log_record_processor(BatchLogRecordProcessor(out))
    tracer = otel.tracer_provider.get_tracer("agent")
    try:
        with _Load(tracer):
            failing_loop(tracer, "marker", batches=3, calls=4)
            started = time.monotonic()
            result = list(_in_thread(otel.force_flush, 5 * TIMEOUT_MILLIS))
            elapsed = time.monotonic() - started
            delivered = _marker_decisions(out.get_finished_logs())
        assert elapsed < BOUND_SECONDS + 4
        assert result == [True]
        assert delivered == ["tracked", "would_warn", "would_stop"]
    finally:
        otel.shutdown()
