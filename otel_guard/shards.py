"""Replaying in several processes: each reads all input and replays one shard of the prompts.

A shard is the set of traces whose prompt ID hashes (CRC-32, the same in every process) to its
index, so every trace of a prompt, and so every batch of it, is replayed by one process, and the
shards' reports add up to one process's report (:func:`otel_guard.report.merge_reports`).
``docs/design.md`` ("Replay report, what-if and shards") gives the reasons and the limits.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from otel_guard.otlp_json import MalformedInput, OtlpJsonReader
from otel_guard.replay import Replayer
from otel_guard.report import merge_reports

__all__ = ["ShardResult", "replay_shard", "replay_sharded"]


@dataclass(frozen=True)
class ShardResult:
    """One shard's report, and the input error that stopped its reading, if any."""

    document: dict[str, Any]
    error: str | None = None
    interrupted: bool = False


def replay_shard(
    files: Sequence[str], mode: str, options: Mapping[str, Any], index: int, count: int
) -> ShardResult:
    """Read every span of ``files`` and replay the traces of shard ``index`` of ``count``."""
    replayer = Replayer(mode, shard=(index, count), **options)
    reader = OtlpJsonReader(files)
    error: str | None = None
    interrupted = False
    try:
        for line in reader:
            replayer.add(line.spans)
    except MalformedInput as malformed:
        error = str(malformed)
    except KeyboardInterrupt:
        interrupted = True
    if index == 0:
        # Every process reads every request: one of them counts the skipped ones, once.
        replayer.report.skipped.update(reader.skipped)
    return ShardResult(replayer.finish().to_json(), error, interrupted)


def replay_sharded(
    files: Sequence[str], mode: str, options: Mapping[str, Any], jobs: int
) -> tuple[dict[str, Any], str | None, bool]:
    """Replay in ``jobs`` processes; returns the merged report, the input error (every process
    reads the same input, so they agree on it) and whether the replay was interrupted."""
    # Fork where there is one: the workers start without importing everything again.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [
            pool.submit(replay_shard, list(files), mode, dict(options), index, jobs)
            for index in range(jobs)
        ]
        results = [future.result() for future in futures]
    errors = [r.error for r in results if r.error is not None]
    document = merge_reports([r.document for r in results])
    return document, errors[0] if errors else None, any(r.interrupted for r in results)
