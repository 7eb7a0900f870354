"""The exit status of ``replay`` and ``merge`` gates a rollout step (docs/contract.md section 7),
and ``merge`` takes only reports a replay could have written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_replay_report import LOOP, record, spans_of, write_lines

from otel_guard.cli import main
from otel_guard.replay.report import unreadable, verdict
from otel_guard.replay.report_schema import REQUIRED_KEYS

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo-traces.jsonl"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, _ = _run(capsys, "replay", "--format", "json", str(DEMO))
    assert code == 0
    document: dict[str, Any] = json.loads(out)
    assert document["complete"] is True and document["verdict"] == {"status": 0, "reasons": []}
    return document


def _write(path: Path, document: object) -> str:
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


# -- the gate ------------------------------------------------------------------------------------


def test_a_clean_replay_passes_and_says_so_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "replay", str(DEMO))
    assert (code, err) == (0, "")
    first, second = out.splitlines()[:2]
    assert first.startswith("verdict: PASS (invariants 0, inputs read completely, false-stop")
    assert second == f"inputs: {DEMO}, read completely"


def test_a_report_with_an_invariant_violation_fails_merge_with_status_5(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report["invariants"]["stop_without_warning"] = 1
    report["invariant_violations"] = 1
    code, out, err = _run(capsys, "merge", _write(tmp_path / "r.json", report))
    assert code == 5
    assert err == "invariant violations: stop_without_warning 1\n"
    merged = json.loads(out)  # the report is still printed
    assert merged["verdict"] == {"status": 5, "reasons": ["invariant violations: 1"]}


def test_merge_of_a_shard_whose_input_stopped_early_fails_with_status_1(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write(tmp_path / "good.json", report)
    report["error"] = "traces.jsonl.gz:7: compressed data ends early (truncated gzip file)"
    report["complete"] = False
    cut = _write(tmp_path / "cut.json", report)
    code, out, err = _run(capsys, "merge", "--format", "text", good, cut)
    assert code == 1
    assert err == (
        f"{cut}: a replay whose input stopped early: traces.jsonl.gz:7: compressed data ends"
        " early (truncated gzip file)\n"
    )
    assert out.startswith("verdict: FAIL, exit 1 (input stopped early: traces.jsonl.gz:7:")


def test_a_report_of_an_older_version_is_judged_by_its_error(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    del report["complete"], report["verdict"]
    report["error"] = "a.jsonl:3: invalid JSON"
    code, _, _ = _run(capsys, "merge", _write(tmp_path / "old.json", report))
    assert code == 1


def test_several_failures_give_the_status_of_the_first_and_list_every_reason() -> None:
    document = {
        "mode": "shadow",
        "spans": 0,
        "prompts": 0,
        "invariant_violations": 2,
        "error": "a.jsonl:1: invalid JSON",
        "complete": False,
    }
    result = verdict(document)
    assert result.status == 1
    assert result.reasons == (
        "input stopped early: a.jsonl:1: invalid JSON",
        "invariant violations: 2",
        "no spans read",
    )
    document.update(error=None, complete=True)
    assert verdict(document).status == 5
    document["invariant_violations"] = 0
    assert verdict(document).status == 3
    assert verdict(document, allow_empty=True).status == 0
    document["spans"] = 4
    assert verdict(document).status == 4
    document["mode"] = "off"  # the guard reads nothing in mode off, by design
    assert verdict(document).status == 0


def test_merge_of_empty_reports_fails_with_status_3_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    code, out, _ = _run(capsys, "replay", "--format", "json", str(empty))
    assert code == 3
    path = _write(tmp_path / "empty.json", json.loads(out))
    assert _run(capsys, "merge", path)[0] == 3
    assert _run(capsys, "merge", "--allow-empty", path)[0] == 0


def test_the_help_lists_the_modes_the_input_formats_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("zstd", "proto", "'-' reads standard input", "off, shadow", "warn", "enforce"):
        assert word in text
    assert "3 no spans" in text and "5 an invariant violated" in text
    assert "7 the --html file could not be written" in text
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "off, shadow (count only), warn" in " ".join(capsys.readouterr().out.split())


# -- merge refuses what a replay cannot have written --------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(spans=-5), "spans: expected a count"),
        (lambda r: r.update(spans=10**300), "spans: expected a count"),
        (lambda r: r.update(spans="5"), "spans: expected a count"),
        (lambda r: r.update(spans=True), "spans: expected a count"),
        (lambda r: r["decisions"].update(stopped=1.5), "decisions.stopped: expected a count"),
        (lambda r: r["decisions"].update(exploded=1), "decisions: unknown name 'exploded'"),
        (lambda r: r["saved"].update(tool_calls=None), "saved.tool_calls: expected a count"),
        (
            lambda r: (
                r.update(invariant_violations=0)
                or r["invariants"].update(stop_without_warning=0)
                or r.pop("invariants")
            ),
            "invariants: missing",
        ),
        (lambda r: r.update(mode="turbo"), "mode: expected one of"),
        (lambda r: r["groups"][0].update(prompts=-1), "groups[0].prompts: expected a count"),
        (lambda r: r.update(groups={}), "groups: expected a list"),
        (lambda r: r.update(complete="yes"), "complete: expected true or false"),
        (lambda r: r["by_day"].update({"soon": {}}), "by_day: 'soon' is not a day"),
        (
            lambda r: r["would_stop_prompts"][0].update(time_unix_nano=-1),
            "would_stop_prompts[0].time_unix_nano: expected a time",
        ),
        (
            lambda r: r.update(invariant_violations=3),
            "invariant_violations: not the sum of invariants",
        ),
    ],
)
def test_merge_refuses_a_forged_report_in_one_line(
    change: Any,
    message: str | None,
    report: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    change(report)
    path = _write(tmp_path / "forged.json", report)
    code, out, err = _run(capsys, "merge", path)
    if message is None:  # a change that keeps the report valid
        assert code == 0, err
        return
    assert code == 1
    assert err.startswith(f"{path}: {message}") and err.count("\n") == 1, err
    empty = json.loads(out)  # the merge of what could be read: nothing
    assert (empty["spans"], empty["complete"]) == (0, False)
    assert empty["error"] == err.rstrip("\n")


_COMMAND_KEYS = ("files", "error", "complete", "verdict")
"""Keys the command adds to a replay's report, optional in a report read back."""


