"""The guard as a hook provider of a real Strands agent, offline with a scripted model provider."""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("strands", reason="the Strands integration needs the 'strands' extra")

from contract_spans import contract_spans
from harness import Harness, run_isolated
from strands import Agent, tool
from strands.hooks import BeforeToolCallEvent, HookProvider, HookRegistry
from strands.models.model import Model

from otel_guard import BatchEvaluation
from otel_guard.integrations.strands import RepeatedToolFailureHooks
from otel_guard.reducer import REMINDER, STOP_MESSAGE

TURNS = 6
Script = Callable[[int], list[tuple[str, str]]]


def failing(step: int) -> list[tuple[str, str]]:
    return [("run_shell", '{"command": "make"}')] * 2 if step <= TURNS else []


class ScriptedModel(Model):
    """A model provider streaming scripted tool uses; no tool use ends the invocation."""

    def __init__(self, script: Script = failing) -> None:
        self.script = script
        self.requests: list[Any] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.requests.append(copy.deepcopy(messages))
        step = len(self.requests)
        calls = self.script(step)
        yield {"messageStart": {"role": "assistant"}}
        for i, (name, arguments) in enumerate(calls):
            use = {"toolUseId": f"s{step}-c{i}", "name": name}
            yield {"contentBlockStart": {"start": {"toolUse": use}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": arguments}}}}
            yield {"contentBlockStop": {}}
        if not calls:
            yield {"contentBlockDelta": {"delta": {"text": "giving up"}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use" if calls else "end_turn"}}

    def reminders(self) -> list[bool]:
        return [
            any(b.get("text") == REMINDER for m in request for b in m["content"])
            for request in self.requests
        ]


@tool
def run_shell(command: str) -> str:
    """Run a shell command."""
    raise OSError(f"{command}: exit status 2")


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "contents"


class DenyShell(HookProvider):
    """A permission hook that refuses every run_shell call before it runs."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.deny)

    def deny(self, event: BeforeToolCallEvent) -> None:
        if event.tool_use["name"] == "run_shell":
            event.cancel_tool = "not allowed"


class Setup:
    def __init__(self, mode: str, **kwargs: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        self.harness = Harness(mode=mode, listener=self.evaluations.append)
        self.hooks = RepeatedToolFailureHooks(
            self.harness.guard, tracer_provider=self.harness.tracer_provider, **kwargs
        )

    def run(self, model: ScriptedModel, *others: HookProvider) -> Any:
        agent = Agent(
            model=model,
            tools=[run_shell, read_file],
            hooks=[*others, self.hooks],
            callback_handler=None,
        )
        return agent("build it")

    def decisions(self) -> dict[str, int]:
        return self.harness.decision_counts()

    def observations(self) -> list[tuple[str, str | None, str | None]]:
        return sorted(
            (o.call_id, o.execution_status, o.execution_error_type)
            for e in self.evaluations
            for o in e.batch.observations
        )


def test_enforce_reminds_once_then_ends_the_invocation_without_another_model_call() -> None:
    setup = Setup("enforce")
    model = ScriptedModel()
    result = setup.run(model)
    assert len(model.requests) == 5
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert str(result).strip() == STOP_MESSAGE
    assert setup.hooks.stopped == setup.evaluations[0].prompt_id
    assert len(setup.harness.logs("acp.loop_detected")) == 1
    spans = setup.harness.span_exporter.get_finished_spans()
    assert [s.name for s in spans if s.name == "invoke_agent"] == ["invoke_agent"]


def test_shadow_never_acts_and_decides_would_warn_then_would_stop() -> None:
    setup = Setup("shadow")
    model = ScriptedModel()
    assert str(setup.run(model)).strip() == "giving up"
    assert len(model.requests) == TURNS + 1
    assert not any(model.reminders())
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}
    kinds = [e.decision.kind for e in setup.evaluations]
    assert kinds[:5] == ["tracked", "tracked", "tracked", "would_warn", "would_stop"]
    assert all(e.action is None and e.batch.complete for e in setup.evaluations)
    assert setup.hooks.stopped is None


def test_shadow_leaves_the_run_exactly_as_without_the_guard() -> None:
    plain, guarded = ScriptedModel(), ScriptedModel()
    Agent(model=plain, tools=[run_shell], callback_handler=None)("build it")
    Setup("shadow").run(guarded)
    assert plain.requests == guarded.requests


def test_warn_reminds_once_and_never_stops() -> None:
    setup = Setup("warn")
    model = ScriptedModel()
    setup.run(model)
    assert model.reminders() == [False, False, False, False, True, True, True]  # in history
    assert setup.decisions() == {"tracked": 3, "warned": 1, "would_stop": 1}


def test_failures_are_typed_from_the_exception_class() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        if step > 1:
            return []
        return [("run_shell", '{"command": "make"}'), ("read_file", '{"path": "a"}')]

    setup = Setup("shadow")
    setup.run(ScriptedModel(script))
    assert setup.observations() == [("s1-c0", "error", "os_error"), ("s1-c1", "success", None)]
    tools = [
        s
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name.startswith("execute_tool")
    ]
    assert {(s.attributes or {}).get("acp.tool.type") for s in tools} == {"native"}


def test_denied_calls_and_unknown_tools_never_count() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        return [("run_shell", '{"command": "make"}'), ("launch", "{}")] if step <= TURNS else []

    setup = Setup("enforce")
    model = ScriptedModel(script)
    setup.run(model, DenyShell())
    assert {o[1:] for o in setup.observations()} == {("not_started", None)}
    assert len(setup.observations()) == 2 * TURNS
    assert setup.decisions() == {} and not any(model.reminders())


@pytest.mark.parametrize("arguments", ['{"command": 3}', "{}"])
def test_input_that_fails_the_tools_schema_never_counts(arguments: str) -> None:
    # Strands raises before the tool runs: a validation failure, however often it repeats.
    def script(step: int) -> list[tuple[str, str]]:
        return [("run_shell", arguments)] * 2 if step <= TURNS else []

    setup = Setup("enforce")
    model = ScriptedModel(script)
    setup.run(model)
    assert {o[1:] for o in setup.observations()} == {("not_started", None)}
    assert len(setup.observations()) == 2 * TURNS
    assert setup.decisions() == {} and not any(model.reminders())


class ApproveShell(HookProvider):
    """A human approves each run_shell call through a Strands interrupt."""

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.approve)

    def approve(self, event: BeforeToolCallEvent) -> None:
        if event.tool_use["name"] == "run_shell" and event.interrupt("approve") != "yes":
            event.cancel_tool = "not approved"


def test_calls_approved_through_an_interrupt_stay_in_their_batch_and_prompt() -> None:
    def script(step: int) -> list[tuple[str, str]]:
        if step > TURNS:
            return []
        return [("run_shell", '{"command": "make"}')] * 2 + [("read_file", '{"path": "a"}')]

    setup = Setup("enforce")
    model = ScriptedModel(script)
    agent = Agent(
        model=model,
        tools=[run_shell, read_file],
        hooks=[ApproveShell(), setup.hooks],
        callback_handler=None,
    )
    result = agent("build it")
    for _ in range(2 * TURNS):
        if result.stop_reason != "interrupt":
            break
        result = agent(
            [
                {"interruptResponse": {"interruptId": i.id, "response": "yes"}}
                for i in result.interrupts
            ]
        )
    assert str(result).strip() == STOP_MESSAGE
    assert len(model.requests) == 5 and model.reminders() == [False] * 4 + [True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert len({e.prompt_id for e in setup.evaluations}) == 1  # resumes go on with the prompt
    # Each call once, in the batch of its model response: the interrupt did not split it.
    assert [sorted(o.call_id for o in e.batch.observations) for e in setup.evaluations] == [
        [f"s{step}-c{i}" for i in range(3)] for step in range(1, 6)
    ]
    assert setup.observations() == sorted(
        (f"s{step}-c{i}", "error", "os_error") if i < 2 else (f"s{step}-c{i}", "success", None)
        for step in range(1, 6)
        for i in range(3)
    )


def test_a_channel_prompt_is_never_guarded() -> None:
    setup = Setup("enforce", channel=True)
    model = ScriptedModel()
    setup.run(model)
    assert setup.decisions() == {} and not any(model.reminders())


def test_each_invocation_is_a_fresh_prompt() -> None:
    setup = Setup("enforce")
    for _ in range(2):
        model = ScriptedModel()
        setup.run(model)
        assert len(model.requests) == 5
    assert setup.decisions() == {"tracked": 6, "warned": 2, "stopped": 2}
    assert len({e.prompt_id for e in setup.evaluations}) == 2


def test_without_a_tracer_provider_the_guard_still_sees_every_batch() -> None:
    harness = Harness(mode="enforce")
    agent = Agent(
        model=ScriptedModel(),
        tools=[run_shell],
        hooks=[RepeatedToolFailureHooks(harness.guard)],
        callback_handler=None,
    )
    assert str(agent("build it")).strip() == STOP_MESSAGE
    assert harness.decision_counts() == {"tracked": 3, "warned": 1, "stopped": 1}
    assert harness.span_exporter.get_finished_spans() == ()


def test_an_unknown_route_is_rejected() -> None:
    with pytest.raises(ValueError, match="route"):
        RepeatedToolFailureHooks(Harness().guard, route="nightly")


def test_documented_example_stops_after_five_responses(capsys: pytest.CaptureFixture[str]) -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "strands.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "RepeatedToolFailureHooks(guard)" in b]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(example, str(page), "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == [STOP_MESSAGE]
    assert namespace["model"].responses == 5


def test_an_mcp_tool_is_recorded_as_mcp() -> None:
    from mcp.types import Tool as MCPTool
    from strands.tools.mcp import MCPAgentTool

    class FailingMCPTool(MCPAgentTool):
        """An MCP tool whose server call fails (no server needed)."""

        async def stream(self, tool_use: Any, invocation_state: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("server went away")
            yield  # an async generator, like the real one

    mcp_tool = FailingMCPTool(MCPTool(name="fetch", inputSchema={"type": "object"}), None)  # type: ignore[arg-type]

    def script(step: int) -> list[tuple[str, str]]:
        return [("fetch", "{}")] * 2 if step <= TURNS else []

    setup = Setup("shadow")
    agent = Agent(
        model=ScriptedModel(script), tools=[mcp_tool], hooks=[setup.hooks], callback_handler=None
    )
    agent("fetch it")
    tools = [
        s
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name == "execute_tool fetch"
    ]
    assert len(tools) == 2 * TURNS
    assert {(s.attributes or {}).get("acp.tool.type") for s in tools} == {"mcp"}
    assert setup.observations()[0][1:] == ("error", "connection_reset_error")
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}


def test_guard_bookkeeping_that_fails_never_reaches_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_guard.integrations import producer

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bookkeeping failed")

    monkeypatch.setattr(producer.ToolBatch, "start_call", broken)
    setup = Setup("enforce")
    model = ScriptedModel()
    assert str(setup.run(model)).strip() == "giving up"
    assert len(model.requests) == TURNS + 1 and setup.decisions() == {}


def test_exported_spans_replay_to_the_live_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from otel_guard.cli import main
    from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

    setup = Setup("shadow")
    setup.run(ScriptedModel())
    path = tmp_path / "strands.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(setup.harness.span_exporter.get_finished_spans())
    assert main(["replay", "--format", "json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["invariant_violations"] == 0
    assert {k: v for k, v in report["decisions"].items() if v} == setup.decisions()


def test_a_call_cancelled_while_it_ran_is_cancelled() -> None:
    from mcp.types import Tool as MCPTool
    from strands.tools.mcp import MCPAgentTool
    from strands.types._events import ToolResultEvent

    class CancelledMCPTool(MCPAgentTool):
        """An MCP call that the agent cancelled while the server worked on it."""

        async def stream(self, tool_use: Any, invocation_state: Any, **kwargs: Any) -> Any:
            yield ToolResultEvent(
                {
                    "toolUseId": tool_use["toolUseId"],
                    "status": "error",
                    "content": [{"text": "cancelled"}],
                    "cancelled": True,
                }
            )

    mcp_tool = CancelledMCPTool(MCPTool(name="fetch", inputSchema={"type": "object"}), None)  # type: ignore[arg-type]

    def script(step: int) -> list[tuple[str, str]]:
        return [("fetch", "{}")] if step == 1 else []

    setup = Setup("shadow")
    Agent(
        model=ScriptedModel(script), tools=[mcp_tool], hooks=[setup.hooks], callback_handler=None
    )("fetch it")
    tools = [
        s
        for s in setup.harness.span_exporter.get_finished_spans()
        if s.name == "execute_tool fetch"
    ]
    assert [(s.attributes or {}).get("acp.tool.status") for s in tools] == ["cancelled"]
    assert setup.observations() == [("s1-c0", "cancelled", None)]


# -- streamed invocations: the same batches, reminder and stop as agent(...) ---------------------


def _contract_spans_of_a_call(mode: str) -> dict[str, Any]:
    setup = Setup(mode)
    setup.run(ScriptedModel())
    return contract_spans(setup.harness.span_exporter.get_finished_spans())


async def _streamed(setup: Setup, model: ScriptedModel) -> tuple[list[str], Any]:
    agent = Agent(
        model=model, tools=[run_shell, read_file], hooks=[setup.hooks], callback_handler=None
    )
    texts: list[str] = []
    result = None
    async for event in agent.stream_async("build it"):
        if "data" in event:
            texts.append(event["data"])
        result = event.get("result", result)
    return texts, result


def test_a_streamed_invocation_is_guarded_like_a_call_shadow_then_enforce() -> None:
    setup = Setup("shadow")
    model = ScriptedModel()
    texts, result = asyncio.run(_streamed(setup, model))
    assert texts == ["giving up"] and str(result).strip() == "giving up"
    assert len(model.requests) == TURNS + 1 and not any(model.reminders())
    assert setup.decisions() == {"tracked": 3, "would_warn": 1, "would_stop": 1}
    spans = contract_spans(setup.harness.span_exporter.get_finished_spans())
    assert spans == _contract_spans_of_a_call("shadow")

    setup = Setup("enforce")
    model = ScriptedModel()
    texts, result = asyncio.run(_streamed(setup, model))
    # The stop ends the invocation without another model call: its text is the final message.
    assert texts == [] and str(result).strip() == STOP_MESSAGE
    assert setup.hooks.stopped == setup.evaluations[0].prompt_id
    assert model.reminders() == [False, False, False, False, True]
    assert setup.decisions() == {"tracked": 3, "warned": 1, "stopped": 1}
    spans = contract_spans(setup.harness.span_exporter.get_finished_spans())
    assert spans == _contract_spans_of_a_call("enforce")
    assert len(spans["batches"]) == 5 and not spans["stray"]


# Strands' own GenAI spans go to the global TracerProvider, which install_guard() sets: run with
# the guard's provider as the global one, in a process of its own (a global provider is set once).
_WITH_NATIVE_SPANS = """
import json, sys
from opentelemetry import trace
import test_strands as t
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter
setup = t.Setup("enforce")
trace.set_tracer_provider(setup.harness.tracer_provider)
model = t.ScriptedModel()
setup.run(model)
spans = setup.harness.span_exporter.get_finished_spans()
with open(sys.argv[1], "w", encoding="utf-8") as stream:
    OtlpJsonSpanExporter(stream).export(spans)
print(json.dumps({
    "reminders": model.reminders(),
    "profiles": sorted({e.profile for e in setup.evaluations}),
    "decisions": setup.decisions(),
    "native": sum(s.name == "invoke_agent Strands Agents" for s in spans),
}))
"""


def test_beside_strands_own_spans_each_batch_is_decided_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from otel_guard.cli import main

    spans = tmp_path / "strands-native.jsonl"
    run = run_isolated(_WITH_NATIVE_SPANS, str(spans))
    # The hooks' prompt span starts below Strands' agent span: that inferred prompt is handed
    # over, so only the section 3 batches are decided, and enforce works as without the spans.
    assert run["native"] == 1
    assert run["reminders"] == [False, False, False, False, True]
    assert run["profiles"] == ["acp"]
    assert run["decisions"] == {"tracked": 3, "warned": 1, "stopped": 1}
    assert main(["replay", "--format", "json", str(spans)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["prompts"], report["invariant_violations"]) == (1, 0)
    assert report["profiles"]["genai"] == 0
