"""One scripted agent per framework, run offline, for the compatibility matrix.

Every app runs the same scenario: a user prompt, then 6 model turns of 2 parallel calls to one
tool (``run_shell``) that always raises the same exception, then a final answer. The model is
scripted; no request leaves the process. The guard joins the app's own providers the way the
README says (``install_guard(mode="shadow")``), and the spans are also kept by an in-memory
exporter.

Run as a script, one framework per process (frameworks keep global state: the global tracer
provider, patched callback managers)::

    python tests/matrix_apps.py FRAMEWORK OUT.jsonl

It writes the finished spans as OTLP/JSON lines to ``OUT.jsonl`` and prints one JSON object:
the live decision and diagnostic counts, and the number of spans.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

# Content canaries: each must be in the spans before redaction and gone after it.
PROMPT = "CnryPromptZq rebuild the vault for alice@example.com"
COMMAND = "CnryArgsZq make deploy --token sk-live-123"
ERROR = "CnryErrorZq: make: permission denied for /home/alice/.ssh"
CANARIES = {"prompt": "CnryPromptZq", "arguments": "CnryArgsZq", "error_message": "CnryErrorZq"}

TOOL = "run_shell"
TURNS = 6
PARALLEL = 2
FINAL = "gave up"

# Telemetry of the frameworks themselves (their vendors' endpoints) is switched off; the
# OpenTelemetry SDK itself stays on (OTEL_SDK_DISABLED is never set).
QUIET_ENVIRONMENT = {
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "ANONYMIZED_TELEMETRY": "false",
    "GOOGLE_GENAI_USE_VERTEXAI": "false",
    "ADK_DISABLE_TELEMETRY": "true",
    "OPENAI_API_KEY": "sk-offline-unused",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "TRACELOOP_TRACE_CONTENT": "true",
    # Google ADK reads the mode's name; "true" there means no content.
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
}


def failing_tool(command: str) -> str:
    """The tool every app registers: always the same exception."""
    raise PermissionError(ERROR)


def call_id(turn: int, index: int) -> str:
    return f"call-{turn}-{index}"


# -- LangGraph ---------------------------------------------------------------------------------


def run_langgraph() -> None:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class ScriptedChatModel(BaseChatModel):
        turn: int = 0

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            self.turn += 1
            if self.turn > TURNS:
                message = AIMessage(content=FINAL)
            else:
                message = AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": TOOL,
                            "args": {"command": COMMAND},
                            "id": call_id(self.turn, i),
                            "type": "tool_call",
                        }
                        for i in range(PARALLEL)
                    ],
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    @tool(TOOL)
    def run_shell(command: str) -> str:
        """Run a shell command."""
        return failing_tool(command)

    model = ScriptedChatModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([run_shell], handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile()
    result = app.invoke({"messages": [("user", PROMPT)]}, {"recursion_limit": 50})
    assert result["messages"][-1].content == FINAL


def instrument_openinference_langchain(provider: Any) -> None:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=provider)


def instrument_openllmetry_langchain(provider: Any) -> None:
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    LangchainInstrumentor().instrument(tracer_provider=provider)


# -- smolagents --------------------------------------------------------------------------------


def run_smolagents() -> None:
    from types import SimpleNamespace

    from smolagents import OpenAIModel, Tool, ToolCallingAgent

    class ScriptedCompletions:
        """Stands in for an OpenAI-compatible client: smolagents' own OpenAIModel (the class
        the instrumentation wraps) turns its answers into tool calls."""

        def __init__(self) -> None:
            self.turn = 0

        def create(self, **request: Any) -> Any:
            self.turn += 1
            if self.turn > TURNS:
                calls = [("final_answer", {"answer": FINAL}, "final")]
            else:
                calls = [
                    (TOOL, {"command": COMMAND}, call_id(self.turn, i)) for i in range(PARALLEL)
                ]
            tool_calls = [
                {
                    "id": identifier,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for name, arguments, identifier in calls
            ]
            message = SimpleNamespace(role="assistant", content="", tool_calls=tool_calls)
            usage = SimpleNamespace(prompt_tokens=10, completion_tokens=5)
            return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=usage)

    client = SimpleNamespace(chat=SimpleNamespace(completions=ScriptedCompletions()))
    model = OpenAIModel(model_id="scripted", client=client)

    class RunShell(Tool):  # type: ignore[misc]
        name = TOOL
        description = "Run a shell command."
        inputs = {"command": {"type": "string", "description": "the command"}}  # noqa: RUF012
        output_type = "string"

        def forward(self, command: str) -> str:
            return failing_tool(command)

    agent = ToolCallingAgent(
        tools=[RunShell()], model=model, max_steps=TURNS + 2, verbosity_level=0
    )
    assert agent.run(PROMPT) == FINAL


def instrument_openinference_smolagents(provider: Any) -> None:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument(tracer_provider=provider)


# -- Strands Agents ----------------------------------------------------------------------------


def strands_provider() -> Any:
    from strands.telemetry import StrandsTelemetry

    return StrandsTelemetry().tracer_provider  # it creates the global provider, as documented


def run_strands() -> None:
    from strands import Agent, tool
    from strands.models.model import Model

    class ScriptedModel(Model):
        def __init__(self) -> None:
            self.turn = 0

        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {"model_id": "scripted"}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            self.turn += 1
            yield {"messageStart": {"role": "assistant"}}
            if self.turn > TURNS:
                yield {"contentBlockDelta": {"delta": {"text": FINAL}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "end_turn"}}
                return
            for i in range(PARALLEL):
                start = {"toolUse": {"toolUseId": call_id(self.turn, i), "name": TOOL}}
                yield {"contentBlockStart": {"start": start}}
                delta = {"toolUse": {"input": json.dumps({"command": COMMAND})}}
                yield {"contentBlockDelta": {"delta": delta}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}

    @tool(name=TOOL)
    def run_shell(command: str) -> str:
        """Run a shell command.

        Args:
            command: the command
        """
        return failing_tool(command)

    agent = Agent(model=ScriptedModel(), tools=[run_shell], callback_handler=None)
    result = agent(PROMPT)
    assert FINAL in str(result)


# -- Google ADK --------------------------------------------------------------------------------


def run_adk() -> None:
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    class ScriptedLlm(BaseLlm):
        turn: int = 0

        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
            self.turn += 1
            if self.turn > TURNS:
                parts = [types.Part(text=FINAL)]
            else:
                parts = [
                    types.Part(
                        function_call=types.FunctionCall(
                            name=TOOL, args={"command": COMMAND}, id=call_id(self.turn, i)
                        )
                    )
                    for i in range(PARALLEL)
                ]
            yield LlmResponse(content=types.Content(role="model", parts=parts))

    def run_shell(command: str) -> str:
        """Run a shell command."""
        return failing_tool(command)

    def report_error(tool: Any, args: Any, tool_context: Any, error: Exception) -> Any:
        # An app's documented way to hand a tool failure back to the model (ADK re-raises it
        # otherwise and ends the run).
        return {"error": f"{type(error).__name__}: {error}"}

    agent = LlmAgent(
        name="builder",
        model=ScriptedLlm(model="scripted"),
        tools=[run_shell],
        on_tool_error_callback=report_error,
    )
    runner = InMemoryRunner(agent=agent, app_name="matrix")

    async def go() -> str:
        session = await runner.session_service.create_session(app_name="matrix", user_id="u")
        text = ""
        message = types.Content(role="user", parts=[types.Part(text=PROMPT)])
        async for event in runner.run_async(
            user_id="u", session_id=session.id, new_message=message
        ):
            for part in (event.content.parts or []) if event.content else []:
                text = part.text or text
        return text

    assert asyncio.run(go()) == FINAL


# -- OpenAI Agents SDK -------------------------------------------------------------------------


def run_openai_agents() -> None:
    import agents
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
        def __init__(self) -> None:
            self.turn = 0

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            self.turn += 1
            # A real model records its generation (with its input), as the SDK's own models do.
            messages = [{"role": "user", "content": input}] if isinstance(input, str) else input
            with generation_span(model="scripted", input=list(messages), output=[]):
                pass
            if self.turn > TURNS:
                text = ResponseOutputText(type="output_text", text=FINAL, annotations=[])
                output: list[Any] = [
                    ResponseOutputMessage(
                        id="m", type="message", role="assistant", status="completed", content=[text]
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"f{self.turn}{i}",
                        call_id=call_id(self.turn, i),
                        type="function_call",
                        name=TOOL,
                        arguments=json.dumps({"command": COMMAND}),
                    )
                    for i in range(PARALLEL)
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @agents.function_tool(name_override=TOOL)
    def run_shell(command: str) -> str:
        """Run a shell command."""
        return failing_tool(command)

    agent = agents.Agent(name="builder", model=ScriptedModel(), tools=[run_shell])
    result = asyncio.run(agents.Runner.run(agent, PROMPT, max_turns=TURNS + 2))
    assert result.final_output == FINAL


def _no_vendor_traces() -> None:
    import agents

    agents.set_trace_processors([])  # the SDK's own export goes to its vendor


def instrument_openinference_openai_agents(provider: Any) -> None:
    _no_vendor_traces()
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)


def instrument_openllmetry_openai_agents(provider: Any) -> None:
    _no_vendor_traces()
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)


# -- CrewAI ------------------------------------------------------------------------------------


def run_crewai() -> None:
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import BaseTool

    class ScriptedLLM(BaseLLM):  # type: ignore[misc]
        turn: int = 0

        def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
            self.turn += 1
            if self.turn > TURNS:
                return f"Thought: done\nFinal Answer: {FINAL}"
            return [
                {
                    "id": call_id(self.turn, i),
                    "type": "function",
                    # CrewAI stops an agent that repeats identical arguments 5 times by itself:
                    # each call differs, the failure stays the same.
                    "function": {
                        "name": TOOL,
                        "arguments": json.dumps({"command": f"{COMMAND} -j{self.turn}{i}"}),
                    },
                }
                for i in range(PARALLEL)
            ]

        def supports_function_calling(self) -> bool:
            return True

        def supports_stop_words(self) -> bool:
            return False

        def get_context_window_size(self) -> int:
            return 100_000

    class RunShell(BaseTool):  # type: ignore[misc]
        name: str = TOOL
        description: str = "Run a shell command."

        def _run(self, command: str) -> str:
            return failing_tool(command)

    llm = ScriptedLLM(model="scripted")
    agent = Agent(role="builder", goal="build", backstory="a builder", llm=llm, tools=[RunShell()])
    task = Task(description=PROMPT, expected_output="a build", agent=agent)
    crew = Crew(agents=[agent], tasks=[task])
    output = crew.kickoff()
    assert FINAL in str(output), output


def instrument_openinference_crewai(provider: Any) -> None:
    from openinference.instrumentation.crewai import CrewAIInstrumentor

    CrewAIInstrumentor().instrument(tracer_provider=provider)


# -- pydantic-ai -------------------------------------------------------------------------------


def run_pydantic_ai(provider: Any) -> None:
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    turns = [0]

    def model(messages: list[Any], info: Any) -> ModelResponse:
        turns[0] += 1
        if turns[0] > TURNS:
            return ModelResponse(parts=[TextPart(FINAL)])
        return ModelResponse(
            parts=[
                ToolCallPart(TOOL, {"command": COMMAND}, tool_call_id=call_id(turns[0], i))
                for i in range(PARALLEL)
            ]
        )

    settings = InstrumentationSettings(tracer_provider=provider)
    agent = Agent(FunctionModel(model), capabilities=[Instrumentation(settings=settings)])

    @agent.tool_plain(retries=TURNS + 1, name=TOOL)
    def run_shell(command: str) -> str:
        try:
            return failing_tool(command)
        except PermissionError as error:  # pydantic-ai hands a ModelRetry back to the model
            raise ModelRetry(str(error)) from error

    assert agent.run_sync(PROMPT).output == FINAL


def instrument_openinference_pydantic_ai(provider: Any) -> None:
    from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

    provider.add_span_processor(OpenInferenceSpanProcessor())


# -- A hand-written agent: GenAI attributes set after each span starts ---------------------------


def run_handwritten(provider: Any) -> None:
    from opentelemetry.trace import Status, StatusCode

    tracer = provider.get_tracer("handwritten-agent")
    with tracer.start_as_current_span("invoke_agent builder") as prompt:
        prompt.set_attribute("gen_ai.operation.name", "invoke_agent")
        prompt.set_attribute("gen_ai.agent.name", "builder")
        prompt.set_attribute("gen_ai.input.messages", json.dumps([{"content": PROMPT}]))
        for turn in range(1, TURNS + 2):
            with tracer.start_as_current_span("chat scripted") as chat:
                chat.set_attribute("gen_ai.operation.name", "chat")
                chat.set_attribute("gen_ai.request.model", "scripted")
            if turn > TURNS:
                break
            spans = []
            for i in range(PARALLEL):  # both calls run at once: started, then ended
                span = tracer.start_span(f"execute_tool {TOOL}")
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", TOOL)
                span.set_attribute("gen_ai.tool.call.id", call_id(turn, i))
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"command": COMMAND}))
                spans.append(span)
            for span in spans:
                try:
                    failing_tool(COMMAND)
                except PermissionError as error:
                    span.record_exception(error)
                    span.set_attribute("error.type", type(error).__name__)
                    span.set_status(Status(StatusCode.ERROR, str(error)))
                span.end()


# -- The runner --------------------------------------------------------------------------------


def _plain_provider() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create({"service.name": "matrix-agent"}))
    trace.set_tracer_provider(provider)
    return provider


def _nothing(provider: Any) -> None:
    pass


# name -> (the app's provider, its instrumentation, the run)
APPS: dict[str, tuple[Callable[[], Any], Callable[[Any], None], Callable[[Any], None]]] = {
    "langgraph-openinference": (
        _plain_provider,
        instrument_openinference_langchain,
        lambda p: run_langgraph(),
    ),
    "langgraph-openllmetry": (
        _plain_provider,
        instrument_openllmetry_langchain,
        lambda p: run_langgraph(),
    ),
    "smolagents-openinference": (
        _plain_provider,
        instrument_openinference_smolagents,
        lambda p: run_smolagents(),
    ),
    "strands-native": (strands_provider, _nothing, lambda p: run_strands()),
    "adk-native": (_plain_provider, _nothing, lambda p: run_adk()),
    "openai-agents-openinference": (
        _plain_provider,
        instrument_openinference_openai_agents,
        lambda p: run_openai_agents(),
    ),
    "openai-agents-openllmetry": (
        _plain_provider,
        instrument_openllmetry_openai_agents,
        lambda p: run_openai_agents(),
    ),
    "crewai-openinference": (
        _plain_provider,
        instrument_openinference_crewai,
        lambda p: run_crewai(),
    ),
    "pydantic-ai-native": (_plain_provider, _nothing, run_pydantic_ai),
    "pydantic-ai-openinference": (
        _plain_provider,
        instrument_openinference_pydantic_ai,
        run_pydantic_ai,
    ),
    "handwritten-genai": (_plain_provider, _nothing, run_handwritten),
}


_CLASSIFYING = frozenset(
    {
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.conversation.id",
        "error.type",
        "openinference.span.kind",
        "tool.name",
        "tool_call.id",
        "tool.id",
        "session.id",
    }
)


def _start_keys() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class StartKeys(SpanProcessor):
        """Notes which attribute keys each span had when it started."""

        def __init__(self) -> None:
            self.keys: dict[int, frozenset[str]] = {}

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.keys[span.context.span_id] = frozenset(span.attributes or {})

    return StartKeys()


def record(name: str, out_path: str) -> dict[str, Any]:
    """Run app ``name`` under the guard; write its spans to ``out_path``; return the counts."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_guard import install_guard
    from otel_guard.guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC
    from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

    make_provider, instrument, run = APPS[name]
    provider = make_provider()  # the app's own tracer provider, the global one
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    instrument(provider)
    memory = InMemorySpanExporter()
    starts = _start_keys()
    installation = install_guard(
        mode="shadow", span_processors=[starts, SimpleSpanProcessor(memory)]
    )
    assert "traces" in installation.joined, "the guard joins the app's own tracer provider"
    run(provider)
    installation.force_flush()
    spans = memory.get_finished_spans()
    with open(out_path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(spans)
    # The same spans as OTLP protobuf bytes, before and after the guard's redaction.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_guard import RedactingSpanExporter

    redacted = InMemorySpanExporter()
    RedactingSpanExporter(redacted).export(spans)
    with open(out_path + ".otlp", "wb") as binary:
        binary.write(encode_spans(spans).SerializeToString())
    with open(out_path + ".redacted.otlp", "wb") as binary:
        binary.write(encode_spans(redacted.get_finished_spans()).SerializeToString())

    counts: dict[str, dict[str, int]] = {DECISIONS_METRIC: {}, DIAGNOSTICS_METRIC: {}}
    label = {DECISIONS_METRIC: "decision", DIAGNOSTICS_METRIC: "diagnostic"}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name in counts:
                    for point in metric.data.data_points:
                        key = str(dict(point.attributes or {})[label[metric.name]])
                        counts[metric.name][key] = counts[metric.name].get(key, 0) + int(
                            point.value  # type: ignore[union-attr]
                        )
    late: dict[str, list[str]] = {}
    for span in spans:
        at_start = starts.keys.get(span.context.span_id, frozenset()) if span.context else ()
        missing = sorted(
            k for k in (span.attributes or {}) if k in _CLASSIFYING and k not in at_start
        )
        if missing:
            late.setdefault(span.name, missing)
    return {
        "set_after_start": late,
        "decisions": counts[DECISIONS_METRIC],
        "diagnostics": counts[DIAGNOSTICS_METRIC],
        "spans": len(spans),
    }


if __name__ == "__main__":
    print(json.dumps(record(sys.argv[1], sys.argv[2]), sort_keys=True))
