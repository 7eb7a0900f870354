"""The guard's memory is bounded in bytes when a host never ends its batch spans.

2,000 batch spans stay open, each with 100 tool-call spans that end under it (200,000 calls).
Before the byte bound the guard kept every ended span (1.4 GiB traced for 500,000 calls); its
compact call records alone, uncapped, trace 66 MiB here. Now they are capped across all open
batches by ``max_call_bytes`` (16 MiB by default, estimated), so the whole scenario, including
the host's own 2,000 open spans (about 6 MiB), traces 18 MiB, under ``BOUND`` (40 MiB). At this
size the uncapped records still exceed the bound by two thirds, and the test takes a third of
the time the 500,000-call one took. ``benchmarks/memory.py`` reports its resident size.
"""

from __future__ import annotations

import gc
import tracemalloc

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.guard.processor import DEFAULT_MAX_CALL_BYTES

BATCHES = 2_000
CALLS = 100
MIB = 1024 * 1024
BOUND = 40 * MIB

FAILING_CALL = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "run_shell",
    "acp.tool.type": "native",
    "acp.tool.status": "error",
    "acp.tool.execution.status": "error",
    "acp.tool.execution.error_type": "exit_nonzero",
}


def never_ending_batches(guard: GuardSpanProcessor) -> list[Span]:
    provider = TracerProvider()
    provider.add_span_processor(guard)
    tracer = provider.get_tracer("agent")
    held: list[Span] = []
    for b in range(BATCHES):
        batch = tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"prompt-{b}"})
        context = set_span_in_context(batch)
        for c in range(CALLS):
            attributes = dict(FAILING_CALL)
            attributes["gen_ai.tool.call.id"] = f"call-{b}-{c}"
            tracer.start_span("execute_tool", context=context, attributes=attributes).end()
        held.append(batch)
    return held


def test_never_ending_batch_spans_stay_under_the_byte_bound() -> None:
    guard = GuardSpanProcessor(mode="enforce")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = never_ending_batches(guard)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(held) == BATCHES
    assert grown < BOUND, f"{grown / MIB:.1f} MiB traced"
    # The budget was reached and shed: the oldest batches gave up their calls.
    assert guard.diagnostics()["batch_overflow"] > 0
    assert DEFAULT_MAX_CALL_BYTES < BOUND


LONG_IDS = 20_000
LONG_ID_LENGTH = 100_000
LONG_ID_BOUND = 64 * MIB


def test_prompt_ids_of_100_kb_keep_a_fixed_size_digest() -> None:
    """20,000 prompts whose IDs are 100 KB each (2 GB of IDs): the guard keeps each ID's digest,
    never the ID, in its prompt states, its open-span and dropped-prompt tables and its records."""
    guard = GuardSpanProcessor(mode="enforce", background_telemetry=False)
    provider = TracerProvider()
    provider.add_span_processor(guard)
    tracer = provider.get_tracer("agent")
    base = "p" * LONG_ID_LENGTH
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(LONG_IDS):
            prompt_id = f"{i:08d}" + base[8:]
            # A prompt span that never ends, and one settled batch that leaves a tracked state.
            tracer.start_span(
                "invoke_agent",
                attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
            )
            batch = tracer.start_span("tool_batch", attributes={"acp.prompt.id": prompt_id})
            attributes = dict(FAILING_CALL)
            attributes["gen_ai.tool.call.id"] = f"call-{i}"
            tracer.start_span(
                "execute_tool", context=set_span_in_context(batch), attributes=attributes
            ).end()
            batch.set_attributes({"acp.batch.admitted": 1, "acp.input.reliable": True})
            batch.end()
            del prompt_id, batch
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < LONG_ID_BOUND, f"{grown / MIB:.1f} MiB kept"
    last = f"{LONG_IDS - 1:08d}" + base[8:]
    state = guard.state(last)
    assert state is not None and state.phase == "tracking"
