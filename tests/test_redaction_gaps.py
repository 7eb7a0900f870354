"""The deny-list of spans that are not GenAI spans generalises: content keys no list names, names
built from removed content (truncated, or on a plain child of a tool call), events and links.
Proven on OTLP bytes, with the canaries asserted present before redaction."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Tracer

from otel_guard import RedactingSpanExporter
from otel_guard.privacy.sensitive import is_sensitive

# Keys the review found exported from plain spans, and a few of the same kind no list names.
GAP_KEYS = (
    "args",
    "kwargs",
    "result",
    "stdout",
    "payload",
    "sql",
    "history",
    "user_question",
    "tool_kwargs",
    "job.payload",
    "Shell.StdErr",
    "retrieval-results",
    "last answer",
)
KEPT_KEYS = (
    "message_count",
    "stdout_bytes",
    "http.response.status_code",
    "http.request.method",
    "db.system",
    "result_type",
)


class _Pipeline:
    def __init__(self, batch: bool = False) -> None:
        self.raw = InMemorySpanExporter()
        self.out = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.raw))
        exporter = RedactingSpanExporter(self.out)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        )
        self.tracer: Tracer = self.provider.get_tracer("app")

    def finish(self) -> tuple[bytes, bytes]:
        self.provider.shutdown()
        return (
            encode_spans(self.raw.get_finished_spans()).SerializeToString(),
            encode_spans(self.out.get_finished_spans()).SerializeToString(),
        )


def _canaries(prefix: str) -> Iterator[tuple[str, str]]:
    for n, key in enumerate(GAP_KEYS):
        yield key, f"Cnry{prefix}{n:02d}Zq secret"


@pytest.mark.parametrize("key", GAP_KEYS)
def test_content_keys_no_list_names_are_sensitive(key: str) -> None:
    assert is_sensitive(key)


@pytest.mark.parametrize("key", KEPT_KEYS)
def test_keys_that_measure_content_are_kept(key: str) -> None:
    assert not is_sensitive(key)


def test_gap_keys_never_reach_the_wire_from_spans_events_or_links() -> None:
    p = _Pipeline()
    spans = dict(_canaries("Span"))
    events = dict(_canaries("Event"))
    links = dict(_canaries("Link"))
    linked = p.tracer.start_span("linked")
    linked.end()
    with p.tracer.start_as_current_span(
        "job",
        attributes=spans | {"message_count": 3},
        links=[Link(linked.get_span_context(), links)],
    ) as span:
        span.add_event("progress", events)
    raw, redacted = p.finish()
    canaries = [*spans.values(), *events.values(), *links.values()]
    assert [c for c in canaries if c.encode() not in raw] == []
    assert [c for c in canaries if c[:10].encode() in redacted] == []
    (job,) = [s for s in p.out.get_finished_spans() if s.name == "job"]
    assert dict(job.attributes or {}) == {"message_count": 3}


def test_a_span_named_from_a_truncated_command_is_renamed() -> None:
    p = _Pipeline()
    command = "cat /srv/CnryTruncZq/notes.txt | base64 --wrap=0 > /tmp/out"
    with p.tracer.start_as_current_span(command[:24] + "...", attributes={"command": command}):
        pass
    raw, redacted = p.finish()
    assert b"CnryTrunc" in raw
    assert b"CnryTrunc" not in redacted
    assert [s.name for s in p.out.get_finished_spans()] == ["redacted"]


@pytest.mark.parametrize("batch", [False, True], ids=["simple", "batch"])
def test_a_plain_child_of_a_tool_call_named_from_its_arguments_is_renamed(batch: bool) -> None:
    p = _Pipeline(batch=batch)
    arguments = json.dumps({"command": "grep -r CnryChildZq /home/alice", "timeout": 30})
    tool = p.tracer.start_span(
        "execute_tool",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.arguments": arguments,
        },
    )
    if not batch:
        tool.end()  # the tool call is exported first, then its late child
    from opentelemetry.trace import set_span_in_context

    child = p.tracer.start_span("grep -r CnryChildZq /home/alice", set_span_in_context(tool))
    child.add_event("grep -r CnryChildZq")  # an event named from the arguments, truncated
    child.end()
    if batch:
        tool.end()  # child first, both in one batch: the usual order
    raw, redacted = p.finish()
    assert b"CnryChildZq" in raw
    assert b"CnryChild" not in redacted
    names = sorted(s.name for s in p.out.get_finished_spans())
    assert names == ["execute_tool", "redacted"]


def test_names_of_unrelated_plain_spans_are_kept() -> None:
    p = _Pipeline()
    with p.tracer.start_as_current_span(
        "execute_tool",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.arguments": json.dumps({"path": "/srv/reports"}),
        },
    ):
        pass
    with p.tracer.start_as_current_span("GET /health", attributes={"http.request.method": "GET"}):
        pass
    p.finish()
    assert sorted(s.name for s in p.out.get_finished_spans()) == ["GET /health", "execute_tool"]
