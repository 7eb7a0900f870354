"""RedactingSpanExporter: what an exported copy keeps and loses (docs/contract.md section 6)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

from otel_guard import RedactingSpanExporter
from otel_guard.privacy.pseudonym import Pseudonymizer
from otel_guard.privacy.redaction import BATCH_SPAN_NAME, REDACTED_SPAN_NAME
from otel_guard.privacy.sensitive import SENSITIVE_KEYS, is_genai_key, is_sensitive

RESOURCE = Resource.create({"service.name": "agent", "deployment.environment.name": "test"})


class Pipeline:
    """A TracerProvider exporting both the original spans and their redacted copies."""

    def __init__(self, limits: SpanLimits | None = None, **options: Any) -> None:
        self.raw = InMemorySpanExporter()
        self.out = InMemorySpanExporter()
        self.exporter = RedactingSpanExporter(self.out, **options)
        self.provider = TracerProvider(resource=RESOURCE, span_limits=limits)
        self.provider.add_span_processor(SimpleSpanProcessor(self.raw))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("agent", "1.2.3")

    def one(self) -> tuple[ReadableSpan, ReadableSpan]:
        (raw,) = self.raw.get_finished_spans()
        (out,) = self.out.get_finished_spans()
        return raw, out


class RecordingExporter(SpanExporter):
    """A real exporter that remembers what it was asked to do."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.batches: list[list[ReadableSpan]] = []
        self.calls: list[str] = []
        self.result = result

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(list(spans))
        return self.result

    def shutdown(self) -> None:
        self.calls.append("shutdown")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.calls.append(f"force_flush({timeout_millis})")
        return False


class FailingExporter(RecordingExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("collector down")


class UnreadableSpan(ReadableSpan):
    """A span whose attributes cannot be read: it cannot be proved safe to export."""

    @property
    def attributes(self) -> Any:
        raise RuntimeError("attributes are gone")


def test_a_genai_span_keeps_only_the_allow_list() -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(
        "chat",
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "model-x",
            "gen_ai.input.messages": "[secret]",
            "gen_ai.output.messages": "[secret]",
            "gen_ai.system_instructions": "secret",
            "user.id": "u-1",
            "file.path": "/home/u/secret.txt",
            "acp.prompt.id": "prompt-1",
            "gen_ai.usage.input_tokens": 12,
            "labels": ("a", "b"),
        },
    ):
        pass
    raw, out = p.one()
    assert dict(out.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "model-x",
        "acp.prompt.id": "prompt-1",
        "gen_ai.usage.input_tokens": 12,
    }
    assert out.name == "chat model-x"
    assert (raw.attributes or {})["user.id"] == "u-1"  # the SDK's own span is untouched


def test_sensitive_attributes_of_other_spans_are_removed_and_the_rest_kept_exactly() -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(
        "work",
        attributes={
            "User.Id": "u-1",
            "file.path": "/home/u/secret.txt",
            "http.request.header.authorization": ("Bearer t",),
            "db.statement": "select 1",
            "http.response.status_code": 200,
            "labels": ("a", "b"),
        },
    ):
        pass
    _, out = p.one()
    assert dict(out.attributes or {}) == {"http.response.status_code": 200, "labels": ("a", "b")}


def test_everything_but_sensitive_data_is_unchanged() -> None:
    p = Pipeline()
    parent = p.tracer.start_span("request")
    linked = p.tracer.start_span("other")
    span = p.tracer.start_span(
        "GET /items",
        context=set_span_in_context(parent),
        kind=SpanKind.CLIENT,
        links=[Link(linked.get_span_context(), {"link.kind": "follows"})],
        attributes={"http.request.method": "GET"},
        start_time=1_000,
    )
    span.add_event("first_byte", {"http.response.body.size": 1}, timestamp=1_500)
    span.end(end_time=2_000)
    linked.end()
    parent.end()
    raw = next(s for s in p.raw.get_finished_spans() if s.name == "GET /items")
    out = next(s for s in p.out.get_finished_spans() if s.name == "GET /items")
    assert out is not raw
    assert isinstance(out, ReadableSpan)
    assert (out.name, out.context, out.parent, out.kind) == (
        raw.name,
        raw.context,
        raw.parent,
        raw.kind,
    )
    assert (out.start_time, out.end_time) == (1_000, 2_000)
    assert out.resource is raw.resource
    assert out.instrumentation_scope == raw.instrumentation_scope
    assert [(e.name, e.timestamp, dict(e.attributes or {})) for e in out.events] == [
        ("first_byte", 1_500, {"http.response.body.size": 1})
    ]
    assert [(link.context, dict(link.attributes or {})) for link in out.links] == [
        (linked.get_span_context(), {"link.kind": "follows"})
    ]
    assert encode_spans([out]).SerializeToString() == encode_spans([raw]).SerializeToString()


