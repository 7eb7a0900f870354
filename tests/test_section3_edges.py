"""Section 3 edges read as docs/contract.md section 3 says, live and in replay: the first span to
end for a call ID is the call; an off prompt's spans give no telemetry however late they end;
a batch span named after its start never lets the guard stop on calls it could not see."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness import FAIL, OK, Harness
from opentelemetry.trace import Span, set_span_in_context

from otel_guard.guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC, OBSERVATIONS_METRIC
from otel_guard.replay.replayer import Replayer

INPUT = {"acp.input.external": False, "acp.input.queued_prompt": False}


def replayed(h: Harness, mode: str) -> dict[str, int]:
    """The decisions a replay of everything the agent exported gives."""
    h.tracer_provider.force_flush()
    replayer = Replayer(mode)
    replayer.add(h.span_exporter.get_finished_spans())
    report: dict[str, Any] = replayer.finish().to_json()
    return {kind: count for kind, count in report["decisions"].items() if count}


def live(h: Harness) -> dict[str, int]:
    counts = h.decision_counts()
    return {kind: count for kind, count in counts.items() if count}


def settle(batch: Span, admitted: int) -> None:
    batch.set_attributes({"acp.batch.admitted": admitted, "acp.input.reliable": True, **INPUT})
    batch.end()


def failing_batches_then_actions(h: Harness, prompt: Span) -> list[str | None]:
    """Three failing batches of prompt "p", each followed by the host's take_action, then the
    prompt's end: the kinds of the actions taken."""
    actions: list[str | None] = []
    for _ in range(3):
        h.batch("p", [FAIL] * 4, parent=prompt)
        action = h.guard.take_action("p")
        actions.append(None if action is None else action.kind)
    prompt.end()
    return actions


def no_telemetry(h: Harness) -> bool:
    return (
        h.points(DECISIONS_METRIC) == []
        and h.points(DIAGNOSTICS_METRIC) == []
        and h.points(OBSERVATIONS_METRIC) == []
        and h.logs() == []
        and h.guard.diagnostics() == {}
    )


def test_a_later_started_span_that_ends_first_is_the_call_and_the_other_is_ignored() -> None:
    # The candidate's tool succeeds in the span that ends first; the failing span of the same
    # call ID, started earlier, ends second: it is the second terminal span, ignored. The
    # success resets the streak, so the loop that follows is tracked afresh, never stopped.
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p")
    h.batch("p", [FAIL] * 4, parent=prompt)
    batch = h.tracer.start_span(
        "tool_batch", context=set_span_in_context(prompt), attributes={"acp.prompt.id": "p"}
    )
    inside = set_span_in_context(batch)
    failing = h.tool_span(replace(FAIL, call_id="k1"), inside)
    succeeding = h.tool_span(replace(OK, call_id="k1"), inside)
    succeeding.end()
    failing.end()
    settle(batch, 1)
    actions = failing_batches_then_actions(h, prompt)
    assert actions == [None, "reminder", "stop"]  # a new candidate: two batches to remind
    assert h.guard.diagnostics() == {"duplicate_span": 1}
    (diagnostic,) = [
        r for r in h.logs() if (r.log_record.attributes or {}).get("diagnostic") is not None
    ]
    assert diagnostic.log_record.span_id == failing.get_span_context().span_id
    assert live(h) == {"tracked": 2, "reset": 1, "warned": 1, "stopped": 1}
    assert replayed(h, "shadow") == {"tracked": 2, "reset": 1, "would_warn": 1, "would_stop": 1}


def test_an_off_prompts_late_tool_span_after_its_prompt_span_ended_gives_no_telemetry() -> None:
    for opt_out in ({"route": "cron"}, {"channel": True}):
        h = Harness(mode="enforce")
        prompt = h.start_prompt("p", **opt_out)  # type: ignore[arg-type]
        (late,) = h.batch("p", [FAIL] * 4, parent=prompt, leave_open=1)
        prompt.end()
        late.end()  # a late frame of a batch of the off prompt, whose facts have gone
        assert no_telemetry(h)


def test_an_off_prompts_batch_ending_after_its_prompt_span_gives_no_telemetry() -> None:
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p", route="cron")
    h.failing_batches("p", 2, parent=prompt)
    batch = h.tracer.start_span(
        "tool_batch", context=set_span_in_context(prompt), attributes={"acp.prompt.id": "p"}
    )
    (late,) = [h.tool_span(FAIL, set_span_in_context(batch)) for _ in range(1)]
    late.end()
    prompt.end()  # legal in the SDK: a child may outlive its parent
    settle(batch, 1)
    assert no_telemetry(h)
    assert h.guard.state("p") is None  # nothing kept of it either
    # A batch that starts after the prompt span ended is a new, guarded prompt's (section 3).
    h.batch("p", [FAIL] * 4)
    assert live(h) == {"tracked": 1}


def test_a_batch_named_after_its_start_with_unread_calls_never_lets_the_guard_stop() -> None:
    # The calls carry no section 3 tool attribute, so while their parent has no prompt ID the
    # guard cannot tell them from another profile's spans and keeps none; a replay, which sees
    # the ID from the start, reads them (unknown outcomes: enforcement disabled). Live, the
    # batch is incomplete and the guard disables enforcement too: a reminder, never a stop.
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p")
    batch = h.tracer.start_span("tool_batch", context=set_span_in_context(prompt))
    for number in range(2):
        h.tracer.start_span(
            "execute_tool",
            context=set_span_in_context(batch),
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "run_shell",
                "gen_ai.tool.call.id": f"bare-{number}",
            },
        ).end()
    batch.set_attribute("acp.prompt.id", "p")
    settle(batch, 2)
    actions = failing_batches_then_actions(h, prompt)
    assert actions == [None, "reminder", None]
    assert "stopped" not in live(h)
    assert replayed(h, "enforce").get("stopped") is None


def test_batches_named_late_inside_an_off_prompt_and_ending_after_it_give_no_telemetry() -> None:
    # Each batch span starts inside the open cron prompt span but names its prompt only just
    # before it ends, after that span ended: still the off prompt's (a replay, which sees the
    # ID from the start, reads it so), never a fresh guarded prompt that can be stopped.
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p", route="cron")
    batches = []
    for _ in range(3):
        batch = h.tracer.start_span("tool_batch", context=set_span_in_context(prompt))
        for _ in range(4):
            h.tool_span(FAIL, set_span_in_context(batch)).end()
        batches.append(batch)
    prompt.end()
    for batch in batches:
        batch.set_attribute("acp.prompt.id", "p")
        settle(batch, 4)
        assert h.guard.take_action("p") is None
    assert no_telemetry(h)
    assert replayed(h, "enforce") == {}


def test_a_batch_named_late_whose_calls_were_all_seen_enforces_as_replay_does() -> None:
    # Admitted two, one call ended: incomplete, but no call went unseen (every call below it
    # carried section 3's attributes), so enforcement stays as a replay has it.
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p")
    h.batch("p", [FAIL] * 4, parent=prompt)
    batch = h.tracer.start_span("tool_batch", context=set_span_in_context(prompt))
    h.tool_span(FAIL, set_span_in_context(batch)).end()
    batch.set_attribute("acp.prompt.id", "p")
    batch.set_attributes({"acp.batch.admitted": 2, "acp.input.reliable": True})
    batch.set_attributes({"acp.input.external": True, "acp.input.queued_prompt": False})
    batch.end()
    assert failing_batches_then_actions(h, prompt) == [None, "reminder", "stop"]
    assert live(h) == replayed(h, "enforce")
