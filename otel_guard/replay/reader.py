"""Trace input read as one stream of requests: the JSON and protobuf readers behind one loop.

:class:`TraceReader` takes the records of each source (:mod:`otel_guard.replay.trace_input`:
files or ``-``, plain, gzip or zstd, JSON lines or length-prefixed frames) and decodes each with
the reader of its encoding (:mod:`otel_guard.replay.otlp_json`, or
:mod:`otel_guard.replay.otlp_proto`, imported only when a frame needs it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.replay.otlp_json import Router, Skipped, parse_json_request
from otel_guard.replay.recorded import Interner, OtherSignal, Shape
from otel_guard.replay.trace_input import (
    DEFAULT_MAX_RECORD_BYTES,
    MalformedInput,
    Record,
    Source,
    source_size,
)

__all__ = ["MalformedInput", "SpanLine", "TraceReader"]


@dataclass(frozen=True, slots=True)
class SpanLine:
    """The spans of one non-blank input line, and where it was read.

    With a :class:`Router`, a span of a trace another process replays is a :data:`Skipped`
    placeholder, in its place.
    """

    path: str
    line: int
    spans: list[ReadableSpan | Skipped]


class TraceReader:
    """Streams OTLP trace input, one request at a time, as one input.

    Sources (paths, or ``-`` for standard input) are read in the order given; compression and
    framing are recognised by content (:mod:`otel_guard.replay.trace_input`). Progress is visible
    through :attr:`bytes_read` (bytes of the sources as stored) and :attr:`total_bytes` (0 for a
    pipe, whose size is unknown). Requests of other signals are skipped and counted in
    :attr:`skipped`. With a ``router`` (:class:`Router`), spans of traces another process
    replays are not built; ``stop`` (index of the source, line) ends the input before that line.
    Iteration raises :class:`MalformedInput` at the first unreadable source or
    malformed request; the lines already yielded stay valid.
    """

    def __init__(
        self,
        paths: Sequence[str],
        *,
        stdin: IO[bytes] | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        router: Router | None = None,
        stop: tuple[int, int] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.source_index = 0
        """The index in :attr:`paths` of the source being read."""
        self._router = router
        self._stop = stop  # (source index, line): where another reading found an error
        self.total_bytes = sum(source_size(p) for p in self.paths)
        self.bytes_read = 0
        self.skipped: Counter[str] = Counter()
        """Requests of other signals skipped, by signal ("logs", "metrics", "profiles")."""
        self._stdin = stdin
        self._max_record_bytes = max_record_bytes
        self._interner = Interner()

    @property
    def skipped_lines(self) -> int:
        """Requests (lines or frames) of other signals skipped, all signals together."""
        return sum(self.skipped.values())

    def __iter__(self) -> Iterator[SpanLine]:
        done = 0
        for index, path in enumerate(self.paths):
            self.source_index = index
            source = Source(path, stdin=self._stdin, max_record_bytes=self._max_record_bytes)
            try:
                for record in source.records():
                    if self._stop is not None and (index, record.number) >= self._stop:
                        return  # not even decoded: a router's decisions stay as they were
                    self.bytes_read = done + source.consumed
                    spans = self._spans(path, record)
                    if spans is not None:
                        yield SpanLine(path, record.number, spans)
            finally:
                done += source.consumed
                self.bytes_read = done

    def _spans(self, path: str, record: Record) -> list[ReadableSpan | Skipped] | None:
        try:
            if record.kind == "json":
                return parse_json_request(record.data, self._interner, self._router)
            from otel_guard.replay.otlp_proto import parse_proto_request  # protobuf when needed

            return list(parse_proto_request(record.data, self._interner))
        except Shape as error:
            raise MalformedInput(path, record.number, str(error)) from None
        except OtherSignal as other:
            self.skipped[other.signal] += 1
            return None
