"""Half-written hand-made section 3 spans are counted (``missing_attribute``), never silent."""

from __future__ import annotations

from typing import Any

import pytest
from harness import FAIL, Call, Harness
from opentelemetry.trace import set_span_in_context

from otel_guard import BatchEvaluation
from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT

TOOL_KEYS = (
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "acp.tool.type",
    "acp.tool.status",
    "acp.tool.execution.status",
)


def _records(h: Harness) -> list[dict[str, Any]]:
    return [dict(r.log_record.attributes or {}) for r in h.logs(DIAGNOSTIC_EVENT)]


def test_complete_spans_give_no_diagnostic() -> None:
    h = Harness()
    h.failing_batches("p", 3)
    assert h.guard.diagnostics() == {}


@pytest.mark.parametrize("key", TOOL_KEYS)
def test_a_tool_call_span_without_a_required_attribute_is_counted_once(key: str) -> None:
    evaluations: list[BatchEvaluation] = []
    h = Harness(listener=evaluations.append)
    batch = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "p"})
    for index in range(2):
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "run_shell",
            "gen_ai.tool.call.id": f"c{index}",
            "acp.tool.type": "native",
            "acp.tool.status": "error",
            "acp.tool.execution.status": "error",
            "acp.tool.execution.error_type": "exit_nonzero",
        }
        if index == 0:
            del attributes[key]
        h.tracer.start_span(
            "execute_tool", context=set_span_in_context(batch), attributes=attributes
        ).end()
    batch.set_attributes({"acp.batch.admitted": 2, "acp.input.reliable": True})
    batch.end()
    assert h.guard.diagnostics() == {"missing_attribute": 1}
    assert _records(h) == [{"diagnostic": "missing_attribute", "prompt_id": "p"}]
    assert len(evaluations) == 1  # the batch is still evaluated, as section 3 reads it


@pytest.mark.parametrize("value", [1, True, ["error"]])
def test_a_wrongly_typed_required_value_is_a_missing_one(value: Any) -> None:
    h = Harness()
    h.batch("p", [Call(extra={"acp.tool.status": value}), FAIL])
    assert h.guard.diagnostics() == {"missing_attribute": 1}


def test_an_unresolved_tool_type_is_declared_not_missing() -> None:
    # A third-party tool says so (section 3, tool type): unknown, never counted, not half-written.
    h = Harness()
    h.batch("p", [Call(tool_type="extension")])
    assert h.guard.diagnostics() == {}


def test_a_batch_span_without_its_input_drain_reliability_is_counted() -> None:
    h = Harness()
    h.batch("p", [FAIL], reliable=None)
    assert h.guard.diagnostics() == {"missing_attribute": 1}
    assert _records(h) == [{"diagnostic": "missing_attribute", "prompt_id": "p"}]


def test_a_batch_span_whose_prompt_id_came_after_start_is_a_batch_span() -> None:
    # A batch span is one when it ends (section 3 asks the prompt ID at start of prompt spans
    # only): it is read with its calls, as a replay reads it, and is not half-written.
    seen: list[BatchEvaluation] = []
    h = Harness(listener=seen.append)
    batch = h.tracer.start_span("tool_batch")
    h.tool_span(FAIL, set_span_in_context(batch)).end()
    batch.set_attributes(
        {"acp.prompt.id": "p", "acp.batch.admitted": 1, "acp.input.reliable": True}
    )
    batch.end()
    assert h.guard.diagnostics() == {}
    (evaluation,) = seen
    assert evaluation.prompt_id == "p" and evaluation.batch.complete
    assert [o.execution_status for o in evaluation.batch.observations] == ["error"]


def test_a_prompt_span_whose_prompt_id_came_after_start_is_counted() -> None:
    h = Harness()
    prompt = h.tracer.start_span(
        "invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}
    )
    prompt.set_attribute("acp.prompt.id", "p")
    prompt.end()
    assert h.guard.diagnostics() == {"missing_attribute": 1}


def test_a_late_prompt_id_on_an_opted_out_span_gives_no_telemetry() -> None:
    h = Harness()
    batch = h.tracer.start_span("tool_batch")
    batch.set_attributes(
        {"acp.prompt.id": "p", "acp.batch.admitted": 0, "acp.prompt.route": "cron"}
    )
    batch.end()
    assert h.guard.diagnostics() == {}


def test_half_written_calls_of_an_opted_out_prompt_give_no_telemetry() -> None:
    h = Harness()
    h.batch(
        "p", [Call(tool_type=None)], reliable=None, batch_attributes={"acp.prompt.route": "cron"}
    )
    assert h.guard.diagnostics() == {}
    assert h.logs(DIAGNOSTIC_EVENT) == []


def test_a_span_that_only_names_its_prompt_late_is_not_a_batch() -> None:
    h = Harness()
    span = h.tracer.start_span("chat")
    span.set_attribute("acp.prompt.id", "p")
    span.end()
    assert h.guard.diagnostics() == {}


def test_an_evicted_batch_span_is_evicted_not_half_written() -> None:
    h = Harness(max_prompts=1)
    opened = [
        h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"p{i}"}) for i in range(8)
    ]
    for span in opened:
        span.set_attributes({"acp.batch.admitted": 0, "acp.input.reliable": True})
        span.end()
    counts = h.guard.diagnostics()
    assert counts.get("evicted", 0) >= 1
    assert "missing_attribute" not in counts
