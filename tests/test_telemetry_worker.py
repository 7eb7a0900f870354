"""Guard records leave the agent's thread: a bounded queue, a worker, flush, fork safety."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import RESOURCE, Harness, metric_points
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_guard.guard import telemetry as telemetry_module
from otel_guard.guard.telemetry import (
    DECISIONS_METRIC,
    DIAGNOSTIC_EVENT,
    DIAGNOSTICS_METRIC,
    OBSERVATIONS_METRIC,
    TRANSITION_EVENT,
    GuardTelemetry,
)
from otel_guard.reducer import Observation


class ThreadRecorder(LogRecordProcessor):
    """Notes the thread that emits each record; ``gate`` (when set) holds emission until
    released."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.threads: list[threading.Thread] = []
        self.emitted = threading.Event()
        self.entered = threading.Event()
        self.gate = gate

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        self.threads.append(threading.current_thread())
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(timeout=30)
        self.emitted.set()

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_records_are_emitted_by_the_worker_not_the_agent_thread() -> None:
    h = Harness(mode="enforce")
    recorder = ThreadRecorder()
    h.logger_provider.add_log_record_processor(recorder)
    h.failing_batches("p", 2)
    # The decision and the action are synchronous, whatever the records do.
    assert h.guard.take_action("p") is not None
    assert recorder.emitted.wait(timeout=30)  # the worker wakes within its interval
    assert recorder.threads and threading.current_thread() not in recorder.threads
    assert {t.name for t in recorder.threads} == {"otel_guard telemetry"}


def test_force_flush_delivers_every_pending_record_and_count() -> None:
    h = Harness(mode="shadow")
    h.failing_batches("p", 3)
    h.guard.force_flush()
    records = list(h.log_exporter.get_finished_logs())
    assert [r.log_record.event_name for r in records] == [TRANSITION_EVENT] * 3
    assert h.decision_counts() == {"tracked": 1, "would_warn": 1, "would_stop": 1}


def test_metric_collection_sees_counts_not_yet_flushed() -> None:
    h = Harness(mode="shadow")
    h.failing_batches("p", 3)
    points = metric_points(h.metric_reader, DECISIONS_METRIC)  # no flush first
    assert sum(value for _, value in points) == 3


def test_shutdown_delivers_pending_records_and_later_ones_directly() -> None:
    h = Harness(mode="shadow")
    h.failing_batches("p", 3)
    h.guard.shutdown()
    assert len(h.log_exporter.get_finished_logs()) == 3
    h.guard._telemetry.diagnostic("late_span", "p")  # after shutdown: emitted at once
    assert len(h.log_exporter.get_finished_logs()) == 4


def test_records_carry_the_batch_end_time_and_an_observed_time() -> None:
    h = Harness(mode="shadow")
    ends: list[int] = []
    original_batch = h.batch

    def batch(*args: Any, **kwargs: Any) -> Any:
        late = original_batch(*args, **kwargs)
        ends.append(h.span_exporter.get_finished_spans()[-1].end_time or 0)
        return late

    h.batch = batch  # type: ignore[method-assign]
    h.failing_batches("p", 2)
    records = h.logs(TRANSITION_EVENT)
    assert [r.log_record.timestamp for r in records] == ends
    for record in records:
        observed = record.log_record.observed_timestamp
        assert observed is not None and observed >= (record.log_record.timestamp or 0)


def _providers() -> tuple[MeterProvider, InMemoryMetricReader, LoggerProvider]:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    logger_provider = LoggerProvider(resource=RESOURCE)
    return meter_provider, reader, logger_provider


