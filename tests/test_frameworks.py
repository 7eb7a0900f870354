"""Real frameworks traced by their own OpenTelemetry instrumentation, read by the GenAI profile.

Offline: each framework runs with a scripted model. No integration code: the guard is only a
span processor in the framework's tracer provider.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Harness

from otel_guard.cli import main
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

# -- pydantic-ai's own Instrumentation ----------------------------------------------------------


def _pydantic_ai() -> Any:
    return pytest.importorskip(
        "pydantic_ai", reason="pydantic-ai's instrumentation needs the 'pydantic-ai' extra"
    )


def _scripts() -> dict[str, Callable[[int, Any], list[Any]]]:
    from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart

    def failing(step: int, last: Any) -> list[Any]:
        return [
            ToolCallPart("run_shell", {"command": "make"}, tool_call_id=f"s{step}-c{i}")
            for i in range(4)
        ]

    def recovers(step: int, last: Any) -> list[Any]:
        if step == 3:
            return [ToolCallPart("run_shell", {"command": "make -k"}, tool_call_id="fixed")]
        if any(isinstance(p, ToolReturnPart) and p.tool_call_id == "fixed" for p in last.parts):
            return [TextPart("built")]
        return failing(step, last)

    def mixed(step: int, last: Any) -> list[Any]:
        if step > 4:
            return [TextPart("gave up")]
        return [
            *failing(step, last)[:3],
            ToolCallPart("read_file", {"path": "Makefile"}, tool_call_id=f"s{step}-r"),
        ]

    return {"failing": failing, "recovers": recovers, "mixed": mixed}


def _run_pydantic_ai(script: Callable[[int, Any], list[Any]], integrated: bool) -> Harness:
    """One scripted run; the guard reads either pydantic-ai's spans or the integration's."""
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    from otel_guard.integrations.pydantic_ai import RepeatedToolFailureGuard

    harness = Harness(mode="shadow", listener=None)
    steps = [0]

    def model(messages: list[Any], info: Any) -> ModelResponse:
        steps[0] += 1
        return ModelResponse(parts=script(steps[0], messages[-1]))

    if integrated:
        capability: Any = RepeatedToolFailureGuard(harness.guard)  # its own private spans
    else:
        settings = InstrumentationSettings(
            tracer_provider=harness.tracer_provider, include_content=False
        )
        capability = Instrumentation(settings=settings)
    agent = Agent(FunctionModel(model), capabilities=[capability])

    @agent.tool_plain(retries=5)
    def run_shell(command: str) -> str:
        if command == "make":
            raise ModelRetry("make: *** [all] Error 2")
        return "built"

    @agent.tool_plain(retries=5)
    def read_file(path: str) -> str:
        return "all: build"

    try:
        agent.run_sync("build it")
    except Exception as error:  # the failing script ends on pydantic-ai's retry limit
        assert type(error).__name__ == "UnexpectedModelBehavior"
    return harness


@pytest.mark.parametrize("name", ["failing", "recovers", "mixed"])
def test_pydantic_ai_spans_give_the_integrations_shadow_decisions(name: str) -> None:
    _pydantic_ai()
    script = _scripts()[name]
    read_from_spans = _run_pydantic_ai(script, integrated=False)
    integrated = _run_pydantic_ai(script, integrated=True)
    decisions = read_from_spans.decision_counts()
    assert decisions == integrated.decision_counts()
    assert decisions, "each script makes at least one decision"
    spans_sequence = [(a["decision"], a.get("reset_reason")) for a, _ in read_from_spans.points()]
    assert sorted(spans_sequence) == sorted(
        (a["decision"], a.get("reset_reason")) for a, _ in integrated.points()
    )


def test_pydantic_ai_failing_run_is_tracked_warned_and_would_stop() -> None:
    _pydantic_ai()
    harness = _run_pydantic_ai(_scripts()["failing"], integrated=False)
    assert harness.decision_counts() == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    coverage = harness.guard.genai_coverage()
    assert (coverage.prompts, coverage.model_calls, coverage.tool_calls) == (1, 6, 24)


# -- OpenAI Agents SDK with the OpenTelemetry openai-agents instrumentation ----------------------


@pytest.fixture
def openai_agents() -> Any:
    agents = pytest.importorskip(
        "agents", reason="the OpenAI Agents SDK needs the 'openai-agents' extra installed"
    )
    instrumentation = pytest.importorskip(
        "opentelemetry.instrumentation.openai_agents",
        reason="its instrumentation needs the 'openai-agents' extra installed",
    )
    # The SDK's own trace export goes to its vendor: replaced, so nothing leaves the machine.
    agents.set_trace_processors([])
    harness = Harness(mode="shadow", listener=None)
    evaluations: list[Any] = []
    harness.guard._listener = evaluations.append
    instrumentor = instrumentation.OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=harness.tracer_provider)
    yield agents, harness, evaluations
    instrumentor.uninstrument()
    agents.set_trace_processors([])


def _run_openai_agents(openai_agents: Any, fail: bool, turns: int = 3) -> tuple[Harness, list[Any]]:
    agents, harness, evaluations = openai_agents
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.tracing import generation_span
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):  # type: ignore[misc]
        """Calls run_shell twice per turn, then answers; records a generation like real models."""

        def __init__(self) -> None:
            self.step = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            self.step += 1
            with generation_span(model="scripted", input=[], output=[]):
                pass
            if self.step > turns:
                text = ResponseOutputText(type="output_text", text="done", annotations=[])
                output: list[Any] = [
                    ResponseOutputMessage(
                        id="m",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[text],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"f{self.step}{i}",
                        call_id=f"call-{self.step}-{i}",
                        type="function_call",
                        name="run_shell",
                        arguments='{"command":"make"}',
                    )
                    for i in range(2)
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @agents.function_tool
    def run_shell(command: str) -> str:
        if fail:
            raise FileNotFoundError("make: not found")
        return "built"

    agent = agents.Agent(name="builder", model=ScriptedModel(), tools=[run_shell])
    result = asyncio.run(agents.Runner.run(agent, "build it"))
    assert result.final_output == "done"
    return harness, evaluations


def test_openai_agents_turns_become_inferred_batches(openai_agents: Any) -> None:
    harness, evaluations = _run_openai_agents(openai_agents, fail=True)
    assert [len(e.batch.observations) for e in evaluations] == [2, 2, 2]
    assert all(e.profile == "genai" and e.batch.complete for e in evaluations)
    observation = evaluations[0].batch.observations[0]
    assert observation.policy_tool_name == "run_shell"
    assert (observation.terminal_status, observation.execution_status) == ("error", "error")
    # The instrumentation records neither error.type nor an exception event: the failure is
    # unclassified, never counted, and the prompt (never enforced) records no transition.
    assert observation.execution_error_type is None
    assert len(observation.call_id) == 16  # no gen_ai.tool.call.id: the span ID
    assert harness.decision_counts() == {}
    coverage = harness.guard.genai_coverage()
    assert (coverage.prompts, coverage.model_calls, coverage.tool_calls) == (1, 4, 6)


def test_openai_agents_successful_tools_are_successes(openai_agents: Any) -> None:
    harness, evaluations = _run_openai_agents(openai_agents, fail=False, turns=2)
    statuses = {o.execution_status for e in evaluations for o in e.batch.observations}
    assert statuses == {"success"} and len(evaluations) == 2
    assert harness.decision_counts() == {}


def test_pydantic_ai_traces_replay_to_the_live_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _pydantic_ai()
    harness = _run_pydantic_ai(_scripts()["failing"], integrated=False)
    path = tmp_path / "pydantic-ai.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(harness.span_exporter.get_finished_spans())
    assert main(["replay", "--format", "json", str(path)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert captured.err == ""
    assert report["profiles"] == {"acp": 0, "genai": 1, "openinference": 0}
    assert {k: v for k, v in report["decisions"].items() if v} == harness.decision_counts()
