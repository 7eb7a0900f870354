"""What the guard costs for spans it ignores (HTTP, database, framework spans without GenAI keys).

Run from the repository root after ``pip install .``::

    python benchmarks/ignored_spans.py           # a few seconds
    python benchmarks/ignored_spans.py --quick   # indicative only
    python benchmarks/ignored_spans.py --baseline OLD/otel_guard/guard/processor.py

``--baseline`` loads another version's ``processor.py`` beside this one and measures both in the
same run (its imports must resolve in this ``otel_guard``), so before and after are compared
side by side rather than across runs of a shared machine.

Two measures, each side by side in one run, rounds interleaved, medians reported:

* **end to end**: start and end one ignored span (a client span with five attributes, child of
  a root span) through a real ``TracerProvider`` with no span processor, with an empty processor
  (the SDK's own cost of calling one: the floor), and with the guard; per span in nanoseconds
  and as a ratio to no processor;
* **hooks only** (best of many short rounds): ``on_start`` + ``on_end`` called directly on
  ended spans, empty processor
  against the guard, with no GenAI prompt open (the common case) and with one open (the span is
  then inside an agent run, and the guard follows it to find its prompt).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.version import __version__ as guard_version

ATTRIBUTES = {
    "http.request.method": "GET",
    "url.full": "https://example.invalid/items?page=2",
    "server.address": "example.invalid",
    "http.response.status_code": 200,
    "network.protocol.version": "1.1",
}


class EmptyProcessor(SpanProcessor):
    """The floor: a processor whose hooks do nothing."""

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        return None


def _provider(processor: SpanProcessor | None) -> TracerProvider:
    provider = TracerProvider()
    if processor is not None:
        provider.add_span_processor(processor)
    return provider


def _end_to_end(provider: TracerProvider, count: int) -> float:
    """Nanoseconds per ignored span started and ended under one root span."""
    tracer = provider.get_tracer("bench")
    root = tracer.start_span("GET /")
    context = set_span_in_context(root)
    start_span = tracer.start_span
    begin = time.perf_counter_ns()
    for _ in range(count):
        start_span("GET", context=context, attributes=ATTRIBUTES).end()
    elapsed = time.perf_counter_ns() - begin
    root.end()
    return elapsed / count


def _hooks(processor: SpanProcessor, spans: Sequence[Any], rounds: int) -> float:
    on_start, on_end = processor.on_start, processor.on_end
    begin = time.perf_counter_ns()
    for _ in range(rounds):
        for span in spans:
            on_start(span)
            on_end(span)
    return (time.perf_counter_ns() - begin) / (rounds * len(spans))


def _interleaved(
    runs: dict[str, Callable[[], float]], repeats: int, pick: Callable[[list[float]], float]
) -> dict[str, float]:
    measures: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            measures[name].append(run())
    return {name: pick(values) for name, values in measures.items()}


def _guard(kind: type[SpanProcessor] = GuardSpanProcessor) -> SpanProcessor:
    # Telemetry goes to the global no-op providers: only the span path is measured.
    return kind(mode="shadow")  # type: ignore[call-arg]


def _load_processor(path: str) -> type[SpanProcessor]:
    spec = importlib.util.spec_from_file_location("otel_guard_baseline_processor", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: cannot load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    kind: type[SpanProcessor] = module.GuardSpanProcessor
    return kind


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes; indicative only")
    parser.add_argument("--baseline", metavar="PROCESSOR_PY", help="another processor.py")
    args = parser.parse_args(argv)
    kinds: dict[str, type[SpanProcessor]] = {"guard": GuardSpanProcessor}
    if args.baseline:
        kinds["guard (baseline)"] = _load_processor(args.baseline)
    count, repeats, rounds, hook_repeats = (
        (2_000, 5, 20, 10) if args.quick else (20_000, 9, 20, 200)
    )
    print(f"otel-guard {guard_version}: ignored spans, Python {sys.version.split()[0]}")

    providers = {
        "no processor": _provider(None),
        "empty processor": _provider(EmptyProcessor()),
        **{name: _provider(_guard(kind)) for name, kind in kinds.items()},
    }
    e2e = _interleaved(
        {name: (lambda p=p: _end_to_end(p, count)) for name, p in providers.items()},
        repeats,
        statistics.median,
    )
    base = e2e["no processor"]
    print(f"\nend to end, {count} spans x {repeats} rounds (median ns per span, ratio)")
    for name, value in e2e.items():
        print(f"  {name:<16} {value:8.0f} ns  {value / base:6.3f}")
    for name in kinds:
        print(f"  {name} - empty  {e2e[name] - e2e['empty processor']:8.0f} ns")

    # Hooks only, on ended spans made once.
    source = TracerProvider().get_tracer("bench")
    root = source.start_span("GET /")
    spans = [
        source.start_span("GET", context=set_span_in_context(root), attributes=ATTRIBUTES)
        for _ in range(100)
    ]
    for span in spans:
        span.end()
    root.end()
    empty = EmptyProcessor()
    runs: dict[str, Callable[[], float]] = {"empty processor": lambda: _hooks(empty, spans, rounds)}
    prompts = []
    for name, kind in kinds.items():
        idle, busy = _guard(kind), _guard(kind)
        agent = TracerProvider()
        agent.add_span_processor(busy)
        prompt = agent.get_tracer("bench").start_span(
            "invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}
        )  # left open: a GenAI prompt is running
        prompts.append(prompt)
        inside = [
            agent.get_tracer("bench").start_span(
                "GET", context=set_span_in_context(prompt), attributes=ATTRIBUTES
            )
            for _ in range(100)
        ]
        for span in inside:
            span.end()
        runs[name] = lambda idle=idle: _hooks(idle, spans, rounds)
        runs[f"{name}, prompt open"] = lambda busy=busy, inside=inside: _hooks(busy, inside, rounds)
    # Many short rounds, the fastest kept: on a shared machine the minimum is what the code
    # costs, the rest is other processes.
    hooks = _interleaved(runs, hook_repeats, min)
    print(
        f"\nhooks only, {len(spans)} spans x {rounds} rounds, best of {hook_repeats} (ns per span)"
    )
    for name, value in hooks.items():
        print(f"  {name:<30} {value:8.1f} ns")
    for name in kinds:
        print(f"  {name + ' - empty':<30} {hooks[name] - hooks['empty processor']:8.1f} ns")
    for prompt in prompts:
        prompt.end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
