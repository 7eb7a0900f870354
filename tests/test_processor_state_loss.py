"""State loss, collisions and tool-type eligibility never widen what the guard may do.

A hypothesis state machine drives the public API (a real ``TracerProvider`` with the guard in
``enforce``, a small ``max_prompts`` and an injected clock for the TTL): prompts start, collide,
end and are reused, batches of several kinds settle, time jumps past the TTL, and the table
evicts. A model of what the host did checks, from the guard's own log records and actions:

* no stop without a reminder the same host took for the same candidate at its previous batch;
* no stop in a prompt after an unreliable input drain, a tool that is not ``native``/``mcp``,
  a collision, or a loss of its state (an ``evicted``/``expired`` diagnostic naming it);
* no telemetry at all for an opted-out prompt.

Two machines run: a table of 3 prompts for 5 IDs (most sequences lose state or collide) and one
with room for all (losses from the TTL only, so stops are reached more often). Each generates
``OTEL_GUARD_STATEFUL_EXAMPLES`` sequences of up to 40 steps (default 1,000).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import hypothesis.strategies as st
from harness import FAIL, OK, Call, Harness
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from opentelemetry.trace import Span, set_span_in_context

from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT, OBSERVATIONS_METRIC, TRANSITION_EVENT
from otel_guard.reducer import Batch, GuardInput, GuardState, Observation, reduce

EXAMPLES = int(os.environ.get("OTEL_GUARD_STATEFUL_EXAMPLES", "1000"))
PROMPT_IDS = ("a", "b", "c", "d", "e")
TTL = 100.0

FAIL_MCP = Call(tool_type="mcp")  # the same failure key as FAIL
FAIL_OTHER = Call(tool="edit", error_type="conflict")
CANCELLED = Call(status="cancelled", execution="cancelled", error_type=None)
THIRD_PARTY = (
    Call(tool_type=None),
    Call(tool_type="third_party"),
    Call(tool_type="extension"),
)

# Batch kinds, weighted towards repeated failures so that reminders and stops are common.
KINDS = (
    ("fail",) * 6
    + ("fail_mcp", "fail_other", "ok", "cancelled", "unreliable", "opt_out")
    + ("third_party", "third_party_mixed")
)
# The failure key of the kinds that can count towards a candidate.
KEY_OF = {"fail": "run_shell", "fail_mcp": "run_shell", "fail_other": "edit"}


def calls_of(kind: str, variant: int) -> list[Call]:
    if kind == "fail":
        return [FAIL] * 4
    if kind == "fail_mcp":
        return [FAIL_MCP] * 4
    if kind == "fail_other":
        return [FAIL_OTHER] * 4
    if kind == "ok":
        return [OK]
    if kind == "cancelled":
        return [CANCELLED]
    if kind == "third_party":
        return [THIRD_PARTY[variant % 3]] * 4
    if kind == "third_party_mixed":
        return [FAIL, FAIL, THIRD_PARTY[variant % 3], FAIL]
    return [FAIL] * 4  # unreliable, opt_out: failures with a drain or a marker


@dataclass
class Instance:
    """One prompt as the host sees it: from its first activity to the end of its last span."""

    hosts: set[int] = field(default_factory=set)
    opted_out: bool = False
    no_stop: str | None = None  # why no stop may come any more
    # The instance's previous batch: (host, kind, whether that host took a reminder from it).
    last: tuple[int, str, bool] | None = None
    # The host that took the reminder of the current candidate: a batch that decides nothing
    # (another tool's success, say) may stand between the reminder and the stop.
    reminded_host: int | None = None
    reminded_key: object = None  # the failure key of the batch whose reminder was taken


@dataclass
class Host:
    number: int
    prompt_id: str
    span: Span | None  # None: a host that sends batches without a prompt span


class GuardUnderStateLoss(RuleBasedStateMachine):
    """A table of 3 prompts for 5 IDs: most sequences lose state or collide."""

    max_prompts = 3
    push_outs = False  # the open-span eviction move: see GuardLosingOpenSpans

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.harness = Harness(
            mode="enforce",
            max_prompts=self.max_prompts,
            max_calls_per_batch=4,  # every batch here has 4 calls at most; a small span table
            prompt_ttl_seconds=TTL,
            clock=lambda: self.now,
        )
        self.junk = 0
        self.instances: dict[str, Instance] = {}
        self.hosts: list[Host] = []  # hosts with an open prompt span
        self.bare: dict[str, Host] = {}  # hosts without one, one per prompt ID
        self.seen_logs = 0
        self.host_count = 0
        self.stops = 0
        self.lost = 0
        self.collisions = 0

    # -- helpers ----------------------------------------------------------------------------

    def _new_host(self, prompt_id: str, span: Span | None) -> Host:
        self.host_count += 1
        return Host(self.host_count, prompt_id, span)

    def _read_new_logs(self, batch_host: Host | None = None, kind: str | None = None) -> None:
        """Check every record emitted since the last call, in order."""
        self.harness.guard.force_flush()
        self.harness.logger_provider.force_flush()
        records = list(self.harness.log_exporter.get_finished_logs())
        for record in records[self.seen_logs :]:
            attributes = dict(record.log_record.attributes or {})
            prompt_id = attributes.get("prompt_id")
            instance = self.instances.get(str(prompt_id)) if prompt_id is not None else None
            if instance is not None:
                assert not instance.opted_out, f"telemetry for opted-out {prompt_id}: {attributes}"
            event = record.log_record.event_name
            if (
                event == DIAGNOSTIC_EVENT
                and attributes["diagnostic"] in ("evicted", "expired")
                and instance is not None
            ):
                instance.no_stop = instance.no_stop or "state lost"
                self.lost += 1
            if (
                event == TRANSITION_EVENT
                and attributes["decision"] in ("reset", "tracked")
                and instance is not None
            ):
                instance.reminded_host = None  # a new candidate, or none: its reminder is gone
            if event == TRANSITION_EVENT and attributes["decision"] == "stopped":
                assert instance is not None and batch_host is not None and kind is not None
                self._check_stop(instance, batch_host, kind)
        self.seen_logs = len(records)

    def _check_stop(self, instance: Instance, host: Host, kind: str) -> None:
        self.stops += 1
        assert instance.no_stop is None, f"stop after {instance.no_stop}"
        assert kind in KEY_OF and instance.last is not None
        assert instance.reminded_host is not None, "stop without a taken reminder for the candidate"
        assert instance.reminded_host == host.number, "stop for a host that took no reminder"
        assert instance.reminded_key == KEY_OF[kind], "stop for another candidate"

    def _observations(self) -> int:
        return sum(value for _, value in self.harness.points(OBSERVATIONS_METRIC))

    # -- rules ------------------------------------------------------------------------------

    @rule(
        prompt_id=st.sampled_from(PROMPT_IDS),
        marker=st.sampled_from([None, None, None, "route", "channel"]),
    )
    def start_prompt(self, prompt_id: str, marker: str | None) -> None:
        span = self.harness.start_prompt(
            prompt_id,
            route="cron" if marker == "route" else None,
            channel=True if marker == "channel" else None,
        )
        host = self._new_host(prompt_id, span)
        instance = self.instances.get(prompt_id)
        if instance is None or not instance.hosts:
            instance = self.instances[prompt_id] = Instance()  # a fresh prompt
            self.bare.pop(prompt_id, None)
        else:
            instance.no_stop = instance.no_stop or "collision"
            self.collisions += 1
        instance.hosts.add(host.number)
        instance.opted_out = instance.opted_out or marker is not None
        self.hosts.append(host)
        self._read_new_logs()

    @precondition(lambda self: self.hosts)
    @rule(index=st.integers(min_value=0, max_value=1_000))
    def end_prompt(self, index: int) -> None:
        host = self.hosts.pop(index % len(self.hosts))
        assert host.span is not None
        host.span.end()
        instance = self.instances[host.prompt_id]
        instance.hosts.discard(host.number)
        if not instance.hosts:
            del self.instances[host.prompt_id]  # its state is discarded with its last span
        self._read_new_logs()

    @rule(
        index=st.integers(min_value=0, max_value=1_000),
        bare_id=st.sampled_from((None, None, *PROMPT_IDS)),
        kind=st.sampled_from(KINDS),
        variant=st.integers(min_value=0, max_value=2),
        take=st.sampled_from([True, True, True, False]),
    )
    def settle_batch(
        self, index: int, bare_id: str | None, kind: str, variant: int, take: bool
    ) -> None:
        open_hosts = [h for h in self.hosts if h.prompt_id == bare_id]
        if bare_id is None and self.hosts:
            host = self.hosts[index % len(self.hosts)]
        elif open_hosts:
            # The guard knows hosts only by their prompt spans: a batch for an open prompt ID
            # comes from a host of that prompt, whatever its parent span.
            host = open_hosts[index % len(open_hosts)]
        else:
            prompt_id = bare_id or PROMPT_IDS[index % len(PROMPT_IDS)]
            host = self.bare.get(prompt_id) or self._new_host(prompt_id, None)
            self.bare[prompt_id] = host
        instance = self.instances.setdefault(host.prompt_id, Instance())
        if kind == "unreliable":
            instance.no_stop = instance.no_stop or "unreliable input"
        if kind in ("third_party", "third_party_mixed"):
            instance.no_stop = instance.no_stop or "a tool that is not native or mcp"
        if kind == "opt_out":
            instance.opted_out = True
        observations_before = self._observations() if instance.opted_out else 0

        extra: dict[str, Any] = {"acp.prompt.route": "background"} if kind == "opt_out" else {}
        self.harness.batch(
            host.prompt_id,
            calls_of(kind, variant),
            parent=host.span,
            reliable=kind != "unreliable",
            batch_attributes=extra,
        )
        action = self.harness.guard.take_action(host.prompt_id) if take else None
        stops_before = self.stops
        self._read_new_logs(host, kind)
        if action is not None and action.kind == "stop":
            assert self.stops == stops_before + 1, "a stop action without its stopped record"
        if instance.opted_out:
            assert self._observations() == observations_before, "observations of opted-out"
        reminded = action is not None and action.kind == "reminder"
        if self.instances.get(host.prompt_id) is instance:
            instance.last = (host.number, kind, reminded)
            if reminded:
                instance.reminded_host = host.number
                instance.reminded_key = KEY_OF.get(kind)

    @rule(prompt_id=st.sampled_from(PROMPT_IDS), turns=st.integers(min_value=1, max_value=4))
    def genai_prompt(self, prompt_id: str, turns: int) -> None:
        """A whole GenAI-conventions prompt with this ID as its conversation ID, in a trace of
        its own: another profile with the same prompt ID, a collision if the ID has any state."""
        tracer = self.harness.tracer
        prompt = tracer.start_span(
            "invoke_agent",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.conversation.id": prompt_id,
            },
        )
        context = set_span_in_context(prompt)
        for turn in range(turns + 1):
            tracer.start_span(
                "chat", context=context, attributes={"gen_ai.operation.name": "chat"}
            ).end()
            if turn == turns:
                break
            for c in range(4):
                tool = tracer.start_span(
                    "execute_tool",
                    context=context,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "run_shell",
                        "gen_ai.tool.call.id": f"g{turn}-{c}",
                        "error.type": "exit_nonzero",
                    },
                )
                tool.end()
        instance = self.instances.get(prompt_id)
        if instance is not None:
            instance.no_stop = instance.no_stop or "a prompt of another profile"
            self.collisions += 1
        prompt.end()
        self._read_new_logs()

    @precondition(lambda self: self.push_outs)
    @rule()
    def push_out_open_spans(self) -> None:
        """Never-ending batch spans of other prompts push every open prompt span out of the
        bounded span table; a later prompt span with one of their IDs must collide."""
        guard: Any = self.harness.guard
        for _ in range(guard._max_tracked):
            self.junk += 1
            self.harness.tracer.start_span(
                "tool_batch", attributes={"acp.prompt.id": f"junk-{self.junk}"}
            )
        self._read_new_logs()

    @rule(seconds=st.sampled_from([1.0, 30.0, TTL + 1]))
    def advance_time(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def guard_never_raised(self) -> None:
        assert "internal_error" not in self.harness.guard.diagnostics()

    def teardown(self) -> None:
        # Shown by --hypothesis-show-statistics: how often the sequences reach what they test.
        event("reached a stop" if self.stops else "no stop")
        event("some state lost" if self.lost else "no state lost")
        event("a collision" if self.collisions else "no collision")
        self.harness.tracer_provider.shutdown()
        self.harness.logger_provider.shutdown()
        self.harness.meter_provider.shutdown()


class GuardWithRoom(GuardUnderStateLoss):
    """A table with room for every ID: losses come from the TTL only, and stops are reached."""

    max_prompts = 50


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGuardUnderStateLoss = GuardUnderStateLoss.TestCase
TestGuardUnderStateLoss.settings = SETTINGS
TestGuardWithRoom = GuardWithRoom.TestCase
TestGuardWithRoom.settings = SETTINGS


class GuardLosingOpenSpans(GuardUnderStateLoss):
    """With the open-span eviction move: never-ending batch spans push open prompt spans out of
    the span table between any other moves."""

    push_outs = True


TestGuardLosingOpenSpans = GuardLosingOpenSpans.TestCase
TestGuardLosingOpenSpans.settings = SETTINGS


# -- each finding, one scenario ------------------------------------------------------------------


def loop(h: Harness, prompt_id: str, batches: int, parent: Span | None = None) -> list[str | None]:
    """Failing batches, the host taking every action; the kinds of the actions it got."""
    kinds: list[str | None] = []
    for _ in range(batches):
        h.batch(prompt_id, [FAIL] * 4, parent=parent)
        action = h.guard.take_action(prompt_id)
        kinds.append(None if action is None else action.kind)
    return kinds


def test_an_unreliable_prompt_evicted_by_other_prompts_is_rebuilt_without_enforcement() -> None:
    h = Harness(mode="enforce", max_prompts=10)
    prompt = h.start_prompt("p")
    h.batch("p", [FAIL] * 4, parent=prompt, reliable=False)
    for i in range(10):
        h.start_prompt(f"other-{i}")  # p is idle, so the first to go
    assert h.guard.state("p") is None
    assert loop(h, "p", 4, prompt) == [None, "reminder", None, None]
    assert h.decision_counts()["would_stop"] == 1 and "stopped" not in h.decision_counts()


def test_an_unreliable_prompt_past_the_ttl_is_rebuilt_without_enforcement() -> None:
    now = [0.0]
    h = Harness(mode="enforce", prompt_ttl_seconds=60, clock=lambda: now[0])
    h.batch("p", [FAIL] * 4, reliable=False)  # no prompt span: remembered by ID
    now[0] = 7 * 3600.0
    assert loop(h, "p", 4) == [None, "reminder", None, None]
    assert h.guard.diagnostics() == {"expired": 1}
    rebuilt = h.guard.state("p")
    assert rebuilt is not None and rebuilt.enforcement_disabled


def test_any_dropped_state_is_rebuilt_without_enforcement() -> None:
    h = Harness(mode="enforce", max_prompts=1)
    h.batch("p", [FAIL] * 4)
    h.batch("q", [FAIL] * 4)  # p is evicted mid-candidate
    assert loop(h, "p", 4) == [None, "reminder", None, None]


def test_opted_out_prompts_stay_off_after_eviction() -> None:
    h = Harness(mode="enforce", max_prompts=2)
    channel = h.start_prompt("channel", channel=True)
    cron = h.start_prompt("cron", route="cron")
    h.batch("by-batch", [OK], batch_attributes={"acp.prompt.route": "notification"})
    for i in range(6):
        h.start_prompt(f"other-{i}")
    assert loop(h, "channel", 4, channel) == [None] * 4
    assert loop(h, "cron", 4, cron) == [None] * 4
    assert loop(h, "by-batch", 4) == [None] * 4
    named = {dict(r.log_record.attributes or {}).get("prompt_id") for r in h.logs()}
    assert named.isdisjoint({"channel", "cron", "by-batch"})
    assert h.points() == []  # no decision at all


def test_an_action_not_taken_is_dropped_when_an_opting_out_batch_settles() -> None:
    h = Harness(mode="enforce")
    assert loop(h, "p", 2) == [None, "reminder"]
    h.batch("p", [FAIL] * 4)  # a stop is pending, and the host does not take it
    h.batch("p", [OK], batch_attributes={"acp.prompt.route": "background"})
    assert h.guard.take_action("p") is None


def test_a_new_prompt_span_starts_fresh_after_its_id_was_dropped() -> None:
    h = Harness(mode="enforce", max_prompts=1)
    h.batch("p", [FAIL] * 4, reliable=False)
    h.batch("q", [FAIL] * 4)  # p dropped: remembered as unreliable-lost
    prompt = h.start_prompt("p")  # a new prompt with that ID
    assert loop(h, "p", 3, prompt) == [None, "reminder", "stop"]


def test_third_party_tools_never_count_and_disable_enforcement() -> None:
    for tool_type in (None, "third_party", "NATIVE", 7):
        h = Harness(mode="enforce")
        third = (
            Call(tool_type=tool_type)
            if not isinstance(tool_type, int)
            else Call(tool_type=None, extra={"acp.tool.type": tool_type})
        )
        for _ in range(3):
            h.batch("p", [third] * 4)
            assert h.guard.take_action("p") is None
        assert h.decision_counts() == {"reset": 1}  # unknown, with enforcement disabled
        state = h.guard.state("p")
        assert state is not None and state.enforcement_disabled and state.failure_count == 0
        assert loop(h, "p", 3) == [None, "reminder", None]  # native failures: warn at most


def test_mcp_and_native_tools_are_eligible() -> None:
    h = Harness(mode="enforce")
    h.batch("p", [Call(tool_type="mcp")] * 4)
    h.guard.take_action("p")
    assert loop(h, "p", 2) == ["reminder", "stop"]


def test_colliding_prompt_spans_disable_enforcement_and_share_one_state_until_both_end() -> None:
    h = Harness(mode="enforce")
    first = h.start_prompt("p")
    assert loop(h, "p", 1, first) == [None]
    second = h.start_prompt("p")
    assert h.guard.diagnostics() == {"prompt_collision": 1}
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert dict(record.log_record.attributes or {}) == {
        "diagnostic": "prompt_collision",
        "prompt_id": "p",
    }
    assert record.log_record.span_id == second.get_span_context().span_id
    # The second host gets the reminder; the first never gets a stop it was not warned for.
    assert loop(h, "p", 1, second) == ["reminder"]
    assert loop(h, "p", 1, first) == [None]
    second.end()
    state = h.guard.state("p")
    assert state is not None and state.enforcement_disabled and state.phase == "latched"
    first.end()
    assert h.guard.state("p") is None
    assert "stopped" not in h.decision_counts()


def test_a_collision_withdraws_a_pending_stop() -> None:
    h = Harness(mode="enforce")
    first = h.start_prompt("p")
    loop(h, "p", 2, first)
    h.batch("p", [FAIL] * 4, parent=first)  # a stop is pending for the first host
    h.start_prompt("p")
    assert h.guard.take_action("p") is None
    assert h.guard.diagnostics() == {"prompt_collision": 1}


def test_a_batch_without_a_prompt_span_after_a_fresh_prompt_span_ended_is_a_new_prompt() -> None:
    h = Harness(mode="enforce", max_prompts=1)
    h.batch("p", [FAIL] * 4)
    h.batch("q", [FAIL] * 4)  # p dropped
    h.start_prompt("p").end()  # a new prompt with that ID, which ends: nothing of p is left
    h.batch("p", [FAIL] * 4)
    state = h.guard.state("p")
    assert state is not None and not state.enforcement_disabled


def test_a_collision_with_an_opted_out_span_turns_the_id_off() -> None:
    h = Harness(mode="enforce")
    h.start_prompt("p")
    h.start_prompt("p", route="subagent")
    assert loop(h, "p", 3) == [None] * 3
    assert h.logs() == []  # the ID is off now: no telemetry at all, the collision's included


def test_contract_violation_is_a_diagnostic_beside_its_reset() -> None:
    h = Harness(mode="shadow")
    batch_spans: list[Any] = []
    h.batch("p", [Call(status="success", execution="error")])
    batch_spans = [s for s in h.span_exporter.get_finished_spans() if s.name == "tool_batch"]
    assert h.decision_counts() == {"reset": 1}
    assert h.diagnostic_counts() == {"contract_violation": 1}
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert dict(record.log_record.attributes or {}) == {
        "diagnostic": "contract_violation",
        "prompt_id": "p",
    }
    assert record.log_record.span_id == batch_spans[0].context.span_id


def test_observations_are_counted_by_execution_status_and_tool_type() -> None:
    h = Harness(mode="shadow")
    h.batch(
        "p",
        [
            FAIL,
            FAIL,
            OK,
            Call(tool_type="mcp", status="cancelled", execution="cancelled"),
            Call(tool_type="third_party", execution="not_started", status="error"),
            Call(execution=None),
            Call(execution="exploded"),
        ],
    )
    h.start_prompt("off", route="cron")
    h.batch("off", [FAIL] * 3)  # not evaluated: not observed
    points = sorted(
        (a["execution_status"], a["tool_type"], v) for a, v in h.points(OBSERVATIONS_METRIC)
    )
    assert points == [
        ("cancelled", "mcp", 1),
        ("error", "native", 2),
        ("not_started", "other", 1),
        ("success", "native", 1),
        ("unknown", "native", 2),
    ]


def test_log_records_carry_the_batch_end_as_timestamp_and_an_observed_timestamp() -> None:
    h = Harness(mode="enforce")
    loop(h, "p", 3)
    h.start_prompt("p")  # no collision: p had no prompt span; a diagnostic-free start
    h.guard.force_flush()
    batches = [s for s in h.span_exporter.get_finished_spans() if s.name == "tool_batch"]
    transitions = h.logs(TRANSITION_EVENT)
    assert [r.log_record.timestamp for r in transitions] == [s.end_time for s in batches]
    for record in h.logs():
        assert record.log_record.timestamp and record.log_record.observed_timestamp
        assert record.log_record.observed_timestamp >= record.log_record.timestamp


def test_diagnostic_records_carry_a_timestamp() -> None:
    h = Harness(mode="shadow", max_prompts=1)
    h.batch("p", [FAIL])
    h.batch("q", [FAIL])
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert record.log_record.timestamp is not None and record.log_record.timestamp > 0
    assert record.log_record.observed_timestamp is not None


def test_call_data_over_the_byte_budget_is_shed_by_the_longest_holder() -> None:
    seen: list[Any] = []
    h = Harness(mode="shadow", max_call_bytes=9_000, listener=seen.append)
    from opentelemetry.trace import set_span_in_context

    stuck = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "stuck"})
    for _ in range(20):
        h.tool_span(FAIL, set_span_in_context(stuck)).end()
    assert h.guard.diagnostics() == {}
    for _ in range(20):
        h.batch("live", [FAIL] * 2)  # each batch holds little: the stuck batch goes first
    assert h.guard.diagnostics() == {"batch_overflow": 1}
    assert all(e.batch.complete for e in seen)
    stuck.set_attributes({"acp.batch.admitted": 20, "acp.input.reliable": True})
    stuck.end()
    assert seen[-1].prompt_id == "stuck" and seen[-1].batch.complete is False
    (record,) = h.logs(DIAGNOSTIC_EVENT)
    assert dict(record.log_record.attributes or {}) == {
        "diagnostic": "batch_overflow",
        "prompt_id": "stuck",
    }


def _calls(prefix: str, count: int) -> list[Call]:
    # Each counts as 400 bytes plus its call ID (2), tool name (9) and error type (12): 423.
    return [Call(call_id=f"{prefix}{i}") for i in range(count)]


def test_call_data_of_exactly_the_byte_budget_is_kept_and_one_byte_less_is_shed() -> None:
    # 423 bytes, and 402 for a call with neither a tool name nor an error type.
    calls = [Call(call_id="a0"), Call(call_id="a1", tool=None, error_type=None)]
    # The second call lacks its tool name: a missing_attribute diagnostic either way.
    missing = {"missing_attribute": 1}
    for budget, complete, diagnostics in (
        (825, True, missing),
        (824, False, {"batch_overflow": 1, **missing}),
    ):
        seen: list[Any] = []
        h = Harness(mode="shadow", max_call_bytes=budget, listener=seen.append)
        h.batch("p", calls)
        assert seen[-1].batch.complete is complete
        assert h.guard.diagnostics() == diagnostics


def test_a_batch_that_gave_up_its_call_data_stays_incomplete_and_frees_exactly_its_bytes() -> None:
    from opentelemetry.trace import set_span_in_context

    seen: list[Any] = []
    h = Harness(mode="shadow", max_call_bytes=846, listener=seen.append)  # two calls
    stuck = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": "stuck"})
    h.tool_span(Call(call_id="s0"), set_span_in_context(stuck)).end()
    h.batch("live", _calls("a", 2))  # the second call is over the budget: the stuck one sheds
    assert h.guard.diagnostics() == {"batch_overflow": 1}
    assert seen[-1].batch.complete is True
    h.tool_span(Call(call_id="s1"), set_span_in_context(stuck)).end()  # not kept any more
    stuck.set_attributes({"acp.batch.admitted": 1, "acp.input.reliable": True})
    stuck.end()
    assert seen[-1].prompt_id == "stuck" and seen[-1].batch.complete is False
    assert seen[-1].batch.observations == ()
    # With every batch ended the whole budget is free again, and no more than that.
    h.batch("live", _calls("b", 2))
    assert seen[-1].batch.complete is True
    h.batch("live", _calls("c", 3))
    assert seen[-1].batch.complete is False
    assert h.guard.diagnostics() == {"batch_overflow": 2}


def open_batch(h: Harness, prompt_id: str) -> None:
    h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": prompt_id})  # never ends


def test_a_prompt_span_pushed_out_of_the_span_table_keeps_its_dropped_state_from_enforcing() -> (
    None
):
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)  # 5 open spans at most
    h.start_prompt("a")
    h.batch("b", [FAIL])  # evicts the state of "a" while its prompt span is open
    for i in range(5):
        open_batch(h, f"x{i}")  # pushes the prompt span of "a" out of the table
    h.batch("a", [FAIL])
    state = h.guard.state("a")
    assert state is not None and state.phase == "tracking" and state.enforcement_disabled
    # The first span of "a" may still be open, its record lost to the bound: a collision,
    # never a fresh enforcing prompt (docs/contract.md section 4).
    h.start_prompt("a")
    assert h.guard.diagnostics()["prompt_collision"] == 1
    state = h.guard.state("a")
    assert state is not None and state.enforcement_disabled


def test_an_opted_out_prompt_span_pushed_out_of_the_span_table_stays_off() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)
    h.start_prompt("a", route="cron")
    h.batch("b", [FAIL])  # evicts the state of "a"
    for i in range(5):
        open_batch(h, f"x{i}")
    h.batch("a", [FAIL])
    assert h.decision_counts() == {"tracked": 1}  # the batch of "b" only


def test_a_colliding_prompt_id_stays_open_while_one_of_its_spans_is_in_the_span_table() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)  # 5 open spans at most
    h.start_prompt("a")
    h.start_prompt("a")  # a collision: two open spans
    for i in range(4):
        open_batch(h, f"x{i}")  # pushes the first span of "a" out
    h.start_prompt("a")  # the second is still open: another collision
    assert h.guard.diagnostics()["prompt_collision"] == 2


def test_a_prompt_span_pushed_out_while_its_state_is_kept_is_not_remembered_as_dropped() -> None:
    # Room for 9 open spans and 8 dropped prompt IDs.
    h = Harness(mode="enforce", max_prompts=2, max_calls_per_batch=1)
    h.start_prompt("a")
    h.batch("a", [FAIL])  # tracking: eviction takes the idle prompts first
    for i in range(9):
        h.batch(f"d{i}", [OK])  # each evicts the one before: d0 to d7 are remembered
    for i in range(9):
        open_batch(h, f"x{i}")  # pushes the prompt span of "a" out; its state stays
    assert h.guard.state("a") is not None
    h.batch("d0", [FAIL])
    state = h.guard.state("d0")
    assert state is not None and state.enforcement_disabled  # still known as dropped


def test_the_table_of_dropped_prompts_forgets_the_oldest_first() -> None:
    h = Harness(mode="enforce", max_prompts=1)  # 4 dropped prompt IDs are remembered
    for i in range(6):
        h.batch(f"p{i}", [OK])  # each evicts the one before: p0 to p4 dropped, p0 forgotten
    h.batch("p0", [FAIL])
    state = h.guard.state("p0")
    assert state is not None and not state.enforcement_disabled  # forgotten: a new prompt
    h.batch("p2", [FAIL])  # p0 evicted p5 in turn, so p1 is forgotten too, but not p2
    state = h.guard.state("p2")
    assert state is not None and state.enforcement_disabled  # still known as dropped


def test_an_opting_out_batch_that_finds_its_state_expired_reports_nothing_and_stays_off() -> None:
    now = [0.0]
    h = Harness(mode="enforce", prompt_ttl_seconds=10.0, clock=lambda: now[0])
    h.batch("p", [FAIL])
    now[0] = 10.0
    h.batch("p", [OK], batch_attributes={"acp.prompt.route": "cron"})
    assert h.logs(DIAGNOSTIC_EVENT) == []  # the prompt it drops is off: no telemetry
    state = h.guard.state("p")
    assert state is not None and state.enforcement_disabled  # rebuilt from the dropped facts
    h.batch("p", [FAIL] * 4)
    assert h.decision_counts() == {"tracked": 1}  # the first batch only


def test_a_prompt_opted_out_by_a_batch_stays_off_once_its_span_left_the_span_table() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)  # 5 open spans at most
    h.start_prompt("a")
    h.batch("a", [OK], batch_attributes={"acp.prompt.route": "cron"})  # opts "a" out
    h.batch("b", [FAIL])  # evicts the state of "a"
    for i in range(5):
        open_batch(h, f"x{i}")  # pushes the prompt span of "a" out
    h.batch("a", [FAIL])
    assert h.decision_counts() == {"tracked": 1}  # the batch of "b" only
    named = {dict(r.log_record.attributes or {}).get("prompt_id") for r in h.logs()}
    assert "a" not in named


def test_an_id_whose_state_was_evicted_while_its_prompt_span_was_open_is_new_once_it_ended() -> (
    None
):
    h = Harness(mode="enforce", max_prompts=1)
    span = h.start_prompt("a")
    h.batch("b", [FAIL] * 4)  # evicts the state of "a" while its span is open
    span.end()  # the prompt ended: nothing of "a" is kept
    h.batch("a", [FAIL] * 4)
    state = h.guard.state("a")
    assert state is not None and not state.enforcement_disabled


def test_a_batch_that_ended_gives_back_exactly_its_bytes() -> None:
    seen: list[Any] = []
    h = Harness(mode="shadow", max_call_bytes=846, listener=seen.append)
    h.batch("p", _calls("a", 1))  # 423 bytes, given back when it ends
    h.batch("p", [Call(call_id="b0"), Call(call_id="b10")])  # 423 + 424: one byte over
    assert [e.batch.complete for e in seen] == [True, False]
    assert h.guard.diagnostics() == {"batch_overflow": 1}


def test_an_opted_out_prompt_span_lost_to_the_span_table_stays_off_once_its_drop_is_forgotten() -> (
    None
):
    evaluations: list[Any] = []
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1, listener=evaluations.append)
    h.start_prompt("a", route="cron")  # stays open
    h.batch("b", [FAIL])  # evicts the state of "a"
    for i in range(5):
        open_batch(h, f"x{i}")  # pushes the prompt span of "a" out of the span table
    for i in range(6):
        h.batch(f"y{i}", [FAIL])  # each evicts the previous: the dropped table forgets "a"
    h.batch("a", [FAIL])
    assert [e.prompt_id for e in evaluations if e.prompt_id == "a"] == []
    assert all(dict(r.log_record.attributes or {}).get("prompt_id") != "a" for r in h.logs())


def test_a_collision_with_lost_prompt_spans_keeps_its_opt_out_once_the_tracked_span_ended() -> None:
    # The state machine's shrunk sequence: two spans of "a" lost to the span table, a third
    # opting out collides with them and ends; the lost ones are still open, and so is the opt-out.
    h = Harness(mode="enforce", max_prompts=3, max_calls_per_batch=4)  # 16 open spans at most
    first = h.start_prompt("a")
    h.start_prompt("a")  # a collision: two open spans
    for i in range(16):
        open_batch(h, f"x{i}")  # pushes both spans of "a" out of the span table
    h.start_prompt("a", route="cron").end()  # collides with the lost ones, opts the ID out
    h.batch("a", [OK], parent=first)
    assert h.points(OBSERVATIONS_METRIC) == []
    records = [dict(r.log_record.attributes or {}) for r in h.logs(DIAGNOSTIC_EVENT)]
    assert [r.get("prompt_id") for r in records if r["diagnostic"] == "prompt_collision"] == [
        "a",  # the first collision, before the opt-out; the second, opting out, is not reported
    ]
    named = [dict(r.log_record.attributes or {}).get("prompt_id") for r in h.logs()]
    assert named.count("a") == 1
    assert h.decision_counts() == {}


def test_an_inferred_prompt_colliding_with_lost_opted_out_spans_names_no_prompt() -> None:
    h = Harness(mode="enforce", max_prompts=3, max_calls_per_batch=4)
    h.start_prompt("a")
    h.start_prompt("a")
    for i in range(16):
        open_batch(h, f"x{i}")
    h.start_prompt("a", route="cron").end()
    prompt = h.tracer.start_span(
        "invoke_agent",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "a"},
    )
    h.tracer.start_span(
        "chat", context=set_span_in_context(prompt), attributes={"gen_ai.operation.name": "chat"}
    ).end()
    prompt.end()
    named = [dict(r.log_record.attributes or {}).get("prompt_id") for r in h.logs()]
    assert named.count("a") == 1  # the first collision only, before the opt-out
    assert h.guard.diagnostics()["prompt_collision"] == 1  # the later two are an off ID's


def test_a_prompt_whose_lost_span_ended_leaves_no_state_to_a_later_host() -> None:
    # The state machine's second shrunk sequence: the span of "b" is lost to the span table
    # while its state is kept, the host takes a reminder and ends the span; a later host sending
    # batches with the ID is a new prompt, which no stop may reach.
    h = Harness(mode="enforce", max_prompts=3, max_calls_per_batch=4)
    span = h.start_prompt("b")
    assert loop(h, "b", 1, span) == [None]
    for i in range(16):
        open_batch(h, f"x{i}")  # pushes the span of "b" out of the span table
    assert loop(h, "b", 1, span) == ["reminder"]
    span.end()  # untracked, but its ID's lost entry counts it: nothing of "b" is kept
    assert h.guard.state("b") is None
    assert loop(h, "b", 3) == [None, "reminder", "stop"]  # a new prompt, from its start


def test_a_kept_state_whose_prompt_span_left_the_span_table_never_enforces_again() -> None:
    # Room for 2 prompts, 12 open spans and 8 lost prompt IDs.
    h = Harness(mode="enforce", max_prompts=2, max_calls_per_batch=4)
    span = h.start_prompt("a")
    assert loop(h, "a", 2, span) == [None, "reminder"]  # warned: eviction takes idle ones first
    for i in range(12):
        open_batch(h, f"x{i}")  # pushes the span of "a" out; its state stays
    for p in range(8):
        h.start_prompt(f"p{p}")
        for i in range(12):
            open_batch(h, f"p{p}-x{i}")  # each lost span: the lost table forgets "a"
    span.end()  # unseen now: the state of "a" outlives its prompt
    state = h.guard.state("a")
    assert state is not None and state.enforcement_disabled
    assert loop(h, "a", 1) == [None]  # a later host of "a": never a stop from that history
    assert "stopped" not in h.decision_counts()


# -- losing batches never stops sooner -------------------------------------------------------------


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),  # the batch's prompt
            st.integers(min_value=0, max_value=4),  # its failing calls
            st.booleans(),  # and a successful call of the same tool
            st.sampled_from([0, 0, 0, 12]),  # spans opened, never ended, while it is open
        ),
        max_size=30,
    ),
    max_prompts=st.integers(min_value=1, max_value=2),
)
@example(  # the batch holding the candidate's success is pushed out while it is open
    steps=[("a", 4, False, 0), ("a", 0, True, 12), ("a", 4, False, 0), ("a", 4, False, 0)],
    max_prompts=1,
)
def test_a_stop_under_state_loss_is_never_sooner_than_with_full_knowledge(
    steps: list[tuple[str, int, bool, int]], max_prompts: int
) -> None:
    """Section 4: losing state never widens what the guard may do. Open spans that never end
    push batch spans (and prompt states) out of the guard's bounded tables; every batch is
    complete, so the pure reducer on all of them is the guard with full knowledge. The host
    takes every action. A stop of the guard must come at or after that guard's first stop."""
    h = Harness(mode="enforce", max_prompts=max_prompts, max_calls_per_batch=5)
    full: dict[str, GuardState] = {}
    reminded: dict[str, int] = {}
    stopped: set[str] = set()
    for index, (prompt_id, failing, succeeding, others) in enumerate(steps):
        calls = [FAIL] * failing + [OK] * succeeding
        if not calls:
            continue
        batch = h.tracer.start_span("tool_batch", attributes={"acp.prompt.id": prompt_id})
        observations = []
        for number, call in enumerate(calls):
            call_id = f"{index}-{number}"
            h.tool_span(replace(call, call_id=call_id), set_span_in_context(batch)).end()
            observations.append(
                Observation(
                    call_id,
                    call.tool,
                    call.tool_type,
                    call.status or "",
                    call.execution,
                    call.error_type,
                )
            )
        for other in range(others):
            open_batch(h, f"other-{index}-{other}")
        batch.set_attributes({"acp.batch.admitted": len(calls), "acp.input.reliable": True})
        batch.end()
        action = h.guard.take_action(prompt_id)
        before = full.get(prompt_id, GuardState.initial())
        batch_input = GuardInput("enforce", Batch(True, tuple(observations)), False, False, True)
        decision = reduce(before, batch_input)
        full[prompt_id] = decision.state
        if decision.kind == "warn":
            reminded[prompt_id] = decision.state.candidate_ordinal
        elif decision.kind == "stop" and reminded.get(prompt_id) == before.candidate_ordinal:
            stopped.add(prompt_id)
        if action is not None and action.kind == "stop":
            assert prompt_id in stopped, f"batch {index}: a stop the full guard had not issued"


