"""The ``otel-guard`` command through its real entry points: ``main(argv)``, the console script."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_guard.cli import main
from otel_guard.guard.telemetry import DECISION_VALUES
from otel_guard.reducer import RESET_REASONS
from otel_guard.replay.replayer import INVARIANTS

MODES = ("off", "shadow", "warn", "enforce")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "replay", "--format", "json", *argv)
    return code, json.loads(out), err


def timeline_decisions(demo_output: str) -> Counter[str]:
    """Decision values as printed on the demo's timeline, one per batch line."""
    counts: Counter[str] = Counter()
    for match in re.finditer(r"^\s+-> (\w+)", demo_output, re.MULTILINE):
        value = match.group(1)
        if value in DECISION_VALUES:
            counts[value] += 1
    return counts


def summary_of(demo_output: str) -> str:
    """The demo's summary report (after the timeline, before the trailing note)."""
    summary = demo_output.split("\nsummary\n", 1)[1]
    return summary.split("\n\nspans written to ", 1)[0].rstrip("\n")


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Per mode: the demo's OTLP/JSON output and its printed timeline."""
    files: dict[str, tuple[Path, str]] = {}
    folder = tmp_path_factory.mktemp("demo")
    for mode in MODES:
        path = folder / f"demo-{mode}.jsonl"
        capture = folder / f"demo-{mode}.txt"
        with open(capture, "w", encoding="utf-8") as stream:
            completed = subprocess.run(
                [sys.executable, "-m", "otel_guard", "demo", "--mode", mode, "--out", str(path)],
                stdout=stream,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        assert completed.returncode == 0, completed.stderr
        files[mode] = (path, capture.read_text(encoding="utf-8"))
    return files


def explode(lines: list[str]) -> list[str]:
    """Rewrite requests so that each line holds exactly one span (same resource and scope)."""
    out: list[str] = []
    for line in lines:
        for block in json.loads(line)["resourceSpans"]:
            for scope in block["scopeSpans"]:
                for span in scope["spans"]:
                    single = {
                        "resourceSpans": [
                            {
                                "resource": block["resource"],
                                "scopeSpans": [{"scope": scope["scope"], "spans": [span]}],
                            }
                        ]
                    }
                    out.append(json.dumps(single))
    return out


# -- demo ---------------------------------------------------------------------------------------


def test_enforce_demo_warns_then_stops_the_loop(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "demo", "--mode", "enforce")
    assert (code, err) == (0, "")
    loop = out.split("prompt-loop:", 1)[1].split("\n\n", 1)[0]
    assert "-> warned  [8 failures in 2 batches]   host: reminder sent to the model" in loop
    assert "-> stopped  [12 failures in 3 batches]   host: automatic continuation stopped" in loop
    assert "batch 4" not in loop  # the host really stopped the prompt
    counts = timeline_decisions(out)
    assert counts["warned"] == 3 and counts["stopped"] == 1
    assert counts["would_warn"] == 0


def test_shadow_demo_records_only_would_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert out.startswith("otel-guard demo, mode shadow\n")
    counts = timeline_decisions(out)
    assert counts["would_warn"] == 3 and counts["would_stop"] == 2
    assert counts["warned"] == 0 and counts["stopped"] == 0
    assert "host: reminder" not in out and "host: automatic continuation stopped" not in out
    loop = out.split("prompt-loop:", 1)[1].split("\n\n", 1)[0]
    assert "batch 5" in loop  # nothing stopped the loop in shadow


def test_demo_covers_every_required_session(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "demo", "--mode", "enforce")
    assert "reset (cancelled)" in out.split("prompt-permission:", 1)[1].split("\n\n", 1)[0]
    assert "reset (success)" in out.split("prompt-recovery:", 1)[1].split("\n\n", 1)[0]
    channel = out.split("prompt-channel:", 1)[1].split("\n\n", 1)[0]
    assert channel.count("not guarded (guard off for this prompt)") == 3
    old_host = out.split("prompt-old-host:", 1)[1].split("\n\n", 1)[0]
    assert "reset (unreliable_input)" in old_host
    # An unreliable input drain disables enforcement: recorded, never stopped.
    assert "-> would_stop" in old_host and "-> stopped" not in old_host
    assert "invariant violations: 0" in out


def test_demo_reports_what_stopping_would_save_in_shadow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(capsys, "demo")
    assert "would-stop prompts, 2: prompt-loop (8 calls after) trace " in out
    assert "would-warn prompts (not warned), 3: prompt-loop," in out
    assert "warned prompts" not in out
    assert "  stopped prompts:" not in out


# -- replay of the demo's own output ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_replay_of_the_demo_output_reproduces_the_demo_decisions(
    mode: str, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, demo_output = demo_files[mode]
    code, report, err = replay_json(capsys, "--mode", mode, str(path))
    assert (code, err) == (0, "")
    expected = {value: timeline_decisions(demo_output)[value] for value in DECISION_VALUES}
    assert report["decisions"] == expected
    code, text, _ = run(capsys, "replay", "--mode", mode, str(path))
    assert code == 0
    verdict_line, inputs_line, blank, rest = text.split("\n", 3)
    assert verdict_line.startswith("verdict: PASS (invariants 0, inputs read completely")
    assert (inputs_line, blank) == (f"inputs: {path}, read completely", "")
    assert rest.rstrip("\n") == summary_of(demo_output)


def test_replay_in_enforce_stops_a_loop_recorded_in_shadow(
    demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = demo_files["shadow"]
    _, report, _ = replay_json(capsys, "--mode", "enforce", str(path))
    # The recorded loop went on for two batches of four calls after the stop decision.
    assert report["decisions"]["stopped"] == 1
    assert report["saved"]["tool_calls"] == 8
    # The old host's prompt was downgraded to would_stop: never listed or counted as stopped.
    assert [p["prompt_id"] for p in report["stopped_prompts"]] == ["prompt-loop"]
    assert [p["prompt_id"] for p in report["would_stop_prompts"]] == ["prompt-old-host"]
    assert (report["prompts_stopped"], report["prompts_would_stop"]) == (1, 1)


def test_replay_default_mode_is_shadow(
    demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, report, _ = replay_json(capsys, str(demo_files["enforce"][0]))
    assert report["mode"] == "shadow"
    assert report["decisions"]["warned"] == 0 and report["decisions"]["would_warn"] == 3


# -- input forms --------------------------------------------------------------------------------


def test_gzip_and_several_files_read_as_one_stream(
    tmp_path: Path, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = demo_files["enforce"]
    lines = source.read_text(encoding="utf-8").splitlines()
    first = tmp_path / "part-1.jsonl.gz"
    second = tmp_path / "part-2.jsonl"
    with gzip.open(first, "wt", encoding="utf-8") as stream:
        stream.write("\n".join(lines[:3]) + "\n")
    second.write_text("\n".join(lines[3:]) + "\n", encoding="utf-8")
    _, whole, _ = replay_json(capsys, "--mode", "enforce", str(source))
    code, parts, err = replay_json(capsys, "--mode", "enforce", str(first), str(second))
    assert (code, err) == (0, "")
    assert parts["files"] == [str(first), str(second)]
    for key in ("spans", "traces", "prompts", "batches", "decisions", "reset_reasons"):
        assert parts[key] == whole[key], key


def test_a_trace_split_across_two_files_is_replayed_whole(
    tmp_path: Path, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = demo_files["enforce"]
    spans = explode(source.read_text(encoding="utf-8").splitlines())
    # The first trace is the loop prompt; cut its spans in the middle of a batch.
    first_trace = json.loads(spans[0])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    in_first = [
        i
        for i, line in enumerate(spans)
        if json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
        == first_trace
    ]
    cut = in_first[len(in_first) // 2]
    (tmp_path / "a.jsonl").write_text("\n".join(spans[:cut]) + "\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("\n".join(spans[cut:]) + "\n", encoding="utf-8")
    _, whole, _ = replay_json(capsys, "--mode", "enforce", str(source))
    code, split, _ = replay_json(
        capsys, "--mode", "enforce", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    )
    assert code == 0
    assert split["traces"] == whole["traces"] == 6
    assert split["decisions"] == whole["decisions"]
    assert split["decisions"]["stopped"] == 1


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_out_of_order_lines_replay_to_the_same_decisions(
    seed: int,
    tmp_path_factory: pytest.TempPathFactory,
    demo_files: dict[str, tuple[Path, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, demo_output = demo_files["enforce"]
    spans = explode(source.read_text(encoding="utf-8").splitlines())
    random.Random(seed).shuffle(spans)
    shuffled = tmp_path_factory.mktemp("shuffled") / "spans.jsonl"
    shuffled.write_text("\n".join(spans) + "\n", encoding="utf-8")
    code, report, _ = replay_json(capsys, "--mode", "enforce", str(shuffled))
    assert code == 0
    assert report["decisions"] == {
        value: timeline_decisions(demo_output)[value] for value in DECISION_VALUES
    }
    assert report["invariant_violations"] == 0


def test_an_empty_file_gives_an_empty_report_and_exit_3_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n", encoding="utf-8")
    code, report, err = replay_json(capsys, str(empty), str(blank))
    assert (code, err) == (3, f"{empty}, {blank}: no spans read (--allow-empty accepts it)\n")
    assert (report["spans"], report["prompts"], report["batches"], report["traces"]) == (0, 0, 0, 0)
    assert set(report["decisions"].values()) == {0}
    assert report["groups"] == [] and report["error"] is None and report["complete"] is True
    code, report, err = replay_json(capsys, "--allow-empty", str(empty), str(blank))
    assert (code, err, report["spans"]) == (0, "", 0)
    code, text, _ = run(capsys, "replay", str(empty))
    assert code == 3 and "spans 0  prompts 0  batches 0" in text
    assert "verdict: FAIL, exit 3 (no spans read" in text


# -- malformed input ----------------------------------------------------------------------------

GOOD_TRACE = "0af7651916cd43dd8448eb211c80319c"
SPANS_PATH = "resourceSpans[0].scopeSpans[0].spans[0]"


def request(span: object = None, **fields: object) -> str:
    """One request line holding ``span``, or a valid span changed by ``fields``."""
    if span is None:
        span = {
            "traceId": GOOD_TRACE,
            "spanId": "b7ad6b7169203331",
            "name": "s",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            **fields,
        }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"resourceSpans": [', "invalid JSON (Expecting value at column 20)"),
        ('{"resourceSpans": "', "invalid JSON (Unterminated string starting at column 19)"),
        ("[1, 2]", "request: expected an object"),
        ('{"resourceMetric": []}', "not a trace export request (no resourceSpans)"),
        ('{"resourceSpans": {}}', "resourceSpans: expected an array"),
        (request("span"), f"{SPANS_PATH}: expected an object"),
        (request(traceId="zz" * 16), f"{SPANS_PATH}.traceId: expected 32 hex digits"),
        (request(spanId="b7ad6b71"), f"{SPANS_PATH}.spanId: expected 16 hex digits"),
        (request(traceId="0" * 32), f"{SPANS_PATH}.traceId: an all-zero ID is invalid"),
        (
            request(startTimeUnixNano="x"),
            f"{SPANS_PATH}.startTimeUnixNano: expected an unsigned integer"
            " (number or decimal string)",
        ),
        (
            request(attributes=[{"key": "n", "value": {"intValue": "ten"}}]),
            f"{SPANS_PATH}.attributes[0].value.intValue: expected an integer"
            " (number or decimal string)",
        ),
    ],
)
def test_a_malformed_line_names_file_and_line_and_keeps_the_partial_report(
    bad_line: str,
    message: str,
    tmp_path: Path,
    demo_files: dict[str, tuple[Path, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = demo_files["enforce"][0].read_text(encoding="utf-8").splitlines()
    path = tmp_path / "traces.jsonl"
    # Two good traces, a blank line, the bad line (line 4), then more that is never read.
    path.write_text("\n".join([good[0], good[1], "", bad_line, *good[2:]]) + "\n", "utf-8")
    _, first_two, _ = replay_json(capsys, "--mode", "enforce", str(demo_files["enforce"][0]))
    code, report, err = replay_json(capsys, "--mode", "enforce", str(path))
    assert code == 1
    assert err == f"{path}:4: {message}\n"
    assert report["error"] == f"{path}:4: {message}"
    expected_spans = sum(
        len(s["spans"])
        for line in good[:2]
        for block in json.loads(line)["resourceSpans"]
        for s in block["scopeSpans"]
    )
    assert report["spans"] == expected_spans < first_two["spans"]
    assert report["traces"] == 2
    assert report["decisions"]["stopped"] == 1  # the loop prompt, read before the bad line


def test_malformed_input_in_text_format_still_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    code, out, err = run(capsys, "replay", str(path))
    assert code == 1
    assert err == f"{path}:1: not a trace export request (no resourceSpans)\n"
    assert "invariant violations: 0" in out
    assert out.rstrip("\n").endswith(
        f"input stopped early: {path}:1: not a trace export request (no resourceSpans)"
    )


def test_a_missing_file_is_named_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.jsonl"
    code, report, err = replay_json(capsys, str(missing))
    assert code == 1
    assert err == f"{missing}: cannot read (No such file or directory)\n"
    assert report["spans"] == 0


def test_a_truncated_gzip_file_names_the_line_it_broke_on(
    tmp_path: Path, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    data = gzip.compress(demo_files["shadow"][0].read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) - 20])
    code, report, err = replay_json(capsys, str(path))
    assert code == 1
    assert re.fullmatch(
        re.escape(str(path)) + r":\d+: compressed data ends early \(truncated gzip file\)\n", err
    )
    assert report["spans"] > 0


def test_a_subprocess_malformed_run_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"resourceSpans": [1]}\n', encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-m", "otel_guard", "replay", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1
    assert completed.stderr == f"{path}:1: resourceSpans[0]: expected an object\n"
    assert "invariant violations: 0" in completed.stdout


def test_text_on_the_first_line_is_named_by_its_line_as_any_other_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text("not json\n" + request() + "\n", encoding="utf-8")
    code, report, err = replay_json(capsys, str(path))
    assert code == 1
    assert err.startswith(f"{path}:1: text, not trace input (starts 'not json'); ")
    assert report["error"] == err.rstrip("\n")


def test_a_file_name_with_a_newline_or_escape_is_escaped_once_wherever_it_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad\nname\x1b[31m.jsonl"
    path.write_text("{}\n", encoding="utf-8")
    shown = str(path).replace("\n", "\\x0a").replace("\x1b", "\\x1b")
    code, out, err = run(capsys, "replay", str(path))
    assert code == 1
    assert err == f"{shown}:1: not a trace export request (no resourceSpans)\n"
    verdict, inputs = out.splitlines()[:2]
    assert verdict.startswith(f"verdict: FAIL, exit 1 (input stopped early: {shown}:1: not a")
    assert inputs.startswith(f"inputs: {shown}; input stopped early: {shown}:1: not a")
    assert "\x1b" not in out
    code, report, _ = replay_json(capsys, str(path))
    assert report["files"] == [str(path)]  # the report's data keeps the name as it is
    assert report["error"].startswith(f"{path}:1: ")


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_standard_input_is_replayed_from_a_pipe_as_the_file_is(
    name: str, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path = demo_files["enforce"][0]
    _, expected, _ = replay_json(capsys, "--mode", "enforce", str(path))
    with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
        command = [sys.executable, "-m", "otel_guard", "replay", "--mode", "enforce"]
        completed = subprocess.run(
            [*command, "--format", "json", name],
            stdin=cat.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
    assert (completed.returncode, completed.stderr) == (0, "")
    report = json.loads(completed.stdout)
    assert report["files"] == [name]
    report["files"] = expected["files"]
    assert report == expected


# -- report schema ------------------------------------------------------------------------------


def test_json_report_schema(
    demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, report, _ = replay_json(capsys, "--mode", "enforce", str(demo_files["enforce"][0]))
    counts = {
        "spans",
        "traces",
        "prompts",
        "batches",
        "prompts_would_warn",
        "prompts_warned",
        "prompts_would_stop",
        "prompts_stopped",
        "self_recovered_after_would_stop",
        "invariant_violations",
    }
    assert counts <= set(report)
    assert list(report["saved"]) == ["tool_calls", "model_calls", "input_tokens", "output_tokens"]
    for key in counts:
        assert type(report[key]) is int, key
    assert list(report["decisions"]) == list(DECISION_VALUES)
    assert list(report["reset_reasons"]) == list(RESET_REASONS)
    assert list(report["invariants"]) == list(INVARIANTS)
    assert report["invariant_violations"] == sum(report["invariants"].values()) == 0
    assert report["mode"] == "enforce" and report["error"] is None
    assert (report["spans"], report["traces"], report["prompts"], report["batches"]) == (
        104,
        6,
        5,
        18,
    )
    groups = report["groups"]
    assert [(g["deployment.environment.name"], g["service.version"]) for g in groups] == [
        ("demo", "2.3.1"),
        ("demo", "2.4.0"),
    ]
    for key in ("spans", "prompts", "batches", "prompts_stopped"):
        assert sum(g[key] for g in groups) == report[key], key
    assert sum(g["saved"]["tool_calls"] for g in groups) == report["saved"]["tool_calls"]
    for entry in report["stopped_prompts"]:
        assert set(entry) == {
            "prompt_id",
            "trace_id",
            "decision",
            "deployment.environment.name",
            "service.version",
            "time_unix_nano",
            "tool_calls_after_stop",
            "batches",
        }
        assert entry["decision"] == "stopped"
        assert re.fullmatch(r"[0-9a-f]{32}", entry["trace_id"])


def test_text_report_groups_by_environment_and_version(
    demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "replay", "--mode", "enforce", str(demo_files["enforce"][0]))
    headings = [line for line in out.splitlines() if line.startswith("deployment.environment")]
    assert headings == [
        "deployment.environment.name=demo  service.version=2.3.1",
        "deployment.environment.name=demo  service.version=2.4.0",
    ]


# -- the command itself -------------------------------------------------------------------------


def test_console_script_runs_the_demo() -> None:
    script = Path(sys.executable).with_name("otel-guard")
    completed = subprocess.run([str(script), "demo"], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("otel-guard demo, mode shadow\n")
    assert completed.stderr == ""


def test_an_invalid_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--mode", "loud"])
    assert exit_info.value.code == 2
    assert "invalid mode 'loud'" in capsys.readouterr().err


def test_no_progress_bar_when_stderr_is_not_a_terminal(
    demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "replay", str(demo_files["shadow"][0]))
    assert (code, err) == (0, "")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_progress_bar_on_a_terminal(demo_files: dict[str, tuple[Path, str]]) -> None:
    primary, secondary = os.openpty()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "otel_guard", "replay", str(demo_files["shadow"][0])],
            stdout=subprocess.PIPE,
            stderr=secondary,
            check=False,
        )
        os.close(secondary)
        secondary = -1
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
        if secondary != -1:
            os.close(secondary)
    assert completed.returncode == 0
    drawn = b"".join(chunks).decode()
    assert re.search(r"\r\[[#.]{30}\] +\d+%  \d+ spans", drawn)
    assert drawn.endswith("\r")  # the bar is cleared before the report


def test_the_example_file_replays_to_the_demo_decisions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "demo-traces.jsonl"
    _, demo_output, _ = run(capsys, "demo")
    code, report, err = replay_json(capsys, str(example))
    assert (code, err) == (0, "")
    assert report["decisions"] == {
        value: timeline_decisions(demo_output)[value] for value in DECISION_VALUES
    }
    assert report["spans"] == 114 and report["invariant_violations"] == 0


def test_spans_repeated_by_a_retried_export_are_counted_once(
    tmp_path: Path, demo_files: dict[str, tuple[Path, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    source, demo_output = demo_files["enforce"]
    lines = source.read_text(encoding="utf-8").splitlines()
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text("\n".join(line for line in lines for _ in range(2)) + "\n", "utf-8")
    code, report, _ = replay_json(capsys, "--mode", "enforce", str(doubled))
    assert code == 0
    assert report["decisions"] == {
        value: timeline_decisions(demo_output)[value] for value in DECISION_VALUES
    }
    assert (report["spans"], report["duplicate_spans"]) == (208, 104)


def _replay_counts(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    assert main(["replay", "--format", "json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    return {key: document[key] for key in ("spans", "prompts", "batches", "decisions")}


def test_demo_out_gets_every_span_when_the_reader_of_stdout_goes_away(
    demo_files: dict[str, tuple[Path, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reader of the timeline that goes away (``| head``) is not a failure to write FILE:
    FILE gets every span and the demo exits 0, quietly, as ``replay`` does."""
    out = tmp_path / "spans.jsonl"
    reading, writing = os.pipe()
    os.close(reading)  # gone before the first line: every write to stdout breaks the pipe
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "otel_guard", "demo", "--out", str(out)],
            stdout=writing,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(writing)
    assert (completed.returncode, completed.stderr) == (0, "")
    assert _replay_counts(capsys, out) == _replay_counts(capsys, demo_files["shadow"][0])


def test_demo_out_names_the_file_when_the_file_cannot_be_written(tmp_path: Path) -> None:
    """FILE's own write error still names FILE, whether or not stdout's reader is there."""
    for stdout_gone in (False, True):
        reading, writing = os.pipe()
        os.close(reading)  # FILE is a pipe nobody reads
        out = f"/dev/fd/{writing}"
        stdout_reading, stdout_writing = os.pipe()
        if stdout_gone:
            os.close(stdout_reading)
        try:
            completed = subprocess.run(
                [sys.executable, "-m", "otel_guard", "demo", "--out", out],
                stdout=stdout_writing,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
                pass_fds=(writing,),
            )
        finally:
            os.close(writing)
            os.close(stdout_writing)
            if not stdout_gone:
                os.close(stdout_reading)
        assert completed.returncode == 1
        assert completed.stderr == f"{out}: cannot write (Broken pipe)\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_demo_out_names_the_file_when_the_disk_is_full(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", "/dev/full"]) == 1
    assert capsys.readouterr().err == "/dev/full: cannot write (No space left on device)\n"
