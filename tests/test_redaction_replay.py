"""Redacted traces replay to exactly the decisions of the raw traces (docs/contract.md section 6).

Operators can only replay what they exported. The demo's sessions, written as OTLP/JSON, are
redacted by the exporter and written again; both files are replayed by ``otel-guard replay``;
the reports must be equal. Hypothesis then generates loops of its own (tool names that differ
only in case, blank and over-long names, classified, upper-case and free-text error types,
every terminal and execution status) and compares the raw and redacted replays the same way.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, Status, StatusCode, Tracer, set_span_in_context

from otel_guard import RedactingSpanExporter
from otel_guard.cli import main
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter, parse_request
from otel_guard.replay.reader import TraceReader
from otel_guard.replay.replayer import Replayer

MODES = ("shadow", "warn", "enforce")


def redact_file(raw: Path, redacted: Path, key: bytes | None = None) -> None:
    """Redact every line of an OTLP/JSON file with the exporter, as an agent would export it."""
    with redacted.open("w", encoding="utf-8") as stream:
        exporter = RedactingSpanExporter(OtlpJsonSpanExporter(stream), pseudonym_key=key)
        for line in TraceReader([str(raw)]):
            exporter.export(line.spans)
        assert exporter.dropped_spans == 0


def replay_json(capsys: pytest.CaptureFixture[str], mode: str, path: Path) -> dict[str, Any]:
    assert main(["replay", "--mode", mode, "--format", "json", str(path)]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    document.pop("files")
    return document


@pytest.mark.parametrize("mode", MODES)
def test_redacted_demo_traces_replay_to_the_same_report(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, redacted = tmp_path / "raw.jsonl", tmp_path / "redacted.jsonl"
    assert main(["demo", "--mode", mode, "--out", str(raw)]) == 0
    capsys.readouterr()
    redact_file(raw, redacted)
    # The redaction really happened: no tool name of the demo is left in the file.
    raw_text, redacted_text = raw.read_text(), redacted.read_text()
    for tool in ("run_shell", "read_file", "write_file"):
        assert tool in raw_text and tool not in redacted_text, tool
    raw_report = replay_json(capsys, mode, raw)
    assert raw_report["decisions"]["tracked"] > 0  # the demo's loops are really replayed
    assert replay_json(capsys, mode, redacted) == raw_report


def test_the_checked_in_demo_traces_replay_the_same_after_redaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = Path(__file__).resolve().parent.parent / "examples" / "demo-traces.jsonl"
    redacted = tmp_path / "redacted.jsonl"
    redact_file(raw, redacted, key=b"deployment key")
    raw_report = replay_json(capsys, "shadow", raw)
    assert raw_report["decisions"]["tracked"] == 7
    assert raw_report["decisions"]["would_warn"] == 3
    assert replay_json(capsys, "shadow", redacted) == raw_report


# -- generated loops -------------------------------------------------------------------------

TOOL_NAMES = ("run_shell", "Run_Shell", "read_file", "mcp__files__read", "", "  ", "x" * 300)
ERROR_TYPES = (
    "exit_nonzero",
    "timeout",
    "Exit_Nonzero",
    "TimeoutError",
    "unknown",
    "",
    "Connection reset by peer",
    None,
)
STATUSES = ("error", "success", "cancelled", "weird")
EXECUTIONS = ("error", "success", "cancelled", "not_started", "unknown", None)

calls = st.tuples(
    st.sampled_from(TOOL_NAMES),
    st.sampled_from(("error",) * 4 + STATUSES),
    st.sampled_from(("error",) * 4 + EXECUTIONS),
    st.sampled_from(ERROR_TYPES),
    st.sampled_from(("native", "mcp", "other", None)),
    st.sampled_from(ERROR_TYPES),  # error.type, never the key on an acp.* span
)
batches = st.tuples(
    st.lists(calls, min_size=1, max_size=4),
    st.booleans(),  # input reliable
    st.integers(min_value=0, max_value=1),  # admitted minus ended: 1 leaves the batch incomplete
)
prompts = st.lists(st.lists(batches, min_size=1, max_size=6), min_size=1, max_size=3)


# Values of the wrong shape under allowed keys: (call ID, status, route, admitted) forms.
ODD_CALL_IDS = (
    lambda n: f"call-{n}",
    lambda n: f"call-{n}".encode(),  # bytes
    lambda n: json.dumps({"id": n, "note": "CnryIdZq"}),  # JSON: a pseudonym, still distinct
    lambda n: json.dumps({"note": "CnryIdZq"}),  # JSON, equal for every call
    lambda n: (f"call-{n}", "CnryIdZq"),  # a list
)
ODD_STATUSES = (None, ["error", "CnryStatusZq"], "CnryStatusZq text")
ODD_ROUTES = (None, "cron", "interactive", "CnryRouteZq text", ["cron"])
ODD_ADMITTED = (None, "CnryAdmittedZq", True, -3)


def _record(
    tracer: Tracer, sessions: Sequence[Any], odd: tuple[int, int, int, int] | None = None
) -> None:
    call_id_form, status_form, route_form, admitted_form = odd or (0, 0, 0, 0)
    number = 0
    for p, session in enumerate(sessions):
        prompt_id = f"prompt-{p}"
        prompt_attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "acp.prompt.id": prompt_id,
        }
        if ODD_ROUTES[route_form] is not None:
            prompt_attributes["acp.prompt.route"] = ODD_ROUTES[route_form]
        prompt = tracer.start_span("invoke_agent", attributes=prompt_attributes)
        for batch_calls, reliable, missing in session:
            batch = tracer.start_span(
                "tool_batch",
                context=set_span_in_context(prompt),
                attributes={"acp.prompt.id": prompt_id},
            )
            spans: list[Span] = []
            for tool, status, execution, error_type, tool_type, terminal_type in batch_calls:
                number += 1
                attributes: dict[str, Any] = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": ODD_CALL_IDS[call_id_form](number),
                    "acp.tool.status": status
                    if ODD_STATUSES[status_form] is None or number % 2 == 0
                    else ODD_STATUSES[status_form],
                    "gen_ai.tool.call.arguments": '{"cmd": "make"}',
                }
                for key, value in (
                    ("acp.tool.execution.status", execution),
                    ("acp.tool.execution.error_type", error_type),
                    ("acp.tool.type", tool_type),
                    ("error.type", terminal_type),
                ):
                    if value is not None:
                        attributes[key] = value
                span = tracer.start_span(
                    f"execute_tool {tool}",
                    context=set_span_in_context(batch),
                    attributes=attributes,
                )
                if status == "error":
                    span.set_status(Status(StatusCode.ERROR, f"{tool} failed"))
                spans.append(span)
            for span in spans:
                span.end()
            batch.set_attributes(
                {
                    "acp.batch.admitted": len(spans) + missing
                    if ODD_ADMITTED[admitted_form] is None
                    else ODD_ADMITTED[admitted_form],
                    "acp.input.external": False,
                    "acp.input.queued_prompt": False,
                    "acp.input.reliable": reliable,
                }
            )
            batch.end()
        prompt.end()


def _raw_and_redacted(
    key: bytes | None = None,
) -> tuple[TracerProvider, InMemorySpanExporter, InMemorySpanExporter]:
    """A provider exporting each span twice: as it is, and through the redacting exporter."""
    raw = InMemorySpanExporter()
    redacted = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(raw))
    provider.add_span_processor(
        SimpleSpanProcessor(RedactingSpanExporter(redacted, pseudonym_key=key))
    )
    return provider, raw, redacted


def _replay(mode: str, spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    replayer = Replayer(mode)
    replayer.add(spans)
    return replayer.finish().to_json()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions=prompts, key=st.one_of(st.none(), st.binary(min_size=1, max_size=8)))
def test_generated_loops_replay_to_the_same_report_after_redaction(
    mode: str, sessions: list[Any], key: bytes | None
) -> None:
    provider, raw, redacted = _raw_and_redacted(key)
    _record(provider.get_tracer("agent"), sessions)
    raw_spans, redacted_spans = raw.get_finished_spans(), redacted.get_finished_spans()
    # Redacted for real: no raw tool name, no arguments, no status text.
    encoded = "\n".join(span.to_json() for span in redacted_spans)
    assert "run_shell" not in encoded.lower() and "cmd" not in encoded and "failed" not in encoded
    # Replayed as an operator has them: the redacted spans as exported OTLP/JSON, read back.
    stream = io.StringIO()
    assert OtlpJsonSpanExporter(stream).export(redacted_spans) is SpanExportResult.SUCCESS
    read_back = parse_request(stream.getvalue())
    assert len(read_back) == len(raw_spans)
    assert _replay(mode, read_back) == _replay(mode, raw_spans)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions=prompts,
    odd=st.tuples(
        st.integers(0, len(ODD_CALL_IDS) - 1),
        st.integers(0, len(ODD_STATUSES) - 1),
        st.integers(0, len(ODD_ROUTES) - 1),
        st.integers(0, len(ODD_ADMITTED) - 1),
    ),
)
def test_values_of_the_wrong_shape_leave_nothing_and_replay_to_the_same_report(
    mode: str, sessions: list[Any], odd: tuple[int, int, int, int]
) -> None:
    raw = InMemorySpanExporter()
    redacted = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(raw))
    provider.add_span_processor(SimpleSpanProcessor(RedactingSpanExporter(redacted)))
    _record(provider.get_tracer("agent"), sessions, odd)
    raw_spans, redacted_spans = raw.get_finished_spans(), redacted.get_finished_spans()
    call_id_form, status_form, route_form, admitted_form = odd
    if call_id_form >= 2 or status_form >= 1 or route_form == 3 or admitted_form == 1:
        assert b"Cnry" in encode_spans(raw_spans).SerializeToString()
    assert b"Cnry" not in encode_spans(redacted_spans).SerializeToString()
    stream = io.StringIO()
    assert OtlpJsonSpanExporter(stream).export(redacted_spans) is SpanExportResult.SUCCESS
    read_back = parse_request(stream.getvalue())
    assert _replay(mode, read_back) == _replay(mode, raw_spans)


def _record_openinference(
    tracer: Tracer, tools: Sequence[str], call_id_key: str, session: str | None, typed_by: str
) -> None:
    """An OpenInference agent (section 3c) looping on failing tools: an AGENT span, an LLM span
    before each batch and after the last, each batch's TOOL spans failing below a chain span."""
    agent_attributes: dict[str, Any] = {"openinference.span.kind": "AGENT"}
    if session is not None:
        agent_attributes["session.id"] = session
    agent = tracer.start_span("agent run", attributes=agent_attributes)
    inside = set_span_in_context(agent)
    number = 0
    for _ in range(4):
        tracer.start_span(
            "llm", context=inside, attributes={"openinference.span.kind": "LLM"}
        ).end()
        chain = tracer.start_span("tools", context=inside, attributes={"input.value": "CnryArgsZq"})
        for tool in tools:
            number += 1
            span = tracer.start_span(
                f"tool {tool}",
                context=set_span_in_context(chain),
                attributes={
                    "openinference.span.kind": "TOOL",
                    "tool.name": tool,
                    call_id_key: f"CnryCall {number}/x",
                    "input.value": '{"path": "/home/CnryPathZq"}',
                },
            )
            if typed_by == "error.type":
                span.set_attribute("error.type", "TimeoutError")
            else:
                span.record_exception(TimeoutError("CnryMessageZq"))
            span.set_status(Status(StatusCode.ERROR, "CnryStatusZq"))
            span.end()
        chain.end()
    tracer.start_span("llm", context=inside, attributes={"openinference.span.kind": "LLM"}).end()
    agent.end()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call_id_key", ["tool_call.id", "tool.id"])
