"""Fused dispatch: the guard's not-mine test first, the other processors as the SDK calls them."""

from __future__ import annotations

from typing import Any

import pytest
from harness import FAIL, OK, Call, Harness
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.trace import set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.guard.dispatch import GuardFirstSpanProcessor, guarded_tracer_provider
from otel_guard.guard.processor import ANY_VALUE, Interest


class Recorder(SpanProcessor):
    """Writes every hook call, with the span's name, into a shared journal."""

    def __init__(self, name: str, journal: list[tuple[str, str, str]]) -> None:
        self.name = name
        self.journal = journal
        self.flushes: list[int] = []

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self.journal.append((self.name, "start", span.name))

    def _on_ending(self, span: Span) -> None:
        self.journal.append((self.name, "ending", span.name))

    def on_end(self, span: ReadableSpan) -> None:
        self.journal.append((self.name, "end", span.name))

    def shutdown(self) -> None:
        self.journal.append((self.name, "shutdown", ""))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushes.append(timeout_millis)
        return True


class CountingGuard(GuardSpanProcessor):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, str]] = []

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self.calls.append(("start", span.name))
        super().on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.calls.append(("end", span.name))
        super().on_end(span)


def _spans(provider: TracerProvider) -> None:
    """A prompt, a model call, a batch with one tool call, and an HTTP request."""
    tracer = provider.get_tracer("agent")
    prompt = tracer.start_span(
        "invoke_agent",
        attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p"},
    )
    context = set_span_in_context(prompt)
    tracer.start_span("chat", context=context, attributes={"gen_ai.operation.name": "chat"}).end()
    batch = tracer.start_span("tool_batch", context=context, attributes={"acp.prompt.id": "p"})
    tool = tracer.start_span(
        "execute_tool",
        context=set_span_in_context(batch),
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "c1"},
    )
    tool.end()
    batch.set_attribute("acp.batch.admitted", 1)
    batch.end()
    tracer.start_span("GET", context=context, attributes={"http.request.method": "GET"}).end()
    prompt.end()


def test_other_processors_see_every_hook_in_the_order_the_sdk_calls_them() -> None:
    fused_journal: list[tuple[str, str, str]] = []
    fused = GuardFirstSpanProcessor(
        GuardSpanProcessor(mode="shadow"),
        [Recorder("a", fused_journal)],
    )
    fused_provider = TracerProvider(active_span_processor=fused)
    fused_provider.add_span_processor(Recorder("b", fused_journal))  # added later, still called

    plain_journal: list[tuple[str, str, str]] = []
    plain = SynchronousMultiSpanProcessor()
    plain.add_span_processor(GuardSpanProcessor(mode="shadow"))
    plain.add_span_processor(Recorder("a", plain_journal))
    plain.add_span_processor(Recorder("b", plain_journal))
    plain_provider = TracerProvider(active_span_processor=plain)

    _spans(fused_provider)
    _spans(plain_provider)
    fused_provider.shutdown()
    plain_provider.shutdown()
    assert fused_journal == plain_journal
    assert ("a", "ending", "chat") in fused_journal
    assert fused_journal[-2:] == [("a", "shutdown", ""), ("b", "shutdown", "")]


def test_the_guard_is_called_only_for_spans_that_may_be_its_own() -> None:
    guard = CountingGuard(mode="shadow")
    provider = guarded_tracer_provider(guard, fused=True)
    _spans(provider)
    assert guard.calls == [
        ("start", "invoke_agent"),
        ("end", "chat"),  # a model call: below a section 3 prompt, its trace is not watched
        ("start", "tool_batch"),
        ("end", "execute_tool"),
        ("end", "tool_batch"),
        ("end", "invoke_agent"),
    ]


def test_without_fusing_the_guard_is_called_for_every_span() -> None:
    guard = CountingGuard(mode="shadow")
    provider = guarded_tracer_provider(guard, fused=False)
    _spans(provider)
    assert len(guard.calls) == 2 * 5  # five spans


def test_force_flush_reaches_every_processor_and_reports_their_result() -> None:
    journal: list[tuple[str, str, str]] = []
    recorder = Recorder("a", journal)
    fused = GuardFirstSpanProcessor(GuardSpanProcessor(mode="shadow"), [recorder])
    assert fused.force_flush(5_000) is True
    assert len(recorder.flushes) == 1 and 0 < recorder.flushes[0] <= 5_000

    class Failing(Recorder):
        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return False

    fused.add_span_processor(Failing("b", journal))
    assert fused.force_flush() is False


