"""How the OTLP/JSON reader reports unreadable files and lines: one message naming the exact
file and line, and every line before it still read."""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from otel_guard.replay.otlp_json import encode_request, parse_request
from otel_guard.replay.reader import MalformedInput, TraceReader


def request_line(name: str) -> str:
    """One OTLP/JSON request line holding a single span named ``name``."""
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def read_all(path: Path) -> tuple[list[tuple[int, str]], MalformedInput | None]:
    """The (line, span name) pairs read before the first error, and that error."""
    read: list[tuple[int, str]] = []
    try:
        for item in TraceReader([str(path)]):
            read.extend((item.line, span.name) for span in item.spans)
    except MalformedInput as error:
        return read, error
    return read, None


def gzip_cut_inside_line(lines: list[str], cut_line: int) -> bytes:
    """Gzip ``lines``, then cut the data in the middle of line ``cut_line`` (1-based).

    Each line is flushed as its own deflate block, so every line before the cut decompresses in
    full and the cut line loses its second half, newline included.
    """
    buffer = io.BytesIO()
    ends = []
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as stream:
        for line in lines:
            stream.write(f"{line}\n".encode())
            stream.flush()
            ends.append(buffer.tell())
    start = ends[cut_line - 2] if cut_line > 1 else 10  # 10: the gzip header
    return buffer.getvalue()[: start + (ends[cut_line - 1] - start) // 2]


def padded(name: str) -> str:
    # A long, barely compressible name makes the cut land well inside the line's data.
    return request_line(name + os.urandom(600).hex())


@pytest.mark.parametrize("cut_line", [1, 2, 4])
def test_truncated_gzip_file_names_the_line_cut_short(tmp_path: Path, cut_line: int) -> None:
    lines = [padded(f"span-{i}") for i in range(1, 6)]
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip_cut_inside_line(lines, cut_line))
    read, error = read_all(path)
    assert [line for line, _ in read] == list(range(1, cut_line))
    assert error is not None
    assert error.line == cut_line
    assert str(error) == f"{path}:{cut_line}: compressed data ends early (truncated gzip file)"


def test_truncated_gzip_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    lines = [padded("a"), "", "", padded("b")]
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip_cut_inside_line(lines, 4))
    read, error = read_all(path)
    assert [line for line, _ in read] == [1]
    assert error is not None and error.line == 4


def test_corrupt_gzip_data_names_the_line_it_broke_on(tmp_path: Path) -> None:
    lines = [request_line("first"), request_line("second")]
    data = bytearray(gzip.compress("\n".join(lines).encode() + b"\n", mtime=0))
    data[-8:-4] = bytes(b ^ 0xFF for b in data[-8:-4])  # the trailer's checksum
    path = tmp_path / "trace.json.gz"
    path.write_bytes(bytes(data))
    read, error = read_all(path)
    assert error is not None
    assert str(error) == f"{path}:{len(read) + 1}: corrupt gzip data"


def test_missing_file_is_named_without_a_line(tmp_path: Path) -> None:
    path = tmp_path / "absent.jsonl"
    read, error = read_all(path)
    assert read == []
    assert error is not None and error.line is None
    assert str(error) == f"{path}: cannot read (No such file or directory)"
    assert TraceReader([str(path)]).total_bytes == 0


def test_directory_is_an_unreadable_file(tmp_path: Path) -> None:
    read, error = read_all(tmp_path)
    assert read == []
    assert error is not None
    assert str(error).startswith(f"{tmp_path}: cannot read (")


