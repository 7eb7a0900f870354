"""OTLP trace requests in the protobuf encoding, as the Collector ``file`` exporter's ``proto``
format stores them (one ``ExportTraceServiceRequest`` per frame; see
:mod:`otel_guard.replay.trace_input` for the framing).

Decoded with the ``opentelemetry-proto`` classes and read into the same spans, with the same
checks, as the OTLP/JSON reader (:mod:`otel_guard.replay.otlp_json`); a test compares the two on the
same requests. One difference is forced by the encoding: protobuf cannot tell an absent
``flags`` field from 0, so 0 reads as the JSON reader reads an absent one (sampled).

The three export requests share their outer field numbers, so a frame of another signal also
decodes as a trace request; a frame whose spans do not hold up (IDs of the wrong size, fields of
the wrong type) is then tried as a logs and as a metrics request, and skipped as that signal
when every record of it decodes cleanly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from google.protobuf.message import (  # type: ignore[import-untyped,unused-ignore]
    DecodeError,
    Message,
)
from google.protobuf.unknown_fields import (  # type: ignore[import-untyped,unused-ignore]
    UnknownFieldSet,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_guard.replay.recorded import (
    KINDS,
    OK_STATUS,
    STATUS,
    TRACE_FLAGS,
    UNSET_STATUS,
    Attributes,
    Interner,
    OtherSignal,
    RecordedSpan,
    Shape,
    parent_context,
    span_context,
)
from otel_guard.spans import attributes as attr

__all__ = ["parse_proto_request"]

_TRACE_ID_BYTES: Final = 16
_SPAN_ID_BYTES: Final = 8


def parse_proto_request(data: bytes, interner: Interner) -> list[ReadableSpan]:
    """The spans of one protobuf ``ExportTraceServiceRequest``.

    Raises ``OtherSignal`` for a logs or metrics request and ``Shape`` for anything else that
    is not a trace request.
    """
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except DecodeError:
        fault = Shape("not a protobuf trace export request (undecodable)")
    else:
        try:
            return _request_spans(request, interner)
        except Shape as error:
            fault = error
    signal = _other_signal(data)
    if signal is not None:
        raise OtherSignal(signal)
    raise fault


def _other_signal(data: bytes) -> str | None:
    logs = ExportLogsServiceRequest()
    try:
        logs.ParseFromString(data)
    except DecodeError:
        pass
    else:
        records = [
            record
            for resource in logs.resource_logs
            for scope in resource.scope_logs
            for record in scope.log_records
        ]
        if records and _clean(records):
            return "logs"
    metrics = ExportMetricsServiceRequest()
    try:
        metrics.ParseFromString(data)
    except DecodeError:
        return None
    found = [
        metric
        for resource in metrics.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    if found and _clean(found) and all(metric.WhichOneof("data") for metric in found):
        return "metrics"
    return None


def _clean(messages: Sequence[Message]) -> bool:
    return all(len(UnknownFieldSet(message)) == 0 for message in messages)


def _request_spans(request: Any, interner: Interner) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for r, block in enumerate(request.resource_spans):
        where = f"resourceSpans[{r}]"
        resource = interner.resource(_attributes(block.resource.attributes), block.schema_url)
        for s, scope_block in enumerate(block.scope_spans):
            scope = interner.scope(
                scope_block.scope.name,
                scope_block.scope.version or None,
                scope_block.schema_url or None,
            )
            for i, span in enumerate(scope_block.spans):
                try:
                    spans.append(_span(span, resource, scope))
                except Shape as error:
                    raise error.within(f"{where}.scopeSpans[{s}].spans[{i}]") from None
    return spans


def _id(raw: bytes, size: int, path: str, *, optional: bool = False) -> int:
    if optional and not raw:
        return 0
    if len(raw) != size:
        raise Shape(f"expected {size} bytes", path)
    number = int.from_bytes(raw, "big")
    if number == 0 and not optional:
        raise Shape("an all-zero ID is invalid", path)
    return number


def _span(span: Any, resource: Any, scope: Any) -> ReadableSpan:
    trace_id = _id(span.trace_id, _TRACE_ID_BYTES, ".traceId")
    span_id = _id(span.span_id, _SPAN_ID_BYTES, ".spanId")
    parent_id = _id(span.parent_span_id, _SPAN_ID_BYTES, ".parentSpanId", optional=True)
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if end < start:
        raise Shape("endTimeUnixNano is before startTimeUnixNano")
    kind = KINDS.get(span.kind)
    if kind is None:
        raise Shape("unknown span kind", ".kind")
    code = STATUS.get(span.status.code)
    if code is None:
        raise Shape("unknown status code", ".status.code")
    status = UNSET_STATUS
    if code is StatusCode.ERROR:
        status = Status(code, span.status.message or None)
    elif code is StatusCode.OK:
        status = OK_STATUS
    flags = TRACE_FLAGS[(span.flags or 1) & 0xFF]
    read = RecordedSpan(
        span.name,
        span_context(trace_id, span_id, flags),
        parent_context(trace_id, parent_id, flags, span.flags) if parent_id else None,
        resource,
        _attributes(span.attributes),
        kind,
        status,
        start,
        end,
        scope,
    )
    if span.events:
        read._events = _exception_events(span.events)
    return read


def _exception_events(events: Any) -> tuple[Event, ...]:
    """The span's ``exception`` events with their ``exception.type`` only, as the JSON reader
    keeps them: the inferred profiles type a failed tool call by the last one when
    ``error.type`` is missing."""
    found: list[Event] = []
    for event in events:
        if event.name != attr.EXCEPTION_EVENT:
            continue
        raised = None
        for entry in event.attributes:
            if entry.key == attr.EXCEPTION_TYPE:
                raised = _value(entry.value)
        found.append(
            Event(
                attr.EXCEPTION_EVENT,
                {attr.EXCEPTION_TYPE: raised} if type(raised) is str else {},
                event.time_unix_nano or None,
            )
        )
    return tuple(found)


def _attributes(entries: Any) -> Attributes:
    """Attribute values cannot be malformed in this encoding (the schema types them); those a
    span cannot hold are left out, as the JSON reader leaves them out."""
    result = Attributes()
    for entry in entries:
        value = _value(entry.value)
        if value is not None:
            result[entry.key] = value
    return result


def _value(body: Any) -> AttributeValue | None:
    """An ``AnyValue`` as a span attribute value; ``None`` for what spans cannot hold (as the
    JSON reader: maps, bytes, mixed or nested arrays)."""
    field = body.WhichOneof("value")
    if field is None:
        return None
    if field == "string_value":
        return body.string_value  # type: ignore[no-any-return]
    if field == "bool_value":
        return body.bool_value  # type: ignore[no-any-return]
    if field == "int_value":
        return body.int_value  # type: ignore[no-any-return]
    if field == "double_value":
        return float(body.double_value)
    if field == "array_value":
        kept = [v for v in (_value(item) for item in body.array_value.values) if v is not None]
        if any(isinstance(v, tuple) for v in kept) or len({type(v) for v in kept}) > 1:
            return None
        return tuple(kept)
    return None  # kvlist_value and bytes_value are not span attribute values
