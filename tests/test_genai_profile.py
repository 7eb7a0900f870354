"""The GenAI-conventions profile: agents traced without acp.* attributes (contract section 3b)."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness import OK, Harness, decisions_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from otel_guard import BatchEvaluation
from otel_guard.cli import main
from otel_guard.guard.telemetry import (
    DECISIONS_METRIC,
    DIAGNOSTIC_EVENT,
    OBSERVATIONS_METRIC,
    TRANSITION_EVENT,
)
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter
from otel_guard.spans.assembly import _MAX_EARLY_LINKS


class Agent:
    """Writes spans as a GenAI-instrumented framework does: no batch span, no acp.* keys."""

    def __init__(self, mode: str = "shadow", **guard_kwargs: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        self.harness = Harness(mode=mode, listener=self.evaluations.append, **guard_kwargs)
        self.tracer = self.harness.tracer
        self._ids = itertools.count(1)  # next() is atomic: threads may share one agent

    @contextmanager
    def prompt(
        self, conversation: str | None = "conv-1", parent: Span | None = None
    ) -> Iterator[Span]:
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent"}
        if conversation is not None:
            attributes["gen_ai.conversation.id"] = conversation
        span = self.tracer.start_span(
            "invoke_agent agent",
            context=None if parent is None else set_span_in_context(parent),
            attributes=attributes,
        )
        try:
            yield span
        finally:
            span.end()

    def span(self, parent: Span, name: str, attributes: Mapping[str, Any] | None = None) -> Span:
        return self.tracer.start_span(
            name, context=set_span_in_context(parent), attributes=dict(attributes or {})
        )

    def chat(self, parent: Span) -> None:
        self.span(parent, "chat model", {"gen_ai.operation.name": "chat"}).end()

    def start_tool(
        self,
        parent: Span,
        tool: str = "run_shell",
        extra: Mapping[str, Any] | None = None,
        operation: str | None = "execute_tool",
    ) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"call-{next(self._ids)}",
            **(extra or {}),
        }
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
        return self.span(parent, f"execute_tool {tool}", attributes)

    def tool(
        self,
        parent: Span,
        *,
        error_type: str | None = "TimeoutError",
        fail: bool = True,
        tool: str = "run_shell",
        extra: Mapping[str, Any] | None = None,
        operation: str | None = "execute_tool",
    ) -> None:
        span = self.start_tool(parent, tool, extra, operation)
        if fail:
            if error_type is not None:
                span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, "free text"))
        span.end()

    def turn(self, parent: Span, width: int = 4, **tool: Any) -> None:
        """One model call, then its tool calls."""
        self.chat(parent)
        for _ in range(width):
            self.tool(parent, **tool)

    def kinds(self) -> list[str]:
        return [e.decision.kind for e in self.evaluations]


def test_failing_turns_are_tracked_warned_and_would_stop_like_batch_spans() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)  # the model gives up: settles the third batch
    assert agent.kinds() == ["tracked", "would_warn", "would_stop"]
    assert {e.profile for e in agent.evaluations} == {"genai"}
    assert all(e.batch.complete for e in agent.evaluations)
    records = agent.harness.logs(TRANSITION_EVENT)
    assert decisions_of(records) == ["tracked", "would_warn", "would_stop"]
    attributes = dict(records[0].log_record.attributes or {})
    assert attributes["prompt_id"] == "conv-1"
    assert attributes["execution_error_type"] == "timeouterror"
    assert attributes["mode"] == "shadow"
    assert attributes["tool_type"] == "native"


def test_prompt_id_is_the_span_id_in_hex_without_a_conversation_id() -> None:
    agent = Agent()
    with agent.prompt(conversation=None) as prompt:
        agent.turn(prompt)
    assert agent.evaluations[0].prompt_id == f"{prompt.get_span_context().span_id:016x}"
    assert len(agent.evaluations[0].prompt_id) == 16


def test_the_last_batch_settles_when_the_prompt_span_ends() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.turn(prompt)
        assert agent.evaluations == []
    assert agent.kinds() == ["tracked"]
    assert agent.evaluations[0].span is not None
    assert agent.evaluations[0].span.name == "invoke_agent agent"


def test_a_turn_without_tool_calls_is_not_a_batch() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.chat(prompt)
        agent.chat(prompt)
    assert agent.evaluations == []
    assert agent.harness.guard.genai_coverage().model_calls == 2


def test_never_enforced_reminders_at_most_and_no_stop() -> None:
    agent = Agent(mode="enforce")
    with agent.prompt() as prompt:
        for _ in range(4):
            agent.turn(prompt)
            agent.chat(prompt)
    assert agent.harness.decision_counts() == {"tracked": 1, "warned": 1, "would_stop": 1}
    # Decided when the prompt span ended (its classification is read from ended spans): the
    # reminder is the warn decision's action, never a stop, and no host is left to take it.
    actions = [e.action.kind if e.action else None for e in agent.evaluations]
    assert actions == [None, "reminder", None, None]
    assert agent.harness.guard.take_action("conv-1") is None
    modes = {a["mode"] for a, _ in agent.harness.points(DECISIONS_METRIC)}
    assert modes == {"warn"}
    assert {
        (e.input_reliable, e.has_external_input, e.has_queued_prompt) for e in agent.evaluations
    } == {(True, False, False)}


def test_a_tool_span_still_open_at_the_next_model_call_makes_its_batch_incomplete() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.turn(prompt)
        agent.chat(prompt)
        agent.tool(prompt)
        slow = agent.start_tool(prompt)
        agent.chat(prompt)
        slow.end()
    assert agent.kinds() == ["tracked", "reset"]
    assert agent.evaluations[1].decision.reason == "incomplete"
    assert agent.evaluations[1].batch.complete is False
    assert agent.harness.guard.diagnostics().get("late_span") == 1


def test_status_error_without_a_type_is_unknown_and_never_counts() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        for _ in range(3):
            agent.turn(prompt, error_type=None)
    assert [o.execution_error_type for o in agent.evaluations[0].batch.observations] == [None] * 4
    assert agent.harness.decision_counts() == {}  # idle, already disabled: nothing to reset


def test_the_exception_events_type_stands_in_for_a_missing_error_type() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.chat(prompt)
        span = agent.start_tool(prompt)
        span.record_exception(PermissionError("/secret/path"))
        span.set_status(Status(StatusCode.ERROR))
        span.end()
    observation = agent.evaluations[0].batch.observations[0]
    assert observation.execution_error_type == "permissionerror"
    assert agent.kinds() == ["tracked"]


def test_error_type_alone_is_an_error_and_success_otherwise() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.chat(prompt)
        span = agent.start_tool(prompt)
        span.set_attribute("error.type", "Rate_Limited")
        span.end()
        agent.tool(prompt, fail=False, tool="read_file")
    first, second = agent.evaluations[0].batch.observations
    assert (first.terminal_status, first.execution_error_type) == ("error", "rate_limited")
    assert (second.terminal_status, second.execution_status) == ("success", "success")


def test_a_span_with_any_mcp_attribute_is_an_mcp_tool() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.turn(prompt, extra={"mcp.method.name": "tools/call"})
    assert {o.tool_type for o in agent.evaluations[0].batch.observations} == {"mcp"}
    assert agent.harness.points(DECISIONS_METRIC)[0][0]["tool_type"] == "mcp"


def test_a_tool_named_only_by_tool_name_and_call_id_is_a_tool_call() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.turn(prompt, operation=None)
        agent.turn(prompt, operation="tool")
    assert [len(e.batch.observations) for e in agent.evaluations] == [4, 4]


def test_tool_calls_below_intermediate_spans_find_their_prompt() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.chat(prompt)
        running = agent.span(prompt, "running tools")
        for _ in range(4):
            agent.tool(running)
        running.end()
    assert len(agent.evaluations[0].batch.observations) == 4


def test_the_outermost_of_nested_prompts_owns_their_calls() -> None:
    agent = Agent()
    with agent.prompt("outer") as outer:
        agent.chat(outer)
        delegate = agent.start_tool(outer, "ask_helper")
        with agent.prompt("inner", parent=delegate) as inner:
            agent.turn(inner, width=3)
        delegate.end()
    # One prompt: the delegating call was still running when the inner model call started (its
    # batch is incomplete, the call late); the inner calls settle when the outer prompt ends.
    assert [
        (e.prompt_id, len(e.batch.observations), e.batch.complete) for e in agent.evaluations
    ] == [
        ("outer", 0, False),
        ("outer", 3, True),
    ]
    assert agent.harness.guard.diagnostics() == {"late_span": 1}


@pytest.mark.parametrize("ends_first", ["step", "outer"])
def test_a_nested_prompt_span_that_outlives_its_parent_is_part_of_the_outer_prompt(
    ends_first: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The inner prompt span ends after the span it started in (a step span, or the outer
    # prompt span itself, below a request span): it is still nested, so one prompt decides.
    agent = Agent()
    request = agent.tracer.start_span("request")
    outer = agent.span(request, "invoke_agent outer", {"gen_ai.operation.name": "invoke_agent"})
    agent.chat(outer)  # the trace is watched from here: the step span's end leaves a link
    step = agent.span(outer, "step")
    inner = agent.span(
        step,
        "invoke_agent inner",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "inner"},
    )
    step.end()
    if ends_first == "outer":
        outer.end()
    for _ in range(3):
        agent.turn(inner)
    agent.chat(inner)
    inner.end()
    if ends_first == "step":
        outer.end()
    request.end()
    assert agent.harness.guard.genai_coverage().prompts == 1
    assert agent.harness.decision_counts() == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert {e.prompt_id for e in agent.evaluations} == {f"{outer.get_span_context().span_id:016x}"}
    _, report, _ = _replay(capsys, _write(agent, tmp_path / "outliving.jsonl"))
    assert report["prompts"] == 1 and report["invariant_violations"] == 0
    assert {k: v for k, v in report["decisions"].items() if v} == agent.harness.decision_counts()


def test_spans_with_acp_attributes_follow_section_3_even_below_a_genai_prompt() -> None:
    agent = Agent()
    harness = agent.harness
    with agent.prompt() as outer:
        span = harness.tracer.start_span(
            "invoke_agent",
            context=set_span_in_context(outer),
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "acp-1"},
        )
        agent.chat(span)  # the acp prompt's model call: not the GenAI prompt's
        harness.failing_batches("acp-1", 2)
        agent.tool(outer, extra={"acp.tool.type": "native"})
        span.end()
    assert [(e.prompt_id, e.profile) for e in agent.evaluations] == [
        ("acp-1", "acp"),
        ("acp-1", "acp"),
    ]


def test_a_genai_prompt_with_an_acp_prompt_child_is_handed_over_to_section_3() -> None:
    agent = Agent()
    harness = agent.harness
    with agent.prompt() as outer:
        acp = harness.tracer.start_span(
            "invoke_agent",
            context=set_span_in_context(outer),
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "acp-1"},
        )
        assert harness.guard.state("conv-1") is None  # the GenAI reading stepped aside
        for _ in range(3):
            agent.turn(outer)  # the framework's own spans, below its own run span
        harness.failing_batches("acp-1", 1)
        acp.end()
    assert [(e.prompt_id, e.profile) for e in agent.evaluations] == [("acp-1", "acp")]
    assert harness.guard.diagnostics() == {}
    assert harness.guard._genai_open == {}


@pytest.mark.parametrize("root", ["plain", "section 3 prompt"])
def test_a_genai_prompt_below_a_section_3_prompt_span_is_section_3s(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The framework's own run span inside the integration's section 3 prompt span: the loop is
    # section 3's, wherever that prompt span sits in its trace (the Collector connector agrees).
    agent = Agent()
    acp = {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "acp-1"}
    top = agent.tracer.start_span("request") if root == "plain" else None
    section_3 = (
        agent.tracer.start_span("invoke_agent", attributes=acp)
        if top is None
        else agent.span(top, "invoke_agent", acp)
    )
    with agent.prompt(parent=section_3) as prompt:
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)
    section_3.end()
    if top is not None:
        top.end()
    assert agent.evaluations == [] and agent.harness.decision_counts() == {}
    _, report, _ = _replay(capsys, _write(agent, tmp_path / "below.jsonl"))
    assert not any(report["decisions"].values()) and report["invariant_violations"] == 0


def test_genai_tool_spans_below_a_section_3_batch_span_are_not_the_genai_prompts() -> None:
    # Tool spans of the framework's own below the integration's batch span are that batch's
    # (read as section 3 reads them: half-written), never observations of the GenAI prompt too.
    agent = Agent()
    with agent.prompt() as prompt:
        for _ in range(3):
            agent.chat(prompt)
            batch = agent.span(
                prompt,
                "tools",
                {"acp.prompt.id": "acp-1", "acp.batch.admitted": 4, "acp.input.reliable": True},
            )
            for _ in range(4):
                agent.tool(batch)
            batch.end()
        agent.chat(prompt)
    assert {e.profile for e in agent.evaluations} == {"acp"}
    assert "tracked" not in agent.harness.decision_counts()
    assert agent.harness.diagnostic_counts() == {"missing_attribute": 12}


def test_a_genai_prompt_has_a_never_enforcing_state_from_its_start_to_its_end() -> None:
    agent = Agent(mode="enforce")
    guard = agent.harness.guard
    with agent.prompt() as prompt:
        agent.turn(prompt)
        agent.chat(prompt)
        assert guard.state("conv-1") is None  # nothing is read before the prompt span ends
    (evaluation,) = agent.evaluations
    assert evaluation.before.phase == "idle" and evaluation.before.enforcement_disabled
    assert evaluation.decision.state.phase == "tracking"
    assert guard.state("conv-1") is None
    assert guard.diagnostics() == {}


def test_a_genai_prompt_reusing_an_id_with_section_3_state_collides_without_evicting() -> None:
    agent = Agent(max_prompts=2)
    harness = agent.harness
    guard = harness.guard
    harness.batch("conv-1", [OK])  # a section 3 prompt with the GenAI prompt's ID, idle
    harness.batch("q", [OK])  # idle, more recently active
    with agent.prompt() as prompt:
        agent.turn(prompt)
    # Two profiles with one prompt ID: the ID's state is kept, never enforcing from now on.
    assert guard.diagnostics() == {"prompt_collision": 1}
    state = guard.state("conv-1")
    assert state is not None and state.enforcement_disabled
    assert guard.state("q") is not None


def test_a_genai_prompt_starting_at_capacity_evicts_the_least_recently_active_prompt() -> None:
    agent = Agent(max_prompts=1)
    harness = agent.harness
    harness.failing_batches("p", 1)
    with agent.prompt():
        assert harness.guard.diagnostics() == {}
    assert harness.guard.diagnostics() == {"evicted": 1}
    assert harness.guard.state("p") is None
    (record,) = harness.logs(DIAGNOSTIC_EVENT)
    assert dict(record.log_record.attributes or {}) == {"diagnostic": "evicted", "prompt_id": "p"}


def test_genai_observations_are_counted_and_transitions_carry_the_settling_span() -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        agent.chat(prompt)
        for _ in range(3):
            agent.tool(prompt)
        agent.tool(prompt, fail=False, tool="read_file")
        agent.tool(prompt, extra={"mcp.method.name": "tools/call"})
        settling = agent.tracer.start_span(
            "chat model",
            context=set_span_in_context(prompt),
            attributes={"gen_ai.operation.name": "chat"},
        )
        settling.end()
    points = sorted(
        (a["execution_status"], a["tool_type"], v)
        for a, v in agent.harness.points(OBSERVATIONS_METRIC)
    )
    assert points == [("error", "mcp", 1), ("error", "native", 3), ("success", "native", 1)]
    (record,) = agent.harness.logs(TRANSITION_EVENT)
    assert record.log_record.span_id == settling.get_span_context().span_id
    assert record.log_record.trace_id == settling.get_span_context().trace_id


def test_a_genai_prompt_sharing_its_id_with_an_opted_out_prompt_is_not_evaluated() -> None:
    agent = Agent()
    harness = agent.harness
    with agent.prompt() as prompt:
        harness.batch("conv-1", [OK], batch_attributes={"acp.prompt.route": "cron"})
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)
    assert agent.evaluations == []
    assert harness.points(DECISIONS_METRIC) == [] and harness.logs(TRANSITION_EVENT) == []
    # Two profiles with one ID collide; an opted-out prompt gets no telemetry at all.
    assert harness.guard.diagnostics() == {}
    assert harness.logs(DIAGNOSTIC_EVENT) == []


def test_mode_off_reads_no_genai_prompt() -> None:
    agent = Agent(mode="off")
    guard = agent.harness.guard
    with agent.prompt() as prompt:
        assert guard.state("conv-1") is None
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)
    assert agent.evaluations == [] and guard.genai_coverage().prompts == 0
    assert agent.harness.points() == [] and agent.harness.logs() == []


def test_a_genai_prompt_starting_after_shutdown_is_not_read() -> None:
    agent = Agent()
    guard = agent.harness.guard
    guard.shutdown()
    with agent.prompt() as prompt:
        agent.turn(prompt)
    assert agent.evaluations == [] and guard.genai_coverage().prompts == 0


def test_spans_outside_any_genai_prompt_leave_no_state() -> None:
    agent = Agent()
    root = agent.tracer.start_span("GET /")
    for _ in range(10):
        agent.span(root, "SELECT", {"db.system": "sqlite"}).end()
    agent.tool(root)  # an execute_tool span under no prompt: an orphan
    root.end()
    guard = agent.harness.guard
    assert guard._genai_open == {}
    assert guard.genai_coverage().orphan_tool_calls == 1
    with agent.prompt() as prompt:
        agent.turn(prompt)
    assert guard._genai_open == {}  # every open span's entry left with its span


def test_watched_traces_are_bounded_and_evicted_oldest_first() -> None:
    agent = Agent(max_prompts=1, max_calls_per_batch=4)
    bound = 4 * 1 + 4
    prompts = [agent.tracer.start_span("invoke_agent agent") for _ in range(bound + 3)]
    for prompt in prompts:
        agent.tool(prompt)  # watches the prompt's trace until its root ends
    assert len(agent.harness.guard._genai_open) == bound
    assert agent.harness.guard.diagnostics() == {"evicted": 3}
    for prompt in prompts:
        prompt.set_attribute("gen_ai.operation.name", "invoke_agent")
        prompt.end()
    # The evicted traces are never read in part; the others settle their prompt.
    assert len(agent.evaluations) == bound
    assert agent.harness.guard._genai_open == {}


def test_malformed_attribute_values_never_raise_from_span_end() -> None:
    agent = Agent()
    with agent.prompt(conversation=None) as prompt:
        prompt.set_attribute("gen_ai.conversation.id", "")
        agent.chat(prompt)
        agent.tool(prompt, error_type="x" * 300)
        span = agent.span(
            prompt,
            "weird",
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": 7},
        )
        span.set_attribute("gen_ai.tool.name", "")
        span.end()
    assert agent.harness.guard.diagnostics().get("internal_error") is None
    assert len(agent.evaluations) == 1


# -- replay ---------------------------------------------------------------------------------


def _write(agent: Agent, path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(agent.harness.span_exporter.get_finished_spans())
    return path


def _replay(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict[str, Any], str]:
    code = main(["replay", "--format", "json", str(path)])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _section_3_below_a_node(
    agent: Agent, node_ends_first: bool, beside: bool = False, flood: int = 0
) -> None:
    """OpenLLMetry's LangGraph run around the LangChain integration: ``invoke_agent LangGraph``,
    a nested ``LangGraph.workflow`` prompt span, a node span, and below it the integration's
    section 3 prompt span with its batch spans; the framework's own model and tool spans sit
    below the workflow span. ``node_ends_first``: the node span ends right after the section 3
    prompt span starts (before any span of the trace is claimed), else just after it ends.
    ``beside``: the node is a sibling of the GenAI prompt under a plain root span instead.
    ``flood``: so many node spans of other traces, none ever watched, end right after the node
    span (each leaves a link kept for when its trace is watched)."""
    harness = agent.harness
    root = harness.tracer.start_span("POST /run") if beside else None
    with agent.prompt(parent=root) as outer:
        workflow = agent.span(
            outer, "LangGraph.workflow", {"gen_ai.operation.name": "invoke_agent"}
        )
        node = agent.span(
            root if root is not None else workflow,
            "execute_task before_agent",
            {"gen_ai.operation.name": "execute_task"},
        )
        acp = harness.tracer.start_span(
            "invoke_agent",
            context=set_span_in_context(node),
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "acp-1"},
        )
        if node_ends_first:
            node.end()
        for number in range(flood):
            other = SpanContext(0xF100D << 64 | number, 0xF100D0 + number, False, TraceFlags(1))
            agent.span(
                NonRecordingSpan(other), "execute_task", {"gen_ai.operation.name": "x"}
            ).end()
        for _ in range(3):
            agent.turn(workflow)
            harness.failing_batches("acp-1", 1, parent=acp)
        acp.end()
        if not node_ends_first:
            node.end()
        workflow.end()
    if root is not None:
        root.end()


@pytest.mark.parametrize("node_ends_first", [True, False])
def test_a_genai_prompt_with_an_acp_prompt_below_it_is_handed_over_to_section_3(
    node_ends_first: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = Agent()
    _section_3_below_a_node(agent, node_ends_first)
    assert [(e.prompt_id, e.profile) for e in agent.evaluations] == [("acp-1", "acp")] * 3
    live = agent.harness.decision_counts()
    assert live == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert agent.harness.guard.diagnostics() == {}
    code, report, err = _replay(capsys, _write(agent, tmp_path / "below.jsonl"))
    assert code == 0 and err == ""
    assert report["profiles"] == {"acp": 1, "genai": 0, "openinference": 0}
    assert {k: v for k, v in report["decisions"].items() if v} == live


@pytest.mark.parametrize("pushed_out", [False, True])
def test_links_kept_before_their_trace_is_watched_are_bounded_oldest_trace_first(
    pushed_out: bool,
) -> None:
    # The node span's link is the oldest of _MAX_EARLY_LINKS kept links, or one too many: then
    # it is dropped, the section 3 prompt span is no longer found below the GenAI prompt, and
    # both profiles decide the loop (the price of the bound, never a wider action).
    agent = Agent()
    flood = _MAX_EARLY_LINKS - 1 + int(pushed_out)
    _section_3_below_a_node(agent, node_ends_first=True, flood=flood)
    profiles = sorted({e.profile for e in agent.evaluations})
    assert profiles == (["acp", "genai"] if pushed_out else ["acp"])
    assert agent.harness.guard.diagnostics() == {}


def test_an_acp_prompt_beside_a_genai_prompt_leaves_it_evaluated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = Agent()
    _section_3_below_a_node(agent, node_ends_first=False, beside=True)
    assert sorted({e.profile for e in agent.evaluations}) == ["acp", "genai"]
    live = agent.harness.decision_counts()
    code, report, err = _replay(capsys, _write(agent, tmp_path / "beside.jsonl"))
    assert code == 0 and err == ""
    assert report["profiles"] == {"acp": 1, "genai": 1, "openinference": 0}
    assert {k: v for k, v in report["decisions"].items() if v} == live


def test_replay_reads_genai_traces_with_the_live_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = Agent()
    with agent.prompt() as prompt:
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)
    code, report, err = _replay(capsys, _write(agent, tmp_path / "genai.jsonl"))
    assert code == 0 and err == ""
    assert report["profiles"] == {"acp": 0, "genai": 1, "openinference": 0}
    assert report["prompts"] == 1 and report["batches"] == 3
    live = agent.harness.decision_counts()
    assert {k: v for k, v in report["decisions"].items() if v} == live


def test_a_prompt_under_a_remote_parent_is_decided_live_and_in_replay_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An agent service called with a propagated traceparent: its prompt span is the local root.
    agent = Agent()
    caller = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1)
    )
    with agent.prompt(parent=NonRecordingSpan(caller)) as prompt:
        for _ in range(3):
            agent.turn(prompt)
        agent.chat(prompt)
    live = agent.harness.decision_counts()
    assert live == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    code, report, err = _replay(capsys, _write(agent, tmp_path / "remote.jsonl"))
    assert code == 0 and err == ""
    assert {k: v for k, v in report["decisions"].items() if v} == live
    assert report["invariant_violations"] == 0


def test_a_trace_entering_the_process_twice_gives_two_prompts_live_and_in_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A caller invokes the agent twice in one trace (each call a local root under a remote
    # parent); a tool of the first call ends after its prompt did: an orphan, nothing else.
    agent = Agent()
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    straggler = None
    for call in (1, 2):
        caller = SpanContext(trace_id, 0xF067AA0BA902B700 + call, True, TraceFlags(1))
        with agent.prompt(conversation=None, parent=NonRecordingSpan(caller)) as prompt:
            for _ in range(3):
                agent.turn(prompt)
            agent.chat(prompt)
            if straggler is None:
                straggler = agent.start_tool(prompt)
        if call == 1:
            straggler.end()
    live = agent.harness.decision_counts()
    assert live == {"tracked": 2, "would_warn": 2, "would_stop": 2}
    assert agent.harness.guard.genai_coverage().orphan_tool_calls == 1
    assert agent.harness.diagnostic_counts().get("evicted", 0) == 0
    code, report, err = _replay(capsys, _write(agent, tmp_path / "twice.jsonl"))
    assert code == 0 and err == ""
    assert {k: v for k, v in report["decisions"].items() if v} == live
    assert report["prompts"] == 2 and report["invariant_violations"] == 0


def test_two_prompts_open_at_once_with_one_conversation_id_collide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = Agent()
    with agent.prompt("chat-1") as first:  # one after the other: no collision
        agent.turn(first)
        agent.chat(first)
    with agent.prompt("chat-1") as second, agent.prompt("chat-1") as third:
        agent.turn(second)
        agent.turn(third)
        agent.chat(second)
        agent.chat(third)
    assert agent.harness.diagnostic_counts().get("prompt_collision", 0) == 1
    assert agent.harness.decision_counts() == {"tracked": 3}  # each on its own state
    code, report, _ = _replay(capsys, _write(agent, tmp_path / "collide.jsonl"))
    assert code == 0 and report["diagnostics"].get("prompt_collision", 0) == 1
    assert report["decisions"]["tracked"] == 3


def test_replay_counts_batch_span_prompts_as_acp(capsys: pytest.CaptureFixture[str]) -> None:
    demo = Path(__file__).resolve().parent.parent / "examples" / "demo-traces.jsonl"
    code, report, _ = _replay(capsys, demo)
    assert code == 0
    assert report["profiles"]["acp"] == report["prompts"] > 0
    assert report["profiles"]["genai"] == 0


def test_replay_names_the_missing_attributes_when_no_prompt_is_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = Agent()
    root = plain.tracer.start_span("GET /")
    plain.span(root, "SELECT", {"db.system": "sqlite"}).end()
    root.end()
    orphans = Agent()
    root = orphans.tracer.start_span("handler")
    orphans.tool(root)
    root.end()
    idle = Agent()
    with idle.prompt() as prompt:
        idle.chat(prompt)
    expected = {
        "plain": "no span carries gen_ai.operation.name=invoke_agent/execute_tool",
        "orphans": "missing an ancestor with gen_ai.operation.name=invoke_agent",
        "idle": "missing gen_ai.operation.name=execute_tool",
    }
    for name, agent in (("plain", plain), ("orphans", orphans), ("idle", idle)):
        path = _write(agent, tmp_path / f"{name}.jsonl")
        code, report, err = _replay(capsys, path)
        assert code == 4 and report["prompts"] == 0  # spans, but no prompt: the gate fails
        assert report["verdict"] == {"status": 4, "reasons": ["no prompt the guard can read"]}
        assert err.count("\n") == 1, err
        assert err.startswith(f"{path}: ") and expected[name] in err


KINDS = ("plain", "chat", "tool", "named_tool", "invoke_agent", "acp_prompt")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(("start", "end")), st.sampled_from(KINDS), st.integers(0, 50)),
        max_size=60,
    )
)
def test_any_span_tree_leaves_no_state_and_never_raises(
    steps: list[tuple[str, str, int]],
) -> None:
    agent = Agent()
    attributes = {
        "plain": {"db.system": "sqlite"},
        "chat": {"gen_ai.operation.name": "chat"},
        "tool": {"gen_ai.operation.name": "execute_tool", "error.type": "timeout"},
        "named_tool": {"gen_ai.tool.name": "read", "gen_ai.tool.call.id": "x"},
        "invoke_agent": {"gen_ai.operation.name": "invoke_agent"},
        "acp_prompt": {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p"},
    }
    open_spans: list[Span] = []
    started = 0
    ended_roots: set[int] = set()
    outliving: set[int] = set()  # traces with a span that ended after the trace's root

    def end(span: Span) -> None:
        context = span.get_span_context()
        if context.trace_id in ended_roots:
            outliving.add(context.trace_id)
        span.end()
        if span.parent is None:  # type: ignore[attr-defined]
            ended_roots.add(context.trace_id)

    for action, kind, pick in steps:
        if action == "start" or not open_spans:
            parent = open_spans[pick % len(open_spans)] if open_spans and pick % 5 else None
            span = agent.tracer.start_span(
                kind,
                context=None if parent is None else set_span_in_context(parent),
                attributes=attributes[kind],
            )
            open_spans.append(span)
            started += 1
        else:
            end(open_spans.pop(pick % len(open_spans)))
    while open_spans:
        end(open_spans.pop())
    guard = agent.harness.guard
    # A trace is watched until its root ends; only spans outliving their root leave an entry
    # (bounded by the table of watched traces).
    assert set(guard._genai_open) <= outliving
    assert "internal_error" not in guard.diagnostics()
    assert sum(len(e.batch.observations) for e in agent.evaluations) <= started
    assert {e.profile for e in agent.evaluations} <= {"genai", "acp"}


def test_concurrent_prompts_on_many_threads_each_get_their_own_decisions() -> None:
    agent = Agent()
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with agent.prompt(f"conv-{index}") as prompt:
                for _ in range(3):
                    agent.chat(prompt)
                    step = agent.span(prompt, "running tools")
                    for _ in range(4):
                        agent.tool(step)
                    agent.span(step, "GET /").end()
                    step.end()
                agent.chat(prompt)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    by_prompt: dict[str, list[str]] = {}
    for evaluation in agent.evaluations:
        by_prompt.setdefault(evaluation.prompt_id, []).append(evaluation.decision.kind)
    assert by_prompt == {f"conv-{i}": ["tracked", "would_warn", "would_stop"] for i in range(8)}
    assert agent.harness.guard.diagnostics() == {}
    assert agent.harness.guard._genai_open == {}


def test_an_opted_out_prompt_span_stays_off_when_a_genai_prompt_shares_its_id() -> None:
    agent = Agent(max_prompts=1)
    harness = agent.harness
    harness.start_prompt("conv-1", route="cron")  # opted out, and open throughout
    with agent.prompt():  # a GenAI prompt with the same ID, whose state is evicted
        harness.failing_batches("q", 1)
    harness.failing_batches("conv-1", 1)  # rebuilt from the open prompt span: still off
    assert harness.decision_counts() == {"tracked": 1}  # the batch of q only


def test_a_genai_prompt_active_within_the_ttl_keeps_its_state_when_another_prompt_starts() -> None:
    now = [0.0]
    agent = Agent(clock=lambda: now[0], prompt_ttl_seconds=100)
    with agent.prompt("conv-1") as first:
        for _ in range(3):
            agent.turn(first)
        now[0] = 60.0
        agent.chat(first)  # settles a batch at 60: the prompt was active then
        now[0] = 150.0  # 90 s after that batch, 150 s after the prompt started
        with agent.prompt("conv-2") as second:
            agent.chat(second)
    guard = agent.harness.guard
    assert "internal_error" not in guard.diagnostics()
    assert "expired" not in guard.diagnostics()
    assert [e.decision.kind for e in agent.evaluations] == ["tracked", "would_warn", "would_stop"]


def test_a_long_prompt_decided_at_its_end_loses_no_transition_to_the_record_queue() -> None:
    """An inferred prompt's batches are decided when it ends, all in that one ``end()``: 2,200
    transitions and as many observation counts, more than the record queue holds (4,096). They
    are queued together, so none is dropped, and the counter and the records say the same."""
    agent = Agent()
    pairs = 1_100
    with agent.prompt() as prompt:
        for _ in range(pairs):
            agent.turn(prompt, width=1)
            agent.turn(prompt, width=1, fail=False)
        agent.chat(prompt)
    assert agent.kinds() == ["tracked", "reset"] * pairs  # decided, before the records
    counts = agent.harness.decision_counts()
    assert counts == {"tracked": pairs, "reset": pairs}
    assert "telemetry_error" not in agent.harness.diagnostic_counts()
    records = agent.harness.logs(TRANSITION_EVENT)
    assert decisions_of(records) == ["tracked", "reset"] * pairs
    observed = sum(value for _, value in agent.harness.points(OBSERVATIONS_METRIC))
    assert observed == 2 * pairs