@pytest.mark.parametrize("session", [None, "session-7f3a"])
@pytest.mark.parametrize("typed_by", ["error.type", "exception"])
@pytest.mark.parametrize("key", [None, b"k"])
def test_openinference_loops_replay_to_the_same_report_after_redaction(
    mode: str, call_id_key: str, session: str | None, typed_by: str, key: bytes | None
) -> None:
    """The OpenInference profile's tool name is exported as a pseudonym and its call IDs and
    session as identifiers the guard compares, so its decisions replay unchanged too."""
    provider, raw, redacted = _raw_and_redacted(key)
    _record_openinference(
        provider.get_tracer("agent"),
        ["CnryToolZq"] * 3,
        call_id_key,
        session,
        typed_by,
    )
    raw_spans, redacted_spans = raw.get_finished_spans(), redacted.get_finished_spans()
    encoded = encode_spans(redacted_spans).SerializeToString()
    canaries = [b"CnryToolZq", b"CnryArgsZq", b"CnryPathZq", b"CnryStatusZq"]
    if typed_by == "exception":
        canaries.append(b"CnryMessageZq")
    for canary in canaries:
        assert canary in encode_spans(raw_spans).SerializeToString()
        assert canary not in encoded
    stream = io.StringIO()
    assert OtlpJsonSpanExporter(stream).export(redacted_spans) is SpanExportResult.SUCCESS
    read_back = parse_request(stream.getvalue())
    expected = _replay(mode, raw_spans)
    # Not vacuous: the raw loop is stopped (or would be), and so is the redacted one.
    assert expected["decisions"].get("would_stop", 0) == 1, expected["decisions"]
    assert _replay(mode, read_back) == expected


