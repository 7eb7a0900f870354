"""A canary corpus: every content key agent frameworks are known to emit, in every place.

Each place (a key on a GenAI span, on another span in three spellings, on an event, on a link,
on the resource; a tool name or path in a span or event name) holds its own canary. A real loop
runs through the guard in shadow, warn and enforce, with the registry's policy and with a
deployment's own allow-list; the canaries must all be in the unredacted spans and none in the
OTLP protobuf bytes of the redacted ones, in any letter case.

Run as a script (``python tests/test_redaction_corpus.py``) it prints the corpus size and the
places that leak, per mode and policy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Span, Status, StatusCode, Tracer, set_span_in_context

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Harness

from otel_guard import RedactingSpanExporter
from otel_guard.privacy.sensitive import ERROR_TYPE_KEYS, PSEUDONYMOUS_KEYS, allowed_key

MODES = ("shadow", "warn", "enforce")
POLICIES: dict[str, dict[str, Any]] = {
    "registry": {},
    "deployment allow-list": {"allow_keys": ["gen_ai.operation.name", "gen_ai.tool.call.id"]},
}

# Every key the redaction must keep off the wire, whatever span carries it.
CONTENT_KEYS = (
    # GenAI content keys of the frameworks.
    "input.value",
    "output.value",
    "llm.input_messages.0.message.content",
    "llm.output_messages.0.message.content",
    "llm.prompts",
    "traceloop.entity.input",
    "traceloop.entity.output",
    "langfuse.observation.input",
    "langfuse.observation.output",
    "ai.prompt",
    "ai.prompt.messages",
    "ai.response.text",
    "ai.toolCall.args",
    "ai.toolCall.result",
    "tool.result",
    "tool.parameters",
    "gen_ai.request.messages",
    "pydantic_ai.all_messages",
    "final_result",
    "model_request_parameters",
    "logfire.msg",
    "mlflow.spanInputs",
    "gcp.vertex.agent.llm_request",
    # The conventions' own content keys.
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.tool.description",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.0.content",
    # Tool and user identity.
    "tool.name",
    "mcp.tool.name",
    "mcp.server.name",
    "gen_ai.user.id",
    "langfuse.user.id",
    "user.id",
    "enduser.id",
    # HTTP, database and messaging content.
    "http.url",
    "url.full",
    "url.query",
    "http.target",
    "db.statement",
    "db.query.text",
    "http.request.header.authorization",
    "http.response.header.set-cookie",
    "messaging.message.body",
    # Errors and paths.
    "exception.message",
    "exception.stacktrace",
    "file.path",
    "code.filepath",
    # Generic keys.
    "content",
    "input",
    "output",
    "command",
    "arguments",
    "query",
    "message",
    "prompt",
    "response",
)
RESOURCE_KEYS = (
    "process.executable.path",
    "process.command_line",
    "process.command_args",
    "process.command",
    "process.owner",
)


@dataclass(frozen=True)
class Place:
    where: str
    key: str
    canary: str

    def value(self) -> Any:
        if self.key in ("http.url", "url.full"):
            return f"https://api.example.com/v1/items?token={self.canary}"
        if self.key == "process.command_args":
            return ("python", "agent.py", self.canary)
        if self.key.endswith(".path") or self.key.endswith("filepath"):
            return f"/home/alice/{self.canary}/notes.txt"
        return f"{self.canary} secret content"


def _corpus() -> list[Place]:
    places: list[str | tuple[str, str]] = []
    for key in CONTENT_KEYS:
        places.append(("tool span", key))
        places.append(("tool event", key))
        places.append(("tool link", key))
        places.append(("other span", key))
        places.append(("other span", key.upper()))
        places.append(("other span", ".".join(part.capitalize() for part in key.split("."))))
        places.append(("other event", key))
        places.append(("other link", key))
    places.extend(("resource", key) for key in RESOURCE_KEYS)
    places.extend(("resource", key.upper()) for key in RESOURCE_KEYS)
    places += [
        ("tool span", "GEN_AI.TOOL.NAME"),
        ("tool span", "User.Id"),
        ("tool span", "error.type"),  # free text
        ("free-text span", "acp.tool.execution.error_type"),
        ("status", "description"),
        ("name", "tool name, upper-cased, in a span name"),
        ("name", "tool name in an event name"),
        ("name", "tool name, upper-cased, in an event name"),
        ("name", "removed value in another span's event name"),
        ("name", "basename of a removed path in a span name"),
        ("tool span", "gen_ai.tool.name"),
    ]
    out = []
    for number, place in enumerate(places):
        where, key = place if isinstance(place, tuple) else ("", place)
        out.append(Place(where, key, f"Cnry{number:03d}Zq"))
    return out


CORPUS = _corpus()
TOOL = next(p for p in CORPUS if p.key == "gen_ai.tool.name").canary + "_run_shell"


def _in(where: str) -> list[Place]:
    return [p for p in CORPUS if p.where == where]


def _named(key: str) -> Place:
    return next(p for p in CORPUS if p.key == key)


class CorpusAgent:
    """Runs one looping prompt (tracked, then warned, then stopped) and one with a free-text
    execution error type, with every corpus place filled."""

    def __init__(self, tracer: Tracer, harness: Harness) -> None:
        self.tracer = tracer
        self.h = harness
        self.calls = 0
        self.previous: Span | None = None

    def run(self) -> None:
        prompt = self._prompt("prompt-loop")
        for _ in range(3):
            self._batch(prompt, "prompt-loop", "exit_nonzero", 4)
        prompt.end()
        free_text = self._prompt("prompt-free-text")
        self._batch(free_text, "prompt-free-text", _named("acp.tool.execution.error_type"), 1)
        free_text.end()
        self._other_spans()

    def _prompt(self, prompt_id: str) -> Span:
        return self.tracer.start_span(
            "invoke_agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
        )

    def _batch(self, prompt: Span, prompt_id: str, error_type: str | Place, width: int) -> None:
        batch = self.tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        spans = [self._tool(batch, error_type) for _ in range(width)]
        for span in spans:
            span.end()
        batch.set_attributes(
            {
                "acp.batch.admitted": width,
                "acp.input.external": False,
                "acp.input.queued_prompt": False,
                "acp.input.reliable": True,
            }
        )
        batch.end()
        self.h.guard.take_action(prompt_id)

    def _tool(self, batch: Span, error_type: str | Place) -> Span:
        self.calls += 1
        attributes: dict[str, Any] = {p.key: p.value() for p in _in("tool span")}
        attributes |= {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": TOOL,
            "gen_ai.tool.call.id": f"call-{self.calls}",
            "acp.tool.type": "native",
            "acp.tool.status": "error",
            "acp.tool.execution.status": "error",
            "acp.tool.execution.error_type": (
                error_type.value() if isinstance(error_type, Place) else error_type
            ),
        }
        links = []
        if self.previous is not None:
            link_attributes = {p.key: p.value() for p in _in("tool link")}
            links.append(Link(self.previous.get_span_context(), link_attributes))
        span = self.tracer.start_span(
            f"execute_tool {TOOL.upper()}",
            context=set_span_in_context(batch),
            attributes=attributes,
            links=links,
        )
        span.add_event("tool.output", {p.key: p.value() for p in _in("tool event")})
        span.add_event(f"running {TOOL}")
        span.add_event(TOOL.upper())
        span.set_status(Status(StatusCode.ERROR, _named("description").value()))
        self.previous = span
        return span

    def _other_spans(self) -> None:
        linked = self.tracer.start_span("linked")
        linked.end()
        for place in _in("other span"):
            with self.tracer.start_as_current_span("work", attributes={place.key: place.value()}):
                pass
        with self.tracer.start_as_current_span(
            "work",
            links=[Link(linked.get_span_context(), {p.key: p.value() for p in _in("other link")})],
        ) as span:
            span.add_event("progress", {p.key: p.value() for p in _in("other event")})
        user = _named("removed value in another span's event name").canary
        with self.tracer.start_as_current_span("login", attributes={"user.id": user}) as span:
            span.add_event(f"login of {user}")
        # A framework's own tool spans (no operation name), each with its own tool name.
        tool = _named("tool name, upper-cased, in a span name").canary + "_tool"
        with self.tracer.start_as_current_span(
            f"running tool: {tool.upper()}",
            attributes={"gen_ai.tool.name": tool, "logfire.msg": f"running tool: {tool}"},
        ):
            pass
        for place, event_name in (
            ("tool name in an event name", "running {}"),
            ("tool name, upper-cased, in an event name", "{}"),
        ):
            tool = _named(place).canary + "_tool"
            upper = place.endswith("upper-cased, in an event name")
            with self.tracer.start_as_current_span(
                "tool call", attributes={"gen_ai.tool.name": tool}
            ) as span:
                span.add_event(event_name.format(tool.upper() if upper else tool))
        base = _named("basename of a removed path in a span name").canary
        with self.tracer.start_as_current_span(
            f"open {base}.txt", attributes={"file.path": f"/home/alice/{base}.txt"}
        ):
            pass


def _resource() -> Resource:
    attributes: dict[str, Any] = {"service.name": "corpus-agent"}
    attributes |= {p.key: p.value() for p in _in("resource")}
    return Resource(attributes)


def _needles(place: Place) -> Iterator[bytes]:
    for text in (place.canary, place.canary.lower(), place.canary.upper()):
        yield text.encode()


def run(mode: str, policy: str) -> tuple[bytes, bytes, Harness]:
    """The OTLP protobuf bytes of the unredacted and the redacted spans, and the guard's view."""
    h = Harness(mode=mode)
    provider = TracerProvider(resource=_resource())
    provider.add_span_processor(h.guard)
    raw = InMemorySpanExporter()
    redacted = InMemorySpanExporter()
    exporter = RedactingSpanExporter(redacted, **POLICIES[policy])
    provider.add_span_processor(SimpleSpanProcessor(raw))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    CorpusAgent(provider.get_tracer("agent"), h).run()
    provider.shutdown()
    assert exporter.dropped_spans == 0
    return (
        encode_spans(raw.get_finished_spans()).SerializeToString(),
        encode_spans(redacted.get_finished_spans()).SerializeToString(),
        h,
    )


