"""Trace input as operators have it: files or standard input, plain, gzip or zstd, and the two
framings of the OpenTelemetry Collector ``file`` exporter.

A source is a path, or ``-`` for standard input (pipes included: nothing here seeks). Its
compression is recognised by its first bytes (gzip ``1f 8b``, zstd ``28 b5 2f fd``), whatever
the file is called. The decompressed content is then one of:

* **JSON lines** (``format: json``): each non-blank line one request. Recognised when the content
  starts with ``{`` or with whitespace.
* **Length-prefixed frames** (``format: proto``, and ``format: json`` with the exporter's older
  per-message compression): each message is preceded by its size as a 4-byte big-endian
  unsigned integer. A frame's payload may itself be a zstd frame (per-message compression); it
  is then a JSON request when it starts with ``{``, else a protobuf ``ExportTraceServiceRequest``.
  A first size byte of ``{`` or of a whitespace character would mean a message of 150 MiB or
  more, far beyond :data:`DEFAULT_MAX_RECORD_BYTES`, so the two framings never overlap.

Memory stays bounded whatever the input: content is read in chunks of :data:`CHUNK_BYTES`, runs
of blank lines are skipped at C speed without building a line each, and a line or frame longer
than the record limit stops the input with a :class:`MalformedInput` naming the file and line
before it is held in memory.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, cast

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_EMPTY_FRAMES",
    "STDIN",
    "TEXT_STARTS",
    "MalformedInput",
    "Record",
    "Source",
    "decompress_frame",
    "source_size",
]

STDIN: Final = "-"
"""The path that names standard input."""

DEFAULT_MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
"""The longest line or frame read (64 MiB): 16 times the Collector's default 4 MiB limit on one
received request, so no export the Collector accepted comes near it."""

CHUNK_BYTES: Final = 1024 * 1024
"""Bytes of decompressed content read at a time."""

GZIP_MAGIC: Final = b"\x1f\x8b"
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_LENGTH_BYTES: Final = 4
TEXT_STARTS: Final = frozenset(b"{ \t\r\n\x0b\x0c")
"""First bytes of JSON-lines content (any other first byte means length-prefixed frames)."""
_NON_BLANK: Final = re.compile(rb"[^ \t\r\n\x0b\x0c]").search

RecordKind = Literal["json", "proto"]


class MalformedInput(Exception):
    """A file that cannot be read, or a line that is not an OTLP trace request.

    ``str()`` is the one-line message ``FILE:LINE: what`` (``FILE: what`` without a line). For
    length-prefixed input, LINE counts frames.
    """

    def __init__(self, path: str, line: int | None, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.message = message

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Record:
    """One request as stored: its line (or frame) number, its bytes, and how to decode them."""

    number: int
    data: bytes
    kind: RecordKind


class _Peekable:
    """A binary stream read forwards only, whose first bytes can be looked at and put back.

    ``consumed`` counts the bytes taken from the underlying stream, for progress.
    """

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._head = b""
        self.consumed = 0

    def peek(self, size: int) -> bytes:
        while len(self._head) < size:
            more = self._read(size - len(self._head))
            if not more:
                break
            self.consumed += len(more)
            self._head += more
        return self._head[:size]

    def read(self, size: int) -> bytes:
        # Every caller asks for a size (a chunk, a frame, a decompressor's buffer), never "all".
        head = self._head
        if head:
            self._head = head[size:]
            return head[:size]
        data = self._read(size)
        self.consumed += len(data)
        return data


def _zstd_module() -> Any:
    """The zstd decompressor: the standard library's from Python 3.14, else its backport."""
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            return None
    return zstd


_MISSING_ZSTD: Final = "zstd-compressed; install otel-guard[zstd] to read it"


def decompress_frame(data: bytes, limit: int) -> bytes:
    """One zstd-compressed message (the ``file`` exporter's per-message compression).

    Raises :class:`ValueError` with a description when the extra is missing, the data is not
    zstd, or it decompresses to more than ``limit`` bytes.
    """
    zstd = _zstd_module()
    if zstd is None:
        raise ValueError(f"frame is {_MISSING_ZSTD}")
    import io

    try:
        with zstd.ZstdFile(io.BytesIO(data)) as stream:
            content: bytes = stream.read(limit + 1)
    except (EOFError, OSError, zstd.ZstdError) as error:
        raise ValueError(f"corrupt zstd frame ({error})") from None
    if len(content) > limit:
        raise ValueError(f"frame decompresses to more than {limit:,} bytes (the record limit)")
    return content