def _diagnostic_counts(reader: InMemoryMetricReader) -> dict[str, int]:
    counts: dict[str, int] = {}
    for attributes, value in metric_points(reader, DIAGNOSTICS_METRIC):
        name = str(attributes["diagnostic"])
        counts[name] = counts.get(name, 0) + value
    return counts


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    meter_provider, reader, logger_provider = _providers()
    gate = threading.Event()
    recorder = ThreadRecorder(gate)
    logger_provider.add_log_record_processor(recorder)
    exporter = InMemoryLogRecordExporter()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    failures: list[int] = []
    telemetry = GuardTelemetry(
        meter_provider,
        logger_provider,
        max_pending=4,
        on_failure=lambda: failures.append(1),
    )
    telemetry.diagnostic("late_span", "first")
    flusher = threading.Thread(target=telemetry.flush)
    flusher.start()
    assert recorder.entered.wait(timeout=30)  # emission of "first" is now held at the gate
    for n in range(7):  # 4 fit, 3 do not; none of these calls may wait for the gate
        telemetry.diagnostic("late_span", f"p{n}")
    assert telemetry.dropped == 3
    gate.set()
    flusher.join(timeout=30)
    telemetry.flush()
    names = [
        (r.log_record.attributes or {}).get("diagnostic") for r in exporter.get_finished_logs()
    ]
    # A flush delivers what was queued when it began ("first"), then reports the drops seen
    # meanwhile; the four queued later go out with the next flush.
    assert names == ["late_span", "telemetry_error"] + ["late_span"] * 4
    assert _diagnostic_counts(reader) == {"late_span": 5, "telemetry_error": 3}
    assert len(failures) == 3
    telemetry.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="this platform has no fork")
def test_a_forked_child_starts_with_an_empty_queue_and_a_fresh_worker() -> None:
    h = Harness(mode="shadow")
    h.failing_batches("p", 3)  # records queued, maybe not yet emitted
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            telemetry = h.guard._telemetry
            h.log_exporter.clear()
            fresh = telemetry._worker is None and not telemetry._pending
            h.failing_batches("c", 3)
            h.guard.force_flush()
            decisions = [
                (r.log_record.attributes or {}).get("prompt_id")
                for r in h.log_exporter.get_finished_logs()
            ]
            code = 0 if fresh and decisions == ["c", "c", "c"] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent still delivers its own records, once.
    assert [(r.log_record.attributes or {}).get("prompt_id") for r in h.logs(TRANSITION_EVENT)] == [
        "p",
        "p",
        "p",
    ]


def test_a_failing_logger_is_counted_once_per_failed_record() -> None:
    meter_provider, reader, _ = _providers()

    class Raising(LoggerProvider):
        def get_logger(self, *args: Any, **kwargs: Any) -> Any:
            class Logger:
                def emit(self, *args: Any, **kwargs: Any) -> None:
                    raise RuntimeError("exporter down")

            return Logger()

    failures: list[int] = []
    telemetry = GuardTelemetry(meter_provider, Raising(), on_failure=lambda: failures.append(1))
    telemetry.diagnostic("evicted", "a")
    telemetry.diagnostic("evicted", "b")
    telemetry.flush()
    assert len(failures) == 2
    assert _diagnostic_counts(reader) == {"evicted": 2, "telemetry_error": 2}
    assert telemetry.errors >= 2
    telemetry.close()


def test_diagnostic_records_are_still_emitted_in_order() -> None:
    h = Harness(mode="shadow", max_prompts=1)
    h.failing_batches("a", 1)
    h.failing_batches("b", 1)
    h.failing_batches("c", 1)
    evicted = [(r.log_record.attributes or {}).get("prompt_id") for r in h.logs(DIAGNOSTIC_EVENT)]
    assert evicted == ["a", "b"]


def test_the_worker_of_a_guard_dropped_without_shutdown_ends() -> None:
    meter_provider, _, logger_provider = _providers()
    telemetry = GuardTelemetry(meter_provider, logger_provider)
    telemetry.diagnostic("late_span", "p")
    worker = telemetry._worker
    assert worker is not None and worker.is_alive()
    del telemetry
    gc.collect()
    worker.join(timeout=30)  # it wakes within its interval and finds its telemetry gone
    assert not worker.is_alive()


def test_without_a_worker_thread_records_are_emitted_on_the_callers_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    h = Harness(mode="shadow")
    h.failing_batches("p", 2)
    assert len(h.log_exporter.get_finished_logs()) == 2  # no flush needed: emitted in end()
    assert h.guard.diagnostics() == {}