def leaks(data: bytes) -> list[Place]:
    return [p for p in CORPUS if any(needle in data for needle in _needles(p))]


EXPECTED_DECISIONS = {
    "shadow": {"tracked": 1, "would_warn": 1, "would_stop": 1, "reset": 1},
    "warn": {"tracked": 1, "warned": 1, "would_stop": 1, "reset": 1},
    "enforce": {"tracked": 1, "warned": 1, "stopped": 1, "reset": 1},
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("mode", MODES)
def test_no_corpus_canary_reaches_the_otlp_bytes(mode: str, policy: str) -> None:
    raw, redacted, h = run(mode, policy)
    # The loop really ran through the guard with every key on its spans.
    assert h.decision_counts() == EXPECTED_DECISIONS[mode]
    # Every canary was placed, so a leak cannot hide behind a canary that never was.
    assert [p for p in CORPUS if not any(needle in raw for needle in _needles(p))] == []
    assert leaks(redacted) == []


def test_the_corpus_covers_every_kind_of_place() -> None:
    kinds = {p.where for p in CORPUS}
    assert kinds >= {"tool span", "tool event", "tool link", "other span", "resource", "name"}
    assert len({p.canary for p in CORPUS}) == len(CORPUS) > 450


_unknown_keys = st.text(min_size=1, max_size=40).filter(
    lambda key: (
        allowed_key(key) is None
        and key not in PSEUDONYMOUS_KEYS
        and key not in ERROR_TYPE_KEYS
        and key not in ("acp.tool.execution.error_type",)
    )
)
_genai_markers = st.sampled_from(
    [
        {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m-1"},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "c1"},
        {"acp.prompt.id": "p-1"},
        {"openinference.span.kind": "LLM"},
        {"traceloop.span.kind": "tool"},
        {"langfuse.observation.type": "generation"},
        {"ai.operationId": "ai.generateText"},
        {"mlflow.spanType": "TOOL"},
        {"logfire.span_type": "span"},
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    marker=_genai_markers,
    unknown=st.dictionaries(_unknown_keys, st.integers(min_value=0, max_value=999), max_size=8),
)
def test_unknown_keys_on_genai_spans_never_reach_the_wire(
    marker: dict[str, Any], unknown: dict[str, int]
) -> None:
    # Each unknown key carries its own canary, on the span, an event and a link.
    canaries = {key: f"CnryUnknown{n:03d}Zq" for n, key in enumerate(unknown)}
    out = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedactingSpanExporter(out)))
    tracer = provider.get_tracer("framework")
    other = tracer.start_span("other")
    other.end()
    with tracer.start_as_current_span(
        "framework span",
        attributes=marker | canaries,
        links=[Link(other.get_span_context(), dict(canaries))],
    ) as span:
        span.add_event("gen_ai.choice", dict(canaries))
    data = encode_spans(out.get_finished_spans()).SerializeToString()
    assert [key for key, canary in canaries.items() if canary.encode() in data] == []
    exported = next(s for s in out.get_finished_spans() if s.name != "other")
    keys = set(exported.attributes or {})
    keys |= {k for e in exported.events for k in e.attributes or {}}
    keys |= {k for lk in exported.links for k in lk.attributes or {}}
    assert keys <= set(marker)


def _log_corpus() -> list[Place]:
    places = []
    for key in CONTENT_KEYS:
        for where, spelled in (
            ("genai record", key),
            ("other record", key),
            ("other record", key.upper()),
            ("other record", ".".join(part.capitalize() for part in key.split("."))),
        ):
            places.append((where, spelled))
    places += [("genai body", "body"), ("other body", "body")]
    places += [("resource", key) for key in RESOURCE_KEYS]
    return [Place(where, key, f"CnryLog{n:03d}Zq") for n, (where, key) in enumerate(places)]


LOG_CORPUS = _log_corpus()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_corpus_canary_reaches_the_otlp_bytes_of_log_records(policy: str) -> None:
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import (
        InMemoryLogRecordExporter,
        SimpleLogRecordProcessor,
    )

    from otel_guard import RedactingLogExporter

    resource = {"service.name": "corpus-agent"}
    resource |= {p.key: p.value() for p in LOG_CORPUS if p.where == "resource"}
    provider = LoggerProvider(resource=Resource(resource))
    raw = InMemoryLogRecordExporter()
    out = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(raw))
    exporter = RedactingLogExporter(out, **POLICIES[policy])
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("framework")
    body = {p.where: p.value() for p in LOG_CORPUS if p.where.endswith("body")}
    for place in LOG_CORPUS:
        if place.where == "genai record":
            logger.emit(
                LogRecord(
                    event_name="gen_ai.client.inference.operation.details",
                    attributes={"gen_ai.operation.name": "chat", place.key: place.value()},
                    body=body["genai body"],
                )
            )
        elif place.where == "other record":
            logger.emit(LogRecord(attributes={place.key: place.value()}, body=body["other body"]))
    provider.shutdown()
    assert exporter.dropped_records == 0
    placed = encode_logs(raw.get_finished_logs()).SerializeToString()
    redacted = encode_logs(out.get_finished_logs()).SerializeToString()
    assert [p for p in LOG_CORPUS if not any(n in placed for n in _needles(p))] == []
    assert [p for p in LOG_CORPUS if any(n in redacted for n in _needles(p))] == []


if __name__ == "__main__":
    print(f"corpus: {len(CORPUS)} places")
    total = 0
    for policy in sorted(POLICIES):
        for mode in MODES:
            _, redacted, _ = run(mode, policy)
            found = leaks(redacted)
            total += len(found)
            print(f"{policy} / {mode}: {len(found)} leaks")
            for place in found:
                print(f"    {place.where}: {place.key}")
    print(f"total leaks: {total} of {len(CORPUS) * len(MODES) * len(POLICIES)} place-runs")
