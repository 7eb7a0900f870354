"""The HTML replay report stays a small page: its plots are SVG drawn from the report's data."""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

import pytest
from test_replay_shards import write_prompts

from otel_guard.cli import main
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
