"""Trace input as operators have it: standard input, gzip, zstd, JSON lines, frames, bounds."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from test_otlp_json import _ATTRIBUTE, RESOURCE, produce, summary

from otel_guard.replay import trace_input
from otel_guard.replay.otlp_json import MalformedInput, OtlpJsonReader, encode_request
from otel_guard.replay.trace_input import Record, Source

zstd = trace_input._zstd_module()
needs_zstd = pytest.mark.skipif(zstd is None, reason="the zstd extra is not installed")


def request_line() -> bytes:
    return json.dumps(encode_request(produce())).encode()


def records(data: bytes, **options: Any) -> list[Record]:
    return list(Source("-", stdin=io.BytesIO(data), **options).records())


def framed(*payloads: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def logs_request() -> bytes:
    request = ExportLogsServiceRequest()
    record = request.resource_logs.add().scope_logs.add().log_records.add()
    record.time_unix_nano = 1_700_000_000_000_000_000
    record.severity_number = 9
    record.body.string_value = "a log line"
    return bytes(request.SerializeToString())


def metrics_request() -> bytes:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "calls"
    metric.gauge.data_points.add().as_int = 3
    return bytes(request.SerializeToString())


# -- lines ------------------------------------------------------------------------------------


_LINE = st.one_of(
    st.just(b""),
    st.sampled_from([b" ", b"\t", b"\r", b"  \r"]),
    st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")),
)


@settings(max_examples=200)
@given(lines=st.lists(_LINE, max_size=12), chunk=st.integers(min_value=1, max_value=9))
def test_lines_are_numbered_as_a_plain_split_numbers_them(lines: list[bytes], chunk: int) -> None:
    data = b"\n" + b"\n".join(lines)  # a blank first line: JSON lines, whatever follows
    expected = [
        (number, line.lstrip(b" \t\r\x0b\x0c"))
        for number, line in enumerate(data.split(b"\n"), start=1)
        if line.strip()
    ]
    read = [(r.number, r.data) for r in records(data, chunk_bytes=chunk)]
    # A line keeps its trailing blanks (a JSON reader ignores them) and loses its leading ones.
    assert read == expected


def test_a_gzip_bomb_of_blank_lines_is_read_in_chunks_and_its_lines_still_counted() -> None:
    blank = 50_000_000
    bomb = gzip.compress(b"\n" * blank + b"not json\n", compresslevel=9)
    assert len(bomb) < 100_000
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(bomb))
    with pytest.raises(MalformedInput) as error:
        list(reader)
    assert error.value.line == blank + 1
    assert reader.bytes_read == len(bomb)


def test_a_line_over_the_limit_stops_the_input_at_that_line_after_the_lines_before() -> None:
    line = request_line()
    limit = len(line)
    data = line + b"\n\n" + line + b"\n" + b"x" * (limit + 1) + b"\n" + line + b"\n"
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for record in Source("-", stdin=io.BytesIO(data), max_record_bytes=limit).records():
            read.append(record.number)
    assert read == [1, 3]  # a line of exactly the limit is read
    assert str(error.value) == (
        f"-:4: line longer than {limit:,} bytes, the limit of one record; input stopped here"
    )


def test_the_default_limit_is_stated_in_mebibytes(tmp_path: Path) -> None:
    path = tmp_path / "one-line.jsonl"
    with path.open("wb") as out:
        out.write(b'{"resourceSpans":[],"x":"')
        out.write(b"a" * (trace_input.DEFAULT_MAX_RECORD_BYTES + 1))
    with pytest.raises(MalformedInput) as error:
        list(OtlpJsonReader([str(path)]))
    assert str(error.value) == (
        f"{path}:1: line longer than 64 MiB, the limit of one record; input stopped here"
    )


# -- compression ------------------------------------------------------------------------------


def _cut_after_flush(compressor: Any, flush: Any, head: bytes, tail: bytes) -> bytes:
    """``head`` compressed and flushed to a block boundary, then part of ``tail``, then cut."""
    return compressor.compress(head) + flush() + compressor.compress(tail) + flush()


def test_a_truncated_gzip_file_names_the_exact_line_and_keeps_every_line_before() -> None:
    line = request_line()
    head = line + b"\n\n" + line + b"\n" + line + b"\n\n"  # lines 1..5
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    data = _cut_after_flush(
        packer, lambda: packer.flush(zlib.Z_SYNC_FLUSH), head, line[: len(line) // 2]
    )
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(data))
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for item in reader:
            read.append(item.line)
    assert read == [1, 3, 4]
    assert str(error.value) == "-:6: compressed data ends early (truncated gzip file)"


def test_a_gzip_file_cut_inside_its_trailer_names_the_line_after_the_last(tmp_path: Path) -> None:
    line = request_line()
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(line + b"\n" + line + b"\n")[:-4])
    reader = OtlpJsonReader([str(path)])
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for item in reader:
            read.append(item.line)
    assert read == [1, 2]
    assert str(error.value) == f"{path}:3: compressed data ends early (truncated gzip file)"


@needs_zstd
def test_zstd_files_are_recognised_by_content_and_read_as_plain_ones(tmp_path: Path) -> None:
    spans = produce()
    line = json.dumps(encode_request(spans)).encode()
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b"\n" + line + b"\n")
    packed = tmp_path / "b.json"  # no .zst suffix: its magic bytes say what it is
    packed.write_bytes(zstd.compress(b"\n" + line + b"\n"))
    reader = OtlpJsonReader([str(plain), str(packed)])
    read = [(Path(item.path).name, item.line, [summary(s) for s in item.spans]) for item in reader]
    assert read[0][1:] == read[1][1:] == (2, [summary(s) for s in spans])
    assert reader.bytes_read == reader.total_bytes == plain.stat().st_size + packed.stat().st_size


@needs_zstd
def test_a_truncated_zstd_file_names_the_exact_line_and_keeps_every_line_before() -> None:
    line = request_line()
    packer = zstd.ZstdCompressor()
    data = _cut_after_flush(
        packer,
        lambda: packer.flush(zstd.ZstdCompressor.FLUSH_BLOCK),
        line + b"\n\n\n" + line + b"\n",
        line[:100],
    )
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(data))
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for item in reader:
            read.append(item.line)
    assert read == [1, 4]
    assert str(error.value) == "-:5: compressed data ends early (truncated zstd file)"


def test_without_the_zstd_extra_a_zstd_file_is_named_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace_input, "_zstd_module", lambda: None)
    path = tmp_path / "spans.jsonl.zst"
    path.write_bytes(trace_input.ZSTD_MAGIC + b"\x00" * 16)
    with pytest.raises(MalformedInput) as error:
        list(OtlpJsonReader([str(path)]))
    assert str(error.value) == f"{path}: zstd-compressed; install otel-guard[zstd] to read it"


def test_standard_input_is_read_once_without_seeking() -> None:
    class Pipe(io.RawIOBase):
        """A stream that cannot seek or tell, returning a few bytes per read, like a pipe."""

        def __init__(self, data: bytes) -> None:
            self._data = data

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            size = min(len(buffer), 7, len(self._data))
            buffer[:size] = self._data[:size]
            self._data = self._data[size:]
            return size

    data = gzip.compress(request_line() + b"\n")
    reader = OtlpJsonReader(["-"], stdin=Pipe(data))  # type: ignore[arg-type]
    assert [(item.path, item.line, len(item.spans)) for item in reader] == [("-", 1, 3)]
    assert reader.total_bytes == 0  # unknown for a pipe: progress shows what was read
    assert reader.bytes_read == len(data)


# -- frames -----------------------------------------------------------------------------------


def test_proto_frames_read_to_the_same_spans_as_json_lines() -> None:
    spans = produce()
    message = bytes(encode_spans(spans).SerializeToString())
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(framed(message, message)))
    read = [(item.line, [summary(s) for s in item.spans]) for item in reader]
    assert read == [(1, [summary(s) for s in spans]), (2, [summary(s) for s in spans])]


def test_frames_of_logs_and_metrics_are_skipped_counted_and_later_spans_still_read() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    data = framed(logs_request(), message, metrics_request(), logs_request(), message)
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(data))
    assert [(item.line, len(item.spans)) for item in reader] == [(2, 3), (5, 3)]
    assert reader.skipped == {"logs": 2, "metrics": 1}


def test_json_in_frames_is_read_as_json() -> None:
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(framed(request_line())))
    assert [(item.line, len(item.spans)) for item in reader] == [(1, 3)]


@needs_zstd
def test_frames_compressed_one_by_one_are_read() -> None:
    # The file exporter's per-message compression: each frame's payload is a zstd frame.
    message = bytes(encode_spans(produce()).SerializeToString())
    data = framed(zstd.compress(message), zstd.compress(request_line()))
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(data))
    assert [(item.line, len(item.spans)) for item in reader] == [(1, 3), (2, 3)]


@needs_zstd
def test_a_zstd_file_of_proto_frames_is_read() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(zstd.compress(framed(message, message))))
    assert [(item.line, len(item.spans)) for item in reader] == [(1, 3), (2, 3)]


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (b"\x00\x00", "-:2: data ends inside a frame's length prefix"),
        (b"\x00\x00\x00\x09abc", "-:2: data ends inside a frame (3 of 9 bytes)"),
        (
            (1 << 30).to_bytes(4, "big"),
            "-:2: frame longer than 64 MiB (1,073,741,824 bytes), the limit of one record; "
            "input stopped here",
        ),
        (framed(b"\xff\xff\xff"), "-:2: not a protobuf trace export request (undecodable)"),
    ],
)
def test_broken_frames_are_described_with_their_number(tail: bytes, message: str) -> None:
    good = bytes(encode_spans(produce()).SerializeToString())
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(framed(good) + tail))
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for item in reader:
            read.append(item.line)
    assert read == [1]
    assert str(error.value) == message


def test_a_span_with_a_bad_id_in_a_frame_is_described_not_skipped() -> None:
    request = encode_spans(produce())
    request.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x01\x02"
    reader = OtlpJsonReader(["-"], stdin=io.BytesIO(framed(request.SerializeToString())))
    with pytest.raises(MalformedInput) as error:
        list(reader)
    where = "resourceSpans[0].scopeSpans[0].spans[1]"
    assert str(error.value) == f"-:1: {where}.spanId: expected 8 bytes"


@settings(max_examples=100)
@given(
    attributes=st.dictionaries(st.text(min_size=1, max_size=10), _ATTRIBUTE, max_size=6),
    kind=st.sampled_from(list(SpanKind)),
    code=st.sampled_from(list(StatusCode)),
)
def test_any_span_reads_the_same_from_a_proto_frame_as_from_a_json_line(
    attributes: dict[str, Any], kind: SpanKind, code: StatusCode
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t", "1.0").start_span("s", kind=kind, attributes=attributes)
    span.set_status(Status(code, "why" if code is StatusCode.ERROR else None))
    span.end()
    spans = exporter.get_finished_spans()
    message = bytes(encode_spans(spans).SerializeToString())
    from_json = OtlpJsonReader(["-"], stdin=io.BytesIO(request_line_of(spans)))
    from_proto = OtlpJsonReader(["-"], stdin=io.BytesIO(framed(message)))
    assert [[summary(s) for s in i.spans] for i in from_proto] == [
        [summary(s) for s in i.spans] for i in from_json
    ]


def request_line_of(spans: Any) -> bytes:
    return json.dumps(encode_request(spans)).encode() + b"\n"
