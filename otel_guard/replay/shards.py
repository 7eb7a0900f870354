"""Replaying in several processes: the input decoded in byte ranges, the prompts in shards.

**Plain JSON-lines files** (the common case) are split at line boundaries into ranges of a few
MiB (:func:`plan`). A pool of ``jobs`` processes decodes the ranges, each range once
(:func:`decode_range`), and hands every replaying process, in read order, the compact fields of
the spans it replays and a placeholder for each of the others (:func:`replay_ranges`). Where a
range names a trace's prompt, the spans of that trace go to its shard only; the spans of a trace
not yet named there go to every shard, which routes them as the reader does (the replayer's
:class:`~otel_guard.replay.otlp_json.Router`). The replaying processes therefore see exactly the
stream of :func:`replay_shard`.

**Other input** (gzip, zstd, length-prefixed frames; several of them mixed with plain files)
cannot be split by byte range: :func:`replay_sharded` then lets each process read all input and
replay one shard of the prompts, as below.

A shard is the set of traces whose prompt ID hashes (CRC-32, the same in every process) to its
index, so every trace of a prompt, and so every batch of it, is replayed by one process, and the
shards' reports add up to one process's report (:func:`otel_guard.replay.report.merge_reports`).
Each process decodes every line but builds only the spans of its own traces (the replayer is the
reader's :class:`~otel_guard.replay.otlp_json.Router`).
``docs/design.md`` ("Replay report, what-if and shards") gives the reasons and the limits.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import stat
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any, Final

from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Status

from otel_guard.replay.otlp_json import parse_json_request
from otel_guard.replay.reader import MalformedInput, TraceReader
from otel_guard.replay.recorded import (
    KINDS,
    OK_STATUS,
    STATUS,
    TRACE_FLAGS,
    UNSET_STATUS,
    Interner,
    OtherSignal,
    RecordedSpan,
    Shape,
    bounded_id,
    span_context,
)
from otel_guard.replay.replayer import Replayer, prompt_key
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
    "Decoded",
    "Piece",
    "RangeReplay",
    "ShardResult",
    "decode_range",
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

    Plain JSON-lines files are decoded by byte range (:func:`replay_ranges`); other input, or
    a range that sent a span away from the shard that owns its trace (a trace naming several
    prompts), is replayed again with every process reading all input (:func:`replay_shard`).
    """
    context = _context()
    pieces = plan(files, jobs, RANGE_BYTES)
    if pieces is not None:
        ranged = replay_ranges(pieces, mode, options, jobs, context)
        if not ranged.mismatch:
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

RANGE_BYTES: Final = 8 * 1024 * 1024
"""The largest range decoded at a time (the smallest is 1 MiB): several per process, so that
the processes stay busy alike and the ranges in flight stay few."""

_MIN_RANGE_BYTES: Final = 1024 * 1024
_IN_FLIGHT_PER_JOB: Final = 2


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


