"""Where a tool-heavy turn's guard cost goes: the guard's own hooks, and what it costs around them.

Run from the repository root after ``pip install .``::

    python benchmarks/turn_parts.py            # about half a minute
    python benchmarks/turn_parts.py --rounds 20
    python benchmarks/turn_parts.py --stand-in allocating   # other work in the guard's place
    python benchmarks/turn_parts.py --records    # a transition record: the guard's part, the SDK's

Two measures of the tool-heavy workload of ``run.py`` (a model-call span, a batch span and three
tool-call spans a turn, a prompt span every ten turns), agent-thread CPU in microseconds per
turn, medians of interleaved rounds:

* **in isolation**: the guard's ``on_start`` and ``on_end`` called directly, in the agent's
  order, on spans that were started and ended with no other processor (a recorder notes the
  calls), each call timed alone and counted by kind of span (the timer's own cost
  subtracted). This is what the guard's code costs when nothing runs between its calls.
* **in the pipeline**: the agent emitting through a real ``TracerProvider`` (the discarding
  pipeline of ``run.py``) without the guard, with it, and with it wrapped in a processor that
  times its hooks; a fourth arm times ``run.py``'s empty processor the same way, for the
  wrapper's and the timer's cost. The guard's hooks timed inside the pipeline, less the empty
  wrapper's, are its own code there; the arm's difference to the arm without the guard, less
  that, is what the rest of the process pays more for having the guard between its steps.

``--records`` measures instead what one transition record costs on the telemetry's worker: the
guard's part (the record's fields, attribute dictionaries and context) and the whole, through
the SDK's logger, a ``SimpleLogRecordProcessor`` and an exporter that keeps nothing.

The first two together say whether a change must cut the guard's own work or the memory and code it
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
from typing import Any, TypeVar

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import workload

from otel_guard import GuardSpanProcessor
from otel_guard.guard.telemetry import GuardTelemetry

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


# A hook call to replay: whether it is on_start, the span (a live span for on_start, the
# ReadableSpan the SDK hands to on_end), and the kind it is counted under.
_Call = tuple[bool, Any, str]


class _Recorder(SpanProcessor):
    """Records every hook call of the provider, in order, with the kind of span it is for."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self.calls.append((True, span, _kind(span.name, True)))

    def on_end(self, span: ReadableSpan) -> None:
        self.calls.append((False, span, _kind(span.name, False)))


def _kind(name: str, start: bool) -> str:
    if name == "invoke_agent":
        return "prompt"
    if name == "tool_batch":
        return "batch start" if start else "batch end"
    if name == "execute_tool":
        return "tool start" if start else "tool end"
    return "model call"  # the tool-heavy workload's one other span a turn


def _recorded_calls(prompts: Sequence[workload.Prompt]) -> list[_Call]:
    """The workload's hook calls as the agent makes them (``workload.emit``), recorded by a
    provider with no other processor, so the spans are ended before the guard sees them."""
    recorder = _Recorder()
    provider = TracerProvider(resource=run.RESOURCE)
    provider.add_span_processor(recorder)
    workload.emit(provider.get_tracer("agent"), prompts)
    return recorder.calls


def _isolated_round(calls: list[_Call], times: dict[str, int], overhead: float) -> None:
    guard = GuardSpanProcessor(
        mode="shadow", meter_provider=MeterProvider(), logger_provider=LoggerProvider()
    )
    on_start, on_end = guard.on_start, guard.on_end
    clock = _clock
    for start, span, kind in calls:
        hook = on_start if start else on_end
        begin = clock()
        hook(span)
        times[kind] += clock() - begin
    times["timer"] += int(overhead * len(calls))
    guard.shutdown()


def measure_isolated(prompts: int, rounds: int) -> dict[str, float]:
    sessions = workload.generate(workload.TOOL_HEAVY, prompts)
    calls = _recorded_calls(sessions)
    turns = sum(len(prompt.turns) for prompt in sessions)
    overhead = _timer_cost()
    per_round: list[dict[str, float]] = []
    for r in range(rounds + 2):
        times = dict.fromkeys((*_KINDS, "timer"), 0)
        _isolated_round(calls, times, overhead)
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


_P = TypeVar("_P", bound=SpanProcessor)


def _replace_first(pipeline: run.Pipeline, make: Callable[[SpanProcessor], _P]) -> _P:
    """Put ``make(first)`` in place of the first span processor of the pipeline's provider (the
    guard's place, or the floor's; the SDK keeps them in a tuple on its multi-span processor:
    a private field, read here only)."""
    active = pipeline.tracer_provider._active_span_processor
    processors = list(active._span_processors)
    made = make(processors[0])
    processors[0] = made
    active._span_processors = tuple(processors)
    return made


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
        kind = stand_in
        for name in ("with", "timed"):  # the guard's place in both arms
            _replace_first(arms[name], lambda _: _StandIn(kind, 60))
    timed = {
        "timed": _replace_first(arms["timed"], _Timed),
        "empty timed": _replace_first(arms["empty timed"], _Timed),  # run.FloorProcessor
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


class _DiscardingLogExporter(LogRecordExporter):
    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def measure_records(prompts: int, rounds: int) -> dict[str, float]:
    """What one transition record costs where the worker builds it: the guard's part (its
    fields, attribute dictionaries and context, with no logger) and the whole, through an SDK
    ``LoggerProvider`` with a ``SimpleLogRecordProcessor`` and an exporter that keeps nothing,
    in microseconds per record. The records are the tool-heavy workload's own transitions, taken
    from the guard's hand-over to its worker (``GuardTelemetry._put``, replaced for the run)."""
    items: list[Any] = []
    put = GuardTelemetry._put
    GuardTelemetry._put = lambda self, item: items.append(item)  # type: ignore[method-assign]
    try:
        pipeline = run.Pipeline("with")
        workload.emit(pipeline.tracer, workload.generate(workload.TOOL_HEAVY, prompts))
    finally:
        GuardTelemetry._put = put  # type: ignore[method-assign]
    decided = [item for item in items if item[0] == "decided"]

    def telemetry(sdk: bool) -> GuardTelemetry:
        provider = LoggerProvider(resource=run.RESOURCE)
        provider.add_log_record_processor(SimpleLogRecordProcessor(_DiscardingLogExporter()))
        made = GuardTelemetry(MeterProvider(), provider, background=False)
        if not sdk:
            made._log = None  # the guard's part only: no record reaches the SDK
        return made

    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for sdk in (True, False) if r % 2 else (False, True):
            emitter = telemetry(sdk)
            begin = _clock()
            for item in decided:
                emitter._emit_item(item)
            times[sdk].append((_clock() - begin) / len(decided) / 1e3)
            emitter.close()
    return {
        "records": float(len(decided)),
        "guard": statistics.median(times[False]),
        "whole": statistics.median(times[True]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds")
    parser.add_argument(
        "--stand-in",
        choices=("arithmetic", "allocating"),
        help="in the pipeline, put work of this kind in the guard's place (see _StandIn)",
    )
    parser.add_argument(
        "--records", action="store_true", help="only the cost of a transition record"
    )
    args = parser.parse_args()
    if args.records:
        cost = measure_records(400, max(4, args.rounds // 5))
        print(f"a transition record on the worker, us (medians, {cost['records']:.0f} records):")
        print(f"  the guard's part (fields, attributes, context)  {cost['guard']:6.2f}")
        print(f"  with the SDK's logger, processor and exporter   {cost['whole']:6.2f}")
        return
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