def test_malformed_line_is_numbered_after_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{request_line('a')}\n\n\r\n{{not json\n{request_line('b')}\n")
    read, error = read_all(path)
    assert read == [(1, "a")]
    assert error is not None and error.line == 4
    assert str(error) == (
        f"{path}:4: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
    )


def test_characters_after_the_request_make_the_line_malformed(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{request_line('a')}XX\n")
    read, error = read_all(path)
    assert read == []
    assert error is not None and error.line == 1
    assert str(error).startswith(f"{path}:1: invalid JSON (Extra data at column ")


def test_crlf_line_ends_read_like_lf(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(f"{request_line('a')}\r\n{request_line('b')}\r\n".encode())
    read, error = read_all(path)
    assert error is None
    assert read == [(1, "a"), (2, "b")]


def test_bytes_read_reaches_the_total_only_at_the_end(tmp_path: Path) -> None:
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first.write_text(f"{request_line('a')}\n{request_line('b')}\n")
    second.write_text(f"{request_line('c')}\n")
    reader = TraceReader([str(first), str(second)])
    total = first.stat().st_size + second.stat().st_size
    assert (reader.bytes_read, reader.total_bytes) == (0, total)
    progress = [reader.bytes_read for _ in reader]
    assert len(progress) == 3
    assert progress == sorted(progress) and progress[-1] <= total
    assert reader.bytes_read == total


def test_a_written_request_reads_back(tmp_path: Path) -> None:
    (span,) = parse_request(request_line("x"))
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(encode_request([span])) + "\n")
    read, error = read_all(path)
    assert (read, error) == ([(1, "x")], None)


def test_resource_and_scope_keep_their_schema_urls_and_version(tmp_path: Path) -> None:
    request = json.loads(request_line("a"))
    (resource_spans,) = request["resourceSpans"]
    resource_spans["resource"] = {"attributes": []}
    resource_spans["schemaUrl"] = "https://opentelemetry.io/schemas/1.26.0"
    (scope_spans,) = resource_spans["scopeSpans"]
    scope_spans["scope"] = {"name": "agent", "version": "1.2.3"}
    scope_spans["schemaUrl"] = "https://opentelemetry.io/schemas/1.25.0"
    path = tmp_path / "trace.jsonl"
    other = json.loads(json.dumps(request))
    other["resourceSpans"][0]["schemaUrl"] = ""
    other["resourceSpans"][0]["scopeSpans"][0]["scope"]["version"] = "2.0"
    path.write_text("\n".join(json.dumps(r) for r in (request, request, other)) + "\n")
    spans = [span for item in TraceReader([str(path)]) for span in item.spans]
    last = spans.pop()
    assert last.resource.schema_url == ""
    assert last.instrumentation_scope is not None
    assert last.instrumentation_scope.version == "2.0"
    for span in spans:
        assert span.resource.schema_url == "https://opentelemetry.io/schemas/1.26.0"
        scope = span.instrumentation_scope
        assert scope is not None
        assert (scope.name, scope.version, scope.schema_url) == (
            "agent",
            "1.2.3",
            "https://opentelemetry.io/schemas/1.25.0",
        )
    assert spans[0].resource is spans[1].resource  # shared between lines
    assert spans[0].instrumentation_scope is spans[1].instrumentation_scope


def _request(**block: object) -> str:
    """A one-span request whose resource-spans block has ``block``'s fields replaced."""
    request = json.loads(request_line("a"))
    request["resourceSpans"][0].update(block)
    return json.dumps(request)


def _scope_request(**scope_block: object) -> str:
    request = json.loads(request_line("a"))
    request["resourceSpans"][0]["scopeSpans"][0].update(scope_block)
    return json.dumps(request)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"resource": {}}', "not a trace export request (no resourceSpans)"),
        ('{"resourceSpans": {}}', "resourceSpans: expected an array"),
        ('{"resourceSpans": [1]}', "resourceSpans[0]: expected an object"),
        (_request(resource=[]), "resourceSpans[0].resource: expected an object"),
        (
            _request(resource={"attributes": {}}),
            "resourceSpans[0].resource.attributes: expected an array",
        ),
        (_request(schemaUrl=1), "resourceSpans[0].schemaUrl: expected a string"),
        (_request(scopeSpans={}), "resourceSpans[0].scopeSpans: expected an array"),
        (_request(scopeSpans=[[]]), "resourceSpans[0].scopeSpans[0]: expected an object"),
        (_scope_request(scope=[]), "resourceSpans[0].scopeSpans[0].scope: expected an object"),
        (
            _scope_request(scope={"name": 1}),
            "resourceSpans[0].scopeSpans[0].scope.name: expected a string",
        ),
        (
            _scope_request(scope={"version": 1}),
            "resourceSpans[0].scopeSpans[0].scope.version: expected a string",
        ),
        (
            _scope_request(schemaUrl=False),
            "resourceSpans[0].scopeSpans[0].schemaUrl: expected a string",
        ),
        (_scope_request(spans={}), "resourceSpans[0].scopeSpans[0].spans: expected an array"),
        (_scope_request(spans=[1]), "resourceSpans[0].scopeSpans[0].spans[0]: expected an object"),
    ],
)
def test_request_shape_errors_name_the_path_and_what_was_expected(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(line + "\n")
    read, error = read_all(path)
    assert read == []
    assert str(error) == f"{path}:1: {message}"
    with pytest.raises(ValueError) as described:
        parse_request(line)
    assert str(described.value) == message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "invalid JSON (nested too deeply)"),
        ("[]", "request: expected an object"),
    ],
)
def test_a_request_that_is_not_an_object_is_described(line: str, message: str) -> None:
    with pytest.raises(ValueError) as described:
        parse_request(line)
    assert str(described.value) == message