# -- past every exact table: open prompt spans whose facts the table of lost IDs forgot -------
# With max_prompts=1 and one call per batch: 5 open spans, 4 lost prompt IDs. Twenty prompt
# spans that never end push out every record and every lost ID of the ones before them.


def test_an_opted_out_prompt_stays_off_when_even_its_lost_id_is_forgotten() -> None:
    evaluations: list[Any] = []
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1, listener=evaluations.append)
    cron = h.start_prompt("v", route="cron")  # open, never ends
    for i in range(20):
        h.start_prompt(f"o{i}")  # open, never end
    assert loop(h, "v", 3, cron) == [None, None, None]
    assert [e.prompt_id for e in evaluations] == []
    assert all(dict(r.log_record.attributes or {}).get("prompt_id") != "v" for r in h.logs())


def test_a_disabled_prompt_never_enforces_when_even_its_lost_id_is_forgotten() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=4)  # 8 open spans, 4 lost IDs
    span = h.start_prompt("v")
    h.batch("v", [FAIL] * 4, parent=span, reliable=False)  # enforcement disabled
    for i in range(40):
        h.start_prompt(f"o{i}")
    assert loop(h, "v", 3, span) == [None, "reminder", None]
    state = h.guard.state("v")
    assert state is not None and state.enforcement_disabled


