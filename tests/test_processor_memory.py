"""The guard's memory is bounded in bytes when a host never ends its batch spans.

5,000 batch spans stay open, each with 100 tool-call spans that end under it (500,000 calls).
Before the byte bound the guard kept every ended span: 1.4 GiB traced. Now it keeps a few fields
per call, capped across all open batches by ``max_call_bytes`` (16 MiB by default, estimated),
so the whole scenario, including the host's own 5,000 open spans (about 14 MiB), stays under
``BOUND``. ``benchmarks/memory.py`` reports the same scenario's resident size.
"""

from __future__ import annotations

import gc
import tracemalloc

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.guard.processor import DEFAULT_MAX_CALL_BYTES

BATCHES = 5_000
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
