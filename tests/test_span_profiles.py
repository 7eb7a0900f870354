"""Profiles read ended spans (contract sections 3b, 3c [12-02]): spans as real frameworks write
them, live and replayed, through a real TracerProvider."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from otel_guard import BatchEvaluation
from otel_guard.cli import main
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

LOOP = ["tracked", "would_warn", "would_stop"]


class Framework:
    """Writes spans as an instrumented framework does; ``late`` sets every attribute right after
    the span started (Strands, Google ADK, OpenLLMetry), never at start."""

    def __init__(self, *, late: bool = True, fused: bool = False, **guard: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        guard.setdefault("mode", "shadow")
        self.harness = Harness(fused=fused, listener=self.evaluations.append, **guard)
        self.tracer = self.harness.tracer
        self.late = late
        self._ids = 0

    def start(
        self, name: str, parent: Span | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Span:
        context = None if parent is None else set_span_in_context(parent)
        if self.late:
            span = self.tracer.start_span(name, context=context)
            span.set_attributes(dict(attributes or {}))
            return span
        return self.tracer.start_span(name, context=context, attributes=dict(attributes or {}))

    def call_id(self) -> str:
        self._ids += 1
        return f"call-{self._ids}"

    def fail(self, span: Span, error_type: str | None = "TimeoutError") -> None:
        if error_type is not None:
            span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, "free text"))

    def kinds(self) -> list[str]:
        return [e.decision.kind for e in self.evaluations]


def _genai_tool(f: Framework, parent: Span, call_id: str | None = None) -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "run_shell",
        "gen_ai.tool.call.id": call_id if call_id is not None else f.call_id(),
    }
    span = f.start("execute_tool run_shell", parent, attributes)
    f.fail(span)
    span.end()


def strands(f: Framework, turns: int = 3, width: int = 4) -> None:
    """Strands Agents: invoke_agent > execute_event_loop_cycle > chat, execute_tool; each cycle
    is a child of the previous one."""
    prompt = f.start("invoke_agent agent", None, {"gen_ai.operation.name": "invoke_agent"})
    parent = prompt
    cycles = []
    for _ in range(turns + 1):
        cycle = f.start("execute_event_loop_cycle", parent, {"event_loop.cycle_id": "x"})
        cycles.append(cycle)
        f.start("chat", cycle, {"gen_ai.operation.name": "chat"}).end()
        if len(cycles) <= turns:
            for _ in range(width):
                _genai_tool(f, cycle)
        parent = cycle
    for cycle in reversed(cycles):
        cycle.end()
    prompt.end()


def tools_under_the_model_call(f: Framework, turns: int = 3, width: int = 4) -> None:
    """Tool spans whose parent is a model-call span that had already ended."""
    prompt = f.start("invoke_agent agent", None, {"gen_ai.operation.name": "invoke_agent"})
    for _ in range(turns):
        step = f.start("Step", prompt)
        chat = f.start("chat", step, {"gen_ai.operation.name": "chat"})
        chat.end()
        tools = f.start("tools", step)
        for _ in range(width):
            _genai_tool(f, chat)
        tools.end()
        step.end()
    f.start("chat", prompt, {"gen_ai.operation.name": "chat"}).end()
    prompt.end()


def openllmetry_langgraph(f: Framework, turns: int = 3, width: int = 4) -> None:
    """OpenLLMetry: ``invoke_agent LangGraph`` around ``LangGraph.workflow``, both agents."""
    outer = f.start(
        "invoke_agent LangGraph",
        None,
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "thread-7"},
    )
    workflow = f.start("LangGraph.workflow", outer, {"gen_ai.operation.name": "invoke_agent"})
    for _ in range(turns + 1):
        model = f.start("model.task", workflow)
        f.start("ChatModel.chat", model, {"gen_ai.operation.name": "chat"}).end()
        model.end()
        if turns:
            tools = f.start("tools.task", workflow)
            for _ in range(width):
                _genai_tool(f, tools)
            tools.end()
            turns -= 1
    workflow.end()
    outer.end()


def adk(f: Framework, turns: int = 3, width: int = 4, call_id: str = "<not specified>") -> None:
    """Google ADK: invocation > invoke_agent > call_llm (generate_content), then one execute_tool
    per call with placeholder call IDs, inside an ``execute_tool (merged)`` span per turn."""
    invocation = f.start("invocation", None)
    agent = f.start("invoke_agent root", invocation, {"gen_ai.operation.name": "invoke_agent"})
    for turn in range(turns + 1):
        f.start("call_llm", agent, {"gen_ai.operation.name": "generate_content"}).end()
        if turn == turns:
            break
        merged = f.start(
            "execute_tool (merged)",
            agent,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "(merged tools)"},
        )
        for _ in range(width):
            _genai_tool(f, merged, call_id)
        f.fail(merged)
        merged.end()
    agent.end()
    invocation.end()


def openinference(
    f: Framework,
    turns: int = 3,
    width: int = 4,
    root_kind: str = "CHAIN",
    session: str | None = None,
    exception_only: bool = False,
) -> None:
    """OpenInference (LangGraph/smolagents style): a root CHAIN (or AGENT), LLM and TOOL spans."""
    attributes: dict[str, Any] = {"openinference.span.kind": root_kind}
    if session is not None:
        attributes["session.id"] = session
    root = f.start("LangGraph", None, attributes)
    for turn in range(turns + 1):
        node = f.start("agent", root, {"openinference.span.kind": "CHAIN"})
        f.start("ChatOpenAI", node, {"openinference.span.kind": "LLM"}).end()
        node.end()
        if turn == turns:
            break
        tools = f.start("tools", root, {"openinference.span.kind": "CHAIN"})
        for _ in range(width):
            span = f.start(
                "run_shell",
                tools,
                {
                    "openinference.span.kind": "TOOL",
                    "tool.name": "run_shell",
                    "tool_call.id": f.call_id(),
                    "input.value": "{}",
                },
            )
            span.record_exception(TimeoutError("took too long"))
            if exception_only:
                span.set_status(Status(StatusCode.ERROR, "took too long"))
            else:
                f.fail(span)
            span.end()
        tools.end()
    root.end()


def _replay(f: Framework, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    path = tmp_path / "trace.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(f.harness.span_exporter.get_finished_spans())
    main(["replay", "--format", "json", str(path)])
    return dict(json.loads(capsys.readouterr().out))


SCENARIOS = {
    "strands": strands,
    "tools_under_the_model_call": tools_under_the_model_call,
    "openllmetry_langgraph": openllmetry_langgraph,
    "adk": adk,
    "openinference": openinference,
}


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("late", [True, False])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decisions_do_not_depend_on_attributes_present_at_start(
    name: str, late: bool, fused: bool
) -> None:
    f = Framework(late=late, fused=fused)
    SCENARIOS[name](f)
    assert f.kinds() == LOOP
    assert f.harness.guard.diagnostics() == {}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_live_and_replayed_decisions_are_equal_with_no_invariant_violation(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = Framework(late=True)
    SCENARIOS[name](f)
    report = _replay(f, tmp_path, capsys)
    live = f.harness.decision_counts()
    assert live == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert {k: v for k, v in report["decisions"].items() if v} == live
    assert report["invariant_violations"] == 0
    assert report["prompts"] == 1


def test_a_real_violation_on_an_inferred_batch_still_counts() -> None:
    from otel_guard.reducer import Batch, GuardState, Observation, reduce
    from otel_guard.replay.replayer import GuardReport

    f = Framework(late=True)
    strands(f, turns=1)
    (evaluation,) = f.evaluations
    observation = Observation("", "run_shell", "native", "error", "error", "timeouterror")
    batch = Batch(True, (observation,) * 8)
    decision = reduce(GuardState.initial(), _input(batch))
    forged = BatchEvaluation(
        prompt_id="p",
        span=evaluation.span,
        mode="shadow",
        batch=batch,
        has_external_input=False,
        has_queued_prompt=False,
        input_reliable=True,
        before=GuardState.initial(),
        decision=decision,
        decision_value="tracked",
        action=None,
        profile="genai",
    )
    report = GuardReport("shadow")
    report.observe(forged)  # a call without an ID cannot prove its batch complete
    assert report.violations["incomplete_batch_decision"] == 1
    report.observe(evaluation)
    assert report.violations["incomplete_batch_decision"] == 1


def _input(batch: Any) -> Any:
    from otel_guard.reducer import GuardInput

    return GuardInput("shadow", batch, False, False, True)


def test_nested_agent_spans_are_one_prompt_named_by_the_outermost() -> None:
    f = Framework()
    openllmetry_langgraph(f)
    assert {e.prompt_id for e in f.evaluations} == {"thread-7"}
    assert f.harness.guard.genai_coverage().prompts == 1


def test_the_merged_adk_span_is_not_a_call_and_placeholder_ids_are_missing_ids() -> None:
    f = Framework()
    adk(f, turns=3, width=4)
    # Four calls per turn, each identified by its span ID: no duplicate, no merged call.
    assert [len(e.batch.observations) for e in f.evaluations] == [4, 4, 4]
    assert f.kinds() == LOOP
    assert all(e.batch.complete for e in f.evaluations)
    ids = [o.call_id for e in f.evaluations for o in e.batch.observations]
    assert len(set(ids)) == 12 and all(len(i) == 16 for i in ids)
    assert "duplicate_span" not in f.harness.guard.diagnostics()


@pytest.mark.parametrize("placeholder", ["<not specified>", "  "])
def test_section_3_placeholder_call_ids_are_missing_ids_not_duplicates(placeholder: str) -> None:
    from harness import Call

    evaluations: list[BatchEvaluation] = []
    h = Harness(listener=evaluations.append)
    h.batch("p", [Call(call_id=placeholder), Call(call_id=placeholder)])
    (evaluation,) = evaluations
    assert evaluation.batch.complete is False  # a call without an ID cannot prove completeness
    # Not duplicates: each is a tool-call span missing a required attribute, its call ID.
    assert h.guard.diagnostics() == {"missing_attribute": 2}


def test_openinference_prompt_ids_outcomes_and_call_ids() -> None:
    f = Framework(late=False)
    openinference(f, root_kind="AGENT", session="session-9", exception_only=True)
    assert f.kinds() == LOOP
    assert {e.prompt_id for e in f.evaluations} == {"session-9"}
    assert {e.profile for e in f.evaluations} == {"openinference"}
    keys = {
        (o.policy_tool_name, o.execution_error_type)
        for e in f.evaluations
        for o in e.batch.observations
    }
    assert keys == {("run_shell", "timeouterror")}  # the last exception event's type
    assert [o.call_id for o in f.evaluations[0].batch.observations] == [
        "call-1",
        "call-2",
        "call-3",
        "call-4",
    ]


def test_openinference_tool_id_then_span_id_and_a_non_root_chain_is_no_prompt() -> None:
    f = Framework(late=False)
    root = f.start("request", None)
    chain = f.start("LangGraph", root, {"openinference.span.kind": "CHAIN"})
    f.start("llm", chain, {"openinference.span.kind": "LLM"}).end()
    tool = f.start("t", chain, {"openinference.span.kind": "TOOL", "tool.name": "x"})
    f.fail(tool)
    tool.end()
    chain.end()
    root.end()
    assert f.evaluations == []  # a CHAIN below another span is not a prompt
    assert f.harness.guard.genai_coverage().orphan_tool_calls == 1

    f = Framework(late=False)
    agent = f.start("agent", None, {"openinference.span.kind": "AGENT"})
    f.start("llm", agent, {"openinference.span.kind": "LLM"}).end()
    first = f.start("t", agent, {"openinference.span.kind": "TOOL", "tool.id": "tid-1"})
    first.end()
    second = f.start(
        "t", agent, {"openinference.span.kind": "TOOL", "tool_call.id": "<not specified>"}
    )
    second.end()
    agent.end()
    (evaluation,) = f.evaluations
    assert [o.call_id for o in evaluation.batch.observations] == [
        "tid-1",
        f"{second.get_span_context().span_id:016x}",
    ]
    assert evaluation.prompt_id == f"{agent.get_span_context().span_id:016x}"
    # No outcome error: a success of a tool without a name is unknown, and disables nothing new.
    assert all(o.execution_status == "success" for o in evaluation.batch.observations)


def test_openinference_prompts_are_never_enforced() -> None:
    f = Framework(mode="enforce")
    openinference(f, session="s")
    assert f.harness.decision_counts() == {"tracked": 1, "warned": 1, "would_stop": 1}
    assert all(e.action is None or e.action.kind != "stop" for e in f.evaluations)
    assert f.harness.guard.take_action("s") is None


def test_spans_with_gen_ai_operation_follow_the_genai_profile_not_openinference() -> None:
    f = Framework(late=False)
    prompt = f.start(
        "agent", None, {"openinference.span.kind": "AGENT", "gen_ai.operation.name": "invoke_agent"}
    )
    f.start("chat", prompt, {"gen_ai.operation.name": "chat"}).end()
    _genai_tool(f, prompt)
    prompt.end()
    assert [e.profile for e in f.evaluations] == ["genai"]


def test_an_openinference_tool_span_with_gen_ai_tool_keys_but_no_operation_is_openinference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An OpenInference processor layered on a framework's own spans: section 3c reads spans with
    # openinference.span.kind and no gen_ai.operation.name, so the tool is named by tool.name
    # (one tool here), not by gen_ai.tool.name (a different one per span: a mixed batch).
    f = Framework(late=True)
    agent = f.start("agent", None, {"openinference.span.kind": "AGENT"})
    for turn in range(3):
        f.start("llm", agent, {"openinference.span.kind": "LLM"}).end()
        for call in range(4):
            tool = f.start(
                "running tool",
                agent,
                {
                    "openinference.span.kind": "TOOL",
                    "tool.name": "bash",
                    "gen_ai.tool.name": f"bash-{turn}-{call}",
                    "gen_ai.tool.call.id": f"call-{turn}-{call}",
                },
            )
            f.fail(tool)
            tool.end()
    f.start("llm", agent, {"openinference.span.kind": "LLM"}).end()
    agent.end()
    assert [e.profile for e in f.evaluations] == ["openinference"] * 3
    assert f.kinds() == LOOP
    report = _replay(f, tmp_path, capsys)
    assert {k: v for k, v in report["decisions"].items() if v} == f.harness.decision_counts()


def test_an_inferred_batch_settles_at_the_next_model_call_start_later_calls_are_late() -> None:
    f = Framework(late=False)
    prompt = f.start("invoke_agent", None, {"gen_ai.operation.name": "invoke_agent"})
    f.start("chat", prompt, {"gen_ai.operation.name": "chat"}).end()
    slow = f.start(
        "execute_tool",
        prompt,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "t",
            "gen_ai.tool.call.id": "a",
        },
    )
    _genai_tool(f, prompt)
    f.start("chat", prompt, {"gen_ai.operation.name": "chat"}).end()  # slow is still running
    slow.end()
    prompt.end()
    (evaluation,) = f.evaluations
    assert evaluation.batch.complete is False
    assert len(evaluation.batch.observations) == 1
    assert f.harness.guard.diagnostics() == {"late_span": 1}


# -- collisions that must never let a stop through (issue reproductions) ------------------------


def test_a_prompt_id_shared_by_a_genai_prompt_and_an_acp_prompt_span_never_stops() -> None:
    f = Framework(mode="enforce", late=False)
    h = f.harness
    genai = f.start(
        "invoke_agent",
        None,
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "X"},
    )
    acp = h.start_prompt("X")
    h.failing_batches("X", 2, parent=acp)
    action = h.guard.take_action("X")
    assert action is not None and action.kind == "reminder"  # the acp host takes it
    for _ in range(2):
        f.start("chat", genai, {"gen_ai.operation.name": "chat"}).end()
        for _ in range(4):
            _genai_tool(f, genai)
    f.start("chat", genai, {"gen_ai.operation.name": "chat"}).end()
    genai.end()  # the GenAI profile's batches of "X" settle: a collision
    assert h.guard.diagnostics()["prompt_collision"] == 1
    state = h.guard.state("X")
    assert state is not None and state.enforcement_disabled
    h.failing_batches("X", 1, parent=acp)
    assert h.guard.take_action("X") is None
    acp.end()
    assert "stopped" not in h.decision_counts()
    assert all(e.action is None or e.action.kind != "stop" for e in f.evaluations)


def test_an_open_prompt_span_lost_to_the_span_table_makes_its_id_collide() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)  # 5 open spans at most
    first = h.start_prompt("a", route="cron")  # opted out, stays open
    for i in range(5):
        h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"x{i}"})  # never end
    second = h.start_prompt("a")  # the first is still open: a collision, not a fresh prompt
    # The ID is off (the first span opted out): the collision is not reported, it only keeps
    # the second span from starting a fresh, guarded prompt.
    assert "prompt_collision" not in h.guard.diagnostics()
    actions = []
    for _ in range(4):
        h.failing_batches("a", 1, parent=second)
        actions.append(h.guard.take_action("a"))
    assert actions == [None] * 4  # opted out by the first span: off, no reminder, no stop
    assert h.decision_counts() == {}
    second.end()
    first.end()


def test_an_enforcing_prompt_span_lost_to_the_span_table_collides_and_never_stops() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)
    first = h.start_prompt("a")
    for i in range(5):
        h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"x{i}"})
    second = h.start_prompt("a")
    kinds = []
    for _ in range(4):
        h.failing_batches("a", 1, parent=second)
        action = h.guard.take_action("a")
        kinds.append(None if action is None else action.kind)
    assert "stop" not in kinds
    assert "stopped" not in h.decision_counts()
    first.end()  # the lost span ends: its ID is forgotten
    second.end()
    third = h.start_prompt("a")
    assert h.guard.diagnostics()["prompt_collision"] == 1  # a fresh prompt again
    state = h.guard.state("a")
    assert state is not None and not state.enforcement_disabled
    third.end()


def test_a_long_prompt_id_is_kept_as_a_digest_and_still_found() -> None:
    h = Harness(mode="enforce")
    long_id = "p" * 100_000
    prompt = h.start_prompt(long_id)
    h.failing_batches(long_id, 2, parent=prompt)
    action = h.guard.take_action(long_id)
    assert action is not None and action.kind == "reminder"
    state = h.guard.state(long_id)
    assert state is not None and state.phase == "warned"
    keys = list(h.guard._prompts)  # type: ignore[attr-defined]
    assert keys == ["sha256:" + __import__("hashlib").sha256(long_id.encode()).hexdigest()]
    prompt.end()
    assert h.guard.state(long_id) is None
    assert h.guard.diagnostics() == {"long_prompt_id": 3}  # the prompt span and two batches


def test_attributes_set_after_start_on_a_hand_written_agent() -> None:
    f = Framework(late=True, mode="shadow")
    prompt = f.tracer.start_span("agent run")
    prompt.set_attribute("gen_ai.operation.name", "invoke_agent")
    for _ in range(3):
        chat = f.tracer.start_span("llm", context=set_span_in_context(prompt))
        chat.set_attribute("gen_ai.operation.name", "chat")
        chat.end()
        for _ in range(4):
            tool = f.tracer.start_span("tool", context=set_span_in_context(prompt))
            tool.set_attributes(
                {"gen_ai.tool.name": "run_shell", "gen_ai.tool.call.id": f.call_id()}
            )
            f.fail(tool)
            tool.end()
    prompt.end()
    assert f.kinds() == LOOP


def test_a_trace_rooted_in_a_section_3_prompt_span_is_never_watched() -> None:
    f = Framework(late=False)
    h = f.harness
    prompt = h.start_prompt("p")
    for _ in range(3):
        f.start("chat", prompt, {"gen_ai.operation.name": "chat"}).end()
        assert len(h.guard.genai_lineage) == 0  # plain spans of a section 3 host cost nothing
        h.failing_batches("p", 1, parent=prompt)
    inner = f.start("invoke_agent", prompt, {"gen_ai.operation.name": "invoke_agent"})
    f.start("chat", inner, {"gen_ai.operation.name": "chat"}).end()
    _genai_tool(f, inner)
    inner.end()  # below a section 3 prompt: section 3's, never an inferred prompt
    prompt.end()
    assert {e.profile for e in f.evaluations} == {"acp"}
    assert len(h.guard.genai_lineage) == 0
