"""Replaying in several processes and merging reports: the same report as one replay."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness
from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.cli import main
from otel_guard.replay.otlp_json import encode_request
from otel_guard.replay.report import BOUNDS, merge_reports, render_text
from otel_guard.replay.shards import replay_shard

EDIT = Call(tool="edit", error_type="conflict")
NOV_30 = 1_764_460_800 * 10**9  # 2025-11-30T00:00:00Z


def write_prompts(path: Path, prompts: int, *, per_line: int = 9) -> Path:
    """Prompts whose batches are separate traces (no prompt span joins them), written as an
    exporter would: lines of a few spans each, traces interleaved across prompts."""
    harness = Harness(mode="shadow")
    shapes = [
        [[FAIL] * 4] * 5,  # would_warn, would_stop, then saved calls
        [[FAIL] * 4, [FAIL] * 4, [FAIL] * 4, [OK]],  # recovers after would_stop
        [[FAIL] * 2, [OK], [EDIT] * 3],
        [[FAIL] * 4, [FAIL] * 4, [EDIT] * 4, [EDIT] * 4, [EDIT] * 4],  # a second candidate
    ]
    for round_ in range(5):
        for n in range(prompts):
            batches = shapes[n % len(shapes)]
            if round_ < len(batches):
                harness.batch(f"prompt-{n:03d}", batches[round_])
    spans = list(harness.span_exporter.get_finished_spans())
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, len(spans), per_line):
            out.write(json.dumps(encode_request(spans[start : start + per_line])) + "\n")
    return path


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["replay", "--format", "json", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document: dict[str, Any] = json.loads(captured.out)
    return document


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("shards") / "prompts.jsonl", 40)


def test_jobs_give_exactly_the_report_of_one_process(
    prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = replay_json(capsys, "--sweep", str(prompts_file))
    assert one["prompts"] == 40
    assert one["prompts_would_stop"] == 30 and one["self_recovered_after_would_stop"] == 10
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--sweep", "--jobs", jobs, str(prompts_file)) == one


def test_a_prompt_whose_batches_are_separate_traces_is_replayed_whole_by_one_shard(
    prompts_file: Path,
) -> None:
    shards = [
        replay_shard([str(prompts_file)], "shadow", {}, index, 2).document for index in (0, 1)
    ]
    # Both shards got work, and neither saw a prompt in part: each prompt that would stop
    # (five batches, each its own trace) reached would_stop in the shard that owns it.
    assert all(0 < shard["prompts"] < 40 for shard in shards)
    assert sum(shard["prompts"] for shard in shards) == 40
    assert sum(shard["prompts_would_stop"] for shard in shards) == 30
    assert sum(shard["traces"] for shard in shards) == 10 * (5 + 4 + 3 + 5)
    for shard in shards:
        assert shard["decisions"]["would_stop"] == shard["prompts_would_stop"]
        assert shard["invariant_violations"] == 0


def test_reports_merge_associatively_into_the_one_process_report(prompts_file: Path) -> None:
    options = {"sweep": (4, 8)}
    whole = replay_shard([str(prompts_file)], "shadow", options, 0, 1).document
    a, b, c = (
        replay_shard([str(prompts_file)], "shadow", options, i, 3).document for i in range(3)
    )
    assert merge_reports([a, b, c]) == whole
    assert merge_reports([merge_reports([a, b]), c]) == whole
    assert merge_reports([a, merge_reports([b, c])]) == whole
    assert merge_reports([c, a, b]) == whole


def test_merge_command_combines_shard_reports_written_elsewhere(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = replay_json(capsys, str(prompts_file))
    paths = []
    for index in range(2):
        document = replay_shard([str(prompts_file)], "shadow", {}, index, 2).document
        document.update(files=[str(prompts_file)], error=None)
        path = tmp_path / f"shard-{index}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        paths.append(str(path))
    assert main(["merge", *paths]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged.pop("files") == [str(prompts_file)] * 2
    assert len(set(merged.pop("parts"))) == 2  # what the merge adds up, one per shard
    assert {k: v for k, v in merged.items()} == {k: v for k, v in whole.items() if k != "files"}
    assert main(["merge", "--format", "text", *paths]) == 0
    assert "invariant violations: 0" in capsys.readouterr().out


def test_merge_refuses_reports_of_other_modes_or_constants(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shadow = tmp_path / "shadow.json"
    enforce = tmp_path / "enforce.json"
    shadow.write_text(json.dumps(replay_json(capsys, str(prompts_file))), encoding="utf-8")
    enforce.write_text(
        json.dumps(replay_json(capsys, "--mode", "enforce", str(prompts_file))), encoding="utf-8"
    )
    assert main(["merge", str(shadow), str(enforce)]) == 6  # left out; the rest merged
    assert capsys.readouterr().err == (
        f"{enforce}: left out of the merge: replayed with mode 'enforce', the others 'shadow'\n"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    assert main(["merge", str(shadow), str(broken)]) == 1
    assert capsys.readouterr().err.startswith(f"{broken}: not a JSON report (")


def test_jobs_read_standard_input_once(prompts_file: Path) -> None:
    command = [sys.executable, "-m", "otel_guard", "replay", "--format", "json"]
    from_file = subprocess.run(
        [*command, str(prompts_file)], capture_output=True, text=True, check=True
    )
    with open(prompts_file, "rb") as stdin:
        piped = subprocess.run(
            [*command, "--jobs", "2", "-"], stdin=stdin, capture_output=True, text=True, check=True
        )
    expected = json.loads(from_file.stdout)
    got = json.loads(piped.stdout)
    assert got.pop("files") == ["-"] and expected.pop("files") == [str(prompts_file)]
    assert got == expected


@pytest.fixture(scope="module")
def stream_inputs(prompts_file: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The prompts file plain and gzip-compressed, each with its one-process report."""
    compressed = prompts_file.with_name("prompts.jsonl.gz")
    compressed.write_bytes(gzip.compress(prompts_file.read_bytes(), mtime=0))
    inputs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for name, path in (("plain", prompts_file), ("gzip", compressed)):
        code, document, error = _replay_subprocess([str(path)])
        assert code == 0, error
        document.pop("files")
        inputs[name] = (path, document)
    return inputs