def plan(files: Sequence[str], jobs: int, range_bytes: int = RANGE_BYTES) -> list[Piece] | None:
    """The ranges of ``files`` in read order, or ``None`` when one of them cannot be split."""
    if not all(splittable(path) for path in files):
        return None
    pieces: list[Piece] = []
    for index, path in enumerate(files):
        size = os.path.getsize(path)
        step = max(min(_MIN_RANGE_BYTES, range_bytes), min(range_bytes, -(-size // (jobs * 4))))
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


# A span as handed to the process that replays it: name, trace ID, span ID, flags, parent span
# ID (0 for none), resource index, scope index, attributes, kind, status code, status
# description, start, end, events (name, attributes, time). A span another shard replays is a
# placeholder instead: its trace ID for a root, its negated trace ID otherwise.
_Compact = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Decoded:
    """What :func:`decode_range` tells the main process about its range, and the payloads."""

    newlines: int
    lines: int
    """Non-blank lines decoded (the test of each range being decoded once)."""
    error: tuple[int | None, str] | None
    """The input error that stopped the range: (line within the range, message)."""
    payloads: list[bytes]
    """One per shard: the pickled lines of compact spans and placeholders for that shard."""
    sent: int = 0
    """Compact spans in the payloads: a span a range sends to every shard counts once each."""
    cpu: float = 0.0
    """CPU seconds of the decoding (for benchmarks)."""


def decode_range(piece: Piece, count: int, limit: int = DEFAULT_MAX_RECORD_BYTES) -> Decoded:
    """Decode the lines of one range, and sort its spans into ``count`` shards' payloads."""
    began = time.process_time()
    source = Source(piece.path, max_record_bytes=limit, byte_range=(piece.start, piece.end))
    interner = Interner()
    resources: dict[int, int] = {}  # id(resource) -> index in resource_list
    resource_list: list[tuple[dict[str, Any], str]] = []
    scopes: dict[int, int] = {}
    scope_list: list[tuple[str, str | None, str | None]] = []
    owners: dict[int, int] = {}  # trace ID -> shard, where this range names its prompt
    skipped: Counter[str] = Counter()
    lines: list[list[tuple[list[Any], list[tuple[int, int]]]]] = [[] for _ in range(count)]
    decoded = 0
    error: tuple[int | None, str] | None = None
    number = 0
    try:
        for record in source.records():
            number = record.number
            decoded += 1
            try:
                spans = parse_json_request(record.data, interner)
            except Shape as shape:
                raise MalformedInput(piece.path, record.number, str(shape)) from None
            except OtherSignal as other:
                skipped[other.signal] += 1
                continue
            # The line's decisions first, as the reader's router makes them: each trace not yet
            # named goes with the first prompt key of the line.
            decisions: list[tuple[int, int]] = []
            for span in spans:
                context = span._context
                if context is None or context[0] in owners:
                    continue
                key = prompt_key(span)
                if key is not None:
                    shard = _shard_of(key, count)
                    owners[context[0]] = shard
                    decisions.append((context[0], shard))
            entries: list[list[Any]] = [[] for _ in range(count)]
            for span in spans:
                compact = _compact(span, resources, resource_list, scopes, scope_list)
                trace_id = compact[1]
                owner = owners.get(trace_id) if trace_id else None
                if owner is None:
                    for shard_entries in entries:
                        shard_entries.append(compact)
                    continue
                placeholder = trace_id if span._parent is None else -trace_id
                for index, shard_entries in enumerate(entries):
                    shard_entries.append(compact if index == owner else placeholder)
            for index in range(count):
                lines[index].append((entries[index], decisions))
    except MalformedInput as malformed:
        error = (malformed.line, malformed.message)
    newlines = source.newlines if error is None else number
    payloads = [
        pickle.dumps(
            (resource_list, scope_list, lines[index], skipped if index == 0 else Counter()),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        for index in range(count)
    ]
    sent = sum(1 for shard in lines for entries, _ in shard for e in entries if type(e) is tuple)
    return Decoded(newlines, decoded, error, payloads, sent, time.process_time() - began)


def _shard_of(key: str, count: int) -> int:
    """The shard of a prompt key, as :meth:`Replayer.owns_key` decides it."""
    return zlib.crc32(bounded_id(key).encode("utf-8", "replace")) % count


def _compact(
    span: Any,
    resources: dict[int, int],
    resource_list: list[tuple[dict[str, Any], str]],
    scopes: dict[int, int],
    scope_list: list[tuple[str, str | None, str | None]],
) -> _Compact:
    resource = span._resource
    r = resources.get(id(resource))
    if r is None:
        r = resources[id(resource)] = len(resource_list)
        resource_list.append((dict(resource.attributes), resource.schema_url))
    scope = span._instrumentation_scope
    s = scopes.get(id(scope))
    if s is None:
        s = scopes[id(scope)] = len(scope_list)
        scope_list.append((scope.name, scope.version, scope.schema_url))
    context = span._context
    parent = span._parent
    status = span._status
    events = span._events
    return (
        span._name,
        context[0],
        context[1],
        int(context[3]),
        0 if parent is None else parent[1],
        r,
        s,
        span._attributes,
        span._kind.value,
        status.status_code.value,
        status.description,
        span._start_time,
        span._end_time,
        tuple((e.name, dict(e.attributes or {}), e.timestamp) for e in events) if events else (),
    )


class _Rebuilder:
    """Turns one shard's payloads back into spans and placeholders, routing what is undecided."""

    def __init__(self, replayer: Replayer) -> None:
        self.replayer = replayer
        self.interner = Interner()
        self.mismatch = False
        """Whether a range sent elsewhere a span of a trace this shard owns (a trace naming
        several prompts, or named only after its first part was replayed)."""

    def add(self, payload: bytes) -> None:
        resource_list, scope_list, lines, skipped = pickle.loads(payload)
        replayer = self.replayer
        replayer.report.skipped.update(skipped)
        interner = self.interner
        resources = [interner.resource(a, schema) for a, schema in resource_list]
        scopes = [interner.scope(*fields) for fields in scope_list]
        owner_of = replayer.owner_of
        for entries, decisions in lines:
            spans: list[Any] = []
            append = spans.append
            for entry in entries:
                if type(entry) is int:
                    if owner_of(abs(entry)):
                        self.mismatch = True
                    append(entry if entry > 0 else None)
                    continue
                trace_id = entry[1]
                if trace_id and owner_of(trace_id) is False:
                    append(trace_id if not entry[4] else None)
                    continue
                append(_rebuild(entry, resources, scopes))
            replayer.add(spans)
            for trace_id, shard in decisions:
                if owner_of(trace_id) is None:
                    replayer.decide(trace_id, replayer.owns_shard(shard))


def _rebuild(entry: _Compact, resources: list[Any], scopes: list[Any]) -> RecordedSpan:
    (name, trace_id, span_id, flags, parent_id, r, s, attributes, kind, code, message) = entry[:11]
    trace_flags = TRACE_FLAGS[flags]
    span = RecordedSpan(
        name,
        span_context(trace_id, span_id, trace_flags),
        span_context(trace_id, parent_id, trace_flags) if parent_id else None,
        resources[r],
        attributes,
        KINDS[kind],
        UNSET_STATUS if code == 0 else OK_STATUS if code == 1 else Status(STATUS[code], message),
        entry[11],
        entry[12],
        scopes[s],
    )
    if entry[13]:
        span._events = tuple(Event(n, a, t) for n, a, t in entry[13])
    return span


def _reduce(
    connection: Connection, mode: str, options: Mapping[str, Any], index: int, count: int
) -> None:
    """A replaying process: payloads in, until ``None``; then its report out."""
    replayer = Replayer(mode, shard=(index, count), **options)
    rebuilder = _Rebuilder(replayer)
    try:
        while True:
            payload = connection.recv_bytes()
            if not payload:
                break
            rebuilder.add(payload)
        document = replayer.finish().to_json()
        connection.send((document, rebuilder.mismatch, time.process_time()))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


@dataclass
class RangeReplay:
    """The outcome of :func:`replay_ranges`."""

    document: dict[str, Any]
    error: str | None
    mismatch: bool
    decoded_lines: list[int]
    """Lines decoded, per range, in read order (each line of the input once)."""
    sent: int = 0
    """Compact spans handed to the shards (the spans read, plus one per extra shard for a span
    whose range did not name its trace's prompt)."""
    decoding_cpu: float = 0.0
    """CPU seconds of the decoding processes, all ranges together."""
    replaying_cpu: tuple[float, ...] = ()
    """CPU seconds of each replaying process."""


def replay_ranges(
    pieces: Sequence[Piece],
    mode: str,
    options: Mapping[str, Any],
    jobs: int,
    context: Any = None,
) -> RangeReplay:
    """Decode ``pieces`` in ``jobs`` processes and replay their spans in ``jobs`` shards."""
    if context is None:
        context = _context()
    connections = []
    reducers = []
    for index in range(jobs):
        mine, theirs = context.Pipe()
        process = context.Process(
            target=_reduce, args=(theirs, mode, dict(options), index, jobs), daemon=True
        )
        process.start()
        theirs.close()
        connections.append(mine)
        reducers.append(process)
    queues: list[queue.Queue[bytes]] = [queue.Queue(maxsize=jobs * 2) for _ in range(jobs)]
    feeders = [
        threading.Thread(target=_feed, args=(q, c), daemon=True)
        for q, c in zip(queues, connections, strict=True)
    ]
    for feeder in feeders:
        feeder.start()
    error: str | None = None
    decoded_lines: list[int] = []
    sent = 0
    decoding_cpu = 0.0
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            ahead: deque[Future[Decoded]] = deque()
            waiting = iter(pieces)
            offsets: dict[int, int] = {}  # index of the file -> newlines of its ranges read
            current = list(pieces)
            for piece in current:
                while len(ahead) < jobs * _IN_FLIGHT_PER_JOB:
                    following = next(waiting, None)
                    if following is None:
                        break
                    ahead.append(pool.submit(decode_range, following, jobs))
                result = ahead.popleft().result()
                decoded_lines.append(result.lines)
                sent += result.sent
                decoding_cpu += result.cpu
                for q, payload in zip(queues, result.payloads, strict=True):
                    q.put(payload)
                offset = offsets.get(piece.file_index, 0)
                if result.error is not None:
                    line, message = result.error
                    where = piece.path if line is None else f"{piece.path}:{line + offset}"
                    error = f"{where}: {message}"
                    for future in ahead:
                        future.cancel()
                    break
                offsets[piece.file_index] = offset + result.newlines
        for q in queues:
            q.put(b"")
        for feeder in feeders:
            feeder.join()
        outcomes = [connection.recv() for connection in connections]
    finally:
        for process in reducers:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        for connection in connections:
            connection.close()
    document = merge_reports([outcome[0] for outcome in outcomes])
    mismatch = any(outcome[1] for outcome in outcomes)
    replaying = tuple(outcome[2] for outcome in outcomes)
    return RangeReplay(document, error, mismatch, decoded_lines, sent, decoding_cpu, replaying)


def _feed(payloads: queue.Queue[bytes], connection: Connection) -> None:
    while True:
        payload = payloads.get()
        try:
            connection.send_bytes(payload)
        except (BrokenPipeError, OSError):
            return
        if not payload:
            return


def _context() -> Any:
    # Fork where there is one: the workers start without importing everything again.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
