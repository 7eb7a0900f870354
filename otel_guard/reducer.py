"""The pure repeated-tool-failure reducer.

One function, :func:`reduce`, from ``(state, input)`` to a :class:`Decision`. Values are
immutable, nothing here does I/O, and nothing here imports OpenTelemetry: the span processor
translates spans into :class:`GuardInput` and applies the decision's telemetry and host action.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple, cast, get_args

__all__ = [
    "BATCH_THRESHOLD",
    "REMINDER",
    "RESET_REASONS",
    "STOP_MESSAGE",
    "THRESHOLD",
    "Batch",
    "Decision",
    "DecisionKind",
    "FailureKey",
    "GuardInput",
    "GuardState",
    "Mode",
    "Observation",
    "Phase",
    "ResetReason",
    "effective_mode",
    "parse_mode",
    "reduce",
    "reduce_with_thresholds",
]

THRESHOLD = 8
"""Eligible failures of one key needed before the guard warns ..."""

BATCH_THRESHOLD = 2
"""... across at least this many complete batches."""

REMINDER = (
    "System: the same tool execution has failed repeatedly for the same classified reason. "
    "Do not repeat the same approach. Inspect the returned result, change the approach or "
    "required preconditions, or explain the blocker."
)

STOP_MESSAGE = (
    "Automatic continuation stopped because the same tool execution failure continued after a "
    "corrective reminder. New user input is required to continue."
)

Mode = Literal["off", "shadow", "warn", "enforce"]
Phase = Literal["idle", "tracking", "warned", "latched"]
DecisionKind = Literal["none", "reset", "tracked", "would_warn", "warn", "would_stop", "stop"]
ResetReason = Literal[
    "success",
    "cancelled",
    "not_started",
    "post_execution_failure",
    "unknown",
    "mixed",
    "incomplete",
    "external_input",
    "queued_prompt",
    "unreliable_input",
    "contract_violation",
]

RESET_REASONS: tuple[ResetReason, ...] = get_args(ResetReason)

_MODES: dict[str, Mode] = {"off": "off", "shadow": "shadow", "warn": "warn", "enforce": "enforce"}

# Precedence of the reasons a single batch can collect while classifying its observations.
_REASON_PRECEDENCE: tuple[ResetReason, ...] = (
    "contract_violation",
    "cancelled",
    "unknown",
    "not_started",
    "post_execution_failure",
)

_ERROR_TYPE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")


class FailureKey(NamedTuple):
    """The private identity of a candidate streak. Never leaves the process."""

    policy_tool_name: str
    execution_error_type: str


# The value types are named tuples: immutable like frozen dataclasses, but built several times
# faster, and the processor builds them inside the agent's span.end().


class Observation(NamedTuple):
    """One settled tool call of a batch, as the host's batch receipt describes it."""

    call_id: str
    policy_tool_name: str | None
    tool_type: str | None
    terminal_status: str
    execution_status: str | None
    execution_error_type: str | None
    provider_duplicate: bool = False


class Batch(NamedTuple):
    """A model tool batch; ``complete`` only when every admitted call settled."""

    complete: bool
    observations: tuple[Observation, ...]


class GuardInput(NamedTuple):
    """One settled batch plus the result of the mid-turn input drain that followed it."""

    mode: str
    batch: Batch
    has_external_input: bool
    has_queued_prompt: bool
    input_reliable: bool


class GuardState(NamedTuple):
    """The per-prompt guard state. ``GuardState.initial()`` is the state of a fresh prompt."""

    phase: Phase
    key: FailureKey | None
    failure_count: int
    batch_count: int
    candidate_ordinal: int
    next_candidate_ordinal: int
    enforcement_disabled: bool

    @classmethod
    def initial(cls) -> GuardState:
        return cls("idle", None, 0, 0, 0, 1, False)


class Decision(NamedTuple):
    """What one batch did to the state. ``reason`` is set only for ``reset``."""

    kind: DecisionKind
    state: GuardState
    reason: ResetReason | None = None


