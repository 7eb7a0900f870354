"""Where a tool-heavy turn's guard cost goes: the guard's own hooks, and what it costs around them.

Run from the repository root after ``pip install .``::

    python benchmarks/turn_parts.py            # about half a minute
    python benchmarks/turn_parts.py --rounds 20
    python benchmarks/turn_parts.py --stand-in allocating   # other work in the guard's place

Two measures of the tool-heavy workload of ``run.py`` (a model-call span, a batch span and three
tool-call spans a turn, a prompt span every ten turns), agent-thread CPU in microseconds per
turn, medians of interleaved rounds:

* **in isolation**: the guard's ``on_start`` and ``on_end`` called directly on spans that were
  started and ended with no processor, by kind of span, each timed alone (the timer's own cost
  subtracted). This is what the guard's code costs when nothing runs between its calls.
* **in the pipeline**: the agent emitting through a real ``TracerProvider`` (the discarding
  pipeline of ``run.py``) without the guard, with it, and with it wrapped in a processor that
  times its hooks; a fourth arm times an empty processor the same way, for the wrapper's and
  the timer's cost. The guard's hooks timed inside the pipeline, less the empty wrapper's,
  are its own code there; the arm's difference to the arm without the guard, less that, is
  what the rest of the process pays more for having the guard between its steps.

The two together say whether a change must cut the guard's own work or the memory and code it
brings between the SDK's steps (docs: benchmarks/README.md, "Where the agent's time goes").
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import set_span_in_context

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import workload

from otel_guard import GuardSpanProcessor

_clock = time.thread_time_ns
_KINDS = ("prompt", "model call", "batch start", "tool start", "tool end", "batch end")


def _timer_cost() -> float:
    """Nanoseconds one ``_clock() ... _clock()`` pair adds to what it times."""
    best = float("inf")
    for _ in range(5):
        begin = _clock()
        for _ in range(20_000):
            _clock() - _clock()
        best = min(best, (_clock() - begin) / 20_000)
    return best / 2  # the loop body reads the clock twice; a timing reads it twice, once inside


_Turn = tuple[list[Span], Span, list[Span]]


def _ended_sessions(prompts: Sequence[workload.Prompt]) -> list[tuple[Span, list[_Turn]]]:
    """The workload's spans, started and ended by a provider with no processor."""
    tracer = TracerProvider(resource=run.RESOURCE).get_tracer("agent")
    sessions = []
    for prompt in prompts:
        attributes = {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt.prompt_id}
        prompt_span = tracer.start_span("invoke_agent", attributes=attributes)
        prompt_context = set_span_in_context(prompt_span)
        turns: list[_Turn] = []
        for turn in prompt.turns:
            filler = [
                tracer.start_span(name, context=prompt_context, attributes=attributes)
                for name, attributes in turn.filler
            ]
            for span in filler:
                span.end()
            batch = tracer.start_span(
                "tool_batch", context=prompt_context, attributes={"acp.prompt.id": prompt.prompt_id}
            )
            batch_context = set_span_in_context(batch)
            calls = []
            for call in turn.calls:
                span = tracer.start_span(
                    "execute_tool", context=batch_context, attributes=call.start
                )
                span.set_attributes(call.outcome)
                span.end()
                calls.append(span)
            batch.set_attributes(
                {
                    "acp.batch.admitted": len(turn.calls),
                    "acp.input.external": False,
                    "acp.input.queued_prompt": False,
                    "acp.input.reliable": True,
                }
            )
            batch.end()
            turns.append((filler, batch, calls))
        prompt_span.end()
        sessions.append((prompt_span, turns))
    return sessions


def _isolated_round(
    sessions: list[tuple[Span, list[_Turn]]], times: dict[str, int], overhead: float
) -> None:
    guard = GuardSpanProcessor(
        mode="shadow", meter_provider=MeterProvider(), logger_provider=LoggerProvider()
    )
    on_start, on_end = guard.on_start, guard.on_end
    clock = _clock
    charged = 0.0
    for prompt_span, turns in sessions:
        t0 = clock()
        on_start(prompt_span)
        times["prompt"] += clock() - t0
        for filler, batch, calls in turns:
            t0 = clock()
            for span in filler:
                on_start(span)
                on_end(span)
            t1 = clock()
            on_start(batch)
            t2 = clock()
            for span in calls:
                on_start(span)
            t3 = clock()
            for span in calls:
                on_end(span)
            t4 = clock()
            on_end(batch)
            t5 = clock()
            times["model call"] += t1 - t0
            times["batch start"] += t2 - t1
            times["tool start"] += t3 - t2
            times["tool end"] += t4 - t3
            times["batch end"] += t5 - t4
            charged += 5 * overhead
        t0 = clock()
        on_end(prompt_span)
        times["prompt"] += clock() - t0
        charged += 2 * overhead
    times["timer"] += int(charged)
    guard.shutdown()


def measure_isolated(prompts: int, rounds: int) -> dict[str, float]:
    sessions = _ended_sessions(workload.generate(workload.TOOL_HEAVY, prompts))
    turns = sum(len(turns) for _, turns in sessions)
    overhead = _timer_cost()
    per_round: list[dict[str, float]] = []
    for r in range(rounds + 2):
        times = dict.fromkeys((*_KINDS, "timer"), 0)
        _isolated_round(sessions, times, overhead)
        if r >= 2:  # two warm-up rounds
            per_round.append({k: v / turns / 1e3 for k, v in times.items()})
    result = {kind: statistics.median(r[kind] for r in per_round) for kind in _KINDS}
    timer = statistics.median(r["timer"] for r in per_round)
    result["total"] = statistics.median(sum(r[k] for k in _KINDS) for r in per_round) - timer
    result["timer"] = timer
    return result


