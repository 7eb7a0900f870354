"""Invariants of the reducer over random batch sequences (docs/contract.md section 2)."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from otel_guard.reducer import (
    BATCH_THRESHOLD,
    THRESHOLD,
    Batch,
    Decision,
    GuardInput,
    GuardState,
    Observation,
    reduce,
)

WARN_KINDS = frozenset({"warn", "would_warn"})
STOP_KINDS = frozenset({"stop", "would_stop"})
STREAK_KINDS = frozenset({"tracked"}) | WARN_KINDS | STOP_KINDS

# A small vocabulary so that random sequences often repeat the same failure key. Observations
# are drawn from pre-built pools: one draw per observation keeps generation fast.
TOOLS = ("run_shell", "run_shell", "run_shell", "read_file")
ERROR_TYPES = ("exit_code", "exit_code", "exit_code", "timeout")

eligible_failures = st.sampled_from(
    [
        Observation("call", tool, tool_type, "error", "error", error_type)
        for tool, tool_type, error_type in itertools.product(TOOLS, ("native", "mcp"), ERROR_TYPES)
    ]
)

tool_successes = st.sampled_from(
    [
        Observation("call", tool, "native", "success", execution, None)
        for tool, execution in itertools.product(
            ("read_file", "list_dir", "run_shell"), ("success", "not_started")
        )
    ]
)

any_observations = st.sampled_from(
    [
        Observation("call", *fields)
        for fields in itertools.product(
            ("run_shell", "read_file", None, "", " "),
            ("native", "mcp", None),
            ("success", "error", "cancelled", "timeout", ""),
            ("not_started", "success", "error", "cancelled", "unknown", None, "failed"),
            ("exit_code", "timeout", "unknown", "Exit Code", "exit/1", "", None, "a" * 65),
            (False, True),
        )
    ]
)


# Cancelled, not started, unknown and post-execution outcomes, of a tool that also fails.
ineligible_outcomes = st.sampled_from(
    [
        Observation("call", "run_shell", "native", terminal, execution, error_type)
        for terminal, execution, error_type in (
            ("cancelled", "not_started", None),
            ("cancelled", "error", "exit_code"),
            ("error", "cancelled", "exit_code"),
            ("error", "not_started", "exit_code"),
            ("error", "unknown", "exit_code"),
            ("error", None, "exit_code"),
            ("error", "success", "exit_code"),
            ("success", "unknown", None),
        )
    ]
)

LOOPING_FAILURE = Observation("call", "run_shell", "native", "error", "error", "exit_code")


@st.composite
def streak_batches(draw: st.DrawFn) -> tuple[Observation, ...]:
    """Several failures of one key, mostly the looping one, sometimes beside a tool's success."""
    failure = draw(st.one_of(st.just(LOOPING_FAILURE), st.just(LOOPING_FAILURE), eligible_failures))
    count = draw(st.integers(min_value=1, max_value=6))
    extras = draw(st.lists(tool_successes, max_size=1))
    return (failure,) * count + tuple(extras)


random_batches = st.lists(
    st.one_of(eligible_failures, tool_successes, any_observations), max_size=5
).map(tuple)

ineligible_batches = st.lists(ineligible_outcomes, min_size=1, max_size=2).map(tuple)

# Streaks are drawn more often than other batches so that runs reach warnings and stops.
observation_tuples = st.one_of(
    streak_batches(), streak_batches(), streak_batches(), ineligible_batches, random_batches
)

# At most one input-boundary event per batch, and mostly none, for the same reason.
BOUNDARY_EVENTS = ("none",) * 12 + ("incomplete", "external_input", "queued_prompt", "unreliable")


@st.composite
def guard_inputs(draw: st.DrawFn, mode: str) -> GuardInput:
    event = draw(st.sampled_from(BOUNDARY_EVENTS))
    return GuardInput(
        mode=mode,
        batch=Batch(complete=event != "incomplete", observations=draw(observation_tuples)),
        has_external_input=event == "external_input",
        has_queued_prompt=event == "queued_prompt",
        input_reliable=event != "unreliable",
    )


@dataclass(frozen=True)
class Step:
    before: GuardState
    guard_input: GuardInput
    decision: Decision


ALL_MODES = ("shadow", "warn", "enforce", "off")
DISABLED_START = GuardState("idle", None, 0, 0, 0, 1, True)


@st.composite
def runs(
    draw: st.DrawFn,
    modes: tuple[str, ...] = ALL_MODES,
    starts: tuple[GuardState, ...] = (GuardState.initial(),),
) -> list[Step]:
    """A prompt: one host mode, then a sequence of settled batches reduced in order."""
    mode = draw(st.sampled_from(modes))
    length = draw(st.integers(min_value=0, max_value=14))
    inputs = [draw(guard_inputs(mode)) for _ in range(length)]
    state = draw(st.sampled_from(starts))
    steps = []
    for guard_input in inputs:
        decision = reduce(state, guard_input)
        steps.append(Step(state, guard_input, decision))
        state = decision.state
    return steps


def counted(observation: Observation) -> bool:
    return not observation.provider_duplicate


def is_ineligible_outcome(observation: Observation) -> bool:
    """Cancelled, not started, unknown or post-execution, per the two-axis outcome contract."""
    terminal, execution = observation.terminal_status, observation.execution_status
    return (
        terminal == "cancelled"
        or execution in ("cancelled", "unknown", None)
        or (terminal == "error" and execution in ("not_started", "success"))
    )


