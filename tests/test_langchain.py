"""The guard as middleware of a real LangChain agent (create_agent on LangGraph), offline.

The model is a scripted chat model: every response calls the failing tool twice in parallel.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "langchain.agents", reason="the LangChain integration needs the 'langchain' extra"
)

from contract_spans import contract_spans
from harness import Harness, run_isolated
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, ToolErrorMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import Field

from otel_guard import BatchEvaluation
from otel_guard.integrations.langchain import (
    RepeatedToolFailureMiddleware,
    RepeatedToolFailureStopped,
)
from otel_guard.reducer import REMINDER, STOP_MESSAGE

TURNS = 6  # model responses with tool calls before the scripted model gives up


def _calls(step: int, name: str = "run_shell", width: int = 2, **args: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "args": args or {"command": "make"},
            "id": f"s{step}-c{i}",
            "type": "tool_call",
        }
        for i in range(width)
    ]


class ScriptedModel(BaseChatModel):
    """``script(step, messages)`` gives the next response's tool calls; none ends the run."""

    script: Callable[[int, list[BaseMessage]], list[dict[str, Any]]]
    requests: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.requests.append(list(messages))
        calls = self.script(len(self.requests), messages)
        message = AIMessage(content="" if calls else "giving up", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def reminders(self) -> list[bool]:
        return [
            any(isinstance(m, SystemMessage) and m.content == REMINDER for m in request)
            for request in self.requests
        ]


def failing(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
    return _calls(step) if step <= TURNS else []


@tool
def run_shell(command: str) -> str:
    """Run a shell command."""
    raise ToolException(f"{command}: exit status 2")


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "contents"


@tool
def open_config() -> str:
    """Open the configuration."""
    raise FileNotFoundError("/etc/agent.toml")


def _as_message(error: Exception, request: Any) -> str:
    return f"{request.tool_call['name']} failed: {type(error).__name__}"


class Setup:
    def __init__(self, mode: str, **kwargs: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        self.harness = Harness(mode=mode, listener=self.evaluations.append)
        self.middleware = RepeatedToolFailureMiddleware(
            self.harness.guard, tracer_provider=self.harness.tracer_provider, **kwargs
        )

    def agent(
        self, model: ScriptedModel, *before: Any, after: tuple[Any, ...] = (), **kw: Any
    ) -> Any:
        # ToolErrorMiddleware outside the guard: the tool's exception reaches the guard first.
        return create_agent(
            model,
            tools=[run_shell, read_file, open_config],
            middleware=[ToolErrorMiddleware(_as_message), *before, self.middleware, *after],
            **kw,
        )

    def decisions(self) -> dict[str, int]:
        return self.harness.decision_counts()

    def observations(self) -> list[tuple[str, str | None, str | None]]:
        return [
            (o.call_id, o.execution_status, o.execution_error_type)
            for e in self.evaluations
            for o in e.batch.observations
        ]


def _invoke(agent: Any, **config: Any) -> dict[str, Any]:
    return agent.invoke(  # type: ignore[no-any-return]
        {"messages": [{"role": "user", "content": "build it"}]},
        {"recursion_limit": 100, **config},
    )


def test_enforce_reminds_once_then_stops_before_the_next_model_call() -> None:
    setup = Setup("enforce")
    model = ScriptedModel(script=failing)
    with pytest.raises(RepeatedToolFailureStopped) as raised:
        _invoke(setup.agent(model))
    # 2 failures a batch: tracked at 2, 4, 6; warned at 8 (4th batch); stopped at the 5th.
    assert len(model.requests) == 5
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert len(setup.harness.logs("acp.loop_detected")) == 1
    stopped = raised.value
    assert stopped.message == STOP_MESSAGE and str(stopped) == STOP_MESSAGE
    assert stopped.prompt_id == setup.evaluations[0].prompt_id
    *history, tool_a, tool_b, last = stopped.messages
    assert isinstance(last, SystemMessage) and last.content == STOP_MESSAGE
    assert [t.tool_call_id for t in (tool_a, tool_b) if isinstance(t, ToolMessage)] == [
        "s5-c0",
        "s5-c1",
    ]
    assert sum(isinstance(m, SystemMessage) and m.content == REMINDER for m in history) == 1
    # The run's prompt span ended with the stop.
    spans = setup.harness.span_exporter.get_finished_spans()
    assert [s.name for s in spans if s.name == "invoke_agent"] == ["invoke_agent"]


def test_shadow_never_acts_and_decides_would_warn_then_would_stop() -> None:
    setup = Setup("shadow")
    model = ScriptedModel(script=failing)
    result = _invoke(setup.agent(model))
    assert result["messages"][-1].content == "giving up"
    assert len(model.requests) == TURNS + 1
    assert not any(model.reminders())
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}
    kinds = [e.decision.kind for e in setup.evaluations]
    assert kinds[:5] == ["tracked", "tracked", "tracked", "would_warn", "would_stop"]
    assert all(e.action is None for e in setup.evaluations)
    assert all(e.batch.complete and len(e.batch.observations) == 2 for e in setup.evaluations)


def test_shadow_leaves_the_run_exactly_as_without_the_guard() -> None:
    transcripts = []
    for guarded in (False, True):
        setup = Setup("shadow")
        model = ScriptedModel(script=failing)
        middleware = [ToolErrorMiddleware(_as_message), *([setup.middleware] if guarded else [])]
        agent = create_agent(model, tools=[run_shell], middleware=middleware)
        result = _invoke(agent)
        transcripts.append([(type(m).__name__, m.content) for m in result["messages"]])
    assert transcripts[0] == transcripts[1]


def test_warn_reminds_once_and_never_stops() -> None:
    setup = Setup("warn")
    model = ScriptedModel(script=failing)
    _invoke(setup.agent(model))
    assert model.reminders() == [False, False, False, False, True, True, True]  # kept in history
    assert setup.decisions() == {"tracked": 3, "warned": 1, "would_stop": 1}


def test_a_model_that_changes_approach_after_the_reminder_is_not_stopped() -> None:
    def script(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        if any(isinstance(m, SystemMessage) and m.content == REMINDER for m in messages):
            if isinstance(messages[-1], ToolMessage) and messages[-1].name == "read_file":
                return []
            return _calls(step, "read_file", width=1, path="Makefile")
        return _calls(step)

    setup = Setup("enforce")
    model = ScriptedModel(script=script)
    assert _invoke(setup.agent(model))["messages"][-1].content == "giving up"
    # A success of another tool leaves the streak as it is, but no failing batch followed.
    assert setup.decisions() == {"tracked": 3, "warned": 1}
    assert [e.decision.kind for e in setup.evaluations][-1] == "none"
    assert len(model.requests) == 6


def test_failures_are_typed_from_the_exception_class() -> None:
    def script(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        if step == 1:
            return [*_calls(step, width=1), *_calls(2, "open_config", width=1)]
        return []

    setup = Setup("shadow")
    _invoke(setup.agent(ScriptedModel(script=script)))
    assert sorted(setup.observations()) == [  # parallel calls: started in any order
        ("s1-c0", "error", "tool_exception"),
        ("s2-c0", "error", "file_not_found_error"),
    ]
    (evaluation,) = setup.evaluations
    assert evaluation.batch.complete and evaluation.decision.kind == "none"  # mixed, from idle


def test_an_exception_handled_before_the_guard_saw_it_is_unknown() -> None:
    # ToolErrorMiddleware inside the guard turns the exception into a message first.
    setup = Setup("enforce")
    model = ScriptedModel(script=failing)
    agent = create_agent(
        model, tools=[run_shell], middleware=[setup.middleware, ToolErrorMiddleware(_as_message)]
    )
    _invoke(agent)
    assert {o[1:] for o in setup.observations()} == {("unknown", None)}
    assert not any(model.reminders())
    assert setup.decisions() == {"reset": 1}  # unknown: never counted, enforcement disabled


def test_invalid_arguments_and_unknown_tools_are_not_started() -> None:
    def script(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        if step == 1:
            return [
                {"name": "read_file", "args": {"path": 3.5j}, "id": "bad", "type": "tool_call"},
                {"name": "deploy", "args": {}, "id": "unknown", "type": "tool_call"},
            ]
        return []

    setup = Setup("shadow")
    _invoke(setup.agent(ScriptedModel(script=script)))
    assert sorted(setup.observations()) == [
        ("bad", "not_started", None),
        ("unknown", "not_started", None),
    ]


def test_a_rejected_call_is_a_permission_denial_that_never_counts() -> None:
    setup = Setup("shadow")
    model = ScriptedModel(script=failing)
    approval = HumanInTheLoopMiddleware(interrupt_on={"run_shell": True})
    agent = setup.agent(model, approval, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    _invoke(agent, **config)
    reject = {"decisions": [{"type": "reject", "message": "not allowed"}] * 2}
    for _ in range(3):
        agent.invoke(Command(resume=reject), {"recursion_limit": 100, **config})
    observations = setup.observations()
    assert len(observations) >= 4
    assert {o[1:] for o in observations} == {("not_started", None)}
    assert setup.decisions() == {}


def test_an_exception_that_ends_the_run_is_recorded_before_it_propagates() -> None:
    setup = Setup("shadow")
    model = ScriptedModel(script=failing)
    agent = create_agent(model, tools=[run_shell], middleware=[setup.middleware])
    with pytest.raises(ToolException):
        _invoke(agent)
    tools = [
        s
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name == "execute_tool run_shell"
    ]
    assert {(s.attributes or {}).get("acp.tool.execution.error_type") for s in tools} == {
        "tool_exception"
    }


def test_async_runs_are_guarded_the_same() -> None:
    import asyncio

    setup = Setup("enforce")
    model = ScriptedModel(script=failing)
    agent = setup.agent(model)
    with pytest.raises(RepeatedToolFailureStopped):
        asyncio.run(
            agent.ainvoke(
                {"messages": [{"role": "user", "content": "build"}]}, {"recursion_limit": 100}
            )
        )
    assert len(model.requests) == 5
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}


def test_each_run_is_a_fresh_prompt() -> None:
    setup = Setup("enforce")
    for _ in range(2):  # one middleware instance serving two agents, one run each
        model = ScriptedModel(script=failing)
        with pytest.raises(RepeatedToolFailureStopped):
            _invoke(setup.agent(model))
        assert len(model.requests) == 5
    assert setup.decisions() == {"tracked": 6, "warned": 2, "stopped": 2}
    assert len({e.prompt_id for e in setup.evaluations}) == 2


def _prompt_calls(setup: Setup) -> dict[str, list[str]]:
    """The call IDs of each prompt's tool-call spans, by prompt ID."""
    spans = setup.harness.span_exporter.get_finished_spans()
    prompts = {
        s.context.span_id: str((s.attributes or {})["acp.prompt.id"])
        for s in spans
        if s.name == "invoke_agent"
    }
    batches = {
        s.context.span_id: prompts[s.parent.span_id]
        for s in spans
        if s.name == "tool_batch" and s.parent is not None
    }
    found: dict[str, list[str]] = {p: [] for p in prompts.values()}
    for span in spans:
        if span.name.startswith("execute_tool") and span.parent is not None:
            found[batches[span.parent.span_id]].append(
                str((span.attributes or {})["gen_ai.tool.call.id"])
            )
    return found


@pytest.mark.parametrize("thread", [False, True], ids=["history", "checkpointer"])
def test_new_user_input_after_a_stop_is_a_fresh_prompt_without_the_stopped_calls(
    thread: bool,
) -> None:
    setup = Setup("enforce")
    model = ScriptedModel(script=failing)
    agent = setup.agent(model, checkpointer=InMemorySaver() if thread else None)
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"}} if thread else {}
    with pytest.raises(RepeatedToolFailureStopped) as raised:
        _invoke(agent, **config)
    model.script = lambda step, messages: []  # the model answers the new input
    new_input = {"role": "user", "content": "use the other build script"}
    history = [] if thread else raised.value.messages
    result = agent.invoke({"messages": [*history, new_input]}, {"recursion_limit": 100, **config})
    assert result["messages"][-1].content == "giving up"
    # The stopped response's calls ran in the first prompt: the second one has no batch.
    first, second = _prompt_calls(setup).values()
    assert len(first) == 10 and second == []
    assert [e.prompt_id for e in setup.evaluations] == [raised.value.prompt_id] * 5


def test_a_channel_prompt_is_never_guarded() -> None:
    setup = Setup("enforce", channel=True)
    model = ScriptedModel(script=failing)
    _invoke(setup.agent(model))
    assert setup.decisions() == {} and not any(model.reminders())


def test_without_a_tracer_provider_the_guard_still_sees_every_batch() -> None:
    harness = Harness(mode="enforce")
    model = ScriptedModel(script=failing)
    agent = create_agent(
        model,
        tools=[run_shell],
        middleware=[ToolErrorMiddleware(_as_message), RepeatedToolFailureMiddleware(harness.guard)],
    )
    with pytest.raises(RepeatedToolFailureStopped):
        _invoke(agent)
    assert harness.decision_counts() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert harness.span_exporter.get_finished_spans() == ()


def test_an_unknown_route_is_rejected() -> None:
    with pytest.raises(ValueError, match="route"):
        RepeatedToolFailureMiddleware(Harness().guard, route="nightly")


def test_documented_example_stops_after_five_responses(capsys: pytest.CaptureFixture[str]) -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "langchain.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "RepeatedToolFailureMiddleware(guard)" in b]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(example, str(page), "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == [STOP_MESSAGE]
    responses = [m for m in namespace["history"] if isinstance(m, AIMessage)]
    assert len(responses) == 5


def test_guard_bookkeeping_that_fails_never_reaches_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_guard.integrations import producer

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bookkeeping failed")

    monkeypatch.setattr(producer.ToolBatch, "start_call", broken)
    setup = Setup("enforce")
    model = ScriptedModel(script=failing)
    assert _invoke(setup.agent(model))["messages"][-1].content == "giving up"
    assert len(model.requests) == TURNS + 1 and setup.decisions() == {}


def test_runs_lost_to_an_exception_are_closed_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import otel_guard.integrations.langchain as integration

    monkeypatch.setattr(integration, "_MAX_OPEN_RUNS", 2)
    setup = Setup("shadow")
    agent = create_agent(
        ScriptedModel(script=failing), tools=[run_shell], middleware=[setup.middleware]
    )
    for _ in range(3):  # no ToolErrorMiddleware: each run ends with the tool's exception
        with pytest.raises(ToolException):
            _invoke(agent)
    prompts = [
        s for s in setup.harness.span_exporter.get_finished_spans() if s.name == "invoke_agent"
    ]
    assert len(prompts) == 1  # the oldest of three open runs, closed when the third started
    # Its batch, never settled by the run, is evaluated as it stood: both calls had failed.
    (evaluation,) = setup.evaluations
    assert evaluation.batch.complete and len(evaluation.batch.observations) == 2
    assert evaluation.decision.kind == "tracked"


def test_exported_spans_replay_to_the_live_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from otel_guard.cli import main
    from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

    setup = Setup("shadow")
    _invoke(setup.agent(ScriptedModel(script=failing)))
    path = tmp_path / "langchain.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(setup.harness.span_exporter.get_finished_spans())
    assert main(["replay", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["invariant_violations"] == 0
    assert {k: v for k, v in report["decisions"].items() if v} == setup.decisions()


def test_a_cancelled_call_ends_cancelled_and_counts_nothing() -> None:
    import asyncio

    @tool
    async def wait_for_build() -> str:
        """Wait for the build."""
        raise asyncio.CancelledError  # the task running the tool was cancelled

    def script(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        return _calls(step, "wait_for_build", width=1, wait=True) if step == 1 else []

    setup = Setup("shadow")
    agent = create_agent(
        ScriptedModel(script=script), tools=[wait_for_build], middleware=[setup.middleware]
    )
    from langgraph.errors import NodeCancelledError

    with pytest.raises((asyncio.CancelledError, NodeCancelledError)):
        asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": "wait"}]}))
    (span,) = [
        s
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name == "execute_tool wait_for_build"
    ]
    attributes = span.attributes or {}
    assert attributes["acp.tool.status"] == "cancelled"
    assert attributes["acp.tool.execution.status"] == "cancelled"
    assert setup.decisions() == {}


# -- streaming runs: the same batches, reminder and stop as invoke() ----------------------------


class StreamingModel(ScriptedModel):
    """The script's responses as chunks: each tool call in a chunk of its own."""

    streaming: bool = False
    streamed: int = 0

    def _stream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.requests.append(list(messages))
        self.streamed += 1
        calls = self.script(len(self.requests), messages)
        if not calls:
            yield ChatGenerationChunk(message=AIMessageChunk(content="giving up"))
        for index, call in enumerate(calls):
            chunk = {
                "name": call["name"],
                "args": json.dumps(call["args"]),
                "id": call["id"],
                "index": index,
                "type": "tool_call_chunk",
            }
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[chunk]))


STREAM_MODES: list[Any] = ["values", "updates", "messages", ["updates", "messages"], "debug"]
INPUT = {"messages": [{"role": "user", "content": "build it"}]}


def _invoked(mode: str) -> dict[str, Any]:
    setup = Setup(mode)
    model = StreamingModel(script=failing)
    if mode == "enforce":
        with pytest.raises(RepeatedToolFailureStopped):
            _invoke(setup.agent(model))
    else:
        _invoke(setup.agent(model))
    assert model.streamed == 0
    return contract_spans(setup.harness.span_exporter.get_finished_spans())


def _stream(agent: Any, stream_mode: Any, asynchronous: bool) -> None:
    config = {"recursion_limit": 100}
    if not asynchronous:
        for _ in agent.stream(INPUT, config, stream_mode=stream_mode):
            pass
        return

    async def consume() -> None:
        async for _ in agent.astream(INPUT, config, stream_mode=stream_mode):
            pass

    asyncio.run(consume())


@pytest.mark.parametrize("asynchronous", [False, True], ids=["stream", "astream"])
@pytest.mark.parametrize("stream_mode", STREAM_MODES, ids=str)
def test_a_streamed_run_is_guarded_like_invoke_shadow_then_enforce(
    stream_mode: Any, asynchronous: bool
) -> None:
    for mode, decisions, requests in (
        ("shadow", {"tracked": 3, "would_warn": 1, "would_stop": 1}, TURNS + 1),
        ("enforce", {"tracked": 3, "warned": 1, "stopped": 1}, 5),
    ):
        setup = Setup(mode)
        # streaming=True: the model streams in every stream mode, not only in "messages".
        model = StreamingModel(script=failing, streaming=True)
        if mode == "enforce":
            with pytest.raises(RepeatedToolFailureStopped) as raised:
                _stream(setup.agent(model), stream_mode, asynchronous)
            assert raised.value.message == STOP_MESSAGE
        else:
            _stream(setup.agent(model), stream_mode, asynchronous)
        assert model.streamed == len(model.requests) == requests, mode
        assert sum(model.reminders()) == (1 if mode == "enforce" else 0), mode
        assert model.reminders()[:5] == [False] * 4 + [mode == "enforce"]
        assert setup.decisions() == decisions, mode
        spans = contract_spans(setup.harness.span_exporter.get_finished_spans())
        assert spans == _invoked(mode), mode
        assert len(spans["batches"]) == (TURNS if mode == "shadow" else 5)
        assert not spans["stray"]


# -- MCP tools -----------------------------------------------------------------------------------


def _mcp_shaped_tool() -> Any:
    """A tool shaped as langchain-mcp-adapters builds one: a StructuredTool around a coroutine
    of its ``langchain_mcp_adapters.tools`` module (the package itself needs mcp<2, which the
    other frameworks' extras here exclude, so it is not installed)."""
    from langchain_core.tools import StructuredTool

    async def call_tool(**arguments: Any) -> Any:
        raise ToolException("server error")

    call_tool.__module__ = "langchain_mcp_adapters.tools"
    return StructuredTool(
        name="fetch",
        description="Fetch a URL.",
        args_schema={"type": "object", "properties": {"url": {"type": "string"}}},
        coroutine=call_tool,
        response_format="content_and_artifact",
    )


def _mcp_run(mcp_tool: Any) -> Setup:
    def script(step: int, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        if step > TURNS:
            return []
        return [*_calls(step, "fetch", width=1, url="x"), *_calls(step + 100, width=1)]

    setup = Setup("shadow")
    agent = create_agent(
        ScriptedModel(script=script),
        tools=[mcp_tool, run_shell],
        middleware=[ToolErrorMiddleware(_as_message), setup.middleware],
    )
    asyncio.run(agent.ainvoke(INPUT, {"recursion_limit": 100}))
    return setup


def _tool_types(setup: Setup) -> dict[str, set[Any]]:
    found: dict[str, set[Any]] = {}
    for span in setup.harness.span_exporter.get_finished_spans():
        attributes = span.attributes or {}
        if attributes.get("gen_ai.operation.name") == "execute_tool":
            name = str(attributes["gen_ai.tool.name"])
            found.setdefault(name, set()).add(attributes.get("acp.tool.type"))
    return found


def test_a_tool_of_langchain_mcp_adapters_is_recorded_as_mcp() -> None:
    setup = _mcp_run(_mcp_shaped_tool())
    assert _tool_types(setup) == {"fetch": {"mcp"}, "run_shell": {"native"}}
    assert {o[2] for o in setup.observations()} == {"tool_exception"}


def test_a_tool_converted_by_langchain_mcp_adapters_is_recorded_as_mcp() -> None:
    adapters = pytest.importorskip(
        "langchain_mcp_adapters.tools", reason="langchain-mcp-adapters (needs mcp<2) not installed"
    )
    from mcp.types import Tool as MCPTool

    definition = MCPTool(
        name="fetch", inputSchema={"type": "object", "properties": {"url": {"type": "string"}}}
    )
    # No server: the tool only needs one when it runs, and its connection fails at once.
    connection = {"transport": "stdio", "command": "/nonexistent/mcp-server", "args": []}
    converted = adapters.convert_mcp_tool_to_langchain_tool(
        None, definition, connection=connection, handle_tool_errors=False
    )
    setup = _mcp_run(converted)
    assert _tool_types(setup) == {"fetch": {"mcp"}, "run_shell": {"native"}}


# -- beside the LangChain instrumentations of the compatibility matrix --------------------------

INSTRUMENTATIONS = {
    "openinference": ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
    "openllmetry": ("opentelemetry.instrumentation.langchain", "LangchainInstrumentor"),
}

# Run in a process of its own: an instrumentation patches LangChain process-wide, and one
# instrumented again after uninstrument() no longer traces everything.
_INSTRUMENTED_RUN = """
import importlib, json, sys
import test_langchain as t
module, name = t.INSTRUMENTATIONS[sys.argv[1]]
setup = t.Setup("enforce")
instrumentor = getattr(importlib.import_module(module), name)()
instrumentor.instrument(tracer_provider=setup.harness.tracer_provider)
model = t.ScriptedModel(script=t.failing)
try:
    t._invoke(setup.agent(model))
    stopped = False
except t.RepeatedToolFailureStopped:
    stopped = True
instrumentor.uninstrument()
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter
with open(sys.argv[2], "w", encoding="utf-8") as stream:
    OtlpJsonSpanExporter(stream).export(setup.harness.span_exporter.get_finished_spans())
print(json.dumps({
    "stopped": stopped,
    "reminders": model.reminders(),
    "acp": [e.decision.kind for e in setup.evaluations if e.profile == "acp"],
    "profiles": sorted({e.profile for e in setup.evaluations}),
    "decisions": setup.decisions(),
}))
"""


def _instrumented_enforce_run(name: str, spans: Path) -> dict[str, Any]:
    """The enforce run beside instrumentation ``name``, its spans written to ``spans``."""
    pytest.importorskip(INSTRUMENTATIONS[name][0], reason="needs the 'matrix-langgraph' extra")
    return run_isolated(_INSTRUMENTED_RUN, name, str(spans))


@pytest.mark.parametrize("name", sorted(INSTRUMENTATIONS))
def test_beside_an_instrumentation_enforce_still_reminds_once_then_stops(
    name: str, tmp_path: Path
) -> None:
    run = _instrumented_enforce_run(name, tmp_path / "spans.jsonl")
    assert run["stopped"] and run["reminders"] == [False, False, False, False, True]
    assert run["acp"] == ["tracked", "tracked", "tracked", "warn", "stop"]


# Both instrumentations' agent spans have the section 3 prompt span below them, through a node
# span that ended first, so the guard hands their prompt over instead of deciding it: OpenLLMetry's
# `invoke_agent LangGraph` through the current context, OpenInference's root `LangGraph` chain
# through the middleware's look-up of its current span (its spans are never made current).
@pytest.mark.parametrize("name", sorted(INSTRUMENTATIONS))
def test_beside_an_instrumentation_each_batch_is_decided_once(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from otel_guard.cli import main

    path = tmp_path / "spans.jsonl"
    run = _instrumented_enforce_run(name, path)
    assert run["profiles"] == ["acp"]
    assert run["decisions"] == {"tracked": 3, "warned": 1, "stopped": 1}
    # Replayed (in shadow, the replay's default: the host's stop is not replayed), the spans
    # give one prompt, decided once, with no invariant broken.
    assert main(["replay", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["prompts"], report["invariant_violations"]) == (1, 0)
    assert {k: v for k, v in report["decisions"].items() if v} == {
        "tracked": 3,
        "would_warn": 1,
        "would_stop": 1,
    }


def _prompt_span_parents(setup: Setup) -> list[int | None]:
    return [
        None if span.parent is None else span.parent.span_id
        for span in setup.harness.span_exporter.get_finished_spans()
        if "acp.prompt.id" in (span.attributes or {}) and span.name == "invoke_agent"
    ]


def test_openinference_loaded_but_not_instrumenting_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip(INSTRUMENTATIONS["openinference"][0], reason="needs 'matrix-langgraph'")
    setup = Setup("enforce")
    with pytest.raises(RepeatedToolFailureStopped):
        _invoke(setup.agent(ScriptedModel(script=failing)))
    assert _prompt_span_parents(setup) == [None]
    assert capsys.readouterr().out == ""  # its "Missing `tracer`" notice is never provoked


def test_a_failing_openinference_look_up_leaves_the_run_guarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = pytest.importorskip(INSTRUMENTATIONS["openinference"][0], reason="matrix-langgraph")

    def broken() -> Any:
        raise RuntimeError("instrumentation changed")

    monkeypatch.setattr(module.LangChainInstrumentor, "is_instrumented_by_opentelemetry", True)
    monkeypatch.setattr(module, "get_current_span", broken)
    setup = Setup("enforce")
    with pytest.raises(RepeatedToolFailureStopped):
        _invoke(setup.agent(ScriptedModel(script=failing)))
    assert _prompt_span_parents(setup) == [None]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
