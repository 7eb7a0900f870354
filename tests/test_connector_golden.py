"""The Go connector's golden inputs and numbers are the Python replay's.

``collector/repeatedtoolfailureguardconnector/testdata/expected.json`` holds what
``otel-guard replay --format json`` reports for each golden file; the Go test
``TestDecisionCountsEqualReplay`` asserts the connector gives the same decision counts. Here the
Python side is held to the same numbers, so a change to either guard that the other lacks fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import vector_generator

ROOT = Path(__file__).resolve().parents[1]
TESTDATA = ROOT / "collector" / "repeatedtoolfailureguardconnector" / "testdata"


def _expected() -> dict[str, dict[str, object]]:
    files: dict[str, dict[str, object]] = json.loads(
        (TESTDATA / "expected.json").read_text(encoding="utf-8")
    )["files"]
    return files


@pytest.mark.parametrize("name", sorted(_expected()))
def test_replay_gives_the_golden_numbers(name: str) -> None:
    numbers = vector_generator("generate_connector_golden").replay_numbers(TESTDATA / name)
    assert numbers == _expected()[name]
    decisions = numbers["decisions"]
    assert isinstance(decisions, dict) and sum(decisions.values()) > 0


def test_golden_inputs_are_committed() -> None:
    generator = vector_generator("generate_connector_golden")
    for name, render in (
        ("genai-traces.jsonl", generator.render_genai),
        ("openinference-traces.jsonl", generator.render_openinference),
        ("section3-traces.jsonl", generator.render_section_3),
    ):
        assert (TESTDATA / name).read_text(encoding="utf-8") == render(), (
            "run python tests/vectors/generate_connector_golden.py"
        )
    assert (TESTDATA / "demo-traces.jsonl").read_bytes() == (
        ROOT / "examples" / "demo-traces.jsonl"
    ).read_bytes(), "run python tests/vectors/generate_connector_golden.py"
    assert set(_expected()) == set(generator.FILES)