def _replay_subprocess(argv: list[str], timeout: float = 60) -> tuple[int, dict[str, Any], str]:
    """The CLI in a process of its own (and its replay processes in its session, stopped with
    it if it hangs)."""
    command = [sys.executable, "-m", "otel_guard", "replay", "--format", "json", *argv]
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail(f"replay {' '.join(argv)} still running after {timeout} s")
    return process.returncode, json.loads(out), err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("jobs", ["2", "3"])
@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_jobs_read_a_fifo_once(
    stream_inputs: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path, kind: str, jobs: str
) -> None:
    """A FIFO named as a path is read once by the main process: each replay process opening it
    would read a part of the stream, or wait for a writer that is gone."""
    path, expected = stream_inputs[kind]
    fifo = tmp_path / "traces.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as out:
            out.write(path.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    code, document, error = _replay_subprocess(["--jobs", jobs, str(fifo)])
    writer.join(timeout=10)
    assert code == 0, error
    assert document.pop("files") == [str(fifo)]
    assert document == expected


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
@pytest.mark.parametrize("jobs", ["2", "3"])
@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_jobs_read_a_pipe_named_as_a_path_once(
    stream_inputs: dict[str, tuple[Path, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
    kind: str,
    jobs: str,
) -> None:
    """A pipe given as ``/dev/fd/N`` (as ``<(...)`` gives it) is read once, as ``-`` is."""
    path, expected = stream_inputs[kind]
    reading, writing = os.pipe()
    try:
        # The writer is a process of its own: its end of the pipe is not inherited by the
        # replay's processes, so the stream ends when it is written.
        with subprocess.Popen(["cat", str(path)], stdout=writing) as cat:
            os.close(writing)
            writing = -1
            code, document, error = replay_status(capsys, "--jobs", jobs, f"/dev/fd/{reading}")
    finally:
        os.close(reading)
        if writing != -1:
            os.close(writing)
    assert cat.returncode == 0
    assert code == 0, error
    assert document.pop("files") == [f"/dev/fd/{reading}"]
    assert document == expected


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_stream_that_cannot_be_copied_whole_is_one_line_and_a_report(
    prompts_file: Path, tmp_path: Path
) -> None:
    """With --jobs a stream is copied into a temporary file first: a copy that fails midway (a
    full disk; here a limit on file size) is said in one line naming the input, and what was
    copied is replayed and reported, as a file that cannot be read to its end."""
    import resource

    data = prompts_file.read_bytes()
    limit = len(data) // 3
    fifo = tmp_path / "traces.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        # The replay stops reading where its copy failed.
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as out:
            out.write(data)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    replay = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_guard",
            "replay",
            "--jobs",
            "2",
            "--format",
            "json",
            str(fifo),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )
    writer.join(timeout=10)
    assert replay.returncode == 1, replay.stderr
    assert replay.stderr.splitlines() == [f"{fifo}: cannot read it whole (File too large)"]
    report = json.loads(replay.stdout)
    assert report["complete"] is False and report["spans"] > 0


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_jobs_stop_on_zero_bytes_as_one_process_does(capsys: pytest.CaptureFixture[str]) -> None:
    """A character device is read once too, and one that gives zeros forever is read only as
    far as a replay reads it."""
    one = replay_status(capsys, "/dev/zero")
    assert one[0] == 1 and one[1]["error"].startswith("/dev/zero:65: not trace input")
    assert replay_status(capsys, "--jobs", "2", "/dev/zero") == one


def test_merge_writes_the_html_report_of_the_merged_shards(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the HTML page needs the 'html' extra")
    paths = []
    for index in range(2):
        document = replay_shard([str(prompts_file)], "shadow", {"sweep": (4, 8)}, index, 2)
        path = tmp_path / f"shard-{index}.json"
        path.write_text(json.dumps(document.document), encoding="utf-8")
        paths.append(str(path))
    page = tmp_path / "merged.html"
    assert main(["merge", "--html", str(page), *paths]) == 0
    merged = json.loads(capsys.readouterr().out)
    text = page.read_text(encoding="utf-8")
    # Three plots, the totals of the merged report, and no script at all.
    assert text.count('<div class="plot"') == 3
    assert (
        f"<td>prompts would_stop / stopped</td><td>{merged['prompts_would_stop']} / 0</td>" in text
    )
    assert "<script" not in text


def test_requests_of_other_signals_are_reported_skipped_once_whatever_the_jobs(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = prompts_file.read_text(encoding="utf-8").splitlines()
    log = '{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"stringValue":"x"}}]}]}]}'
    mixed = tmp_path / "mixed.jsonl"
    # Logs and metrics between the trace lines, as a Collector writing every signal to one file.
    with open(mixed, "w", encoding="utf-8") as out:
        for number, line in enumerate(lines):
            out.write(line + "\n")
            if number % 3 == 0:
                out.write(log + "\n")
            if number % 7 == 0:
                out.write('{"resourceMetrics":[]}\n')
    logs, metrics = len(range(0, len(lines), 3)), len(range(0, len(lines), 7))
    expected = {"logs": logs, "metrics": metrics, "profiles": 0}
    plain = replay_json(capsys, str(prompts_file))
    assert plain["skipped"] == {"logs": 0, "metrics": 0, "profiles": 0}
    one = replay_json(capsys, str(mixed))
    assert one["skipped"] == expected
    assert {k: v for k, v in one.items() if k not in ("skipped", "files")} == {
        k: v for k, v in plain.items() if k not in ("skipped", "files")
    }
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--jobs", jobs, str(mixed)) == one
    # Shards replayed apart (other files, other machines) add their counts up.
    assert merge_reports([one, one])["skipped"] == {k: 2 * v for k, v in expected.items()}
    assert main(["replay", str(mixed)]) == 0
    text = capsys.readouterr().out
    assert f"requests of other signals skipped (not traces): logs {logs}  metrics {metrics}\n" in (
        text
    )
    assert main(["replay", str(prompts_file)]) == 0
    assert "other signals skipped" not in capsys.readouterr().out


def replay_status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(["replay", "--format", "json", *argv])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


@pytest.mark.parametrize("per_line", [1, 2, 50])
def test_traces_spread_over_lines_before_their_prompt_is_named_are_replayed_alike(
    per_line: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One span a line: a trace's tool spans are read lines before the batch span naming its
    # prompt, so a process builds them before it knows whose they are.
    path = write_prompts(tmp_path / f"spread-{per_line}.jsonl", 12, per_line=per_line)
    one = replay_json(capsys, str(path))
    assert one["prompts"] == 12 and one["prompts_would_stop"] == 9
    for jobs in ("2", "3"):
        assert replay_json(capsys, "--jobs", jobs, str(path)) == one


def test_a_shard_builds_only_the_spans_of_its_own_traces(prompts_file: Path) -> None:
    from otel_guard.replay.reader import TraceReader
    from otel_guard.replay.replayer import Replayer

    total = sum(len(line.spans) for line in TraceReader([str(prompts_file)]))
    built = []
    for index in (0, 1):
        replayer = Replayer("shadow", shard=(index, 2))
        count = 0
        for line in TraceReader([str(prompts_file)], router=replayer):
            count += sum(1 for span in line.spans if isinstance(span, ReadableSpan))
            replayer.add(line.spans)
        report = replayer.finish()
        built.append(count)
        # It replays only spans it built; it builds the others only while their trace names
        # no prompt yet (here, tool spans read in lines before their batch span).
        assert report.total["spans"] <= count
    assert all(0 < count < total for count in built)
    assert sum(built) < 1.3 * total, (built, total)


def test_a_malformed_span_of_another_shards_trace_stops_every_shard_at_its_line(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = prompts_file.read_text(encoding="utf-8").splitlines()
    middle = len(lines) // 2
    request = json.loads(lines[middle])
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    # A span of a trace whose prompt the line names: the shard that does not own it skips it.
    named = {
        span["traceId"]
        for span in spans
        if any(entry["key"] == "acp.prompt.id" for entry in span.get("attributes", []))
    }
    index = next(i for i, span in enumerate(spans) if span["traceId"] in named)
    spans[index]["kind"] = "SPAN_KIND_BOGUS"
    lines[middle] = json.dumps(request)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    message = (
        f"{broken}:{middle + 1}: resourceSpans[0].scopeSpans[0].spans[{index}].kind:"
        " unknown name 'SPAN_KIND_BOGUS'"
    )
    # Alone, the shard that does not own the trace reads past the line; the other stops there.
    alone = [replay_shard([str(broken)], "shadow", {}, i, 2) for i in (0, 1)]
    assert sorted(str(result.error) for result in alone) == sorted([message, "None"])
    code, one, err = replay_status(capsys, str(broken))
    assert (code, err) == (1, message + "\n") and one["error"] == message
    assert 0 < one["spans"] < sum(len(json.loads(line)["resourceSpans"]) for line in lines) * 999
    for jobs in ("2", "3"):
        assert replay_status(capsys, "--jobs", jobs, str(broken)) == (code, one, err)


def test_a_shard_describes_malformed_trace_ids_as_one_process_does(
    prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = prompts_file.read_text(encoding="utf-8").splitlines()
    request = json.loads(lines[3])
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["traceId"] = [spans[1]["traceId"]]  # not even hashable
    spans[-1]["traceId"] = "zz"
    lines[3] = json.dumps(request)
    broken = tmp_path / "ids.jsonl"
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, one, err = replay_status(capsys, str(broken))
    assert (code, err) == (
        1,
        f"{broken}:4: resourceSpans[0].scopeSpans[0].spans[1].traceId: expected 32 hex digits\n",
    )
    for jobs in ("2", "3"):
        assert replay_status(capsys, "--jobs", jobs, str(broken)) == (code, one, err)


HOUR = 3600 * 10**9


def _failing_batch(index: int, start: int) -> list[dict[str, Any]]:
    """One prompt of one batch with one failed call (decision ``tracked``): a batch span and its
    tool span, as OTLP/JSON."""
    trace = f"{index + 1:032x}"
    batch, call = f"{2 * index + 1:016x}", f"{2 * index + 2:016x}"

    def attribute(key: str, value: object) -> dict[str, Any]:
        if isinstance(value, bool):
            return {"key": key, "value": {"boolValue": value}}
        if isinstance(value, int):
            return {"key": key, "value": {"intValue": str(value)}}
        return {"key": key, "value": {"stringValue": value}}

    return [
        {
            "traceId": trace,
            "spanId": call,
            "parentSpanId": batch,
            "name": "execute_tool run",
            "kind": 1,
            "startTimeUnixNano": str(start + 1000),
            "endTimeUnixNano": str(start + 2000),
            "attributes": [
                attribute("gen_ai.operation.name", "execute_tool"),
                attribute("gen_ai.tool.name", "run"),
                attribute("gen_ai.tool.call.id", f"call-{index}"),
                attribute("acp.tool.type", "native"),
                attribute("acp.tool.status", "error"),
                attribute("acp.tool.execution.status", "error"),
                attribute("acp.tool.execution.error_type", "exit_nonzero"),
            ],
            "status": {"code": 2},
        },
        {
            "traceId": trace,
            "spanId": batch,
            "name": "batch",
            "kind": 1,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 3000),
            "attributes": [
                attribute("acp.prompt.id", f"p{index}"),
                attribute("acp.batch.admitted", 1),
                attribute("acp.input.reliable", True),
                attribute("acp.input.external", False),
                attribute("acp.input.queued_prompt", False),
            ],
        },
    ]


@pytest.fixture(scope="module")
def spread_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20,100 prompts 4.5 hours apart: 20,100 hour buckets over 3,769 days, past both the
    timeline's bound (20,000) and the days' (3,660); each line's prompts written latest first,
    so that the days and hours read first are not always the earliest (the clock stays within a
    line's three weeks, which every process replays alike)."""
    order = [i for line in range(0, 20_100, 100) for i in reversed(range(line, line + 100))]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]}
    path = tmp_path_factory.mktemp("spread") / "spread.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, len(order), 100):
            spans = [
                span
                for index in order[start : start + 100]
                for span in _failing_batch(index, NOV_30 + index * 9 * HOUR // 2)
            ]
            block = {"resource": resource, "scopeSpans": [{"scope": {"name": "a"}, "spans": spans}]}
            out.write(json.dumps({"resourceSpans": [block]}) + "\n")
    return path


def test_day_and_timeline_bounds_are_the_same_for_one_process_jobs_and_a_merge(
    spread_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["replay", "--format", "json", str(spread_file)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    one = json.loads(captured.out)
    assert one["prompts"] == 20_100 and one["decisions"]["tracked"] == 20_100
    days = one["by_day"]
    assert len(days) == 3_661 and min(days) == "2025-11-30"  # the earliest days, then "other"
    assert one["bounds"]["report_days"] == days["other"]["spans"] + days["other"]["batches"] > 0
    assert len(one["timeline"]) == 20_000 and one["timeline"][0]["hour"] == "2025-11-30T00:00Z"
    assert one["bounds"]["timeline"] == 100
    for name in ("report_days", "timeline"):
        assert f"replay: {BOUNDS[name]}" in captured.err
    assert "bounds hit" in render_text(one)

    # Prompts that never end expire at the end of input on each process's own clock: the
    # `expired` diagnostic may differ (docs/design.md, the limits of shards).
    one.pop("diagnostics")
    jobs = replay_json(capsys, "--jobs", "2", str(spread_file))
    assert set(jobs.pop("diagnostics")) == {"expired"}
    assert jobs == one
    paths = []
    for index in range(2):
        document = replay_shard([str(spread_file)], "shadow", {}, index, 2).document
        assert 0 < document["prompts"] < 20_100
        document.update(files=[str(spread_file)], error=None, complete=True)
        paths.append(str(tmp_path / f"shard-{index}.json"))
        Path(paths[-1]).write_text(json.dumps(document), encoding="utf-8")
    assert main(["merge", "--format", "json", *paths]) == 0
    captured = capsys.readouterr()
    merged = json.loads(captured.out)
    assert merged.pop("files") == [str(spread_file)] * 2 and len(merged.pop("parts")) == 2
    merged.pop("diagnostics")
    assert merged == {k: v for k, v in one.items() if k != "files"}
    for name in ("report_days", "timeline"):
        assert f"replay: {BOUNDS[name]}" in captured.err
