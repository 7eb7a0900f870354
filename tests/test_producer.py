"""The producer helpers emit docs/contract.md section 3 spans a real guard evaluates as intended."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_guard import BatchEvaluation
from otel_guard.integrations.producer import (
    ERROR_TYPE_PATTERN,
    AdmissionClosedError,
    BatchEndedError,
    CallAlreadySettledError,
    CallNotSettledError,
    CallsStillOpenError,
    DuplicateCallError,
    InputDrainMissingError,
    InvalidErrorTypeError,
    InvalidStatusError,
    InvalidValueError,
    ProducerError,
    ToolBatch,
    error_type_of,
    prompt_span,
    start_batch,
)
from otel_guard.reducer import (
    REMINDER,
    STOP_MESSAGE,
    Batch,
    GuardInput,
    GuardState,
    Observation,
    reduce,
)
from otel_guard.spans import attributes as attr


class StartAttributes(SpanProcessor):
    """Records each span's attributes as they were when it started."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[dict[str, Any]]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.by_name.setdefault(span.name, []).append(dict(span.attributes or {}))


class Pipeline(Harness):
    def __init__(self, mode: str = "shadow") -> None:
        self.evaluations: list[BatchEvaluation] = []
        super().__init__(mode=mode, listener=self.evaluations.append)
        self.starts = StartAttributes()
        self.tracer_provider.add_span_processor(self.starts)

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.span_exporter.get_finished_spans() if s.name == name]

    def failing_batch(self, prompt: Any, size: int = 4) -> None:
        with prompt.batch() as batch:
            for _ in range(size):
                self._call_seq += 1
                with batch.call(f"c{self._call_seq}", "run_shell") as call:
                    call.settle("error", "exit_nonzero")
            batch.record_input_drain()


