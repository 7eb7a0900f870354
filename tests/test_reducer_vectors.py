"""The shared reducer vectors are the Python reducer's current decisions.

``tests/vectors/reducer.json`` is read by the Go connector's reducer test too: a change to the
Python reducer that is not regenerated fails here, and a Go reducer that differs fails there.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import vector_generator

from otel_guard.reducer import RESET_REASONS

VECTORS = Path(__file__).parent / "vectors"


def test_vectors_are_regenerated() -> None:
    committed = (VECTORS / "reducer.json").read_text(encoding="utf-8")
    assert committed == vector_generator("generate_reducer_vectors").render(), (
        "tests/vectors/reducer.json is stale: run python tests/vectors/generate_reducer_vectors.py"
    )


def test_vectors_cover_every_rule() -> None:
    data = json.loads((VECTORS / "reducer.json").read_text(encoding="utf-8"))
    kinds: set[str] = set()
    reasons: set[str] = set()
    disabled_by_step = False
    what_if = False
    for scenario in data["scenarios"]:
        if (scenario["threshold"], scenario["batch_threshold"]) != (8, 2):
            what_if = what_if or any(s["kind"] == "would_warn" for s in scenario["steps"])
        before = scenario["initial"]
        for step in scenario["steps"]:
            kinds.add(step["kind"])
            if step["reason"] is not None:
                reasons.add(step["reason"])
            if step["state"]["enforcement_disabled"] and not before["enforcement_disabled"]:
                disabled_by_step = True
            before = step["state"]
    assert kinds == {"none", "reset", "tracked", "would_warn", "warn", "would_stop", "stop"}
    assert reasons == set(RESET_REASONS)
    assert disabled_by_step
    assert what_if
