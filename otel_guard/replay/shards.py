"""Replaying in several processes: each reads all input and replays one shard of the prompts.

A shard is the set of traces whose prompt ID hashes (CRC-32, the same in every process) to its
index, so every trace of a prompt, and so every batch of it, is replayed by one process, and the
shards' reports add up to one process's report (:func:`otel_guard.replay.report.merge_reports`).
Each process decodes every line but builds only the spans of its own traces (the replayer is the
reader's :class:`~otel_guard.replay.otlp_json.Router`).
``docs/design.md`` ("Replay report, what-if and shards") gives the reasons and the limits.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from otel_guard.replay.reader import MalformedInput, TraceReader
from otel_guard.replay.replayer import Replayer
from otel_guard.replay.report import merge_reports

__all__ = ["ShardResult", "replay_shard", "replay_sharded"]


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
    """Replay in ``jobs`` processes; returns the merged report, the input error (every process
    reads the same input; the earliest error found holds for all) and whether the replay was
    interrupted."""
    # Fork where there is one: the workers start without importing everything again.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
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