def parse_mode(value: object) -> Mode | None:
    """Trim and lower-case ``value``; return the mode it names, or ``None`` if it names none
    (also when it is not a string)."""
    if not isinstance(value, str):
        return None
    return _MODES.get(value) or _MODES.get(value.strip().lower())


def effective_mode(mode: Mode, enforcement_disabled: bool) -> Mode:
    """``enforce`` is downgraded to ``warn`` once enforcement is disabled for the prompt."""
    if mode == "enforce" and enforcement_disabled:
        return "warn"
    return mode


# Builds a named tuple from a tuple of all its fields without the Python-level ``__new__`` its
# class defines: the reducer runs inside the agent's span.end(), once per batch.
_new = tuple.__new__


def _reset(state: GuardState, reason: ResetReason, disable: bool = False) -> Decision:
    phase, _, _, _, _, next_ordinal, was_disabled = state
    disabled = was_disabled or disable
    if phase == "idle" and disabled == was_disabled:
        return _new(Decision, ("none", state, None))
    after = _new(GuardState, ("idle", None, 0, 0, 0, next_ordinal, disabled))
    return _new(Decision, ("reset", after, reason))


# Error types already judged: a deployment has few distinct ones, and this runs for every
# failed call. A plain dictionary (a hit is one look-up, not a call), emptied when it is full.
_ELIGIBLE_ERROR_TYPES: dict[str, bool] = {}
_MAX_ELIGIBLE_ERROR_TYPES = 1024


def _eligible_error_type(value: str) -> bool:
    """``value`` (at most 64 characters: longer ones are never kept here) is a usable error
    type: section 2's pattern, and not ``unknown``."""
    known = _ELIGIBLE_ERROR_TYPES.get(value)
    if known is not None:
        return known
    eligible = value != "unknown" and _ERROR_TYPE.fullmatch(value) is not None
    if len(_ELIGIBLE_ERROR_TYPES) >= _MAX_ELIGIBLE_ERROR_TYPES:
        _ELIGIBLE_ERROR_TYPES.clear()
    _ELIGIBLE_ERROR_TYPES[value] = eligible
    return eligible


