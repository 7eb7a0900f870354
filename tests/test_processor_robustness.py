"""The guard never raises into span.end(), stays bounded, and is safe across threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from harness import FAIL, Call, Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry._logs import NoOpLogger, NoOpLoggerProvider
from opentelemetry.metrics import NoOpCounter, NoOpMeter, NoOpMeterProvider
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from otel_guard import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT, TRANSITION_EVENT
from otel_guard.reducer import REMINDER, STOP_MESSAGE, GuardState

# -- malformed spans -----------------------------------------------------------------------------

_junk = st.one_of(
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.binary(max_size=8).map(lambda b: b.hex()),
    st.text(max_size=3000),
    st.lists(st.text(max_size=5), max_size=3),
    st.just("x" * 100_000),
)
_required = [
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "acp.tool.status",
    "acp.tool.execution.status",
    "acp.tool.execution.error_type",
]


@st.composite
def malformed_calls(draw: st.DrawFn) -> Call:
    """A failing call with at least one required outcome field wrong or missing."""
    broken = draw(st.lists(st.sampled_from(_required), min_size=1, unique=True))
    extra: dict[str, Any] = {}
    for key in broken:
        value = draw(st.one_of(st.none(), _junk))
        if key == "acp.tool.status" and value in ("error", "success", "cancelled"):
            value = 17
        if key == "acp.tool.execution.status" and value in ("error", "success", "not_started"):
            value = 17
        if key == "gen_ai.tool.name" and isinstance(value, str) and 0 < len(value) <= 256:
            value = value if not value.strip() else 17
        if key == "gen_ai.tool.call.id" and isinstance(value, str):
            value = 17
        if key == "acp.tool.execution.error_type" and isinstance(value, str):
            value = value.upper() + " /"
        if value is None:
            value = 17 if key != "gen_ai.tool.name" else ""
        extra[key] = value
    extra["acp.tool.provider_duplicate"] = draw(st.one_of(st.just(False), _junk))
    if extra["acp.tool.provider_duplicate"] is True:
        extra["acp.tool.provider_duplicate"] = "yes"
    return Call(tool_type=draw(st.one_of(st.none(), st.text(max_size=4))), extra=extra)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.tuples(
            st.lists(st.one_of(st.just(FAIL), malformed_calls()), min_size=1, max_size=4),
            st.one_of(st.none(), _junk),
            st.one_of(st.none(), _junk),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_malformed_spans_never_raise_and_never_enforce(
    batches: list[tuple[list[Call], Any, Any]],
) -> None:
    h = Harness(mode="enforce")
    for calls, admitted, reliable in batches:
        if all(c is FAIL for c in calls):
            calls = [*calls, Call(extra={"acp.tool.execution.status": 17})]
        h.batch("p", calls, admitted=admitted, reliable=reliable)
        action = h.guard.take_action("p")
        assert action is None or action.kind == "reminder"
    assert "stopped" not in h.decision_counts()
    assert h.guard.diagnostics().get("internal_error", 0) == 0


class _ExplodingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")


def test_broken_span_objects_are_counted_as_internal_errors_not_raised() -> None:
    h = Harness(mode="enforce")
    context = SpanContext(trace_id=1, span_id=2, is_remote=False)
    weird = ReadableSpan(name="x", context=context, attributes=_ExplodingMapping())  # type: ignore[arg-type]
    h.guard.on_start(weird)  # type: ignore[arg-type]
    h.guard.on_start(None)  # type: ignore[arg-type]
    h.guard.on_end(None)  # type: ignore[arg-type]
    h.guard.on_end(object())  # type: ignore[arg-type]
    assert h.guard.diagnostics() == {"internal_error": 4}
    assert h.diagnostic_counts() == {"internal_error": 4}


def test_a_raising_listener_is_an_internal_error_and_changes_nothing() -> None:
    def listener(evaluation: BatchEvaluation) -> None:
        raise RuntimeError("listener bug")

    h = Harness(mode="enforce", listener=listener)
    actions = []
    for _ in range(3):
        h.batch("p", [FAIL] * 4)
        actions.append(h.guard.take_action("p"))
    assert actions == [None, GuardAction("reminder", REMINDER), GuardAction("stop", STOP_MESSAGE)]
    assert h.guard.diagnostics() == {"internal_error": 3}


# -- broken telemetry providers ------------------------------------------------------------------


class _RaisingMeterProvider(NoOpMeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("meter provider down")


class _RaisingCounter(NoOpCounter):
    def add(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("counter down")


class _RaisingCounterMeter(NoOpMeter):
    def create_counter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _RaisingCounter(name)


class _RaisingCounterMeterProvider(NoOpMeterProvider):
    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _RaisingCounterMeter(name)


class _RaisingLogger(NoOpLogger):
    def emit(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("log pipeline down")


class _RaisingLoggerProvider(NoOpLoggerProvider):
    def get_logger(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _RaisingLogger(name)


class _RaisingGetLoggerProvider(NoOpLoggerProvider):
    def get_logger(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("logger provider down")


def _script(guard: GuardSpanProcessor, h: Harness) -> list[tuple[str | None, GuardAction | None]]:
    seen: list[tuple[str | None, GuardAction | None]] = []
    for calls in ([FAIL] * 4, [FAIL] * 4, [FAIL] * 4, [Call(tool="x")], [FAIL] * 9, [FAIL] * 2):
        h.batch("p", calls)
        state = guard.state("p")
        seen.append((state.phase if state else None, guard.take_action("p")))
    return seen


def test_broken_meter_and_logger_providers_change_no_decision_and_no_action() -> None:
    reference = Harness(mode="enforce")
    expected = _script(reference.guard, reference)
    for meter_provider, logger_provider in [
        (_RaisingMeterProvider(), _RaisingGetLoggerProvider()),
        (_RaisingCounterMeterProvider(), _RaisingLoggerProvider()),
    ]:
        h = Harness(mode="enforce")
        guard = GuardSpanProcessor(
            mode="enforce", meter_provider=meter_provider, logger_provider=logger_provider
        )
        h.tracer_provider.add_span_processor(guard)
        assert _script(guard, h) == expected
        assert guard.diagnostics().get("internal_error", 0) == 0
    assert expected[2] == ("latched", GuardAction("stop", STOP_MESSAGE))


def test_failing_telemetry_is_counted_as_telemetry_error() -> None:
    h = Harness(mode="shadow")
    guard = GuardSpanProcessor(
        mode="shadow",
        meter_provider=h.meter_provider,
        logger_provider=_RaisingLoggerProvider(),
    )
    h.tracer_provider.add_span_processor(guard)
    h.batch("p", [FAIL] * 4)
    guard.force_flush()  # records are emitted off the agent's thread
    assert guard.diagnostics() == {"telemetry_error": 1}


# -- bounded memory ------------------------------------------------------------------------------


def test_oldest_idle_prompt_is_evicted_first() -> None:
    h = Harness(mode="shadow", max_prompts=3)
    h.batch("a", [FAIL] * 4)  # tracking
    h.start_prompt("b")  # idle
    h.batch("c", [FAIL] * 4)  # tracking
    h.batch("d", [FAIL] * 4)  # over the bound: b goes, although a is older
    assert h.guard.state("b") is None
    assert all(h.guard.state(p) is not None for p in "acd")
    assert h.guard.diagnostics() == {"evicted": 1}
    evicted = [dict(r.log_record.attributes or {}) for r in h.logs(DIAGNOSTIC_EVENT)]
    assert evicted == [{"diagnostic": "evicted", "prompt_id": "b"}]


def test_when_no_prompt_is_idle_the_least_recently_active_is_evicted() -> None:
    h = Harness(mode="shadow", max_prompts=2)
    h.batch("a", [FAIL] * 4)
    h.batch("b", [FAIL] * 4)
    h.batch("a", [FAIL] * 4)  # a is now the most recently active
    h.batch("c", [FAIL] * 4)
    assert h.guard.state("b") is None
    assert h.guard.state("a") is not None and h.guard.state("c") is not None


def test_inactive_prompts_expire_after_the_ttl() -> None:
    now = [0.0]
    h = Harness(mode="shadow", prompt_ttl_seconds=60, clock=lambda: now[0])
    h.batch("a", [FAIL] * 4)
    now[0] = 30.0
    h.batch("b", [FAIL] * 4)
    now[0] = 61.0
    h.batch("c", [FAIL] * 4)
    assert h.guard.state("a") is None
    assert h.guard.state("b") is not None
    assert h.guard.diagnostics() == {"expired": 1}


def test_never_ending_batch_spans_are_bounded() -> None:
    h = Harness(mode="shadow", max_prompts=1, max_calls_per_batch=1)
    spans = [h.tracer.start_span("batch", attributes={"acp.prompt.id": f"p{i}"}) for i in range(7)]
    assert h.guard.diagnostics() == {"evicted": 2}
    spans[0].set_attributes({"acp.batch.admitted": 0, "acp.input.reliable": True})
    spans[0].end()  # evicted: its calls are unknown, so it is an incomplete batch
    # One of them may have been an unknown outcome, which would have disabled enforcement:
    # the guard never enforces the prompt after such a batch (losing state never widens).
    assert h.guard.state("p0") == GuardState.initial()._replace(enforcement_disabled=True)


def test_many_prompts_that_never_end_keep_memory_bounded() -> None:
    h = Harness(mode="shadow", max_prompts=50)
    for i in range(500):
        h.start_prompt(f"p{i}")
        h.batch(f"p{i}", [FAIL])
    assert sum(h.guard.state(f"p{i}") is not None for i in range(500)) == 50
    assert h.guard.diagnostics() == {"evicted": 450}


# -- threads -------------------------------------------------------------------------------------


def test_concurrent_prompts_from_many_threads() -> None:
    h = Harness(mode="enforce")
    threads_count, prompts_per_thread = 8, 40
    results: dict[str, list[GuardAction | None]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_count)

    def agent(worker: int) -> None:
        try:
            barrier.wait()
            for i in range(prompts_per_thread):
                prompt_id = f"w{worker}-p{i}"
                prompt = h.start_prompt(prompt_id)
                actions = []
                for _ in range(4):
                    h.batch(prompt_id, [FAIL] * 4, parent=prompt)
                    actions.append(h.guard.take_action(prompt_id))
                results[prompt_id] = actions
                prompt.end()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=agent, args=(w,)) for w in range(threads_count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    total = threads_count * prompts_per_thread
    expected = [None, GuardAction("reminder", REMINDER), GuardAction("stop", STOP_MESSAGE), None]
    assert len(results) == total
    assert all(actions == expected for actions in results.values())
    assert h.decision_counts() == {"tracked": total, "warned": total, "stopped": total}
    assert len(h.logs(TRANSITION_EVENT)) == 3 * total
    assert h.guard.diagnostics() == {}