@pytest.mark.parametrize("background", [True, False])
def test_a_log_pipeline_that_collects_the_guard_metrics_while_exporting_does_not_deadlock(
    background: bool,
) -> None:
    h = Harness(mode="shadow", background_telemetry=background)

    class Collecting(LogRecordProcessor):
        def __init__(self) -> None:
            self.collected = 0

        def on_emit(self, log_record: ReadWriteLogRecord) -> None:
            h.metric_reader.get_metrics_data()  # re-enters the guard's flush on this thread
            self.collected += 1

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    collecting = Collecting()
    h.logger_provider.add_log_record_processor(collecting)
    producer = threading.Thread(target=h.failing_batches, args=("p", 3), daemon=True)
    producer.start()
    producer.join(timeout=30)
    assert not producer.is_alive()
    flusher = threading.Thread(target=h.guard.force_flush, daemon=True)
    flusher.start()
    flusher.join(timeout=30)
    assert not flusher.is_alive()
    assert collecting.collected == 3
    assert h.decision_counts() == {"tracked": 1, "would_warn": 1, "would_stop": 1}


class Holding(LogRecordProcessor):
    """Holds the emission of a record whose prompt ID was given to :meth:`hold` until its gate
    opens; notes every prompt ID it sees and the thread that entered each held record."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.threads: dict[str, threading.Thread] = {}

    def hold(self, prompt_id: str) -> threading.Event:
        self.entered[prompt_id] = threading.Event()
        gate = self.gates[prompt_id] = threading.Event()
        return gate

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        prompt_id = str((log_record.log_record.attributes or {}).get("prompt_id"))
        if prompt_id in self.gates:
            self.threads[prompt_id] = threading.current_thread()
            self.entered[prompt_id].set()
            self.gates[prompt_id].wait(timeout=30)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _held_pipeline(
    *processors: LogRecordProcessor, **options: Any
) -> tuple[GuardTelemetry, Holding, InMemoryLogRecordExporter, InMemoryMetricReader]:
    meter_provider, reader, logger_provider = _providers()
    holding = Holding()
    logger_provider.add_log_record_processor(holding)
    exporter = InMemoryLogRecordExporter()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    for processor in processors:
        logger_provider.add_log_record_processor(processor)
    return GuardTelemetry(meter_provider, logger_provider, **options), holding, exporter, reader


def _emitted(exporter: InMemoryLogRecordExporter) -> list[tuple[Any, Any]]:
    return [
        (
            (r.log_record.attributes or {}).get("diagnostic"),
            (r.log_record.attributes or {}).get("prompt_id"),
        )
        for r in exporter.get_finished_logs()
    ]


def _drop_while_held(
    telemetry: GuardTelemetry, holding: Holding, held: str, handed_over: int
) -> None:
    """Hand over ``handed_over`` diagnostics while the record ``held`` is being emitted, then
    deliver everything."""
    gate = holding.hold(held)
    telemetry.diagnostic("late_span", held)
    flusher = threading.Thread(target=telemetry.flush)
    flusher.start()
    assert holding.entered[held].wait(timeout=30)
    for n in range(handed_over):
        telemetry.diagnostic("late_span", f"{held}-{n}")
    gate.set()
    flusher.join(timeout=30)
    telemetry.flush()


def test_the_telemetry_errors_of_successive_drops_add_up() -> None:
    failures: list[int] = []
    telemetry, holding, exporter, reader = _held_pipeline(
        max_pending=1, on_failure=lambda: failures.append(1)
    )
    before = time.time_ns()
    _drop_while_held(telemetry, holding, "first", 3)  # 1 fits, 2 dropped
    _drop_while_held(telemetry, holding, "second", 4)  # 1 fits, 3 dropped
    after = time.time_ns()
    assert telemetry.dropped == 5
    assert len(failures) == 5
    assert _diagnostic_counts(reader) == {"late_span": 4, "telemetry_error": 5}
    errors = [r.log_record for r in exporter.get_finished_logs()]
    errors = [r for r in errors if (r.attributes or {}).get("diagnostic") == "telemetry_error"]
    assert len(errors) == 2  # one record per delivery that found drops
    for record in errors:
        assert record.timestamp is not None and before <= record.timestamp <= after
    telemetry.close()


def test_a_raising_failure_callback_for_dropped_records_is_an_error_named_on_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def on_failure() -> None:
        raise RuntimeError("callback broken")

    telemetry, holding, _, reader = _held_pipeline(max_pending=1, on_failure=on_failure)
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.telemetry"):
        _drop_while_held(telemetry, holding, "first", 3)  # 2 dropped
    assert [r.getMessage() for r in caplog.records] == [
        "otel_guard: telemetry emission failed (on_failure)"
    ] * 2
    assert telemetry.errors == 2
    assert _diagnostic_counts(reader) == {"late_span": 2, "telemetry_error": 2}
    telemetry.close()


def test_a_record_handed_over_while_another_thread_emits_waits_its_turn() -> None:
    telemetry, holding, exporter, _ = _held_pipeline(background=False)
    gate = holding.hold("first")
    first = threading.Thread(target=telemetry.diagnostic, args=("late_span", "first"))
    first.start()
    assert holding.entered["first"].wait(timeout=30)
    second = threading.Thread(target=telemetry.diagnostic, args=("late_span", "second"))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()  # it waits for the record being emitted
    assert _emitted(exporter) == []
    gate.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert _emitted(exporter) == [("late_span", "first"), ("late_span", "second")]


def test_a_record_handed_over_from_inside_an_emission_on_the_same_thread_is_emitted_at_once() -> (
    None
):
    meter_provider, _, logger_provider = _providers()
    exporter = InMemoryLogRecordExporter()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    telemetry = GuardTelemetry(meter_provider, logger_provider, background=False)

    class HandingOver(LogRecordProcessor):
        def on_emit(self, log_record: ReadWriteLogRecord) -> None:
            if (log_record.log_record.attributes or {}).get("prompt_id") == "outer":
                telemetry.diagnostic("evicted", "inner")

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    logger_provider.add_log_record_processor(HandingOver())
    telemetry.diagnostic("late_span", "outer")
    assert _emitted(exporter) == [("late_span", "outer"), ("evicted", "inner")]
    assert telemetry.errors == 0


@pytest.mark.parametrize("background", [True, False])
def test_closing_a_telemetry_that_never_started_a_worker_returns(background: bool) -> None:
    telemetry, _, exporter, _ = _held_pipeline(background=background)
    telemetry.close()
    telemetry.close()  # idempotent
    telemetry.diagnostic("late_span", "p")  # emitted at once
    assert _emitted(exporter) == [("late_span", "p")]
    assert telemetry._worker is None


class _OnEmit(LogRecordProcessor):
    """Calls ``action`` with each record it receives."""

    def __init__(self, action: Any) -> None:
        self.action = action

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        self.action(log_record)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_close_stops_the_worker_before_it_returns() -> None:
    telemetry, _, exporter, _ = _held_pipeline(_OnEmit(lambda _: time.sleep(0.05)))
    telemetry.diagnostic("late_span", "p")
    worker = telemetry._worker
    assert worker is not None
    telemetry.close()  # the worker, woken, finds the record being emitted here, then ends
    assert not worker.is_alive()
    assert _emitted(exporter) == [("late_span", "p")]


def test_close_called_on_the_worker_thread_does_not_wait_for_itself() -> None:
    closing = _OnEmit(lambda _: telemetry.close())
    telemetry, _, exporter, _ = _held_pipeline(closing)
    telemetry.diagnostic("late_span", "p")
    worker = telemetry._worker
    assert worker is not None
    worker.join(timeout=30)  # it emits within its interval, is closed from inside, and ends
    assert not worker.is_alive()
    assert _emitted(exporter) == [("late_span", "p")]
    assert telemetry.errors == 0


def test_after_a_fork_the_child_starts_with_no_queue_no_worker_and_no_held_lock() -> None:
    failures: list[int] = []
    telemetry, holding, exporter, _ = _held_pipeline(
        max_pending=2, on_failure=lambda: failures.append(1)
    )
    parent_gate = holding.hold("parent")
    telemetry.diagnostic("late_span", "parent")
    assert holding.entered["parent"].wait(timeout=30)
    parent_worker = telemetry._worker
    assert holding.threads["parent"] is parent_worker  # the worker holds the emission lock
    for n in range(3):  # 2 queued, 1 dropped
        telemetry.diagnostic("late_span", f"parent-{n}")
    try:
        # What the fork hook runs in a child. There, the parent's queue and drops are the
        # parent's to deliver, and its worker, holding the lock, does not exist.
        gc.collect()
        telemetry_module._reset_after_fork()
        child_gate = holding.hold("child")
        telemetry.diagnostic("late_span", "child")
        # A worker of its own delivers, though the parent's still holds the parent's lock.
        assert holding.entered["child"].wait(timeout=10)
        assert holding.threads["child"] is telemetry._worker is not parent_worker
        for n in range(3):  # 2 queued, 1 dropped
            telemetry.diagnostic("late_span", f"child-{n}")
        child_gate.set()
        telemetry.flush()
        # The worker's flush delivers what was queued when it began, then reports the drop.
        assert _emitted(exporter) == [
            ("late_span", "child"),
            ("telemetry_error", None),
            ("late_span", "child-0"),
            ("late_span", "child-1"),
        ]
        assert len(failures) == 1  # the child's one drop, not the parent's
        assert telemetry.errors == 0
    finally:
        parent_gate.set()
        telemetry.close()


def test_close_called_inside_an_emission_on_another_thread_does_not_wait_for_the_worker() -> None:
    closed_in: list[tuple[threading.Thread, float]] = []

    def close(_: object) -> None:
        started = time.monotonic()
        telemetry.close()
        closed_in.append((threading.current_thread(), time.monotonic() - started))

    telemetry, _, exporter, _ = _held_pipeline(_OnEmit(close))
    telemetry.diagnostic("late_span", "first")  # starts the worker
    worker = telemetry._worker
    assert worker is not None
    telemetry.flush()  # emits here, and closes from inside that emission
    ((thread, seconds),) = closed_in
    assert thread is threading.current_thread()
    assert seconds < 4.0  # the worker, waiting for this emission to end, is not awaited
    worker.join(timeout=30)  # once this emission is over, it ends
    assert not worker.is_alive()
    assert _emitted(exporter) == [("late_span", "first")]
    assert telemetry.errors == 0


def test_closing_after_the_worker_could_not_be_started_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    telemetry, _, exporter, _ = _held_pipeline()
    telemetry.diagnostic("late_span", "p")  # emitted here, the worker having failed to start
    telemetry.close()
    assert _emitted(exporter) == [("late_span", "p")]
    assert telemetry.errors == 0


def test_the_worker_is_woken_before_its_interval_only_when_512_records_are_pending() -> None:
    telemetry, holding, _, _ = _held_pipeline()
    gate = holding.hold("held")
    telemetry.diagnostic("late_span", "held")
    assert holding.entered["held"].wait(timeout=30)  # the worker, emitting it, is held
    assert holding.threads["held"] is telemetry._worker
    try:
        for n in range(511):
            telemetry.diagnostic("late_span", f"p{n}")
        assert not telemetry._wake.is_set()
        telemetry.diagnostic("late_span", "p511")
        assert telemetry._wake.is_set()
    finally:
        gate.set()
        telemetry.close()


def test_the_worker_is_a_daemon_so_a_process_that_never_shuts_the_telemetry_down_exits() -> None:
    meter_provider, _, logger_provider = _providers()
    telemetry = GuardTelemetry(meter_provider, logger_provider)
    telemetry.diagnostic("late_span", "p")
    assert telemetry._worker is not None and telemetry._worker.daemon
    telemetry.close()
    script = (
        "from opentelemetry.sdk._logs import LoggerProvider\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from otel_guard.guard.telemetry import GuardTelemetry\n"
        "telemetry = GuardTelemetry(MeterProvider(), LoggerProvider())\n"
        "telemetry.diagnostic('late_span', 'p')\n"
        "assert telemetry._worker is not None and telemetry._worker.is_alive()\n"
    )
    # The child imports the package this test imported, wherever that is.
    root = str(Path(telemetry_module.__file__).resolve().parent.parent.parent)
    environment = {**os.environ, "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30, env=environment)


def _emitting_held(
    telemetry: GuardTelemetry, holding: Holding
) -> tuple[threading.Event, threading.Thread]:
    """A flush on another thread, held inside the emission of a record ``held`` (the queue is
    empty behind it); set the gate and join the thread to let it finish."""
    gate = holding.hold("held")
    telemetry.diagnostic("late_span", "held")
    flusher = threading.Thread(target=telemetry.flush)
    flusher.start()
    assert holding.entered["held"].wait(timeout=30)
    return gate, flusher


def _observation_total(reader: InMemoryMetricReader) -> int:
    return sum(value for _, value in metric_points(reader, OBSERVATIONS_METRIC))


def test_observations_are_never_dropped_by_a_full_queue() -> None:
    # The SLI's denominator must not lose calls: past the queue's bound they are counted on the
    # caller's thread, while records are dropped (and said to be).
    telemetry, holding, _, reader = _held_pipeline(max_pending=1)
    gate, flusher = _emitting_held(telemetry, holding)
    success = Observation("c", "run_shell", "native", "success", "success", None, False)
    for _ in range(50):
        telemetry.observations([success, success])
    telemetry.diagnostic("late_span", "dropped")
    gate.set()
    flusher.join(timeout=30)
    telemetry.flush()
    assert _observation_total(reader) == 100
    assert telemetry.dropped == 1  # the diagnostic, never an observation
    telemetry.close()


def test_records_handed_over_together_pass_the_bound_or_are_dropped_together() -> None:
    # One span's end hands over its records together: all of them while the queue is not full
    # (past its bound), none when it is; observations are counted either way.
    telemetry, holding, exporter, reader = _held_pipeline(max_pending=2)
    gate, flusher = _emitting_held(telemetry, holding)
    success = Observation("c", "run_shell", "native", "success", "success", None, False)
    burst = [telemetry.diagnostic_item("late_span", f"kept-{n}", None) for n in range(5)]
    telemetry.together([*burst, ("observations", [success])])  # the queue held nothing
    telemetry.together(
        [telemetry.diagnostic_item("late_span", "dropped", None), ("observations", [success])]
    )
    gate.set()
    flusher.join(timeout=30)
    telemetry.flush()
    prompts = [prompt for diagnostic, prompt in _emitted(exporter) if diagnostic == "late_span"]
    assert prompts == ["held", *(f"kept-{n}" for n in range(5))]
    assert telemetry.dropped == 1
    assert _observation_total(reader) == 2
    telemetry.close()


class _CountingEvent(threading.Event):
    """An event that counts the worker's waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def _until(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _idle_soon(
    monkeypatch: pytest.MonkeyPatch,
    providers: tuple[MeterProvider, InMemoryMetricReader, LoggerProvider],
) -> GuardTelemetry:
    """A telemetry whose worker polls every 10 ms and idles after two quiet rounds, with one
    record handed over (so its worker has started)."""
    monkeypatch.setattr(telemetry_module, "_INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr(telemetry_module, "_QUIET_ROUNDS", 2)
    telemetry = GuardTelemetry(providers[0], providers[2])
    telemetry.diagnostic("late_span", "p")
    return telemetry


def _until_idle(telemetry: GuardTelemetry) -> bool:
    return _until(lambda: telemetry._idle)


def test_an_idle_worker_is_not_woken_until_a_record_is_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry_module, "_INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr(telemetry_module, "_QUIET_ROUNDS", 3, raising=False)
    meter_provider, _, logger_provider = _providers()
    exporter = InMemoryLogRecordExporter()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    telemetry = GuardTelemetry(meter_provider, logger_provider)
    wake = _CountingEvent()
    telemetry._wake = wake  # before the worker starts, which takes it
    telemetry.diagnostic("late_span", "p")
    assert _until(lambda: len(exporter.get_finished_logs()) == 1)
    time.sleep(0.2)  # past three quiet intervals
    waits = wake.waits
    time.sleep(0.3)  # thirty intervals: a worker still polling would wait about thirty times
    assert wake.waits == waits
    # The next hand-over wakes it at once, and it polls again while records come.
    telemetry.diagnostic("late_span", "q")
    assert _until(lambda: len(exporter.get_finished_logs()) == 2, seconds=5.0)
    assert _until(lambda: wake.waits > waits + 1)
    telemetry.close()


def test_an_idle_worker_ends_when_its_guard_is_dropped_without_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    telemetry = _idle_soon(monkeypatch, _providers())
    worker = telemetry._worker
    assert worker is not None
    assert _until_idle(telemetry)
    del telemetry
    gc.collect()
    worker.join(timeout=30)  # it waits with no timeout: the collection itself wakes it
    assert not worker.is_alive()


def test_an_idle_worker_delivers_a_flush_with_a_timeout_and_ends_at_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    providers = _providers()
    recorder = ThreadRecorder()
    providers[2].add_log_record_processor(recorder)
    telemetry = _idle_soon(monkeypatch, providers)
    assert _until_idle(telemetry)
    worker = telemetry._worker
    telemetry._pending.append(("diagnostic", "late_span", "q", None, time.time_ns()))
    assert telemetry.flush(timeout_millis=5000)  # the mark wakes the idle worker, which emits
    assert recorder.threads[-1] is worker
    telemetry.close()
    assert worker is not None and not worker.is_alive()