class Source:
    """One input (a path or ``-``), opened, decompressed and split into :class:`Record` s.

    :attr:`consumed` is the number of stored (compressed) bytes read so far, for progress.
    """

    def __init__(
        self,
        path: str,
        *,
        stdin: IO[bytes] | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        byte_range: tuple[int, int] | None = None,
    ) -> None:
        self.path = path
        self._stdin = stdin
        self._limit = max_record_bytes
        self._chunk = chunk_bytes
        self._raw: _Peekable | None = None
        self._range = byte_range
        self.newlines = 0
        """Newlines read so far (of a byte range: the lines before the next range)."""

    @property
    def consumed(self) -> int:
        return 0 if self._raw is None else self._raw.consumed

    def records(self) -> Iterator[Record]:
        """The requests of this input, in order; raises :class:`MalformedInput` when it cannot
        go on (the records already yielded stay valid)."""
        path = self.path
        if path == STDIN:
            stream = self._stdin
            if stream is None:
                stream = getattr(sys.stdin, "buffer", None)  # None when there is no stdin
                if stream is None:
                    raise MalformedInput(path, None, "cannot read (no standard input)")
            yield from self._records(stream)
            return
        try:
            opened = open(path, "rb")  # noqa: SIM115  # closed below
        except OSError as error:
            raise MalformedInput(path, None, f"cannot read ({error.strerror or error})") from None
        with opened:
            if self._range is not None:
                yield from self._range_records(opened, *self._range)
                return
            yield from self._records(opened)

    def _range_records(self, stream: IO[bytes], start: int, end: int) -> Iterator[Record]:
        """The JSON lines of bytes ``start`` to ``end`` of a plain file whose content is JSON
        lines (:mod:`otel_guard.replay.shards` splits such files at line boundaries); line
        numbers count from the range's first line."""
        left = end - start

        def read(size: int) -> bytes:
            nonlocal left
            if left <= 0:
                return b""
            data = stream.read(min(size, left))
            left -= len(data)
            return data

        try:
            stream.seek(start)
        except OSError as error:
            raise MalformedInput(self.path, None, _read_error(error, "")) from None
        self._raw = _Peekable(read)
        yield from self._lines(self._raw, "")

    def _records(self, stream: IO[bytes]) -> Iterator[Record]:
        path = self.path
        raw = self._raw = _Peekable(stream.read)
        try:
            magic = raw.peek(len(ZSTD_MAGIC))
        except OSError as error:
            raise MalformedInput(path, None, _read_error(error, "")) from None
        content: _Peekable
        compression = ""
        # read1, not read: a truncated stream then fails only after returning every byte before
        # the cut, so the lines before it are replayed and the error names the exact line.
        if magic.startswith(GZIP_MAGIC):
            compression = "gzip"
            content = _Peekable(gzip.GzipFile(fileobj=cast(IO[bytes], raw)).read1)
        elif magic == ZSTD_MAGIC:
            zstd = _zstd_module()
            if zstd is None:
                raise MalformedInput(path, None, _MISSING_ZSTD)
            compression = "zstd"
            content = _Peekable(zstd.ZstdFile(raw).read1)
        else:
            content = raw
        try:
            first = content.peek(1)
        except Exception as error:  # the decompressor's own errors, whatever its module
            raise MalformedInput(path, 1, _read_error(error, compression)) from None
        if not first:
            return
        if first[0] in TEXT_STARTS:
            yield from self._lines(content, compression)
        else:
            yield from self._frames(content, compression)

    def _lines(self, content: _Peekable, compression: str) -> Iterator[Record]:
        path, limit, read, chunk_bytes = self.path, self._limit, content.read, self._chunk
        number = 0  # newlines read so far
        pieces: list[bytes] = []  # the current line's bytes, when it spans chunks
        size = 0
        while True:
            try:
                chunk = read(chunk_bytes)
            except Exception as error:  # the decompressor's own errors, whatever its module
                raise MalformedInput(path, number + 1, _read_error(error, compression)) from None
            if not chunk:
                break
            position, end = 0, len(chunk)
            while position < end:
                if not pieces:
                    # Skip blank lines (and a line's leading blanks) without building them.
                    found = _NON_BLANK(chunk, position)
                    if found is None:
                        number += chunk.count(b"\n", position)
                        break
                    start = found.start()
                    number += chunk.count(b"\n", position, start)
                    position = start
                newline = chunk.find(b"\n", position)
                stop = end if newline < 0 else newline
                size += stop - position
                if size > limit:
                    raise MalformedInput(path, number + 1, _too_long("line", limit))
                if newline < 0:
                    pieces.append(chunk[position:])
                    break
                number += 1
                if pieces:
                    pieces.append(chunk[position:newline])
                    line = b"".join(pieces)
                    pieces = []
                else:
                    line = chunk[position:newline]
                size = 0
                yield Record(number, line, "json")
                position = newline + 1
        self.newlines = number
        if pieces:
            yield Record(number + 1, b"".join(pieces), "json")

    def _frames(self, content: _Peekable, compression: str) -> Iterator[Record]:
        path, limit = self.path, self._limit
        number = 0
        empty = 0  # zero-length frames in a row
        while True:
            number += 1  # the frame being read, its length prefix included
            try:
                header = _read_exact(content, _LENGTH_BYTES)
                if not header:
                    return
                if len(header) < _LENGTH_BYTES:
                    raise MalformedInput(path, number, "data ends inside a frame's length prefix")
                size = int.from_bytes(header, "big")
                if size > limit:
                    if number == 1:  # no frame read yet: say what the input is instead
                        what = _not_trace_input(header + content.peek(_SHOWN_BYTES), size)
                        raise MalformedInput(path, number, what)  # line 1, as for a bad line
                    raise MalformedInput(path, number, _too_long("frame", limit, size))
                empty = empty + 1 if size == 0 else 0
                if empty > MAX_EMPTY_FRAMES:
                    raise MalformedInput(
                        path,
                        number,
                        f"not trace input: more than {MAX_EMPTY_FRAMES} empty frames in a row "
                        "(zero bytes, as of /dev/zero or a file never written)",
                    )
                data = _read_exact(content, size)
            except MalformedInput:
                raise
            except Exception as error:  # the decompressor's own errors, whatever its module
                raise MalformedInput(path, number, _read_error(error, compression)) from None
            if len(data) < size:
                raise MalformedInput(
                    path, number, f"data ends inside a frame ({len(data)} of {size} bytes)"
                )
            if data.startswith(ZSTD_MAGIC):
                try:
                    data = decompress_frame(data, limit)
                except ValueError as error:
                    raise MalformedInput(path, number, str(error)) from None
            found = _NON_BLANK(data)
            is_json = found is not None and data[found.start()] == 0x7B  # "{"
            yield Record(number, data, "json" if is_json else "proto")