def test_recorded_exception_keeps_its_type_but_loses_message_and_stack_trace() -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span("work", record_exception=False) as span:
        try:
            raise FileNotFoundError("/home/u/secret.txt is missing")
        except FileNotFoundError as exc:
            span.record_exception(exc, attributes={"tool_response": "partial output"})
    raw, out = p.one()
    (raw_event,) = raw.events
    assert "secret.txt" in str((raw_event.attributes or {})["exception.message"])
    (event,) = out.events
    assert (event.name, event.timestamp) == ("exception", raw_event.timestamp)
    assert dict(event.attributes or {}) == {
        "exception.type": "FileNotFoundError",
        "exception.escaped": "False",
    }


def test_sensitive_link_attributes_are_removed_and_the_context_kept() -> None:
    p = Pipeline()
    other = p.tracer.start_span("other")
    other.end()
    link = Link(other.get_span_context(), {"mcp.server.name": "files", "link.reason": "retry"})
    with p.tracer.start_as_current_span("work", links=[link]):
        pass
    out = next(s for s in p.out.get_finished_spans() if s.name == "work")
    assert [(lk.context, dict(lk.attributes or {})) for lk in out.links] == [
        (other.get_span_context(), {"link.reason": "retry"})
    ]


@pytest.mark.parametrize("code", [StatusCode.ERROR, StatusCode.OK, StatusCode.UNSET])
def test_status_description_is_dropped_and_code_kept(code: StatusCode) -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span("work", set_status_on_exception=False) as span:
        span.set_status(Status(code, "disk full at /home/u" if code is StatusCode.ERROR else None))
    raw, out = p.one()
    assert raw.status.status_code is code
    assert (out.status.status_code, out.status.description) == (code, None)


def test_status_set_by_an_escaping_exception_loses_its_description() -> None:
    p = Pipeline()
    with pytest.raises(ValueError), p.tracer.start_as_current_span("work"):
        raise ValueError("token=abc123")
    raw, out = p.one()
    assert raw.status.description == "ValueError: token=abc123"
    assert (out.status.status_code, out.status.description) == (StatusCode.ERROR, None)
    assert "exception.message" not in dict(out.events[0].attributes or {})


def test_tool_call_span_is_exported_under_its_operation_name() -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(
        "execute_tool read_secret_file",
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "c1"},
    ):
        pass
    _, out = p.one()
    assert out.name == "execute_tool"
    assert dict(out.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": "c1",
    }


@pytest.mark.parametrize(
    ("name", "attributes", "exported_name"),
    [
        ("invoke_agent for alice", {"gen_ai.operation.name": "invoke_agent", "user.id": "alice"},
         "invoke_agent"),
        ("open /etc/shadow", {"file.path": "/etc/shadow"}, REDACTED_SPAN_NAME),
        ("open by ab", {"user.id": "ab"}, "open by ab"),  # too short to search for
        ("GET /items", {"http.request.method": "GET"}, "GET /items"),
        ("weird op", {"gen_ai.operation.name": "Not An Op", "user.id": "weird"},
         REDACTED_SPAN_NAME),
    ],
)  # fmt: skip
def test_span_name_holding_a_removed_value_is_replaced(
    name: str, attributes: dict[str, Any], exported_name: str
) -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(name, attributes=attributes):
        pass
    _, out = p.one()
    assert out.name == exported_name


def test_extra_keys_and_patterns_are_removed_too() -> None:
    p = Pipeline(extra_keys=["customer.account"], extra_patterns=[r"internal\..+"])
    with p.tracer.start_as_current_span(
        "work",
        attributes={
            "customer.account": "acme",
            "internal.ticket": "T-1",
            "internal": "kept",
            "tool_arguments": "{}",
            "service.tier": "gold",
        },
    ):
        pass
    _, out = p.one()
    assert dict(out.attributes or {}) == {"internal": "kept", "service.tier": "gold"}