def test_missing_optional_blocks_read_as_empty() -> None:
    (span,) = parse_request(_request(resource={}))
    assert dict(span.resource.attributes) == {}
    assert span.resource.schema_url == ""
    scope = span.instrumentation_scope
    assert scope is not None
    assert (scope.name, scope.version, scope.schema_url) == ("", None, "")
    assert parse_request('{"resourceSpans": [{}]}') == []
    assert parse_request(_request(scopeSpans=[{}])) == []


SPAN_PATH = "resourceSpans[0].scopeSpans[0].spans[0]"


def _span_line(**fields: object) -> str:
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "startTimeUnixNano": "5"}
    span["endTimeUnixNano"] = "6"
    span.update(fields)  # type: ignore[arg-type]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


UNSIGNED = "expected an unsigned integer (number or decimal string)"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"traceId": "x"}, ".traceId: expected 32 hex digits"),
        ({"traceId": "0" * 32}, ".traceId: an all-zero ID is invalid"),
        ({"spanId": "x"}, ".spanId: expected 16 hex digits"),
        ({"spanId": "0" * 16}, ".spanId: an all-zero ID is invalid"),
        ({"endTimeUnixNano": "x"}, f".endTimeUnixNano: {UNSIGNED}"),
        ({"endTimeUnixNano": "1" * 21}, f".endTimeUnixNano: {UNSIGNED}"),
        ({"kind": []}, ".kind: expected an integer"),
        ({"kind": True}, ".kind: expected an integer"),
        ({"status": {"code": False}}, ".status.code: expected an integer"),
        ({"flags": "x"}, f".flags: {UNSIGNED}"),
        ({"status": []}, ".status: expected an object"),
        ({"status": {"code": []}}, ".status.code: expected an integer"),
        ({"status": {"message": 1}}, ".status.message: expected a string"),
        ({"links": {}}, ".links: expected an array"),
        ({"name": 1}, ".name: expected a string"),
        (
            {"attributes": [{"key": "k", "value": {"stringValue": "a", "intValue": "1"}}]},
            ".attributes[0].value: expected exactly one value field",
        ),
        (
            {"attributes": [{"key": "k", "value": {"stringValue": 1}}]},
            ".attributes[0].value.stringValue: expected a string",
        ),
    ],
)
def test_span_shape_errors_name_the_field_and_what_was_expected(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        parse_request(_span_line(**fields))
    assert str(error.value) == SPAN_PATH + message


def test_span_defaults_when_optional_fields_are_missing() -> None:
    (span,) = parse_request(_span_line(status={"message": "ignored without an error code"}))
    assert span.status.status_code is StatusCode.UNSET
    assert span.status.description is None
    assert span.kind is SpanKind.INTERNAL
    assert span.name == ""
    (zero_parent,) = parse_request(_span_line(parentSpanId="0" * 16))
    assert zero_parent.parent is None


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs a file that fails to read")
def test_a_file_failing_on_its_first_read_is_named_with_the_error() -> None:
    # Reading the process's own memory file from offset 0 fails with an I/O error.
    read, error = read_all(Path("/proc/self/mem"))
    assert read == []
    assert error is not None and error.line is None
    assert str(error) == "/proc/self/mem: cannot read (Input/output error)"


def _attribute(value: dict[str, object], *, full_reader: bool) -> object:
    """The attribute read from a one-attribute span; a decimal-string ``flags`` is read only by
    the full reader, so it forces that path."""
    extra: dict[str, object] = {"flags": "1"} if full_reader else {}
    (span,) = parse_request(_span_line(attributes=[{"key": "k", "value": value}], **extra))
    return dict(span.attributes or {}).get("k", "left out")


@pytest.mark.parametrize("full_reader", [False, True])
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"stringValue": "s"}, "s"),
        ({"boolValue": True}, True),
        ({"boolValue": False}, False),
        ({"intValue": "12"}, 12),
        ({"intValue": -3}, -3),
        ({"doubleValue": 1}, 1.0),
        ({"doubleValue": 2.5}, 2.5),
        ({"doubleValue": "Infinity"}, math.inf),
        ({"doubleValue": "-Infinity"}, -math.inf),
        ({"arrayValue": {"values": [{"intValue": "1"}, {"intValue": 2}]}}, (1, 2)),
        ({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}, "left out"),
        ({"arrayValue": {}}, ()),
        ({"arrayValue": {"values": [{"boolValue": True}, {"boolValue": False}]}}, (True, False)),
        ({"kvlistValue": {}}, "left out"),
        ({"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}}, "left out"),
        ({"bytesValue": "AP8="}, "left out"),
        ({}, "left out"),
    ],
)
def test_any_values_read_the_same_on_both_reader_paths(
    value: dict[str, object], expected: object, full_reader: bool
) -> None:
    got = _attribute(value, full_reader=full_reader)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("full_reader", [False, True])
