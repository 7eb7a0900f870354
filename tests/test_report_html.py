"""The HTML replay report, opened offline in a real headless Chromium (the ``browser`` extra).

Skipped without plotly (the ``html`` extra), Playwright's Python package, or a system Chromium;
no browser is ever downloaded: Playwright drives the system one by its path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import FAIL, OK, Harness

from otel_guard.cli import main
from otel_guard.replay.otlp_json import encode_request

pytest.importorskip("plotly", reason="the html extra (plotly) is not installed")
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


def open_page(path: Path) -> dict[str, Any]:
    """Load the page from disk with every network request refused; what the browser saw."""
    seen: dict[str, Any] = {"errors": [], "requests": []}
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
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=20_000)
            seen["plots"] = page.locator(".js-plotly-plot").count()
            seen["svgs"] = page.locator(".js-plotly-plot .main-svg").count()
            seen["traces"] = page.evaluate(
                "Array.from(document.querySelectorAll('.js-plotly-plot'))"
                ".map(p => p.data.map(t => t.name))"
            )
            seen["markers"] = page.locator(".js-plotly-plot .scatterlayer .point").count()
            seen["pwned"] = page.evaluate("window.pwned === undefined ? null : window.pwned")
            seen["text"] = page.inner_text("body")
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
