"""Replaying recorded spans: the same decisions as the live guard, and the report's checks."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

import otel_guard.replay.replayer as replayer_module
from otel_guard.guard.processor import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.guard.telemetry import TRANSITION_EVENT
from otel_guard.reducer import Batch, Decision, GuardState, Observation
from otel_guard.replay.otlp_json import encode_request, parse_request
from otel_guard.replay.replayer import GuardPipeline, GuardReport, Replayer, TelemetryAudit
from otel_guard.spans.attributes import PROMPT_ID

CANCELLED = Call(status="cancelled", execution="not_started", error_type=None)


def live(
    prompts: dict[str, list[list[Call]]], mode: str, *, prompt_spans: bool = True
) -> tuple[Harness, list[ReadableSpan]]:
    """Run the prompts through a live guard; the host takes every action, like the replay."""
    harness = Harness(mode=mode)
    for prompt_id, batches in prompts.items():
        prompt = harness.start_prompt(prompt_id) if prompt_spans else None
        for calls in batches:
            harness.batch(prompt_id, calls, parent=prompt)
            harness.guard.take_action(prompt_id)
        if prompt is not None:
            prompt.end()
    return harness, list(harness.span_exporter.get_finished_spans())


def replay(spans: list[ReadableSpan], mode: str, **kwargs: Any) -> GuardReport:
    replayer = Replayer(mode, **kwargs)
    replayer.add(spans)
    return replayer.finish()


def decisions(report: GuardReport) -> dict[str, int]:
    return {k: v for k, v in report.total["decisions"].items() if v}


_CALLS = st.sampled_from([FAIL, OK, CANCELLED, Call(tool="edit", error_type="conflict")])
_PROMPTS = st.dictionaries(
    st.sampled_from(["p1", "p2", "p3"]),
    st.lists(st.lists(_CALLS, min_size=1, max_size=5), min_size=1, max_size=6),
    min_size=1,
)


@settings(max_examples=40, deadline=None)
@given(
    prompts=_PROMPTS,
    mode=st.sampled_from(["shadow", "warn", "enforce"]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_replay_in_any_span_order_matches_the_live_guard(
    prompts: dict[str, list[list[Call]]], mode: str, seed: int
) -> None:
    harness, spans = live(prompts, mode)
    random.Random(seed).shuffle(spans)
    report = replay(spans, mode)
    assert decisions(report) == harness.decision_counts()
    assert report.invariant_violations == 0
    assert report.total["spans"] == len(spans)


@settings(max_examples=20, deadline=None)
@given(
    prompts=_PROMPTS,
    mode=st.sampled_from(["shadow", "enforce"]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_only_spans_the_guard_may_start_are_started_and_the_report_is_the_same(
    prompts: dict[str, list[list[Call]]], mode: str, seed: int
) -> None:
    _, spans = live(prompts, mode)
    random.Random(seed).shuffle(spans)
    started: list[ReadableSpan] = []
    on_start = GuardSpanProcessor.on_start

    def recording(self: GuardSpanProcessor, span: Any, parent_context: Any = None) -> None:
        started.append(span)
        on_start(self, span, parent_context)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GuardSpanProcessor, "on_start", recording)
        filtered = replay(spans, mode).to_json()
        assert {id(s) for s in started} == {
            id(s) for s in spans if PROMPT_ID in (s.attributes or {})
        }
        # Every span started, as before the filter: the same report.
        patch.setattr(replayer_module, "_START_VALUES", (("any key", "any value"),))
        patch.setattr(replayer_module, "_start_value_matches", lambda attributes: True)
        started.clear()
        assert replay(spans, mode).to_json() == filtered
        assert len(started) == len(spans)


def test_the_replay_host_takes_every_action_the_guard_holds() -> None:
    # The pipeline reads the guard's action only after batches that decided one: none may be
    # left pending, and the stop that needs the reminder taken is still issued.
    prompts = {"p1": [[FAIL] * 4] * 4, "p2": [[FAIL] * 4, [OK], [FAIL] * 4, [FAIL] * 4]}
    harness, spans = live(prompts, "enforce")
    replayer = Replayer("enforce")
    replayer.add(spans)
    replayer._replay_in_start_order(list(replayer._traces))
    assert all(replayer.pipeline.guard.take_action(p) is None for p in prompts)
    report = replayer.finish()
    assert decisions(report) == harness.decision_counts()
    assert report.total["decisions"]["stopped"] >= 1


def test_batches_that_are_their_own_traces_replay_in_start_order() -> None:
    prompts = {"p": [[FAIL] * 4, [FAIL] * 4, [FAIL] * 4]}
    harness, spans = live(prompts, "enforce", prompt_spans=False)
    spans.reverse()  # the last batch's trace is read first
    report = replay(spans, "enforce")
    assert (
        decisions(report) == harness.decision_counts() == {"tracked": 1, "warned": 1, "stopped": 1}
    )
    assert report.traces == 3


def test_a_root_read_before_its_children_still_joins_its_trace() -> None:
    _, spans = live({"p": [[FAIL] * 4, [FAIL] * 4]}, "shadow")
    root = next(s for s in spans if s.parent is None)
    ordered = [root, *(s for s in spans if s is not root)]
    report = replay(ordered, "shadow", reorder_window=len(spans))
    assert decisions(report) == {"tracked": 1, "would_warn": 1}
    assert report.traces == 1


def test_spans_after_the_reorder_window_do_not_join_the_replayed_trace() -> None:
    _, spans = live({"p": [[FAIL] * 4, [FAIL] * 4]}, "shadow")
    root = next(s for s in spans if s.parent is None)
    replayer = Replayer("shadow", reorder_window=0)
    for span in [root, *(s for s in spans if s is not root)]:
        replayer.add([span])  # one line per span
    report = replayer.finish()
    # The prompt was replayed alone; its batches came later as a second fragment of the trace.
    assert report.traces == 2
    assert decisions(report) == {"tracked": 1, "would_warn": 1}


def test_open_traces_stay_within_the_bound() -> None:
    prompts = {f"p{i}": [[FAIL] * 2] for i in range(6)}
    harness, spans = live(prompts, "shadow")
    replayer = Replayer("shadow", max_open_traces=2)
    children = [s for s in spans if s.parent is not None]
    highest = 0
    for span in children:  # no root ever arrives: only the bound releases traces
        replayer.add([span])
        highest = max(highest, replayer.open_traces)
    report = replayer.finish()
    assert highest == 2
    assert report.traces == 6
    assert decisions(report) == harness.decision_counts() == {"tracked": 6}


def test_a_child_that_claims_to_start_before_its_parent_is_still_observed() -> None:
    _, spans = live({"p": [[FAIL] * 4, [FAIL] * 4]}, "shadow")
    document = encode_request(spans)
    for block in document["resourceSpans"]:
        for scope in block["scopeSpans"]:
            for span in scope["spans"]:
                if any(a["key"] == "gen_ai.tool.name" for a in span.get("attributes", [])):
                    span["startTimeUnixNano"] = "1"  # host clock skew
    report = replay(parse_request(json.dumps(document)), "shadow")
    assert decisions(report) == {"tracked": 1, "would_warn": 1}


def test_a_tool_span_ending_after_its_batch_is_a_late_frame() -> None:
    harness = Harness(mode="shadow")
    prompt = harness.start_prompt("p")
    harness.batch("p", [FAIL] * 4, parent=prompt)
    late = harness.batch("p", [FAIL] * 4, parent=prompt, leave_open=1, admitted=4)
    late[0].end()
    prompt.end()
    report = replay(list(harness.span_exporter.get_finished_spans()), "shadow")
    assert report.diagnostics == harness.guard.diagnostics() == {"late_span": 1}
    assert {k: v for k, v in report.total["reset_reasons"].items() if v} == {"incomplete": 1}
    assert report.violations["incomplete_batch_decision"] == 0


def test_the_guard_clock_follows_span_time() -> None:
    harness = Harness(mode="shadow")
    harness.batch("old", [FAIL] * 4)
    spans = list(harness.span_exporter.get_finished_spans())
    seven_hours = 7 * 3600 * 10**9
    later = Harness(mode="shadow")
    later.batch("new", [FAIL] * 4)
    later.batch("old", [FAIL] * 4)
    document = encode_request(later.span_exporter.get_finished_spans())
    for block in document["resourceSpans"]:
        for scope in block["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("startTimeUnixNano", "endTimeUnixNano"):
                    span[key] = str(int(span[key]) + seven_hours)
    report = replay([*spans, *parse_request(json.dumps(document))], "shadow")
    # Seven idle hours in span time exceed the prompt TTL: "old" starts over, never warned.
    assert report.diagnostics == {"expired": 1}
    assert decisions(report) == {"tracked": 3}


def test_calls_after_a_stop_decision_are_counted_as_saved() -> None:
    prompts = {"loop": [[FAIL] * 4, [FAIL] * 4, [FAIL] * 4, [FAIL] * 3, [OK] * 2]}
    _, spans = live(prompts, "shadow")
    report = replay(spans, "enforce")
    assert report.total["saved"]["tool_calls"] == 5
    [entry] = report.samples["stopped_prompts"].entries()
    assert (entry["prompt_id"], entry["tool_calls_after_stop"]) == ("loop", 5)
    assert (report.total["prompts_warned"], report.total["prompts_stopped"]) == (1, 1)
    assert report.total["prompts_would_stop"] == 0


def test_groups_follow_environment_and_version() -> None:
    _, spans = live({"p": [[FAIL] * 4]}, "shadow")
    document = encode_request(spans)
    other = json.loads(json.dumps(document))
    other["resourceSpans"][0]["resource"]["attributes"] = [
        {"key": "deployment.environment.name", "value": {"stringValue": "public"}},
    ]
    report = replay(
        [*parse_request(json.dumps(document)), *parse_request(json.dumps(other))], "shadow"
    )
    assert {group: tally["spans"] for group, tally in report.groups.items()} == {
        (None, "9.9.9"): len(spans),
        ("public", None): len(spans),
    }


# -- the invariant checks themselves --------------------------------------------------------


def _span(admitted: Any) -> ReadableSpan:
    context = SpanContext(1, 2, is_remote=False)
    return ReadableSpan("tool_batch", context=context, attributes={"acp.batch.admitted": admitted})


def _observation(
    call_id: str, status: str = "error", execution: str | None = "error"
) -> Observation:
    return Observation(call_id, "run_shell", "native", status, execution, "exit_nonzero")


def _evaluation(
    observations: tuple[Observation, ...],
    *,
    kind: str = "tracked",
    value: str | None = "tracked",
    complete: bool = True,
    reliable: bool = True,
    ordinal: int = 1,
    action: GuardAction | None = None,
) -> BatchEvaluation:
    state = GuardState("tracking", None, 4, 1, ordinal, ordinal + 1, False)
    return BatchEvaluation(
        prompt_id="p",
        span=_span(len({o.call_id for o in observations})),
        mode="enforce",
        batch=Batch(complete, observations),
        has_external_input=False,
        has_queued_prompt=False,
        input_reliable=reliable,
        before=GuardState.initial(),
        decision=Decision(kind, state, None),  # type: ignore[arg-type]
        decision_value=value,  # type: ignore[arg-type]
        action=action,
    )


def test_a_counted_cancellation_is_a_violation() -> None:
    report = GuardReport("enforce")
    report.observe(_evaluation((_observation("a"), _observation("b", "cancelled", "not_started"))))
    assert report.violations["cancelled_counted"] == 1
    assert report.invariant_violations == 1


def test_counted_ineligible_outcomes_are_violations() -> None:
    report = GuardReport("enforce")
    for execution in ("not_started", "success", "unknown", None):
        report.observe(_evaluation((_observation("a"), _observation("b", "error", execution))))
    assert report.violations["ineligible_counted"] == 4


def test_a_decision_on_an_incomplete_batch_is_a_violation() -> None:
    report = GuardReport("enforce")
    report.observe(_evaluation((_observation("a"),), complete=False))
    report.observe(_evaluation((_observation("a"),), kind="reset", value="reset", complete=False))
    assert report.violations["incomplete_batch_decision"] == 1


def test_a_stop_after_an_unreliable_drain_is_a_violation() -> None:
    report = GuardReport("enforce")
    report.observe(_evaluation((_observation("a"),), kind="reset", value="reset", reliable=False))
    report.observe(_evaluation((_observation("b"),), kind="warn", value="warned"))
    report.observe(
        _evaluation(
            (_observation("c"),), kind="stop", value="stopped", action=GuardAction("stop", "x")
        )
    )
    assert report.violations["enforcement_after_unreliable_input"] == 1
    assert report.violations["stop_without_warning"] == 0


def test_a_stop_without_a_warning_for_the_same_candidate_is_a_violation() -> None:
    report = GuardReport("shadow")
    report.observe(_evaluation((_observation("a"),), kind="would_warn", value="would_warn"))
    report.observe(
        _evaluation((_observation("b"),), kind="would_stop", value="would_stop", ordinal=2)
    )
    assert report.violations["stop_without_warning"] == 1


def test_sensitive_fields_in_guard_telemetry_are_violations() -> None:
    report = GuardReport("shadow")
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(TelemetryAudit(report)))
    logger = provider.get_logger("otel_guard")
    logger.emit(event_name=TRANSITION_EVENT, attributes={"decision": "tracked", "prompt_id": "p"})
    assert report.invariant_violations == 0
    logger.emit(event_name=TRANSITION_EVENT, attributes={"gen_ai.tool.name": "run_shell"})
    logger.emit(event_name=TRANSITION_EVENT, attributes={"decision": "exploded"})
    logger.emit(event_name=TRANSITION_EVENT, attributes={"execution_error_type": "/etc/passwd"})
    logger.emit(event_name=TRANSITION_EVENT, body="raw error text")
    assert report.violations["sensitive_telemetry"] == 4
    provider.shutdown()


def test_the_replay_pipeline_audits_every_record_its_guard_emits() -> None:
    # The pipeline's logger audits records as emitted instead of building SDK records: it must
    # still see each one, as TelemetryAudit sees them, through the guard's own telemetry.
    pipeline = GuardPipeline("shadow", host=True)
    emit = pipeline.guard._telemetry._emit
    assert emit(TRANSITION_EVENT, {"decision": "tracked", "prompt_id": "p"}, None, 1, 1)
    assert pipeline.report.invariant_violations == 0
    emit(TRANSITION_EVENT, {"gen_ai.tool.name": "run_shell"}, None, 1, 1)
    emit(TRANSITION_EVENT, {"decision": "exploded"}, None, 1, 1)
    emit(TRANSITION_EVENT, {"execution_error_type": "/etc/passwd"}, None, 1, 1)
    emit("some.other.event", {"decision": "tracked"}, None, 1, 1)
    assert pipeline.report.violations["sensitive_telemetry"] == 4
    logger = pipeline.logger_provider.get_logger("otel_guard")
    logger.emit(event_name=TRANSITION_EVENT, body="raw error text")
    assert pipeline.report.violations["sensitive_telemetry"] == 5
    assert pipeline.close() is pipeline.report


# -- a prompt whose parent the input lacks ---------------------------------------------------------


def _genai_agent_under(parent: SpanContext) -> tuple[list[ReadableSpan], dict[str, int]]:
    """A GenAI agent whose prompt span is a child of ``parent``, run live through a guard: its
    spans and the live guard's decisions."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import NonRecordingSpan, Status, StatusCode, set_span_in_context

    seen: list[str] = []
    guard = GuardSpanProcessor(
        meter_provider=MeterProvider(),
        logger_provider=LoggerProvider(),
        listener=lambda evaluation: seen.append(evaluation.decision_value or "none"),
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(guard)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    prompt = {"gen_ai.operation.name": "invoke_agent"}
    with tracer.start_as_current_span(
        "invoke_agent", context=set_span_in_context(NonRecordingSpan(parent)), attributes=prompt
    ):
        for turn in range(4):
            with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
                pass
            for call in range(3):
                with tracer.start_as_current_span(
                    "execute_tool",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "run_shell",
                        "gen_ai.tool.call.id": f"call-{turn}-{call}",
                        "error.type": "exit_nonzero",
                    },
                ) as span:
                    span.set_status(Status(StatusCode.ERROR))
        with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
            pass
    counts = {value: seen.count(value) for value in set(seen) if value != "none"}
    return list(exporter.get_finished_spans()), counts


