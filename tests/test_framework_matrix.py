"""The compatibility matrix: real agent frameworks, offline, under their users' instrumentation.

Each cell runs one framework in its own process (``tests/matrix_apps.py``: frameworks keep
process-wide state) with a scripted model: one user prompt, 6 model turns of 2 parallel calls
to a tool that always raises the same exception, then an answer. The guard joins the app's own
tracer provider through ``install_guard(mode="shadow")``. Per cell:

* live shadow: the guard's decisions in that process;
* replay: ``otel-guard replay --format json`` on the recorded OTLP/JSON lines gives the same
  decisions and no invariant violation;
* privacy: no content canary (prompt, tool arguments, error message) survives the
  ``RedactingSpanExporter`` on the encoded OTLP bytes, and each was there before it.

Where an instrumentation gives the guard nothing to decide on, the cell asserts exactly that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matrix_apps
import pytest

from otel_guard.cli import main

APPS = Path(__file__).with_name("matrix_apps.py")

DECIDES = "decides"  # a classified failure on every call, one batch per model turn
UNCLASSIFIED = "unclassified"  # every failure is unknown: no error type, no exception event
NO_TURNS = "no_turns"  # no model-call spans: the turns cannot be told apart


@dataclass(frozen=True)
class Cell:
    framework: str  # the module a user imports
    instrumentation: str  # the module of the instrumentation, or the framework's own
    extra: str
    expect: str


CELLS: dict[str, Cell] = {
    "langgraph-openinference": Cell(
        "langgraph", "openinference.instrumentation.langchain", "matrix-langgraph", DECIDES
    ),
    "langgraph-openllmetry": Cell(
        "langgraph", "opentelemetry.instrumentation.langchain", "matrix-langgraph", DECIDES
    ),
    "smolagents-openinference": Cell(
        "smolagents", "openinference.instrumentation.smolagents", "matrix-smolagents", DECIDES
    ),
    "strands-native": Cell("strands", "strands.telemetry", "matrix-strands", DECIDES),
    "adk-native": Cell("google.adk", "google.adk.telemetry", "matrix-google-adk", DECIDES),
    "openai-agents-openinference": Cell(
        "agents",
        "openinference.instrumentation.openai_agents",
        "matrix-openai-agents",
        UNCLASSIFIED,
    ),
    "openai-agents-openllmetry": Cell(
        "agents", "opentelemetry.instrumentation.openai_agents", "openai-agents", UNCLASSIFIED
    ),
    "crewai-openinference": Cell(
        "crewai", "openinference.instrumentation.crewai", "matrix-crewai", NO_TURNS
    ),
    "pydantic-ai-native": Cell(
        "pydantic_ai", "pydantic_ai.models.instrumented", "pydantic-ai", DECIDES
    ),
    "pydantic-ai-openinference": Cell(
        "pydantic_ai",
        "openinference.instrumentation.pydantic_ai",
        "matrix-pydantic-ai",
        DECIDES,
    ),
    "handwritten-genai": Cell("opentelemetry.trace", "opentelemetry.sdk.trace", "test", DECIDES),
}


@dataclass(frozen=True)
class Recording:
    live: dict[str, Any]  # what the app's process reported
    path: Path  # its spans as OTLP/JSON lines
    before: bytes  # its spans as OTLP protobuf bytes
    after: bytes  # the same after RedactingSpanExporter


_recordings: dict[str, Recording] = {}


def _environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("OTEL_SDK_DISABLED", None)  # the SDK must run: the guard is a processor in it
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        environment.pop(key, None)
    environment.update(matrix_apps.QUIET_ENVIRONMENT)
    # The app process imports otel_guard from this checkout, like the tests do.
    root = str(APPS.parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, [environment.get("PYTHONPATH")])]
    )
    return environment


def _recording(name: str, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    cell = CELLS[name]
    reason = f"{name} needs the '{cell.extra}' extra installed"
    pytest.importorskip(cell.framework, reason=reason)
    pytest.importorskip(cell.instrumentation, reason=reason)
    if name not in _recordings:
        out = tmp_path_factory.mktemp("matrix") / f"{name}.jsonl"
        done = subprocess.run(
            [sys.executable, str(APPS), name, str(out)],
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        live = json.loads(done.stdout.strip().splitlines()[-1])
        _recordings[name] = Recording(
            live,
            out,
            Path(f"{out}.otlp").read_bytes(),
            Path(f"{out}.redacted.otlp").read_bytes(),
        )
    return _recordings[name]


def _replay(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    status = main(["replay", "--format", "json", str(path)])
    return status, json.loads(capsys.readouterr().out)


def _advancing(decisions: dict[str, int]) -> dict[str, int]:
    return {
        k: v for k, v in decisions.items() if v and k in ("tracked", "would_warn", "would_stop")
    }


@pytest.mark.parametrize("name", sorted(CELLS))
def test_live_shadow(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    recording = _recording(name, tmp_path_factory)
    decisions = recording.live["decisions"]
    expect = CELLS[name].expect
    if expect == DECIDES:
        # 12 failures of one tool with one error type over 6 batches: the reminder point, then
        # the stop point (in shadow: would_warn, would_stop).
        assert decisions.get("would_warn") == 1, recording.live
        assert decisions.get("would_stop") == 1, recording.live
    elif expect == UNCLASSIFIED:
        assert _advancing(decisions) == {}, recording.live
    else:
        # One batch at most (no model-call span ends a turn): tracked, never a reminder.
        assert _advancing(decisions).keys() <= {"tracked"}, recording.live
    assert "tool_calls_dropped" not in recording.live["diagnostics"]


@pytest.mark.parametrize("name", sorted(CELLS))
def test_replay_gives_the_live_decisions(
    name: str, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = _recording(name, tmp_path_factory)
    status, report = _replay(recording.path, capsys)
    decisions = {k: v for k, v in report["decisions"].items() if v}
    assert decisions == recording.live["decisions"]
    assert report["invariant_violations"] == 0, report["invariants"]
    expect = CELLS[name].expect
    if expect == DECIDES:
        assert report["prompts"] == 1 and report["batches"] >= matrix_apps.TURNS
        assert report["decisions"]["would_warn"] == 1 and report["decisions"]["would_stop"] == 1
        assert status == 0
    elif expect == UNCLASSIFIED:
        # The guard sees the prompt and all six turns, and can classify none of the failures.
        assert report["prompts"] == 1 and report["batches"] == matrix_apps.TURNS
        assert _advancing(decisions) == {}
    else:
        # No model-call span separates the turns: at most one batch, never a reminder.
        assert report["batches"] <= 1
        assert _advancing(decisions).keys() <= {"tracked"}


@pytest.mark.parametrize("name", sorted(CELLS))
def test_no_content_canary_survives_redaction(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    recording = _recording(name, tmp_path_factory)
    for place, marker in matrix_apps.CANARIES.items():
        if name.startswith("openai-agents") and place == "error_message":
            # The SDK never records the exception's message (its default failure text stands
            # in): nothing to leak, so nothing to find before redaction either.
            assert marker.encode() not in recording.before
            continue
        assert marker.encode() in recording.before, f"{place} is in the spans"
        assert marker.encode() not in recording.after, f"{place} survived redaction"
    assert recording.after, "the redacted spans were exported, not dropped"
