"""What the guard costs for a span inside an open prompt of each profile, beside an ignored span.

Run from the repository root after ``pip install .``::

    python benchmarks/open_prompt_spans.py
    python benchmarks/open_prompt_spans.py --quick
    python benchmarks/open_prompt_spans.py --baseline-package NAME

``--baseline-package`` imports another version of the package under another name (a copy of its
``otel_guard/`` directory renamed, with its imports renamed to match, on ``PYTHONPATH``) and
measures both in the same run, rounds interleaved, so before and after are compared side by side
rather than across runs of a shared machine.

Hooks only (best of many short rounds, nanoseconds per span): ``on_start`` + ``on_end`` called
directly on ended spans, against an empty processor, for

* **ignored**: an HTTP client span in no prompt (the common case);
* **acp**: a plain span below an open section 3 prompt span (``acp.prompt.id``) and open batch;
* **genai**: a plain span below an open ``invoke_agent`` prompt whose trace the guard follows
  (a model call of it has ended);
* **openinference**: the same below an open ``AGENT`` span;
* **genai tool** / **openinference tool**: a failing tool-call span below the open prompt.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.version import __version__ as guard_version

HTTP = {
    "http.request.method": "GET",
    "url.full": "https://example.invalid/items?page=2",
    "server.address": "example.invalid",
    "http.response.status_code": 200,
    "network.protocol.version": "1.1",
}
PROMPTS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # profile: (prompt attributes, model-call attributes, tool-call attributes)
    "acp": (
        {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p"},
        {"gen_ai.operation.name": "chat"},
        {},
    ),
    "genai": (
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "c"},
        {"gen_ai.operation.name": "chat"},
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "run_shell",
            "gen_ai.tool.call.id": "call",
            "error.type": "TimeoutError",
        },
    ),
    "openinference": (
        {"openinference.span.kind": "AGENT", "session.id": "s"},
        {"openinference.span.kind": "LLM"},
        {"openinference.span.kind": "TOOL", "tool.name": "run_shell", "tool_call.id": "call"},
    ),
}


class EmptyProcessor(SpanProcessor):
    def on_start(self, span: Span, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        return None


def _hooks(processor: SpanProcessor, spans: Sequence[Any], rounds: int) -> float:
    on_start, on_end = processor.on_start, processor.on_end
    begin = time.perf_counter_ns()
    for _ in range(rounds):
        for span in spans:
            on_start(span)
            on_end(span)
    return (time.perf_counter_ns() - begin) / (rounds * len(spans))


def _spans(
    tracer: Any, parent: Span | None, attributes: Mapping[str, Any], fail: bool = False
) -> list[Span]:
    context = None if parent is None else set_span_in_context(parent)
    spans = []
    for _ in range(100):
        span = tracer.start_span("GET", context=context, attributes=dict(attributes))
        if fail:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        spans.append(span)
    return spans


def _setup(kind: type[SpanProcessor], profile: str | None, tool: bool) -> tuple[Any, list[Span]]:
    """A guard with the profile's prompt open (its trace followed), and 100 ended spans in it."""
    guard = kind(mode="shadow")  # type: ignore[call-arg]
    provider = TracerProvider()
    provider.add_span_processor(guard)
    tracer = provider.get_tracer("bench")
    if profile is None:
        root = tracer.start_span("GET /")
        return guard, _spans(tracer, root, HTTP)
    prompt_attributes, model_attributes, tool_attributes = PROMPTS[profile]
    prompt = tracer.start_span("agent", attributes=prompt_attributes)  # left open
    parent = prompt
    if profile == "acp":
        parent = tracer.start_span(
            "tool_batch", context=set_span_in_context(prompt), attributes={"acp.prompt.id": "p"}
        )
    tracer.start_span(
        "model", context=set_span_in_context(prompt), attributes=model_attributes
    ).end()
    if tool:
        return guard, _spans(tracer, parent, tool_attributes, fail=True)
    return guard, _spans(tracer, parent, HTTP)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes; indicative only")
    parser.add_argument("--baseline-package", metavar="NAME", help="another version's package")
    args = parser.parse_args(argv)
    kinds: dict[str, type[SpanProcessor]] = {"guard": GuardSpanProcessor}
    if args.baseline_package:
        kinds["baseline"] = importlib.import_module(args.baseline_package).GuardSpanProcessor
    rounds, repeats = (5, 20) if args.quick else (20, 200)
    print(f"otel-guard {guard_version}: spans inside open prompts, Python {sys.version.split()[0]}")
    cases: list[tuple[str, str | None, bool]] = [
        ("ignored", None, False),
        ("acp", "acp", False),
        ("genai", "genai", False),
        ("openinference", "openinference", False),
        ("genai tool", "genai", True),
        ("openinference tool", "openinference", True),
    ]
    empty = EmptyProcessor()
    _, plain = _setup(GuardSpanProcessor, None, False)
    runs: dict[tuple[str, str], Callable[[], float]] = {
        ("empty", "ignored"): lambda: _hooks(empty, plain, rounds)
    }
    for name, kind in kinds.items():
        for case, profile, tool in cases:
            guard, spans = _setup(kind, profile, tool)
            runs[(name, case)] = lambda guard=guard, spans=spans: _hooks(guard, spans, rounds)
    measures: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            gc.collect()
            measures[key].append(run())
    best = {key: min(values) for key, values in measures.items()}
    floor = best[("empty", "ignored")]
    print(
        f"\nhooks only, 100 spans x {rounds} rounds, best of {repeats} (ns per span, minus empty)"
    )
    header = "".join(f"{name:>14}" for name in kinds)
    print(f"  {'case':<22}{header}")
    for case, _, _ in cases:
        row = "".join(f"{best[(name, case)] - floor:14.1f}" for name in kinds)
        print(f"  {case:<22}{row}")
    if len(kinds) > 1:
        print("\nratio guard / baseline (guard's own cost)")
        for case, _, _ in cases:
            new, old = best[("guard", case)] - floor, best[("baseline", case)] - floor
            print(f"  {case:<22}{new / old if old > 0 else float('nan'):14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
