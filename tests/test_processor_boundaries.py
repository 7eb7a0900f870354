"""GuardSpanProcessor at its edges: exact bounds, spans that are not the SDK's own objects,
prompts that outlive their state, and failures it must count rather than raise."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness
from opentelemetry._logs import NoOpLogger, NoOpLoggerProvider
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import set_span_in_context

from otel_guard import BatchEvaluation, GuardSpanProcessor
from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT

# -- construction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"max_prompts": 0}, "max_prompts must be at least 1"),
        ({"prompt_ttl_seconds": 0}, "prompt_ttl_seconds must be positive"),
        ({"prompt_ttl_seconds": -1.0}, "prompt_ttl_seconds must be positive"),
        ({"max_calls_per_batch": 0}, "max_calls_per_batch must be at least 1"),
        ({"max_call_bytes": 0}, "max_call_bytes must be at least 1"),
    ],
)
def test_invalid_bounds_are_rejected_with_a_message_naming_them(
    bounds: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        GuardSpanProcessor(mode="shadow", **bounds)
    assert str(error.value) == message


def test_smallest_valid_bounds_are_accepted() -> None:
    h = Harness(max_prompts=1, prompt_ttl_seconds=0.5, max_calls_per_batch=1, max_call_bytes=1)
    h.batch("p", [FAIL])
    assert h.guard.state("p") is not None


# -- bounded tables -------------------------------------------------------------------------------


def open_batch(h: Harness, prompt_id: str) -> None:
    h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": prompt_id})  # never ends


def test_open_spans_beyond_four_per_prompt_plus_one_batch_of_calls_are_evicted() -> None:
    # max_prompts=2, max_calls_per_batch=1: room for 4 * 2 + 1 = 9 open prompt or batch spans.
    h = Harness(max_prompts=2, max_calls_per_batch=1)
    for i in range(9):
        open_batch(h, f"p{i}")
    assert h.guard.diagnostics() == {}
    open_batch(h, "p9")
    assert h.guard.diagnostics() == {"evicted": 1}
    (record,) = h.logs()
    assert (record.log_record.attributes or {})["prompt_id"] == "p0"


def test_a_batch_span_ending_after_it_was_evicted_is_an_incomplete_batch() -> None:
    seen: list[BatchEvaluation] = []
    h = Harness(max_prompts=1, max_calls_per_batch=1, listener=seen.append)  # 5 open spans
    first = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "p0"})
    for i in range(5):
        open_batch(h, f"p{i + 1}")  # the first is evicted
    first.set_attributes({"acp.batch.admitted": 0, "acp.input.reliable": True})
    first.end()
    assert h.guard.diagnostics() == {"evicted": 1}
    (evaluation,) = seen
    assert evaluation.prompt_id == "p0" and evaluation.batch.complete is False
    assert evaluation.batch.observations == () and evaluation.decision.kind == "none"


@pytest.mark.parametrize("lost", ["evicted", "no prompt ID at start"])
def test_a_batch_the_guard_did_not_follow_resets_the_streak_it_may_have_ended(lost: str) -> None:
    # Pushed out of the span table, its calls are unknown: had it held a success of the
    # candidate's tool, skipping it would let the guard remind and stop a batch sooner than with
    # full knowledge (section 4: losing state never widens what the guard may do). So it is an
    # incomplete batch, and resets. Named after its start, it is read with its calls, and the
    # success resets the streak as a replay reads it.
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=4)  # 8 open spans
    h.batch("p", [FAIL] * 4)
    start = {"acp.prompt.id": "p"} if lost == "evicted" else {}
    unseen = h.tracer.start_span("tool_batch", attributes=start)
    h.tool_span(OK, set_span_in_context(unseen)).end()
    if lost == "evicted":
        for i in range(8):
            open_batch(h, f"x{i}")  # pushes the batch out of the span table
    unseen.set_attributes(
        {"acp.prompt.id": "p", "acp.batch.admitted": 1, "acp.input.reliable": True}
    )
    unseen.end()
    actions = []
    for _ in range(3):
        h.batch("p", [FAIL] * 4)
        action = h.guard.take_action("p")
        actions.append(None if action is None else action.kind)
    # Not [reminder, stop, None]. Evicted, its calls may have held an unknown outcome, which
    # disables enforcement: the guard reminds but never stops this prompt again.
    assert actions == [None, "reminder", None if lost == "evicted" else "stop"]
    assert [
        (attributes["decision"], attributes.get("reset_reason"))
        for attributes, _ in sorted(h.points(), key=lambda point: point[0]["decision"])
        if attributes["decision"] == "reset"
    ] == [("reset", "incomplete" if lost == "evicted" else "success")]


def test_prompt_spans_evict_the_oldest_open_batch_span_too() -> None:
    h = Harness(max_prompts=2, max_calls_per_batch=1)
    open_batch(h, "b")
    for _ in range(9):
        h.start_prompt("p")  # the same prompt ID again: tracked spans grow, prompts do not
    assert h.guard.diagnostics()["evicted"] == 1
    (record,) = [
        r for r in h.logs() if (r.log_record.attributes or {}).get("diagnostic") == "evicted"
    ]
    assert (record.log_record.attributes or {})["prompt_id"] == "b"


def test_restarting_a_prompt_at_capacity_evicts_no_other_prompt() -> None:
    h = Harness(max_prompts=2)
    h.start_prompt("a")
    h.start_prompt("b")
    h.batch("b", [FAIL] * 4)
    h.start_prompt("a")  # while the first is open: a collision, never an eviction
    assert "evicted" not in h.guard.diagnostics()
    state = h.guard.state("b")
    assert state is not None and state.phase == "tracking"


def test_prompt_span_ending_after_its_prompt_was_evicted_is_quiet() -> None:
    h = Harness(max_prompts=1)
    first = h.start_prompt("a")
    h.start_prompt("b")
    first.end()
    assert h.guard.diagnostics() == {"evicted": 1}
    assert h.guard.state("a") is None
    assert h.guard.state("b") is not None


def test_an_ended_prompt_is_never_chosen_for_eviction() -> None:
    h = Harness(max_prompts=1)
    h.start_prompt("a").end()  # idle when it ends
    h.batch("p", [FAIL] * 4)
    h.batch("q", [FAIL] * 4)  # the table is full: p goes, the only prompt with a state
    assert h.guard.diagnostics() == {"evicted": 1}
    assert h.guard.state("p") is None and h.guard.state("q") is not None


def test_prompt_expires_once_inactive_for_exactly_the_ttl() -> None:
    now = [0.0]
    h = Harness(prompt_ttl_seconds=10.0, clock=lambda: now[0])
    h.batch("a", [FAIL] * 4)
    now[0] = 9.5
    h.batch("b", [FAIL] * 4)
    assert h.guard.diagnostics() == {}
    now[0] = 10.0
    h.batch("c", [FAIL] * 4)
    assert h.guard.diagnostics() == {"expired": 1}
    assert h.guard.state("a") is None
    assert h.guard.state("b") is not None


# -- spans that are not the SDK's own -------------------------------------------------------------


class PublicOnlySpan:
    """A span offering only ReadableSpan's public properties, none of the SDK's internals."""

    def __init__(self, span: ReadableSpan, attributes: Any = ...) -> None:
        self.inner = span
        self.override = attributes

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def context(self) -> Any:
        return self.inner.context

    @property
    def parent(self) -> Any:
        return self.inner.parent

    @property
    def start_time(self) -> int | None:
        return self.inner.start_time

    @property
    def end_time(self) -> int | None:
        return self.inner.end_time

    @property
    def attributes(self) -> Any:
        return self.inner.attributes if self.override is ... else self.override


def recorded(span: ReadableSpan) -> ReadableSpan:
    """The span as a reader of recorded data builds it: a plain dict of attributes."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=dict(span.attributes or {}),
        start_time=span.start_time,
        end_time=span.end_time,
    )