MAX_EMPTY_FRAMES: Final = 64
"""Empty frames (length 0) read in a row before the input is judged not to be frames at all: a
Collector writes no empty request, and zeros would otherwise read as empty frames forever."""

_SHOWN_BYTES: Final = 40


def _not_trace_input(head: bytes, size: int) -> str:
    """What input that is neither JSON lines nor length-prefixed frames looks like."""
    expected = (
        "OTLP trace input is JSON lines (each a request object starting with '{') or "
        "length-prefixed proto frames, plain, gzip or zstd"
    )
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as error:  # a character cut at the end of the bytes looked at
        text = head[: error.start].decode("utf-8") if error.start >= 8 else ""
    line = text.split("\n", 1)[0]
    if line and all(char.isprintable() or char in "\t\r" for char in line):
        kind = "a JSON array or other text" if line.startswith("[") else "text"
        return f"{kind}, not trace input (starts {line[:_SHOWN_BYTES]!r}); {expected}"
    return (
        f"binary data, not trace input (starts {head[:8].hex(' ')}; read as a frame it would be "
        f"{size:,} bytes, over the record limit); {expected}"
    )


def _read_exact(content: _Peekable, size: int) -> bytes:
    data = content.read(size)
    if len(data) == size or not data:
        return data
    pieces = [data]
    have = len(data)
    while have < size:
        more = content.read(size - have)
        if not more:
            break
        pieces.append(more)
        have += len(more)
    return b"".join(pieces)


def _too_long(what: str, limit: int, size: int | None = None) -> str:
    stated = "" if size is None else f" ({size:,} bytes)"
    bound = f"{limit >> 20} MiB" if limit and not limit % (1 << 20) else f"{limit:,} bytes"
    return f"{what} longer than {bound}{stated}, the limit of one record; input stopped here"


def _read_error(error: BaseException, compression: str) -> str:
    """What went wrong reading a source; ``compression`` is ``""`` when it is stored plain, so
    that the error is the stream's own, not a decompressor's."""
    if isinstance(error, gzip.BadGzipFile | zlib.error):
        return "corrupt gzip data"
    if isinstance(error, OSError):
        return f"cannot read ({error.strerror or error})"
    if not compression:
        return f"cannot read ({error})"
    if isinstance(error, EOFError):
        return f"compressed data ends early (truncated {compression} file)"
    return f"corrupt {compression} data ({error})"


def source_size(path: str) -> int:
    """The stored size of ``path`` in bytes; for ``-``, that of standard input when it is a
    regular file; 0 when unknown (a pipe)."""
    try:
        if path == STDIN:
            status = os.fstat(sys.stdin.fileno())
            return status.st_size if stat.S_ISREG(status.st_mode) else 0
        return os.path.getsize(path)
    except (OSError, ValueError, AttributeError):
        return 0
