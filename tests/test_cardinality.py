"""Guard metrics stay low-cardinality however many prompts and tools pass through the guard."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness import metric_points
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Tracer, set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.guard.telemetry import (
    DECISION_VALUES,
    DECISIONS_METRIC,
    DIAGNOSTICS,
    DIAGNOSTICS_METRIC,
    METRIC_ATTRIBUTE_VALUES,
    TRANSITION_EVENT,
)
from otel_guard.reducer import RESET_REASONS

PROMPTS = 10_000
TOOLS = 500
ERROR_TYPES = 40
MODES = ("shadow", "warn", "enforce")


def decisions_series_bound(values: Mapping[str, frozenset[str]]) -> int:
    """The most decisions-counter series the closed sets of docs/contract.md section 5 allow.

    Every series has ``route``, ``mode``, both phases, ``decision`` and both buckets; a reset
    adds its ``reset_reason``; any other decision adds ``terminal_status``, ``execution_status``
    and perhaps ``tool_type``.
    """
    common = math.prod(
        len(values[key])
        for key in (
            "route",
            "mode",
            "phase_before",
            "phase_after",
            "failure_count_bucket",
            "batch_count_bucket",
        )
    )
    resets = len(values["reset_reason"])
    others = (len(values["decision"]) - 1) * (
        len(values["terminal_status"])
        * len(values["execution_status"])
        * (len(values["tool_type"]) + 1)
    )
    return common * (resets + others)


@dataclass(frozen=True)
class Outcome:
    status: str = "error"
    execution: str = "error"
    error_type: str | None = "exit_nonzero"
    other_tool: bool = False


FAIL = Outcome()
SUCCESS = Outcome("success", "success", None)


class Agent:
    """A lean span producer: many prompts, many tools, every kind of reset."""

    def __init__(self, tracer: Tracer, guard: GuardSpanProcessor) -> None:
        self.tracer = tracer
        self.guard = guard
        self.calls = 0

    def prompt(self, n: int, mode: str) -> None:
        prompt_id = f"{mode}-prompt-{n}"
        tool = f"mcp__server{n % 7}__tool_{n % TOOLS}"
        other = f"native_tool_{(n + 1) % TOOLS}"
        error_type = f"err_{n % ERROR_TYPES}"
        tool_type = "mcp" if n % 2 else "native"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "acp.prompt.id": prompt_id,
        }
        if n % 29 == 0:
            attributes["acp.prompt.route"] = "cron"  # an unguarded prompt: no telemetry
        span = self.tracer.start_span("invoke_agent", attributes=attributes)

        def batch(outcomes: Sequence[Outcome], **drain: Any) -> None:
            self.batch(span, prompt_id, tool, other, tool_type, error_type, outcomes, **drain)

        # The mode is n % 3 (see Pipeline.run); the scenario and size vary independently of it.
        fails = [FAIL] * (1 + (n // 36) % 3)
        scenario = (n // 3) % 12
        batch(fails)
        if scenario == 0:  # loop: warn, then stop
            batch([FAIL] * 7)
            self.guard.take_action(prompt_id)
            batch([FAIL])
        elif scenario == 1:
            batch([SUCCESS])
        elif scenario == 2:
            batch([FAIL, Outcome(other_tool=True)])  # two keys: mixed
        elif scenario == 3:
            batch([Outcome("cancelled", "cancelled", None)])
        elif scenario == 4:
            batch(fails, external=True)
        elif scenario == 5:
            batch(fails, queued=True)
        elif scenario == 6:
            batch(fails, reliable=None)
        elif scenario == 7:
            batch([Outcome(error_type=f"Free text error {n}")])
        elif scenario == 8:
            batch([Outcome("error", "not_started", None)])
        elif scenario == 9:
            batch([Outcome("error", "success", None)])
        elif scenario == 10:
            batch([Outcome("success", "error", None)])
        else:
            batch(fails, admitted=99)  # incomplete
        span.end()

    def batch(
        self,
        prompt: Span,
        prompt_id: str,
        tool: str,
        other: str,
        tool_type: str,
        error_type: str,
        outcomes: Sequence[Outcome],
        *,
        external: bool = False,
        queued: bool = False,
        reliable: bool | None = True,
        admitted: int | None = None,
    ) -> None:
        batch_span = self.tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        context = set_span_in_context(batch_span)
        for outcome in outcomes:
            self.calls += 1
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": other if outcome.other_tool else tool,
                "gen_ai.tool.call.id": f"call-{self.calls}",
                "acp.tool.type": tool_type,
                "acp.tool.status": outcome.status,
                "acp.tool.execution.status": outcome.execution,
            }
            if outcome.error_type is not None:
                attributes["acp.tool.execution.error_type"] = (
                    error_type if outcome.error_type == "exit_nonzero" else outcome.error_type
                )
            self.tracer.start_span("execute_tool", context=context, attributes=attributes).end()
        batch_span.set_attribute(
            "acp.batch.admitted", len(outcomes) if admitted is None else admitted
        )
        batch_span.set_attribute("acp.input.external", external)
        batch_span.set_attribute("acp.input.queued_prompt", queued)
        if reliable is not None:
            batch_span.set_attribute("acp.input.reliable", reliable)
        batch_span.end()


class Pipeline:
    def __init__(self, keep_logs: bool = True) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        if keep_logs:
            self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.agents = {}
        for mode in MODES:
            guard = GuardSpanProcessor(
                mode=mode, meter_provider=self.meter_provider, logger_provider=self.logger_provider
            )
            provider = TracerProvider()
            provider.add_span_processor(guard)
            self.agents[mode] = Agent(provider.get_tracer("agent"), guard)

    def run(self, prompts: range) -> None:
        for n in prompts:
            self.agents[MODES[n % len(MODES)]].prompt(n, MODES[n % len(MODES)])

    def series(self, name: str) -> list[tuple[dict[str, Any], int]]:
        return metric_points(self.reader, name)


def test_decisions_counter_series_are_bounded_by_the_closed_sets() -> None:
    pipeline = Pipeline(keep_logs=False)  # the logs are checked below; here only time is spent
    pipeline.run(range(PROMPTS // 2))
    halfway = {frozenset(a.items()) for a, _ in pipeline.series(DECISIONS_METRIC)}
    pipeline.run(range(PROMPTS // 2, PROMPTS))
    series = pipeline.series(DECISIONS_METRIC)
    observed = len(series)
    bound = decisions_series_bound(METRIC_ATTRIBUTE_VALUES)
    print(f"decisions counter: {observed} series (closed-set bound {bound}) for {PROMPTS} prompts")
    assert observed <= bound
    # Twice the prompts, no new series: prompts and tools do not reach the labels.
    assert {frozenset(a.items()) for a, _ in series} == halfway
    assert observed < TOOLS
    # Every decision value and reset reason was exercised, so the count is not trivially small.
    assert {a["decision"] for a, _ in series} == set(DECISION_VALUES)
    assert {a["reset_reason"] for a, _ in series if "reset_reason" in a} == set(RESET_REASONS)


def test_every_guard_metric_attribute_belongs_to_the_spec_closed_sets() -> None:
    pipeline = Pipeline()
    pipeline.run(range(600))
    decisions = pipeline.series(DECISIONS_METRIC)
    diagnostics = pipeline.series(DIAGNOSTICS_METRIC)
    assert decisions
    for attributes, _ in decisions + diagnostics:
        for key, value in attributes.items():
            assert key in METRIC_ATTRIBUTE_VALUES, key
            assert value in METRIC_ATTRIBUTE_VALUES[key], (key, value)
    for attributes, _ in decisions:
        assert "diagnostic" not in attributes
        assert ("reset_reason" in attributes) == (attributes["decision"] == "reset")
        assert ("terminal_status" in attributes) == (attributes["decision"] != "reset")
    assert {a["diagnostic"] for a, _ in diagnostics} <= set(DIAGNOSTICS)
    # The transition log adds exactly the three log-only fields to the counter's attributes.
    log_only = {"prompt_id", "candidate_ordinal", "execution_error_type"}
    for record in pipeline.logs.get_finished_logs():
        if record.log_record.event_name == TRANSITION_EVENT:
            keys = set((record.log_record.attributes or {}).keys())
            assert keys - log_only <= set(METRIC_ATTRIBUTE_VALUES) - {"diagnostic"}
            assert {"prompt_id", "candidate_ordinal"} <= keys
