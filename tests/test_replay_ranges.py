"""``--jobs N`` decodes plain input by byte range: each line once, the report of one process."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_replay_shards import replay_json, replay_status, write_prompts

from otel_guard.cli import main
from otel_guard.replay import shards
from otel_guard.replay.report import merge_reports
from otel_guard.replay.shards import Piece, plan, replay_ranges, replay_shard

RANGE = 3000  # bytes: the test files are a few dozen KiB, so each file has many ranges


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "RANGE_BYTES", RANGE)


@pytest.fixture(scope="module")
def two_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One export split in two files in the middle: traces and prompts cross the file."""
    directory = tmp_path_factory.mktemp("ranges")
    whole = write_prompts(directory / "whole.jsonl", 40, per_line=5)
    lines = whole.read_text(encoding="utf-8").splitlines(keepends=True)
    first, second = directory / "a.jsonl", directory / "b.jsonl"
    first.write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    # Blank lines too: line numbers count them, ranges may start on one.
    second.write_text("\n\n" + "".join(lines[len(lines) // 2 :]), encoding="utf-8")
    return [first, second]


def _trace_ids(path: Path, piece: Piece) -> set[str]:
    with path.open("rb") as stream:
        stream.seek(piece.start)
        text = stream.read(piece.end - piece.start).decode("utf-8")
    return {
        span["traceId"]
        for line in text.splitlines()
        if line.strip()
        for block in json.loads(line)["resourceSpans"]
        for scope in block["scopeSpans"]
        for span in scope["spans"]
    }


def test_jobs_give_the_report_of_one_process_with_traces_across_ranges_and_files(
    two_files: list[Path], small_ranges: None, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [str(path) for path in two_files]
    pieces = plan(paths, RANGE)
    assert pieces is not None and len(pieces) > 6
    assert {piece.file_index for piece in pieces} == {0, 1}
    # The input does what the test is about: traces whose spans are in several ranges, and
    # a trace in both files.
    seen = [_trace_ids(two_files[piece.file_index], piece) for piece in pieces]
    crossing = [a & b for a, b in itertools.pairwise(seen)]
    assert sum(1 for common in crossing if common) >= 3
    last_of_first = max(i for i, piece in enumerate(pieces) if piece.file_index == 0)
    assert seen[last_of_first] & seen[last_of_first + 1]

    one = replay_json(capsys, "--sweep", *paths)
    assert one["prompts"] == 40 and one["prompts_would_stop"] == 30
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--sweep", "--jobs", jobs, *paths) == one
    assert main(["replay", "--format", "text", *paths]) == 0
    text = capsys.readouterr().out
    assert main(["replay", "--format", "text", "--jobs", "2", *paths]) == 0
    assert capsys.readouterr().out == text


def test_ids_written_in_base64_give_the_report_of_one_process(
    two_files: list[Path], tmp_path: Path, small_ranges: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # The contract reads trace and span IDs in hex or base64; a process that routes the spans
    # it hands over reads them as the reader does.
    paths = []
    for path in two_files:
        lines = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                lines.append(line)
                continue
            request = json.loads(line)
            for block in request["resourceSpans"]:
                for scope in block["scopeSpans"]:
                    for span in scope["spans"]:
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if span.get(key):
                                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
            lines.append(json.dumps(request))
        written = tmp_path / path.name
        written.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(str(written))
    one = replay_json(capsys, *paths)
    assert one["prompts"] == 40 and one["prompts_would_stop"] == 30
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--jobs", jobs, *paths) == one


def test_each_line_is_decoded_once_whatever_the_jobs(two_files: list[Path]) -> None:
    paths = [str(path) for path in two_files]
    lines = sum(1 for path in two_files for line in path.open() if line.strip())
    pieces = plan(paths, RANGE)
    assert pieces is not None
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.error is None and not ranged.mismatch
    # Every range decoded by one process, and every line by one range: the lines decoded add
    # up to the lines of the input (reading all input in each process would make it twice).
    assert len(ranged.decoded_lines) == len(pieces)
    assert sum(ranged.decoded_lines) == lines
    assert max(ranged.decoded_lines) < lines / 4
    assert ranged.document["prompts"] == 40


def test_a_malformed_line_in_a_later_range_names_its_file_and_line(
    two_files: list[Path], tmp_path: Path, small_ranges: None, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = two_files
    lines = second.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = len(lines) * 2 // 3  # well inside a later range of the second file
    lines[bad] = '{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}\n'
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines), encoding="utf-8")
    pieces = plan([str(first), str(broken)], RANGE)
    assert pieces is not None
    assert [p.start for p in pieces if p.file_index == 1].index(0) == 0
    assert sum(1 for p in pieces if p.file_index == 1 and p.start < broken.stat().st_size) > 2

    code, one, err = replay_status(capsys, str(first), str(broken))
    message = f"{broken}:{bad + 1}: resourceSpans[0].scopeSpans[0].spans[0]: expected an object"
    assert (code, err.splitlines()[0]) == (1, message) and one["error"] == message
    assert one["complete"] is False and one["spans"] > 0
    for jobs in ("2", "3"):
        assert replay_status(capsys, "--jobs", jobs, str(first), str(broken)) == (code, one, err)


def test_a_file_that_cannot_be_read_stops_the_ranges_as_one_process(
    two_files: list[Path], tmp_path: Path, small_ranges: None, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    paths = [str(two_files[0]), str(missing)]
    one = replay_status(capsys, *paths)
    assert one[0] == 1 and "missing.jsonl: cannot read" in one[2]
    assert replay_status(capsys, "--jobs", "2", *paths) == one


def test_compressed_input_is_read_whole_by_every_process_with_the_same_report(
    two_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(two_files[1].read_bytes()))
    paths = [str(two_files[0]), str(packed)]
    assert plan(paths) is None  # a gzip file cannot be split by byte range
    one = replay_json(capsys, *paths)
    assert replay_json(capsys, "--jobs", "2", *paths) == one


def _span(trace: str, span: str, parent: str, name: str, **attributes: Any) -> dict[str, Any]:
    return {
        "traceId": trace,
        "spanId": span,
        "parentSpanId": parent,
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000100000000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }


def _prompts_of_shards() -> tuple[str, str]:
    """Two prompt keys whose shards of two differ: the first of shard 0, the second of shard 1."""
    first, second = (
        next(f"prompt-{n}" for n in range(100) if shards._shard_of(f"prompt-{n}", 2) == shard)
        for shard in (0, 1)
    )
    return first, second


def _write_one_span_a_line(path: Path, spans: list[dict[str, Any]]) -> None:
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [{}]}]}]}
    with path.open("w", encoding="utf-8") as out:
        for span in spans:
            request["resourceSpans"][0]["scopeSpans"][0]["spans"] = [span]
            out.write(json.dumps(request) + "\n")