def test_spans_carry_the_contract_attributes_from_their_start() -> None:
    p = Pipeline()
    with prompt_span(p.tracer, "p1") as prompt, prompt.batch() as batch:
        with batch.call("c1", "read_file", tool_type="mcp"):
            pass
        batch.record_input_drain()

    assert p.starts.by_name["invoke_agent"] == [
        {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p1"}
    ]
    assert p.starts.by_name["tool_batch"] == [{"acp.prompt.id": "p1"}]
    (batch_span,) = p.spans("tool_batch")
    assert dict(batch_span.attributes or {}) == {
        "acp.prompt.id": "p1",
        "acp.batch.admitted": 1,
        "acp.input.external": False,
        "acp.input.queued_prompt": False,
        "acp.input.reliable": True,
    }
    (tool_span,) = p.spans("execute_tool read_file")
    assert dict(tool_span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "read_file",
        "gen_ai.tool.call.id": "c1",
        "acp.tool.type": "mcp",
        "acp.tool.execution.status": "success",
        "acp.tool.status": "success",
    }
    assert tool_span.parent is not None and batch_span.context is not None
    assert tool_span.parent.span_id == batch_span.context.span_id
    (prompt_end,) = p.spans("invoke_agent")
    assert batch_span.parent is not None and prompt_end.context is not None
    assert batch_span.parent.span_id == prompt_end.context.span_id


def test_route_and_channel_markers_are_on_prompt_and_batch_spans() -> None:
    p = Pipeline()
    with (
        prompt_span(p.tracer, "p1", route="cron", channel=True) as prompt,
        prompt.batch() as batch,
    ):
        batch.record_input_drain()
    marks = {"acp.prompt.route": "cron", "acp.prompt.channel": True}
    assert p.starts.by_name["invoke_agent"][0].items() >= marks.items()
    assert p.starts.by_name["tool_batch"][0].items() >= marks.items()


def test_enforce_reminds_then_stops_a_loop_emitted_with_the_helpers() -> None:
    p = Pipeline(mode="enforce")
    actions = []
    with prompt_span(p.tracer, "p1") as prompt:
        for _ in range(3):
            p.failing_batch(prompt)
            actions.append(p.guard.take_action("p1"))
    assert [a.kind if a else None for a in actions] == [None, "reminder", "stop"]
    assert actions[1] is not None and actions[1].text == REMINDER
    assert actions[2] is not None and actions[2].text == STOP_MESSAGE
    assert p.decision_counts() == {"tracked": 1, "warned": 1, "stopped": 1}
    assert p.diagnostic_counts() == {}


def test_a_post_execution_failure_keeps_the_frozen_execution_outcome() -> None:
    p = Pipeline()
    with prompt_span(p.tracer, "p1") as prompt:
        p.failing_batch(prompt)
        with prompt.batch() as batch:
            call = batch.start_call("late-hook", "run_shell")
            call.settle("success")
            assert call.finish("error") == "error"  # a finalisation step failed afterwards
            batch.record_input_drain()
    (span,) = p.spans("execute_tool run_shell")[-1:]
    assert span.attributes is not None
    assert span.attributes["acp.tool.execution.status"] == "success"
    assert span.attributes["acp.tool.status"] == "error"
    assert attr.TOOL_EXECUTION_ERROR_TYPE not in span.attributes
    assert p.evaluations[-1].decision.kind == "reset"
    assert p.evaluations[-1].decision.reason == "post_execution_failure"


def test_finalisation_may_change_the_terminal_status_but_not_the_error_type() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        call = batch.start_call("c1", "run_shell")
        call.settle("error", "exit_nonzero")
        with pytest.raises(CallAlreadySettledError):
            call.settle("error", "timeout")
        call.finish("error")
        batch.record_input_drain()
    (span,) = p.spans("execute_tool run_shell")
    assert span.attributes is not None
    assert span.attributes["acp.tool.execution.error_type"] == "exit_nonzero"
    assert p.evaluations[0].batch.observations[0].execution_error_type == "exit_nonzero"


def test_a_cancel_racing_an_execution_error_ends_cancelled_and_is_not_counted() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        call = batch.start_call("c1", "run_shell")
        call.settle("error", "exit_nonzero")
        assert call.cancel() is True
        assert call.finish("error") == "cancelled"
        batch.record_input_drain()
    (observation,) = p.evaluations[0].batch.observations
    assert (observation.terminal_status, observation.execution_status) == ("cancelled", "error")
    assert observation.execution_error_type == "exit_nonzero"
    assert p.evaluations[0].decision.kind == "none"  # idle -> idle reset emits nothing
    assert p.evaluations[0].decision.state.failure_count == 0


def test_a_cancel_before_execution_settles_the_call_cancelled() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        call = batch.start_call("c1", "run_shell")
        call.cancel()
        assert call.finish() == "cancelled"
        batch.record_input_drain()
    (observation,) = p.evaluations[0].batch.observations
    assert (observation.terminal_status, observation.execution_status) == (
        "cancelled",
        "cancelled",
    )


def test_a_cancel_after_the_call_finished_changes_nothing() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        call = batch.start_call("c1", "run_shell")
        call.settle("error", "exit_nonzero")
        call.finish()
        assert call.cancel() is False
        batch.record_input_drain()
    assert p.evaluations[0].batch.observations[0].terminal_status == "error"


def test_call_block_settles_from_how_it_exits() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        with batch.call("ok", "read_file"):
            pass
        with pytest.raises(FileNotFoundError), batch.call("missing", "read_file"):
            raise FileNotFoundError("secret/path")
        with pytest.raises(asyncio.CancelledError), batch.call("stopped", "read_file"):
            raise asyncio.CancelledError
        with batch.call("denied", "read_file") as call:
            call.settle("not_started")
        batch.record_input_drain()
    observed = {
        o.call_id: (o.terminal_status, o.execution_status, o.execution_error_type)
        for o in p.evaluations[0].batch.observations
    }
    assert observed == {
        "ok": ("success", "success", None),
        "missing": ("error", "error", "file_not_found_error"),
        "stopped": ("cancelled", "cancelled", None),
        "denied": ("error", "not_started", None),
    }
    assert p.evaluations[0].batch.complete is True


def test_the_tool_span_is_current_inside_a_call_block() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        with batch.call("c1", "read_file"):
            p.tracer.start_span("inner").end()
        batch.record_input_drain()
    (inner,) = p.spans("inner")
    (tool,) = p.spans("execute_tool read_file")
    assert inner.parent is not None and tool.context is not None
    assert inner.parent.span_id == tool.context.span_id


def test_provider_duplicates_are_flagged_and_not_admitted() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as batch:
        with batch.call("c1", "run_shell") as call:
            call.settle("error", "exit_nonzero")
        batch.record_duplicate("c1", "run_shell")
        assert batch.admitted == 1
        batch.record_input_drain()
    evaluation = p.evaluations[0]
    assert evaluation.batch.complete is True
    assert [o.provider_duplicate for o in evaluation.batch.observations] == [False, True]
    assert evaluation.decision.kind == "tracked"
    assert evaluation.decision.state.failure_count == 1


def test_ending_a_batch_with_open_calls_raises_and_the_guard_sees_it_incomplete() -> None:
    p = Pipeline()
    with start_batch(p.tracer, "p1") as warmup:  # a streak the incomplete batch must reset
        with warmup.call("c0", "run_shell") as call:
            call.settle("error", "exit_nonzero")
        warmup.record_input_drain()
    batch = start_batch(p.tracer, "p1")
    with batch.call("c1", "run_shell") as call:
        call.settle("error", "exit_nonzero")
    open_call = batch.start_call("c2", "run_shell")
    batch.admit("c3")
    with pytest.raises(CallsStillOpenError) as raised:
        batch.end()
    assert raised.value.call_ids == ("c2", "c3")
    assert batch.ended and open_call.finished
    evaluation = p.evaluations[-1]
    assert evaluation.batch.complete is False
    # No drain could follow an unsettled batch, so the input is unreliable too (checked first).
    assert (evaluation.decision.kind, evaluation.decision.reason) == ("reset", "unreliable_input")
    assert p.diagnostic_counts() == {"late_span": 1}
    with pytest.raises(BatchEndedError):
        open_call.settle("success")


def test_a_call_settled_twice_or_finished_twice_is_rejected() -> None:
    p = Pipeline()
    batch = start_batch(p.tracer, "p1")
    call = batch.start_call("c1", "run_shell")
    call.settle("success")
    with pytest.raises(CallAlreadySettledError):
        call.settle("success")
    call.finish()
    with pytest.raises(CallAlreadySettledError):
        call.finish()
    with pytest.raises(CallAlreadySettledError):
        call.settle("error", "exit_nonzero")


def test_settling_or_finishing_after_the_batch_ended_is_rejected() -> None:
    p = Pipeline()
    batch = start_batch(p.tracer, "p1")
    call = batch.start_call("c1", "run_shell")
    with pytest.raises(CallsStillOpenError):
        batch.end()
    with pytest.raises(BatchEndedError):
        call.settle("success")
    with pytest.raises(BatchEndedError):
        call.finish("error")
    with pytest.raises(BatchEndedError):
        batch.start_call("c2", "run_shell")
    with pytest.raises(BatchEndedError):
        batch.end()


def test_a_call_block_that_outlives_its_batch_is_rejected() -> None:
    p = Pipeline()
    batch = start_batch(p.tracer, "p1")
    with (
        pytest.raises(BatchEndedError),
        batch.call("c1", "run_shell"),
        pytest.raises(CallsStillOpenError),
    ):
        batch.end()


@pytest.mark.parametrize("status", ["failed", "", "SUCCESS", None])
def test_an_invalid_execution_status_is_rejected(status: Any) -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    with pytest.raises(InvalidStatusError):
        call.settle(status)


@pytest.mark.parametrize("status", ["failed", "not_started", "unknown"])
def test_an_invalid_terminal_status_is_rejected(status: Any) -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    call.settle("success")
    with pytest.raises(InvalidStatusError):
        call.finish(status)


@pytest.mark.parametrize("execution", ["error", "cancelled"])
def test_terminal_success_after_a_failed_execution_is_a_contract_violation(
    execution: Any,
) -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    call.settle(execution, "exit_nonzero" if execution == "error" else None)
    with pytest.raises(InvalidStatusError):
        call.finish("success")
    assert not call.finished


@pytest.mark.parametrize(
    "error_type",
    [None, "", "ExitNonzero", "1exit", "_exit", "exit nonzero", "a" * 65, "exit/nonzero", 7],
)
def test_an_error_type_that_is_not_a_structured_identifier_is_rejected(error_type: Any) -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    with pytest.raises(InvalidErrorTypeError):
        call.settle("error", error_type)
    assert call.execution_status is None


def test_an_error_type_without_an_execution_error_is_rejected() -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    with pytest.raises(InvalidErrorTypeError):
        call.settle("success", "exit_nonzero")


def test_finishing_an_unsettled_call_is_rejected() -> None:
    call = start_batch(Pipeline().tracer, "p1").start_call("c1", "run_shell")
    with pytest.raises(CallNotSettledError):
        call.finish("error")
    assert not call.finished


def test_starting_the_same_call_twice_is_rejected() -> None:
    batch = start_batch(Pipeline().tracer, "p1")
    batch.start_call("c1", "run_shell")
    with pytest.raises(DuplicateCallError):
        batch.start_call("c1", "run_shell")


def test_admission_closes_with_the_input_drain_which_needs_every_call_finished() -> None:
    batch = start_batch(Pipeline().tracer, "p1")
    call = batch.start_call("c1", "run_shell")
    with pytest.raises(CallsStillOpenError):
        batch.record_input_drain()
    call.settle("success")
    call.finish()
    batch.record_input_drain(external=True)
    with pytest.raises(AdmissionClosedError):
        batch.start_call("c2", "run_shell")
    with pytest.raises(AdmissionClosedError):
        batch.admit("c2")


def test_a_batch_ended_without_its_input_drain_raises_and_disables_enforcement() -> None:
    p = Pipeline(mode="enforce")
    batch = start_batch(p.tracer, "p1")
    with batch.call("c1", "run_shell"):
        pass
    with pytest.raises(InputDrainMissingError):
        batch.end()
    assert p.evaluations[0].input_reliable is False
    state = p.guard.state("p1")
    assert state is not None and state.enforcement_disabled is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"route": "nightly"}, "route"),
        ({"channel": "yes"}, "channel"),
    ],
)
def test_invalid_route_markers_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        start_batch(Pipeline().tracer, "p1", **kwargs)


