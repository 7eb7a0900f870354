"""Trace input as operators have it: standard input, gzip, zstd, JSON lines, frames, bounds."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
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
from otel_guard.replay.otlp_json import encode_request
from otel_guard.replay.reader import MalformedInput, TraceReader
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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    reader = TraceReader(["-"], stdin=io.BytesIO(bomb))
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
        list(TraceReader([str(path)]))
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
    reader = TraceReader(["-"], stdin=io.BytesIO(data))
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
    reader = TraceReader([str(path)])
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
    reader = TraceReader([str(plain), str(packed)])
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
    reader = TraceReader(["-"], stdin=io.BytesIO(data))
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
        list(TraceReader([str(path)]))
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
    reader = TraceReader(["-"], stdin=Pipe(data))  # type: ignore[arg-type]
    assert [(item.path, item.line, len(item.spans)) for item in reader] == [("-", 1, 3)]
    assert reader.total_bytes == 0  # unknown for a pipe: progress shows what was read
    assert reader.bytes_read == len(data)


# -- frames -----------------------------------------------------------------------------------


def test_proto_frames_read_to_the_same_spans_as_json_lines() -> None:
    spans = produce()
    message = bytes(encode_spans(spans).SerializeToString())
    reader = TraceReader(["-"], stdin=io.BytesIO(framed(message, message)))
    read = [(item.line, [summary(s) for s in item.spans]) for item in reader]
    assert read == [(1, [summary(s) for s in spans]), (2, [summary(s) for s in spans])]


def test_frames_of_logs_and_metrics_are_skipped_counted_and_later_spans_still_read() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    data = framed(logs_request(), message, metrics_request(), logs_request(), message)
    reader = TraceReader(["-"], stdin=io.BytesIO(data))
    assert [(item.line, len(item.spans)) for item in reader] == [(2, 3), (5, 3)]
    assert reader.skipped == {"logs": 2, "metrics": 1}


def test_json_in_frames_is_read_as_json() -> None:
    reader = TraceReader(["-"], stdin=io.BytesIO(framed(request_line())))
    assert [(item.line, len(item.spans)) for item in reader] == [(1, 3)]


@needs_zstd
def test_frames_compressed_one_by_one_are_read() -> None:
    # The file exporter's per-message compression: each frame's payload is a zstd frame.
    message = bytes(encode_spans(produce()).SerializeToString())
    data = framed(zstd.compress(message), zstd.compress(request_line()))
    reader = TraceReader(["-"], stdin=io.BytesIO(data))
    assert [(item.line, len(item.spans)) for item in reader] == [(1, 3), (2, 3)]


@needs_zstd
def test_a_zstd_file_of_proto_frames_is_read() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    reader = TraceReader(["-"], stdin=io.BytesIO(zstd.compress(framed(message, message))))
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
    reader = TraceReader(["-"], stdin=io.BytesIO(framed(good) + tail))
    read: list[int] = []
    with pytest.raises(MalformedInput) as error:
        for item in reader:
            read.append(item.line)
    assert read == [1]
    assert str(error.value) == message


def test_a_span_with_a_bad_id_in_a_frame_is_described_not_skipped() -> None:
    request = encode_spans(produce())
    request.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x01\x02"
    reader = TraceReader(["-"], stdin=io.BytesIO(framed(request.SerializeToString())))
    with pytest.raises(MalformedInput) as error:
        list(reader)
    where = "resourceSpans[0].scopeSpans[0].spans[1]"
    assert str(error.value) == f"-:1: {where}.spanId: expected 8 bytes"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    from_json = TraceReader(["-"], stdin=io.BytesIO(request_line_of(spans)))
    from_proto = TraceReader(["-"], stdin=io.BytesIO(framed(message)))
    assert [[summary(s) for s in i.spans] for i in from_proto] == [
        [summary(s) for s in i.spans] for i in from_json
    ]


def request_line_of(spans: Any) -> bytes:
    return json.dumps(encode_request(spans)).encode() + b"\n"


# -- standard input, progress and sizes -------------------------------------------------------


class _Trickle(io.RawIOBase):
    """A pipe that hands over at most ``most`` bytes per read."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data = data
        self._most = most

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), self._most, len(self._data))
        buffer[:size] = self._data[:size]
        self._data = self._data[size:]
        return size