def live_run() -> tuple[list[ReadableSpan], list[tuple[Any, ...]]]:
    seen: list[BatchEvaluation] = []
    h = Harness(listener=seen.append)
    prompt = h.start_prompt("p")
    for calls in ([FAIL] * 4, [FAIL] * 4, [FAIL, OK], [FAIL] * 2):
        h.batch("p", calls, parent=prompt)
    late = h.batch("p", [FAIL] * 3, parent=prompt, leave_open=1)
    late[0].end()
    # Calls that end in the reverse of their start order.
    batch_span = h.tracer.start_span(
        "tool_batch", context=set_span_in_context(prompt), attributes={"acp.prompt.id": "p"}
    )
    context = set_span_in_context(batch_span)
    first = h.tool_span(Call(error_type="timeout"), context)
    second = h.tool_span(FAIL, context)
    second.end()
    first.end()
    batch_span.set_attributes({"acp.batch.admitted": 2, "acp.input.reliable": True})
    batch_span.end()
    prompt.end()
    return list(h.span_exporter.get_finished_spans()), [summary(e) for e in seen]


def summary(evaluation: BatchEvaluation) -> tuple[Any, ...]:
    return (evaluation.batch, evaluation.decision, evaluation.decision_value)


def replay(spans: list[Any]) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
    seen: list[BatchEvaluation] = []
    guard = GuardSpanProcessor(mode="shadow", listener=seen.append)
    events = [(s.start_time, 0, i) for i, s in enumerate(spans)]
    events += [(s.end_time, 1, i) for i, s in enumerate(spans)]
    for _, ending, i in sorted(events):
        if ending:
            guard.on_end(spans[i])
        else:
            guard.on_start(spans[i])
    return [summary(e) for e in seen], guard.diagnostics()


