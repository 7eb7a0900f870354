"""Example-based tests of the pure reducer against the algorithm of docs/contract.md section 2.

Every expected state below is written out by hand from the algorithm, never taken from a run.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from otel_guard import reducer
from otel_guard.reducer import (
    BATCH_THRESHOLD,
    REMINDER,
    STOP_MESSAGE,
    THRESHOLD,
    Batch,
    Decision,
    DecisionKind,
    FailureKey,
    GuardInput,
    GuardState,
    Mode,
    Observation,
    ResetReason,
    effective_mode,
    parse_mode,
    reduce,
)

SHELL_EXIT = FailureKey("run_shell", "exit_code")

# Tracking run_shell/exit_code: 3 failures in 1 batch, candidate 1, next ordinal 2.
TRACKING = GuardState("tracking", SHELL_EXIT, 3, 1, 1, 2, False)
# Warned for run_shell/exit_code: 8 failures over 2 batches, candidate 1.
WARNED = GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, False)
LATCHED = GuardState("latched", SHELL_EXIT, 9, 3, 1, 2, False)
IDLE = GuardState.initial()
IDLE_DISABLED = GuardState("idle", None, 0, 0, 0, 1, True)


def obs(
    tool: str | None = "run_shell",
    terminal: str = "error",
    execution: str | None = "error",
    error_type: str | None = "exit_code",
    *,
    call_id: str = "call",
    duplicate: bool = False,
) -> Observation:
    return Observation(
        call_id=call_id,
        policy_tool_name=tool,
        tool_type="native",
        terminal_status=terminal,
        execution_status=execution,
        execution_error_type=error_type,
        provider_duplicate=duplicate,
    )


def failures(n: int, tool: str = "run_shell", error_type: str = "exit_code") -> list[Observation]:
    return [obs(tool, error_type=error_type, call_id=f"{tool}-{i}") for i in range(n)]


def success(tool: str = "run_shell", *, duplicate: bool = False) -> Observation:
    return obs(tool, "success", "success", None, call_id=f"{tool}-ok", duplicate=duplicate)


def cancelled() -> Observation:
    return obs("run_shell", "cancelled", "not_started", None, call_id="cancelled")


def not_started() -> Observation:
    return obs("run_shell", "error", "not_started", "validation", call_id="not-started")


def post_execution() -> Observation:
    return obs("run_shell", "error", "success", None, call_id="post")


def unknown() -> Observation:
    return obs("run_shell", "error", "unknown", None, call_id="unknown")


def contract_violation() -> Observation:
    return obs("run_shell", "success", "error", "exit_code", call_id="violation")


def batch(
    *observations: Observation | list[Observation],
    mode: str = "shadow",
    complete: bool = True,
    external: bool = False,
    queued: bool = False,
    reliable: bool = True,
) -> GuardInput:
    flat: list[Observation] = []
    for item in observations:
        flat.extend(item if isinstance(item, list) else [item])
    return GuardInput(mode, Batch(complete, tuple(flat)), external, queued, reliable)


def run(state: GuardState, *inputs: GuardInput) -> list[Decision]:
    decisions = []
    for guard_input in inputs:
        decision = reduce(state, guard_input)
        decisions.append(decision)
        state = decision.state
    return decisions


def reset_to(state: GuardState, disabled: bool) -> GuardState:
    return GuardState("idle", None, 0, 0, 0, state.next_candidate_ordinal, disabled)


# --- constants and values -----------------------------------------------------------------


def test_initial_state_is_idle_with_first_ordinal_pending() -> None:
    assert GuardState.initial() == ("idle", None, 0, 0, 0, 1, False)


def test_thresholds_are_eight_failures_across_two_batches() -> None:
    assert (THRESHOLD, BATCH_THRESHOLD) == (8, 2)


def test_reminder_text_is_the_fixed_contract_text() -> None:
    assert REMINDER == (
        "System: the same tool execution has failed repeatedly for the same classified reason. "
        "Do not repeat the same approach. Inspect the returned result, change the approach or "
        "required preconditions, or explain the blocker."
    )


def test_stop_text_is_the_fixed_contract_text() -> None:
    assert STOP_MESSAGE == (
        "Automatic continuation stopped because the same tool execution failure continued "
        "after a corrective reminder. New user input is required to continue."
    )


@pytest.mark.parametrize("text", [REMINDER, STOP_MESSAGE])
def test_host_texts_carry_no_tool_data(text: str) -> None:
    for tool_data in ("run_shell", "exit_code", "read_file", "call", "mcp", "native", "{", "%"):
        assert tool_data not in text


def test_reducer_module_imports_no_opentelemetry() -> None:
    # The source beside the module (a compiled build loads a binary module from there).
    tree = ast.parse(Path(reducer.__file__).with_name("reducer.py").read_text(encoding="utf-8"))
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            imported.append(node.module)
    assert imported
    assert not [name for name in imported if name.split(".")[0] == "opentelemetry"]


def test_importing_the_reducer_loads_no_opentelemetry_module() -> None:
    # The package's public names are imported on first use: the reducer, imported alone in a
    # fresh interpreter, brings no OpenTelemetry module in (and works without one installed).
    probe = (
        "import sys\n"
        "from otel_guard.reducer import GuardState, reduce\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
        "import otel_guard\n"
        "print(otel_guard.GuardSpanProcessor.__name__, 'GuardSpanProcessor' in dir(otel_guard))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines() == ["[]", "GuardSpanProcessor True"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("off", "off"),
        ("shadow", "shadow"),
        ("warn", "warn"),
        ("enforce", "enforce"),
        ("  Enforce\n", "enforce"),
        ("WARN", "warn"),
        ("\tShadow ", "shadow"),
        (" OFF", "off"),
        ("", None),
        ("   ", None),
        (None, None),
        ("enforcing", None),
        ("en force", None),
        ("1", None),
    ],
)
def test_parse_mode_trims_and_lower_cases_and_rejects_other_values(
    raw: str | None, expected: str | None
) -> None:
    assert parse_mode(raw) == expected


# --- the terminal/execution decision table ------------------------------------------------

TERMINALS = ("success", "error", "cancelled", "timeout", "ERROR")
EXECUTIONS = ("not_started", "success", "error", "cancelled", "unknown", None, "failed", "Error")

# (terminal, execution) -> (kind, reason, enforcement disabled afterwards), applied to TRACKING
# with one run_shell observation whose error type is the tracked one.
DECISION_TABLE: dict[tuple[str, str | None], tuple[DecisionKind, ResetReason | None, bool]] = {
    ("success", "not_started"): ("reset", "success", False),
    ("success", "success"): ("reset", "success", False),
    ("success", "error"): ("reset", "contract_violation", True),
    ("success", "cancelled"): ("reset", "contract_violation", True),
    ("success", "unknown"): ("reset", "unknown", True),
    ("success", None): ("reset", "unknown", True),
    ("success", "failed"): ("reset", "unknown", True),
    ("success", "Error"): ("reset", "unknown", True),
    ("error", "not_started"): ("reset", "not_started", False),
    ("error", "success"): ("reset", "post_execution_failure", False),
    ("error", "error"): ("tracked", None, False),
    ("error", "cancelled"): ("reset", "cancelled", False),
    ("error", "unknown"): ("reset", "unknown", True),
    ("error", None): ("reset", "unknown", True),
    ("error", "failed"): ("reset", "unknown", True),
    ("error", "Error"): ("reset", "unknown", True),
    ("cancelled", "not_started"): ("reset", "cancelled", False),
    ("cancelled", "success"): ("reset", "cancelled", False),
    ("cancelled", "error"): ("reset", "cancelled", False),
    ("cancelled", "cancelled"): ("reset", "cancelled", False),
    ("cancelled", "unknown"): ("reset", "cancelled", False),
    ("cancelled", None): ("reset", "cancelled", False),
    ("cancelled", "failed"): ("reset", "cancelled", False),
    ("cancelled", "Error"): ("reset", "cancelled", False),
    ("timeout", "not_started"): ("reset", "unknown", True),
    ("timeout", "success"): ("reset", "unknown", True),
    ("timeout", "error"): ("reset", "unknown", True),
    ("timeout", "cancelled"): ("reset", "unknown", True),
    ("timeout", "unknown"): ("reset", "unknown", True),
    ("timeout", None): ("reset", "unknown", True),
    ("timeout", "failed"): ("reset", "unknown", True),
    ("timeout", "Error"): ("reset", "unknown", True),
    ("ERROR", "not_started"): ("reset", "unknown", True),
    ("ERROR", "success"): ("reset", "unknown", True),
    ("ERROR", "error"): ("reset", "unknown", True),
    ("ERROR", "cancelled"): ("reset", "unknown", True),
    ("ERROR", "unknown"): ("reset", "unknown", True),
    ("ERROR", None): ("reset", "unknown", True),
    ("ERROR", "failed"): ("reset", "unknown", True),
    ("ERROR", "Error"): ("reset", "unknown", True),
}


def test_decision_table_covers_every_terminal_and_execution_pair() -> None:
    assert set(DECISION_TABLE) == set(itertools.product(TERMINALS, EXECUTIONS))


@pytest.mark.parametrize(("terminal", "execution"), sorted(DECISION_TABLE, key=repr))
def test_terminal_and_execution_pair_decides_per_table(
    terminal: str, execution: str | None
) -> None:
    kind, reason, disabled = DECISION_TABLE[(terminal, execution)]
    decision = reduce(TRACKING, batch(obs("run_shell", terminal, execution, "exit_code")))
    if kind == "tracked":
        expected = Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 2, 1, 2, False))
    else:
        expected = Decision(kind, reset_to(TRACKING, disabled), reason)
    assert decision == expected


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (success(), Decision("none", IDLE)),
        (not_started(), Decision("none", IDLE)),
        (post_execution(), Decision("none", IDLE)),
        (cancelled(), Decision("none", IDLE)),
        (unknown(), Decision("reset", IDLE_DISABLED, "unknown")),
        (contract_violation(), Decision("reset", IDLE_DISABLED, "contract_violation")),
    ],
)
def test_ineligible_outcomes_from_idle_reset_only_when_the_disable_flag_changes(
    observation: Observation, expected: Decision
) -> None:
    assert reduce(IDLE, batch(observation)) == expected


def test_disabling_outcome_from_idle_already_disabled_is_none() -> None:
    assert reduce(IDLE_DISABLED, batch(unknown())) == Decision("none", IDLE_DISABLED)


# --- error types and tool names -----------------------------------------------------------


@pytest.mark.parametrize(
    "error_type",
    [
        "exit code",  # space
        "exit/1",  # slash
        "ExitCode",  # upper case
        "EXIT_CODE",
        "a" * 65,  # longer than 64 characters
        "unknown",
        "",
        "   ",
        None,
        "1exit",  # must start with a letter
        "_exit",
        "exit_code\n",  # a trailing newline is not part of a closed identifier
        "exit:1",
        "timeout ",
    ],
)
def test_free_text_or_missing_error_type_is_ineligible_and_disables(
    error_type: str | None,
) -> None:
    decision = reduce(TRACKING, batch(obs("run_shell", error_type=error_type)))
    assert decision == Decision("reset", reset_to(TRACKING, True), "unknown")


@pytest.mark.parametrize("error_type", ["a", "a" * 64, "exit_code.1-x", "http.503", "e-9"])
def test_identifier_error_types_are_eligible(error_type: str) -> None:
    decision = reduce(IDLE, batch(obs("run_shell", error_type=error_type)))
    key = FailureKey("run_shell", error_type)
    assert decision == Decision("tracked", GuardState("tracking", key, 1, 1, 1, 2, False))


@pytest.mark.parametrize("tool", [None, "", "  "])
def test_failure_without_tool_name_is_ineligible_and_disables(tool: str | None) -> None:
    decision = reduce(TRACKING, batch(obs(tool)))
    assert decision == Decision("reset", reset_to(TRACKING, True), "unknown")


@pytest.mark.parametrize("tool", [None, "", "  "])
def test_success_without_tool_name_is_unknown_and_disables(tool: str | None) -> None:
    decision = reduce(TRACKING, batch(obs(tool, "success", "success", None)))
    assert decision == Decision("reset", reset_to(TRACKING, True), "unknown")


def test_same_tool_with_another_error_type_is_a_new_key() -> None:
    # Same tool, different frozen execution error type: a different key, so a new streak.
    decision = reduce(TRACKING, batch(obs("run_shell", error_type="timeout")))
    key = FailureKey("run_shell", "timeout")
    assert decision == Decision("tracked", GuardState("tracking", key, 1, 1, 2, 3, False))


# --- thresholds, warning and stop ---------------------------------------------------------


def test_eight_failures_in_one_batch_do_not_warn() -> None:
    for mode in ("shadow", "warn", "enforce"):
        decision = reduce(IDLE, batch(failures(8), mode=mode))
        assert decision == Decision(
            "tracked", GuardState("tracking", SHELL_EXIT, 8, 1, 1, 2, False)
        )


def test_many_failures_in_one_batch_do_not_warn() -> None:
    decision = reduce(IDLE, batch(failures(50), mode="enforce"))
    assert decision == Decision("tracked", GuardState("tracking", SHELL_EXIT, 50, 1, 1, 2, False))


def test_eight_failures_across_two_batches_warn() -> None:
    first, second = run(IDLE, batch(failures(4), mode="warn"), batch(failures(4), mode="warn"))
    assert first == Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False))
    assert second == Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, False))


def test_seven_failures_across_two_batches_keep_tracking_until_the_eighth() -> None:
    decisions = run(
        IDLE,
        batch(failures(4), mode="warn"),
        batch(failures(3), mode="warn"),
        batch(failures(1), mode="warn"),
    )
    assert decisions == [
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 7, 2, 1, 2, False)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 3, 1, 2, False)),
    ]


def test_a_large_second_batch_warns_and_does_not_skip_to_a_stop() -> None:
    decisions = run(IDLE, batch(failures(1), mode="enforce"), batch(failures(20), mode="enforce"))
    assert decisions[1] == Decision("warn", GuardState("warned", SHELL_EXIT, 21, 2, 1, 2, False))


def test_eight_failures_then_one_more_batch_warns_on_the_second_batch() -> None:
    decisions = run(IDLE, batch(failures(8), mode="warn"), batch(failures(1), mode="warn"))
    assert [d.kind for d in decisions] == ["tracked", "warn"]
    assert decisions[1].state == GuardState("warned", SHELL_EXIT, 9, 2, 1, 2, False)


def test_next_matching_batch_after_the_warning_stops() -> None:
    decisions = run(
        IDLE,
        batch(failures(4), mode="enforce"),
        batch(failures(4), mode="enforce"),
        batch(failures(1), mode="enforce"),
    )
    assert decisions == [
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, False)),
        Decision("stop", GuardState("latched", SHELL_EXIT, 9, 3, 1, 2, False)),
    ]


def test_batches_without_a_matching_failure_after_the_warning_do_not_stop() -> None:
    decisions = run(
        WARNED,
        batch(success("read_file"), mode="enforce"),
        batch(failures(1, tool="read_file"), success("read_file"), mode="enforce"),
        batch(obs("run_shell", duplicate=True), mode="enforce"),
        batch(failures(2), mode="enforce"),
    )
    assert decisions == [
        Decision("none", WARNED),
        Decision("none", WARNED),
        Decision("none", WARNED),
        Decision("stop", GuardState("latched", SHELL_EXIT, 10, 3, 1, 2, False)),
    ]


@pytest.mark.parametrize(
    ("mode", "kinds"),
    [
        ("shadow", ["tracked", "would_warn", "would_stop"]),
        ("warn", ["tracked", "warn", "would_stop"]),
        ("enforce", ["tracked", "warn", "stop"]),
        ("  ENFORCE ", ["tracked", "warn", "stop"]),
        ("off", ["none", "none", "none"]),
    ],
)
def test_mode_decides_the_kinds_of_a_full_loop(mode: str, kinds: list[str]) -> None:
    decisions = run(
        IDLE,
        batch(failures(4), mode=mode),
        batch(failures(4), mode=mode),
        batch(failures(4), mode=mode),
    )
    assert [d.kind for d in decisions] == kinds
    assert all(d.reason is None for d in decisions)


def test_shadow_loop_moves_through_the_same_states_as_enforce() -> None:
    shadow = run(IDLE, *[batch(failures(4), mode="shadow")] * 3)
    enforce = run(IDLE, *[batch(failures(4), mode="enforce")] * 3)
    assert [d.state for d in shadow] == [d.state for d in enforce]
    assert shadow[2].state == GuardState("latched", SHELL_EXIT, 12, 3, 1, 2, False)


def test_enforce_with_enforcement_disabled_behaves_as_warn() -> None:
    start = GuardState("idle", None, 0, 0, 0, 1, True)
    decisions = run(start, *[batch(failures(4), mode="enforce")] * 3)
    assert decisions == [
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, True)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, True)),
        Decision("would_stop", GuardState("latched", SHELL_EXIT, 12, 3, 1, 2, True)),
    ]


def test_unrecognised_mode_is_read_as_shadow() -> None:
    decisions = run(IDLE, *[batch(failures(4), mode="bogus")] * 3)
    assert [d.kind for d in decisions] == ["tracked", "would_warn", "would_stop"]


@pytest.mark.parametrize("mode", [None, 3, ["enforce"], {"mode": "enforce"}])
def test_mode_that_is_not_a_string_is_read_as_shadow_even_when_unhashable(mode: object) -> None:
    inputs = [batch(failures(4))._replace(mode=mode)] * 3
    decisions = run(IDLE, *inputs)  # type: ignore[arg-type]
    assert [d.kind for d in decisions] == ["tracked", "would_warn", "would_stop"]


@pytest.mark.parametrize(
    ("mode", "disabled", "effective"),
    [
        ("enforce", True, "warn"),
        ("enforce", False, "enforce"),
        ("warn", True, "warn"),
        ("shadow", True, "shadow"),
        ("off", True, "off"),
    ],
)
def test_effective_mode_downgrades_only_enforce_and_only_once_disabled(
    mode: Mode, disabled: bool, effective: Mode
) -> None:
    assert effective_mode(mode, disabled) == effective


# --- latched and off ----------------------------------------------------------------------

EVERY_KIND_OF_INPUT = [
    batch(failures(4)),
    batch(failures(4), mode="enforce"),
    batch(success()),
    batch(cancelled()),
    batch(unknown()),
    batch(contract_violation()),
    batch(failures(2), failures(2, tool="read_file")),
    batch(failures(1, tool="read_file")),
    batch(failures(4), complete=False),
    batch(failures(4), external=True),
    batch(failures(4), queued=True),
    batch(failures(4), reliable=False),
    batch(),
]


@pytest.mark.parametrize("mode", ["shadow", "warn", "enforce"])
def test_latched_prompt_only_ever_decides_none(mode: str) -> None:
    for guard_input in EVERY_KIND_OF_INPUT:
        latched_input = GuardInput(
            mode,
            guard_input.batch,
            guard_input.has_external_input,
            guard_input.has_queued_prompt,
            guard_input.input_reliable,
        )
        assert reduce(LATCHED, latched_input) == Decision("none", LATCHED)


@pytest.mark.parametrize("state", [IDLE, TRACKING, WARNED, IDLE_DISABLED])
def test_off_decides_none_and_leaves_the_state_unchanged(state: GuardState) -> None:
    for guard_input in EVERY_KIND_OF_INPUT:
        off_input = GuardInput(
            " Off ",
            guard_input.batch,
            guard_input.has_external_input,
            guard_input.has_queued_prompt,
            guard_input.input_reliable,
        )
        assert reduce(state, off_input) == Decision("none", state)


# --- successes ----------------------------------------------------------------------------


def test_same_tool_success_resets_the_streak() -> None:
    assert reduce(TRACKING, batch(success())) == Decision(
        "reset", reset_to(TRACKING, False), "success"
    )


def test_same_tool_success_resets_a_warned_candidate() -> None:
    assert reduce(WARNED, batch(success(), mode="enforce")) == Decision(
        "reset", GuardState("idle", None, 0, 0, 0, 2, False), "success"
    )


def test_success_of_the_tracked_tool_that_needed_no_execution_resets() -> None:
    # Terminal success with execution not_started is still a success of that tool.
    decision = reduce(TRACKING, batch(obs("run_shell", "success", "not_started", None)))
    assert decision == Decision("reset", reset_to(TRACKING, False), "success")


def test_same_tool_success_inside_a_failing_batch_cancels_its_failures_and_resets() -> None:
    decision = reduce(TRACKING, batch(failures(4), success()))
    assert decision == Decision("reset", reset_to(TRACKING, False), "success")


def test_untracked_tool_failing_and_succeeding_in_one_batch_leaves_the_streak() -> None:
    decision = reduce(TRACKING, batch(failures(3, tool="read_file"), success("read_file")))
    assert decision == Decision("none", TRACKING)


def test_success_of_the_tracked_tool_beside_another_tools_failures_starts_their_streak() -> None:
    decision = reduce(TRACKING, batch(success(), failures(2, tool="read_file")))
    key = FailureKey("read_file", "exit_code")
    assert decision == Decision("tracked", GuardState("tracking", key, 2, 1, 2, 3, False))


def test_other_tools_success_inside_a_failing_batch_is_ignored() -> None:
    first, second = run(
        IDLE,
        batch(failures(4), success("read_file"), mode="warn"),
        batch(success("list_dir"), failures(4), success("read_file"), mode="warn"),
    )
    assert first == Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False))
    assert second == Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, False))


def test_other_tools_success_between_failing_batches_is_ignored() -> None:
    decisions = run(
        IDLE,
        batch(failures(4), mode="enforce"),
        batch(success("read_file"), mode="enforce"),
        batch(failures(4), mode="enforce"),
        batch(success("read_file"), success("list_dir"), mode="enforce"),
        batch(failures(1), mode="enforce"),
    )
    tracking = GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)
    warned = GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, False)
    assert decisions == [
        Decision("tracked", tracking),
        Decision("none", tracking),
        Decision("warn", warned),
        Decision("none", warned),
        Decision("stop", GuardState("latched", SHELL_EXIT, 9, 3, 1, 2, False)),
    ]


def test_success_only_batch_from_idle_is_none() -> None:
    assert reduce(IDLE, batch(success(), success("read_file"))) == Decision("none", IDLE)


# --- provider duplicates ------------------------------------------------------------------


@pytest.mark.parametrize(
    "duplicate",
    [
        obs(duplicate=True),
        success(duplicate=True),
        obs("run_shell", "cancelled", "cancelled", None, duplicate=True),
        obs("run_shell", "error", "unknown", None, duplicate=True),
        obs("run_shell", "success", "error", "exit_code", duplicate=True),
        obs(None, "weird", None, "Free Text", duplicate=True),
    ],
)
def test_batch_of_provider_duplicates_neither_advances_nor_resets(duplicate: Observation) -> None:
    assert reduce(TRACKING, batch(duplicate, duplicate)) == Decision("none", TRACKING)


def test_provider_duplicates_beside_real_failures_are_not_counted() -> None:
    dup_failures = [obs(call_id=f"dup-{i}", duplicate=True) for i in range(4)]
    dup_reset = [success(duplicate=True), obs("run_shell", "cancelled", "error", duplicate=True)]
    decisions = run(
        IDLE,
        batch(failures(4), dup_failures, mode="warn"),
        batch(failures(3), dup_failures, dup_reset, mode="warn"),
        batch(dup_reset, failures(1), mode="warn"),
    )
    assert decisions == [
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 7, 2, 1, 2, False)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 3, 1, 2, False)),
    ]


def test_empty_complete_batch_is_none() -> None:
    assert reduce(TRACKING, batch()) == Decision("none", TRACKING)


# --- resets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mixed",
    [
        [*failures(2), *failures(2, error_type="timeout")],
        [*failures(2), *failures(2, tool="read_file")],
        [*failures(1, tool="read_file"), *failures(3, tool="grep", error_type="no_match")],
    ],
)
def test_mixed_failure_keys_reset(mixed: list[Observation]) -> None:
    assert reduce(TRACKING, batch(mixed)) == Decision("reset", reset_to(TRACKING, False), "mixed")


def test_mixed_failure_keys_from_idle_are_none() -> None:
    assert reduce(IDLE, batch(failures(2), failures(2, tool="read_file"))) == Decision("none", IDLE)


def test_mixed_keys_after_removing_a_succeeding_tools_failures_are_one_key() -> None:
    decision = reduce(
        TRACKING, batch(failures(1), failures(2, tool="read_file"), success("read_file"))
    )
    assert decision == Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 2, 1, 2, False))


def test_incomplete_batch_resets() -> None:
    decision = reduce(TRACKING, batch(failures(4), complete=False))
    assert decision == Decision("reset", reset_to(TRACKING, False), "incomplete")


def test_incomplete_batch_resets_before_its_observations_are_classified() -> None:
    decision = reduce(TRACKING, batch(unknown(), contract_violation(), complete=False))
    assert decision == Decision("reset", reset_to(TRACKING, False), "incomplete")


def test_queued_prompt_resets() -> None:
    decision = reduce(TRACKING, batch(failures(4), queued=True))
    assert decision == Decision("reset", reset_to(TRACKING, False), "queued_prompt")


def test_new_external_input_resets() -> None:
    decision = reduce(TRACKING, batch(failures(4), external=True))
    assert decision == Decision("reset", reset_to(TRACKING, False), "external_input")


def test_new_external_input_resets_a_warned_candidate_so_no_stop_follows() -> None:
    decisions = run(
        WARNED,
        batch(failures(4), mode="enforce", external=True),
        batch(failures(4), mode="enforce"),
    )
    assert decisions == [
        Decision("reset", GuardState("idle", None, 0, 0, 0, 2, False), "external_input"),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 2, 3, False)),
    ]


def test_unreliable_input_resets_and_disables_enforcement() -> None:
    decision = reduce(TRACKING, batch(failures(4), reliable=False))
    assert decision == Decision("reset", reset_to(TRACKING, True), "unreliable_input")


def test_unreliable_input_from_idle_is_a_reset_because_it_disables_enforcement() -> None:
    decision = reduce(IDLE, batch(failures(4), reliable=False))
    assert decision == Decision("reset", IDLE_DISABLED, "unreliable_input")


def test_unreliable_input_again_from_idle_is_none() -> None:
    assert reduce(IDLE_DISABLED, batch(reliable=False)) == Decision("none", IDLE_DISABLED)


def test_unreliable_input_turns_a_later_enforce_stop_into_would_stop() -> None:
    decisions = run(
        IDLE,
        batch(failures(4), mode="enforce", reliable=False),
        *[batch(failures(4), mode="enforce")] * 3,
    )
    assert decisions == [
        Decision("reset", IDLE_DISABLED, "unreliable_input"),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, True)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 1, 2, True)),
        Decision("would_stop", GuardState("latched", SHELL_EXIT, 12, 3, 1, 2, True)),
    ]


def test_contract_violation_resets_and_turns_a_later_stop_into_would_stop() -> None:
    decisions = run(
        TRACKING,
        batch(failures(2), contract_violation(), mode="enforce"),
        *[batch(failures(4), mode="enforce")] * 3,
    )
    assert decisions == [
        Decision("reset", GuardState("idle", None, 0, 0, 0, 2, True), "contract_violation"),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 2, 3, True)),
        Decision("warn", GuardState("warned", SHELL_EXIT, 8, 2, 2, 3, True)),
        Decision("would_stop", GuardState("latched", SHELL_EXIT, 12, 3, 2, 3, True)),
    ]


@pytest.mark.parametrize(
    ("reliable", "external", "queued", "complete", "reason", "disabled"),
    [
        (False, True, True, False, "unreliable_input", True),
        (True, True, True, False, "external_input", False),
        (True, False, True, False, "queued_prompt", False),
        (True, False, False, False, "incomplete", False),
    ],
)
def test_input_boundary_resets_take_precedence_in_order(
    reliable: bool,
    external: bool,
    queued: bool,
    complete: bool,
    reason: ResetReason,
    disabled: bool,
) -> None:
    guard_input = batch(
        contract_violation(),
        cancelled(),
        reliable=reliable,
        external=external,
        queued=queued,
        complete=complete,
    )
    assert reduce(TRACKING, guard_input) == Decision("reset", reset_to(TRACKING, disabled), reason)


@pytest.mark.parametrize(
    ("outcomes", "reason", "disabled"),
    [
        (
            [post_execution(), not_started(), unknown(), cancelled(), contract_violation()],
            "contract_violation",
            True,
        ),
        ([post_execution(), not_started(), unknown(), cancelled()], "cancelled", True),
        ([post_execution(), not_started(), cancelled()], "cancelled", False),
        ([post_execution(), not_started(), unknown()], "unknown", True),
        ([post_execution(), not_started()], "not_started", False),
        ([post_execution()], "post_execution_failure", False),
        ([*failures(4), success(), cancelled()], "cancelled", False),
        ([*failures(4), post_execution()], "post_execution_failure", False),
        ([*failures(4), obs(error_type="Exit Code")], "unknown", True),
    ],
)
def test_reset_precedence_among_several_ineligible_outcomes(
    outcomes: list[Observation], reason: ResetReason, disabled: bool
) -> None:
    expected = Decision("reset", reset_to(TRACKING, disabled), reason)
    assert reduce(TRACKING, batch(outcomes)) == expected
    assert reduce(TRACKING, batch(list(reversed(outcomes)))) == expected


def test_reset_keeps_enforcement_disabled() -> None:
    state = GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, True)
    decision = reduce(state, batch(failures(4), queued=True))
    assert decision == Decision(
        "reset", IDLE_DISABLED._replace(next_candidate_ordinal=2), "queued_prompt"
    )


def test_non_disabling_reset_from_idle_already_disabled_is_none() -> None:
    assert reduce(IDLE_DISABLED, batch(cancelled())) == Decision("none", IDLE_DISABLED)


def test_reset_keeps_the_next_candidate_ordinal() -> None:
    state = GuardState("tracking", SHELL_EXIT, 5, 1, 7, 8, False)
    decision = reduce(state, batch(cancelled()))
    assert decision == Decision("reset", GuardState("idle", None, 0, 0, 0, 8, False), "cancelled")


def test_decision_reason_is_set_only_on_resets() -> None:
    assert reduce(IDLE, batch(failures(1))).reason is None
    assert reduce(TRACKING, batch(failures(1))).reason is None
    assert reduce(TRACKING, batch(success("read_file"))).reason is None


# --- new keys and ordinals ----------------------------------------------------------------


def test_new_key_starts_a_new_streak_with_a_new_ordinal() -> None:
    grep = FailureKey("grep", "no_match")
    decisions = run(
        IDLE,
        batch(failures(4)),
        batch(failures(2, tool="grep", error_type="no_match")),
        batch(failures(3, tool="grep", error_type="no_match")),
        batch(queued=True),
        batch(failures(1)),
    )
    assert decisions == [
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)),
        Decision("tracked", GuardState("tracking", grep, 2, 1, 2, 3, False)),
        Decision("tracked", GuardState("tracking", grep, 5, 2, 2, 3, False)),
        Decision("reset", GuardState("idle", None, 0, 0, 0, 3, False), "queued_prompt"),
        Decision("tracked", GuardState("tracking", SHELL_EXIT, 1, 1, 3, 4, False)),
    ]


def test_new_key_after_a_warning_needs_its_own_warning_before_a_stop() -> None:
    timeout = FailureKey("run_shell", "timeout")
    decisions = run(
        WARNED,
        batch(failures(8, error_type="timeout"), mode="enforce"),
        batch(failures(1, error_type="timeout"), mode="enforce"),
        batch(failures(1, error_type="timeout"), mode="enforce"),
    )
    assert decisions == [
        Decision("tracked", GuardState("tracking", timeout, 8, 1, 2, 3, False)),
        Decision("warn", GuardState("warned", timeout, 9, 2, 2, 3, False)),
        Decision("stop", GuardState("latched", timeout, 10, 3, 2, 3, False)),
    ]


def test_reduce_leaves_its_arguments_unchanged() -> None:
    guard_input = batch(failures(4), success("read_file"), mode="enforce")
    state = GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)
    reduce(state, guard_input)
    assert state == GuardState("tracking", SHELL_EXIT, 4, 1, 1, 2, False)
    assert guard_input == batch(failures(4), success("read_file"), mode="enforce")