def test_every_key_a_replay_report_has_is_required(report: dict[str, Any]) -> None:
    # The schema follows the writer: a key the replay adds later is required too.
    written = {key for key in report if key not in _COMMAND_KEYS}
    assert set(REQUIRED_KEYS) == written and len(REQUIRED_KEYS) == len(written)


def _mistyped(value: object) -> object:
    """A value of another JSON type than ``value``."""
    if isinstance(value, dict):
        return []
    if isinstance(value, list):
        return {}
    if isinstance(value, str):
        return 5
    return str(value)


def _without(document: dict[str, Any]) -> dict[str, Any]:
    """A merged report without what tells an incomplete merge apart."""
    return {k: v for k, v in document.items() if k not in ("complete", "error", "verdict")}


@pytest.mark.parametrize("key", REQUIRED_KEYS)
@pytest.mark.parametrize("fault", ["deleted", "mistyped"])
def test_merge_refuses_a_report_missing_or_mistyping_a_required_key_and_merges_the_others(
    key: str,
    fault: str,
    report: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = _write(tmp_path / "good.json", report)
    code, alone, _ = _run(capsys, "merge", "--format", "json", good)
    assert code == 0
    broken = dict(report)
    if fault == "deleted":
        del broken[key]
    else:
        broken[key] = _mistyped(report[key])
    # Given first, so that a report taken for the first could not set the merge's settings.
    bad = _write(tmp_path / f"{fault}-{key}.json", broken)
    code, out, err = _run(capsys, "merge", "--format", "json", bad, good)
    assert code == 1, err
    assert err.startswith(f"{bad}: ") and key in err and err.count("\n") == 1, err
    if fault == "deleted" and key not in ("mode", "decisions"):  # those have messages of their own
        assert err == f"{bad}: {key}: missing (every replay report has it)\n"
    merged = json.loads(out)
    assert merged["error"] == err.rstrip("\n")
    expected = json.loads(alone)
    assert _without(merged) == _without(expected)


@pytest.mark.parametrize("section", ["groups", "by_day"])
def test_merge_refuses_a_group_or_day_missing_a_count(
    section: str,
    report: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if section == "groups":
        del report["groups"][0]["spans"]
        where = "groups[0].spans"
    else:
        day = next(iter(report["by_day"]))
        del report["by_day"][day]["batches"]
        where = f"by_day[{day}].batches"
    path = _write(tmp_path / "r.json", report)
    code, _, err = _run(capsys, "merge", path)
    assert (code, err) == (1, f"{path}: {where}: missing (every replay report has it)\n")


def test_merge_refuses_nan_and_infinity(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        path = tmp_path / "nan.json"
        path.write_text(json.dumps(report).replace('"spans": 114', f'"spans": {constant}'), "utf-8")
        code, _, err = _run(capsys, "merge", str(path))
        assert code == 1 and err == f"{path}: {constant} is not a count\n"


def test_merge_of_a_deeply_nested_report_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    depth = 200_000
    path.write_text('{"decisions": {}, "skipped": ' + "[" * depth + "]" * depth + "}", "utf-8")
    code, _, err = _run(capsys, "merge", str(path))
    assert code == 1
    assert err in (
        f"{path}: not a replay report (nested too deeply)\n",
        f"{path}: mode: expected one of enforce, off, shadow, warn\n",
    )


def test_merge_refuses_more_days_than_a_replay_keeps(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report["by_day"] = {
        f"{1000 + i // 372:04d}-{1 + i // 31 % 12:02d}-{1 + i % 31:02d}": {} for i in range(200_000)
    }
    code, out, err = _run(capsys, "merge", _write(tmp_path / "days.json", report))
    assert code == 1 and json.loads(out)["verdict"]["status"] == 1
    assert err.endswith(": by_day: more than 3,661 days\n")


def test_a_reader_that_closes_the_pipe_early_does_not_turn_a_failure_into_success(
    tmp_path: Path,
) -> None:
    # Reports larger than a pipe holds (64 KiB), so the writer meets the closed pipe.
    big = write_lines(
        tmp_path / "loops.jsonl", spans_of(record({f"p{i}": LOOP for i in range(150)}))
    )
    cut = tmp_path / "cut.jsonl"
    cut.write_text(big.read_text(encoding="utf-8") + "{broken\n", encoding="utf-8")
    command = [sys.executable, "-m", "otel_guard", "replay", "--format", "json", "--sweep"]
    for path, status in ((cut, 1), (big, 0)):
        with subprocess.Popen(
            [*command, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as replay:
            assert replay.stdout is not None and replay.stderr is not None
            replay.stdout.read(1)
            replay.stdout.close()  # as `| head -c 1` does
            err = replay.stderr.read().decode()
        assert replay.returncode == status, err
        assert len(_full_report(command, path)) > 80 * 1024  # more than a pipe holds
        assert "Traceback" not in err and "BrokenPipe" not in err


def _full_report(command: list[str], path: Path) -> str:
    return subprocess.run([*command, str(path)], capture_output=True, text=True, check=False).stdout


def test_merge_refuses_a_report_larger_than_the_limit_before_decoding_it(
    report: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_guard.replay import report_schema

    monkeypatch.setattr(report_schema, "MAX_REPORT_BYTES", 1 << 20)
    report["padding"] = "x" * (1 << 20)
    path = _write(tmp_path / "big.json", report)
    code, out, err = _run(capsys, "merge", path)
    assert (code, err) == (1, f"{path}: larger than 1 MiB, the limit of a report\n")
    assert json.loads(out)["complete"] is False


# -- merge prints what it could merge, and refuses what would be counted twice -----------------


def test_merge_with_a_report_that_is_not_one_prints_the_merge_of_the_others_with_status_1(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write(tmp_path / "good.json", report)
    bad = _write(tmp_path / "bad.json", {"spans": 3})
    code, out, err = _run(capsys, "merge", good, bad)
    assert code == 1
    assert err == f"{bad}: not a replay report (no decisions)\n"
    merged = json.loads(out)
    assert (merged["spans"], merged["prompts"]) == (report["spans"], report["prompts"])
    assert (merged["complete"], merged["error"]) == (False, err.rstrip("\n"))
    assert merged["verdict"]["status"] == 1


def test_merge_leaves_out_a_report_of_another_mode_merges_the_rest_and_exits_6(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write(tmp_path / "shadow.json", report)
    code, out, _ = _run(capsys, "replay", "--mode", "enforce", "--format", "json", str(DEMO))
    enforce = _write(tmp_path / "enforce.json", json.loads(out))
    code, out, err = _run(capsys, "merge", "--format", "text", good, enforce)
    assert code == 6
    reason = f"{enforce}: replayed with mode 'enforce', the others 'shadow'"
    assert err == f"{enforce}: left out of the merge: {reason.split(': ', 1)[1]}\n"
    assert out.startswith(f"verdict: FAIL, exit 6 (left out of the merge: {reason});")
    assert f"spans {report['spans']}  prompts {report['prompts']}" in out


@pytest.mark.parametrize("given", ["same path", "copy", "reindented", "inside a merge"])
def test_merge_refuses_a_report_given_twice_instead_of_counting_it_twice(
    given: str, report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _write(tmp_path / "a.json", report)
    if given == "same path":
        second = first
    elif given == "copy":
        second = tmp_path / "b.json"
        second.write_bytes(Path(first).read_bytes())
    elif given == "reindented":
        second = tmp_path / "b.json"
        second.write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
    else:
        code, out, _ = _run(capsys, "merge", first)
        assert code == 0
        second = _write(tmp_path / "merged.json", json.loads(out))
    code, out, err = _run(capsys, "merge", first, str(second))
    assert code == 6
    assert err == (
        f"{second}: left out of the merge: the same replay as {first} (given twice, a copy, or"
        " part of a merge): it would be counted twice\n"
    )
    merged = json.loads(out)
    assert (merged["spans"], merged["prompts"]) == (report["spans"], report["prompts"])
    assert merged["verdict"]["status"] == 6
    assert merged["left_out"] == [{"report": str(second), "reason": err.split(": ", 2)[2][:-1]}]
    # The merged report stays mergeable, and remembers what it holds.
    again = _write(tmp_path / "again.json", merged)
    assert _run(capsys, "merge", again, first)[0] == 6


def test_merge_of_reports_with_and_without_a_sweep_drops_the_sweep_and_says_so(
    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _write(tmp_path / "plain.json", report)
    half = tmp_path / "half.jsonl"
    half.write_text(DEMO.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    code, out, _ = _run(capsys, "replay", "--sweep", "--format", "json", str(half))
    swept = _write(tmp_path / "swept.json", json.loads(out))
    code, out, err = _run(capsys, "merge", plain, swept)
    assert code == 0
    assert err == (
        "the reports' what-if sweeps differ (thresholds, or a sweep in some only):"
        " the merged report has none\n"
    )
    assert "sweep" not in json.loads(out)


def test_an_html_file_that_cannot_be_written_exits_7_not_the_status_of_a_cut_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    page = tmp_path / "missing-folder" / "report.html"
    code, out, err = _run(capsys, "replay", "--format", "json", "--html", str(page), str(DEMO))
    assert code == 7
    assert err == f"{page}: cannot write (No such file or directory)\n"
    report = json.loads(out)
    assert report["complete"] is True
    assert report["verdict"] == {
        "status": 7,
        "reasons": [f"HTML report not written: {page}: cannot write (No such file or directory)"],
    }
    code, out, _ = _run(capsys, "replay", "--html", str(page), str(DEMO))
    assert code == 7 and out.startswith("verdict: FAIL, exit 7 (HTML report not written: ")


# -- no guard-readable prompt, whatever the mode ---------------------------------------------------


def _opted_out_copy(path: Path) -> Path:
    """The demo's traces with every prompt marked a channel prompt: the guard guards none."""
    lines = []
    for line in DEMO.read_text(encoding="utf-8").splitlines():
        request = json.loads(line)
        for block in request["resourceSpans"]:
            for scope in block["scopeSpans"]:
                for span in scope["spans"]:
                    keys = {entry["key"] for entry in span.get("attributes", [])}
                    if "acp.prompt.id" in keys:
                        span["attributes"].append(
                            {"key": "acp.prompt.channel", "value": {"boolValue": True}}
                        )
        lines.append(json.dumps(request))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _no_prompt_file(path: Path) -> Path:
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "GET /health",
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
    }
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    path.write_text(json.dumps(request) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_mode_off_fails_with_status_4_on_a_file_without_a_prompt_and_passes_on_one_with(
    jobs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = _no_prompt_file(tmp_path / "health.jsonl")
    argv = ("replay", "--mode", "off", "--jobs", jobs, "--format", "json")
    code, out, err = _run(capsys, *argv, str(empty))
    assert code == 4
    report = json.loads(out)
    assert (report["prompts"], report["readable_prompt"]) == (0, False)
    assert report["verdict"] == {"status": 4, "reasons": ["no prompt the guard can read"]}
    assert err.startswith(f"{empty}: 1 spans, no prompt the guard can read: no span carries ")
    code, out, err = _run(capsys, *argv, str(DEMO))
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["prompts"], report["readable_prompt"]) == (0, True)  # the guard is off
    path = _write(tmp_path / "off.json", report)
    assert _run(capsys, "merge", path)[0] == 0


@pytest.mark.parametrize("mode", ["shadow", "off"])
def test_a_file_whose_prompts_are_all_opted_out_says_so_not_that_attributes_are_missing(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _opted_out_copy(tmp_path / "channels.jsonl")
    code, out, err = _run(capsys, "replay", "--mode", mode, "--format", "json", str(path))
    assert code == 4
    named = len(
        {
            entry["value"]["stringValue"]
            for line in path.read_text(encoding="utf-8").splitlines()
            for block in json.loads(line)["resourceSpans"]
            for scope in block["scopeSpans"]
            for span in scope["spans"]
            for entry in span.get("attributes", [])
            if entry["key"] == "acp.prompt.id"
        }
    )
    spans = json.loads(out)["spans"]
    assert err == (
        f"{path}: {spans} spans, no prompt the guard can read: the {named} prompt(s) named"
        " (acp.prompt.id) are all opted out of the guard (acp.prompt.route other than"
        " interactive, or acp.prompt.channel true)\n"
    )


def test_no_prompt_read_because_a_bound_dropped_it_names_the_bound() -> None:
    # Prompts below one long-lived span wait for it; over the byte budget the trace is dropped
    # (batch_overflow), and its tool calls were never "below no prompt".
    document = {
        "mode": "shadow",
        "spans": 34_001,
        "prompts": 0,
        "diagnostics": {"batch_overflow": 1, "late_span": 0},
        "genai_seen": {"prompts": 0, "tool_calls": 0, "orphan_tool_calls": 5962},
    }
    reason = unreadable(document)
    assert reason is not None and reason.startswith("no prompt was read to its end")
    assert "(batch_overflow 1)" in reason and "below a prompt" not in reason
    document["diagnostics"] = {}
    assert "none below a prompt" in (unreadable(document) or "")
