"""The HTML replay report, opened offline in a real headless Chromium (the ``browser`` extra).

Skipped without Playwright's Python package or a system Chromium; no browser is ever
downloaded: Playwright drives the system one by its path.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import FAIL, OK, Harness

from otel_guard.cli import main
from otel_guard.replay.otlp_json import encode_request

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the browser extra (playwright) is not installed"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no system chromium to drive", allow_module_level=True)

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE = "</script><script>window.pwned = 1</script><img src=x onerror='window.pwned=2'>"


def write_trace_file(path: Path) -> Path:
    harness = Harness(mode="shadow")
    prompts = {
        "loop": [[FAIL] * 4] * 5,
        "recovers": [[FAIL] * 4] * 3 + [[OK]],
        HOSTILE: [[FAIL] * 4] * 4,
        "fine": [[OK]] * 2,
    }
    for prompt_id, batches in prompts.items():
        prompt = harness.start_prompt(prompt_id)
        for calls in batches:
            harness.batch(prompt_id, calls, parent=prompt)
        prompt.end()
    spans = list(harness.span_exporter.get_finished_spans())
    path.write_text(json.dumps(encode_request(spans)) + "\n", encoding="utf-8")
    return path


def open_page(path: Path, screenshot: Path | None = None) -> dict[str, Any]:
    """Load the page from disk with every network request refused; what the browser saw."""
    seen: dict[str, Any] = {"errors": [], "requests": []}
    if screenshot is not None:
        seen["screenshot"] = str(screenshot)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on(
                "console",
                lambda message: (
                    seen["errors"].append(message.text) if message.type == "error" else None
                ),
            )
            page.on("pageerror", lambda error: seen["errors"].append(str(error)))
            page.on("dialog", lambda dialog: dialog.dismiss())

            def refuse(route: Any) -> None:
                if route.request.url.startswith("file://"):
                    route.continue_()
                else:
                    seen["requests"].append(route.request.url)
                    route.abort()

            page.route("**/*", refuse)
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_selector(".plot svg", timeout=20_000)
            seen["plots"] = page.locator(".plot").count()
            seen["svgs"] = page.locator(".plot svg").count()
            # Each series (id NAME-trace-I) and the legend text of the same index.
            seen["traces"] = page.evaluate(
                "Array.from(document.querySelectorAll('.plot')).map(p => {"
                "  const name = p.dataset.plot;"
                "  return Array.from(p.querySelectorAll(`[id^='${name}-trace-']`)).map(t => {"
                "    const label = p.querySelector("
                "      '#' + CSS.escape(`${name}-name-${t.id.split('-').pop()}`));"
                "    return label && label.textContent.trim();"
                "  });"
                "})"
            )
            # Markers the browser laid out: drawn, with a size.
            seen["markers"] = page.evaluate(
                "Array.from(document.querySelectorAll('.plot [id*=\"-trace-\"] use'))"
                ".filter(c => c.getBoundingClientRect().width > 0).length"
            )
            seen["pwned"] = page.evaluate("window.pwned === undefined ? null : window.pwned")
            seen["text"] = page.inner_text("body")
            seen["verdict"] = page.inner_text("#verdict")
            seen["verdict_class"] = page.get_attribute("#verdict", "class")
            seen["cuts"] = page.locator(".cut").all_inner_texts()
            # Per plot, where the browser laid out its panels, marks and tick labels.
            seen["layouts"] = page.evaluate(
                "Array.from(document.querySelectorAll('.plot')).map(p => {"
                "  const name = p.dataset.plot;"
                "  const box = e => e.getBoundingClientRect();"
                "  const middle = e => (box(e).left + box(e).right) / 2;"
                "  const labels = (axis, title) => Array.from(axis.querySelectorAll('text'))"
                "    .filter(t => !t.closest(`[id*='-${title}']`))"
                "    .map(t => ({text: t.textContent.trim(), x: middle(t)}));"
                "  const xaxis = p.querySelector(`#${name}-xaxis`);"
                "  return {"
                "    annotations: Array.from(p.querySelectorAll(`#${name}-annotation`))"
                "      .map(a => a.textContent.trim()),"
                "    marks: Array.from(p.querySelectorAll(`[id^='${name}-mark-']`)).map(middle),"
                "    yaxes: Array.from(p.querySelectorAll(`[id^='${name}-yaxis-']`)).map(a => {"
                "      const panel = p.querySelector(`#${name}-panel-${a.id.split('-').pop()}`);"
                "      return {top: box(panel).top, bottom: box(panel).bottom,"
                "              ticks: labels(a, 'ylabel').map(t => t.text)};"
                "    }),"
                "    xticks: xaxis ? labels(xaxis, 'xlabel') : null,"
                "  };"
                "})"
            )
            seen["first_line"] = page.evaluate(
                "document.body.firstElementChild && document.body.firstElementChild.id"
            )
            if "screenshot" in seen:
                page.set_viewport_size({"width": 1300, "height": 900})
                page.screenshot(path=seen["screenshot"], full_page=True)
        finally:
            browser.close()
    return seen


def test_the_html_report_draws_its_plots_offline_without_console_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "report.html"
    code = main(["replay", "--html", str(page_path), str(write_trace_file(tmp_path / "t.jsonl"))])
    assert code == 0, capsys.readouterr().err
    seen = open_page(page_path)
    assert seen["errors"] == []
    assert seen["requests"] == []  # everything is inlined: nothing fetched
    assert seen["plots"] == 3
    assert seen["svgs"] >= 3
    decisions, sweep, stops = seen["traces"]
    assert "(unset) / 9.9.9: would_stop" in decisions
    assert sweep == [
        "would_stop prompts",
        "stopped prompts",
        "self-recovered after would_stop",
        "saved tool calls",
        "saved model calls",
    ]
    assert set(stops) == {"tracked", "would_warn", "would_stop", "none"}
    assert seen["markers"] > 0
    assert seen["pwned"] is None  # the hostile prompt ID stayed data
    assert "self-recovered after would_stop\t1" in seen["text"]

    # The verdict comes first, and says the gate passed.
    assert seen["first_line"] == "verdict"
    assert seen["verdict"].startswith("verdict: PASS (invariants 0, inputs read completely")
    assert "pass" in seen["verdict_class"]
    decisions_layout, sweep_layout, _ = seen["layouts"]
    # The live threshold is marked on both panels of the sweep, at the threshold axis' 8.
    assert "live threshold 8" in sweep_layout["annotations"]
    (eight,) = [tick["x"] for tick in sweep_layout["xticks"] if tick["text"] == "8"]
    assert len(sweep_layout["marks"]) == 2
    assert all(abs(mark - eight) < 1.5 for mark in sweep_layout["marks"]), sweep_layout
    # Prompts and saved calls on y axes of their own that do not overlap, ticking whole numbers.
    first, second = sweep_layout["yaxes"]
    assert first["bottom"] <= second["top"] or second["bottom"] <= first["top"], sweep_layout
    for layout in seen["layouts"][:2]:
        for axis in layout["yaxes"]:
            assert axis["ticks"] and all(float(tick).is_integer() for tick in axis["ticks"]), axis
    # The decisions' time axis is in hours (UTC).
    hours = [tick["text"] for tick in decisions_layout["xticks"]]
    assert hours and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:00", hour) for hour in hours)
    assert "Per environment and version" in seen["text"]


def test_the_html_report_says_what_it_cut_and_when_the_input_stopped_early(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = Harness(mode="shadow")
    for index in range(25):
        prompt = harness.start_prompt(f"loop-{index}")
        for calls in [[FAIL] * 4] * 4:
            harness.batch(f"loop-{index}", calls, parent=prompt)
        prompt.end()
    spans = list(harness.span_exporter.get_finished_spans())
    trace_file = tmp_path / "t.jsonl"
    trace_file.write_text(json.dumps(encode_request(spans)) + "\n{broken\n", encoding="utf-8")
    page_path = tmp_path / "report.html"
    code = main(["replay", "--html", str(page_path), str(trace_file)])
    assert code == 1, capsys.readouterr().err
    seen = open_page(page_path, tmp_path / "cut.png")
    assert seen["errors"] == [] and seen["requests"] == []
    assert seen["verdict"].startswith("verdict: FAIL, exit 1 (input stopped early: ")
    assert "fail" in seen["verdict_class"]
    inputs = [line for line in seen["text"].splitlines() if line.startswith("inputs: ")]
    assert inputs == [
        f"inputs: {trace_file}; input stopped early: {trace_file}:2: invalid JSON"
        " (Expecting property name enclosed in double quotes at column 2)"
    ]
    assert seen["cuts"] == [
        "20 of 25 shown; 5 more (the JSON report lists the earliest 100).",
        "20 of 25 would-stop and stopped prompts drawn (the earliest); 5 more not drawn.",
    ]
    assert (tmp_path / "cut.png").stat().st_size > 0