def _record_genai_placeholders(tracer: Tracer, placeholder: str, merged: bool) -> None:
    """A GenAI-conventions agent (section 3b) looping on a failing tool whose call IDs are a
    framework's placeholder; with ``merged``, each turn also has Google ADK's ``execute_tool
    (merged)`` span, which is no call, failing with another type."""
    agent = tracer.start_span(
        "invoke_agent CnryAgentZq", attributes={"gen_ai.operation.name": "invoke_agent"}
    )
    inside = set_span_in_context(agent)
    for _ in range(4):
        tracer.start_span(
            "chat", context=inside, attributes={"gen_ai.operation.name": "chat"}
        ).end()
        if merged:
            wrapper = tracer.start_span(
                "execute_tool (merged)",
                context=inside,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "(merged tools)",
                    "gen_ai.tool.call.id": placeholder,
                    "error.type": "ValueError",
                },
            )
            wrapper.set_status(Status(StatusCode.ERROR, "CnryStatusZq"))
            wrapper.end()
        for _ in range(3):
            span = tracer.start_span(
                "execute_tool CnryToolZq",
                context=inside,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "CnryToolZq",
                    "gen_ai.tool.call.id": placeholder,
                    "gen_ai.tool.call.arguments": '{"path": "/home/CnryPathZq"}',
                    "error.type": "TimeoutError",
                },
            )
            span.set_status(Status(StatusCode.ERROR, "CnryStatusZq"))
            span.end()
    tracer.start_span("chat", context=inside, attributes={"gen_ai.operation.name": "chat"}).end()
    agent.end()