def test_invalid_identifiers_and_tool_types_are_rejected() -> None:
    p = Pipeline()
    with pytest.raises(InvalidValueError), prompt_span(p.tracer, ""):
        pass
    batch = start_batch(p.tracer, "p1")
    with pytest.raises(InvalidValueError):
        batch.start_call("", "run_shell")
    with pytest.raises(InvalidValueError):
        batch.start_call("c1", "run_shell", tool_type="plugin")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError):
        batch.record_input_drain(reliable=1)  # type: ignore[arg-type]
    assert issubclass(InvalidValueError, ValueError)
    assert issubclass(InvalidValueError, ProducerError)


def test_an_exception_leaving_the_batch_ends_it_and_propagates() -> None:
    p = Pipeline()
    with pytest.raises(asyncio.CancelledError), start_batch(p.tracer, "p1") as batch:
        batch.start_call("c1", "run_shell")
        raise asyncio.CancelledError
    assert isinstance(batch, ToolBatch) and batch.ended
    (tool,) = p.spans("execute_tool run_shell")
    assert tool.attributes is not None
    assert tool.attributes["acp.tool.status"] == "cancelled"
    assert p.evaluations[0].batch.complete is False
    assert p.diagnostic_counts() == {"late_span": 1}


def test_an_exception_leaving_the_prompt_block_leaves_its_message_out_of_the_span() -> None:
    p = Pipeline()
    secret = "CnryErrorZq: permission denied for token sk-live-123"
    with pytest.raises(PermissionError), prompt_span(p.tracer, "p1"):
        raise PermissionError(secret)
    (prompt,) = p.spans(attr.INVOKE_AGENT)
    assert prompt.status.status_code.name == "ERROR"
    assert prompt.status.description is None
    assert not prompt.events
    assert "CnryErrorZq" not in repr(prompt.to_json())


