"""The OTLP/JSON writer: what it encodes, as the reader reads it back, and the exporter's lines."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otel_guard.replay.otlp_json import OtlpJsonSpanExporter, encode_request, parse_request


def span(span_id: int, **fields: Any) -> ReadableSpan:
    context = SpanContext(0xABC, span_id, is_remote=False, trace_flags=TraceFlags(1))
    fields.setdefault("start_time", 10)
    fields.setdefault("end_time", 20)
    return ReadableSpan(name=f"s{span_id}", context=context, **fields)


def round_trip(*spans: ReadableSpan) -> list[ReadableSpan]:
    return parse_request(json.dumps(encode_request(spans)))


def test_special_floats_bytes_and_other_values_are_encoded_as_the_collector_does() -> None:
    attributes = {
        "nan": math.nan,
        "inf": math.inf,
        "ninf": -math.inf,
        "bytes": b"\x00\xff",
        "text": "t",
    }
    values = {
        entry["key"]: entry["value"]
        for entry in encode_request([span(1, attributes=attributes)])["resourceSpans"][0][
            "scopeSpans"
        ][0]["spans"][0]["attributes"]
    }
    assert values == {
        "nan": {"doubleValue": "NaN"},
        "inf": {"doubleValue": "Infinity"},
        "ninf": {"doubleValue": "-Infinity"},
        "bytes": {"bytesValue": "AP8="},
        "text": {"stringValue": "t"},
    }
    (read,) = round_trip(span(1, attributes=attributes))
    got = dict(read.attributes or {})
    assert math.isnan(got["nan"]) and got["inf"] == math.inf and got["ninf"] == -math.inf
    assert "bytes" not in got  # not a value a span attribute can hold


def test_a_value_of_another_type_is_written_as_its_text() -> None:
    request = encode_request([span(1, attributes={"odd": 1j})])
    assert request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] == [
        {"key": "odd", "value": {"stringValue": "1j"}}
    ]


@pytest.mark.parametrize(
    ("kind", "number"),
    [(SpanKind.INTERNAL, 1), (SpanKind.SERVER, 2), (SpanKind.CLIENT, 3)],
)
def test_kinds_flags_and_times_are_written(kind: SpanKind, number: int) -> None:
    body = encode_request([span(1, kind=kind)])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    # The sampled trace flag, and bit 8: whether the parent is remote is known (it is not).
    assert (body["kind"], body["flags"]) == (number, 0x101)
    assert (body["startTimeUnixNano"], body["endTimeUnixNano"]) == ("10", "20")


def test_missing_times_are_written_as_zero_and_an_open_span_ends_at_its_start() -> None:
    bodies = [
        encode_request([s])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        for s in (span(1, start_time=None, end_time=None), span(2, end_time=None))
    ]
    assert [(b["startTimeUnixNano"], b["endTimeUnixNano"]) for b in bodies] == [
        ("0", "0"),
        ("10", "10"),
    ]


def test_a_span_without_a_context_cannot_be_encoded() -> None:
    with pytest.raises(ValueError) as error:
        encode_request([ReadableSpan(name="x")])
    assert str(error.value) == "a span without a context cannot be encoded"


def test_spans_are_grouped_by_resource_and_scope_with_schema_urls_and_versions() -> None:
    first = Resource({"service.name": "a"}, "https://opentelemetry.io/schemas/1.26.0")
    second = Resource({"service.name": "b"})
    scope = InstrumentationScope("agent", "1.0", "https://opentelemetry.io/schemas/1.25.0")
    other_scope = InstrumentationScope("tools")
    spans = [
        span(1, resource=first, instrumentation_scope=scope),
        span(2, resource=first, instrumentation_scope=other_scope),
        span(3, resource=second, instrumentation_scope=scope),
        span(4, resource=first, instrumentation_scope=scope),
        span(5, resource=first),
    ]
    request = encode_request(spans)
    layout = [
        (
            entry.get("schemaUrl"),
            [
                (
                    block["scope"],
                    block.get("schemaUrl"),
                    [s["name"] for s in block["spans"]],
                )
                for block in entry["scopeSpans"]
            ],
        )
        for entry in request["resourceSpans"]
    ]
    assert layout == [
        (
            "https://opentelemetry.io/schemas/1.26.0",
            [
                (
                    {"name": "agent", "version": "1.0"},
                    "https://opentelemetry.io/schemas/1.25.0",
                    ["s1", "s4"],
                ),
                ({"name": "tools"}, None, ["s2"]),
                ({}, None, ["s5"]),
            ],
        ),
        (
            None,
            [
                (
                    {"name": "agent", "version": "1.0"},
                    "https://opentelemetry.io/schemas/1.25.0",
                    ["s3"],
                )
            ],
        ),
    ]


def test_exporter_writes_compact_lines_and_nothing_after_shutdown() -> None:
    stream = io.StringIO()
    exporter = OtlpJsonSpanExporter(stream)
    assert exporter.export([span(1, attributes={"k": "v"})]) is SpanExportResult.SUCCESS
    line = stream.getvalue()
    assert line.endswith("}\n") and line.count("\n") == 1
    assert ", " not in line and '": ' not in line
    exporter.shutdown()
    assert exporter.export([span(2)]) is SpanExportResult.FAILURE
    assert stream.getvalue() == line


def test_events_are_written_with_their_time_name_and_attributes_and_read_back() -> None:
    events = [
        Event("exception", {"exception.type": "OSError", "exception.message": "m"}, 5),
        Event("retry", {}, 0),
    ]
    body = encode_request([span(1, events=events)])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert body["events"] == [
        {
            "timeUnixNano": "5",
            "name": "exception",
            "attributes": [
                {"key": "exception.type", "value": {"stringValue": "OSError"}},
                {"key": "exception.message", "value": {"stringValue": "m"}},
            ],
        },
        {"timeUnixNano": "0", "name": "retry", "attributes": []},
    ]
    (read,) = round_trip(span(1, events=events))
    assert [(e.name, dict(e.attributes or {}), e.timestamp) for e in read.events] == [
        ("exception", {"exception.type": "OSError"}, 5)
    ]


def test_a_span_of_no_known_kind_is_written_as_internal() -> None:
    odd = span(1, kind=None)
    body = encode_request([odd])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert body["kind"] == 1


def test_exporter_flushes_its_stream_and_reports_a_stream_that_cannot_be(tmp_path: Path) -> None:
    with (tmp_path / "spans.jsonl").open("w", encoding="utf-8") as stream:
        exporter = OtlpJsonSpanExporter(stream)
        assert exporter.export([span(1)]) is SpanExportResult.SUCCESS
        assert exporter.force_flush() is True
        assert (tmp_path / "spans.jsonl").read_text(encoding="utf-8").count("\n") == 1
    assert exporter.force_flush() is False  # closed
    assert exporter.export([span(2)]) is SpanExportResult.FAILURE