def test_peeking_takes_no_more_from_the_stream_than_it_shows() -> None:
    stream = trace_input._Peekable(_Trickle(b"abcdefgh", 3).read)
    assert stream.peek(4) == b"abcd"
    assert stream.consumed == 4
    assert stream.read(2) == b"ab"  # what was peeked comes back first
    assert stream.read(9) == b"cd"
    assert stream.read(9) == b"efg"
    assert stream.consumed == 7


@pytest.mark.parametrize("compress", [bytes, gzip.compress])
@pytest.mark.parametrize("most", [1, 3])
def test_a_pipe_handing_over_a_few_bytes_at_a_time_reads_like_a_file(
    compress: Any, most: int
) -> None:
    line = request_line()
    data = compress(b"\n" + line + b"\n\n" + line)
    whole = TraceReader(["-"], stdin=io.BytesIO(data))
    expected = [(item.line, [summary(s) for s in item.spans]) for item in whole]
    trickled = TraceReader(["-"], stdin=_Trickle(data, most))  # type: ignore[arg-type]
    assert [(item.line, [summary(s) for s in item.spans]) for item in trickled] == expected
    assert [line for line, _ in expected] == [2, 4]
    assert trickled.bytes_read == whole.bytes_read == len(data)


class _Descriptor:
    """Standard input reduced to its file descriptor."""

    def __init__(self, descriptor: int) -> None:
        self._descriptor = descriptor

    def fileno(self) -> int:
        return self._descriptor


