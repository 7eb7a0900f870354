"""Replaying in several processes: the input decoded in byte ranges, the prompts in shards.

**Plain JSON-lines files** (the common case) are split at line boundaries into ranges of about
1 MiB (:func:`plan`). Each of ``jobs`` processes decodes every ``jobs``-th range, each range once,
and replays one shard of the prompts, every range in read order (:func:`replay_ranges`). A
range's decoder builds the spans of its own shard; every other process gets, in one payload, the
spans it replays as they were written (encoded again) and a placeholder for each of the others.
Where a range names a trace's prompt, the spans of that trace go to its shard only; the spans of
a trace not yet named there go to every shard, which routes them as the reader does (the
replayer's :class:`~otel_guard.replay.otlp_json.Router`). The processes therefore see exactly
the stream of :func:`replay_shard`; after an input error the input is read again the other way
(below), which finds its first fault as one process does.

**Other input** (gzip, zstd, length-prefixed frames; several of them mixed with plain files)
cannot be split by byte range: :func:`replay_sharded` then lets each process read all input and
replay one shard of the prompts, as below.

A shard is the set of traces whose prompt ID hashes (CRC-32, the same in every process) to its
index, so every trace of a prompt, and so every batch of it, is replayed by one process, and the
shards' reports add up to one process's report (:func:`otel_guard.replay.report.merge_reports`).
Reading all input, each process decodes every line but builds only the spans of its own traces
(the replayer is the reader's :class:`~otel_guard.replay.otlp_json.Router`).
``docs/design.md`` ("Replay report, what-if and shards") gives the reasons and the limits.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import stat
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any, Final, cast

from otel_guard.replay.otlp_json import Decoded, encode_document, id_number, parse_json_request
from otel_guard.replay.reader import MalformedInput, TraceReader
from otel_guard.replay.recorded import (
    Interner,
    OtherSignal,
    Shape,
    bounded_id,
)
from otel_guard.replay.replayer import Replayer
from otel_guard.replay.report import merge_reports
from otel_guard.replay.trace_input import (
    DEFAULT_MAX_RECORD_BYTES,
    GZIP_MAGIC,
    STDIN,
    TEXT_STARTS,
    ZSTD_MAGIC,
    Source,
)

__all__ = [
    "RANGE_BYTES",
    "Piece",
    "RangeReplay",
    "ShardResult",
    "jobs_within_open_files",
    "plan",
    "replay_ranges",
    "replay_shard",
    "replay_sharded",
    "splittable",
]


@dataclass(frozen=True)
class ShardResult:
    """One shard's report, and the input error that stopped its reading, if any."""

    document: dict[str, Any]
    error: str | None = None
    interrupted: bool = False
    stopped_at: tuple[int, int] | None = None
    """Where the error stopped the input: (index of the file, line)."""


Stop = tuple[int, int, str]
"""An input error found by another shard: (index of the file, line, message)."""


def replay_shard(
    files: Sequence[str],
    mode: str,
    options: Mapping[str, Any],
    index: int,
    count: int,
    stop: Stop | None = None,
) -> ShardResult:
    """Read every request of ``files`` and replay the traces of shard ``index`` of ``count``;
    with ``stop``, the input ends there, with that error, as if this process had found it."""
    replayer = Replayer(mode, shard=(index, count), **options)
    # The reader asks the replayer which traces are its own, and builds no span of the others.
    reader = TraceReader(files, router=replayer, stop=None if stop is None else stop[:2])
    error: str | None = None
    stopped_at: tuple[int, int] | None = None
    interrupted = False
    try:
        for line in reader:
            replayer.add(line.spans)
        if stop is not None:
            error, stopped_at = stop[2], stop[:2]
    except MalformedInput as malformed:
        error, stopped_at = str(malformed), (reader.source_index, malformed.line or 0)
    except KeyboardInterrupt:
        interrupted = True
    if index == 0:
        # Every process reads every request: one of them counts the skipped ones, once.
        replayer.report.skipped.update(reader.skipped)
    return ShardResult(replayer.finish().to_json(), error, interrupted, stopped_at)


