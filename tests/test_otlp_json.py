"""The OTLP/JSON reader and writer."""

from __future__ import annotations

import base64
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from otel_guard.replay import otlp_json
from otel_guard.replay.otlp_json import (
    OtlpJsonSpanExporter,
    _common_span,
    _span,
    encode_request,
    parse_request,
)
from otel_guard.replay.reader import MalformedInput, TraceReader
from otel_guard.replay.recorded import CACHE_LIMIT, Interner, Shape

_KIND_NAMES = [f"SPAN_KIND_{name}" for name in ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT")]
_KIND_NAMES += ["SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER"]

RESOURCE = Resource.create({"service.name": "agent", "service.version": "1.2.3"})


def produce() -> list[ReadableSpan]:
    """A parent and two children through a real SDK pipeline, with every attribute type."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent", "0.1")
    parent = tracer.start_span("tool_batch", kind=SpanKind.SERVER, attributes={"n": 3})
    context = set_span_in_context(parent)
    child = tracer.start_span(
        "execute_tool",
        context=context,
        attributes={
            "s": "text",
            "b": True,
            "i": -(2**62),
            "f": 1.5,
            "list": ("a", "b"),
            "ints": (1, 2),
        },
    )
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end()
    tracer.start_span("execute_tool", context=context).end()
    parent.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def summary(span: ReadableSpan) -> tuple[Any, ...]:
    context = span.context
    assert context is not None
    return (
        context.trace_id,
        context.span_id,
        None if span.parent is None else span.parent.span_id,
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        span.status.status_code,
        span.status.description,
        dict(span.resource.attributes),
        span.instrumentation_scope.name if span.instrumentation_scope else None,
    )


def one_span_line(span: Any) -> str:
    """One request line holding just ``span``, in one resource and one scope."""
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def hex_ids(document: Any) -> Any:
    """Turn the protobuf JSON mapping's base64 IDs into OTLP/JSON hex IDs."""
    if isinstance(document, dict):
        return {
            key: base64.b64decode(value).hex()
            if key in ("traceId", "spanId", "parentSpanId")
            else hex_ids(value)
            for key, value in document.items()
        }
    if isinstance(document, list):
        return [hex_ids(item) for item in document]
    return document


def test_written_lines_read_back_to_the_same_spans() -> None:
    spans = produce()
    line = json.dumps(encode_request(spans))
    assert [summary(s) for s in parse_request(line)] == [summary(s) for s in spans]


def test_written_lines_use_hex_ids_and_string_integers_like_the_collector() -> None:
    spans = produce()
    document = encode_request(spans)
    body = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert body["traceId"] == f"{spans[0].context.trace_id:032x}"  # type: ignore[union-attr]
    assert body["parentSpanId"] == f"{spans[0].parent.span_id:016x}"  # type: ignore[union-attr]
    assert body["startTimeUnixNano"] == str(spans[0].start_time)
    assert {"key": "i", "value": {"intValue": str(-(2**62))}} in body["attributes"]
    assert body["status"] == {"code": 2, "message": "boom"}


def test_the_reference_protobuf_encoding_reads_to_the_same_spans() -> None:
    spans = produce()
    reference = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    line = json.dumps(hex_ids(reference))
    assert [summary(s) for s in parse_request(line)] == [summary(s) for s in spans]


def _remote_child() -> list[ReadableSpan]:
    """A span whose parent came from another process (a propagated ``traceparent``)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1)
    )
    parent = provider.get_tracer("agent").start_span(
        "invoke_agent", context=set_span_in_context(NonRecordingSpan(remote))
    )
    provider.get_tracer("agent").start_span("chat", context=set_span_in_context(parent)).end()
    parent.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_a_remote_parent_is_read_as_remote_from_the_writer_and_the_reference_encoding() -> None:
    spans = _remote_child()
    written = json.dumps(encode_request(spans))
    reference = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for line in (
        written,
        json.dumps(hex_ids(reference)),
        json.dumps(MessageToDict(encode_spans(spans))),
    ):
        chat, agent = parse_request(line)
        assert agent.parent is not None and agent.parent.is_remote
        assert chat.parent is not None and not chat.parent.is_remote
        assert chat.parent.span_id == agent.context.span_id  # type: ignore[union-attr]
        assert not agent.context.is_remote  # type: ignore[union-attr]


def test_enum_names_and_base64_ids_of_the_generic_protobuf_json_mapping_are_read() -> None:
    spans = produce()
    document = MessageToDict(encode_spans(spans))  # enum names, base64 IDs
    body = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert body["kind"] == "SPAN_KIND_INTERNAL"
    assert body["status"] == {"code": "STATUS_CODE_ERROR", "message": "boom"}
    assert len(body["traceId"]) == 24
    assert [summary(s) for s in parse_request(json.dumps(document))] == [summary(s) for s in spans]


@pytest.mark.parametrize(
    ("span_fields", "message"),
    [
        ({"kind": "SPAN_KIND_NOPE"}, ".kind: unknown name 'SPAN_KIND_NOPE'"),
        ({"status": {"code": "ERROR"}}, ".status.code: unknown name 'ERROR'"),
        ({"spanId": "A" * 12}, ".spanId: expected the base64 of 8 bytes"),
        ({"traceId": "AAAAAAAAAAAAAAAAAAAAAA=="}, ".traceId: an all-zero ID is invalid"),
        # One padding character where two are due: neither hex nor base64 of 16 bytes.
        ({"traceId": "AQAAAAAAAAAAAAAAAAAAAA="}, ".traceId: expected 32 hex digits"),
    ],
)
def test_unknown_enum_names_and_bad_base64_ids_are_described(
    span_fields: dict[str, Any], message: str
) -> None:
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "startTimeUnixNano": "1"}
    span |= {"endTimeUnixNano": "2", **span_fields}
    with pytest.raises(ValueError) as error:
        parse_request(one_span_line(span))
    assert str(error.value) == "resourceSpans[0].scopeSpans[0].spans[0]" + message


def test_lines_of_other_signals_are_skipped_counted_and_later_spans_still_read(
    tmp_path: Path,
) -> None:
    line = json.dumps(encode_request(produce()))
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"stringValue":"x"}}]}]}]}',
                line,
                '{"resourceMetrics":[]}',
                ' { "resourceLogs": [] }',  # not in the Collector's spelling: decoded, then skipped
                '{"resourceProfiles":[]}',
                line,
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    reader = TraceReader([str(path)])
    assert [(item.line, len(item.spans)) for item in reader] == [(2, 3), (6, 3)]
    assert reader.skipped == {"logs": 2, "metrics": 1, "profiles": 1}
    assert reader.skipped_lines == 4


def test_exporter_writes_one_line_per_export(tmp_path: Path) -> None:
    spans = produce()
    path = tmp_path / "out.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        exporter = OtlpJsonSpanExporter(stream)
        exporter.export(spans[:1])
        exporter.export(spans[1:])
        exporter.export([])
        exporter.shutdown()
    lines = [line.spans for line in TraceReader([str(path)])]
    assert [len(spans_of_line) for spans_of_line in lines] == [1, 2]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"stringValue": "x"}, "x"),
        ({"intValue": "42"}, 42),
        ({"intValue": 42}, 42),
        ({"intValue": "-7"}, -7),
        ({"boolValue": False}, False),
        ({"doubleValue": 2.5}, 2.5),
        ({"doubleValue": 3}, 3.0),
        ({"arrayValue": {"values": [{"intValue": "1"}, {"intValue": 2}]}}, (1, 2)),
        ({"arrayValue": {}}, ()),
    ],
)
def test_any_values_become_span_attribute_values(value: dict[str, Any], expected: Any) -> None:
    line = one_span_line(
        {
            "traceId": "1" * 32,
            "spanId": "2" * 16,
            "startTimeUnixNano": 1,
            "endTimeUnixNano": 2,
            "attributes": [{"key": "k", "value": value}],
        }
    )
    (span,) = parse_request(line)
    assert dict(span.attributes or {}) == {"k": expected}
    assert (span.start_time, span.end_time) == (1, 2)


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"kvlistValue": {"values": [{"key": "a", "value": {"stringValue": "b"}}]}},
        {"bytesValue": "aGVsbG8="},
        {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "x"}]}},
    ],
)
def test_values_a_span_attribute_cannot_hold_are_left_out(value: dict[str, Any]) -> None:
    line = one_span_line(
        {
            "traceId": "1" * 32,
            "spanId": "2" * 16,
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "1",
            "attributes": [{"key": "k", "value": value}],
        }
    )
    (span,) = parse_request(line)
    assert dict(span.attributes or {}) == {}


@pytest.mark.parametrize(
    ("span_fields", "message"),
    [
        ({"endTimeUnixNano": "0"}, ": endTimeUnixNano is before startTimeUnixNano"),
        ({"parentSpanId": "xyz"}, ".parentSpanId: expected 16 hex digits"),
        ({"kind": 9}, ".kind: unknown span kind"),
        ({"status": {"code": 7}}, ".status.code: unknown status code"),
        ({"attributes": [{"key": 1}]}, ".attributes[0].key: expected a string"),
        (
            {"attributes": [{"key": "k", "value": {"mapValue": {}}}]},
            ".attributes[0].value: unknown value field 'mapValue'",
        ),
        (
            {"attributes": [{"key": "k", "value": {"bytesValue": "%%"}}]},
            ".attributes[0].value.bytesValue: expected base64",
        ),
        ({"startTimeUnixNano": str(2**64)}, ".startTimeUnixNano: out of range"),
        ({"events": {}}, ".events: expected an array"),
    ],
)
def test_wrong_shapes_are_described(span_fields: dict[str, Any], message: str) -> None:
    span = {
        "traceId": "1" * 32,
        "spanId": "2" * 16,
        "startTimeUnixNano": "5",
        "endTimeUnixNano": "6",
        **span_fields,
    }
    line = one_span_line(span)
    with pytest.raises(ValueError) as error:
        parse_request(line)
    assert str(error.value) == "resourceSpans[0].scopeSpans[0].spans[0]" + message


def test_an_empty_parent_id_means_a_root_span() -> None:
    span = {
        "traceId": "1" * 32,
        "spanId": "2" * 16,
        "parentSpanId": "",
        "startTimeUnixNano": "5",
        "endTimeUnixNano": "6",
    }
    (parsed,) = parse_request(one_span_line(span))
    assert parsed.parent is None


def test_gzip_is_recognised_by_content_and_lines_are_numbered_with_blanks(tmp_path: Path) -> None:
    line = json.dumps(encode_request(produce()))
    plain = tmp_path / "a.jsonl"
    plain.write_text(f"\n{line}\n\n", encoding="utf-8")
    packed = tmp_path / "b.json"  # no .gz suffix: detected by its magic bytes
    packed.write_bytes(gzip.compress(f"{line}\n".encode()))
    reader = TraceReader([str(plain), str(packed)])
    read = [(Path(item.path).name, item.line, len(item.spans)) for item in reader]
    assert read == [("a.jsonl", 2, 3), ("b.json", 1, 3)]
    assert reader.bytes_read == reader.total_bytes == plain.stat().st_size + packed.stat().st_size


def test_bad_utf8_is_a_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"resourceSpans": []}\n\xff\xfe\n')
    reader = iter(TraceReader([str(path)]))
    assert next(reader).spans == []
    with pytest.raises(MalformedInput) as error:
        next(reader)
    assert str(error.value) == f"{path}:2: not UTF-8 text"


_PRIMITIVE = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
_ATTRIBUTE = st.one_of(
    _PRIMITIVE,
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3).map(tuple),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attributes=st.dictionaries(st.text(min_size=1, max_size=10), _ATTRIBUTE, max_size=6))
def test_any_attribute_round_trips(attributes: dict[str, Any]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("s", attributes=attributes).end()
    (span,) = exporter.get_finished_spans()
    (read,) = parse_request(json.dumps(encode_request([span])))
    assert dict(read.attributes or {}) == dict(span.attributes or {})


def _outcome(line: str | bytes) -> Any:
    try:
        return [summary(span) for span in parse_request(line)]
    except ValueError as error:
        return str(error)


_SPAN_PREFIX = '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + "1" * 32 + '",'
_ODD_LINES = [
    # Lines the fast decoder declines or reads differently: the standard library decides.
    _SPAN_PREFIX + '"spanId":"' + "2" * 16 + '","startTimeUnixNano":NaN}]}]}]}',
    _SPAN_PREFIX + '"spanId":"' + "2" * 16 + '","startTimeUnixNano":' + "9" * 30 + "}]}]}]}",
    _SPAN_PREFIX + '"spanId":"' + "2" * 16 + '","startTimeUnixNano":1,"endTimeUnixNano":2,'
    '"attributes":[{"key":"d","value":{"doubleValue":Infinity}}]}]}]}]}',
    '{"resourceSpans":' + "[" * 2000 + "]" * 2000 + "}",
    b'{"resourceSpans":[],"x":"\xff"}',
    '{"resourceSpans":[],"resourceSpans":[]}',
    '{"resourceSpans":[]} trailing',
    '{"resourceSpans":[{"scopeSpans":[{"spans":[]}]}]}  \r',
    '"\ud800"',
    _SPAN_PREFIX + '"spanId":"' + "2" * 16 + '","startTimeUnixNano":1,"endTimeUnixNano":2,'
    '"attributes":[{"key":"i","value":{"intValue":' + "9" * 24 + "}}]}]}]}]}",
]


@pytest.mark.skipif(otlp_json._loads_fast is None, reason="the fast extra is not installed")
@pytest.mark.parametrize("line", _ODD_LINES)
def test_the_fast_decoder_reads_every_line_as_the_standard_library_does(
    line: str | bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _outcome(line)
    monkeypatch.setattr(otlp_json, "_loads_fast", None)
    assert fast == _outcome(line)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found.extend(_paths(value, (*prefix, index)))
    return found


_VALID = encode_request(produce())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=_JSON)
def test_any_corrupted_request_is_read_or_described_never_crashes(
    data: st.DataObject, replacement: Any
) -> None:
    document = json.loads(json.dumps(_VALID))
    path = data.draw(st.sampled_from(_paths(document)))
    if not path:
        document = replacement
    else:
        target = document
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = replacement
    try:
        spans = parse_request(json.dumps(document))
    except ValueError as error:
        assert "\n" not in str(error) and str(error)
    else:
        assert all(isinstance(span, ReadableSpan) for span in spans)


_HUGE = st.one_of(  # integers beyond 64 bits, which the fast decoder reads as floats
    st.integers(min_value=2**63, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-(2**63)),
)


@pytest.mark.skipif(otlp_json._loads_fast is None, reason="the fast extra is not installed")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=st.one_of(_JSON, _HUGE, st.lists(_HUGE, max_size=2)))
def test_the_fast_decoder_reads_any_corrupted_request_as_the_standard_library_does(
    data: st.DataObject, replacement: Any
) -> None:
    document = json.loads(json.dumps(_VALID))
    path = data.draw(st.sampled_from(_paths(document)))
    if not path:
        document = replacement
    else:
        target = document
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = replacement
    line = json.dumps(document)
    fast = _outcome(line)
    loads_fast = otlp_json._loads_fast
    try:
        otlp_json._loads_fast = None  # type: ignore[misc]
        assert fast == _outcome(line)
    finally:
        otlp_json._loads_fast = loads_fast  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("startTimeUnixNano", "9" * 5000, ".startTimeUnixNano: expected an unsigned integer"),
        ("attributes", [{"key": "k", "value": {"intValue": "9" * 5000}}], ".intValue: expected"),
    ],
)
def test_numbers_too_long_to_convert_are_described(field: str, value: Any, message: str) -> None:
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "startTimeUnixNano": 1, "endTimeUnixNano": 2}
    span[field] = value
    with pytest.raises(ValueError, match=message):
        parse_request(one_span_line(span))
    with pytest.raises(ValueError, match=r"^invalid JSON \(a value out of range\)$"):
        parse_request('{"resourceSpans": [' + "9" * 5000 + "]}")


def test_decoded_spans_set_every_field_a_readable_span_sets() -> None:
    line = json.dumps(encode_request(produce()))
    reference = set(vars(ReadableSpan("s")))
    for span in parse_request(line):
        assert isinstance(span, ReadableSpan)
        assert set(vars(span)) == reference
        assert (span.events, span.links, span.dropped_attributes) == ((), (), 0)
        assert span._instrumentation_info is None  # as the SDK leaves it beside a scope


# -- the fast reader and the full reader agree ---------------------------------------------------

_TRACE_IDS = (
    "1" * 32,
    "ab" * 16,
    "AB" * 16,
    base64.b64encode(bytes.fromhex("ab" * 16)).decode(),  # the same ID in base64
    base64.urlsafe_b64encode(bytes.fromhex("fe" * 16)).decode().rstrip("="),
)
_SPAN_IDS = (
    "1" * 16,
    "2" * 16,
    "cd" * 8,
    "CD" * 8,
    base64.b64encode(bytes.fromhex("cd" * 8)).decode(),
    base64.urlsafe_b64encode(bytes.fromhex("ff" * 8)).decode().rstrip("="),
)
_BAD_IDS = (
    *("", "0" * 16, "0" * 32, "1" * 15, "1" * 33, "g" * 16, "\uff11" * 16, 1, None, True),
    *("AAAAAAAAAAA=", "AAAAAAAAAAAAAAAAAAAAAA==", "A" * 12, "!" * 12, "AAAAAAAAAAA", "\uff21" * 12),
)
_VALID_TIMES = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1).map(str),
)
_ODD_TIMES = ["", "-1", "+1", " 1", "1_0", "1e3", "١٢", "²", str(2**64), "9" * 21, 1.5, -1, True]
_COMMON_VALUES = st.one_of(
    st.text(max_size=4).map(lambda t: {"stringValue": t}),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda i: {"intValue": str(i)}),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(lambda i: {"intValue": i}),
    st.booleans().map(lambda b: {"boolValue": b}),
)
_ODD_VALUES = [
    {},
    {"stringValue": 1},
    {"intValue": "1.0"},
    {"intValue": " 7"},
    {"intValue": "٣"},
    {"intValue": "9" * 30},
    {"intValue": True},
    {"intValue": 2**70},
    {"boolValue": 1},
    {"doubleValue": 1.5},
    {"doubleValue": "NaN"},
    {"doubleValue": "1.5"},
    {"arrayValue": {"values": [{"intValue": "1"}]}},
    {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}},
    {"kvlistValue": {"values": []}},
    {"bytesValue": "aGk="},
    {"bytesValue": "%"},
    {"stringValue": "a", "intValue": "1"},
    {"mapValue": {}},
    [],
    None,
]
_ODD_ATTRIBUTES = [
    *({"key": "k", "value": value} for value in _ODD_VALUES),
    {"key": 1, "value": {"stringValue": "v"}},
    {"key": "k"},
    {"value": {"stringValue": "v"}},
    {"key": "k", "value": {"stringValue": "v"}, "extra": 1},
    ["k", "v"],
    "k",
    None,
]
_COMMON_ATTRIBUTE = st.builds(
    lambda key, value: {"key": key, "value": value}, st.text(max_size=4), _COMMON_VALUES
)
_ODD_ATTRIBUTE = st.one_of(
    st.sampled_from(_ODD_ATTRIBUTES),
    st.builds(lambda key, value: {"key": key, "value": value}, st.text(max_size=4), _JSON),
)


@st.composite
def _common_span_body(draw: st.DrawFn) -> dict[str, Any]:
    """A span as the Collector writes it: the shapes the fast reader is for."""
    start = draw(_VALID_TIMES)
    end = draw(_VALID_TIMES.filter(lambda e: int(e) >= int(start)))
    body: dict[str, Any] = {
        "traceId": draw(st.sampled_from(_TRACE_IDS)),
        "spanId": draw(st.sampled_from(_SPAN_IDS)),
        "name": draw(st.text(max_size=4)),
        "kind": draw(
            st.one_of(st.integers(min_value=0, max_value=5), st.sampled_from(_KIND_NAMES))
        ),
        "startTimeUnixNano": start,
        "endTimeUnixNano": end,
        "attributes": draw(st.lists(_COMMON_ATTRIBUTE, max_size=4)),
        "status": draw(
            st.sampled_from(
                [
                    *({}, {"code": 0}, {"code": 1}, {"code": 2}, {"code": 2, "message": "m"}),
                    *({"code": "STATUS_CODE_OK"}, {"code": "STATUS_CODE_ERROR", "message": "m"}),
                    {"code": "STATUS_CODE_UNSET"},
                ]
            )
        ),
    }
    parent = draw(st.sampled_from(["", None, *_SPAN_IDS]))
    if parent is not None:
        body["parentSpanId"] = parent
    if draw(st.booleans()):
        body["flags"] = draw(st.integers(min_value=0, max_value=2**64 - 1))
    return body


# Values of each field that are malformed, or valid but not the common shape.
_ODD_FIELDS: dict[str, list[Any]] = {
    "traceId": list(_BAD_IDS),
    "spanId": list(_BAD_IDS),
    "parentSpanId": list(_BAD_IDS),
    "flags": [-1, 2**64, True, "1", 1.0, None],
    "startTimeUnixNano": [*_ODD_TIMES, 2**64, 7, 2**64 - 1],
    "endTimeUnixNano": [*_ODD_TIMES, 2**64, 0, "4"],
    "kind": [-1, 6, True, "1", 1.0, None, "SPAN_KIND_NOPE", "span_kind_server"],
    "status": [
        *([], None, {"code": 3}, {"code": True}, {"code": "2"}, {"code": 2, "message": 1}),
        *({"code": "STATUS_CODE_NOPE"}, {"code": "ERROR"}),
    ],
    "events": [[], [{}], {}, None],
    "links": [[], {}, "x"],
    "name": [1, None, []],
    "attributes": [{}, None, "x", *([attribute] for attribute in _ODD_ATTRIBUTES)],
}
_ODD_FIELD_STRATEGIES = {
    **{field: st.sampled_from(values) for field, values in _ODD_FIELDS.items()},
    "attributes": st.one_of(
        st.sampled_from(_ODD_FIELDS["attributes"]),
        st.lists(st.one_of(_COMMON_ATTRIBUTE, _ODD_ATTRIBUTE), min_size=1, max_size=3),
    ),
}


@st.composite
def _any_span_body(draw: st.DrawFn) -> Any:
    """A common span with some fields replaced by odd (valid or malformed) values, or removed."""
    body = draw(_common_span_body())
    # Mostly one odd field, so that the rest of the span is what decides; the attributes, where
    # most of the checking is, more often than the others.
    count = draw(st.sampled_from([1, 1, 1, 2, 3]))
    fields = st.sampled_from([*sorted(_ODD_FIELDS), *["attributes"] * 6])
    for field in draw(st.lists(fields, min_size=count, max_size=count, unique=True)):
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            body.pop(field, None)
        else:
            body[field] = draw(_ODD_FIELD_STRATEGIES[field])
    return (
        draw(st.one_of(st.just(body), st.sampled_from([[], None, "span"])))
        if draw(st.integers(min_value=0, max_value=20)) == 0
        else body
    )


def _fields(span: ReadableSpan) -> tuple[Any, ...]:
    """Everything a span read from a file holds; attribute values by type and ``repr`` (NaN)."""
    return (
        type(span),
        tuple(span.context) if span.context else None,
        tuple(span.parent) if span.parent else None,
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        type(span._attributes),
        [(key, type(value), repr(value)) for key, value in (span.attributes or {}).items()],
        span.status.status_code,
        span.status.description,
        span.resource,
        span.instrumentation_scope,
        span.events,
        span.links,
    )


_RESOURCE = Resource({"service.name": "agent"})
_SCOPE = InstrumentationScope("agent")


def _read_both(bodies: list[Any]) -> tuple[list[Any], list[Any]]:
    """Each body as the fast reader reads it (sharing one line's ID cache) and as the full reader
    reads it; ``None`` where one declines (fast) or rejects (full) it."""
    contexts: Any = ({}, {})
    fast = [_common_span(body, _RESOURCE, _SCOPE, contexts) for body in bodies]
    full: list[Any] = []
    for body in bodies:
        try:
            full.append(_span(body, _RESOURCE, _SCOPE))
        except Shape:
            full.append(None)
    return fast, full


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_common_span_body(), min_size=1, max_size=6))
def test_the_fast_reader_reads_common_spans_as_the_full_reader_does(
    bodies: list[dict[str, Any]],
) -> None:
    fast, full = _read_both(bodies)
    assert None not in fast
    assert [_fields(span) for span in fast] == [_fields(span) for span in full]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_any_span_body(), min_size=1, max_size=6))
def test_the_fast_reader_never_accepts_what_the_full_reader_reads_otherwise(
    bodies: list[Any],
) -> None:
    fast, full = _read_both(bodies)
    for fast_span, full_span in zip(fast, full, strict=True):
        if fast_span is not None:
            assert full_span is not None
            assert _fields(fast_span) == _fields(full_span)


_PLAIN_SPAN = {
    "traceId": "ab" * 16,
    "spanId": "cd" * 8,
    "parentSpanId": "12" * 8,
    "name": "s",
    "kind": 1,
    "startTimeUnixNano": "5",
    "endTimeUnixNano": "6",
    "attributes": [{"key": "a", "value": {"stringValue": "b"}}],
    "status": {},
}


_LEFT_OUT = object()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *((field, value) for field, values in _ODD_FIELDS.items() for value in values),
        *((field, _LEFT_OUT) for field in _PLAIN_SPAN),
    ],
)
def test_the_fast_reader_declines_or_agrees_on_every_odd_field(field: str, value: Any) -> None:
    body = dict(_PLAIN_SPAN)
    if value is _LEFT_OUT:
        del body[field]
    else:
        body[field] = value
    (fast,), (full,) = _read_both([body])
    assert fast is None or (full is not None and _fields(fast) == _fields(full))


# -- routing: a reader that builds only the traces its process replays -----------------------


class _Shard:
    """A router (otel_guard.replay.otlp_json.Router) that owns the prompts whose key starts with
    ``mine`` and knows the owners of the traces in ``known`` already."""

    def __init__(self, known: dict[int, bool]) -> None:
        self.known = known
        self.decided: dict[int, bool] = {}

    def owner_of(self, trace_id: int) -> bool | None:
        return self.known.get(trace_id)

    def owns_key(self, key: str) -> bool:
        return key.startswith("mine")

    def decide(self, trace_id: int, owned: bool) -> None:
        self.decided[trace_id] = owned


_PROMPT, _OPERATION, _CONVERSATION = (
    "acp.prompt.id",
    "gen_ai.operation.name",
    "gen_ai.conversation.id",
)


def _routed_span(trace: int, span: int, parent: int | None, *attributes: Any) -> dict[str, Any]:
    """A span body; ``attributes`` are (key, value) pairs (a str value is a stringValue) or,
    raw, entries as the line holds them."""
    body: dict[str, Any] = {
        "traceId": f"{trace:032x}",
        "spanId": f"{span:016x}",
        "name": f"s{span}",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
    }
    if parent is not None:
        body["parentSpanId"] = "" if parent == 0 else f"{parent:016x}"
    if attributes:
        body["attributes"] = [
            {"key": a[0], "value": {"stringValue": a[1]} if isinstance(a[1], str) else a[1]}
            if isinstance(a, tuple)
            else a
            for a in attributes
        ]
    return body


def _routed_line(*scopes: list[dict[str, Any]]) -> bytes:
    """One request: the first scope in a resource of its own, the others in a second one."""
    blocks = [{"scopeSpans": [{"spans": scopes[0]}]}]
    if len(scopes) > 1:
        blocks.append({"scopeSpans": [{"spans": spans} for spans in scopes[1:]]})
    return json.dumps({"resourceSpans": blocks}).encode() + b"\n"


def test_a_router_decides_each_trace_by_its_owner_or_its_first_prompt_key() -> None:
    theirs_by_agent = [(_OPERATION, "invoke_agent"), (_CONVERSATION, "theirs-5")]
    line = _routed_line(
        [
            _routed_span(1, 11, None),  # 1: known to be another process's; a root
            _routed_span(2, 21, None, (_PROMPT, "theirs-2")),  # 2: known ours; its key unread
            _routed_span(3, 31, 32),  # 3: undecided until its second span names a prompt
            _routed_span(4, 41, 42),  # 4: the same, of a prompt another process replays
            _routed_span(1, 12, 11),  # a child of 1
            _routed_span(3, 32, 0, (_PROMPT, "mine-3")),  # a root with an empty parent ID
            _routed_span(4, 42, None, (_PROMPT, "theirs-4")),
            _routed_span(3, 33, 32, (_PROMPT, "theirs-3")),  # 3 is decided by its first key
        ],
        [
            _routed_span(5, 51, None, *theirs_by_agent),  # an agent's conversation is its key
            _routed_span(6, 61, None, (_OPERATION, "chat"), (_CONVERSATION, "theirs-6")),
            _routed_span(1, 13, 11, (_PROMPT, "mine-1")),
        ],
        [
            # A prompt ID that is not a string names no prompt: the conversation does.
            _routed_span(7, 71, None, (_PROMPT, {"stringValue": 7}), *theirs_by_agent),
            # The prompt ID comes before an agent's conversation.
            _routed_span(8, 81, None, (_PROMPT, "mine-8"), *theirs_by_agent),
            # Entries that are not well formed are passed over (the trace is not built here).
            _routed_span(9, 91, None, 5, {"key": _PROMPT, "value": "x"}, (_PROMPT, "theirs-9")),
            _routed_span(10, 101, None, (_OPERATION, "invoke_agent")),  # no conversation
        ],
    )
    expected = [
        1,  # a root of another process's trace: its trace ID
        "s21",
        "s31",
        None,  # a child of another process's trace: a place only
        None,
        "s32",
        4,
        "s33",
        5,
        "s61",
        None,
        7,
        "s81",
        9,
        "s101",
    ]
    router = _Shard({1: False, 2: True})
    (read,) = TraceReader(["-"], stdin=io.BytesIO(line), router=router)
    assert [s.name if isinstance(s, ReadableSpan) else s for s in read.spans] == expected
    assert router.decided == {3: True, 4: False, 5: False, 7: False, 8: True, 9: False}
    # A bare NaN: a line the fast decoder declines, read by the standard library's, routed alike.
    odd = line.replace(b'{"resourceSpans"', b'{"padding": NaN, "resourceSpans"', 1)
    router = _Shard({1: False, 2: True})
    (read,) = TraceReader(["-"], stdin=io.BytesIO(odd), router=router)
    assert [s.name if isinstance(s, ReadableSpan) else s for s in read.spans] == expected
    assert router.decided == {3: True, 4: False, 5: False, 7: False, 8: True, 9: False}


@pytest.mark.parametrize(
    "line",
    [
        {"resourceSpans": None},
        {"resourceSpans": [5]},
        {"resourceSpans": [{"scopeSpans": None}]},
        {"resourceSpans": [{"scopeSpans": [5]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": None}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [_routed_span(1, 11, None), 5]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [_routed_span(1, 11, None), {}]}]}]},
        {
            "resourceSpans": [
                {"scopeSpans": [{"spans": [_routed_span(1, 11, None), {"traceId": []}]}]}
            ]
        },
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {"spans": [{**_routed_span(3, 31, None), "traceId": "zz"}]},
                    ]
                }
            ]
        },
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                _routed_span(3, 31, None, (_PROMPT, "theirs-3")),
                                {**_routed_span(3, 32, None), "traceId": "zz"},
                            ]
                        },
                    ]
                }
            ]
        },
    ],
)
def test_a_line_a_router_cannot_read_is_described_as_without_one(line: dict[str, Any]) -> None:
    data = json.dumps(line).encode() + b"\n"
    with pytest.raises(MalformedInput) as plain:
        list(TraceReader(["-"], stdin=io.BytesIO(data)))
    router = _Shard({1: False})
    with pytest.raises(MalformedInput) as routed:
        list(TraceReader(["-"], stdin=io.BytesIO(data), router=router))
    assert str(routed.value) == str(plain.value)
    assert router.decided == {}  # a line that did not decode whole decides nothing


# -- exception events -------------------------------------------------------------------------


def test_exception_events_are_read_with_their_type_and_time_only() -> None:
    def exception(**fields: Any) -> dict[str, Any]:
        return {"name": "exception", **fields}

    def typed(value: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"key": "exception.message", "value": {"stringValue": "no such file"}},
            {"key": "exception.type", "value": value},
        ]

    events = [
        exception(timeUnixNano="5", attributes=typed({"stringValue": "FileNotFoundError"})),
        {"name": "log", "timeUnixNano": "6"},  # not an exception: left out
        5,  # not an object: left out
        exception(timeUnixNano="7"),  # no attributes: no type
        exception(timeUnixNano="8", attributes=typed({"intValue": "3"})),  # not a type name
        exception(timeUnixNano="9", attributes=[5]),  # attributes not well formed: left out
        exception(timeUnixNano="x1"),  # a time that is not a decimal string: none
        exception(timeUnixNano=11),
        exception(),
    ]
    span = {**_routed_span(1, 11, None), "events": events}
    uncommon = {**span, "flags": "1"}  # read by the full reader
    for body in (span, uncommon):
        (read,) = parse_request(one_span_line(body))
        found = [(e.name, dict(e.attributes or {}), e.timestamp) for e in read.events]
        assert [(name, attributes) for name, attributes, _ in found] == [
            ("exception", {"exception.type": "FileNotFoundError"}),
            ("exception", {}),
            ("exception", {}),
            ("exception", {}),
            ("exception", {}),
            ("exception", {}),
        ]
        assert [time for _, _, time in found[:3]] == [5, 7, 8]
        assert all(time not in (None, 1, 11) for _, _, time in found[3:])  # no time read


def test_a_span_without_events_has_none() -> None:
    (read,) = parse_request(one_span_line(_routed_span(1, 11, None)))
    assert read.events == ()


def test_a_span_read_by_the_full_reader_keeps_its_resource_and_scope() -> None:
    span = {**_routed_span(1, 11, None), "flags": "1"}  # a string: the full reader reads it
    line = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "a"}}]
                },
                "scopeSpans": [{"scope": {"name": "tools", "version": "2"}, "spans": [span]}],
            }
        ]
    }
    (read,) = parse_request(json.dumps(line))
    assert dict(read.resource.attributes) == {"service.name": "a"}
    assert read.instrumentation_scope == InstrumentationScope("tools", "2")


# -- the reader's entry points ---------------------------------------------------------------


@pytest.mark.skipif(otlp_json._loads_fast is None, reason="the fast extra is not installed")
def test_the_fast_decoder_is_orjsons_when_the_fast_extra_is_installed() -> None:
    import orjson

    assert otlp_json._load_fast() is orjson.loads


def test_a_text_line_that_cannot_be_utf8_is_described_not_raised_by_the_codec() -> None:
    with pytest.raises(ValueError) as error:
        parse_request('{"resourceSpans": [], "x": "\ud800"}')
    assert type(error.value) is ValueError
    assert str(error.value) == "not UTF-8 text"


def test_a_line_of_another_signal_is_not_a_trace_request() -> None:
    with pytest.raises(ValueError) as error:
        parse_request('{"resourceMetrics": []}')
    assert str(error.value) == "not a trace export request (metrics)"


def test_the_reader_names_the_source_it_reads_and_stops_where_told(tmp_path: Path) -> None:
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    line = json.dumps(encode_request(produce()))
    first.write_text(f"{line}\n{line}\n", encoding="utf-8")
    second.write_text(f"{line}\n\n{line}\nnot json\n", encoding="utf-8")
    reader = TraceReader([str(first), str(second)], stop=(1, 4))
    assert reader.source_index == 0
    read = [(reader.source_index, item.line, reader.bytes_read) for item in reader]
    size = first.stat().st_size
    # A file smaller than a chunk is read whole at its first line; line 4 is not even decoded.
    assert read == [
        (0, 1, size),
        (0, 2, size),
        (1, 1, reader.total_bytes),
        (1, 3, reader.total_bytes),
    ]


def test_the_reader_holds_its_sources_to_its_record_limit() -> None:
    line = json.dumps(encode_request(produce())).encode()
    reader = TraceReader(["-"], stdin=io.BytesIO(line + b"\n"), max_record_bytes=len(line) - 1)
    with pytest.raises(MalformedInput) as error:
        list(reader)
    assert str(error.value).startswith(f"-:1: line longer than {len(line) - 1:,} bytes")


def test_equal_resources_and_scopes_are_shared_up_to_the_limit_then_afresh() -> None:
    interner = Interner()
    limit = CACHE_LIMIT
    resource = interner.resource({"n": 0}, "")
    scope = interner.scope("s0", None, None)
    for n in range(1, limit):
        interner.resource({"n": n}, "")
        interner.scope(f"s{n}", None, None)
    assert interner.resource({"n": 0}, "") is resource  # the table holds the limit
    assert interner.scope("s0", None, None) is scope
    assert interner.resource({"n": 0}, "https://schema") is not resource
    interner = Interner()
    resource = interner.resource({"n": 0}, "")
    scope = interner.scope("s0", None, None)
    for n in range(1, limit + 1):  # one more than the table holds: it starts afresh
        interner.resource({"n": n}, "")
        interner.scope(f"s{n}", None, None)
    assert interner.resource({"n": 0}, "") is not resource
    assert interner.scope("s0", None, None) is not scope


@pytest.mark.parametrize("padding", [b"", b'"padding": NaN, '])  # NaN: the fast decoder declines
def test_a_well_formed_line_is_routed_by_either_decoder(padding: bytes) -> None:
    spans = [
        _routed_span(1, 11, None),
        _routed_span(3, 31, 0, (_PROMPT, "theirs-3")),  # a root with an empty parent ID
        _routed_span(3, 32, 31),
        _routed_span(4, 41, None, (_PROMPT, "mine-4")),
    ]
    line = (
        b"{"
        + padding
        + json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()[1:]
    )
    router = _Shard({1: False})
    (read,) = TraceReader(["-"], stdin=io.BytesIO(line), router=router)
    assert [s.name if isinstance(s, ReadableSpan) else s for s in read.spans] == [1, 3, None, "s41"]
    assert router.decided == {3: False, 4: True}


def test_a_span_id_repeated_in_another_trace_gets_that_traces_context() -> None:
    # The second trace's ID equals the span ID as a number: no context is shared by mistake.
    first = {**_routed_span(0xAB, 0xFF, None), "spanId": "00000000000000ff"}
    second = {**_routed_span(0xFF, 0xFF, None), "spanId": "00000000000000ff"}
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [first, second]}]}]})
    assert [(s.context.trace_id, s.context.span_id) for s in parse_request(line)] == [  # type: ignore[union-attr]
        (0xAB, 0xFF),
        (0xFF, 0xFF),
    ]