class _Timed(SpanProcessor):
    """Times the processor it wraps, adding the time to ``spent``."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.spent = 0

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        begin = _clock()
        self.inner.on_start(span, parent_context)
        self.spent += _clock() - begin

    def on_end(self, span: ReadableSpan) -> None:
        begin = _clock()
        self.inner.on_end(span)
        self.spent += _clock() - begin

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _wrap_first(pipeline: run.Pipeline, make: Callable[[SpanProcessor], _Timed]) -> _Timed:
    """Wrap the first span processor of the pipeline's provider (the SDK keeps them in a tuple
    on its multi-span processor: a private field, read here only)."""
    active = pipeline.tracer_provider._active_span_processor
    processors = list(active._span_processors)
    timed = make(processors[0])
    processors[0] = timed
    active._span_processors = tuple(processors)
    return timed


class _Empty(SpanProcessor):
    def on_start(self, span: Span, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        pass


class _StandIn(SpanProcessor):
    """Work of another kind in the guard's place, to tell what costs the rest of the turn more:
    ``arithmetic`` adds integers (no memory touched) for every ended span; ``allocating`` builds
    a list of small tuples for every ended span and keeps the last 512 lists (memory touched and
    kept a while, as the guard keeps its batches, prompts and queued records)."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind = kind
        self.size = size
        self.kept: list[list[tuple[int, str]]] = []

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.kind == "arithmetic":
            total = 0
            for i in range(self.size):
                total += i
        else:
            self.kept.append([(i, str(i)) for i in range(self.size // 4)])
            if len(self.kept) > 512:
                self.kept.clear()


def measure_pipeline(prompts: int, rounds: int, stand_in: str | None = None) -> dict[str, float]:
    arms = {
        "without": run.Pipeline(False),
        "with": run.Pipeline("with"),
        "timed": run.Pipeline("with"),
        "empty timed": run.Pipeline("floor"),
    }
    if stand_in is not None:
        for name in ("with", "timed"):  # the guard's place in both arms
            active = arms[name].tracer_provider._active_span_processor
            processors = list(active._span_processors)
            processors[0] = _StandIn(stand_in, 60)
            active._span_processors = tuple(processors)
    timed = {
        "timed": _wrap_first(arms["timed"], _Timed),
        "empty timed": _wrap_first(arms["empty timed"], lambda _: _Timed(_Empty())),
    }
    sessions = workload.generate(workload.TOOL_HEAVY, prompts)
    blocks = [sessions[i : i + 20] for i in range(0, len(sessions) - 19, 20)]
    try:
        for name, arm in arms.items():
            for w, chunk in enumerate(blocks):
                workload.emit(arm.tracer, chunk, suffix=f"#warm-{name}-{w}")
                arm.clear()
        gc.collect()
        times: dict[str, list[float]] = {name: [] for name in arms}
        inside: dict[str, list[float]] = {name: [] for name in timed}
        names = list(arms)
        for r in range(rounds):
            chunk = blocks[r % len(blocks)]
            turns = sum(len(p.turns) for p in chunk)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                for wrapper in timed.values():
                    wrapper.spent = 0
                begin = _clock()
                workload.emit(arms[name].tracer, chunk, suffix=f"#{r}")
                times[name].append((_clock() - begin) / turns / 1e3)
                if name in timed:
                    inside[name].append(timed[name].spent / turns / 1e3)
            for arm in arms.values():
                arm.clear()
    finally:
        for arm in arms.values():
            arm.shutdown()

    def over(name: str) -> float:
        return statistics.median(a - b for a, b in zip(times[name], times["without"], strict=True))

    own = statistics.median(inside["timed"]) - statistics.median(inside["empty timed"])
    wrapped = over("timed") - over("empty timed")
    return {
        "without": statistics.median(times["without"]),
        "with": over("with"),
        "own": own,
        "around": wrapped - own,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds")
    parser.add_argument(
        "--stand-in",
        choices=("arithmetic", "allocating"),
        help="in the pipeline, put work of this kind in the guard's place (see _StandIn)",
    )
    args = parser.parse_args()
    if args.stand_in:
        piped = measure_pipeline(200, args.rounds, args.stand_in)
        print(f"{args.stand_in} stand-in in the guard's place, us per tool-heavy turn (medians):")
        print(f"  the arm over the arm without it  {piped['with']:6.2f}")
        print(f"  the stand-in's own hooks there   {piped['own']:6.2f}")
        print(f"  the rest of the turn, around     {piped['around']:6.2f}")
        return
    isolated = measure_isolated(100, max(5, args.rounds // 3))
    print(
        f"tool-heavy turn, guard ({run._build()} build) on the agent's thread,"
        " us per turn (medians)"
    )
    print("in isolation (hooks called directly on ended spans):")
    for kind in _KINDS:
        print(f"  {kind:12s} {isolated[kind]:6.2f}")
    print(
        f"  {'total':12s} {isolated['total']:6.2f}"
        f" (the timer's own cost, {isolated['timer']:.2f}, taken out)"
    )
    piped = measure_pipeline(200, args.rounds)
    print(f"in the pipeline (a turn without the guard: {piped['without']:.1f} us):")
    print(f"  the guard's arm over the arm without it  {piped['with']:6.2f}")
    print(f"  the guard's own hooks there              {piped['own']:6.2f}")
    print(f"  the rest of the turn, around them        {piped['around']:6.2f}")


if __name__ == "__main__":
    main()