def test_allow_list_mode_keeps_only_the_listed_keys_everywhere() -> None:
    p = Pipeline(allow_keys=["gen_ai.operation.name", "gen_ai.tool.name", "exception.type"])
    with p.tracer.start_as_current_span(
        "execute_tool run_shell",
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "run_shell",
            "gen_ai.tool.call.id": "c1",
            "acp.tool.status": "error",
        },
    ) as span:
        span.record_exception(RuntimeError("boom"))
        span.add_event("progress", {"percent": 50})
    _, out = p.one()
    # The listed registry key survives: in allow-list mode the list is the policy.
    assert dict(out.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "run_shell",
    }
    assert out.name == "execute_tool run_shell"  # the tool name is allowed, so is its span name
    assert [(e.name, dict(e.attributes or {})) for e in out.events] == [
        ("exception", {"exception.type": "RuntimeError"}),
        ("progress", {}),
    ]


def test_a_single_string_option_names_one_key() -> None:
    p = Pipeline(extra_keys="ab", allow_keys="ab.c")
    with p.tracer.start_as_current_span("work", attributes={"a": 1, "ab": 2, "ab.c": 3}):
        pass
    _, out = p.one()
    assert dict(out.attributes or {}) == {"ab.c": 3}


def test_allow_list_mode_still_removes_extra_keys() -> None:
    p = Pipeline(allow_keys=["a", "b.c"], extra_patterns=[r"b\..*"])
    with p.tracer.start_as_current_span("work", attributes={"a": 1, "b.c": 2, "d": 3}):
        pass
    _, out = p.one()
    assert dict(out.attributes or {}) == {"a": 1}


def test_empty_allow_list_exports_no_attributes() -> None:
    p = Pipeline(allow_keys=[])
    with p.tracer.start_as_current_span("work", attributes={"a": 1, "service.tier": "gold"}):
        pass
    _, out = p.one()
    assert dict(out.attributes or {}) == {}


def test_dropped_counts_survive_redaction() -> None:
    limits = SpanLimits(max_span_attributes=2, max_events=1, max_links=1)
    p = Pipeline(limits=limits)
    a = p.tracer.start_span("a")
    a.end()
    links = [Link(a.get_span_context()), Link(a.get_span_context())]
    with p.tracer.start_as_current_span("work", links=links) as span:
        span.set_attributes({"x": 1, "user.id": "u", "y": 2})  # the oldest, x, is dropped
        span.add_event("one")
        span.add_event("two")
    raw = next(s for s in p.raw.get_finished_spans() if s.name == "work")
    out = next(s for s in p.out.get_finished_spans() if s.name == "work")
    assert (raw.dropped_attributes, raw.dropped_events, raw.dropped_links) == (1, 1, 1)
    assert (out.dropped_attributes, out.dropped_events, out.dropped_links) == (1, 1, 1)
    assert dict(out.attributes or {}) == {"y": 2}


def test_a_span_that_cannot_be_redacted_is_dropped_and_counted_not_exported() -> None:
    delegate = RecordingExporter()
    exporter = RedactingSpanExporter(delegate)
    good = ReadableSpan("good", attributes={"user.id": "u", "k": "v"})
    bad = UnreadableSpan("bad", attributes={"user.id": "u"})
    assert exporter.export([bad, good, bad]) is SpanExportResult.SUCCESS
    assert [[(s.name, dict(s.attributes or {})) for s in b] for b in delegate.batches] == [
        [("good", {"k": "v"})]
    ]
    assert exporter.dropped_spans == 2
    assert exporter.export([bad]) is SpanExportResult.FAILURE
    assert len(delegate.batches) == 1  # nothing left to hand over
    assert exporter.dropped_spans == 3


def test_export_never_raises_and_reports_the_delegates_failure() -> None:
    exporter = RedactingSpanExporter(FailingExporter())
    assert exporter.export([ReadableSpan("a")]) is SpanExportResult.FAILURE
    failing = RedactingSpanExporter(RecordingExporter(SpanExportResult.FAILURE))
    assert failing.export([ReadableSpan("a")]) is SpanExportResult.FAILURE


def test_shutdown_and_force_flush_delegate() -> None:
    delegate = RecordingExporter()
    exporter = RedactingSpanExporter(delegate)
    assert exporter.force_flush(1234) is False
    exporter.shutdown()
    assert delegate.calls == ["force_flush(1234)", "shutdown"]