@pytest.mark.parametrize("flags", ["not remote", "no flags"])
def test_a_prompt_whose_parent_the_input_lacks_is_decided_as_live(flags: str) -> None:
    # Live, the caller's span arrives propagated (remote) and the prompt is decided. In the
    # file the parent is absent, and either marked local (lost on the way) or not marked at
    # all (a writer without the span flags' remote bits).
    remote = SpanContext(0x5EED, 0xCA11E2, is_remote=True, trace_flags=TraceFlags(1))  # sampled
    spans, live_counts = _genai_agent_under(remote)
    assert live_counts == {"tracked": 2, "would_warn": 1, "would_stop": 1}
    document = encode_request(spans)
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                if flags == "no flags":
                    span.pop("flags", None)
                elif span.get("parentSpanId"):
                    span["flags"] = int(span.get("flags", 0)) & ~0x200  # the parent said local
    recorded = parse_request(json.dumps(document))
    roots = [s for s in recorded if s.parent is not None and s.parent.span_id == 0xCA11E2]
    assert len(roots) == 1 and not roots[0].parent.is_remote  # as read: a local parent
    assert decisions(replay(recorded, "shadow")) == live_counts


def test_a_trace_replayed_in_parts_keeps_the_parents_of_its_later_parts() -> None:
    # The trace spans bound replays a trace in parts as read (children end, so are read, before
    # their parents): a parent not read yet is in a later part, not lost.
    remote = SpanContext(0x5EED, 0xCA11E2, is_remote=True, trace_flags=TraceFlags(1))
    spans, live_counts = _genai_agent_under(remote)
    for bound in (2, 5, 9, 17):
        recorded = parse_request(json.dumps(encode_request(spans)))
        assert decisions(replay(recorded, "shadow", max_trace_spans=bound)) == live_counts


def test_traces_with_lost_parents_replayed_at_the_open_traces_bound_are_decided() -> None:
    recorded: list[ReadableSpan] = []
    expected: dict[str, int] = {}
    for trace_id in (0x5EED, 0x5EEE, 0x5EEF):
        parent = SpanContext(trace_id, 0xCA11E2, is_remote=True, trace_flags=TraceFlags(1))
        spans, live_counts = _genai_agent_under(parent)
        document = encode_request(spans)
        for resource in document["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    span.pop("flags", None)
        recorded += parse_request(json.dumps(document))
        for value, count in live_counts.items():
            expected[value] = expected.get(value, 0) + count
    report = replay(recorded, "shadow", max_open_traces=1)
    assert report.bounds["open_traces"] == 2
    assert decisions(report) == expected