PROPERTY_SETTINGS = settings(max_examples=75, deadline=None)


@PROPERTY_SETTINGS
@given(runs())
def test_stop_is_always_preceded_by_a_warning_for_the_same_candidate(steps: list[Step]) -> None:
    warned_ordinals: set[int] = set()
    for step in steps:
        ordinal = step.decision.state.candidate_ordinal
        if step.decision.kind in WARN_KINDS:
            warned_ordinals.add(ordinal)
        if step.decision.kind in STOP_KINDS:
            assert ordinal in warned_ordinals
            assert step.before.phase == "warned"
            assert step.before.candidate_ordinal == ordinal


@PROPERTY_SETTINGS
@given(runs())
def test_after_latched_only_none(steps: list[Step]) -> None:
    for step in steps:
        if step.before.phase == "latched":
            assert step.decision == Decision("none", step.before)


@PROPERTY_SETTINGS
@given(runs())
def test_ineligible_outcomes_never_raise_the_failure_count(steps: list[Step]) -> None:
    for step in steps:
        observations = [o for o in step.guard_input.batch.observations if counted(o)]
        after = step.decision.state
        if any(is_ineligible_outcome(o) for o in observations):
            assert step.decision.kind in ("none", "reset")
            assert after.failure_count in (0, step.before.failure_count)
        if step.decision.kind in STREAK_KINDS:
            # Only settled error/error calls of the batch can have been added.
            error_error = [
                o
                for o in observations
                if o.terminal_status == "error" and o.execution_status == "error"
            ]
            gained = after.failure_count - (
                step.before.failure_count if after.key == step.before.key else 0
            )
            assert 1 <= gained <= len(error_error)


@PROPERTY_SETTINGS
@given(runs())
def test_one_batch_alone_never_warns(steps: list[Step]) -> None:
    if steps:
        assert steps[0].decision.kind in ("none", "reset", "tracked")
    for step in steps:
        after = step.decision.state
        if step.decision.kind in WARN_KINDS:
            assert after.batch_count >= BATCH_THRESHOLD
            assert after.failure_count >= THRESHOLD
            assert step.before.key == after.key
        if after.candidate_ordinal != step.before.candidate_ordinal:
            assert step.decision.kind in ("reset", "tracked")


@PROPERTY_SETTINGS
@given(runs())
def test_reduce_never_mutates_its_input_and_is_deterministic(steps: list[Step]) -> None:
    for step in steps:
        state_copy = copy.deepcopy(step.before)
        input_copy = copy.deepcopy(step.guard_input)
        again = reduce(step.before, step.guard_input)
        assert again == step.decision
        assert reduce(state_copy, input_copy) == step.decision
        assert step.before == state_copy
        assert step.guard_input == input_copy


@PROPERTY_SETTINGS
@given(runs(starts=(GuardState.initial(), DISABLED_START)))
def test_once_enforcement_is_disabled_it_stays_disabled(steps: list[Step]) -> None:
    for step in steps:
        if step.before.enforcement_disabled:
            assert step.decision.state.enforcement_disabled


@PROPERTY_SETTINGS
@given(runs(modes=("enforce",), starts=(GuardState.initial(), DISABLED_START)))
def test_enforce_never_stops_once_enforcement_is_disabled(steps: list[Step]) -> None:
    for step in steps:
        if step.before.enforcement_disabled or step.decision.state.enforcement_disabled:
            assert step.decision.kind != "stop"


@PROPERTY_SETTINGS
@given(runs())
def test_counts_only_fall_when_the_candidate_is_reset_or_replaced(steps: list[Step]) -> None:
    for step in steps:
        before, after = step.before, step.decision.state
        if step.decision.kind == "reset":
            assert (after.phase, after.key, after.failure_count, after.batch_count) == (
                "idle",
                None,
                0,
                0,
            )
            assert after.candidate_ordinal == 0
        elif after.candidate_ordinal != before.candidate_ordinal:
            # A new key starts a fresh streak: one batch, at least one failure.
            assert after.batch_count == 1
            assert after.failure_count >= 1
        else:
            assert after.failure_count >= before.failure_count
            assert after.batch_count >= before.batch_count


@PROPERTY_SETTINGS
@given(runs())
def test_next_candidate_ordinal_never_decreases(steps: list[Step]) -> None:
    for step in steps:
        before, after = step.before, step.decision.state
        new_candidate = after.candidate_ordinal not in (0, before.candidate_ordinal)
        if new_candidate:
            assert after.candidate_ordinal == before.next_candidate_ordinal
            assert after.next_candidate_ordinal == before.next_candidate_ordinal + 1
        else:
            assert after.next_candidate_ordinal == before.next_candidate_ordinal


@PROPERTY_SETTINGS
@given(runs())
def test_off_mode_never_changes_the_state(steps: list[Step]) -> None:
    for step in steps:
        if step.guard_input.mode == "off":
            assert step.decision == Decision("none", GuardState.initial())


def test_random_runs_reach_a_stop_so_the_properties_are_exercised() -> None:
    stopping = find(
        runs(),
        lambda steps: any(step.decision.kind == "stop" for step in steps),
        settings=settings(
            max_examples=500, database=None, derandomize=True, phases=[Phase.generate]
        ),
    )
    assert [step.decision.kind for step in stopping].count("stop") == 1