def test_redaction_is_not_done_inside_span_end_with_a_batch_processor() -> None:
    out = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    # A long schedule delay: the worker exports only when flushed.
    processor = BatchSpanProcessor(RedactingSpanExporter(out), schedule_delay_millis=600_000)
    provider.add_span_processor(processor)
    with provider.get_tracer("agent").start_as_current_span("work", attributes={"user.id": "u"}):
        pass
    assert out.get_finished_spans() == ()
    assert provider.force_flush()
    assert [dict(s.attributes or {}) for s in out.get_finished_spans()] == [{}]
    provider.shutdown()


_CONTRACT_KEYS = (
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "exception.message",
    "exception.stacktrace",
    "user.id",
    "enduser.id",
    "file.path",
    "code.filepath",
    "mcp.server.name",
    "gen_ai.tool.name",
    "error.type",
    "acp.tool.execution.error_type",
    "tool_arguments",
    "tool_response",
    "function_args",
    "error",
)


@pytest.mark.parametrize("key", _CONTRACT_KEYS)
def test_registry_names_the_spec_and_legacy_keys(key: str) -> None:
    assert is_sensitive(key)
    assert RedactingSpanExporter(InMemorySpanExporter()).removes(key)


@pytest.mark.parametrize(
    "key",
    [
        "gen_ai.operation.name",
        "gen_ai.tool.call.id",
        "acp.prompt.id",
        "acp.tool.type",
        "acp.tool.status",
        "acp.tool.execution.status",
        "acp.batch.admitted",
        "exception.type",
        "http.response.status_code",
    ],
)
def test_registry_keeps_the_structural_keys(key: str) -> None:
    assert not is_sensitive(key)


_keys = st.one_of(
    st.sampled_from(sorted(SENSITIVE_KEYS)),
    st.sampled_from(_CONTRACT_KEYS),
    st.from_regex(r"[a-z]{1,6}(\.[a-z_]{1,8}){0,3}", fullmatch=True),
)
_values = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.booleans(),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
)
_other_keys = _keys.filter(lambda key: not is_genai_key(key))


def _derived(key: str, value: Any, pseudonym: Pseudonymizer) -> Any:
    """What a removed key still exports for replay: a pseudonym or a classified error type."""
    prefix = {"gen_ai.tool.name": "tool_", "tool.name": "tool_", "mcp.server.name": "mcp_"}.get(key)
    if prefix is not None and isinstance(value, str):
        return pseudonym(value, prefix) if value.strip() else value
    if key == "error.type":
        if not isinstance(value, str):
            return "_OTHER"
        lowered = value.lower()
        return lowered if re.fullmatch(r"[a-z][a-z0-9_.-]{0,63}", lowered) else "_OTHER"
    if key == "acp.tool.execution.error_type" and isinstance(value, str):
        return value if re.fullmatch(r"[a-z][a-z0-9_.-]{0,63}", value) else None
    return None


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_other_keys, _values, max_size=12), st.lists(_keys, max_size=3))
def test_other_spans_export_exactly_the_unremoved_attributes(
    attributes: dict[str, Any], extra: Iterable[str]
) -> None:
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out, extra_keys=extra)
    exporter.export([ReadableSpan("work", attributes=attributes)])
    (span,) = out.get_finished_spans()
    exported = dict(span.attributes or {})
    assert exported == {
        k: v for k, v in attributes.items() if not is_sensitive(k) and k not in set(extra)
    }
    assert not any(is_sensitive(k) for k in exported)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=12), st.frozensets(_keys, max_size=6))
def test_allow_list_mode_exports_exactly_the_allowed_keys(
    attributes: dict[str, Any], allowed: frozenset[str]
) -> None:
    out = InMemorySpanExporter()
    RedactingSpanExporter(out, allow_keys=allowed, pseudonym_key=b"k").export(
        [ReadableSpan("work", attributes=attributes)]
    )
    (span,) = out.get_finished_spans()
    pseudonym = Pseudonymizer(b"k")
    expected = {k: v for k, v in attributes.items() if k in allowed}
    for key, value in attributes.items():
        derived = _derived(key, value, pseudonym)
        if key not in allowed and derived is not None:
            expected[key] = derived
    assert dict(span.attributes or {}) == expected


