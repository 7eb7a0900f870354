"""pydantic-ai's own instrumentation on the provider ``install_guard`` built leaks nothing.

The recipe a pydantic-ai user follows: ``install_guard()``, then pydantic-ai's standard
``Instrumentation`` capability on the same tracer provider, content included (its default). A
real agent runs offline on a ``FunctionModel``; its spans go through the real OTLP/HTTP exporter
to a receiver on 127.0.0.1. The user prompt, the tool's arguments, result and retry message, the
final answer, the system prompt and instructions, the tool's definition and its name (also in
``logfire.msg``) must all be in the unredacted spans and nowhere in the received bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip(
    "pydantic_ai", reason="the pydantic-ai recipe needs the 'pydantic-ai' extra installed"
)

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from test_wire import Receiver, receiving

from otel_guard import install_guard
from otel_guard.privacy.pseudonym import Pseudonymizer

CANARIES = {
    "user prompt": "CnryPromptZq what is in my notes",
    "system prompt": "CnrySystemZq you are a careful assistant",
    "instructions": "CnryInstructionsZq answer in French",
    "tool description": "CnryToolDocZq reads the user's private notes",
    "tool arguments": "CnryArgsZq /home/alice/notes.txt",
    "tool retry message": "CnryRetryZq file is locked",
    "tool result": "CnryResultZq my bank PIN is 1234",
    "final answer": "CnryAnswerZq the PIN is 1234",
    "tool name": "cnry_tool_zq_read_notes",
}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    yield from receiving(monkeypatch)


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(
        1
        for m in messages
        if isinstance(m, ModelResponse)
        for p in m.parts
        if p.part_kind == "tool-call"
    )
    if calls < 2:
        path = CANARIES["tool arguments"]
        return ModelResponse(
            parts=[ToolCallPart(CANARIES["tool name"], {"path": path}, tool_call_id=f"c{calls}")]
        )
    return ModelResponse(parts=[TextPart(CANARIES["final answer"])])


def build_agent(settings: InstrumentationSettings) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model),
        system_prompt=CANARIES["system prompt"],
        instructions=CANARIES["instructions"],
        capabilities=[Instrumentation(settings=settings)],
    )
    attempts: list[str] = []

    def read_notes(path: str) -> str:
        attempts.append(path)
        if len(attempts) == 1:
            raise ModelRetry(CANARIES["tool retry message"])
        return CANARIES["tool result"]

    read_notes.__name__ = CANARIES["tool name"]
    read_notes.__doc__ = CANARIES["tool description"]
    agent.tool_plain(name=CANARIES["tool name"])(read_notes)
    return agent


def test_pydantic_ai_instrumentation_leaks_nothing_through_install_guard(
    receiver: Receiver,
) -> None:
    otel = install_guard(mode="shadow", set_global=False)
    raw = InMemorySpanExporter()  # the unredacted spans, to prove the canaries were there
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(raw))
    settings = InstrumentationSettings(tracer_provider=otel.tracer_provider)
    result = build_agent(settings).run_sync(CANARIES["user prompt"])
    assert result.output == CANARIES["final answer"]
    otel.shutdown()

    placed = encode_spans(raw.get_finished_spans()).SerializeToString()
    assert [place for place, canary in CANARIES.items() if canary.encode() not in placed] == []
    raw_keys = {k for s in raw.get_finished_spans() for k in s.attributes or {}}
    # The keys the recipe leaked before: all present on the unredacted spans.
    assert {"pydantic_ai.all_messages", "final_result", "model_request_parameters"} <= raw_keys
    assert "logfire.msg" in raw_keys

    received = b"".join(receiver.bodies["/v1/traces"])
    assert received
    leaked = [
        place
        for place, canary in CANARIES.items()
        if any(v.encode() in received for v in (canary, canary.lower(), canary.upper()))
    ]
    assert leaked == []
    spans = [
        span
        for request in receiver.traces()
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert sorted({span.name for span in spans}) == [
        "chat function:model:",
        "execute_tool",
        "invoke_agent",
    ]
    tool_names = {
        kv.value.string_value
        for span in spans
        for kv in span.attributes
        if kv.key == "gen_ai.tool.name"
    }
    assert tool_names == {Pseudonymizer()(CANARIES["tool name"])}