def test_nan_reads_as_nan_on_both_reader_paths(full_reader: bool) -> None:
    got = _attribute({"doubleValue": "NaN"}, full_reader=full_reader)
    assert isinstance(got, float) and math.isnan(got)


@pytest.mark.parametrize("full_reader", [False, True])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"boolValue": "true"}, ".boolValue: expected a boolean"),
        ({"intValue": "1.5"}, ".intValue: expected an integer (number or decimal string)"),
        ({"doubleValue": "x"}, ".doubleValue: expected a number"),
        ({"doubleValue": "nan"}, ".doubleValue: expected a number"),
        ({"stringValue": 1}, ".stringValue: expected a string"),
        ({"bytesValue": 5}, ".bytesValue: expected a string"),
        ({"arrayValue": []}, ".arrayValue: expected an object"),
        ({"arrayValue": {"values": {}}}, ".arrayValue.values: expected an array"),
        ({"arrayValue": {"values": [1]}}, ".arrayValue.values[0]: expected an object"),
        (
            {"arrayValue": {"values": [{"boolValue": 1}]}},
            ".arrayValue.values[0].boolValue: expected a boolean",
        ),
        ({"kvlistValue": []}, ".kvlistValue: expected an object"),
        (
            {"kvlistValue": {"values": [{"key": 1}]}},
            ".kvlistValue.values[0].key: expected a string",
        ),
    ],
)
def test_any_value_errors_name_the_field_on_both_reader_paths(
    value: dict[str, object], message: str, full_reader: bool
) -> None:
    with pytest.raises(ValueError) as error:
        _attribute(value, full_reader=full_reader)
    assert str(error.value) == f"{SPAN_PATH}.attributes[0].value{message}"