def test_a_second_prompt_span_collides_when_even_the_first_ones_lost_id_is_forgotten() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=4)  # 8 open spans, 4 lost IDs
    h.start_prompt("a")  # open, never ends
    for i in range(40):
        h.start_prompt(f"o{i}")
    second = h.start_prompt("a")
    assert h.guard.diagnostics()["prompt_collision"] == 1
    assert loop(h, "a", 3, second) == [None, "reminder", None]  # never a stop


def test_an_opt_out_learned_after_the_lost_id_was_forgotten_stays() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=1)
    span = h.start_prompt("v")
    for i in range(20):
        h.start_prompt(f"o{i}")
    named_before = len(named(h, "v"))  # its eviction, while it was guarded
    h.batch("v", [FAIL], parent=span, batch_attributes={"acp.prompt.route": "cron"})
    for i in range(20):
        h.batch(f"d{i}", [OK])  # evict the state of "v" and every dropped ID
    h.batch("v", [FAIL], parent=span)
    assert len(named(h, "v")) == named_before


def named(h: Harness, prompt_id: str) -> list[Any]:
    return [r for r in h.logs() if (r.log_record.attributes or {}).get("prompt_id") == prompt_id]


def test_a_forgotten_prompt_span_that_ended_leaves_its_id_to_a_fresh_prompt() -> None:
    h = Harness(mode="enforce", max_prompts=1, max_calls_per_batch=4)
    first = h.start_prompt("a", route="cron")
    for i in range(40):
        h.start_prompt(f"o{i}")
    first.end()  # untracked: the coarse table's count for "a" goes back to none
    fresh = h.start_prompt("a")
    assert h.guard.diagnostics().get("prompt_collision", 0) == 0
    assert loop(h, "a", 3, fresh) == [None, "reminder", "stop"]