def test_a_trace_that_names_another_prompt_in_a_later_range_is_replayed_again_whole(
    tmp_path: Path, small_ranges: None, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = _prompts_of_shards()
    trace = "ab" * 16
    path = tmp_path / "two-prompts.jsonl"
    lines = [_span(trace, f"{1:016x}", f"{9:016x}", "early", **{"acp.prompt.id": first})]
    lines += [_span(trace, f"{n + 2:016x}", f"{9:016x}", "filler") for n in range(60)]
    lines += [_span(trace, f"{70:016x}", f"{9:016x}", "late", **{"acp.prompt.id": second})]
    _write_one_span_a_line(path, lines)
    pieces = plan([str(path)], RANGE)
    assert pieces is not None and len(pieces) > 2
    # The last range names the second prompt: it sends the trace's spans to the other shard.
    assert replay_ranges(pieces, "shadow", {}, 2).mismatch
    one = replay_status(capsys, str(path))
    assert one[1]["spans"] == 62
    assert replay_status(capsys, "--jobs", "2", str(path)) == one


def test_spans_of_a_trace_named_in_an_earlier_range_reach_only_its_owner(
    tmp_path: Path, small_ranges: None
) -> None:
    # The first range names the prompts of two traces, one of each shard; the later ranges hold
    # more of their spans and never name them. Their decoders cannot tell whose spans they are,
    # so every process gets them, and each must route them by what its replayer already knows,
    # as the reader does in replay_shard: the other shard's trace as placeholders only. Kept
    # instead, it would take one of the open traces a replayer may hold, and with room for one
    # the shard's own trace would be pushed out early (a bound one process does not hit).
    first, second = _prompts_of_shards()
    traces = {first: "cd" * 16, second: "ef" * 16}
    spans = [
        _span(trace, f"{1:016x}", f"{99:016x}", "named", **{"acp.prompt.id": key})
        for key, trace in traces.items()
    ]
    spans += [
        _span(trace, f"{n + 2:016x}", f"{99:016x}", "later")
        for n in range(40)
        for trace in traces.values()
    ]
    spans += [_span(trace, f"{99:016x}", "", "root") for trace in traces.values()]
    path = tmp_path / "named-early.jsonl"
    _write_one_span_a_line(path, spans)
    pieces = plan([str(path)], RANGE)
    assert pieces is not None and len(pieces) > 4
    options = {"max_open_traces": 1}
    ranged = replay_ranges(pieces, "shadow", options, 2)
    shards_read = [replay_shard([str(path)], "shadow", options, i, 2).document for i in (0, 1)]
    assert ranged.exact and ranged.document == merge_reports(shards_read)
    assert ranged.document["spans"] == len(spans)


def test_a_process_that_fails_leaves_the_report_of_one_process(
    two_files: list[Path],
    small_ranges: None,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A fault of the ranges' own code (not of the input) in one process: it says so in one
    # line, and the input is read again the whole-input way, so the report is still exact.
    paths = [str(path) for path in two_files]
    assert main(["replay", "--format", "json", *paths]) == 0
    one = json.loads(capfd.readouterr().out)

    split = shards._Peer._split

    def failing(peer: Any, *args: Any) -> Any:
        if peer.index == 1:
            raise RuntimeError("a fault of the ranges' code")
        return split(peer, *args)

    monkeypatch.setattr(shards._Peer, "_split", failing)
    pieces = plan(paths, RANGE)
    assert pieces is not None
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.lost and not ranged.exact
    capfd.readouterr()
    assert main(["replay", "--format", "json", "--jobs", "2", *paths]) == 0
    captured = capfd.readouterr()
    assert json.loads(captured.out) == one
    assert captured.err.strip().splitlines() == [
        "otel-guard: replay process 2 of 2 stopped (RuntimeError); every process reads the"
        " input again"
    ]


def test_a_process_replays_the_spans_of_its_own_ranges_without_sending_them(
    two_files: list[Path],
) -> None:
    paths = [str(path) for path in two_files]
    spans = sum(
        len(scope["spans"])
        for path in two_files
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
        for block in json.loads(line)["resourceSpans"]
        for scope in block["scopeSpans"]
    )
    pieces = plan(paths, RANGE)
    assert pieces is not None
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.error is None and not ranged.mismatch and ranged.document["spans"] == spans
    # A span crosses to the other process only when its range's decoder does not replay its
    # shard (about half of them), or when its range has not named its trace's prompt. Handing
    # every span from decoders to replayers would send at least as many as were read.
    assert 0 < ranged.sent < 0.75 * spans
    assert len(ranged.process_cpu) == 2 and all(cpu > 0 for cpu in ranged.process_cpu)


def _break_spans(path: Path, *, own_too: bool = False) -> tuple[list[str], int]:
    """The lines of ``path`` with a span of a trace of the second of two shards made malformed,
    in a line that names the trace's prompt; with ``own_too``, a span of the first shard later
    in the same line too. Returns the lines and the index of the line."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines):
        if number < 4 or not line.strip():
            continue  # a line well after the first
        request = json.loads(line)
        spans = [s for b in request["resourceSpans"] for c in b["scopeSpans"] for s in c["spans"]]
        named = {
            span["traceId"]: shards._shard_of(attribute["value"]["stringValue"], 2)
            for span in spans
            for attribute in span.get("attributes", [])
            if attribute["key"] == "acp.prompt.id"
        }
        other = next((i for i, s in enumerate(spans) if named.get(s["traceId"]) == 1), None)
        if other is None:
            continue
        later = range(other + 1, len(spans))
        own = next((i for i in later if named.get(spans[i]["traceId"]) == 0), None)
        if own_too and own is None:
            continue
        spans[other]["startTimeUnixNano"] = "soon"
        if own_too and own is not None:
            spans[own]["endTimeUnixNano"] = "later"
        lines[number] = json.dumps(request) + "\n"
        return lines, number
    raise AssertionError("no line names prompts of both shards")


def test_a_malformed_span_its_decoder_hands_over_unbuilt_is_found_as_by_one_process(
    two_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A range's decoder builds only its own shard's spans and those of traces the range has not
    # named; the others it hands over as they were written. A fault in one of those must still
    # stop the replay where one process stops, with its message.
    lines, target = _break_spans(two_files[0])
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines), encoding="utf-8")

    # One range, decoded by the first process, which does not build the broken span.
    pieces = plan([str(broken)])
    assert pieces is not None and len(pieces) == 1
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.unread and not ranged.exact

    code, one, err = replay_status(capsys, str(broken))
    assert code == 1 and err.startswith(f"{broken}:{target + 1}: ")
    for jobs in ("2", "3"):
        assert replay_status(capsys, "--jobs", jobs, str(broken)) == (code, one, err)


def test_spans_handed_over_unbuilt_are_written_again_as_their_decoder_read_them() -> None:
    from otel_guard.replay.otlp_json import encode_document

    # The standard library reads what the fast decoder declines (NaN, infinities, integers
    # beyond 64 bits); it must write them so that they read back the same.
    text = '{"a": [NaN, Infinity, -Infinity, 123456789012345678901234567890, "\\u00e9", 1.5]}'
    document = json.loads(text)
    again = json.loads(encode_document(document, fast=False))
    assert again["a"][3:] == document["a"][3:] and type(again["a"][3]) is int
    assert again["a"][0] != again["a"][0] and again["a"][1:3] == [float("inf"), float("-inf")]
    orjson = pytest.importorskip("orjson")
    fast = orjson.loads(b'{"b": [1, 2.5, "x", {"c": null, "d": true}, 18446744073709551615]}')
    assert orjson.loads(encode_document(fast, fast=True)) == fast


def test_a_line_only_the_standard_library_reads_replays_alike_in_several_processes(
    two_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A NaN attribute on every span: the fast decoder declines each line, the standard library
    # reads it, and the spans handed over are written again by the standard library.
    text = two_files[0].read_text(encoding="utf-8")
    nan = '{"key": "x.nan", "value": {"doubleValue": NaN}}, '
    path = tmp_path / "nan.jsonl"
    path.write_text(text.replace('"attributes": [', '"attributes": [' + nan), encoding="utf-8")
    assert "NaN" in path.read_text(encoding="utf-8")
    one = replay_json(capsys, str(path))
    assert one["prompts"] > 0
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--jobs", jobs, str(path)) == one
    # Read by byte range, not again the whole-input way after a fault.
    pieces = plan([str(path)])
    assert pieces is not None
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.exact and ranged.sent > 0
    assert ranged.document["decisions"] == one["decisions"]
    assert ranged.document["spans"] == one["spans"] and ranged.document["prompts"] == one["prompts"]


def test_a_fault_a_decoder_finds_after_one_it_skipped_is_reported_as_the_first(
    two_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The decoder skips the first malformed span (another shard's) and stops on a later one of
    # its own: the error it reports is still the line's first fault, as one process words it.
    lines, target = _break_spans(two_files[0], own_too=True)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines), encoding="utf-8")
    code, one, err = replay_status(capsys, str(broken))
    assert code == 1 and err.startswith(f"{broken}:{target + 1}: ")
    assert "startTimeUnixNano" in err.splitlines()[0]

    pieces = plan([str(broken)])
    assert pieces is not None and len(pieces) == 1
    ranged = replay_ranges(pieces, "shadow", {}, 2)
    assert ranged.exact and ranged.error == err.splitlines()[0]
    for jobs in ("2", "3"):
        assert replay_status(capsys, "--jobs", jobs, str(broken)) == (code, one, err)


def test_a_file_is_cut_into_ranges_of_about_one_mib_each_ending_after_a_newline(
    tmp_path: Path,
) -> None:
    # Ranges of 1 MiB whatever the number of processes (docs/design.md, "Byte ranges"): a
    # range's spans stay in the caches until they are replayed, and a small file is not cut
    # into slivers for many processes.
    line = '{"resourceSpans": []}' + " " * 999 + "\n"  # 1,022 bytes, so no range ends evenly
    path = tmp_path / "three-mib.jsonl"
    path.write_text(line * 3100, encoding="utf-8")  # about 3.02 MiB
    size = path.stat().st_size
    pieces = plan([str(path)])
    assert pieces is not None and len(pieces) == 4
    assert pieces[0].start == 0 and pieces[-1].end == size
    data = path.read_bytes()
    for before, after in itertools.pairwise(pieces):
        assert before.end == after.start and data[before.end - 1 : before.end] == b"\n"
    for piece in pieces[:-1]:
        assert shards.RANGE_BYTES <= piece.end - piece.start < shards.RANGE_BYTES + len(line)
    assert shards.RANGE_BYTES == 1024 * 1024


def test_more_jobs_than_the_open_file_limit_allows_run_as_many_as_it_allows(
    two_files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight processes need more than 100 pipe ends at once; under a soft limit of 64 open files
    the replay runs as many as fit, says how many, and reports as one process does."""
    resource = pytest.importorskip("resource")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 64
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip("the hard limit on open files is below the test's")
    one = replay_json(capsys, *map(str, two_files))

    def lower_the_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    command = [sys.executable, "-m", "otel_guard", "replay", "--format", "json", "--jobs", "8"]
    completed = subprocess.run(
        [*command, *map(str, two_files)],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lower_the_limit,
    )
    assert "Traceback" not in completed.stderr
    assert completed.returncode == 0, completed.stderr
    notice = re.fullmatch(
        r"replay: --jobs 8 would open more files than ulimit -n allows:"
        r" replaying in (\d+) process(es)?\n",
        completed.stderr,
    )
    assert notice is not None, completed.stderr
    assert 1 <= int(notice.group(1)) < 8
    assert json.loads(completed.stdout) == one
