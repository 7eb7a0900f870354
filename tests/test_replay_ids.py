"""Prompt IDs of any length replay in memory that does not grow with their length: an ID over
``ID_CHARS_LIMIT`` is kept as a fixed-size digest, in buffers, shards and the report alike."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from test_replay_report import LOOP, record, spans_of

from otel_guard.cli import main
from otel_guard.replay.otlp_json import encode_request
from otel_guard.replay.reader import TraceReader
from otel_guard.replay.recorded import ID_CHARS_LIMIT, bounded_id
from otel_guard.replay.replayer import Replayer
from otel_guard.spans import attributes as attr


def _lines(names: dict[str, str], prompts: int) -> list[str]:
    """Request lines of ``prompts`` looping prompts, each ID replaced as ``names`` says (by the
    prompt's index), one trace per line."""
    harness = record({f"p{i}": LOOP for i in range(prompts)})
    by_trace: dict[int, list[Any]] = {}
    for span in spans_of(harness):
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span)
    lines = []
    for spans in by_trace.values():
        document = encode_request(spans)
        for block in document["resourceSpans"]:
            for scope in block["scopeSpans"]:
                for span in scope["spans"]:
                    for item in span.get("attributes", []):
                        if item["key"] == attr.PROMPT_ID:
                            value = item["value"]["stringValue"]
                            item["value"]["stringValue"] = names.get(value, value)
        lines.append(json.dumps(document))
    return lines


def _long(index: int, size: int = 100_000) -> str:
    # Every ID shares its first 64 characters and more: only the digest tells them apart.
    return "x" * (size - 8) + f"{index:08d}"


def test_bounded_id_keeps_short_ids_and_digests_long_ones_to_a_fixed_size() -> None:
    short = "p" * ID_CHARS_LIMIT
    assert bounded_id(short) == short
    first, second = bounded_id(_long(1)), bounded_id(_long(2))
    assert first != second and len(first) == len(second) < ID_CHARS_LIMIT
    assert first.startswith("x" * 64 + "~sha256:")
    assert bounded_id(first) == first  # a digest is kept as it is


def test_long_ids_replay_to_the_decisions_of_short_ones_with_digests_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = 6
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(_lines({}, prompts)) + "\n", encoding="utf-8")
    long = tmp_path / "long.jsonl"
    names = {f"p{i}": _long(i) for i in range(prompts)}
    long.write_text("\n".join(_lines(names, prompts)) + "\n", encoding="utf-8")
    reports = []
    for path in (short, long):
        assert main(["replay", "--format", "json", str(path)]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    expected, got = reports
    for key in ("spans", "prompts", "batches", "decisions", "prompts_would_stop"):
        assert got[key] == expected[key], key
    assert got["prompts"] == prompts
    assert got["bounds"]["prompt_ids"] > 0 and expected["bounds"]["prompt_ids"] == 0
    sampled = {entry["prompt_id"] for entry in got["would_stop_prompts"]}
    assert sampled == {bounded_id(name) for name in names.values()}
    assert main(["replay", "--format", "json", "--jobs", "2", str(long)]) == 0
    sharded = json.loads(capsys.readouterr().out)
    sharded["files"] = got["files"]
    assert sharded == got


def test_buffered_spans_do_not_hold_long_ids(tmp_path: Path) -> None:
    prompts = 60
    names = {f"p{i}": _long(i) for i in range(prompts)}
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(_lines(names, prompts)) + "\n", encoding="utf-8")
    replayer = Replayer("shadow")
    tracemalloc.start()
    try:
        for line in TraceReader([str(path)]):
            replayer.add(line.spans)
        assert replayer.open_traces == prompts  # all waiting for the reorder window
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Without the bound: every buffered span holds its 100 KB ID, over 30 MB in all.
    assert current < 8 * 1024 * 1024
    report = replayer.finish().to_json()
    assert report["prompts"] == prompts
