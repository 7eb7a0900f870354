"""The replay report an operator decides on: stops kept apart, false stops, saved work, days,
duplicates, bounds, escaping, and what-if thresholds; through the real replay and command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import set_span_in_context

from otel_guard import reducer
from otel_guard.cli import main
from otel_guard.replay.otlp_json import encode_request, parse_request
from otel_guard.replay.replayer import DEFAULT_REORDER_WINDOW, SWEEP_THRESHOLDS, Replayer
from otel_guard.replay.report import BOUNDS, GROUP_LIMIT, merge_reports, render_text

DAY = 24 * 3600 * 10**9
NOV_30 = 1_764_460_800 * 10**9  # 2025-11-30T00:00:00Z
EDIT_OK = Call(tool="edit", status="success", execution="success", error_type=None)


def record(prompts: dict[str, list[list[Call]]], *, prompt_spans: bool = True) -> Harness:
    """Prompts as a live agent would have traced them (the guard in shadow, never acting)."""
    harness = Harness(mode="shadow")
    for prompt_id, batches in prompts.items():
        prompt = harness.start_prompt(prompt_id) if prompt_spans else None
        for calls in batches:
            harness.batch(prompt_id, calls, parent=prompt)
        if prompt is not None:
            prompt.end()
    return harness


def spans_of(harness: Harness) -> list[ReadableSpan]:
    return list(harness.span_exporter.get_finished_spans())


def shifted(spans: Sequence[ReadableSpan], to: int, **resource: str) -> list[ReadableSpan]:
    """The spans re-read from OTLP/JSON with their times moved so the first starts at ``to``,
    and resource attributes replaced when given."""
    document = encode_request(spans)
    first = min(s.start_time or 0 for s in spans)
    for block in document["resourceSpans"]:
        if resource:
            block["resource"]["attributes"] = [
                {"key": k, "value": {"stringValue": v}} for k, v in resource.items()
            ]
        for scope in block["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("startTimeUnixNano", "endTimeUnixNano"):
                    span[key] = str(int(span[key]) - first + to)
    return parse_request(json.dumps(document))


def replay(spans: Sequence[ReadableSpan], mode: str = "shadow", **kwargs: Any) -> dict[str, Any]:
    replayer = Replayer(mode, **kwargs)
    replayer.add(spans)
    return replayer.finish().to_json()


def write_lines(path: Path, spans: Sequence[ReadableSpan], per_line: int = 7) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for start in range(0, len(spans), per_line):
            out.write(json.dumps(encode_request(spans[start : start + per_line])) + "\n")
    return path


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["replay", "--format", "json", *argv])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


LOOP = [[FAIL] * 4, [FAIL] * 4, [FAIL] * 4]  # tracked, would_warn, would_stop


# -- stops, false stops and saved work --------------------------------------------------------


def test_a_tool_that_succeeds_after_would_stop_counts_as_self_recovered() -> None:
    report = replay(
        spans_of(
            record(
                {
                    "recovers": [*LOOP, [FAIL] * 4, [OK]],
                    "other-tool-succeeds": [*LOOP, [EDIT_OK]],
                    "keeps-failing": [*LOOP, [FAIL] * 4, [FAIL] * 4],
                }
            )
        )
    )
    assert report["prompts_would_stop"] == 3
    assert report["prompts_stopped"] == 0
    assert report["self_recovered_after_would_stop"] == 1
    assert report["saved"]["tool_calls"] == (4 + 1) + 1 + (4 + 4)
    entries = {e["prompt_id"]: e for e in report["would_stop_prompts"]}
    assert entries["recovers"]["self_recovered"] is True
    assert entries["other-tool-succeeds"]["self_recovered"] is False
    assert entries["recovers"]["tool_calls_after_stop"] == 5
    # The stop sample carries the prompt's timeline: its streak, the stop, then what followed.
    assert [b[1] for b in entries["recovers"]["batches"]] == [
        "tracked",
        "would_warn",
        "would_stop",
        "none",
        "none",
    ]


def test_enforce_keeps_stopped_and_downgraded_would_stop_apart_in_every_section() -> None:
    harness = Harness(mode="shadow")
    for prompt_id, reliable in (("stops", True), ("unreliable-host", None)):
        prompt = harness.start_prompt(prompt_id)
        # An unreliable input drain resets and disables enforcement for the prompt.
        harness.batch(prompt_id, [OK], parent=prompt, reliable=reliable)
        for calls in LOOP:
            harness.batch(prompt_id, calls, parent=prompt)
        harness.batch(prompt_id, [FAIL] * 2, parent=prompt)
        prompt.end()
    report = replay(spans_of(harness), "enforce")
    for section in (report, *report["groups"], *report["by_day"].values()):
        assert (section["prompts_stopped"], section["prompts_would_stop"]) == (1, 1)
        assert section["decisions"]["stopped"] == section["decisions"]["would_stop"] == 1
    assert [e["prompt_id"] for e in report["stopped_prompts"]] == ["stops"]
    assert [e["prompt_id"] for e in report["would_stop_prompts"]] == ["unreliable-host"]
    text = render_text(report)
    stops_trace = report["stopped_prompts"][0]["trace_id"]
    would_trace = report["would_stop_prompts"][0]["trace_id"]
    assert f"  stopped prompts, 1: stops (2 calls after) trace {stops_trace}\n" in text
    assert f"  would-stop prompts, 1: unreliable-host (2 calls after) trace {would_trace}\n" in text
    assert "  prompts: would_warn 0  warned 2  would_stop 1  stopped 1" in text


def test_saved_work_counts_model_calls_and_their_tokens_after_the_stop_point() -> None:
    harness = Harness(mode="shadow")
    prompt = harness.start_prompt("p")
    in_prompt = set_span_in_context(prompt)

    def model_call(operation: str, tokens: tuple[Any, Any]) -> None:
        attributes = {"gen_ai.operation.name": operation}
        for key, value in zip(("input", "output"), tokens, strict=True):
            if value is not None:
                attributes[f"gen_ai.usage.{key}_tokens"] = value
        harness.tracer.start_span(operation, context=in_prompt, attributes=attributes).end()

    model_call("chat", (1000, 100))  # before the stop: not saved
    for calls in LOOP:
        model_call("chat", (1000, 100))
        harness.batch("p", calls, parent=prompt)
    model_call("chat", (2000, 50))
    model_call("text_completion", (300, 7))
    model_call("generate_content", ("many", None))  # a wrongly typed count is no count
    harness.tracer.start_span(
        "embed",
        context=in_prompt,
        attributes={"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": 99},
    ).end()  # not a model call
    harness.batch("p", [FAIL] * 2, parent=prompt)
    prompt.end()
    report = replay(spans_of(harness))
    assert report["saved"] == {
        "tool_calls": 2,
        "model_calls": 3,
        "input_tokens": 2300,
        "output_tokens": 57,
    }
    assert report["groups"][0]["saved"] == report["saved"]
    text = render_text(report)
    assert (
        "saved after the stop point (estimate): tool calls 2  model calls 3"
        "  input tokens 2300  output tokens 57"
    ) in text


def _inferred_loop(
    harness: Harness, prompt_attributes: dict[str, Any], openinference: bool
) -> None:
    """An agent traced by its framework (no acp.* keys): a model call before each turn of 4
    failing tools, 3 turns (tracked, would_warn, would_stop), then 2 model calls with usage."""
    tracer = harness.tracer
    prompt = tracer.start_span("agent", attributes=prompt_attributes)
    outer = set_span_in_context(prompt)
    step = tracer.start_span("step", context=outer)  # an intermediate span, ended early
    inside = set_span_in_context(step)
    model = (
        {"openinference.span.kind": "LLM"} if openinference else {"gen_ai.operation.name": "chat"}
    )
    usage = "llm.token_count" if openinference else "gen_ai.usage"

    def model_call(tokens: int) -> None:
        attributes = {**model, "gen_ai.usage.input_tokens": tokens, "gen_ai.usage.output_tokens": 1}
        if openinference:
            attributes[f"{usage}.prompt"] = tokens
        tracer.start_span("llm", context=inside, attributes=attributes).end()

    for turn in range(3):
        model_call(1000)
        for index in range(4):
            tool = tracer.start_span(
                "tool",
                context=inside,
                attributes=(
                    {"openinference.span.kind": "TOOL", "tool.name": "read_file"}
                    if openinference
                    else {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file"}
                )
                | {"error.type": "FileNotFoundError", "tool_call.id": f"c{turn}-{index}"},
            )
            tool.end()
    model_call(200)  # after the stop point: saved
    model_call(30)
    step.end()
    prompt.end()


@pytest.mark.parametrize(
    ("prompt_attributes", "openinference"),
    [
        ({"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv"}, False),
        ({"gen_ai.operation.name": "invoke_agent"}, False),
        ({"openinference.span.kind": "AGENT", "session.id": "session"}, True),
    ],
)
def test_saved_work_counts_model_calls_of_inferred_prompts_after_the_stop_point(
    prompt_attributes: dict[str, Any], openinference: bool
) -> None:
    # Inferred prompts are decided when they end, after their model calls have ended.
    harness = Harness(mode="shadow")
    _inferred_loop(harness, prompt_attributes, openinference)
    report = replay(spans_of(harness))
    assert report["decisions"]["would_stop"] == 1
    assert report["saved"] == {
        "tool_calls": 0,
        "model_calls": 2,
        "input_tokens": 230,
        "output_tokens": 2,
    }


def test_turns_sharing_a_conversation_id_are_prompts_of_their_own() -> None:
    # Each invoke_agent span is one prompt (its ID the conversation's): the second turn is
    # neither work the first turn's stop would have saved nor its recovery.
    harness = Harness(mode="shadow")
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "chat-1"}
    _inferred_loop(harness, attributes, openinference=False)
    tracer = harness.tracer
    second = tracer.start_span("agent", attributes=attributes)
    inside = set_span_in_context(second)
    tracer.start_span("llm", context=inside, attributes={"gen_ai.operation.name": "chat"}).end()
    tracer.start_span(
        "tool",
        context=inside,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file"},
    ).end()  # the tool that looped in the first turn succeeds
    tracer.start_span("llm", context=inside, attributes={"gen_ai.operation.name": "chat"}).end()
    second.end()
    report = replay(spans_of(harness))
    assert report["prompts"] == 2 and report["prompts_would_stop"] == 1
    assert report["self_recovered_after_would_stop"] == 0
    assert report["saved"] == {
        "tool_calls": 0,
        "model_calls": 2,
        "input_tokens": 230,
        "output_tokens": 2,
    }


def test_counts_break_down_by_utc_day_of_the_batch() -> None:
    first = shifted(spans_of(record({"monday": LOOP})), NOV_30 + DAY - 10**9)
    second = shifted(spans_of(record({"tuesday": LOOP[:1]})), NOV_30 + DAY + 3600 * 10**9)
    report = replay([*first, *second])
    days = report["by_day"]
    # The first prompt's batches straddle midnight only if they took a second: they do not.
    assert list(days) == ["2025-11-30", "2025-12-01"]
    assert (days["2025-11-30"]["prompts"], days["2025-11-30"]["batches"]) == (1, 3)
    assert days["2025-11-30"]["spans"] == len(first)
    assert days["2025-12-01"]["spans"] == len(second)
    assert days["2025-11-30"]["prompts_would_stop"] == 1
    assert (days["2025-12-01"]["prompts"], days["2025-12-01"]["decisions"]["tracked"]) == (1, 1)
    assert [e["hour"] for e in report["timeline"]] == ["2025-11-30T23:00Z", "2025-12-01T01:00Z"]
    assert "  2025-11-30  batches 3  prompts 1  would_stop 1  stopped 0" in render_text(report)


# -- duplicates -------------------------------------------------------------------------------


def test_spans_exported_again_after_their_trace_was_replayed_are_replayed_once() -> None:
    spans = spans_of(record({"p": LOOP, "q": LOOP[:2]}))
    once = replay(spans, reorder_window=0)
    twice = replay([*spans, *spans, *spans[:5]], reorder_window=0)
    assert twice["decisions"] == once["decisions"]
    assert twice["prompts_would_stop"] == once["prompts_would_stop"] == 1
    assert twice["duplicate_spans"] == len(spans) + 5
    assert twice["spans"] == 2 * len(spans) + 5
    assert twice["traces"] == once["traces"] == 2


def test_spans_of_a_trace_forgotten_since_its_replay_are_replayed_apart_and_said_to_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_guard.replay import replayer

    monkeypatch.setattr(replayer, "REMEMBERED_TRACES", 3)
    spans = spans_of(record({f"p{i}": LOOP[:1] for i in range(8)}))

    def replay_parts(*parts: Sequence[ReadableSpan]) -> dict[str, Any]:
        replaying = Replayer("shadow", reorder_window=0)
        for part in parts:
            replaying.add(part)
        return replaying.finish().to_json()

    within = replay_parts(spans, spans[-2:])  # spans of the last traces: still known
    assert within["bounds"]["replayed_traces"] == 0 and within["duplicate_spans"] == 2
    report = replay_parts(spans, spans)
    assert report["duplicate_spans"] < len(spans)
    assert report["bounds"]["replayed_traces"] == report["traces"] - 8 > 0
    assert "replayed apart from it, repeats among them again" in render_text(report)


# -- bounds -----------------------------------------------------------------------------------


def rootless_trace(count: int) -> list[ReadableSpan]:
    spans = [
        {
            "traceId": "ab" * 16,
            "spanId": f"{i + 1:016x}",
            "parentSpanId": "f" * 16,
            "name": "s",
            "startTimeUnixNano": str(NOV_30 + i),
            "endTimeUnixNano": str(NOV_30 + i + 1),
        }
        for i in range(count)
    ]
    request = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    return parse_request(json.dumps(request))


def test_a_trace_beyond_the_span_bound_is_replayed_in_parts_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = rootless_trace(25)
    replayer = Replayer("shadow", max_trace_spans=10)
    replayer.add(spans[:12])
    assert replayer.open_traces == 1  # ten replayed, two buffered
    replayer.add(spans[12:])
    report = replayer.finish().to_json()
    assert report["bounds"]["trace_spans"] == 2
    assert (report["spans"], report["traces"]) == (25, 3)
    assert "     2  a trace was replayed in parts" in render_text(report)
    # The command's default bound is far above this input: nothing to say.
    path = str(write_lines(tmp_path / "t.jsonl", spans))
    code, document, err = cli_json(capsys, "--allow-empty", path)
    assert (code, document["bounds"]["trace_spans"]) == (0, 0)
    assert "replay:" not in err  # no bound line (these plain spans only say no prompt is readable)


def _split_by_traffic(path: Path, other_spans: int) -> tuple[Path, int]:
    """A prompt's trace whose root is written first and the rest after ``other_spans`` spans of
    other traces (a turn that outlived the request that started it); the spans written after."""
    spans = spans_of(record({"p": LOOP}))
    roots = [span for span in spans if span.parent is None]
    rest = [span for span in spans if span.parent is not None]
    assert len(roots) == 1 and rest
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(encode_request(roots)) + "\n")
        for first in range(0, other_spans, 1000):
            other = [
                {
                    "traceId": f"{i + 1:032x}",
                    "spanId": f"{i + 1:016x}",
                    "name": "GET /health",
                    "kind": 2,
                    "startTimeUnixNano": str(NOV_30 + i),
                    "endTimeUnixNano": str(NOV_30 + i + 1),
                }
                for i in range(first, min(first + 1000, other_spans))
            ]
            block = {"resource": {}, "scopeSpans": [{"scope": {"name": "a"}, "spans": other}]}
            out.write(json.dumps({"resourceSpans": [block]}) + "\n")
        out.write(json.dumps(encode_request(rest)) + "\n")
    return path, len(rest)


def test_spans_that_come_after_their_trace_left_the_reorder_window_are_counted_and_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    late, count = _split_by_traffic(tmp_path / "late.jsonl", DEFAULT_REORDER_WINDOW + 1)
    code, report, err = cli_json(capsys, str(late))
    assert code == 0  # read completely: a bound does not change the status (docs/contract.md)
    assert report["bounds"]["late_spans"] == count
    assert {name for name, n in report["bounds"].items() if n} == {"late_spans"}
    assert err == (
        f"replay: {BOUNDS['late_spans']} ({DEFAULT_REORDER_WINDOW:,}), {count:,} times\n"
    )
    assert f"  {count:>6}  {BOUNDS['late_spans']}" in render_text(report)
    code, jobs, _ = cli_json(capsys, "--jobs", "2", str(late))
    assert jobs == report

    clean, _ = _split_by_traffic(tmp_path / "clean.jsonl", DEFAULT_REORDER_WINDOW - 10)
    code, report, err = cli_json(capsys, str(clean))
    assert (code, err, report["bounds"]["late_spans"]) == (0, "", 0)


def test_groups_beyond_the_bound_fold_into_other_with_exact_totals(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spans = spans_of(record({"p": LOOP}))
    path = tmp_path / "versions.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for version in range(GROUP_LIMIT + 5):
            document = encode_request(spans)
            for block in document["resourceSpans"]:
                block["resource"]["attributes"] = [
                    {"key": "service.version", "value": {"stringValue": f"v{version:05d}"}}
                ]
                for scope in block["scopeSpans"]:
                    for span in scope["spans"]:
                        span["traceId"] = f"{version + 1:032x}"
            # A prompt per version, so that the shards of --jobs share the groups out.
            line = json.dumps(document).replace(
                '{"stringValue": "p"}', f'{{"stringValue": "p{version}"}}'
            )
            out.write(line + "\n")
    code, report, err = cli_json(capsys, str(path))
    assert code == 0
    assert err == (
        "replay: a resource was counted under group 'other': more environment/version groups "
        "than the bound (1,000), 5 times\n"
    )
    groups = report["groups"]
    assert len(groups) == GROUP_LIMIT + 1
    assert groups[-1]["other"] is True
    assert groups[-1]["spans"] == 5 * len(spans)
    assert groups[-2]["service.version"] == f"v{GROUP_LIMIT - 1:05d}"
    assert report["spans"] == (GROUP_LIMIT + 5) * len(spans)
    assert sum(g["spans"] for g in groups) == report["spans"]
    assert report["bounds"]["report_groups"] == 5
    # The shards of --jobs name other groups (docs/design.md), but fold the timeline as their
    # groups, as one process does: no decision under a group the report does not name.
    for jobs in ("1", "2"):
        code, report, _ = cli_json(capsys, "--jobs", jobs, str(path))
        named = {g["service.version"] for g in report["groups"] if not g.get("other")}
        timeline = report["timeline"]
        assert {e["service.version"] for e in timeline if not e.get("other")} <= named
        assert sum(sum(e["decisions"].values()) for e in timeline) == 3 * (GROUP_LIMIT + 5)


# -- escaping ---------------------------------------------------------------------------------


def test_the_text_report_escapes_control_characters_of_prompt_ids_and_resource_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = "p\ninvariant violations: 0\x1b[2J\u202e"
    spans = shifted(
        spans_of(record({forged: LOOP})),
        NOV_30,
        **{"deployment.environment.name": "prod\r\x07", "service.version": "1\\n"},
    )
    code = main(["replay", str(write_lines(tmp_path / "x.jsonl", spans))])
    out = capsys.readouterr().out
    assert code == 0
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out and "\u202e" not in out
    assert [line for line in out.splitlines() if line.startswith("invariant violations")] == [
        "invariant violations: 0"
    ]
    assert (
        "would-stop prompts, 1: p\\x0ainvariant violations: 0\\x1b[2J\\u202e (0 calls after)" in out
    )
    assert "deployment.environment.name=prod\\x0d\\x07  service.version=1\\\\n" in out


# -- what-if ----------------------------------------------------------------------------------


def test_threshold_flags_replay_other_constants_without_touching_the_live_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lines(tmp_path / "s.jsonl", spans_of(record({"slow": [[FAIL] * 3] * 5})))
    _, live, _ = cli_json(capsys, str(path))
    # 3 failures a batch: live warns at 9 (third batch) and stops at the fourth.
    assert live["decisions"]["would_warn"] == live["decisions"]["would_stop"] == 1
    _, strict, _ = cli_json(capsys, "--threshold", "12", "--batch-threshold", "4", str(path))
    assert (strict["threshold"], strict["batch_threshold"]) == (12, 4)
    # 12 failures over 4 batches: warned at the fourth batch only, stopped at the fifth.
    assert [strict["decisions"][v] for v in ("tracked", "would_warn", "would_stop")] == [3, 1, 1]
    assert (strict["saved"]["tool_calls"], live["saved"]["tool_calls"]) == (0, 3)
    _, eager, _ = cli_json(capsys, "--threshold", "3", "--batch-threshold", "1", str(path))
    # The first batch of a streak only tracks, whatever the constants (the reducer's step 9).
    assert [eager["decisions"][v] for v in ("tracked", "would_warn", "would_stop")] == [1, 1, 1]
    assert eager["saved"]["tool_calls"] == 6
    assert (reducer.THRESHOLD, reducer.BATCH_THRESHOLD) == (8, 2)
    with pytest.raises(SystemExit) as usage:
        main(["replay", "--threshold", "0", str(path)])
    assert usage.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err


def test_sweep_rows_match_single_replays_at_each_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = {f"p{n}": [[FAIL] * n] * 4 + [[OK]] for n in range(1, 7)}
    path = write_lines(tmp_path / "s.jsonl", spans_of(record(prompts)))
    _, report, _ = cli_json(capsys, "--sweep", str(path))
    sweep = report["sweep"]
    assert [row["threshold"] for row in sweep] == list(SWEEP_THRESHOLDS)
    for row in sweep:
        _, single, _ = cli_json(capsys, "--threshold", str(row["threshold"]), str(path))
        expected = {k: single[k] for k in row if k not in ("threshold", "batch_threshold")}
        assert {k: v for k, v in row.items() if k in expected} == expected
    by_threshold = {row["threshold"]: row for row in sweep}
    # Prompt pN fails N calls a batch, four batches: warned at batch max(2, ceil(T/N)), so
    # stopped (at the next batch) only when that is batch 3 at the latest.
    assert by_threshold[8]["prompts_would_stop"] == report["prompts_would_stop"] == 4
    assert by_threshold[2]["prompts_would_stop"] == 6
    assert by_threshold[32]["prompts_would_stop"] == 0
    assert by_threshold[8]["self_recovered_after_would_stop"] == 4
    assert by_threshold[12]["prompts_would_stop"] == 3  # p4, p5, p6
    code = main(["replay", "--sweep", str(path)])
    text = capsys.readouterr().out
    assert code == 0
    assert "what-if sweep (prompts, and work saved after the stop point)" in text
    assert any(line.split()[:5] == ["8", "2", "4", "0", "4"] for line in text.splitlines())


def test_a_single_report_merges_to_itself() -> None:
    report = replay(spans_of(record({"p": LOOP, "q": [[OK]]})), sweep=(4, 8))
    assert merge_reports([report]) == report