def test_the_prompt_span_ends_the_guards_prompt_state() -> None:
    p = Pipeline()
    with prompt_span(p.tracer, "p1") as prompt:
        p.failing_batch(prompt)
        assert p.guard.state("p1") is not None
    assert p.guard.state("p1") is None


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FileNotFoundError, "file_not_found_error"),
        (OSError, "os_error"),
        (ValueError("raw text"), "value_error"),
        (type("HTTP2Error", (Exception,), {}), "http2_error"),
        (type("JSONDecodeError", (Exception,), {}), "json_decode_error"),
        (type("_PrivateTimeout", (Exception,), {}), "private_timeout"),
        (type("Ünïcode", (Exception,), {}), "n_code"),
        (type("123", (Exception,), {}), "error"),
    ],
)
def test_error_type_of_derives_snake_case_from_the_class(error: Any, expected: str) -> None:
    assert error_type_of(error) == expected


@given(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=200))
def test_error_type_of_always_gives_an_error_type_the_reducer_counts(name: str) -> None:
    error_type = error_type_of(type(name or "E", (Exception,), {}))
    assert ERROR_TYPE_PATTERN.fullmatch(error_type)
    failure = Observation("c1", "run_shell", "native", "error", "error", error_type)
    decision = reduce(
        GuardState.initial(), GuardInput("shadow", Batch(True, (failure,)), False, False, True)
    )
    expected = "reset" if error_type == "unknown" else "tracked"
    assert decision.kind == expected


def test_an_abandoned_batch_with_an_intact_input_channel_resets_as_incomplete() -> None:
    p = Pipeline(mode="enforce")
    batch = start_batch(p.tracer, "p1")
    with batch.call("c1", "run_shell") as call:
        call.settle("error", "exit_nonzero")
    batch.start_call("c2", "run_shell")
    batch.abandon(RuntimeError("host interrupted"), reliable=True)
    batch.abandon()  # already ended: a no-op
    evaluation = p.evaluations[0]
    assert (evaluation.batch.complete, evaluation.input_reliable) == (False, True)
    state = p.guard.state("p1")
    assert state is not None and state.enforcement_disabled is False
    (late,) = [
        s
        for s in p.spans("execute_tool run_shell")
        if (s.attributes or {}).get("gen_ai.tool.call.id") == "c2"
    ]
    assert late.attributes is not None
    assert (late.attributes["acp.tool.status"], late.attributes["acp.tool.execution.status"]) == (
        "error",
        "unknown",
    )


def test_readme_producer_example_reminds_then_stops(capsys: pytest.CaptureFixture[str]) -> None:
    readme = Path(__file__).resolve().parent.parent / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
    wanted = "from otel_guard.integrations.producer import prompt_span"
    (example,) = [b for b in blocks if wanted in b]
    exec(compile(example, str(readme), "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out.splitlines() == ["turn 1: reminder", "turn 2: stop"]
