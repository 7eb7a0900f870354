"""Batch assembly and the decision path of GuardSpanProcessor: completeness, late frames, and
which observation a transition describes (docs/contract.md sections 3 and 5)."""

from __future__ import annotations

import threading

from harness import FAIL, OK, Call, Harness
from opentelemetry.trace import Span, set_span_in_context

from otel_guard import BatchEvaluation, GuardAction
from otel_guard.guard.processor import _ENDED_BATCHES, MAX_CALL_ID_LENGTH, MAX_TOOL_NAME_LENGTH
from otel_guard.guard.telemetry import TRANSITION_EVENT
from otel_guard.reducer import REMINDER, Batch, Decision, FailureKey, GuardInput, GuardState


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


def test_a_decision_keyed_on_no_call_of_the_batch_names_no_tool_type() -> None:
    # The replay's what-if reducers decide from the same batch; a key none of its calls carries
    # still gives a transition, without a tool type, and never an internal error.
    key = FailureKey("write_file", "conflict")

    def reducer(state: GuardState, guard_input: GuardInput) -> Decision:
        return Decision("tracked", GuardState("tracking", key, 4, 1, 1, 2, False))

    h, seen = evaluations(reducer=reducer)
    h.batch("p", [FAIL] * 4)
    (tracked,) = transition_attributes(h)
    assert tracked["decision"] == "tracked" and "tool_type" not in tracked
    assert tracked["execution_error_type"] == "conflict"
    assert h.guard.diagnostics() == {}
    assert seen[0].decision.state.key == key


# -- what a call contributes ----------------------------------------------------------------------


def observed(h: Harness, seen: list[BatchEvaluation], calls: list[Call], **kw: object) -> Batch:
    h.batch("p", calls, **kw)  # type: ignore[arg-type]
    return seen[-1].batch


def test_call_id_of_the_maximum_length_counts_and_a_longer_one_is_missing() -> None:
    h, seen = evaluations()
    longest = "c" * MAX_CALL_ID_LENGTH
    assert observed(h, seen, [Call(call_id=longest)]).complete is True
    assert seen[-1].batch.observations[0].call_id == longest
    too_long = Call(call_id="c" * (MAX_CALL_ID_LENGTH + 1))
    assert observed(h, seen, [too_long], admitted=1).complete is False
    assert seen[-1].batch.observations == ()


def test_call_without_an_id_makes_the_batch_incomplete_even_when_the_rest_add_up() -> None:
    h, seen = evaluations()
    no_id = Call(extra={"gen_ai.tool.call.id": 42})
    batch = observed(h, seen, [Call(call_id="a"), no_id, Call(call_id="b")], admitted=2)
    assert batch.complete is False
    assert [o.call_id for o in batch.observations] == ["a", "b"]


def test_provider_duplicate_without_an_id_is_observed_with_an_empty_id() -> None:
    h, seen = evaluations()
    duplicate = Call(duplicate=True, extra={"gen_ai.tool.call.id": ""})
    batch = observed(h, seen, [duplicate, Call(call_id="a")], admitted=1)
    assert batch.complete is True
    assert [(o.call_id, o.provider_duplicate) for o in batch.observations] == [
        ("", True),
        ("a", False),
    ]


def test_tool_name_of_the_maximum_length_is_kept_and_a_longer_one_is_missing() -> None:
    h, seen = evaluations()
    longest = "t" * MAX_TOOL_NAME_LENGTH
    batch = observed(h, seen, [Call(tool=longest), Call(tool=longest + "t")])
    assert [o.policy_tool_name for o in batch.observations] == [longest, None]


def test_attributes_of_the_wrong_type_are_read_as_missing() -> None:
    h, seen = evaluations()
    odd = Call(
        tool=None,
        status=None,
        execution=None,
        error_type=None,
        tool_type=None,
        extra={
            "gen_ai.tool.name": 5,
            "acp.tool.type": 7,
            "acp.tool.status": 1,
            "acp.tool.execution.status": True,
            "acp.tool.execution.error_type": 3.5,
        },
    )
    (observation,) = observed(h, seen, [odd]).observations
    assert observation[1:] == (None, None, "", None, None, False)


