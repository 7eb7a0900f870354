"""The guard as run hooks of a real OpenAI Agents SDK run, offline with a scripted Model."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "agents", reason="the OpenAI Agents SDK integration needs the 'openai-agents' extra"
)

import agents
from agents.items import ModelResponse
from agents.mcp import MCPServer
from agents.models.interface import Model
from agents.usage import Usage
from contract_spans import contract_spans
from harness import Harness
from mcp.types import Tool as MCPTool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
)

from otel_guard import BatchEvaluation
from otel_guard.integrations.openai_agents import (
    RepeatedToolFailureHooks,
    RepeatedToolFailureStopped,
)
from otel_guard.reducer import REMINDER, STOP_MESSAGE

TURNS = 6


@pytest.fixture(autouse=True)
def _no_sdk_tracing() -> Iterator[None]:
    agents.set_tracing_disabled(True)  # the SDK's own trace export would reach for the network
    yield
    agents.set_tracing_disabled(False)


Script = Callable[[int], list[tuple[str, str]]]  # step -> [(tool name, arguments JSON)]


def failing(step: int) -> list[tuple[str, str]]:
    return [("run_shell", '{"command": "make"}')] * 2 if step <= TURNS else []


class ScriptedModel(Model):  # type: ignore[misc]
    def __init__(self, script: Script = failing) -> None:
        self.script = script
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.inputs.append(list(input) if isinstance(input, list) else [input])
        step = len(self.inputs)
        calls = self.script(step)
        output: list[Any] = [
            ResponseFunctionToolCall(
                id=f"f{step}-{i}",
                call_id=f"s{step}-c{i}",
                type="function_call",
                name=name,
                arguments=arguments,
            )
            for i, (name, arguments) in enumerate(calls)
        ]
        if not calls:
            text = ResponseOutputText(type="output_text", text="giving up", annotations=[])
            output = [
                ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=[text]
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def reminders(self) -> list[bool]:
        return [
            any(isinstance(i, dict) and i.get("content") == REMINDER for i in items)
            for items in self.inputs
        ]


@agents.function_tool
def run_shell(command: str) -> str:
    """Run a shell command."""
    raise OSError(f"{command}: exit status 2")


@agents.function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return "contents"


@agents.function_tool(needs_approval=True)
def deploy() -> str:
    """Deploy."""
    return "deployed"


class Setup:
    def __init__(self, mode: str, **kwargs: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        self.harness = Harness(mode=mode, listener=self.evaluations.append)
        self.kwargs = kwargs

    def run(self, model: ScriptedModel, **kwargs: Any) -> Any:
        hooks = RepeatedToolFailureHooks(
            self.harness.guard, tracer_provider=self.harness.tracer_provider, **self.kwargs
        )
        agent = agents.Agent(name="builder", model=model, tools=[run_shell, read_file, deploy])
        with hooks:
            return asyncio.run(
                agents.Runner.run(
                    agent, "build it", hooks=hooks, run_config=hooks.run_config(), **kwargs
                )
            )

    def decisions(self) -> dict[str, int]:
        return self.harness.decision_counts()

    def observations(self) -> list[tuple[str, str | None, str | None]]:
        return sorted(
            (o.call_id, o.execution_status, o.execution_error_type)
            for e in self.evaluations
            for o in e.batch.observations
        )


def test_enforce_reminds_once_then_stops_before_the_next_model_call() -> None:
    setup = Setup("enforce")
    model = ScriptedModel()
    with pytest.raises(RepeatedToolFailureStopped) as raised:
        setup.run(model)
    assert len(model.inputs) == 5
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert len(setup.harness.logs("acp.loop_detected")) == 1
    stopped = raised.value
    assert stopped.message == STOP_MESSAGE
    assert stopped.input[-1] == {"role": "system", "content": STOP_MESSAGE}
    outputs = [
        i["call_id"]
        for i in stopped.input
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    assert outputs[-2:] == ["s5-c0", "s5-c1"]
    spans = setup.harness.span_exporter.get_finished_spans()
    assert [s.name for s in spans if s.name == "invoke_agent"] == ["invoke_agent"]


def test_shadow_never_acts_and_decides_would_warn_then_would_stop() -> None:
    setup = Setup("shadow")
    model = ScriptedModel()
    assert setup.run(model).final_output == "giving up"
    assert len(model.inputs) == TURNS + 1
    assert not any(model.reminders())
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}
    kinds = [e.decision.kind for e in setup.evaluations]
    assert kinds[:5] == ["tracked", "tracked", "tracked", "would_warn", "would_stop"]
    assert all(e.action is None and e.batch.complete for e in setup.evaluations)


def test_shadow_leaves_the_run_exactly_as_without_the_guard() -> None:
    plain = ScriptedModel()
    agent = agents.Agent(name="builder", model=plain, tools=[run_shell])
    asyncio.run(agents.Runner.run(agent, "build it"))
    guarded = ScriptedModel()
    Setup("shadow").run(guarded)
    assert plain.inputs == guarded.inputs


def test_warn_reminds_once_and_never_stops() -> None:
    setup = Setup("warn")
    model = ScriptedModel()
    setup.run(model)
    assert model.reminders() == [False, False, False, False, True, False, False]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "would_stop": 1}


def test_failures_are_typed_from_the_exception_class() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        return (
            [("run_shell", '{"command": "make"}'), ("read_file", '{"path": "a"}')]
            if step == 1
            else []
        )

    setup = Setup("shadow")
    setup.run(ScriptedModel(script))
    assert setup.observations() == [("s1-c0", "error", "os_error"), ("s1-c1", "success", None)]


def test_rejected_approvals_and_unknown_tools_never_count() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        return [("deploy", "{}"), ("launch", "{}")] if step == 1 else []

    setup = Setup("shadow")
    guard, provider = setup.harness.guard, setup.harness.tracer_provider
    agent = agents.Agent(name="builder", model=ScriptedModel(script), tools=[deploy])
    kinds: list[str] = []

    def formatter(args: Any) -> None:
        kinds.append(args.kind)  # the SDK's message stays

    config = agents.RunConfig(
        tool_not_found_behavior="return_error_to_model", tool_error_formatter=formatter
    )
    with RepeatedToolFailureHooks(guard, tracer_provider=provider) as hooks:
        run_config = hooks.run_config(config)
        result = asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=run_config))
        assert result.interruptions, "the approval was not requested"
        state = result.to_state()
        for interruption in result.interruptions:
            state.reject(interruption)
        asyncio.run(agents.Runner.run(agent, state, hooks=hooks, run_config=run_config))
    assert sorted(kinds) == ["approval_rejected", "tool_not_found"]
    assert setup.observations() == [("s1-c0", "not_started", None), ("s1-c1", "not_started", None)]
    assert setup.decisions() == {}


@pytest.mark.parametrize("arguments", ['{"command": 3}', "{not json", "{}", "[1]"])
def test_arguments_that_fail_the_tools_schema_never_count(arguments: str) -> None:
    # The SDK raises before the tool runs: a validation failure, however often it repeats.
    def script(step: int) -> list[tuple[str, str]]:
        return [("run_shell", arguments)] * 2 if step <= 4 else []

    setup = Setup("enforce")
    model = ScriptedModel(script)
    result = setup.run(model)
    assert result.final_output == "giving up"  # never stopped
    assert model.reminders() == [False] * 5
    assert {status for _, status, _ in setup.observations()} == {"not_started"}
    assert "warned" not in setup.decisions() and "stopped" not in setup.decisions()


def test_a_channel_prompt_is_never_guarded() -> None:
    setup = Setup("enforce", channel=True)
    model = ScriptedModel()
    setup.run(model)
    assert setup.decisions() == {} and not any(model.reminders())


def test_without_a_tracer_provider_the_guard_still_sees_every_batch() -> None:
    harness = Harness(mode="enforce")
    hooks = RepeatedToolFailureHooks(harness.guard)
    agent = agents.Agent(name="builder", model=ScriptedModel(), tools=[run_shell])
    with pytest.raises(RepeatedToolFailureStopped):
        asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=hooks.run_config()))
    assert harness.decision_counts() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert harness.span_exporter.get_finished_spans() == ()


def test_a_run_that_raises_ends_its_prompt_on_close() -> None:
    setup = Setup("shadow")
    with pytest.raises(agents.MaxTurnsExceeded):
        setup.run(ScriptedModel(), max_turns=3)
    names = [s.name for s in setup.harness.span_exporter.get_finished_spans()]
    assert names.count("invoke_agent") == 1


def test_hooks_reused_for_a_second_run_guard_it_as_a_new_prompt() -> None:
    setup = Setup("enforce")
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    prompt_ids = []
    for _ in range(2):  # one after the other, as a chat loop would
        model = ScriptedModel()
        agent = agents.Agent(name="builder", model=model, tools=[run_shell])
        with pytest.raises(RepeatedToolFailureStopped) as raised:
            asyncio.run(
                agents.Runner.run(agent, "build it", hooks=hooks, run_config=hooks.run_config())
            )
        assert len(model.inputs) == 5 and model.reminders() == [False] * 4 + [True]
        prompt_ids.append(raised.value.prompt_id)
    assert prompt_ids[0] != prompt_ids[1]
    assert setup.decisions() == {"tracked": 6, "warned": 2, "stopped": 2}


def test_calls_left_running_by_a_run_that_raised_are_never_recorded_as_not_started() -> None:
    @agents.function_tool(failure_error_function=None)
    def run_build(command: str) -> str:
        """Run the build."""
        raise OSError("exit status 2")  # no failure function: the exception ends the run

    setup = Setup("shadow")
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    model = ScriptedModel(lambda step: [("run_build", '{"command": "make"}')] * 2)
    agent = agents.Agent(name="builder", model=model, tools=[run_build])
    with pytest.raises(agents.UserError), hooks:
        asyncio.run(
            agents.Runner.run(agent, "build it", hooks=hooks, run_config=hooks.run_config())
        )
    calls = [
        s.attributes or {}
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name == "execute_tool run_build"
    ]
    assert len(calls) == 2
    assert {a["acp.tool.execution.status"] for a in calls} == {"unknown"}  # they ran
    (evaluation,) = setup.evaluations
    assert not evaluation.batch.complete  # torn down with the run


def test_hooks_without_their_run_config_say_so_and_disable_enforcement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    setup = Setup("enforce")
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    model = ScriptedModel()
    agent = agents.Agent(name="builder", model=model, tools=[run_shell])
    with caplog.at_level("WARNING", logger="otel_guard.integrations.openai_agents"), hooks:
        result = asyncio.run(agents.Runner.run(agent, "build it", hooks=hooks))  # no run_config
    assert result.final_output == "giving up"
    (warning,) = [r for r in caplog.records if "run_config" in r.getMessage()]
    assert warning.levelname == "WARNING"
    reasons = {
        str(a.get("reset_reason")) for a, _ in setup.harness.points() if a["decision"] == "reset"
    }
    assert reasons == {"unreliable_input"}  # what the guard was shown cannot be trusted
    assert all(e.decision.state.enforcement_disabled for e in setup.evaluations[1:])


def test_an_unknown_route_is_rejected() -> None:
    with pytest.raises(ValueError, match="route"):
        RepeatedToolFailureHooks(Harness().guard, route="nightly")


def test_documented_example_stops_after_five_responses(capsys: pytest.CaptureFixture[str]) -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "openai-agents.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "RepeatedToolFailureHooks(guard)" in b]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(example, str(page), "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == [STOP_MESSAGE]
    assert namespace["model"].responses == 5


def test_guard_bookkeeping_that_fails_never_reaches_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_guard.integrations import producer

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bookkeeping failed")

    monkeypatch.setattr(producer.ToolBatch, "start_call", broken)
    setup = Setup("enforce")
    model = ScriptedModel()
    assert setup.run(model).final_output == "giving up"
    assert len(model.inputs) == TURNS + 1 and setup.decisions() == {}


def test_a_formatter_in_the_base_config_still_writes_the_message() -> None:
    seen: list[str] = []

    def formatter(args: Any) -> str:
        seen.append(args.kind)
        return f"failed: {type(args.error).__name__}"

    setup = Setup("shadow")
    model = ScriptedModel()
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    agent = agents.Agent(name="builder", model=model, tools=[run_shell])
    with hooks:
        config = hooks.run_config(agents.RunConfig(tool_error_formatter=formatter))
        asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=config))
    assert seen == ["tool_exception"] * 2 * TURNS
    outputs = [
        i
        for i in model.inputs[1]
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    assert {o["output"] for o in outputs} == {"failed: OSError"}
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}


def test_exported_spans_replay_to_the_live_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from otel_guard.cli import main
    from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

    setup = Setup("shadow")
    setup.run(ScriptedModel())
    path = tmp_path / "openai-agents.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(setup.harness.span_exporter.get_finished_spans())
    assert main(["replay", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["invariant_violations"] == 0
    assert {k: v for k, v in report["decisions"].items() if v} == setup.decisions()


def test_beside_the_sdks_own_instrumentation_each_batch_is_decided_once() -> None:
    instrumentation = pytest.importorskip(
        "opentelemetry.instrumentation.openai_agents",
        reason="the SDK's instrumentation needs the 'openai-agents' extra",
    )
    agents.set_tracing_disabled(False)
    agents.set_trace_processors([])  # the SDK's own export would leave the machine
    setup = Setup("enforce")
    instrumentor = instrumentation.OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=setup.harness.tracer_provider)
    try:
        model = ScriptedModel()
        with pytest.raises(RepeatedToolFailureStopped):
            setup.run(model)
    finally:
        instrumentor.uninstrument()
        agents.set_trace_processors([])
    assert len(model.inputs) == 5
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert {e.profile for e in setup.evaluations} == {"acp"}
    names = [s.name for s in setup.harness.span_exporter.get_finished_spans()]
    assert names.count("run_shell.tool") == names.count("execute_tool run_shell") == 10


def test_a_cancelled_call_ends_cancelled_and_counts_nothing() -> None:
    @agents.function_tool
    async def wait_for_build() -> str:
        """Wait for the build."""
        raise asyncio.CancelledError  # the task running the tool was cancelled

    def script(step: int) -> list[tuple[str, str]]:
        return [("wait_for_build", "{}")] if step == 1 else []

    setup = Setup("shadow")
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    agent = agents.Agent(name="builder", model=ScriptedModel(script), tools=[wait_for_build])
    with hooks:
        asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=hooks.run_config()))
    (evaluation,) = setup.evaluations
    (observation,) = evaluation.batch.observations
    assert (observation.terminal_status, observation.execution_status) == ("cancelled", "cancelled")
    assert evaluation.decision.kind == "none"


# -- streamed runs: the same batches, reminder and stop as Runner.run ----------------------------


class StreamingModel(ScriptedModel):
    """Streams each scripted response as the Responses API does: items, then the completion."""

    def __init__(self, script: Script = failing) -> None:
        super().__init__(script)
        self.streamed = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a streamed run asks for a stream")

    async def stream_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.streamed += 1
        response = await ScriptedModel.get_response(self, system_instructions, input)
        for index, item in enumerate(response.output):
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=item,
                output_index=index,
                sequence_number=index,
            )
        completed = Response(
            id=f"r{len(self.inputs)}",
            created_at=0,
            model="scripted",
            object="response",
            output=response.output,
            parallel_tool_calls=True,
            tool_choice="auto",
            tools=[],
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=completed, sequence_number=len(response.output)
        )


def _streamed(setup: Setup, model: ScriptedModel) -> Any:
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider, **setup.kwargs
    )
    agent = agents.Agent(name="builder", model=model, tools=[run_shell, read_file, deploy])

    async def consume() -> Any:
        result = agents.Runner.run_streamed(
            agent, "build it", hooks=hooks, run_config=hooks.run_config()
        )
        async for _ in result.stream_events():
            pass
        return result

    with hooks:
        return asyncio.run(consume())


def test_a_streamed_run_is_guarded_like_run_shadow_then_enforce() -> None:
    plain: dict[str, Any] = {}
    for mode in ("shadow", "enforce"):
        setup = Setup(mode)
        with contextlib.suppress(RepeatedToolFailureStopped):
            setup.run(ScriptedModel())
        plain[mode] = contract_spans(setup.harness.span_exporter.get_finished_spans())

    setup = Setup("shadow")
    model = StreamingModel()
    assert _streamed(setup, model).final_output == "giving up"
    assert model.streamed == len(model.inputs) == TURNS + 1 and not any(model.reminders())
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}
    assert contract_spans(setup.harness.span_exporter.get_finished_spans()) == plain["shadow"]

    setup = Setup("enforce")
    model = StreamingModel()
    with pytest.raises(RepeatedToolFailureStopped) as raised:
        _streamed(setup, model)
    assert raised.value.input[-1] == {"role": "system", "content": STOP_MESSAGE}
    assert model.streamed == len(model.inputs) == 5
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    spans = contract_spans(setup.harness.span_exporter.get_finished_spans())
    assert spans == plain["enforce"] and len(spans["batches"]) == 5 and not spans["stray"]


# -- MCP tools -----------------------------------------------------------------------------------


class FailingMCPServer(MCPServer):  # type: ignore[misc]
    """An MCP server in process: it lists one tool, and every call of it fails (no transport)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @property
    def name(self) -> str:
        return "build-server"

    async def connect(self) -> None:
        pass

    async def cleanup(self) -> None:
        pass

    async def list_tools(self, *args: Any, **kwargs: Any) -> list[MCPTool]:
        schema = {"type": "object", "properties": {"url": {"type": "string"}}}
        return [MCPTool(name="fetch", inputSchema=schema)]

    async def call_tool(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise ConnectionResetError("server went away")

    async def list_prompts(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def get_prompt(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_a_tool_listed_from_an_mcp_server_is_recorded_as_mcp() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        return [("fetch", '{"url": "x"}'), ("read_file", '{"path": "a"}')] if step == 1 else []

    setup = Setup("shadow")
    server = FailingMCPServer()
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    agent = agents.Agent(
        name="builder", model=ScriptedModel(script), tools=[read_file], mcp_servers=[server]
    )
    with hooks:
        asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=hooks.run_config()))
    assert server.calls == 1
    types = {
        str((s.attributes or {})["gen_ai.tool.name"]): (s.attributes or {}).get("acp.tool.type")
        for s in setup.harness.span_exporter.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.operation.name") == "execute_tool"
    }
    assert types == {"fetch": "mcp", "read_file": "native"}
    (evaluation,) = setup.evaluations
    observations = {o.call_id: o for o in evaluation.batch.observations}
    assert observations["s1-c0"].tool_type == "mcp"
    # The server's exception, not a cancellation: the SDK formats MCP failures on its own path.
    assert (observations["s1-c0"].terminal_status, observations["s1-c0"].execution_status) == (
        "error",
        "error",
    )
    assert observations["s1-c0"].execution_error_type == "connection_reset_error"
    assert observations["s1-c1"].execution_status == "success"


def test_mcp_failures_repeated_across_turns_are_warned_then_stopped() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        return [("fetch", '{"url": "x"}')] * 2 if step <= TURNS else []

    setup = Setup("enforce")
    model = ScriptedModel(script)
    hooks = RepeatedToolFailureHooks(
        setup.harness.guard, tracer_provider=setup.harness.tracer_provider
    )
    agent = agents.Agent(name="builder", model=model, mcp_servers=[FailingMCPServer()])
    with hooks, pytest.raises(RepeatedToolFailureStopped):
        asyncio.run(agents.Runner.run(agent, "x", hooks=hooks, run_config=hooks.run_config()))
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
