"""Generate ``tests/vectors/reducer.json``: the Python reducer's decisions, for the Go reducer.

Run as a script (``python tests/vectors/generate_reducer_vectors.py``) after any change to
``otel_guard.reducer``; ``tests/test_reducer_vectors.py`` fails while the file is stale, and the
Go connector's ``internal/reducer`` test fails while the Go reducer decides differently.

Each scenario is a sequence of steps from an initial state: every step gives the input and the
decision the reducer returned, and the next step starts from that decision's state. Hand-written
scenarios name each rule of docs/contract.md section 2; seeded random ones mix them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from otel_guard.reducer import (
    BATCH_THRESHOLD,
    THRESHOLD,
    Batch,
    FailureKey,
    GuardInput,
    GuardState,
    Observation,
    reduce_with_thresholds,
)

OUT = Path(__file__).with_name("reducer.json")
SEED = 20261202
RANDOM_SCENARIOS = 160


def obs(
    tool: str | None = "read_file",
    terminal: str = "error",
    execution: str | None = "error",
    error_type: str | None = "enoent",
    call: str = "c",
    tool_type: str | None = "native",
    duplicate: bool = False,
) -> Observation:
    return Observation(call, tool, tool_type, terminal, execution, error_type, duplicate)


def inp(
    *observations: Observation,
    mode: str = "shadow",
    complete: bool = True,
    external: bool = False,
    queued: bool = False,
    reliable: bool = True,
) -> GuardInput:
    return GuardInput(mode, Batch(complete, tuple(observations)), external, queued, reliable)


FAIL = obs()
FAIL4 = (obs(call="a"), obs(call="b"), obs(call="c"), obs(call="d"))
OK = obs(terminal="success", execution="success", error_type=None)


def state_json(state: GuardState) -> dict[str, Any]:
    return {
        "phase": state.phase,
        "key": None if state.key is None else list(state.key),
        "failure_count": state.failure_count,
        "batch_count": state.batch_count,
        "candidate_ordinal": state.candidate_ordinal,
        "next_candidate_ordinal": state.next_candidate_ordinal,
        "enforcement_disabled": state.enforcement_disabled,
    }


def input_json(value: GuardInput) -> dict[str, Any]:
    return {
        "mode": value.mode,
        "complete": value.batch.complete,
        "observations": [
            {
                "call_id": o.call_id,
                "policy_tool_name": o.policy_tool_name,
                "tool_type": o.tool_type,
                "terminal_status": o.terminal_status,
                "execution_status": o.execution_status,
                "execution_error_type": o.execution_error_type,
                "provider_duplicate": o.provider_duplicate,
            }
            for o in value.batch.observations
        ],
        "has_external_input": value.has_external_input,
        "has_queued_prompt": value.has_queued_prompt,
        "input_reliable": value.input_reliable,
    }


def scenario(
    name: str,
    inputs: list[GuardInput],
    initial: GuardState | None = None,
    threshold: int = THRESHOLD,
    batch_threshold: int = BATCH_THRESHOLD,
) -> dict[str, Any]:
    state = GuardState.initial() if initial is None else initial
    steps = []
    for value in inputs:
        decision = reduce_with_thresholds(state, value, threshold, batch_threshold)
        steps.append(
            {
                "input": input_json(value),
                "kind": decision.kind,
                "reason": decision.reason,
                "state": state_json(decision.state),
            }
        )
        state = decision.state
    start = GuardState.initial() if initial is None else initial
    return {
        "name": name,
        "threshold": threshold,
        "batch_threshold": batch_threshold,
        "initial": state_json(start),
        "steps": steps,
    }


KEY = FailureKey("read_file", "enoent")
TRACKING = GuardState("tracking", KEY, 4, 1, 1, 2, False)
WARNED = GuardState("warned", KEY, 8, 2, 1, 2, False)
LATCHED = GuardState("latched", KEY, 12, 3, 1, 2, False)


def hand_written() -> list[dict[str, Any]]:
    loop = [inp(*FAIL4) for _ in range(4)]
    s: list[dict[str, Any]] = []
    add = s.append
    # Step 1: off, latched.
    add(scenario("off_is_none", [inp(*FAIL4, mode="off")], TRACKING))
    add(scenario("latched_is_absorbing", [inp(*FAIL4), inp(OK), inp(reliable=False)], LATCHED))
    # Step 2-3: input boundary and completeness.
    add(scenario("unreliable_input_resets_and_disables", [inp(*FAIL4, reliable=False)], TRACKING))
    add(scenario("unreliable_input_from_idle_disables", [inp(*FAIL4, reliable=False)]))
    add(
        scenario(
            "unreliable_input_idle_already_disabled_is_none",
            [inp(FAIL, reliable=False)],
            GuardState.initial()._replace(enforcement_disabled=True),
        )
    )
    add(scenario("external_input", [inp(*FAIL4, external=True)], TRACKING))
    add(scenario("queued_prompt", [inp(*FAIL4, queued=True)], TRACKING))
    add(scenario("external_before_queued", [inp(*FAIL4, external=True, queued=True)], TRACKING))
    add(scenario("incomplete", [inp(*FAIL4, complete=False)], TRACKING))
    add(scenario("incomplete_from_idle_is_none", [inp(*FAIL4, complete=False)]))
    # Step 4: duplicates.
    add(
        scenario(
            "only_duplicates_is_none",
            [
                inp(
                    obs(duplicate=True),
                    obs(OK.policy_tool_name, "success", "success", None, duplicate=True),
                )
            ],
            TRACKING,
        )
    )
    add(
        scenario(
            "duplicate_neither_advances_nor_resets",
            [inp(FAIL, obs(terminal="cancelled", duplicate=True, call="d"))],
            TRACKING,
        )
    )
    add(scenario("empty_batch_is_none", [inp()], TRACKING))
    # Step 5: every classification branch.
    add(scenario("terminal_cancelled", [inp(obs(terminal="cancelled"))], TRACKING))
    add(scenario("execution_missing", [inp(obs(execution=None))], TRACKING))
    add(scenario("execution_unknown", [inp(obs(execution="unknown"))], TRACKING))
    add(scenario("success_with_execution_error", [inp(obs(terminal="success"))], TRACKING))
    add(
        scenario(
            "success_with_execution_cancelled",
            [inp(obs(terminal="success", execution="cancelled"))],
            TRACKING,
        )
    )
    add(scenario("success_of_tracked_tool", [inp(OK)], TRACKING))
    add(
        scenario(
            "success_not_started_of_tracked_tool",
            [inp(obs(terminal="success", execution="not_started"))],
            TRACKING,
        )
    )
    add(
        scenario(
            "success_without_tool_name",
            [inp(obs(tool=None, terminal="success", execution="success"))],
            TRACKING,
        )
    )
    add(
        scenario(
            "success_blank_tool_name",
            [inp(obs(tool="  ", terminal="success", execution="success"))],
            TRACKING,
        )
    )
    add(
        scenario(
            "success_other_execution", [inp(obs(terminal="success", execution="weird"))], TRACKING
        )
    )
    add(scenario("terminal_other", [inp(obs(terminal="timeout"))], TRACKING))
    add(scenario("terminal_empty", [inp(obs(terminal=""))], TRACKING))
    add(scenario("error_execution_cancelled", [inp(obs(execution="cancelled"))], TRACKING))
    add(scenario("error_execution_not_started", [inp(obs(execution="not_started"))], TRACKING))
    add(scenario("error_execution_success", [inp(obs(execution="success"))], TRACKING))
    add(scenario("error_execution_other", [inp(obs(execution="paused"))], TRACKING))
    for label, tool, error_type in [
        ("no_tool", None, "enoent"),
        ("blank_tool", " ", "enoent"),
        ("no_error_type", "read_file", None),
        ("blank_error_type", "read_file", ""),
        ("error_type_unknown", "read_file", "unknown"),
        ("error_type_upper", "read_file", "ENOENT"),
        ("error_type_digit_first", "read_file", "1abc"),
        ("error_type_space", "read_file", "no such file"),
        ("error_type_64", "read_file", "a" * 64),
        ("error_type_65", "read_file", "a" * 65),
        ("error_type_punct", "read_file", "a.b_c-d9"),
        ("error_type_colon", "read_file", "a:b"),
    ]:
        add(
            scenario(f"eligibility_{label}", [inp(obs(tool=tool, error_type=error_type))], TRACKING)
        )
    # Step 6: precedence of collected reasons.
    everything = [
        obs(call="1", execution="success"),
        obs(call="2", execution="not_started"),
        obs(call="3", execution="unknown"),
        obs(call="4", terminal="cancelled"),
        obs(call="5", terminal="success", execution="error"),
    ]
    for n in range(len(everything)):
        add(scenario(f"precedence_{n}", [inp(*everything[n:])], TRACKING))
        add(scenario(f"precedence_reversed_{n}", [inp(*reversed(everything[n:]))], TRACKING))
    # Step 7: success clears a tool's failures.
    add(scenario("success_clears_same_tool_failures", [inp(FAIL, OK)], TRACKING))
    add(
        scenario(
            "success_of_other_tool_keeps_streak",
            [inp(obs(tool="grep", terminal="success", execution="success", error_type=None))],
            TRACKING,
        )
    )
    add(
        scenario(
            "success_of_other_tool_with_failure",
            [
                inp(
                    FAIL,
                    obs(
                        tool="grep",
                        terminal="success",
                        execution="success",
                        error_type=None,
                        call="g",
                    ),
                )
            ],
            TRACKING,
        )
    )
    add(
        scenario(
            "success_of_other_tool_from_idle_is_none",
            [inp(obs(tool="grep", terminal="success", execution="success", error_type=None))],
        )
    )
    # Step 8: mixed.
    add(scenario("mixed_error_types", [inp(FAIL, obs(error_type="eacces", call="x"))], TRACKING))
    add(scenario("mixed_tools", [inp(FAIL, obs(tool="grep", call="x"))], TRACKING))
    # Step 9: a new key.
    add(scenario("new_key_from_idle", [inp(FAIL)]))
    add(scenario("new_key_replaces", [inp(obs(error_type="eacces"))], TRACKING))
    add(scenario("new_key_from_warned", [inp(obs(tool="grep"))], WARNED))
    # Step 10: the streak, in every mode.
    for mode in ("shadow", "warn", "enforce", " Enforce ", "bogus", ""):
        add(scenario(f"loop_{mode.strip() or 'empty'}", loop, None))
        add(
            scenario(
                f"loop_disabled_{mode.strip() or 'empty'}",
                loop,
                GuardState.initial()._replace(enforcement_disabled=True),
            )
        )
    add(scenario("loop_enforce_named", [inp(*FAIL4, mode="enforce") for _ in range(4)]))
    add(
        scenario(
            "loop_enforce_disabled_would_stop_is_warn_mode",
            [inp(*FAIL4, mode="enforce", reliable=False)]
            + [inp(*FAIL4, mode="enforce") for _ in range(4)],
        )
    )
    add(
        scenario(
            "threshold_needs_two_batches", [inp(*(obs(call=str(i)) for i in range(9))), inp(FAIL)]
        )
    )
    add(scenario("threshold_exactly_eight", [inp(*FAIL4), inp(*FAIL4), inp(FAIL)]))
    add(scenario("seven_then_one", [inp(*(obs(call=str(i)) for i in range(7))), inp(FAIL)]))
    add(
        scenario(
            "warned_then_reset_then_new_ordinal",
            [inp(*FAIL4), inp(*FAIL4), inp(OK), inp(*FAIL4), inp(*FAIL4), inp(*FAIL4)],
        )
    )
    # What-if thresholds.
    for threshold, batch_threshold in [(1, 1), (3, 1), (4, 2), (5, 3), (12, 2), (20, 4)]:
        add(
            scenario(
                f"what_if_{threshold}_{batch_threshold}",
                [*loop, inp(FAIL), inp(FAIL)],
                None,
                threshold,
                batch_threshold,
            )
        )
        add(
            scenario(
                f"what_if_{threshold}_{batch_threshold}_enforce",
                [inp(*FAIL4, mode="enforce") for _ in range(5)],
                None,
                threshold,
                batch_threshold,
            )
        )
    return s


TOOLS = [None, "", " ", "read_file", "grep", "shell"]
TERMINALS = ["error", "error", "error", "success", "cancelled", "timeout", ""]
EXECUTIONS = [None, "error", "error", "success", "not_started", "cancelled", "unknown", "x"]
ERROR_TYPES = [None, "", "enoent", "enoent", "eacces", "unknown", "Bad", "a" * 65, "timeout.read"]
MODES = ["shadow", "warn", "enforce", "off", "ENFORCE", "junk"]


def random_scenarios() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    out = []
    for n in range(RANDOM_SCENARIOS):
        mode = rng.choice(MODES)
        failing = rng.random() < 0.7  # mostly loops, so streaks get long
        inputs = []
        for _ in range(rng.randint(1, 12)):
            observations = []
            for c in range(rng.randint(0, 5)):
                if failing and rng.random() < 0.8:
                    observations.append(
                        obs(
                            call=str(c),
                            tool=rng.choice(["read_file", "grep"]),
                            error_type=rng.choice(["enoent", "enoent", "eacces"]),
                        )
                    )
                else:
                    observations.append(
                        obs(
                            tool=rng.choice(TOOLS),
                            terminal=rng.choice(TERMINALS),
                            execution=rng.choice(EXECUTIONS),
                            error_type=rng.choice(ERROR_TYPES),
                            call=str(c),
                            tool_type=rng.choice(["native", "mcp", None]),
                            duplicate=rng.random() < 0.1,
                        )
                    )
            inputs.append(
                inp(
                    *observations,
                    mode=mode if rng.random() < 0.9 else rng.choice(MODES),
                    complete=rng.random() < 0.93,
                    external=rng.random() < 0.04,
                    queued=rng.random() < 0.04,
                    reliable=rng.random() < 0.95,
                )
            )
        threshold, batch_threshold = THRESHOLD, BATCH_THRESHOLD
        if rng.random() < 0.3:
            threshold, batch_threshold = rng.randint(1, 16), rng.randint(1, 4)
        out.append(scenario(f"random_{n}", inputs, None, threshold, batch_threshold))
    return out


def vectors() -> dict[str, Any]:
    return {
        "about": "Generated by tests/vectors/generate_reducer_vectors.py from otel_guard.reducer; "
        "do not edit by hand.",
        "scenarios": hand_written() + random_scenarios(),
    }


def render() -> str:
    """One scenario a line: small, and a change shows as the scenarios it changed."""
    data = vectors()
    lines = [json.dumps(s, sort_keys=True) for s in data["scenarios"]]
    return (
        '{"about": '
        + json.dumps(data["about"])
        + ',\n"scenarios": [\n'
        + ",\n".join(lines)
        + "\n]}\n"
    )


def main() -> int:
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT.name}: {len(vectors()['scenarios'])} scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