def test_standard_input_redirected_from_a_file_is_read_and_its_size_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_bytes(request_line() + b"\n")
    with path.open("rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        reader = TraceReader(["-"])
        assert [(item.path, item.line, len(item.spans)) for item in reader] == [("-", 1, 3)]
    assert reader.total_bytes == reader.bytes_read == path.stat().st_size


def test_standard_input_from_a_pipe_is_read_with_no_known_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = request_line() + b"\n"
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        reader = TraceReader(["-"])
        assert [(item.line, len(item.spans)) for item in reader] == [(1, 3)]
    assert (reader.total_bytes, reader.bytes_read) == (0, len(data))


def test_only_a_regular_file_on_standard_input_has_a_known_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory reports a size of its own (as a pipe does on some systems): not a source size.
    descriptor = os.open(tmp_path, os.O_RDONLY)
    try:
        assert os.fstat(descriptor).st_size > 0
        monkeypatch.setattr(sys, "stdin", _Descriptor(descriptor))
        assert trace_input.source_size("-") == 0
    finally:
        os.close(descriptor)


def test_without_standard_input_reading_it_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # as Python leaves it when there is none
    reader = TraceReader(["-"])
    assert reader.total_bytes == 0
    with pytest.raises(MalformedInput) as error:
        list(reader)
    assert str(error.value) == "-: cannot read (no standard input)"
    assert (error.value.path, error.value.line) == ("-", None)


def test_a_plain_stream_failing_midway_is_described_as_unreadable_at_its_line() -> None:
    class Failing(io.RawIOBase):
        """A stream that gives its first line, then fails as a closed file does."""

        def __init__(self, head: bytes, error: Exception) -> None:
            self._head = head
            self._error = error

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            if not self._head:
                raise self._error
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size

    head = request_line() + b"\n"
    for error, message in [
        (ValueError("I/O operation on closed file."), "I/O operation on closed file."),
        (EOFError("no more"), "no more"),
    ]:
        reader = TraceReader(["-"], stdin=Failing(head, error))  # type: ignore[arg-type]
        read: list[int] = []
        with pytest.raises(MalformedInput) as raised:
            for item in reader:
                read.append(item.line)
        assert read == [1]
        assert str(raised.value) == f"-:2: cannot read ({message})"


def test_a_malformed_input_error_carries_its_message_as_its_argument() -> None:
    error = MalformedInput("spans.jsonl", 3, "invalid JSON")
    assert error.args == ("invalid JSON",)
    assert repr(error) == "MalformedInput('invalid JSON')"
    assert str(error) == "spans.jsonl:3: invalid JSON"


# -- bounds, compression and framing faults ---------------------------------------------------


def test_a_limit_of_whole_mebibytes_is_stated_in_mebibytes() -> None:
    limit = 1 << 20
    with pytest.raises(MalformedInput) as error:
        records(b"{" + b" " * limit + b"}\n", max_record_bytes=limit)
    assert str(error.value) == (
        "-:1: line longer than 1 MiB, the limit of one record; input stopped here"
    )


def test_lines_of_exactly_the_limit_are_read_wherever_the_chunks_cut_them() -> None:
    line = b'{"resourceSpans":[]}'
    data = line + b"\n" + line + b"\n"
    for chunk in range(1, len(data) + 1):  # a newline at the start of a chunk among them
        read = records(data, max_record_bytes=len(line), chunk_bytes=chunk)
        assert [(r.number, r.data, r.kind) for r in read] == [(1, line, "json"), (2, line, "json")]


def test_a_last_line_without_a_newline_is_read_as_json() -> None:
    line = request_line()
    read = records(b"\n" + line + b"\n" + line)
    assert [(r.number, r.kind) for r in read] == [(2, "json"), (3, "json")]


def test_frames_are_told_apart_as_json_or_protobuf_by_their_first_byte() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    read = records(framed(message, b" \n" + request_line(), b""))
    assert [(r.number, r.kind) for r in read] == [(1, "proto"), (2, "json"), (3, "proto")]


@needs_zstd
def test_frames_of_exactly_the_limit_stored_or_decompressed_are_read() -> None:
    line = request_line()
    packed = zstd.compress(line)
    read = records(framed(line, packed), max_record_bytes=len(line))
    assert [(r.number, r.data, r.kind) for r in read] == [(1, line, "json"), (2, line, "json")]


@needs_zstd
def test_a_frame_decompressing_beyond_the_limit_is_refused_before_it_is_held() -> None:
    import tracemalloc

    limit = 1 << 20
    bomb = zstd.compress(b"{" + b" " * (64 << 20))  # 64 MiB from a few kilobytes
    tracemalloc.start()
    try:
        with pytest.raises(MalformedInput) as error:
            records(framed(bomb), max_record_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(error.value) == (
        "-:1: frame decompresses to more than 1,048,576 bytes (the record limit)"
    )
    assert peak < 8 * limit


@needs_zstd
def test_a_corrupt_compressed_frame_is_described_with_its_number() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    with pytest.raises(MalformedInput) as error:
        records(framed(message, trace_input.ZSTD_MAGIC + b"\x00" * 20))
    assert error.value.line == 2
    assert str(error.value).startswith("-:2: corrupt zstd frame (")


def test_without_the_zstd_extra_a_compressed_frame_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_input, "_zstd_module", lambda: None)
    with pytest.raises(MalformedInput) as error:
        records(framed(trace_input.ZSTD_MAGIC + b"\x00" * 20))
    assert str(error.value) == "-:1: frame is zstd-compressed; install otel-guard[zstd] to read it"


@needs_zstd
def test_corrupt_zstd_data_is_described_at_its_line() -> None:
    line = request_line()
    packed = bytearray(zstd.compress(line + b"\n" + os.urandom(3000).hex().encode()))
    for index in range(20, len(packed) - 10, 7):
        packed[index] ^= 0x55
    with pytest.raises(MalformedInput) as error:
        records(bytes(packed))
    assert str(error.value).startswith("-:1: corrupt zstd data (")


def _gzip_cut(*parts: bytes) -> bytes:
    """``parts`` gzip-compressed, each flushed to a block boundary, without the end."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    return b"".join(packer.compress(part) + packer.flush(zlib.Z_SYNC_FLUSH) for part in parts)


def test_a_gzip_stream_cut_after_its_first_blank_line_names_the_second_line() -> None:
    with pytest.raises(MalformedInput) as error:
        records(_gzip_cut(b"\n"))
    assert str(error.value) == "-:2: compressed data ends early (truncated gzip file)"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # mtime=0: the header's time is in the test ID, which every test worker must collect alike
        (
            gzip.compress(b"\n", mtime=0)[:5],
            "-:1: compressed data ends early (truncated gzip file)",
        ),
        (trace_input.GZIP_MAGIC + b"\x08\x00" + b"\xff" * 16, "-:1: corrupt gzip data"),
    ],
)
def test_a_gzip_stream_broken_in_its_header_is_described_at_the_first_line(
    data: bytes, message: str
) -> None:
    with pytest.raises(MalformedInput) as error:
        records(data)
    assert str(error.value) == message


def test_gzip_compressed_frames_cut_short_name_the_frame_being_read() -> None:
    message = bytes(encode_spans(produce()).SerializeToString())
    first = framed(message)
    truncated = "compressed data ends early (truncated gzip file)"
    for data, number in [
        (_gzip_cut(first[:2]), 1),  # inside the first frame's length prefix
        (_gzip_cut(first, first[:2]), 2),  # inside the second one's
        (_gzip_cut(first, first[:9]), 2),  # inside the second frame
    ]:
        read: list[int] = []
        with pytest.raises(MalformedInput) as error:
            for record in Source("-", stdin=io.BytesIO(data)).records():
                read.append(record.number)
        assert read == list(range(1, number))
        assert str(error.value) == f"-:{number}: {truncated}"


def test_an_empty_read_ends_the_input_as_at_a_terminals_end_of_input() -> None:
    class Terminal(io.RawIOBase):
        """A stream whose reads return these pieces in turn, an empty one included."""

        def __init__(self, *pieces: bytes) -> None:
            self._pieces = list(pieces)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            piece = self._pieces.pop(0) if self._pieces else b""
            buffer[: len(piece)] = piece
            return len(piece)

    message = bytes(encode_spans(produce()).SerializeToString())
    frame = framed(message)
    stream = Terminal(frame[:4], frame[4:], b"", frame)  # end of input, then more typed
    assert [r.number for r in Source("-", stdin=stream).records()] == [1]  # type: ignore[arg-type]


# -- input that is not trace input at all ---------------------------------------------------------

_EXPECTED = (
    "OTLP trace input is JSON lines (each a request object starting with '{') or "
    "length-prefixed proto frames, plain, gzip or zstd"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"[1,2,3]\n",
            f"a JSON array or other text, not trace input (starts '[1,2,3]'); {_EXPECTED}",
        ),
        (
            b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n",
            f"text, not trace input (starts 'root:x:0:0:root:/root:/bin/bash'); {_EXPECTED}",
        ),
        (
            bytes(range(0xC0, 0xE0)),
            "binary data, not trace input (starts c0 c1 c2 c3 c4 c5 c6 c7; read as a frame it "
            f"would be 3,233,923,779 bytes, over the record limit); {_EXPECTED}",
        ),
    ],
)
def test_input_that_is_neither_json_lines_nor_frames_is_described_not_called_a_long_frame(
    data: bytes, message: str
) -> None:
    with pytest.raises(MalformedInput) as error:
        list(Source("-", stdin=io.BytesIO(data)).records())
    assert str(error.value) == f"-:1: {message}"
    packed = gzip.compress(data)  # the same once decompressed
    with pytest.raises(MalformedInput) as error:
        list(Source("-", stdin=io.BytesIO(packed)).records())
    assert str(error.value) == f"-:1: {message}"


class _Zeros:
    """Zero bytes, as ``/dev/zero`` reads, ending after a mebibyte so that a reader that would
    read them forever ends (and the test fails) instead."""

    def __init__(self) -> None:
        self.left = 1 << 20

    def read(self, size: int = -1) -> bytes:
        size = min(self.left, size if size >= 0 else 4096)
        self.left -= size
        return b"\0" * size


def test_endless_zero_bytes_stop_as_not_trace_input_instead_of_reading_forever() -> None:
    limit = trace_input.MAX_EMPTY_FRAMES
    with pytest.raises(MalformedInput) as error:
        list(TraceReader(["-"], stdin=_Zeros()))  # type: ignore[arg-type]
    assert str(error.value) == (
        f"-:{limit + 1}: not trace input: more than {limit} empty frames in a row"
        " (zero bytes, as of /dev/zero or a file never written)"
    )


def test_a_few_empty_frames_between_requests_are_read_as_empty_requests() -> None:
    spans = produce()
    message = bytes(encode_spans(spans).SerializeToString())
    data = framed(*[b""] * trace_input.MAX_EMPTY_FRAMES, message)
    reader = TraceReader(["-"], stdin=io.BytesIO(data))
    read = [(line.line, len(line.spans)) for line in reader]
    assert read[-1] == (trace_input.MAX_EMPTY_FRAMES + 1, len(spans))