def test_spans_built_from_recorded_data_are_evaluated_as_live_ones() -> None:
    spans, expected = live_run()
    assert [e[2] for e in expected] == [
        "tracked",
        "would_warn",
        "reset",
        "tracked",
        "reset",
        None,  # two keys from idle: mixed, nothing to reset
    ]
    assert [o.execution_error_type for o in expected[-1][0].observations] == [
        "timeout",
        "exit_nonzero",
    ]
    assert replay([recorded(s) for s in spans]) == (expected, {"late_span": 1})


def test_spans_offering_only_the_public_span_interface_are_evaluated_as_live_ones() -> None:
    spans, expected = live_run()
    assert replay([PublicOnlySpan(s) for s in spans]) == (expected, {"late_span": 1})


def test_a_call_without_a_start_time_counts_as_started_at_time_zero() -> None:
    spans, _ = live_run()
    batch = next(s for s in spans if s.name == "tool_batch")
    calls = [s for s in spans if s.parent and s.parent.span_id == batch.context.span_id]
    stamped, unstamped = recorded(calls[0]), recorded(calls[1])
    stamped._start_time = 1  # recorded data with odd clocks: one call at time 1,
    unstamped._start_time = None  # the other without a start time
    seen: list[BatchEvaluation] = []
    guard = GuardSpanProcessor(mode="shadow", listener=seen.append)
    guard.on_start(recorded(batch))  # type: ignore[arg-type]
    guard.on_end(stamped)
    guard.on_end(unstamped)
    guard.on_end(recorded(batch))
    (evaluation,) = seen
    ids = [o.call_id for o in evaluation.batch.observations]
    assert ids == [
        unstamped.attributes["gen_ai.tool.call.id"],  # type: ignore[index]
        stamped.attributes["gen_ai.tool.call.id"],  # type: ignore[index]
    ]


def test_spans_without_attributes_or_context_are_ignored_quietly() -> None:
    spans, _ = live_run()
    without_attributes = [PublicOnlySpan(s, attributes=None) for s in spans]
    assert replay(without_attributes) == ([], {})
    guard = GuardSpanProcessor(mode="shadow")
    guard.on_end(ReadableSpan(name="batch", context=None, attributes={"acp.prompt.id": "p"}))
    assert guard.diagnostics() == {}


