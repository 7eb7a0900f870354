"""GuardSpanProcessor end to end through real SDK providers (docs/contract.md sections 3-5)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness, decisions_of
from opentelemetry.sdk._logs import LogRecordProcessor
from opentelemetry.trace import set_span_in_context

from otel_guard import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.guard.mode import MODE_ENV_VAR
from otel_guard.guard.telemetry import (
    DIAGNOSTIC_EVENT,
    DIAGNOSTICS_METRIC,
    LOOP_EVENT,
    METRIC_ATTRIBUTE_VALUES,
    OBSERVATIONS_METRIC,
    TRANSITION_EVENT,
    batch_count_bucket,
    failure_count_bucket,
)
from otel_guard.reducer import REMINDER, STOP_MESSAGE, GuardState


def run_loop(
    h: Harness, prompt_id: str, batches: int, take: bool = True
) -> list[GuardAction | None]:
    actions: list[GuardAction | None] = []
    for _ in range(batches):
        h.batch(prompt_id, [FAIL] * 4)
        actions.append(h.guard.take_action(prompt_id) if take else None)
    return actions


# -- modes and host actions ---------------------------------------------------------------------


def test_shadow_observes_without_actions() -> None:
    h = Harness(mode="shadow")
    h.start_prompt("p")
    actions = run_loop(h, "p", 5)
    assert actions == [None] * 5
    assert h.decision_counts() == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert decisions_of(h.logs(TRANSITION_EVENT)) == ["tracked", "would_warn", "would_stop"]
    assert h.logs(LOOP_EVENT) == []
    assert h.guard.state("p") == GuardState("latched", h.guard.state("p").key, 12, 3, 1, 2, False)  # type: ignore[union-attr]


def test_warn_reminds_exactly_once_per_candidate_and_never_stops() -> None:
    h = Harness(mode="warn")
    h.start_prompt("p")
    actions = run_loop(h, "p", 5)
    assert actions == [None, GuardAction("reminder", REMINDER), None, None, None]
    assert h.decision_counts() == {"tracked": 1, "warned": 1, "would_stop": 1}
    assert h.logs(LOOP_EVENT) == []


def test_warn_reminds_again_for_a_new_candidate_after_a_reset() -> None:
    h = Harness(mode="warn")
    actions = run_loop(h, "p", 2)
    h.batch("p", [OK])  # same tool succeeds: the candidate resets
    actions += run_loop(h, "p", 2)
    reminder = GuardAction("reminder", REMINDER)
    assert actions == [None, reminder, None, reminder]
    transitions = h.logs(TRANSITION_EVENT)
    ordinals = [(r.log_record.attributes or {})["candidate_ordinal"] for r in transitions]
    assert decisions_of(transitions) == ["tracked", "warned", "reset", "tracked", "warned"]
    assert ordinals == [1, 1, 1, 2, 2]


def test_enforce_stops_after_the_reminder_was_taken_and_emits_the_loop_event_once() -> None:
    h = Harness(mode="enforce")
    h.start_prompt("p")
    actions = run_loop(h, "p", 4)
    assert actions == [
        None,
        GuardAction("reminder", REMINDER),
        GuardAction("stop", STOP_MESSAGE),
        None,
    ]
    assert h.decision_counts() == {"tracked": 1, "warned": 1, "stopped": 1}
    loops = h.logs(LOOP_EVENT)
    assert len(loops) == 1
    assert dict(loops[0].log_record.attributes or {}) == {
        "loop_type": "repeated_tool_execution_failure",
        "prompt_id": "p",
    }


def test_enforce_without_a_taken_reminder_records_would_stop_and_issues_no_stop() -> None:
    h = Harness(mode="enforce")
    h.start_prompt("p")
    actions = run_loop(h, "p", 3, take=False)
    assert actions == [None, None, None]
    assert h.guard.take_action("p") is None
    assert h.decision_counts() == {"tracked": 1, "warned": 1, "would_stop": 1}
    assert h.logs(LOOP_EVENT) == []


def test_take_action_returns_the_action_once() -> None:
    h = Harness(mode="warn")
    run_loop(h, "p", 2, take=False)
    assert h.guard.take_action("p") == GuardAction("reminder", REMINDER)
    assert h.guard.take_action("p") is None
    assert h.guard.take_action("unknown-prompt") is None


def test_an_action_not_taken_before_the_next_batch_is_dropped() -> None:
    h = Harness(mode="warn")
    run_loop(h, "p", 2, take=False)
    h.batch("p", [Call(tool="read_file", status="success", execution="success", error_type=None)])
    assert h.guard.take_action("p") is None


def test_queued_prompt_takes_precedence_over_enforcement() -> None:
    h = Harness(mode="enforce")
    assert run_loop(h, "p", 2)[-1] == GuardAction("reminder", REMINDER)
    h.batch("p", [FAIL] * 4, queued=True)
    assert h.guard.take_action("p") is None
    assert h.guard.state("p").phase == "idle"  # type: ignore[union-attr]
    last = h.logs(TRANSITION_EVENT)[-1].log_record.attributes or {}
    assert last["decision"] == "reset" and last["reset_reason"] == "queued_prompt"


def test_cancellation_takes_precedence_over_enforcement() -> None:
    h = Harness(mode="enforce")
    run_loop(h, "p", 2)
    h.batch("p", [FAIL, FAIL, Call(status="cancelled", execution="error")])
    assert h.guard.take_action("p") is None
    last = h.logs(TRANSITION_EVENT)[-1].log_record.attributes or {}
    assert last["reset_reason"] == "cancelled"
    assert h.logs(LOOP_EVENT) == []


def test_external_input_resets() -> None:
    h = Harness(mode="enforce")
    run_loop(h, "p", 2)
    h.batch("p", [FAIL] * 4, external=True)
    last = h.logs(TRANSITION_EVENT)[-1].log_record.attributes or {}
    assert last["reset_reason"] == "external_input"


def test_unreliable_host_downgrades_through_unreliable_input_once() -> None:
    h = Harness(mode="enforce")
    h.start_prompt("p")
    for _ in range(3):
        h.batch("p", [FAIL] * 4, reliable=None)  # the drain result is missing: unreliable
    assert decisions_of(h.logs(TRANSITION_EVENT)) == ["reset"]
    first = h.logs(TRANSITION_EVENT)[0].log_record.attributes or {}
    assert first["reset_reason"] == "unreliable_input"
    assert first["mode"] == "warn"
    # The host becomes reliable again: the guard tracks, but enforce stays downgraded to warn.
    actions = run_loop(h, "p", 3)
    assert actions == [None, GuardAction("reminder", REMINDER), None]
    assert decisions_of(h.logs(TRANSITION_EVENT))[1:] == ["tracked", "warned", "would_stop"]
    assert {(r.log_record.attributes or {})["mode"] for r in h.logs(TRANSITION_EVENT)} == {"warn"}


def test_wrongly_typed_reliable_flag_is_missing() -> None:
    h = Harness(mode="shadow")
    h.batch("p", [FAIL], reliable="true")
    attributes = h.logs(TRANSITION_EVENT)[0].log_record.attributes or {}
    assert attributes["reset_reason"] == "unreliable_input"


# -- routing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "channel"),
    [
        (None, True),
        ("channel", None),
        ("cron", None),
        ("notification", None),
        ("background", None),
        ("subagent", None),
        ("continuation", None),
    ],
)
@pytest.mark.parametrize("marker_on", ["prompt", "batch"])
def test_channel_and_non_interactive_prompts_emit_nothing(
    route: str | None, channel: bool | None, marker_on: str
) -> None:
    h = Harness(mode="enforce")
    markers: dict[str, Any] = {}
    if route is not None:
        markers["acp.prompt.route"] = route
    if channel is not None:
        markers["acp.prompt.channel"] = channel
    if marker_on == "prompt":
        prompt = h.start_prompt("p", route=route, channel=channel)
        actions = [
            (h.batch("p", [FAIL] * 4, parent=prompt), h.guard.take_action("p"))[1] for _ in range(4)
        ]
    else:
        actions = [
            (h.batch("p", [FAIL] * 4, batch_attributes=markers), h.guard.take_action("p"))[1]
            for _ in range(4)
        ]
    assert actions == [None] * 4
    assert h.points() == []
    assert h.logs() == []


@pytest.mark.parametrize("marker_on", ["prompt", "batch start", "batch end"])
def test_late_and_overflowing_calls_of_an_opted_out_prompt_emit_nothing(marker_on: str) -> None:
    # Section 3: every prompt that is not interactive is off, "no telemetry at all"; the
    # diagnostics of its batches (a late frame, too many calls) are no exception.
    h = Harness(mode="enforce", max_calls_per_batch=2)
    marker = {"acp.prompt.route": "cron"}
    prompt = h.start_prompt("p", route="cron") if marker_on == "prompt" else None
    at_start = marker if marker_on == "batch start" else None
    at_end = marker if marker_on == "batch end" else None
    h.batch("p", [FAIL] * 2, parent=prompt, batch_attributes=at_start, end_attributes=at_end)
    late = h.batch("p", [FAIL] * 2, parent=prompt, batch_attributes=at_start, leave_open=1)
    late[0].end()  # a late frame of an opted-out batch
    h.batch("p", [FAIL] * 3, parent=prompt, batch_attributes=at_start, admitted=3)  # overflows
    assert h.guard.take_action("p") is None
    assert h.points() == [] and h.points(DIAGNOSTICS_METRIC) == []
    assert h.points(OBSERVATIONS_METRIC) == []
    assert h.logs() == []
    assert h.guard.diagnostics() == {}


@pytest.mark.parametrize("marker_on", ["prompt", "batch start"])
def test_an_opted_out_prompt_with_a_long_id_emits_nothing(marker_on: str) -> None:
    h = Harness(mode="enforce")
    long_id = "p" * 300  # over the bound: kept as its digest
    marker = {"acp.prompt.channel": True}
    prompt = h.start_prompt(long_id, channel=True) if marker_on == "prompt" else None
    at_start = marker if marker_on == "batch start" else None
    for _ in range(3):
        h.batch(long_id, [FAIL] * 4, parent=prompt, batch_attributes=at_start)
    assert h.guard.take_action(long_id) is None
    assert h.points(DIAGNOSTICS_METRIC) == [] and h.logs() == []
    assert h.guard.diagnostics() == {}


def test_an_open_batch_of_an_opted_out_prompt_dropped_to_a_bound_gives_no_diagnostic() -> None:
    h = Harness(mode="shadow", max_prompts=1, max_calls_per_batch=1)  # 5 open spans at most
    off = h.tracer.start_span(
        "tool_batch", attributes={"acp.prompt.id": "off", "acp.prompt.route": "notification"}
    )
    h.tool_span(FAIL, set_span_in_context(off)).end()
    for i in range(5):  # never end: the first of them pushes the opted-out batch out
        h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"x{i}"})
    # An off prompt gets no telemetry at all (docs/contract.md section 3), diagnostics included.
    assert h.guard.diagnostics() == {}
    assert h.logs(DIAGNOSTIC_EVENT) == [] and h.points(DIAGNOSTICS_METRIC) == []
    # The same bound on a guarded prompt's batch is counted and named.
    h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "x5"})
    assert h.guard.diagnostics() == {"evicted": 1}
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert dict(record.log_record.attributes or {}) == {"diagnostic": "evicted", "prompt_id": "x0"}


def test_interactive_prompt_with_explicit_route_is_guarded() -> None:
    h = Harness(mode="shadow")
    h.start_prompt("p", route="interactive", channel=False)
    run_loop(h, "p", 2)
    assert h.decision_counts() == {"tracked": 1, "would_warn": 1}


def test_mode_off_emits_nothing() -> None:
    h = Harness(mode="off")
    h.start_prompt("p")
    assert run_loop(h, "p", 4) == [None] * 4
    assert h.points() == [] and h.logs() == []
    assert h.guard.state("p") is None


# -- prompt lifecycle ----------------------------------------------------------------------------


def test_prompt_end_discards_state_and_pending_action_and_the_id_starts_fresh() -> None:
    h = Harness(mode="warn")
    prompt = h.start_prompt("p")
    run_loop(h, "p", 2, take=False)
    prompt.end()
    assert h.guard.state("p") is None
    assert h.guard.take_action("p") is None
    h.start_prompt("p")
    h.batch("p", [FAIL] * 4)
    state = h.guard.state("p")
    assert state is not None and state.candidate_ordinal == 1 and state.failure_count == 4


# -- batch assembly ------------------------------------------------------------------------------


def evaluations(h_kwargs: dict[str, Any] | None = None) -> tuple[Harness, list[BatchEvaluation]]:
    seen: list[BatchEvaluation] = []
    h = Harness(listener=seen.append, **(h_kwargs or {}))
    return h, seen


def test_late_tool_span_is_a_diagnostic_and_its_batch_is_incomplete() -> None:
    h, seen = evaluations()
    run_loop(h, "p", 1)
    late = h.batch("p", [FAIL] * 4, admitted=4, leave_open=1)
    assert seen[-1].batch.complete is False
    assert seen[-1].decision.reason == "incomplete"
    late[0].end()
    assert h.guard.diagnostics() == {"late_span": 1}
    assert h.diagnostic_counts() == {"late_span": 1}
    assert len(seen) == 2  # the late frame is not an observation


def test_complete_only_when_distinct_call_ids_equal_admitted() -> None:
    h, seen = evaluations()
    h.batch("p", [FAIL, FAIL], admitted=3)
    h.batch("p", [FAIL, FAIL], admitted=2)
    assert [e.batch.complete for e in seen] == [False, True]


def test_malformed_admitted_count_makes_the_batch_incomplete() -> None:
    h, seen = evaluations()
    for admitted in ("2", -1, 2.0, True):
        h.batch("p", [FAIL, FAIL], admitted=admitted)
    assert [e.batch.complete for e in seen] == [False] * 4


def test_repeated_frame_for_a_call_id_is_ignored() -> None:
    h, seen = evaluations()
    h.batch("p", [Call(call_id="a"), Call(call_id="a"), Call(call_id="b")], admitted=2)
    assert [o.call_id for o in seen[0].batch.observations] == ["a", "b"]
    assert seen[0].batch.complete is True
    assert h.guard.diagnostics() == {"duplicate_span": 1}


def test_of_two_frames_with_one_call_id_the_first_to_end_is_kept() -> None:
    # docs/contract.md section 3: "A second terminal span for a call ID already seen is
    # ignored": the guard sees a call when its span ends, so the second is the later to end,
    # wherever it started.
    from opentelemetry.trace import set_span_in_context

    h, seen = evaluations()
    batch_span = h.tracer.start_span("batch", attributes={"acp.prompt.id": "p"})
    ctx = set_span_in_context(batch_span)
    first = h.tool_span(Call(call_id="a", error_type="timeout"), ctx)
    second = h.tool_span(Call(call_id="a", error_type="exit_nonzero"), ctx)
    second.end()  # the later-started frame settles first
    first.end()
    batch_span.set_attributes({"acp.batch.admitted": 1, "acp.input.reliable": True})
    batch_span.end()
    assert [o.execution_error_type for o in seen[0].batch.observations] == ["exit_nonzero"]
    assert seen[0].batch.complete is True
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert record.log_record.attributes is not None
    assert record.log_record.attributes["diagnostic"] == "duplicate_span"
    assert record.log_record.span_id == first.get_span_context().span_id


def test_provider_duplicates_are_not_counted_by_the_observations_counter() -> None:
    # A duplicate provider event is no execution (section 2 drops it): the execution SLI's
    # denominator counts the call once.
    h = Harness()
    h.batch("p", [Call(call_id="a"), Call(call_id="a", duplicate=True), OK], admitted=2)
    counts = {
        (str(attributes["execution_status"]), str(attributes["tool_type"])): value
        for attributes, value in h.points(OBSERVATIONS_METRIC)
    }
    assert counts == {("error", "native"): 1, ("success", "native"): 1}


def test_provider_duplicates_are_observed_but_not_counted_for_completeness() -> None:
    h, seen = evaluations()
    h.batch("p", [Call(call_id="a"), Call(call_id="a", duplicate=True)], admitted=1)
    batch = seen[0].batch
    assert batch.complete is True
    assert [o.provider_duplicate for o in batch.observations] == [False, True]
    assert seen[0].decision.state.failure_count == 1


def test_observations_are_kept_in_call_start_order() -> None:
    h, seen = evaluations()
    batch_span = h.tracer.start_span("batch", attributes={"acp.prompt.id": "p"})
    from opentelemetry.trace import set_span_in_context

    ctx = set_span_in_context(batch_span)
    spans = [h.tool_span(Call(call_id=f"c{i}"), ctx) for i in range(5)]
    for span in reversed(spans):  # settle in the opposite order
        span.end()
    batch_span.set_attributes({"acp.batch.admitted": 5, "acp.input.reliable": True})
    batch_span.end()
    assert [o.call_id for o in seen[0].batch.observations] == ["c0", "c1", "c2", "c3", "c4"]


def test_orphan_tool_spans_and_grandchildren_are_ignored() -> None:
    h, seen = evaluations()
    from opentelemetry.trace import set_span_in_context

    h.tool_span(FAIL, None).end()  # no parent at all
    batch_span = h.tracer.start_span("batch", attributes={"acp.prompt.id": "p"})
    wrapper = h.tracer.start_span("wrapper", context=set_span_in_context(batch_span))
    h.tool_span(FAIL, set_span_in_context(wrapper)).end()  # not a direct child
    wrapper.end()
    batch_span.set_attributes({"acp.batch.admitted": 0, "acp.input.reliable": True})
    batch_span.end()
    assert seen[0].batch.observations == ()
    assert seen[0].decision.kind == "none"


def test_span_with_prompt_id_but_no_admitted_count_is_not_a_batch() -> None:
    h, seen = evaluations()
    from opentelemetry.trace import set_span_in_context

    span = h.tracer.start_span("chat", attributes={"acp.prompt.id": "p"})
    h.tool_span(FAIL, set_span_in_context(span)).end()
    span.end()
    assert seen == []
    assert h.points() == []
    assert h.guard.diagnostics() == {}


def test_tool_call_without_call_id_makes_the_batch_incomplete() -> None:
    h, seen = evaluations()
    h.batch("p", [Call(extra={"gen_ai.tool.call.id": 7})], admitted=1)
    assert seen[0].batch.complete is False


def test_batch_over_max_calls_is_incomplete_with_a_diagnostic() -> None:
    h, seen = evaluations({"max_calls_per_batch": 3})
    h.batch("p", [FAIL] * 5, admitted=5)
    assert seen[0].batch.complete is False
    assert h.guard.diagnostics() == {"batch_overflow": 1}


# -- telemetry -----------------------------------------------------------------------------------


def test_metric_attributes_come_from_the_closed_sets_only() -> None:
    h = Harness(mode="enforce")
    run_loop(h, "p", 4)
    h.batch("q", [FAIL] * 4)
    h.batch("q", [Call(status="error", execution="not_started")])
    h.batch("r", [FAIL, Call(tool="other")])
    for attributes, _ in h.points():
        for key, value in attributes.items():
            assert value in METRIC_ATTRIBUTE_VALUES[key], (key, value)


def test_transition_logs_carry_exactly_the_specified_attributes() -> None:
    h = Harness(mode="enforce")
    run_loop(h, "p", 1)
    h.batch("p", [OK])
    tracked, reset = (dict(r.log_record.attributes or {}) for r in h.logs(TRANSITION_EVENT))
    assert tracked == {
        "route": "acp_foreground",
        "mode": "enforce",
        "phase_before": "idle",
        "phase_after": "tracking",
        "decision": "tracked",
        "failure_count_bucket": "3-4",
        "batch_count_bucket": "1",
        "terminal_status": "error",
        "execution_status": "error",
        "tool_type": "native",
        "prompt_id": "p",
        "candidate_ordinal": 1,
        "execution_error_type": "exit_nonzero",
    }
    # A reset describes the candidate just reset.
    assert reset == {
        "route": "acp_foreground",
        "mode": "enforce",
        "phase_before": "tracking",
        "phase_after": "idle",
        "decision": "reset",
        "failure_count_bucket": "3-4",
        "batch_count_bucket": "1",
        "reset_reason": "success",
        "prompt_id": "p",
        "candidate_ordinal": 1,
    }
    for record in h.logs(TRANSITION_EVENT):
        assert record.log_record.severity_text == "INFO"
        assert record.log_record.body is None


def test_counter_and_logs_match_one_to_one() -> None:
    h = Harness(mode="warn")
    run_loop(h, "p", 3)
    h.batch("p", [FAIL], external=True)
    logged = decisions_of(h.logs(TRANSITION_EVENT))
    counted = h.decision_counts()
    assert sum(counted.values()) == len(logged)
    assert {d: logged.count(d) for d in set(logged)} == counted


def test_log_records_carry_the_batch_span_trace_context() -> None:
    h = Harness(mode="enforce")
    run_loop(h, "p", 3)
    batch_spans = [s for s in h.span_exporter.get_finished_spans() if s.name == "tool_batch"]
    records = h.logs(TRANSITION_EVENT) + h.logs(LOOP_EVENT)
    assert len(records) == 4
    by_span = {s.context.span_id: s.context.trace_id for s in batch_spans}  # type: ignore[union-attr]
    for record in records:
        assert record.log_record.span_id in by_span
        assert by_span[record.log_record.span_id] == record.log_record.trace_id
    loop = h.logs(LOOP_EVENT)[0].log_record
    stopped = h.logs(TRANSITION_EVENT)[-1].log_record
    assert (loop.trace_id, loop.span_id) == (stopped.trace_id, stopped.span_id)
    assert batch_spans[-1].context.span_id == loop.span_id  # type: ignore[union-attr]


def test_resource_attributes_are_never_copied_into_guard_attributes() -> None:
    h = Harness(mode="shadow")
    run_loop(h, "p", 3)
    for record in h.logs():
        assert not set(record.log_record.attributes or {}) & {"service.version", "service.name"}
    for attributes, _ in h.points():
        assert "service.version" not in attributes


def test_no_tool_name_in_any_guard_telemetry() -> None:
    h = Harness(mode="enforce")
    secret = "tool-name-canary-1234"
    for _ in range(3):
        h.batch("p", [Call(tool=secret)] * 4)
        h.guard.take_action("p")
    assert h.decision_counts() == {"tracked": 1, "warned": 1, "stopped": 1}
    assert secret not in repr(h.points())
    assert secret not in repr([dict(r.log_record.attributes or {}) for r in h.logs()])


@pytest.mark.parametrize(
    ("count", "bucket"),
    [(0, "0"), (1, "1-2"), (2, "1-2"), (3, "3-4"), (4, "3-4"), (5, "5-7"), (7, "5-7"), (8, "8+"),
     (100, "8+")],
)  # fmt: skip
def test_failure_count_buckets(count: int, bucket: str) -> None:
    assert failure_count_bucket(count) == bucket


@pytest.mark.parametrize(("count", "bucket"), [(0, "0"), (1, "1"), (2, "2"), (3, "3+"), (9, "3+")])
def test_batch_count_buckets(count: int, bucket: str) -> None:
    assert batch_count_bucket(count) == bucket


# -- configuration -------------------------------------------------------------------------------


def test_invalid_mode_gives_shadow_and_one_diagnostic_without_the_raw_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, "enforce-please-canary")
    h = Harness(mode=None)
    assert h.guard.mode == "shadow"
    assert h.diagnostic_counts() == {"invalid_mode": 1}
    records = h.logs(DIAGNOSTIC_EVENT)
    assert [dict(r.log_record.attributes or {}) for r in records] == [
        {"diagnostic": "invalid_mode"}
    ]
    assert "canary" not in repr(h.points())


def test_mode_is_read_from_the_environment_once_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, " Enforce ")
    h = Harness(mode=None)
    monkeypatch.setenv(MODE_ENV_VAR, "off")
    assert h.guard.mode == "enforce"
    assert run_loop(h, "p", 3)[-1] == GuardAction("stop", STOP_MESSAGE)


def test_explicit_mode_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, "enforce")
    assert GuardSpanProcessor(mode="warn").mode == "warn"


def test_missing_mode_is_shadow_without_diagnostic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODE_ENV_VAR, raising=False)
    h = Harness(mode=None)
    assert h.guard.mode == "shadow"
    assert h.diagnostic_counts() == {}


class ThreadRecorder(LogRecordProcessor):
    """Notes the thread each guard record is emitted on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.emitted = threading.Event()

    def on_emit(self, log_record: Any) -> None:
        self.threads.append(threading.current_thread().name)
        self.emitted.set()

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_by_default_guard_records_are_emitted_off_the_agents_thread() -> None:
    recorder = ThreadRecorder()
    h = Harness(mode="shadow")  # background telemetry is the default
    h.logger_provider.add_log_record_processor(recorder)
    h.batch("p", [FAIL] * 4)  # a transition, handed to the worker
    assert recorder.emitted.wait(5.0)
    assert recorder.threads == ["otel_guard telemetry"]
    h.guard.shutdown()