def reduce(state: GuardState, input: GuardInput) -> Decision:
    """Apply one settled batch to ``state`` and return the decision (docs/contract.md section 2).

    An input mode that is not one of the four modes is treated as ``shadow``, the same as a
    missing or invalid deployment setting: the reducer never enforces on a mode it cannot read.
    """
    # The values are unpacked once: a named tuple's field access is a descriptor call, tuple
    # unpacking is not, and this runs inside the agent's span.end().
    # The mode is read as any object: a compiled build checks a value's declared type when it is
    # unpacked, and a mode that is not a string must read as shadow, not raise.
    fields: tuple[object, Batch, bool, bool, bool] = input  # a plain assignment, not a call
    requested, batch, has_external_input, has_queued_prompt, input_reliable = fields
    phase, current_key, failure_count, batch_count, ordinal, next_ordinal, disabled = state
    mode = _MODES.get(requested) if type(requested) is str else None
    if mode is None:
        mode = parse_mode(requested) or "shadow"

    # 1. Off, or latched until the prompt ends.
    if mode == "off" or phase == "latched":
        return _new(Decision, ("none", state, None))

    # 2-3. Input boundary and completeness.
    if not input_reliable:
        return _reset(state, "unreliable_input", disable=True)
    if has_external_input:
        return _reset(state, "external_input")
    if has_queued_prompt:
        return _reset(state, "queued_prompt")
    complete, observations = batch
    if not complete:
        return _reset(state, "incomplete")

    # 4-5. Classify. Provider duplicates neither advance nor reset.
    counted = False
    reasons: set[ResetReason] = set()
    disable = False
    succeeded: set[str] = set()
    failures: list[FailureKey] = []
    for _, tool, _, terminal, execution, error_type, provider_duplicate in observations:
        if provider_duplicate:
            continue
        counted = True
        if terminal == "error" and execution == "error":
            # An execution error, the common case, is asked first (no other branch below takes
            # it): counted when its tool and error type are usable.
            if (
                isinstance(tool, str)
                and isinstance(error_type, str)
                and len(error_type) <= 64
                and _eligible_error_type(error_type)
                and tool.strip()
            ):
                failures.append(_new(FailureKey, (tool, error_type)))
            else:
                reasons.add("unknown")
                disable = True
            continue
        if terminal == "cancelled":
            reasons.add("cancelled")
        elif execution is None or execution == "unknown":
            reasons.add("unknown")
            disable = True
        elif terminal == "success":
            if execution == "error" or execution == "cancelled":
                reasons.add("contract_violation")
                disable = True
            elif execution == "success" or execution == "not_started":
                if not isinstance(tool, str) or not tool.strip():
                    reasons.add("unknown")
                    disable = True
                else:
                    succeeded.add(tool)
            else:
                reasons.add("unknown")
                disable = True
        elif terminal != "error":
            reasons.add("unknown")
            disable = True
        elif execution == "cancelled":
            reasons.add("cancelled")
        elif execution == "not_started":
            reasons.add("not_started")
        elif execution == "success":
            reasons.add("post_execution_failure")
        else:
            reasons.add("unknown")
            disable = True
    if not counted:
        return _new(Decision, ("none", state, None))

    # 6. Any ineligible outcome resets, by precedence.
    if reasons:
        reason = next(r for r in _REASON_PRECEDENCE if r in reasons)
        return _reset(state, reason, disable=disable)

    # 7. A tool's success clears that tool's failures in the same batch.
    remaining = (
        [k for k in failures if k.policy_tool_name not in succeeded] if succeeded else failures
    )
    if not remaining:
        if current_key is not None and current_key.policy_tool_name in succeeded:
            return _reset(state, "success")
        if succeeded:
            return _new(Decision, ("none", state, None))
        return _reset(state, "unknown", disable=True)

    # 8. One candidate at a time.
    key = remaining[0]
    if remaining.count(key) != len(remaining):
        return _reset(state, "mixed")

    # 9. A new key starts a new streak with a new ordinal.
    if key != current_key:
        after = (
            "tracking",
            key,
            len(remaining),
            1,
            next_ordinal,
            next_ordinal + 1,
            disabled,
        )
        return _new(Decision, ("tracked", _new(GuardState, after), None))

    # 10. The same key continues the streak.
    failure_count += len(remaining)
    batch_count += 1
    if phase == "warned":
        kind: DecisionKind = "stop" if effective_mode(mode, disabled) == "enforce" else "would_stop"
        phase = "latched"
    elif failure_count >= THRESHOLD and batch_count >= BATCH_THRESHOLD:
        kind = "would_warn" if mode == "shadow" else "warn"
        phase = "warned"
    else:
        kind = "tracked"
        phase = "tracking"
    after = (phase, key, failure_count, batch_count, ordinal, next_ordinal, disabled)
    return _new(Decision, (kind, _new(GuardState, after), None))


def reduce_with_thresholds(
    state: GuardState, input: GuardInput, threshold: int, batch_threshold: int
) -> Decision:
    """:func:`reduce` as if :data:`THRESHOLD` and :data:`BATCH_THRESHOLD` were ``threshold`` and
    ``batch_threshold``: for what-if analysis (the replay's ``--threshold``), never the live guard.

    The constants decide only whether a continuing streak warns (step 10); every other step, and
    the counts a streak carries, are the same for any constants. So the live decision is taken
    and, for a streak that continues from ``tracking``, that one condition is re-evaluated.
    """
    decision = reduce(state, input)
    kind, after, _ = decision
    # A streak continuing from ``tracking``: only there do these kinds keep the key (a new key is
    # step 9, ``warned`` goes on to a stop, ``latched`` and ``idle`` have no streak to continue).
    if after.key != state.key or kind not in ("tracked", "would_warn", "warn"):
        return decision
    if after.failure_count >= threshold and after.batch_count >= batch_threshold:
        # What-if only: no fast path needed. Any object, as in reduce().
        mode = parse_mode(cast("tuple[object, ...]", input)[0]) or "shadow"
        return Decision(
            "would_warn" if mode == "shadow" else "warn", after._replace(phase="warned")
        )
    return Decision("tracked", after._replace(phase="tracking"))