def test_a_repeated_call_without_a_span_context_is_reported_without_a_span_id() -> None:
    spans, _ = live_run()
    batch = next(s for s in spans if s.name == "tool_batch")
    call = recorded(next(s for s in spans if s.parent == batch.context))
    h = Harness(mode="shadow")
    guard = h.guard
    guard.on_start(recorded(batch))  # type: ignore[arg-type]
    for _ in range(2):  # the same call twice, as recorded data without its span context
        call._context = None
        guard.on_end(call)
    guard.on_end(recorded(batch))
    assert guard.diagnostics() == {"duplicate_span": 1}
    (record,) = h.logs()
    assert record.log_record.trace_id == batch.context.trace_id
    assert not record.log_record.span_id


def test_a_late_call_offering_only_the_public_interface_is_reported_with_its_span() -> None:
    spans, _ = live_run()
    by_id = {s.context.span_id: s for s in spans}
    (late,) = [
        s
        for s in spans
        if s.parent
        and s.parent.span_id in by_id
        and (s.end_time or 0) > (by_id[s.parent.span_id].end_time or 0)
    ]  # a call that ended after its batch span
    h = Harness(mode="shadow")
    events = [(s.start_time, 0, i) for i, s in enumerate(spans)]
    events += [(s.end_time, 1, i) for i, s in enumerate(spans)]
    for _, ending, i in sorted(events):
        span = PublicOnlySpan(spans[i])
        (h.guard.on_end if ending else h.guard.on_start)(span)  # type: ignore[operator]
    assert h.guard.diagnostics() == {"late_span": 1}
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert record.log_record.span_id == late.context.span_id
    assert h.guard.genai_coverage().orphan_tool_calls == 0  # section 3 calls, late or not


# -- failures are counted, never raised -----------------------------------------------------------


class _RaisingLogger(NoOpLogger):
    def emit(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("log pipeline down")


class _RaisingLoggerProvider(NoOpLoggerProvider):
    def get_logger(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _RaisingLogger(name)


def test_failing_transition_telemetry_is_recorded_as_a_telemetry_error_metric() -> None:
    h = Harness()
    guard = GuardSpanProcessor(
        mode="shadow", meter_provider=h.meter_provider, logger_provider=_RaisingLoggerProvider()
    )
    h.tracer_provider.add_span_processor(guard)
    h.batch("p", [FAIL] * 4)
    guard.force_flush()
    assert guard.diagnostics() == {"telemetry_error": 1}
    assert h.diagnostic_counts() == {"telemetry_error": 1}


def test_internal_error_logs_one_debug_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = GuardSpanProcessor(mode="shadow")
    with caplog.at_level(logging.DEBUG, logger="otel_guard.guard.processor"):
        guard.on_end(object())  # type: ignore[arg-type]
    assert guard.diagnostics() == {"internal_error": 1}
    (record,) = [r for r in caplog.records if r.name == "otel_guard.guard.processor"]
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == "otel_guard: internal error in the guard processor"
    assert record.exc_info is None


def test_batch_spans_named_after_their_start_are_enforced_as_tracked_ones() -> None:
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p")
    actions = []
    for _ in range(3):
        batch = h.tracer.start_span("tool_batch", context=set_span_in_context(prompt))
        batch.set_attribute("acp.prompt.id", "p")  # a moment after its start
        for _ in range(4):
            h.tool_span(FAIL, set_span_in_context(batch)).end()
        batch.set_attributes({"acp.batch.admitted": 4, "acp.input.reliable": True})
        batch.end()
        action = h.guard.take_action("p")
        actions.append(None if action is None else action.kind)
    assert actions == [None, "reminder", "stop"]
    assert h.guard.diagnostics() == {}
    assert h.guard._call_bytes == 0  # the calls kept below them were given back