def test_without_background_telemetry_guard_records_are_emitted_on_the_agents_thread() -> None:
    recorder = ThreadRecorder()
    h = Harness(mode="shadow", background_telemetry=False)
    h.logger_provider.add_log_record_processor(recorder)
    h.batch("p", [FAIL] * 4)  # a transition, emitted before span.end() returns
    assert recorder.emitted.is_set()
    assert recorder.threads == [threading.current_thread().name]
    h.guard.shutdown()


def test_invalid_bounds_are_rejected_at_construction() -> None:
    for kwargs in ({"max_prompts": 0}, {"prompt_ttl_seconds": 0}, {"max_calls_per_batch": 0}):
        with pytest.raises(ValueError):
            GuardSpanProcessor(mode="shadow", **kwargs)  # type: ignore[arg-type]


def test_shutdown_is_idempotent_and_stops_observing() -> None:
    h = Harness(mode="warn")
    run_loop(h, "p", 1)
    assert h.guard.force_flush() is True
    h.guard.shutdown()
    h.guard.shutdown()
    run_loop(h, "p", 2)
    assert h.guard.state("p") is None
    assert h.decision_counts() == {"tracked": 1}
    h.tracer_provider.shutdown()


def test_calls_are_read_in_start_order_and_ties_in_the_order_they_ended() -> None:
    seen: list[tuple[str, ...]] = []
    h = Harness(
        mode="shadow",
        listener=lambda e: seen.append(tuple(o.call_id for o in e.batch.observations)),
    )
    batch = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "p"})
    context = set_span_in_context(batch)
    for call_id, start in (("c30", 30), ("tie-b", 5), ("c10", 10), ("tie-a", 5), ("c20", 20)):
        h.tracer.start_span(
            "execute_tool",
            context=context,
            start_time=start,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.name": "run_shell",
                "acp.tool.status": "success",
                "acp.tool.execution.status": "success",
            },
        ).end(end_time=100)
    batch.set_attributes({"acp.batch.admitted": 5, "acp.input.reliable": True})
    batch.end()
    assert seen == [("tie-b", "tie-a", "c10", "c20", "c30")]
