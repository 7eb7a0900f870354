"""The protobuf reader against the OTLP/JSON reader: the same request reads to the same spans,
context, resource and scope included, and the same faults give the same messages."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from otel_guard.replay.reader import MalformedInput, TraceReader

SPAN_PATH = "resourceSpans[0].scopeSpans[0].spans[0]"
TRACE_ID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN_ID = bytes.fromhex("b7ad6b7169203331")


def framed(*payloads: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def request(**span_fields: Any) -> ExportTraceServiceRequest:
    """One span in one resource and one scope; ``span_fields`` override the defaults."""
    message = ExportTraceServiceRequest()
    block = message.resource_spans.add()
    scope_block = block.scope_spans.add()
    span = scope_block.spans.add()
    span.trace_id = TRACE_ID
    span.span_id = SPAN_ID
    span.name = "execute_tool"
    span.start_time_unix_nano = 5
    span.end_time_unix_nano = 6
    for name, value in span_fields.items():
        if name == "status":
            span.status.code, span.status.message = value
        else:
            setattr(span, name, value)
    return message


def from_proto(message: ExportTraceServiceRequest) -> list[ReadableSpan]:
    reader = TraceReader(["-"], stdin=io.BytesIO(framed(message.SerializeToString())))
    return [span for item in reader for span in item.spans]


def proto_error(message: ExportTraceServiceRequest | bytes) -> str:
    data = message if isinstance(message, bytes) else message.SerializeToString()
    with pytest.raises(MalformedInput) as error:
        list(TraceReader(["-"], stdin=io.BytesIO(framed(data))))
    return str(error.value)


def as_json_line(message: ExportTraceServiceRequest) -> bytes:
    """The same request in OTLP/JSON (hex IDs, integer enums), built by hand."""

    def value(body: Any) -> dict[str, Any]:
        field = body.WhichOneof("value")
        if field == "int_value":
            return {"intValue": str(body.int_value)}
        if field == "array_value":
            return {"arrayValue": {"values": [value(v) for v in body.array_value.values]}}
        camel = {"string_value": "stringValue", "bool_value": "boolValue"}
        camel["double_value"] = "doubleValue"
        return {camel[field]: getattr(body, field)}

    def attributes(entries: Any) -> list[dict[str, Any]]:
        return [{"key": e.key, "value": value(e.value)} for e in entries]

    blocks = []
    for block in message.resource_spans:
        scopes = []
        for scope_block in block.scope_spans:
            spans = []
            for span in scope_block.spans:
                body: dict[str, Any] = {
                    "traceId": span.trace_id.hex(),
                    "spanId": span.span_id.hex(),
                    "name": span.name,
                    "kind": span.kind,
                    "startTimeUnixNano": str(span.start_time_unix_nano),
                    "endTimeUnixNano": str(span.end_time_unix_nano),
                    "attributes": attributes(span.attributes),
                    "status": {"code": span.status.code, "message": span.status.message},
                }
                if span.parent_span_id:
                    body["parentSpanId"] = span.parent_span_id.hex()
                if span.flags:
                    body["flags"] = span.flags
                if span.events:
                    body["events"] = [
                        {
                            "timeUnixNano": str(event.time_unix_nano),
                            "name": event.name,
                            "attributes": attributes(event.attributes),
                        }
                        for event in span.events
                    ]
                spans.append(body)
            scope = {"name": scope_block.scope.name, "version": scope_block.scope.version}
            scopes.append({"scope": scope, "schemaUrl": scope_block.schema_url, "spans": spans})
        resource = {"attributes": attributes(block.resource.attributes)}
        blocks.append({"resource": resource, "schemaUrl": block.schema_url, "scopeSpans": scopes})
    return json.dumps({"resourceSpans": blocks}).encode() + b"\n"


def from_json(message: ExportTraceServiceRequest) -> list[ReadableSpan]:
    reader = TraceReader(["-"], stdin=io.BytesIO(as_json_line(message)))
    return [span for item in reader for span in item.spans]


def everything(span: ReadableSpan) -> tuple[Any, ...]:
    """All a reader decides about a span, its contexts, resource and scope included."""
    context, parent, scope = span.context, span.parent, span.instrumentation_scope
    assert context is not None and scope is not None
    return (
        (context.trace_id, context.span_id, context.trace_flags, context.is_remote),
        None
        if parent is None
        else (parent.trace_id, parent.span_id, parent.trace_flags, parent.is_remote),
        span.name,
        span.kind,
        (span.start_time, span.end_time),
        dict(span.attributes or {}),
        (span.status.status_code, span.status.description),
        (dict(span.resource.attributes), span.resource.schema_url),
        (scope.name, scope.version, scope.schema_url),
        [(e.name, dict(e.attributes or {}), e.timestamp) for e in span.events],
    )


def test_a_request_with_every_field_set_reads_the_same_from_proto_as_from_json() -> None:
    message = request(
        parent_span_id=bytes.fromhex("00f067aa0ba902b7"),
        kind=3,
        flags=0x301,
        status=(2, "tool failed"),
    )
    block = message.resource_spans[0]
    block.schema_url = "https://opentelemetry.io/schemas/1.26.0"
    entry = block.resource.attributes.add()
    entry.key, entry.value.string_value = "service.name", "agent"
    scope_block = block.scope_spans[0]
    scope_block.scope.name, scope_block.scope.version = "agent", "1.2.3"
    scope_block.schema_url = "https://opentelemetry.io/schemas/1.25.0"
    span = scope_block.spans[0]
    for key, field, value in [
        ("s", "string_value", "text"),
        ("b", "bool_value", True),
        ("i", "int_value", -(2**63)),
        ("d", "double_value", 0.25),
    ]:
        entry = span.attributes.add()
        entry.key = key
        setattr(entry.value, field, value)
    for name, raised, at in [
        ("exception", "TimeoutError", 7),
        ("retry", "ignored", 8),
        ("exception", None, 9),
        ("exception", "PermissionError", 10),
    ]:
        event = span.events.add()
        event.name, event.time_unix_nano = name, at
        if raised is not None:
            entry = event.attributes.add()
            entry.key, entry.value.string_value = "exception.type", raised
        entry = event.attributes.add()
        entry.key, entry.value.string_value = "exception.message", "secret message"
    (read,) = from_proto(message)
    assert everything(read) == everything(from_json(message)[0])
    # The exception events, with their type only: the inferred profiles type a failure by them.
    assert [(e.name, dict(e.attributes or {}), e.timestamp) for e in read.events] == [
        ("exception", {"exception.type": "TimeoutError"}, 7),
        ("exception", {}, 9),
        ("exception", {"exception.type": "PermissionError"}, 10),
    ]
    assert read.parent is not None and read.parent.trace_id == int(TRACE_ID.hex(), 16)
    assert read.parent.span_id == 0x00F067AA0BA902B7
    assert read.context is not None and read.context.trace_flags.sampled
    assert read.resource.schema_url == "https://opentelemetry.io/schemas/1.26.0"
    assert read.instrumentation_scope is not None
    assert read.instrumentation_scope.version == "1.2.3"
    assert read.instrumentation_scope.schema_url == "https://opentelemetry.io/schemas/1.25.0"
    assert read.status.description == "tool failed"
    assert read.kind is SpanKind.CLIENT


@pytest.mark.parametrize(
    ("flags", "sampled"),
    [(0, True), (1, True), (0x100, False), (0x301, True), (2, False)],
)
def test_trace_flags_read_as_the_json_reader_reads_them(flags: int, sampled: bool) -> None:
    # Protobuf cannot tell an absent flags field from 0: both read as sampled.
    message = request(parent_span_id=b"\x00" * 7 + b"\x01", flags=flags)
    (read,) = from_proto(message)
    assert everything(read) == everything(from_json(message)[0])
    assert read.context is not None and read.parent is not None
    assert read.context.trace_flags.sampled is sampled
    assert read.parent.trace_flags == read.context.trace_flags


def test_empty_scope_version_and_schema_urls_read_as_absent() -> None:
    (read,) = from_proto(request())
    scope = read.instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version, scope.schema_url) == ("", None, "")
    assert read.resource.schema_url == ""
    assert everything(read) == everything(from_json(request())[0])


def test_ids_of_one_are_valid_and_an_all_zero_parent_means_no_parent() -> None:
    (read,) = from_proto(request(trace_id=b"\x00" * 15 + b"\x01", span_id=b"\x00" * 7 + b"\x01"))
    assert read.context is not None
    assert (read.context.trace_id, read.context.span_id) == (1, 1)
    (orphan,) = from_proto(request(parent_span_id=b"\x00" * 8))
    assert orphan.parent is None


def test_a_span_ending_as_it_starts_is_read() -> None:
    (read,) = from_proto(request(start_time_unix_nano=7, end_time_unix_nano=7))
    assert (read.start_time, read.end_time) == (7, 7)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trace_id": b"\x01" * 15}, ".traceId: expected 16 bytes"),
        ({"trace_id": b"\x00" * 16}, ".traceId: an all-zero ID is invalid"),
        ({"span_id": b"\x00" * 8}, ".spanId: an all-zero ID is invalid"),
        ({"span_id": b"\x01" * 9}, ".spanId: expected 8 bytes"),
        ({"parent_span_id": b"\x01" * 3}, ".parentSpanId: expected 8 bytes"),
        ({"end_time_unix_nano": 4}, ": endTimeUnixNano is before startTimeUnixNano"),
        ({"kind": 9}, ".kind: unknown span kind"),
        ({"status": (7, "")}, ".status.code: unknown status code"),
    ],
)
def test_span_faults_name_the_frame_the_span_and_the_field(
    fields: dict[str, Any], message: str
) -> None:
    assert proto_error(request(**fields)) == f"-:1: {SPAN_PATH}{message}"


def test_a_fault_in_a_later_span_names_that_span() -> None:
    message = request()
    block = message.resource_spans.add()
    block.scope_spans.add()
    bad = block.scope_spans.add().spans.add()
    bad.CopyFrom(message.resource_spans[0].scope_spans[0].spans[0])
    bad.kind = 12
    where = "resourceSpans[1].scopeSpans[1].spans[0]"
    assert proto_error(message) == f"-:1: {where}.kind: unknown span kind"


def test_attribute_values_a_span_cannot_hold_are_left_out_as_the_json_reader_leaves_them() -> None:
    message = request()
    span = message.resource_spans[0].scope_spans[0].spans[0]
    mixed = span.attributes.add()
    mixed.key = "mixed"
    mixed.value.array_value.values.add().string_value = "a"
    mixed.value.array_value.values.add().int_value = 1
    nested = span.attributes.add()
    nested.key = "nested"
    nested.value.array_value.values.add().array_value.values.add().int_value = 1
    same = span.attributes.add()
    same.key = "same"
    for word in ("a", "b", "c"):
        same.value.array_value.values.add().string_value = word
    empty = span.attributes.add()
    empty.key = "empty"
    (read,) = from_proto(message)
    assert dict(read.attributes or {}) == {"same": ("a", "b", "c")}


def _with_unknown_metric_field(metrics: ExportMetricsServiceRequest) -> bytes:
    metric = metrics.resource_metrics[0].scope_metrics[0].metrics[0]
    metric_bytes = metric.SerializeToString() + bytes([0x98, 0x06, 0x01])  # field 99, varint 1
    scope = bytes([0x12, len(metric_bytes)]) + metric_bytes
    resource = bytes([0x12, len(scope)]) + scope
    return bytes([0x0A, len(resource)]) + resource


def test_a_frame_is_skipped_as_metrics_only_when_it_decodes_cleanly_as_metrics() -> None:
    # Read as a trace request, the metric's name is a trace ID of the wrong size.
    assert proto_error(_with_unknown_metric_field(_metrics())) == (
        f"-:1: {SPAN_PATH}.traceId: expected 16 bytes"
    )


def _metrics() -> ExportMetricsServiceRequest:
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "calls"
    metric.gauge.data_points.add().as_int = 3
    return metrics


def test_a_broken_span_is_reported_even_when_the_frame_also_decodes_as_a_metric() -> None:
    # Without a name (field 5, which metrics use for a gauge), a span with a bad trace ID also
    # decodes as a metric request, with fields no metric has: it is a broken span, not metrics.
    message = request(trace_id=b"\x01\x02", name="")
    assert proto_error(message) == f"-:1: {SPAN_PATH}.traceId: expected 16 bytes"


def test_a_clean_metrics_frame_with_no_data_is_not_taken_for_metrics() -> None:
    metrics = _metrics()
    metrics.resource_metrics[0].scope_metrics[0].metrics[0].ClearField("gauge")
    data = bytes(metrics.SerializeToString())
    assert proto_error(data) == f"-:1: {SPAN_PATH}.traceId: expected 16 bytes"


def test_status_without_an_error_code_has_no_description() -> None:
    (ok,) = from_proto(request(status=(1, "ignored")))
    (unset,) = from_proto(request(status=(0, "ignored")))
    (error,) = from_proto(request(status=(2, "")))
    assert (ok.status.status_code, ok.status.description) == (StatusCode.OK, None)
    assert (unset.status.status_code, unset.status.description) == (StatusCode.UNSET, None)
    assert (error.status.status_code, error.status.description) == (StatusCode.ERROR, None)


@pytest.mark.parametrize(
    ("flags", "remote"),
    [(0, False), (1, False), (0x100, False), (0x101, False), (0x200, False), (0x300, True)],
)
def test_the_span_flags_say_whether_the_parent_is_remote(flags: int, remote: bool) -> None:
    # Bit 8 says whether bit 9 is known; bit 9 that the parent is in another process.
    message = request(parent_span_id=b"\x00" * 7 + b"\x01", flags=flags | 1)
    for read in (from_proto(message)[0], from_json(message)[0]):
        assert read.parent is not None and read.parent.is_remote is remote
        assert read.context is not None and read.context.is_remote is False
