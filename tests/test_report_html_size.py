"""The HTML replay report: a small page of matplotlib SVG, gaps as gaps, the extra it needs."""

from __future__ import annotations

import copy
import datetime
import json
import re
import sys
from pathlib import Path

import pytest
from test_replay_shards import write_prompts

from otel_guard.cli import main

pytest.importorskip("matplotlib", reason="the HTML page needs the 'html' extra")

from otel_guard.replay.report_html import HOURS_SHOWN, render_html

MEGABYTE = 1_000_000


def test_the_page_of_two_weeks_of_hourly_decisions_in_five_groups_is_under_a_megabyte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_file = write_prompts(tmp_path / "prompts.jsonl", 40)
    page = tmp_path / "report.html"
    assert main(["replay", "--format", "json", "--html", str(page), str(trace_file)]) == 0
    assert page.stat().st_size < 100_000  # a small report: tens of kilobytes
    document = json.loads(capsys.readouterr().out)
    assert document["would_stop_prompts"] and document["sweep"]

    # The most the decisions plot draws hour by hour: every hour of two weeks, five groups,
    # every decision; and stop timelines of 32 batches each.
    start = datetime.datetime(2026, 1, 1)
    document["timeline"] = [
        {
            "hour": (start + datetime.timedelta(hours=hour)).strftime("%Y-%m-%dT%H:00Z"),
            "deployment.environment.name": f"env-{group}",
            "service.version": "1.0.0",
            "decisions": dict.fromkeys(
                ("reset", "tracked", "would_warn", "warned", "would_stop", "stopped"), hour + 1
            ),
        }
        for hour in range(HOURS_SHOWN)
        for group in range(5)
    ]
    sample = document["would_stop_prompts"][0]
    document["would_stop_prompts"] = [
        {**copy.deepcopy(sample), "prompt_id": f"p-{n}", "batches": sample["batches"] * 32}
        for n in range(100)
    ]
    size = len(render_html(document).encode("utf-8"))
    assert size < MEGABYTE, size


def _decisions_svg(hours: list[int]) -> str:
    start = datetime.datetime(2026, 1, 1)
    document = {
        "timeline": [
            {
                "hour": (start + datetime.timedelta(hours=hour)).strftime("%Y-%m-%dT%H:00Z"),
                "deployment.environment.name": "prod",
                "service.version": "1.0.0",
                "decisions": {"tracked": 2},
            }
            for hour in hours
        ]
    }
    page = render_html(document)
    return page[page.index('<div class="plot" data-plot="decisions">') :].split("</div>")[0]


def test_an_hour_without_decisions_is_a_gap_in_the_line_and_a_long_report_is_drawn_by_day() -> None:
    # Hours 0-2 and 5-6: the line breaks over hours 3 and 4 (a second move, not a join).
    svg = _decisions_svg([0, 1, 2, 5, 6])
    (trace,) = re.findall(r'<g id="decisions-trace-0">.*?</g>', svg, re.DOTALL)
    (path,) = re.findall(r'<path d="([^"]*)"', trace)
    assert path.count("M") == 2, path
    assert "2026-01-01 00:00" in svg  # ticks in hours
    # More than two weeks of hours: ticks in days.
    svg = _decisions_svg([0, 1, HOURS_SHOWN + 48])
    assert re.search(r">2026-01-1\d</text>", svg) and " 00:00<" not in svg
    assert "day (UTC) of the batch" in svg


def test_html_without_matplotlib_is_a_one_line_usage_error_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the html extra were missing
    trace_file = write_prompts(tmp_path / "prompts.jsonl", 2)
    page = tmp_path / "report.html"
    assert main(["replay", "--html", str(page), str(trace_file)]) == 2
    captured = capsys.readouterr()
    assert captured.err == "--html needs matplotlib: install otel-guard[html]\n"
    assert captured.out == "" and not page.exists()
