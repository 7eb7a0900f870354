"""The replay's what-if reducer: exactly the reducer with other constants, never the live one."""

from __future__ import annotations

import itertools
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_guard import reducer
from otel_guard.reducer import (
    Batch,
    Decision,
    GuardInput,
    GuardState,
    Observation,
    reduce,
    reduce_with_thresholds,
)

_OBSERVATIONS = [
    Observation("c", tool, "native", "error", "error", error)
    for tool, error in itertools.product(("run_shell", "read_file"), ("exit_code", "timeout"))
] + [
    Observation("c", "run_shell", "native", "success", "success", None),
    Observation("c", "read_file", "native", "cancelled", "cancelled", None),
    Observation("c", "run_shell", "native", "error", "not_started", None),
]
_INPUTS = st.builds(
    lambda mode, calls, complete, external, reliable: GuardInput(
        mode, Batch(complete, tuple(calls)), external, False, reliable
    ),
    st.sampled_from(["shadow", "warn", "enforce", " Enforce ", "bogus"]),
    # Mostly the same failure, repeated: streaks form, warn and stop.
    st.tuples(st.sampled_from([_OBSERVATIONS[0]] * 6 + _OBSERVATIONS), st.integers(1, 5)).map(
        lambda pair: [pair[0]] * pair[1]
    ),
    st.sampled_from([True, True, True, False]),
    st.sampled_from([False, False, False, True]),
    st.sampled_from([True, True, True, False]),
)


def _run(inputs: list[GuardInput], step: object) -> list[Decision]:
    state = GuardState.initial()
    decisions = []
    for guard_input in inputs:
        decision = step(state, guard_input)  # type: ignore[operator]
        decisions.append(decision)
        state = decision.state
    return decisions


@settings(max_examples=300, deadline=None)
@given(
    inputs=st.lists(_INPUTS, min_size=1, max_size=14),
    threshold=st.integers(min_value=1, max_value=20),
    batch_threshold=st.integers(min_value=1, max_value=6),
)
def test_what_if_decisions_equal_the_reducer_with_those_constants(
    inputs: list[GuardInput], threshold: int, batch_threshold: int
) -> None:
    what_if = _run(
        inputs,
        lambda s, i: reduce_with_thresholds(
            s, i, threshold=threshold, batch_threshold=batch_threshold
        ),
    )
    # The reducer reads its constants when it runs: patched here, it is the reference.
    with (
        mock.patch.object(reducer, "THRESHOLD", threshold),
        mock.patch.object(reducer, "BATCH_THRESHOLD", batch_threshold),
    ):
        expected = _run(inputs, reduce)
    assert what_if == expected
    assert (reducer.THRESHOLD, reducer.BATCH_THRESHOLD) == (8, 2)


@settings(max_examples=100, deadline=None)
@given(inputs=st.lists(_INPUTS, min_size=1, max_size=14))
def test_what_if_with_the_live_constants_is_the_reducer(inputs: list[GuardInput]) -> None:
    assert _run(inputs, lambda s, i: reduce_with_thresholds(s, i, 8, 2)) == _run(inputs, reduce)


def test_a_batch_without_a_decision_during_a_streak_stays_without_one_at_any_threshold() -> None:
    # Another tool's success, or only provider duplicates, leave a streak as it is: lowering the
    # thresholds must not turn such a batch into a warning.
    failing = Observation("c", "read_file", "native", "error", "error", "timeout")
    other_success = Observation("c", "run_shell", "native", "success", "success", None)
    duplicate = failing._replace(provider_duplicate=True)
    for quiet in (other_success, duplicate):
        inputs = [
            GuardInput("warn", Batch(True, (failing, failing)), False, False, True),
            GuardInput("warn", Batch(True, (quiet,)), False, False, True),
        ]
        decisions = _run(inputs, lambda s, i: reduce_with_thresholds(s, i, 1, 1))
        assert [d.kind for d in decisions] == ["tracked", "none"]
        assert decisions[1].state == decisions[0].state