@pytest.mark.parametrize(
    ("key", "value", "exported"),
    [
        ("error.type", "timeout", "timeout"),
        ("error.type", "TimeoutError", "timeouterror"),  # read lower-cased by the GenAI profile
        ("error.type", "Connection reset by peer", "_OTHER"),
        ("error.type", 7, "_OTHER"),
        ("acp.tool.execution.error_type", "exit_nonzero", "exit_nonzero"),
        ("acp.tool.execution.error_type", "Exit_Nonzero", None),  # unclassified to the reducer
        ("acp.tool.execution.error_type", "no such file /home/u", None),
    ],
)
def test_genai_spans_keep_classified_error_types_only(key: str, value: Any, exported: Any) -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(
        "execute_tool", attributes={"gen_ai.operation.name": "execute_tool", key: value}
    ):
        pass
    _, out = p.one()
    assert (out.attributes or {}).get(key) == exported


@pytest.mark.parametrize(
    ("name", "attributes", "exported_name"),
    [
        ("execute_tool Run_Shell", {"gen_ai.operation.name": "execute_tool",
                                    "gen_ai.tool.name": "run_shell"}, "execute_tool"),
        ("chat gpt-x", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x"},
         "chat gpt-x"),
        ("invoke_agent support bot", {"gen_ai.operation.name": "invoke_agent"}, "invoke_agent"),
        ("tool_batch", {"acp.prompt.id": "p", "acp.batch.admitted": 2}, BATCH_SPAN_NAME),
        ("batch read_notes", {"acp.prompt.id": "p", "acp.batch.admitted": 2}, BATCH_SPAN_NAME),
        # Never the span's own name, even a plain identifier.
        ("tool_batch", {"acp.prompt.id": "p"}, REDACTED_SPAN_NAME),
        ("read_notes", {"gen_ai.system": "openai"}, REDACTED_SPAN_NAME),
        ("notes_agent", {"openinference.span.kind": "AGENT"}, "agent"),
        ("read_notes", {"openinference.span.kind": "TOOL", "tool.name": "read_notes"}, "tool"),
        ("notes_chain", {"openinference.span.kind": "CHAIN", "input.value": "x"}, "chain"),
        ("notes_chain", {"openinference.span.kind": "NOTES"}, REDACTED_SPAN_NAME),
        ("running tool: RUN_SHELL", {"gen_ai.tool.name": "run_shell"}, REDACTED_SPAN_NAME),
        ("run_shell", {"gen_ai.tool.name": "run_shell"}, REDACTED_SPAN_NAME),
        ("agent run", {"logfire.msg": "agent run"}, REDACTED_SPAN_NAME),
        ("open NOTES.TXT", {"file.path": "/home/u/notes.txt"}, REDACTED_SPAN_NAME),
    ],
)  # fmt: skip
def test_genai_span_names_become_their_operation(
    name: str, attributes: dict[str, Any], exported_name: str
) -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(name, attributes=attributes):
        pass
    _, out = p.one()
    assert out.name == exported_name


def test_event_names_of_genai_spans_are_identifiers_holding_no_removed_value() -> None:
    p = Pipeline()
    with p.tracer.start_as_current_span(
        "execute_tool", attributes={"gen_ai.operation.name": "execute_tool",
                                    "gen_ai.tool.name": "read_notes"}
    ) as span:  # fmt: skip
        for name in ("gen_ai.choice", "read_notes", "READ_NOTES done", "retry 2", "notes_read"):
            span.add_event(name)
        span.add_event("exception", {"exception.type": "OSError"})
    _, out = p.one()
    # Only the closed names of the conventions survive, identifier-shaped or not.
    assert [e.name for e in out.events] == [
        "gen_ai.choice",
        "redacted",
        "redacted",
        "redacted",
        "redacted",
        "exception",
    ]


def test_sensitive_resource_attributes_are_dropped() -> None:
    resource = Resource(
        {
            "service.name": "agent",
            "process.executable.path": "/home/alice/venv/bin/python",
            "process.command_line": "python agent.py --token t",
            "PROCESS.COMMAND_ARGS": ("python", "agent.py"),
            "process.owner": "alice",
            "process.pid": 42,
        }
    )
    out = InMemorySpanExporter()
    exporter = RedactingSpanExporter(out)
    exporter.export([ReadableSpan("a", resource=resource), ReadableSpan("b", resource=resource)])
    first, second = out.get_finished_spans()
    assert dict(first.resource.attributes) == {"service.name": "agent", "process.pid": 42}
    assert second.resource is first.resource  # one redacted copy per resource
