"""RedactingSpanExporter at its edges: dropped counts on events and links, the status text as a
removed value, several deny patterns at once, and what it logs when it cannot export."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode

from otel_guard import RedactingSpanExporter
from otel_guard.privacy.pseudonym import Pseudonymizer
from otel_guard.privacy.redaction import REDACTED_SPAN_NAME
from otel_guard.privacy.sensitive import SensitiveKeys


def pipeline(
    limits: SpanLimits | None = None, **options: object
) -> tuple[TracerProvider, InMemorySpanExporter]:
    out = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(RedactingSpanExporter(out, **options)))  # type: ignore[arg-type]
    return provider, out


def test_dropped_attribute_counts_of_events_and_links_survive_redaction() -> None:
    limits = SpanLimits(max_event_attributes=1, max_link_attributes=1)
    provider, out = pipeline(limits)
    tracer = provider.get_tracer("agent")
    other = tracer.start_span("other")
    other.end()
    link = Link(other.get_span_context(), {"a": 1, "b": 2, "c": 3})
    with tracer.start_as_current_span("work", links=[link]) as span:
        span.add_event("e", {"x": 1, "y": 2, "user.id": "u"})
    exported = next(s for s in out.get_finished_spans() if s.name == "work")
    (event,) = exported.events
    (exported_link,) = exported.links
    assert (event.dropped_attributes, exported_link.dropped_attributes) == (2, 2)
    assert dict(event.attributes or {}) == {}  # the one kept, user.id, is removed
    assert dict(exported_link.attributes or {}) == {"c": 3}


def test_span_name_holding_the_status_description_is_replaced() -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("failed: disk full") as span:
        span.set_status(Status(StatusCode.ERROR, "disk full"))
    (exported,) = out.get_finished_spans()
    assert exported.name == REDACTED_SPAN_NAME
    assert exported.status.status_code is StatusCode.ERROR
    assert exported.status.description is None


def test_allow_list_with_several_deny_patterns_removes_every_match() -> None:
    provider, out = pipeline(
        allow_keys=["ticket.id", "ticket.body", "ticket.kind"],
        extra_patterns=[r"ticket\.id", r"ticket\.body"],
    )
    with provider.get_tracer("agent").start_as_current_span("work") as span:
        span.set_attributes({"ticket.id": "T-1", "ticket.body": "b", "ticket.kind": "bug"})
    (exported,) = out.get_finished_spans()
    assert dict(exported.attributes or {}) == {"ticket.kind": "bug"}


class _Recording(SpanExporter):
    def __init__(self) -> None:
        self.flushes: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("collector down")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushes.append(timeout_millis)
        return True


def test_force_flush_passes_the_default_timeout_on() -> None:
    delegate = _Recording()
    assert RedactingSpanExporter(delegate).force_flush() is True
    assert delegate.flushes == [30000]


class _Unreadable(ReadableSpan):
    @property
    def attributes(self) -> object:  # type: ignore[override]
        raise RuntimeError("cannot read")


def test_failures_are_logged_by_count_and_type_never_by_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = RedactingSpanExporter(_Recording())
    secret = ReadableSpan("secret-name", attributes={"k": "secret-value"})
    with caplog.at_level(logging.WARNING, logger="otel_guard.privacy.redaction"):
        result = exporter.export([_Unreadable("x"), _Unreadable("y"), secret])
    assert result is SpanExportResult.FAILURE
    assert [r.getMessage() for r in caplog.records] == [
        "otel_guard: dropped 2 span(s) that could not be redacted",
        "otel_guard: span export failed (ConnectionError)",
    ]
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize(("value", "replaced"), [("abc", True), ("ab", False), ("abcd", True)])
def test_removed_values_from_the_minimum_length_up_are_searched_in_the_name(
    value: str, replaced: bool
) -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span(f"run {value}") as span:
        span.set_attribute("user.id", value)
    (exported,) = out.get_finished_spans()
    assert exported.name == (REDACTED_SPAN_NAME if replaced else f"run {value}")


def test_a_removed_attribute_holding_numbers_does_not_stop_the_export() -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("work") as span:
        span.set_attribute("user.id", [7, 8])
        span.set_attribute("k", "v")
    (exported,) = out.get_finished_spans()
    assert (exported.name, dict(exported.attributes or {})) == ("work", {"k": "v"})


def test_exported_event_attributes_are_read_only() -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("work") as span:
        span.add_event("e", {"k": "v"})
    (exported,) = out.get_finished_spans()
    (event,) = exported.events
    with pytest.raises(TypeError):
        event.attributes["k"] = "changed"  # type: ignore[index]


@pytest.mark.parametrize(
    ("key", "value", "kept"),
    [
        # count: numbers only, never text or flags
        ("gen_ai.usage.input_tokens", 12, True),
        ("gen_ai.usage.input_tokens", 1.5, True),
        ("gen_ai.usage.input_tokens", (1, 2), True),
        ("gen_ai.usage.input_tokens", "12 tokens of secret", False),
        ("gen_ai.usage.input_tokens", True, False),
        ("gen_ai.usage.input_tokens", (1, True), False),
        # word: short tokens, alone or in a list
        ("gen_ai.request.model", "model-x", True),
        ("gen_ai.response.finish_reasons", ("stop", "length"), True),
        ("gen_ai.request.model", "model x", False),
        ("gen_ai.request.model", 7, False),
        ("gen_ai.response.finish_reasons", ("stop", "the user said no"), False),
        ("gen_ai.response.finish_reasons", ("stop", 7), False),
        # as is: the prompt ID, whatever it holds; flags and vocabularies of the guard
        ("acp.prompt.id", "prompt 1 / ü", True),
        ("acp.input.external", True, True),
        ("acp.input.external", "yes, CnryFlagZq", False),
        ("acp.tool.status", "error", True),
        ("acp.tool.status", ["CnryStatusZq"], False),
        ("acp.tool.type", "mcp", True),
        ("gen_ai.conversation.id", "conv-123", True),
        ("gen_ai.conversation.id", 42, False),
        ("gen_ai.tool.call.id", "toolu_01ABC", True),
    ],
)
def test_a_genai_span_keeps_an_allowed_key_only_when_its_value_has_the_keys_shape(
    key: str, value: object, kept: bool | str
) -> None:
    out = InMemorySpanExporter()
    attributes = {"gen_ai.operation.name": "chat", key: value}
    RedactingSpanExporter(out).export([ReadableSpan("chat", attributes=attributes)])  # type: ignore[arg-type]
    (exported,) = out.get_finished_spans()
    expected = (
        {"gen_ai.operation.name": "chat", key: value} if kept else {"gen_ai.operation.name": "chat"}
    )
    assert dict(exported.attributes or {}) == expected


def test_a_span_that_is_not_a_genai_span_keeps_allowed_keys_of_any_shape() -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("work") as span:
        span.set_attributes({"server.address": "not a word", "server.port": "443"})
    (exported,) = out.get_finished_spans()
    assert dict(exported.attributes or {}) == {"server.address": "not a word", "server.port": "443"}


@pytest.mark.parametrize(("length", "exported"), [(256, True), (257, False)])
def test_a_tool_name_up_to_256_characters_is_a_pseudonym_and_a_longer_one_is_dropped(
    length: int, exported: bool
) -> None:
    name = "t" * length
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out, pseudonym_key=b"k")
    exporter.export([ReadableSpan("execute_tool", attributes={"gen_ai.tool.name": name})])
    (span,) = out.get_finished_spans()
    expected = {"gen_ai.tool.name": Pseudonymizer(b"k")(name)} if exported else {}
    assert dict(span.attributes or {}) == expected


def test_removes_answers_for_spans_that_are_not_genai_spans_unless_told() -> None:
    exporter = RedactingSpanExporter(InMemorySpanExporter())
    assert exporter.removes("labels") is False
    assert exporter.removes("labels", genai=True) is True
    assert exporter.removes("user.id") is True


def test_each_resource_is_redacted_once_and_keeps_its_schema_url() -> None:
    schema = "https://opentelemetry.io/schemas/1.26.0"
    first = Resource({"service.name": "a", "process.owner": "alice"}, schema)
    second = Resource({"service.name": "b", "process.owner": "bob"}, schema)
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out)
    spans = [ReadableSpan(name, resource=r) for name, r in [("1", first), ("2", second)]]
    exporter.export(spans)
    exporter.export([ReadableSpan("3", resource=first)])
    one, two, three = (s.resource for s in out.get_finished_spans())
    assert dict(one.attributes) == {"service.name": "a"}
    assert dict(two.attributes) == {"service.name": "b"}
    assert three is one  # not redacted again after another resource came between
    assert one.schema_url == two.schema_url == schema


@pytest.mark.parametrize(
    ("event_name", "event_attributes"),
    [("gen_ai.choice", {}), ("choice", {"gen_ai.response.id": "r-1"})],
)
def test_a_span_is_a_genai_span_by_an_event_name_or_an_event_attribute_alone(
    event_name: str, event_attributes: dict[str, str]
) -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("work") as span:
        span.set_attribute("labels", "kept on other spans")
        span.add_event(event_name, event_attributes)
    (exported,) = out.get_finished_spans()
    assert dict(exported.attributes or {}) == {}  # the allow-list applies


def test_the_resource_cache_starts_over_when_it_holds_4096_resources() -> None:
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out)
    resources = [Resource({"service.name": f"s{n}", "process.owner": "al"}) for n in range(4097)]
    exporter.export([ReadableSpan("a", resource=r) for r in resources[:4096]])
    exporter.export([ReadableSpan("b", resource=resources[0])])  # held: the same copy
    exporter.export([ReadableSpan("c", resource=resources[4096])])  # one more: it starts over
    exporter.export([ReadableSpan("d", resource=resources[0])])
    spans = out.get_finished_spans()
    first = spans[0].resource
    assert spans[4096].resource is first
    assert spans[-1].resource is not first
    assert spans[-1].resource == first == Resource({"service.name": "s0"})


def test_extra_keys_and_patterns_are_removed_from_resources_too() -> None:
    resource = Resource(
        {"service.name": "agent", "deployment.owner": "alice", "team.lead": "bob", "team": "x"}
    )
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(
        out, extra_keys=["deployment.owner"], extra_patterns=[r"team\..+", r"nothing"]
    )
    exporter.export([ReadableSpan("work", resource=resource)])
    (span,) = out.get_finished_spans()
    assert dict(span.resource.attributes) == {"service.name": "agent", "team": "x"}


def test_without_extra_patterns_no_key_matches_by_pattern_not_even_the_empty_one() -> None:
    assert SensitiveKeys()("") is False
    assert SensitiveKeys(["a"])("") is False
    assert RedactingSpanExporter(InMemorySpanExporter()).removes("") is False
    assert (
        RedactingSpanExporter(InMemorySpanExporter(), extra_patterns=["x.*"]).removes("") is False
    )


@pytest.mark.parametrize(
    ("attributes", "name"),
    [
        ({"gen_ai.operation.name": "chat", "gen_ai.response.model": "model-y"}, "chat model-y"),
        (
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "model-x",
                "gen_ai.response.model": "model-y",
            },
            "chat model-x",
        ),
        ({"gen_ai.operation.name": "chat"}, "chat"),
        ({"gen_ai.operation.name": "execute_tool", "gen_ai.request.model": "m"}, "execute_tool"),
    ],
)
def test_a_model_call_is_named_after_the_requested_else_the_responding_model(
    attributes: dict[str, str], name: str
) -> None:
    out = InMemorySpanExporter()
    RedactingSpanExporter(out).export([ReadableSpan("anything", attributes=attributes)])
    (span,) = out.get_finished_spans()
    assert span.name == name


@pytest.mark.parametrize(
    ("allowed", "name"), [((), "execute_tool"), (("gen_ai.tool.name",), "Run-Shell")]
)
def test_with_an_allow_list_a_tool_span_whose_name_was_rewritten_is_named_after_its_operation(
    allowed: tuple[str, ...], name: str
) -> None:
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out, allow_keys=["gen_ai.operation.name", *allowed])
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_shell"}
    exporter.export([ReadableSpan("Run-Shell", attributes=attributes)])
    (span,) = out.get_finished_spans()
    assert span.name == name


@pytest.mark.parametrize("path", ["/home/u/notes/", "C:\\Users\\u\\notes\\", "/home/u/notes"])
def test_the_last_part_of_a_removed_path_is_searched_in_names_even_after_a_trailing_slash(
    path: str,
) -> None:
    provider, out = pipeline()
    with provider.get_tracer("agent").start_as_current_span("list NOTES") as span:
        span.set_attribute("file.path", path)
    (exported,) = out.get_finished_spans()
    assert exported.name == REDACTED_SPAN_NAME


@pytest.mark.parametrize(
    ("key", "value", "exported"),
    [
        # Rewritten, not dropped: the key's presence or kind is what the guard reads.
        ("gen_ai.tool.call.id", b"call-1", ""),
        ("gen_ai.tool.call.id", ("call 1", "call 2"), ""),
        ("gen_ai.tool.call.id", "x" * 300, ""),
        ("acp.batch.admitted", "CnryAdmittedZq", -1),
        ("acp.batch.admitted", True, -1),
        ("acp.prompt.route", "CnryRouteZq text", "_OTHER"),
        ("acp.prompt.route", "cron", "cron"),
        # A string outside a closed vocabulary stays a value outside it (replay reads it so:
        # declared, not missing).
        ("acp.tool.status", "CnryStatusZq disk full", "_OTHER"),
        ("acp.tool.type", "CnryTypeZq", "_OTHER"),
        ("acp.tool.execution.status", "CnryExecZq", "_OTHER"),
    ],
)
def test_an_allowed_key_of_the_wrong_shape_is_rewritten_as_the_guard_reads_it(
    key: str, value: object, exported: object
) -> None:
    out = InMemorySpanExporter()
    attributes = {"gen_ai.operation.name": "chat", key: value}
    RedactingSpanExporter(out).export([ReadableSpan("chat", attributes=attributes)])  # type: ignore[arg-type]
    (span,) = out.get_finished_spans()
    assert dict(span.attributes or {}) == {"gen_ai.operation.name": "chat", key: exported}


def test_ids_holding_json_become_pseudonyms_that_keep_equality() -> None:
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out, pseudonym_key=b"k")
    first = '{"user": "CnryConvZq alice"}'
    spans = [
        ReadableSpan(
            "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": v}
        )
        for v in (first, first, '{"user": "bob"}')
    ]
    exporter.export(spans)  # type: ignore[arg-type]
    ids = [dict(s.attributes or {})["gen_ai.conversation.id"] for s in out.get_finished_spans()]
    assert ids[0] == ids[1] != ids[2]
    assert all(isinstance(i, str) and i.startswith("conv_") and "Cnry" not in i for i in ids)


@pytest.mark.parametrize(
    "marker",
    [
        "mcp.method.name",
        "mcp.protocol.version",
        "mcp.resource.uri",
        "mcp.server.name",
        "mcp.session.id",
    ],
)
def test_an_mcp_call_loses_the_host_that_names_its_server(marker: str) -> None:
    # On a model call the host is the model endpoint; on an MCP call it names the MCP server.
    out = InMemorySpanExporter()
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "server.address": "cnry-mcp-host.internal",
        "server.port": 8443,
        marker: "tools/call",
    }
    RedactingSpanExporter(out).export(
        [ReadableSpan("tools/call cnry-mcp-host.internal", attributes=attributes)]
    )  # type: ignore[arg-type]
    (exported,) = out.get_finished_spans()
    assert "server.address" not in (exported.attributes or {})
    assert (exported.attributes or {})["server.port"] == 8443
    assert "cnry" not in exported.name
    chat = {"gen_ai.operation.name": "chat", "server.address": "api.example.com"}
    RedactingSpanExporter(out).export([ReadableSpan("chat", attributes=chat)])  # type: ignore[arg-type]
    assert (out.get_finished_spans()[-1].attributes or {})["server.address"] == "api.example.com"
