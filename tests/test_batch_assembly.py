"""Batch assembly and the decision path of GuardSpanProcessor: completeness, late frames, and
which observation a transition describes (SPEC sections 3 and 5)."""

from __future__ import annotations

import threading

from harness import FAIL, OK, Call, Harness
from opentelemetry.trace import Span, set_span_in_context

from otel_guard import BatchEvaluation
from otel_guard.telemetry import TRANSITION_EVENT


def evaluations(**guard_kwargs: object) -> tuple[Harness, list[BatchEvaluation]]:
    seen: list[BatchEvaluation] = []
    return Harness(listener=seen.append, **guard_kwargs), seen


def transition_attributes(h: Harness) -> list[dict[str, object]]:
    return [dict(r.log_record.attributes or {}) for r in h.logs(TRANSITION_EVENT)]


# -- completeness -------------------------------------------------------------------------------


def test_batch_with_more_distinct_call_ids_than_admitted_is_incomplete() -> None:
    h, seen = evaluations()
    h.batch("p", [FAIL] * 4)
    h.batch("p", [FAIL] * 3, admitted=2)
    assert [e.batch.complete for e in seen] == [True, False]
    assert seen[-1].decision.kind == "reset"
    assert seen[-1].decision.reason == "incomplete"


def test_batch_with_fewer_distinct_call_ids_than_admitted_is_incomplete() -> None:
    h, seen = evaluations()
    h.batch("p", [FAIL] * 4)
    h.batch("p", [FAIL] * 3, admitted=4)
    assert [e.batch.complete for e in seen] == [True, False]
    assert seen[-1].decision.reason == "incomplete"


def test_negative_admitted_count_makes_the_batch_incomplete_even_with_no_calls() -> None:
    h, seen = evaluations()
    h.batch("p", [FAIL] * 4)
    h.batch("p", [], admitted=-1)
    h.batch("p", [], admitted=0)
    assert [e.batch.complete for e in seen] == [True, False, True]


def test_boolean_admitted_count_is_malformed() -> None:
    h, seen = evaluations()
    h.batch("p", [FAIL])
    h.batch("p", [FAIL], admitted=True)
    assert [e.batch.complete for e in seen] == [True, False]


# -- late frames ----------------------------------------------------------------------------------


def test_call_ending_after_its_batch_is_late_and_never_joins_the_next_batch() -> None:
    h, seen = evaluations()
    late = h.batch("p", [FAIL] * 4, admitted=4, leave_open=1)
    late[0].end()
    h.batch("p", [FAIL] * 4)
    assert h.guard.diagnostics() == {"late_span": 1}
    assert [len(e.batch.observations) for e in seen] == [3, 4]
    assert [e.batch.complete for e in seen] == [False, True]


def test_late_frame_diagnostic_names_the_batch_prompt() -> None:
    h, _ = evaluations()
    late = h.batch("p-late", [FAIL] * 2, admitted=2, leave_open=1)
    late[0].end()
    (record,) = [r for r in h.logs() if (r.log_record.attributes or {}).get("diagnostic")]
    assert (record.log_record.attributes or {})["diagnostic"] == "late_span"
    assert (record.log_record.attributes or {})["prompt_id"] == "p-late"


def test_call_ending_while_its_batch_ends_is_either_observed_or_late_never_both() -> None:
    # Calls and their batch span end on different threads at once: each call must come out
    # exactly once, as an observation of the batch or as a late frame.
    calls = 6
    for _ in range(20):
        h, seen = evaluations()
        batch_span = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "p"})
        context = set_span_in_context(batch_span)
        tool_spans = [h.tool_span(FAIL, context) for _ in range(calls)]
        batch_span.set_attribute("acp.batch.admitted", calls)
        batch_span.set_attribute("acp.input.reliable", True)
        ready = threading.Barrier(calls + 1)

        threads = [threading.Thread(target=_end_after, args=(ready, s)) for s in tool_spans]
        for thread in threads:
            thread.start()
        _end_after(ready, batch_span)
        for thread in threads:
            thread.join()
        (evaluation,) = seen
        late = h.guard.diagnostics().get("late_span", 0)
        assert len(evaluation.batch.observations) + late == calls
        assert evaluation.batch.complete is (late == 0)


def _end_after(barrier: threading.Barrier, span: Span) -> None:
    barrier.wait()
    span.end()


# -- the transition describes the failing key -----------------------------------------------------


def test_transition_tool_type_comes_from_the_failing_call_not_the_first_call() -> None:
    h, _ = evaluations()
    other_tool_success = Call(
        tool="read_file", status="success", execution="success", error_type=None, tool_type="mcp"
    )
    for _ in range(2):
        h.batch("p", [other_tool_success, FAIL, FAIL, FAIL, FAIL])
    tool_types = [a.get("tool_type") for a in transition_attributes(h)]
    assert [a["decision"] for a in transition_attributes(h)] == ["tracked", "would_warn"]
    assert tool_types == ["native", "native"]


def test_transition_tool_type_skips_provider_duplicates_of_the_failing_call() -> None:
    h, _ = evaluations()
    duplicate = Call(tool_type="mcp", duplicate=True, call_id="dup")
    h.batch("p", [duplicate, FAIL, FAIL])
    (tracked,) = transition_attributes(h)
    assert tracked["tool_type"] == "native"


def test_transition_tool_type_matches_the_error_type_of_the_key() -> None:
    h, _ = evaluations()
    # Same tool, another error type, in an earlier batch of another key: the new key's own call
    # gives the tool type.
    h.batch("p", [Call(error_type="timeout", tool_type="mcp")])
    h.batch("p", [Call(error_type="exit_nonzero", tool_type="native")])
    assert [a.get("tool_type") for a in transition_attributes(h)] == ["mcp", "native"]


def test_reset_transition_carries_no_tool_type() -> None:
    h, _ = evaluations()
    h.batch("p", [FAIL] * 4)
    h.batch("p", [OK])
    tracked, reset = transition_attributes(h)
    assert tracked["tool_type"] == "native"
    assert "tool_type" not in reset