@pytest.mark.parametrize("full_reader", [False, True])
def test_a_status_without_a_code_is_unset_and_an_ok_status_drops_its_message_quietly(
    full_reader: bool, caplog: pytest.LogCaptureFixture
) -> None:
    extra: dict[str, object] = {"flags": "1"} if full_reader else {}
    (no_code,) = parse_request(_span_line(status={"message": "m"}, **extra))
    assert (no_code.status.status_code, no_code.status.description) == (StatusCode.UNSET, None)
    with caplog.at_level(logging.DEBUG):
        (ok,) = parse_request(_span_line(status={"code": 1, "message": "m"}, **extra))
    assert (ok.status.status_code, ok.status.description) == (StatusCode.OK, None)
    assert caplog.records == []  # the SDK warns of a description on a status not an error


@pytest.mark.parametrize("full_reader", [False, True])
@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"KEY": "k", "value": {"stringValue": "v"}}, "[0].key: expected a string"),
        ({"XXkeyXX": "k", "value": {"stringValue": "v"}}, "[0].key: expected a string"),
        *(
            ({"key": "k", "value": {field: value}}, f"[0].value: unknown value field {field!r}")
            for field, value in [
                ("stringvalue", "v"),
                ("STRINGVALUE", "v"),
                ("XXstringValueXX", "v"),
                ("boolvalue", True),
                ("BOOLVALUE", True),
                ("XXboolValueXX", True),
                ("intvalue", "5"),
                ("INTVALUE", "5"),
                ("XXintValueXX", "5"),
            ]
        ),
    ],
)
def test_misspelled_attribute_fields_are_described_on_both_reader_paths(
    entry: dict[str, object], message: str, full_reader: bool
) -> None:
    extra: dict[str, object] = {"flags": "1"} if full_reader else {}
    with pytest.raises(ValueError) as error:
        parse_request(_span_line(attributes=[entry], **extra))
    assert str(error.value) == f"{SPAN_PATH}.attributes{message}"


@pytest.mark.parametrize("full_reader", [False, True])
@pytest.mark.parametrize("field", ["VALUE", "XXvalueXX"])
def test_an_attribute_with_its_value_under_another_name_has_none_and_is_left_out(
    field: str, full_reader: bool
) -> None:
    extra: dict[str, object] = {"flags": "1"} if full_reader else {}
    entry = {"key": "k", field: {"stringValue": "v"}}
    (span,) = parse_request(_span_line(attributes=[entry], **extra))
    assert dict(span.attributes or {}) == {}


@pytest.mark.parametrize("full_reader", [False, True])
@pytest.mark.parametrize(
    ("entry", "message"),
    [(5, "[0]: expected an object"), ({"key": "k", "value": 5}, "[0].value: expected an object")],
)
def test_an_attribute_or_value_that_is_not_an_object_is_described(
    entry: object, message: str, full_reader: bool
) -> None:
    extra: dict[str, object] = {"flags": "1"} if full_reader else {}
    with pytest.raises(ValueError) as error:
        parse_request(_span_line(attributes=[entry], **extra))
    assert str(error.value) == f"{SPAN_PATH}.attributes{message}"


@pytest.mark.parametrize("field", ["startTimeUnixNano", "endTimeUnixNano"])
def test_a_time_of_more_than_20_digits_is_refused_even_when_its_value_is_small(field: str) -> None:
    # 21 digits with leading zeros: a small number, but not a uint64 as OTLP/JSON writes one.
    with pytest.raises(ValueError) as error:
        parse_request(_span_line(**{field: "0" * 20 + "5"}))
    assert str(error.value) == f"{SPAN_PATH}.{field}: {UNSIGNED}"


def test_a_parent_id_seen_in_another_trace_gets_the_trace_of_the_span_that_names_it() -> None:
    # The second trace's ID has the parent's number: a context cached for the first trace must
    # not be reused for it.
    parent = "00000000000000ab"
    first = {"traceId": "1" * 32, "spanId": "2" * 16, "parentSpanId": parent}
    second = {"traceId": "0" * 16 + parent, "spanId": "3" * 16, "parentSpanId": parent}
    spans = [{**span, "startTimeUnixNano": "5", "endTimeUnixNano": "6"} for span in (first, second)]
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    read = parse_request(line)
    assert [(s.parent.trace_id, s.parent.span_id) for s in read if s.parent] == [
        (int("1" * 32, 16), 0xAB),
        (0xAB, 0xAB),
    ]
