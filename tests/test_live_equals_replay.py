"""Live and replayed decisions on the same spans are equal (contract sections 3b, 3c [12-02]).

Hypothesis draws span trees of every profile (``tests/span_trees.py``): attributes set at start
or just before the end, outcomes of every kind, start and end times in any order a tracer
allows. The spans run live through a guard, in the order of their times, and the finished spans
are then replayed from OTLP/JSON: the decisions, reset reasons and diagnostics must be the same,
and replay must find no invariant violated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from span_trees import Node, build, reset_counts, run

from otel_guard.cli import main

T = TypeVar("T")


class _Drawn:
    """Choices drawn by Hypothesis, so that a failing tree shrinks."""

    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def boolean(self) -> bool:
        return self._draw(st.booleans())

    def integer(self, low: int, high: int) -> int:
        return self._draw(st.integers(low, high))

    def choice(self, options: Sequence[T]) -> T:
        return self._draw(st.sampled_from(options))


@st.composite
def trees(draw: st.DrawFn, loops: bool) -> list[Node]:
    return build(_Drawn(draw), loops)


def check(nodes: list[Node], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.jsonl"
    harness = run(nodes, path)
    decisions, resets = harness.decision_counts(), reset_counts(harness)
    diagnostics = harness.diagnostic_counts()
    assert "internal_error" not in diagnostics
    capsys.readouterr()
    main(["replay", "--format", "json", str(path)])
    report = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in report["decisions"].items() if v} == decisions
    assert {k: v for k, v in report["reset_reasons"].items() if v} == resets
    assert {k: v for k, v in report["diagnostics"].items() if v} == diagnostics
    assert report["invariant_violations"] == 0


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(nodes=trees(loops=False))
def test_span_trees_of_any_shape_decide_alike_live_and_in_replay(
    nodes: list[Node], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check(nodes, tmp_path, capsys)


@SETTINGS
@given(nodes=trees(loops=True))
def test_agent_loops_decide_alike_live_and_in_replay(
    nodes: list[Node], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check(nodes, tmp_path, capsys)