@pytest.mark.parametrize("placeholder", ["<not specified>", "", "  ", " <not specified> "])
@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("key", [None, b"k"])
def test_placeholder_call_ids_and_merged_spans_replay_the_same_after_redaction(
    placeholder: str, merged: bool, key: bytes | None
) -> None:
    """Placeholder call IDs are missing IDs (the span ID stands in) and ADK's merged span is no
    call: both are kept as written, since a pseudonym of either reads as something else (one
    call ID shared by every call, a failing call of a tool)."""
    provider, raw, redacted = _raw_and_redacted(key)
    _record_genai_placeholders(provider.get_tracer("agent"), placeholder, merged)
    raw_spans, redacted_spans = raw.get_finished_spans(), redacted.get_finished_spans()
    encoded = encode_spans(redacted_spans).SerializeToString()
    for canary in (b"CnryToolZq", b"CnryPathZq", b"CnryStatusZq", b"CnryAgentZq"):
        assert canary in encode_spans(raw_spans).SerializeToString()
        assert canary not in encoded
    stream = io.StringIO()
    assert OtlpJsonSpanExporter(stream).export(redacted_spans) is SpanExportResult.SUCCESS
    read_back = parse_request(stream.getvalue())
    expected = _replay("shadow", raw_spans)
    assert expected["decisions"].get("would_stop", 0) == 1, expected["decisions"]
    assert _replay("shadow", read_back) == expected