def test_status_and_type_values_of_64_characters_are_kept_and_longer_ones_are_missing() -> None:
    h, seen = evaluations()
    kept = "k" * 64
    (observation,) = observed(
        h,
        seen,
        [Call(tool_type="t" * 64, status=kept, execution=kept, error_type=kept)],
    ).observations
    assert observation[1:] == (None, "t" * 64, kept, kept, kept, False)  # unresolved: no name
    longer = "l" * 65
    (observation,) = observed(
        h,
        seen,
        [Call(tool_type="t" * 65, status=longer, execution=longer, error_type=longer)],
    ).observations
    assert observation[1:] == (None, None, "", None, None, False)


def test_calls_beyond_the_batch_limit_make_it_incomplete_with_one_diagnostic() -> None:
    h, seen = evaluations(max_calls_per_batch=2)
    assert observed(h, seen, [FAIL] * 2).complete is True
    assert h.guard.diagnostics() == {}
    batch = observed(h, seen, [FAIL] * 4)
    assert batch.complete is False
    assert len(batch.observations) == 2
    assert h.guard.diagnostics() == {"batch_overflow": 1}


# -- the evaluation a listener receives -----------------------------------------------------------


def test_evaluation_carries_the_batch_its_inputs_and_what_was_decided() -> None:
    h, seen = evaluations(mode="warn")
    h.batch("p", [FAIL] * 4)
    h.batch("p", [FAIL] * 4, external=False, queued=False, reliable=True)
    first, second = seen
    assert second.prompt_id == "p"
    assert second.span.name == "tool_batch"
    assert second.span is h.span_exporter.get_finished_spans()[-1]
    assert second.mode == "warn"
    assert (second.has_external_input, second.has_queued_prompt, second.input_reliable) == (
        False,
        False,
        True,
    )
    assert second.before == first.decision.state
    assert second.decision.kind == "warn"
    assert second.decision_value == "warned"
    assert second.action == GuardAction("reminder", REMINDER)
    h.batch("p", [FAIL], external=True, queued=True, reliable=False)
    third = seen[-1]
    assert (third.has_external_input, third.has_queued_prompt, third.input_reliable) == (
        True,
        True,
        False,
    )
    assert (third.decision_value, third.action) == ("reset", None)


def test_batch_span_whose_prompt_id_is_not_a_string_is_not_evaluated() -> None:
    h, seen = evaluations()
    span = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": 7})
    span.set_attribute("acp.batch.admitted", 0)
    span.end()
    assert seen == []
    assert h.guard.diagnostics() == {}


def test_duplicate_frame_in_a_batch_nobody_listens_to_is_still_a_diagnostic() -> None:
    h = Harness()
    h.batch("p", [Call(call_id="x", status="success", execution="success"), Call(call_id="x")])
    assert h.guard.state("p") == GuardState.initial()
    assert h.guard.diagnostics() == {"duplicate_span": 1}
    assert h.diagnostic_counts() == {"duplicate_span": 1}
    (record,) = h.logs()
    batch, duplicate, _ = h.span_exporter.get_finished_spans()[::-1]  # the later-started call
    assert record.log_record.span_id == duplicate.context.span_id
    assert record.log_record.trace_id == batch.context.trace_id
    assert record.log_record.trace_flags == batch.context.trace_flags


def test_late_frames_are_recognised_for_the_most_recent_ended_batches_only() -> None:
    h = Harness()
    oldest = h.batch("p", [FAIL] * 2, leave_open=1)
    kept = h.batch("p", [FAIL] * 2, leave_open=1)
    for _ in range(_ENDED_BATCHES - 1):
        h.batch("p", [])
    oldest[0].end()  # its batch is no longer remembered: an orphan
    assert h.guard.diagnostics() == {}
    kept[0].end()
    assert h.guard.diagnostics() == {"late_span": 1}