def replay_sharded(
    files: Sequence[str], mode: str, options: Mapping[str, Any], jobs: int
) -> tuple[dict[str, Any], str | None, bool]:
    """Replay in ``jobs`` processes; returns the merged report, the input error (the earliest
    error found holds for all) and whether the replay was interrupted.

    Plain JSON-lines files are decoded by byte range (:func:`replay_ranges`); other input, a
    range that sent a span away from the shard that owns its trace (a trace naming several
    prompts), or a malformed span that a range's decoder did not build is replayed again with
    every process reading all input (:func:`replay_shard`).
    """
    context = _context()
    pieces = plan(files, RANGE_BYTES)
    if pieces is not None:
        ranged = replay_ranges(pieces, mode, options, jobs, context)
        if ranged.exact:
            return ranged.document, ranged.error, False
    return _replay_reading_all(files, mode, options, jobs, context)


def _replay_reading_all(
    files: Sequence[str], mode: str, options: Mapping[str, Any], jobs: int, context: Any
) -> tuple[dict[str, Any], str | None, bool]:
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [
            pool.submit(replay_shard, list(files), mode, dict(options), index, jobs)
            for index in range(jobs)
        ]
        results = [future.result() for future in futures]
        interrupted = any(r.interrupted for r in results)
        # A process does not check the spans it does not build: a malformed span is found by
        # the process that replays its trace. The others read on; they replay again, stopping
        # where it stopped (rare: only malformed input pays for it).
        found = [(r.stopped_at, r.error) for r in results if r.stopped_at and r.error]
        if found and not interrupted:
            (file_index, line), message = min(found)
            stop = (file_index, line, message)
            again = {
                index: pool.submit(
                    replay_shard, list(files), mode, dict(options), index, jobs, stop
                )
                for index, result in enumerate(results)
                if result.stopped_at is None or result.stopped_at > stop[:2]
            }
            for index, future in again.items():
                results[index] = future.result()
            return merge_reports([r.document for r in results]), message, interrupted
    errors = [r.error for r in results if r.error is not None]
    document = merge_reports([r.document for r in results])
    return document, errors[0] if errors else None, interrupted


# -- byte ranges --------------------------------------------------------------------------------

RANGE_BYTES: Final = 1024 * 1024
"""The size of a range decoded at a time (it ends just after the first newline from there on).

Small, so that a range's spans are still in the processor's caches when they are replayed:
against ranges of 4 MiB, two processes took 2-5% less wall time on the benchmark file
(benchmarks/README.md), and a process holds at most a few MiB of decoded spans."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A byte range of one input file, starting at a line: (index of the file, path, range)."""

    file_index: int
    path: str
    start: int
    end: int