def _scenario(h: Harness) -> None:
    prompt = h.start_prompt("p")
    h.failing_batches("p", 3, parent=prompt)
    late = h.batch("p", [FAIL, FAIL, FAIL], parent=prompt, leave_open=1)
    for span in late:
        span.end()
    h.batch("p", [OK, Call(call_id="dup"), Call(call_id="dup")], parent=prompt)
    h.tracer.start_span("chat", attributes={"gen_ai.operation.name": "chat"}).end()
    h.failing_batches("q", 4)
    prompt.end()


@pytest.mark.parametrize("mode", ["shadow", "warn", "enforce"])
def test_fused_and_plain_dispatch_give_the_same_telemetry_and_spans(mode: str) -> None:
    plain, fused = Harness(mode=mode), Harness(mode=mode, fused=True)
    _scenario(plain)
    _scenario(fused)

    def records(h: Harness) -> list[tuple[str | None, dict[str, Any]]]:
        return [(r.log_record.event_name, dict(r.log_record.attributes or {})) for r in h.logs()]

    assert records(fused) == records(plain)
    assert len(records(plain)) > 3
    assert fused.decision_counts() == plain.decision_counts()
    assert fused.guard.diagnostics() == plain.guard.diagnostics()
    assert [s.name for s in fused.span_exporter.get_finished_spans()] == [
        s.name for s in plain.span_exporter.get_finished_spans()
    ]


# Spans that match neither interest of the guard, each started and ended under an open batch of
# an open prompt: the hooks must leave the guard exactly as they found it.
_NOT_THE_GUARDS: list[dict[str, Any]] = [
    {},
    {"gen_ai.request.model": "m", "gen_ai.provider.name": "openai"},
    {"gen_ai.tool.name": "run_shell", "acp.tool.status": "error"},
    {"tool.name": "run_shell", "session.id": "s", "input.value": "x"},
    {"acp.batch.admitted": 3, "acp.input.reliable": True},
    {"acp.prompt.route": "cron", "acp.prompt.channel": True},
]


def _matches(interest: Interest, attributes: dict[str, Any]) -> bool:
    return any(
        key in attributes and (value is ANY_VALUE or attributes[key] == value)
        for key, value in interest
    )


@pytest.mark.parametrize("attributes", _NOT_THE_GUARDS)
def test_spans_the_filter_turns_away_leave_the_guard_unchanged(attributes: dict[str, Any]) -> None:
    h = Harness(mode="enforce")
    prompt = h.start_prompt("p")
    h.failing_batches("p", 2, parent=prompt)
    batch = h.tracer.start_span(
        "tool_batch", context=set_span_in_context(prompt), attributes={"acp.prompt.id": "p"}
    )
    guard: Any = h.guard
    assert not _matches(guard.START_INTEREST, attributes)
    assert not _matches(guard.END_INTEREST, attributes)
    before = (
        h.guard.state("p"),
        len(guard._tracked),
        len(guard._prompts),
        h.guard.diagnostics(),
        len(h.logs()),
    )
    span = h.tracer.start_span("other", context=set_span_in_context(batch), attributes=attributes)
    span.end()
    h.guard.on_start(span, None)  # called directly, as the plain dispatch would
    h.guard.on_end(span)
    after = (
        h.guard.state("p"),
        len(guard._tracked),
        len(guard._prompts),
        h.guard.diagnostics(),
        len(h.logs()),
    )
    assert after == before


def _genai_loop(h: Harness, turns: int) -> None:
    """A GenAI-conventions prompt (no acp.* attributes) whose tool calls sit below a plain span
    between the model call and the tools, as frameworks nest them: the guard reaches them only by
    following every span of the open prompt."""
    tracer = h.tracer
    agent = tracer.start_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"})
    for turn in range(turns):
        chat = tracer.start_span(
            "chat m",
            context=set_span_in_context(agent),
            attributes={"gen_ai.operation.name": "chat"},
        )
        chat.end()
        tools = tracer.start_span("running tools", context=set_span_in_context(agent))
        for i in range(4):
            call = tracer.start_span(
                "execute_tool run_shell",
                context=set_span_in_context(tools),
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "run_shell",
                    "gen_ai.tool.call.id": f"c-{turn}-{i}",
                    "error.type": "exit_nonzero",
                },
            )
            call.end()
        tools.end()
    final = tracer.start_span(
        "chat m", context=set_span_in_context(agent), attributes={"gen_ai.operation.name": "chat"}
    )
    final.end()
    agent.end()


def test_fused_dispatch_follows_genai_prompts_through_plain_spans() -> None:
    plain = Harness(mode="shadow")
    fused = Harness(mode="shadow", fused=True)
    for h in (plain, fused):
        _genai_loop(h, 3)
        h.guard.force_flush()
    decisions = plain.decision_counts()
    assert decisions.get("would_stop") == 1
    assert fused.decision_counts() == decisions