def splittable(path: str) -> bool:
    """Whether ``path`` is a plain file of JSON lines, which can be read from any line on."""
    if path == STDIN:
        return False
    try:
        with open(path, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return False
            head = stream.read(len(ZSTD_MAGIC))
    except OSError:
        return False  # read (and reported) by the whole-input way
    if head.startswith(GZIP_MAGIC) or head == ZSTD_MAGIC:
        return False
    return not head or head[0] in TEXT_STARTS


def plan(files: Sequence[str], range_bytes: int = RANGE_BYTES) -> list[Piece] | None:
    """The ranges of ``files`` in read order, or ``None`` when one of them cannot be split.

    Each range but a file's last is ``range_bytes`` or a little more (to the end of a line),
    whatever the number of processes: a file of a few ranges keeps a process idle, but only
    for as long as one range takes."""
    if not all(splittable(path) for path in files):
        return None
    pieces: list[Piece] = []
    for index, path in enumerate(files):
        size = os.path.getsize(path)
        step = max(1, range_bytes)
        start = 0
        with open(path, "rb") as stream:
            while start < size:
                end = _line_end(stream, start + step, size)
                pieces.append(Piece(index, path, start, end))
                start = end
        if size == 0:
            pieces.append(Piece(index, path, 0, 0))
    return pieces


def _line_end(stream: IO[bytes], position: int, size: int) -> int:
    """The offset just after the first newline at or after ``position`` (``size`` if none)."""
    if position >= size:
        return size
    stream.seek(position)
    while True:
        block = stream.read(64 * 1024)
        if not block:
            return size
        found = block.find(b"\n")
        if found >= 0:
            return position + found + 1
        position += len(block)


_Entry = Any
"""A span a process replays from one line: a RecordedSpan it decoded; ``0`` for the next span of
the line's part decoded elsewhere; or a placeholder for a span of a trace another shard replays
(its trace ID for a root, else ``None``)."""
_Line = tuple[list[_Entry], bytes, list[tuple[int, int]], bool]
"""One decoded line for one process: its entries in read order; the spans of the line that it
replays and its decoder did not, as an OTLP/JSON request (empty if none); the owners the line
decided (trace ID, shard), as the reader's router decides them; and whether the line has spans
of a trace its range had not named, which the replayer's owners route."""

_AHEAD: Final = 2
"""Own ranges a process keeps decoded ahead of the one it replays."""


@dataclass(slots=True)
class _Range:
    """What one process learned of one range: the counts of its lines and the error that
    stopped it, if any (line within the range, message)."""

    newlines: int
    decoded: int
    error: tuple[int | None, str] | None


@dataclass(slots=True)
class _Decoded:
    """A range this process decoded: what it read, and its lines for this process."""

    range: _Range
    lines: list[_Line]


class _Peer:
    """One of the ``count`` processes of :func:`replay_ranges`: it decodes the ranges ``k`` with
    ``k % count == index``, replays shard ``index`` of the prompts, and exchanges with the others
    the spans of each other's shards.

    Ranges are replayed in read order. A range decoded here builds the spans this process
    replays and hands every other process, as one payload, the spans it replays as they were
    written (encoded again) and a placeholder for each of the others. A range decoded elsewhere
    arrives as such a payload. The process keeps :data:`_AHEAD` of its own ranges decoded (and
    sent) ahead of the one it replays, so no process waits on one that waits on it: every range
    depends only on ranges before it, and each one's decoder reaches it. Payloads go out
    through one thread per receiver, so two processes sending to each other at once never block
    each other.
    """

    def __init__(
        self,
        pieces: Sequence[Piece],
        replayer: Replayer,
        index: int,
        count: int,
        outbound: Mapping[int, Connection],
        limit: int,
    ) -> None:
        self.pieces = pieces
        self.replayer = replayer
        self.index = index
        self.count = count
        self.interner = Interner()  # one for the ranges decoded here and those received
        self.mismatch = False
        """Whether a range named a trace's prompt against the owner the replayer already had
        (a trace naming several prompts, or named only after its first part was replayed): it
        sent the trace's spans away from their owner."""
        self.unread = False
        """Whether a span another process handed over unbuilt was malformed."""
        self.limit = limit
        self.sent = 0
        self.decoding = 0.0
        self.decoded_lines: dict[int, int] = {}
        self._outbound = {peer: _Sender(connection) for peer, connection in outbound.items()}
        self._mine = iter(range(index, len(pieces), count))
        self._ahead: deque[_Decoded] = deque()
        self._stopped = False  # a range decoded here stopped on an error: decode no further

    def run(self, inbound: Mapping[int, Connection]) -> str | None:
        """Replay every range in read order; the input error that stopped them, if any.

        On a malformed span that another process handed over unbuilt, stop with :attr:`unread`
        set: the input's first fault is then found by reading it whole."""
        try:
            return self._run(inbound)
        except _Unread:
            self.unread = True
            return None

    def _run(self, inbound: Mapping[int, Connection]) -> str | None:
        offsets: dict[int, int] = {}  # index of the file -> newlines of its ranges read
        for k, piece in enumerate(self.pieces):
            owner = k % self.count
            # Own ranges are decoded (and sent) ahead of their turn, so that the others find
            # them there when they reach them, and this process when it reaches theirs.
            while len(self._ahead) < _AHEAD and self._decode_next():
                pass
            if owner == self.index:
                decoded = self._ahead.popleft()
                read = decoded.range
                self._replay(decoded.lines)
            else:
                read = self._receive(inbound[owner].recv_bytes())
            offset = offsets.get(piece.file_index, 0)
            if read.error is not None:
                line, message = read.error
                where = piece.path if line is None else f"{piece.path}:{line + offset}"
                return f"{where}: {message}"
            offsets[piece.file_index] = offset + read.newlines
        return None

    def close(self, inbound: Mapping[int, Connection]) -> None:
        """Stop reading, then wait until every payload is sent or its receiver stopped reading.

        A process stops reading only once it has read all it replays, so closing its ends of
        the pipes never takes a range from another; a range decoded ahead beyond an input error
        then fails to send instead of blocking its sender, and no two processes wait on each
        other."""
        for connection in inbound.values():
            connection.close()
        for sender in self._outbound.values():
            sender.close()

    def _decode_next(self) -> bool:
        """Decode this process's next range and send the others their parts; False if none."""
        k = None if self._stopped else next(self._mine, None)
        if k is None:
            return False
        began = time.process_time()
        decoded, payloads = self._decode(k)
        for peer, payload in payloads.items():
            self._outbound[peer].send(payload)
        self.decoding += time.process_time() - began
        self.decoded_lines[k] = decoded.range.decoded
        self._ahead.append(decoded)
        self._stopped = decoded.range.error is not None
        return True

    def _decode(self, k: int) -> tuple[_Decoded, dict[int, bytes]]:
        piece = self.pieces[k]
        source = Source(
            piece.path, max_record_bytes=self.limit, byte_range=(piece.start, piece.end)
        )
        count, index = self.count, self.index
        router = _RangeRouter(index, count)
        skipped = self.replayer.report.skipped  # each range is decoded by one process
        lines: list[list[_Line]] = [[] for _ in range(count)]
        decoded = 0
        error: tuple[int | None, str] | None = None
        number = 0
        documents: list[Decoded] = []
        try:
            for record in source.records():
                number = record.number
                decoded += 1
                router.start_line()
                documents.clear()
                try:
                    spans = parse_json_request(record.data, self.interner, router, documents)
                except Shape as shape:
                    message = _first_fault(record.data, shape)
                    raise MalformedInput(piece.path, record.number, message) from None
                except OtherSignal as other:
                    skipped[other.signal] += 1
                    continue
                for shard, line in enumerate(self._split(spans, documents[0], router)):
                    lines[shard].append(line)
        except MalformedInput as malformed:
            error = (malformed.line, malformed.message)
        read = _Range(source.newlines if error is None else number, decoded, error)
        payloads = {
            shard: pickle.dumps((read, lines[shard]), protocol=pickle.HIGHEST_PROTOCOL)
            for shard in range(count)
            if shard != index
        }
        return _Decoded(read, lines[index]), payloads

    def _split(self, spans: list[Any], decoded: Decoded, router: _RangeRouter) -> list[_Line]:
        """One line for every process: this one's spans and placeholders, and for each other
        the undecoded spans it replays (a part of the request, encoded again) and their places.

        ``spans`` has one entry per span of the request, in order (the reader's placeholder for
        a span of a trace another process replays); the request is walked in the same order.
        A span the range built is this process's, or of a trace the range has not named: that
        one goes to every process, and the line is checked against the replayer's owners
        (:meth:`_replay`).
        """
        count, index = self.count, self.index
        owners = router.owners
        receivers = [shard for shard in range(count) if shard != index]
        places: list[list[Any]] = [[] for _ in range(count)]
        parts: list[list[Any]] = [[] for _ in range(count)]  # resourceSpans of each part
        texts: dict[str, int] = {}  # trace ID text -> shard, for placeholders of non-roots
        checked = False
        position = 0
        sent = 0
        for block in decoded.document["resourceSpans"]:
            block_parts: list[list[Any] | None] = [None] * count
            for scope_block in block.get("scopeSpans", ()):
                scope_parts: list[list[Any] | None] = [None] * count
                for raw in scope_block.get("spans", ()):
                    span = spans[position]
                    position += 1
                    if span is None:  # another's, not a root: its owner was decided here
                        text = raw["traceId"]
                        owner = texts.get(text)
                        if owner is None:
                            # Hex or base64, as the reader read it to route it.
                            owner = texts[text] = owners[cast(int, id_number(text, 16))]
                    elif type(span) is int:  # another's root
                        owner = owners[span]
                    else:
                        context = span._context
                        trace_id = context[0] if context is not None else 0
                        if trace_id and trace_id in owners:  # this process's
                            placeholder = trace_id if span._parent is None else None
                            for shard in receivers:
                                places[shard].append(placeholder)
                            continue
                        # Not named here: every process routes it as the reader does.
                        checked = True
                        owner = -1
                    for shard in receivers:
                        place = places[shard]
                        if shard != owner and owner != -1:
                            place.append(span if type(span) is int else None)
                            continue
                        place.append(0)
                        sent += 1
                        found = scope_parts[shard]
                        if found is None:
                            found = scope_parts[shard] = []
                            shell = {k: v for k, v in scope_block.items() if k != "spans"}
                            shell["spans"] = found
                            block_part = block_parts[shard]
                            if block_part is None:
                                block_part = block_parts[shard] = []
                                outer = {k: v for k, v in block.items() if k != "scopeSpans"}
                                outer["scopeSpans"] = block_part
                                parts[shard].append(outer)
                            block_part.append(shell)
                        found.append(raw)
        self.sent += sent
        decisions = router.decisions
        lines: list[_Line] = []
        for shard in range(count):
            if shard == index:
                lines.append((spans, b"", decisions, checked))
            elif parts[shard]:
                part = encode_document({"resourceSpans": parts[shard]}, decoded.fast)
                lines.append((places[shard], part, decisions, checked))
            else:
                lines.append((places[shard], b"", decisions, checked))
        return lines

    def _receive(self, payload: bytes) -> _Range:
        read, lines = pickle.loads(payload)
        self._replay(lines)
        return cast(_Range, read)

    def _replay(self, lines: list[_Line]) -> None:
        replayer = self.replayer
        interner = self.interner
        for entries, part, decisions, checked in lines:
            try:
                sent = iter(parse_json_request(part, interner) if part else ())
            except (Shape, OtherSignal):
                # A span its decoder did not build (another's) is malformed: the input's first
                # fault is then found by reading it all (replay_sharded).
                raise _Unread from None
            if checked:
                entries = self._checked(entries, sent)  # takes every span of the part
            replayer.add(entries, sent)
            for trace_id, shard in decisions:
                owned = replayer.owner_of(trace_id)
                if owned is None:
                    replayer.decide(trace_id, replayer.owns_shard(shard))
                elif owned is not replayer.owns_shard(shard):
                    # The range named the trace's prompt after another range named another
                    # (of another shard): it sent the trace's spans away from their owner.
                    self.mismatch = True

    def _checked(self, entries: list[Any], sent: Iterator[Any]) -> list[Any]:
        """A line with spans of traces its range had not named, as the replayer routes them:
        a span of a trace it knows to be another's is only a placeholder (as the reader makes
        it)."""
        owners = _Owners(self.replayer)  # asked once per trace
        spans: list[Any] = []
        append = spans.append
        for entry in entries:
            if entry is None:
                append(entry)
                continue
            if type(entry) is int:
                if entry:
                    append(entry)
                    continue
                entry = next(sent)
            context = entry._context
            trace_id = context[0] if context is not None else 0
            if trace_id and owners[trace_id] is False:
                append(trace_id if entry._parent is None else None)
                continue
            append(entry)
        return spans


class _Owners(dict[int, "bool | None"]):
    """The replayer's owner of each trace asked for, asked once (:meth:`Replayer.owner_of`)."""

    __slots__ = ("_replayer",)

    def __init__(self, replayer: Replayer) -> None:
        super().__init__()
        self._replayer = replayer

    def __missing__(self, trace_id: int) -> bool | None:
        owner = self[trace_id] = self._replayer.owner_of(trace_id)
        return owner


def _first_fault(data: bytes, found: Shape) -> str:
    """The fault one process finds first in a line that ``found`` was found in, by a reading
    that skipped the spans of other shards (a skipped span may be malformed too, and earlier)."""
    try:
        parse_json_request(data, Interner())
    except Shape as first:
        return str(first)
    except OtherSignal:
        pass
    return str(found)


class _Unread(Exception):
    """A span that its range's decoder handed over unbuilt is malformed."""


class _RangeRouter:
    """The reader's router while one range is decoded: a trace's owner is the shard of the first
    prompt key that a line of the range names for it, as the replayer's router decides it for a
    whole input (:meth:`Replayer.owns_key`, :func:`_shard_of`)."""

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self.owners: dict[int, int] = {}
        """Trace ID -> shard, for the traces the range has named so far."""
        self.decisions: list[tuple[int, int]] = []
        """The owners the current line decided, in order: (trace ID, shard)."""
        self._shards: deque[int] = deque()

    def start_line(self) -> None:
        self.decisions = []
        self._shards.clear()

    def owner_of(self, trace_id: int) -> bool | None:
        shard = self.owners.get(trace_id)
        return None if shard is None else shard == self.index

    def owns_key(self, key: str) -> bool:
        # The reader asks for each trace it decides, and hands the answers back through
        # decide() in the same order once the line is read whole. (A line the fast decoder
        # declines is looked over twice, with the same keys: the second look's answers follow
        # the first's, which decide() has taken by the time the next line starts.)
        shard = _shard_of(key, self.count)
        self._shards.append(shard)
        return shard == self.index

    def decide(self, trace_id: int, owned: bool) -> None:
        shard = self._shards.popleft()
        self.owners[trace_id] = shard
        self.decisions.append((trace_id, shard))


class _Sender:
    """Sends payloads to one other process from a thread of its own, in the order given."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._payloads: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def send(self, payload: bytes) -> None:
        self._payloads.put(payload)

    def close(self) -> None:
        """Send what is queued, unless the receiver stops reading first; then return."""
        self._payloads.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            payload = self._payloads.get()
            if payload is None:
                return
            try:
                self._connection.send_bytes(payload)
            except (BrokenPipeError, OSError):
                return


def _shard_of(key: str, count: int) -> int:
    """The shard of a prompt key, as :meth:`Replayer.owns_key` decides it."""
    return zlib.crc32(bounded_id(key).encode("utf-8", "replace")) % count


@dataclass(frozen=True, slots=True)
class _PeerResult:
    document: dict[str, Any]
    error: str | None
    mismatch: bool
    unread: bool
    decoded_lines: dict[int, int]
    sent: int
    decoding_cpu: float
    cpu: float


def _run_peer(
    pieces: Sequence[Piece],
    mode: str,
    options: Mapping[str, Any],
    index: int,
    count: int,
    inbound: Mapping[int, Connection],
    outbound: Mapping[int, Connection],
    result: Connection,
    unused: Sequence[Connection],
    limit: int,
) -> None:
    """A process of :func:`replay_ranges`: its report (and what it read) out when done."""
    for connection in unused:  # ends of other processes' pipes, inherited by a fork
        connection.close()
    peer = _Peer(
        pieces, Replayer(mode, shard=(index, count), **options), index, count, outbound, limit
    )
    try:
        error = peer.run(inbound)
        document = peer.replayer.finish().to_json()
        peer.close(inbound)
        result.send(
            _PeerResult(
                document,
                error,
                peer.mismatch,
                peer.unread,
                peer.decoded_lines,
                peer.sent,
                peer.decoding,
                time.process_time(),
            )
        )
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception as failure:
        # A fault of this module, not of the input (input errors are reported as such): the
        # main process sees this process end without its report and reads the input again
        # the whole-input way, which gives one process's report. Named by type only: an
        # exception's text may quote the input.
        print(
            f"otel-guard: replay process {index + 1} of {count} stopped"
            f" ({type(failure).__name__}); every process reads the input again",
            file=sys.stderr,
        )
        return


@dataclass
class RangeReplay:
    """The outcome of :func:`replay_ranges`."""

    document: dict[str, Any]
    error: str | None
    mismatch: bool
    """Whether a range sent a span away from the shard that owns its trace."""
    decoded_lines: list[int]
    """Lines decoded, per range, in read order (each line of the input once)."""
    sent: int = 0
    """Spans one process handed another undecoded (a span of a trace its range did not name
    goes to every other process)."""
    decoding_cpu: float = 0.0
    """CPU seconds spent decoding ranges, all processes together."""
    process_cpu: tuple[float, ...] = ()
    """CPU seconds of each process, decoding included."""
    unread: bool = False
    """Whether a span handed over undecoded was malformed (its decoder does not check it)."""
    lost: bool = False
    """Whether a process ended without its report (a fault of this module, not of the input)."""

    @property
    def exact(self) -> bool:
        """Whether this is the report (and the error) of one process reading the input whole.

        It is not when a range sent a span away from its owner, when a span that a range's
        decoder handed over unbuilt was malformed (that fault may come before the one the
        ranges stopped on, if any), or when a process ended without its report.
        :func:`replay_sharded` then reads the input again the whole-input way."""
        return not (self.mismatch or self.unread or self.lost)


def replay_ranges(
    pieces: Sequence[Piece],
    mode: str,
    options: Mapping[str, Any],
    jobs: int,
    context: Any = None,
    limit: int = DEFAULT_MAX_RECORD_BYTES,
) -> RangeReplay:
    """Decode ``pieces`` and replay their spans in ``jobs`` processes, one shard each."""
    if context is None:
        context = _context()
    # One pipe for each ordered pair of processes: (receiving end, sending end).
    pipes = {
        (sender, receiver): context.Pipe(duplex=False)
        for sender in range(jobs)
        for receiver in range(jobs)
        if sender != receiver
    }
    results = [context.Pipe(duplex=False) for _ in range(jobs)]
    processes = []
    for index in range(jobs):
        inbound = {s: ends[0] for (s, r), ends in pipes.items() if r == index}
        outbound = {r: ends[1] for (s, r), ends in pipes.items() if s == index}
        mine = {id(c) for c in (*inbound.values(), *outbound.values())}
        unused = [c for ends in pipes.values() for c in ends if id(c) not in mine]
        unused += [c for i, ends in enumerate(results) for c in ends if i != index]
        unused.append(results[index][0])
        args = (pieces, mode, dict(options), index, jobs, inbound, outbound, results[index][1])
        process = context.Process(target=_run_peer, args=(*args, unused, limit), daemon=True)
        process.start()
        processes.append(process)
    for ends in pipes.values():
        for connection in ends:
            connection.close()
    for _, sending in results:
        sending.close()
    outcomes: list[_PeerResult] = []
    lost = False
    try:
        for receiving, _ in results:
            try:
                outcomes.append(receiving.recv())
            except EOFError:  # the process ended without its report
                lost = True
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        for receiving, _ in results:
            receiving.close()
    if lost:
        return RangeReplay({}, None, False, [], lost=True)
    decoded: dict[int, int] = {}
    for outcome in outcomes:
        decoded.update(outcome.decoded_lines)
    errors = [outcome.error for outcome in outcomes if outcome.error is not None]
    return RangeReplay(
        merge_reports([outcome.document for outcome in outcomes]),
        errors[0] if errors else None,
        any(outcome.mismatch for outcome in outcomes),
        [decoded[k] for k in sorted(decoded)],
        sum(outcome.sent for outcome in outcomes),
        sum(outcome.decoding_cpu for outcome in outcomes),
        tuple(outcome.cpu for outcome in outcomes),
        any(outcome.unread for outcome in outcomes),
    )


_SPARE_FILES: Final = 16
"""Open files left for what a process opens besides the pipes: its input, the spool of a stream,
the interpreter's own."""


def jobs_within_open_files(jobs: int) -> int:
    """The most processes, up to ``jobs``, whose pipes fit within the soft limit on open files.

    :func:`replay_ranges` opens a pipe for each ordered pair of processes, all at once: about
    2N² + 2N descriptors in the main process (and in each process until it closes those of
    others), so at the common limit of 1,024 more than 21 processes would fail to start. The
    number is lowered rather than the limit raised: the limit is the operator's, and more
    processes than that buy nothing on any machine where it is so low."""
    try:
        import resource
    except ImportError:  # no such limit to respect (Windows)
        return jobs
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return jobs
    try:
        used = len(os.listdir("/dev/fd"))
    except OSError:
        used = 3
    spare = soft - used - _SPARE_FILES
    allowed = jobs
    while allowed > 1 and 2 * allowed * allowed + 2 * allowed + 2 > spare:
        allowed -= 1
    return allowed


def _context() -> Any:
    # Fork where there is one: the workers start without importing everything again.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
