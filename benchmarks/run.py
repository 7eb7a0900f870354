"""What the guard costs: span-throughput overhead, per-span cost, memory, and replay speed.

Run from the repository root after ``pip install .``::

    python benchmarks/run.py           # the full run (a few minutes at most)
    python benchmarks/run.py --quick   # a fast smoke run; its figures are indicative only
    python benchmarks/run.py --replay-only   # only item 8, the replay throughput
    python benchmarks/run.py --hot-path-only # only items 1 to 6, the cost to the agent

Every comparison is measured in the same run, with and without the guard interleaved, and
reported as a ratio of medians so that the figures carry over between machines. See
``benchmarks/README.md`` for what each figure means and the setup behind it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import set_span_in_context

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload

from otel_guard import GuardSpanProcessor
from otel_guard.guard.processor import DEFAULT_MAX_PROMPTS
from otel_guard.version import __version__ as guard_version

RESOURCE = Resource.create({"service.name": "agent"})

# The hot-path targets (a "must" is the bound the figure may not pass; a target is the aim).
TARGET_TOOL_HEAVY, MUST_TOOL_HEAVY = 1.10, 1.15  # agent-thread CPU, against either pipeline
TARGET_TYPICAL, MUST_TYPICAL = 1.03, 1.06
TARGET_PROCESS = 1.20  # whole-process CPU, tool-heavy, against the discarding provider
TARGET_PROCESS_OTLP = 1.06  # whole-process CPU, tool-heavy, against the OTLP pipeline
TARGET_IGNORED_NS = 300.0  # a span no profile claims, over an empty processor
TARGET_BYTES_PER_PROMPT = 1024
# A realistic turn, to put the guard's cost per turn in proportion: one 1 s model call and three
# 50 ms tool calls (the tool-heavy workload's turn shape: one model span, one batch of three).
REALISTIC_TURN_SECONDS = 1.0 + 3 * 0.050
TARGET_REPLAY_SPANS_PER_SECOND = 50_000
REPLAY_BUDGET_SECONDS = 20.0


class DiscardingSpanExporter(SpanExporter):
    """Stands in for the agent's own exporter: both arms pay for it, and it keeps nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class FloorProcessor(SpanProcessor):
    """The cheapest span processor Python can add: every hook does nothing."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        pass


# The fused dispatch exists from this version on; the benchmarks also run on older checkouts.
try:
    from otel_guard.guard.dispatch import GuardFirstSpanProcessor
except ImportError:  # pragma: no cover - an older checkout
    GuardFirstSpanProcessor = None  # type: ignore[assignment,misc]


class CountingLogExporter(OTLPLogExporter):
    """The OTLP/HTTP log exporter, counting the records it was handed (the guard's transitions)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint=endpoint)
        self.count = 0

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        self.count += len(batch)
        return super().export(batch)


class Pipeline:
    """A real TracerProvider, with or without the guard, exporting to one of two pipelines.

    ``otlp`` is ``None`` for the discarding pipeline: spans go through a ``SimpleSpanProcessor``
    to an exporter that keeps nothing, and the guard's telemetry to a real SDK ``MeterProvider``
    (in-memory reader) and ``LoggerProvider`` (synchronous in-memory exporter, cleared between
    repetitions). ``otlp`` is the base URL of an OTLP/HTTP endpoint for what users run: spans
    through a ``BatchSpanProcessor`` to the OTLP/HTTP span exporter, and the guard's telemetry
    through a ``PeriodicExportingMetricReader`` and a ``BatchLogRecordProcessor`` to the
    OTLP/HTTP metric and log exporters. The arm without the guard has the tracer provider only:
    the metric and log providers are counted as the guard's cost, unless ``idle_providers``
    gives it the same OTLP metric and log providers, unused (an application that exports its
    own metrics and logs already).

    ``arm`` is ``without`` (no guard), ``with`` (the guard added with ``add_span_processor``),
    ``fused`` (the guard's dispatch in front of the provider's other processors) or ``floor``
    (an empty Python processor in the guard's place).
    """

    def __init__(
        self,
        guarded: bool | str,
        otlp: str | None = None,
        idle_providers: bool = False,
        **guard_kwargs: Any,
    ) -> None:
        arm = guarded if isinstance(guarded, str) else ("with" if guarded else "without")
        self.arm = arm
        self.otlp = otlp
        self.log_exporter: InMemoryLogRecordExporter | CountingLogExporter | None = None
        self.meter_provider: MeterProvider | None = None
        self.logger_provider: LoggerProvider | None = None
        self.metric_reader: MetricReader | None = None
        self.guard: GuardSpanProcessor | None = None
        exporter: SpanProcessor
        if otlp is None:
            exporter = SimpleSpanProcessor(DiscardingSpanExporter())
        else:
            exporter = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp}/v1/traces"))
        if arm in ("with", "fused") or (otlp is not None and idle_providers):
            self.logger_provider = LoggerProvider(resource=RESOURCE)
            if otlp is None:
                self.metric_reader = InMemoryMetricReader()
                self.log_exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
                self.logger_provider.add_log_record_processor(
                    SimpleLogRecordProcessor(self.log_exporter)
                )
            else:
                self.metric_reader = PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=f"{otlp}/v1/metrics")
                )
                self.log_exporter = CountingLogExporter(f"{otlp}/v1/logs")
                self.logger_provider.add_log_record_processor(
                    BatchLogRecordProcessor(self.log_exporter)
                )
            self.meter_provider = MeterProvider(
                resource=RESOURCE, metric_readers=[self.metric_reader]
            )
        if arm in ("with", "fused"):
            self.guard = GuardSpanProcessor(
                mode="shadow",
                meter_provider=self.meter_provider,
                logger_provider=self.logger_provider,
                **guard_kwargs,
            )
        if arm == "fused":
            if GuardFirstSpanProcessor is None:
                raise RuntimeError("this version has no fused dispatch")
            assert self.guard is not None
            self.tracer_provider = TracerProvider(
                resource=RESOURCE,
                active_span_processor=GuardFirstSpanProcessor(self.guard, [exporter]),
            )
        else:
            self.tracer_provider = TracerProvider(resource=RESOURCE)
            if arm == "with":
                assert self.guard is not None
                self.tracer_provider.add_span_processor(self.guard)
            elif arm == "floor":
                self.tracer_provider.add_span_processor(FloorProcessor())
            self.tracer_provider.add_span_processor(exporter)
        self.tracer = self.tracer_provider.get_tracer("agent")

    def flush(self) -> None:
        """Deliver what the guard still holds (its records may be emitted off the thread)."""
        if self.guard is not None:
            self.guard.force_flush()

    def records(self) -> int:
        """Log records the guard emitted since the last :meth:`clear`."""
        if isinstance(self.log_exporter, InMemoryLogRecordExporter):
            return len(self.log_exporter.get_finished_logs())
        if isinstance(self.log_exporter, CountingLogExporter):
            assert self.logger_provider is not None
            self.logger_provider.force_flush()
            return self.log_exporter.count
        return 0

    def clear(self) -> None:
        """Between repetitions: deliver everything queued, and forget the records kept."""
        self.flush()
        if self.otlp is not None:
            self.tracer_provider.force_flush()
            if self.logger_provider is not None:
                self.logger_provider.force_flush()
        if isinstance(self.log_exporter, InMemoryLogRecordExporter):
            self.log_exporter.clear()
        elif isinstance(self.log_exporter, CountingLogExporter):
            self.log_exporter.count = 0

    def shutdown(self) -> None:
        """What a process does before it exits: traces, then a last metric collection and the
        log and metric providers."""
        self.tracer_provider.shutdown()
        if self.logger_provider is not None:
            self.logger_provider.shutdown()
        if self.meter_provider is not None:
            if isinstance(self.metric_reader, InMemoryMetricReader):
                self.metric_reader.get_metrics_data()
            self.meter_provider.shutdown()  # a periodic reader collects and exports once more


def _build() -> str:
    """``compiled`` when the guard's processor is the mypyc build's extension module (the
    README's optional compiled build), else ``pure Python``: the two differ by far more than
    runs of one do, so every report says which it measured."""
    import otel_guard.guard.processor as processor

    return "compiled" if not processor.__file__.endswith(".py") else "pure Python"


def fused_available() -> bool:
    return GuardFirstSpanProcessor is not None


def _cpu_ns() -> int:
    """CPU time of this thread: other processes competing for the cores do not count."""
    return time.thread_time_ns()


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# -- 1. span-throughput overhead ----------------------------------------------------------------


@dataclass(frozen=True)
class Overhead:
    profile: str
    pipeline: str  # "discarding" or "otlp"
    arm: str
    tool_share: float
    spans: int
    without_spans_per_second: float
    with_spans_per_second: float
    ratio: float  # median of the per-repetition ratios (with / without)
    transitions_per_batch: float
    us_per_turn: float  # median of the per-repetition differences (with - without), per turn
    calls_per_turn: float


def _label(profile: str, arm: str) -> str:
    return profile if arm == "with" else f"{profile} ({arm})"


def measure_overhead(
    profile: workload.Profile,
    prompts: int,
    block: int,
    pairs: int,
    guarded: str = "with",
    otlp: str | None = None,
) -> Overhead:
    """Throughput of ``profile`` with and without the guard, in short alternating blocks.

    Each pair runs the same ``block`` prompts through both arms back to back (in alternating
    order), so both see the same machine conditions; the ratio is the median of the pairs'.
    ``guarded`` names the guarded arm (``with`` or ``fused``) and ``otlp`` the pipeline (see
    :class:`Pipeline`). Both arms' queued spans and records are exported between pairs, off
    the clock: this is the agent thread's time.
    """
    sessions = workload.generate(profile, prompts)
    blocks = [sessions[i : i + block] for i in range(0, prompts - block + 1, block)]
    arms = {"without": Pipeline(False, otlp), "with": Pipeline(guarded, otlp)}
    try:
        for name, arm in arms.items():  # warm-up: lazy SDK setup, code paths, caches
            for w, chunk in enumerate(blocks):  # a block at a time: no batch queue overflows
                workload.emit(arm.tracer, chunk, suffix=f"#warm-{name}-{w}")
                arm.clear()
        gc.collect()
        times: dict[str, list[int]] = {"without": [], "with": []}
        ratios: list[float] = []
        per_turn: list[float] = []
        spans: list[int] = []
        transitions = batches = calls = 0
        for r in range(pairs):
            chunk = blocks[r % len(blocks)]
            spans.append(workload.span_count(chunk))
            turns = sum(len(p.turns) for p in chunk)
            batches += turns
            calls += sum(len(t.calls) for p in chunk for t in p.turns)
            order = ("without", "with") if r % 2 == 0 else ("with", "without")
            for name in order:
                arm = arms[name]
                start = _cpu_ns()
                workload.emit(arm.tracer, chunk, suffix=f"#{r}")
                times[name].append(_cpu_ns() - start)
            arms["with"].flush()
            transitions += arms["with"].records()
            for arm in arms.values():
                arm.clear()
            ratios.append(times["with"][-1] / times["without"][-1])
            per_turn.append((times["with"][-1] - times["without"][-1]) / turns / 1e3)
    finally:
        for arm in arms.values():
            arm.shutdown()
    total = sum(spans)
    return Overhead(
        profile=profile.name,
        pipeline="discarding" if otlp is None else "otlp",
        arm=guarded,
        tool_share=workload.tool_share(sessions),
        spans=total,
        without_spans_per_second=total / (sum(times["without"]) / 1e9),
        with_spans_per_second=total / (sum(times["with"]) / 1e9),
        ratio=_median(ratios),
        transitions_per_batch=transitions / batches,
        us_per_turn=_median(per_turn),
        calls_per_turn=calls / batches,
    )


# -- 2. the cost of a span that is not the guard's ------------------------------------------------


@dataclass(frozen=True)
class SpanCost:
    kind: str
    nanoseconds: float


def _guard_loop(spans: Sequence[Any], guard: GuardSpanProcessor, rounds: int) -> int:
    on_start, on_end = guard.on_start, guard.on_end
    start = _cpu_ns()
    for _ in range(rounds):
        for span in spans:
            on_start(span, None)
            on_end(span)
    return _cpu_ns() - start


def _empty_loop(spans: Sequence[Any], guard: GuardSpanProcessor, rounds: int) -> int:
    start = _cpu_ns()
    for _ in range(rounds):
        for _span in spans:
            pass
    return _cpu_ns() - start


def measure_span_cost(count: int, rounds: int, repeats: int) -> list[SpanCost]:
    """``on_start`` + ``on_end`` on real, ended SDK spans, minus the bare loop."""
    tracer = TracerProvider(resource=RESOURCE).get_tracer("agent")
    guard = Pipeline(True).guard
    assert guard is not None
    kinds: dict[str, tuple[str, dict[str, Any]]] = {
        "model call (gen_ai.operation.name=chat)": (
            "chat",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4.1",
                "gen_ai.usage.input_tokens": 4711,
                "gen_ai.usage.output_tokens": 312,
            },
        ),
        "HTTP request (no gen_ai attributes)": (
            "GET",
            {
                "http.request.method": "GET",
                "url.full": "https://api.example.com/v1/items/42",
                "http.response.status_code": 200,
                "server.address": "api.example.com",
            },
        ),
    }
    results: list[SpanCost] = []
    parent = tracer.start_span("invoke_agent")
    context = set_span_in_context(parent)
    for label, (name, template) in kinds.items():
        spans = []
        for _ in range(count):
            span = tracer.start_span(name, context=context, attributes=template)
            span.end()
            spans.append(span)
        loops: dict[str, list[int]] = {"guard": [], "empty": []}
        runners: dict[str, Callable[[Sequence[Any], GuardSpanProcessor, int], int]] = {
            "guard": _guard_loop,
            "empty": _empty_loop,
        }
        _guard_loop(spans, guard, 1)  # warm-up
        for r in range(repeats):
            for which in ("guard", "empty") if r % 2 == 0 else ("empty", "guard"):
                loops[which].append(runners[which](spans, guard, rounds))
        per_span = (_median(loops["guard"]) - _median(loops["empty"])) / (count * rounds)
        results.append(SpanCost(label, per_span))
    return results


# -- 2b. the whole process, shutdown included ---------------------------------------------------


@dataclass(frozen=True)
class ProcessCost:
    profile: str
    pipeline: str  # "discarding" or "otlp"
    arm: str
    ratio: float  # median of the per-pair ratios of process CPU time (with / without)
    ratios: tuple[float, float]  # the lowest and highest pair ratio
    us_per_turn: float  # median of the per-pair differences (with - without), per turn
    calls_per_turn: float


def measure_process(
    profile: workload.Profile,
    prompts: int,
    block: int,
    pairs: int,
    guarded: str = "with",
    otlp: str | None = None,
    idle_providers: bool = False,
) -> ProcessCost:
    """Process CPU time (every thread: the guard's worker, the SDK's exporters) of emitting
    ``block`` prompts and then shutting the providers down, with and without the guard.

    Each arm gets fresh providers in every pair, built before the clock starts; the arms
    alternate their order between pairs. With ``otlp``, the time includes encoding and sending
    every span, metric and log record to the endpoint (whose own process is not counted);
    ``idle_providers`` gives the arm without the guard unused OTLP metric and log providers.
    """
    sessions = workload.generate(profile, prompts)
    blocks = [sessions[i : i + block] for i in range(0, prompts - block + 1, block)]
    for name in ("without", guarded):  # warm-up
        warm = Pipeline(name, otlp, idle_providers)
        workload.emit(warm.tracer, blocks[0], suffix="#warm")
        warm.shutdown()
    ratios: list[float] = []
    per_turn: list[float] = []
    turns = calls = 0
    for r in range(pairs):
        chunk = blocks[r % len(blocks)]
        chunk_turns = sum(len(p.turns) for p in chunk)
        turns += chunk_turns
        calls += sum(len(t.calls) for p in chunk for t in p.turns)
        spent: dict[str, int] = {}
        order = ("without", guarded) if r % 2 == 0 else (guarded, "without")
        for name in order:
            arm = Pipeline(name, otlp, idle_providers)
            gc.collect()
            start = time.process_time_ns()
            workload.emit(arm.tracer, chunk, suffix=f"#{r}")
            arm.shutdown()
            spent[name] = time.process_time_ns() - start
        ratios.append(spent[guarded] / spent["without"])
        per_turn.append((spent[guarded] - spent["without"]) / chunk_turns / 1e3)
    return ProcessCost(
        profile.name,
        "discarding" if otlp is None else ("otlp, idle providers" if idle_providers else "otlp"),
        guarded,
        _median(ratios),
        (min(ratios), max(ratios)),
        _median(per_turn),
        calls / turns,
    )


# -- 2c. a span the guard ignores, against the floor processor ----------------------------------


@dataclass(frozen=True)
class IgnoredSpanCost:
    arm: str
    nanoseconds_over_floor: float  # per span, median over repetitions
    floor_over_bare: float  # per span, median of the paired differences: the empty processor itself


def measure_ignored(
    spans: Sequence[tuple[str, dict[str, Any]]], rounds: int
) -> list[IgnoredSpanCost]:
    """Thread CPU per span of ``spans`` (spans the guard does not follow), through a whole
    provider: the guard's arms minus the floor arm (an empty Python processor in the guard's
    place), interleaved in one run."""
    spans_per_round = len(spans)
    names = ["without", "floor", "with"] + (["fused"] if fused_available() else [])
    arms = {name: Pipeline(name) for name in names}

    def run(pipeline: Pipeline) -> int:
        tracer = pipeline.tracer
        start = _cpu_ns()
        for name, attributes in spans:
            tracer.start_span(name, attributes=attributes).end()
        return _cpu_ns() - start

    for pipeline in arms.values():
        run(pipeline)
    times: dict[str, list[int]] = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            times[name].append(run(arms[name]))
    # Paired: each round's arms ran back to back, so a difference within a round cancels the
    # machine's slower and faster moments; the figure is the median of those differences.
    floor = times["floor"]

    def over(name: str, base: list[int]) -> float:
        return _median([a - b for a, b in zip(times[name], base, strict=True)]) / spans_per_round

    floor_over_bare = -over("without", floor)
    return [
        IgnoredSpanCost(name, over(name, floor), floor_over_bare)
        for name in names
        if name not in ("without", "floor")
    ]


# -- 3. memory per tracked prompt -------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    prompts: int
    total_bytes: int
    bytes_per_prompt: float


def _fresh(text: str) -> str:
    """A new string object, as a value decoded from the wire would be (not an interned one)."""
    return text.encode().decode()


def _open_tracked_prompts(pipeline: Pipeline, count: int, tag: str) -> list[Any]:
    """``count`` prompts, each left open after one batch of 3 failures of one realistic key."""
    tracer = pipeline.tracer
    open_spans = []
    for p in range(count):
        prompt_id = f"{tag}-{p:06d}-6f1c2a9e-8b7d-4c3e-9a51-{p:012x}"
        prompt = tracer.start_span(
            "invoke_agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
        )
        tool = _fresh(workload.TOOLS[p % len(workload.TOOLS)])
        error = _fresh(workload.ERROR_TYPES[p % len(workload.ERROR_TYPES)])
        context = set_span_in_context(prompt)
        batch = tracer.start_span(
            "tool_batch", context=context, attributes={"acp.prompt.id": prompt_id}
        )
        batch_context = set_span_in_context(batch)
        for c in range(3):
            span = tracer.start_span(
                "execute_tool",
                context=batch_context,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": f"call_{p:08x}_{c}",
                    "acp.tool.type": "native",
                },
            )
            span.set_attributes(
                {
                    "acp.tool.status": "error",
                    "acp.tool.execution.status": "error",
                    "acp.tool.execution.error_type": error,
                }
            )
            span.end()
        batch.set_attributes({"acp.batch.admitted": 3, "acp.input.reliable": True})
        batch.end()
        open_spans.append(prompt)
    return open_spans


def _traced_bytes(guarded: bool, count: int) -> int:
    pipeline = Pipeline(guarded, max_prompts=count)
    warm = _open_tracked_prompts(pipeline, 10, "warm")  # lazy SDK and telemetry set-up
    for span in warm:
        span.end()
    pipeline.clear()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        open_spans = _open_tracked_prompts(pipeline, count, "mem")
        pipeline.clear()  # the transition log records are the exporter's, not the guard's
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    if pipeline.guard is not None:
        phases = {
            state.phase
            for span in open_spans
            if (state := pipeline.guard.state(str(span.attributes["acp.prompt.id"])))
        }
        if phases != {"tracking"}:
            raise RuntimeError(f"expected every prompt in tracking state, got {phases}")
    del open_spans
    return used


def measure_memory(count: int) -> Memory:
    """Bytes the guard keeps alive with ``count`` open prompts tracking a failure key.

    The same prompts are produced with and without the guard; the difference is what the guard
    holds (its state, bookkeeping, and the strings it keeps that would otherwise be freed).
    """
    with_guard = _traced_bytes(True, count)
    without = _traced_bytes(False, count)
    total = with_guard - without
    return Memory(count, total, total / count)


# -- 4. replay throughput ---------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    spans: int
    file_bytes: int
    seconds: float  # median wall time of the runs, start-up included
    cpu_seconds: float  # the same run's CPU time (user + system)
    startup_seconds: float
    spans_per_second: float
    peak_rss_mib: float | None  # the largest resident size of any replay run, where known
    decisions: dict[str, int]


# The replay runs as `otel-guard replay` does, and reports its own peak resident size when it
# exits. Read from the child itself: Linux carries a parent's high-water mark into a forked or
# vforked child across exec, so RUSAGE_CHILDREN reports this (large) process's peak instead.
_REPLAY_CHILD = """
import sys
from otel_guard.cli import main
code = main(sys.argv[1:])
try:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                print("peak-rss-kib", line.split()[1], file=sys.stderr)
except OSError:
    pass
sys.exit(code)
"""


def _replay_command() -> list[str]:
    return [sys.executable, "-c", _REPLAY_CHILD]


def _pin_to_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_replay(
    path: Path, *, allow_empty: bool = False
) -> tuple[float, float, float | None, dict[str, Any]]:
    """Wall and CPU seconds of one ``otel-guard replay --format json`` run, its peak resident
    size in MiB (``None`` where the system does not say), and its report. ``allow_empty`` for
    the start-up run on an empty file, which replay otherwise refuses with exit status 3."""
    command = [*_replay_command(), "replay", "--format", "json", str(path)]
    if allow_empty:
        command.append("--allow-empty")
    cpu = _children_cpu_seconds()
    start = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, preexec_fn=_pin_to_one_core
    )
    elapsed = time.perf_counter() - start
    cpu = _children_cpu_seconds() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"replay failed ({done.returncode}): {done.stderr.strip()[:300]}")
    peak = None
    for line in done.stderr.splitlines():
        if line.startswith("peak-rss-kib "):
            peak = int(line.split()[1]) / 1024
    return elapsed, cpu, peak, json.loads(done.stdout)


def measure_replay(min_spans: int, repeats: int) -> Replay | None:
    if importlib.util.find_spec("otel_guard.replay.replayer") is None:
        return None
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "spans.jsonl"
        with path.open("w", encoding="utf-8") as out:
            written = workload.write_otlp_json(out, workload.TOOL_HEAVY, min_spans)
        empty = Path(directory) / "empty.jsonl"
        empty.write_text("", encoding="utf-8")
        startup = _median([_timed_replay(empty, allow_empty=True)[0] for _ in range(3)])
        runs: list[tuple[float, float]] = []
        peaks: list[float] = []
        # Repeat only while the runs stay short: a slow replay must not stretch the whole run.
        while len(runs) < repeats and sum(r[0] for r in runs) < REPLAY_BUDGET_SECONDS:
            elapsed, cpu, run_peak, report = _timed_replay(path)
            if report.get("spans") != written:
                raise RuntimeError(f"replay read {report.get('spans')} spans of {written}")
            runs.append((elapsed, cpu))
            if run_peak is not None:
                peaks.append(run_peak)
        seconds, cpu_seconds = sorted(runs)[(len(runs) - 1) // 2]
        decisions = {k: v for k, v in report["decisions"].items() if v}
        peak = max(peaks) if peaks else None
        return Replay(
            spans=written,
            file_bytes=path.stat().st_size,
            seconds=seconds,
            cpu_seconds=cpu_seconds,
            startup_seconds=startup,
            spans_per_second=written / seconds,
            peak_rss_mib=peak,
            decisions=decisions,
        )


# -- report -----------------------------------------------------------------------------------


def _reference_loop_seconds() -> float:
    """CPU seconds for a fixed pure-Python loop: how fast this machine runs Python, to compare
    absolute figures between machines (about 0.4 s on a recent laptop core)."""
    start = _cpu_ns()
    total = 0
    for i in range(10_000_000):
        total += i
    return (_cpu_ns() - start) / 1e9


def _cores() -> tuple[int, int]:
    logical = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    return logical, usable


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _bounds(value: float, target: float | None, must: float | None = None, unit: str = "") -> str:
    """``target <= X: met; must <= Y: met`` for a figure that should stay at or below both."""
    if target is None:
        return "no target"
    fmt = (lambda v: f"{v:.2f}") if not unit else (lambda v: f"{v:,.0f}{unit}")
    text = f"target <= {fmt(target)}: {_verdict(value <= target)}"
    if must is not None:
        text += f"; must <= {fmt(must)}: {_verdict(value <= must)}"
    return text


@contextlib.contextmanager
def null_sink() -> Iterator[tuple[str, dict[str, tuple[int, int]]]]:
    """Run ``null_sink.py`` in its own process (its CPU is not this process's); yield its base
    URL and a dictionary that, once the block is left and the sink stopped, holds the requests
    and bytes it received per path (and ``rejected``)."""
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent / "null_sink.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    received: dict[str, tuple[int, int]] = {}
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"the null sink did not start: {line.strip()!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}", received
    finally:
        try:
            out, _ = child.communicate(timeout=10)  # closing its standard input stops it
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
        for row in (out or "").splitlines():
            name, *numbers = row.split()
            received[name] = (int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else 0)


def _report_replay(spans: int, repeats: int, figures: dict[str, Any]) -> None:
    print("8. Replay: otel-guard replay --format json FILE, pinned to one core")
    replay = measure_replay(spans, repeats)
    if replay is None:
        print("   not available (this version has no otel_guard.replay.replayer)")
        figures["replay"] = None
        return
    peak = "unknown" if replay.peak_rss_mib is None else f"{replay.peak_rss_mib:.0f} MiB"
    print(
        f"   {replay.spans:,} spans ({replay.file_bytes / 2**20:.0f} MiB OTLP/JSON) in "
        f"{replay.seconds:.2f} s ({replay.cpu_seconds:.2f} s CPU), including "
        f"{replay.startup_seconds:.2f} s start-up: {replay.spans_per_second:,.0f} spans/s "
        f"(target >= {TARGET_REPLAY_SPANS_PER_SECOND:,}: "
        f"{_verdict(replay.spans_per_second >= TARGET_REPLAY_SPANS_PER_SECOND)}); "
        f"peak RSS {peak}"
    )
    print(f"   decisions: {replay.decisions}")
    figures["replay"] = replay.__dict__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (smaller sizes)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--replay-only", action="store_true", help="measure only the replay throughput (item 8)"
    )
    parser.add_argument(
        "--hot-path-only",
        action="store_true",
        help="measure only the guard's cost to the agent (items 1 to 6)",
    )
    args = parser.parse_args(argv)

    if args.quick:
        pairs, repeats = 20, 5
        process_prompts, process_block, process_pairs = 60, 10, 6
        ignored_spans, ignored_rounds = 1_000, 12
        span_count, span_rounds = 2_000, 5
        memory_prompts, replay_spans, replay_repeats = 1_000, 20_000, 1
    else:
        pairs, repeats = 200, 15
        process_prompts, process_block, process_pairs = 200, 20, 30
        ignored_spans, ignored_rounds = 2_000, 75
        span_count, span_rounds = 10_000, 20
        memory_prompts, replay_spans, replay_repeats = DEFAULT_MAX_PROMPTS, 200_000, 3

    logical, usable = _cores()
    reference = _reference_loop_seconds()
    build = _build()
    print(f"otel-guard {guard_version} benchmarks{' (quick)' if args.quick else ''}, {build} build")
    print(
        f"Python {platform.python_version()}, opentelemetry-sdk {sdk_version}, "
        f"{platform.machine()}, {logical} cores ({usable} usable); "
        f"reference loop {reference:.2f} s CPU"
    )
    print()
    figures: dict[str, Any] = {
        "quick": args.quick,
        "cores": logical,
        "usable_cores": usable,
        "python": platform.python_version(),
        "opentelemetry_sdk": sdk_version,
        "reference_loop_seconds": reference,
        "build": build,
    }

    if args.replay_only:
        _report_replay(replay_spans, replay_repeats, figures)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        return 0

    print("1. Agent-thread CPU, with / without the guard, discarding provider (medians)")
    guarded_arms = ["with", "fused"] if fused_available() else ["with"]
    bounds: dict[str, tuple[float | None, float | None]] = {
        workload.TOOL_HEAVY.name: (TARGET_TOOL_HEAVY, MUST_TOOL_HEAVY),
        workload.TYPICAL.name: (TARGET_TYPICAL, MUST_TYPICAL),
        workload.FAILURE_HEAVY.name: (None, None),
    }
    sizes = {workload.TOOL_HEAVY.name: (200, 4), workload.TYPICAL.name: (40, 1)}
    if args.quick:
        sizes = {workload.TOOL_HEAVY.name: (80, 4), workload.TYPICAL.name: (16, 1)}
    sizes[workload.FAILURE_HEAVY.name] = sizes[workload.TOOL_HEAVY.name]

    def overhead_row(o: Overhead) -> None:
        print(
            f"   {_label(o.profile, o.arm):<18} {o.tool_share:4.0%} tool-call spans, "
            f"{o.transitions_per_batch:.2f} transitions per batch: "
            f"{o.without_spans_per_second:,.0f} -> {o.with_spans_per_second:,.0f} spans/s, "
            f"ratio {o.ratio:.3f} ({_bounds(o.ratio, *bounds[o.profile])})"
        )

    def process_row(p: ProcessCost, target: float | None) -> None:
        print(
            f"   {_label(p.profile, p.arm):<18} ratio {p.ratio:.3f} "
            f"(pairs {p.ratios[0]:.3f}-{p.ratios[1]:.3f}; {_bounds(p.ratio, target)})"
        )

    overheads: list[Overhead] = []
    for profile in (workload.TOOL_HEAVY, workload.TYPICAL, workload.FAILURE_HEAVY):
        for arm in guarded_arms:
            o = measure_overhead(profile, *sizes[profile.name], pairs, arm)
            overheads.append(o)
            overhead_row(o)

    print("2. Whole-process CPU, emission plus providers' shutdown, discarding provider")
    process_costs = [
        measure_process(workload.TOOL_HEAVY, process_prompts, process_block, process_pairs, arm)
        for arm in guarded_arms
    ]
    for p in process_costs:
        process_row(p, TARGET_PROCESS)

    print(
        "3. What users run: BatchSpanProcessor + OTLP/HTTP exporters (spans, and the guard's "
        "metrics and logs) into a null sink on 127.0.0.1 (its own process, not counted)"
    )
    with null_sink() as (endpoint, received):
        print("   agent-thread CPU, with / without the guard (medians, interleaved)")
        for profile in (workload.TOOL_HEAVY, workload.TYPICAL):
            for arm in guarded_arms:
                o = measure_overhead(profile, *sizes[profile.name], pairs, arm, endpoint)
                overheads.append(o)
                overhead_row(o)
        print("   whole-process CPU, emission plus providers' shutdown (medians, interleaved)")
        otlp_costs = [
            measure_process(
                workload.TOOL_HEAVY, process_prompts, process_block, process_pairs, arm, endpoint
            )
            for arm in guarded_arms
        ]
        for p in otlp_costs:
            process_row(p, TARGET_PROCESS_OTLP)
        print(
            "   the same, where the arm without the guard has the same OTLP metric and log "
            "providers, idle (no target)"
        )
        idle_costs = [
            measure_process(
                workload.TOOL_HEAVY,
                process_prompts,
                process_block,
                process_pairs,
                arm,
                endpoint,
                idle_providers=True,
            )
            for arm in guarded_arms
        ]
        for p in idle_costs:
            process_row(p, None)
        otlp_costs += idle_costs
    process_costs += otlp_costs
    print(
        "   the null sink received: "
        + ", ".join(
            f"{path.removeprefix('/v1/')} {n:,} requests ({size / 2**20:.1f} MiB)"
            for path, (n, size) in received.items()
            if path.startswith("/v1/")
        )
        + f"; {received.get('rejected', (0, 0))[0]} refused"
    )
    figures["overhead"] = [o.__dict__ for o in overheads]
    figures["process"] = [p.__dict__ for p in process_costs]
    figures["null_sink_received"] = received

    print(
        "4. The guard's cost per turn and per tool call (median differences of 1 to 3), and its "
        f"share of a realistic turn ({REALISTIC_TURN_SECONDS:.2f} s: a 1 s model call, three "
        "50 ms tools)"
    )
    costs_per_turn: list[dict[str, Any]] = []
    for pipeline in ("discarding", "otlp"):
        for arm in guarded_arms:
            heavy = next(
                o
                for o in overheads
                if (o.pipeline, o.arm, o.profile) == (pipeline, arm, workload.TOOL_HEAVY.name)
            )
            typical = next(
                o
                for o in overheads
                if (o.pipeline, o.arm, o.profile) == (pipeline, arm, workload.TYPICAL.name)
            )
            process = next(p for p in process_costs if (p.pipeline, p.arm) == (pipeline, arm))
            row = {
                "pipeline": pipeline,
                "arm": arm,
                "thread_us_per_turn": heavy.us_per_turn,
                "thread_us_per_call": heavy.us_per_turn / heavy.calls_per_turn,
                "typical_thread_us_per_turn": typical.us_per_turn,
                "process_us_per_turn": process.us_per_turn,
                "process_us_per_call": process.us_per_turn / process.calls_per_turn,
                "thread_share_of_turn": heavy.us_per_turn / 1e6 / REALISTIC_TURN_SECONDS,
                "process_share_of_turn": process.us_per_turn / 1e6 / REALISTIC_TURN_SECONDS,
            }
            costs_per_turn.append(row)
            print(
                f"   {pipeline + ' (' + arm + ')':<18} agent thread: "
                f"{row['thread_us_per_turn']:5.1f} us per tool-heavy turn, "
                f"{row['thread_us_per_call']:4.1f} us per tool call, "
                f"{row['typical_thread_us_per_turn']:5.1f} us per typical turn; "
                f"whole process: {row['process_us_per_turn']:5.1f} us per turn, "
                f"{row['process_us_per_call']:4.1f} us per tool call; share of a realistic "
                f"turn {row['thread_share_of_turn']:.4%} (thread), "
                f"{row['process_share_of_turn']:.4%} (process)"
            )
    figures["cost_per_turn"] = costs_per_turn

    print("5. A span the guard ignores, through a provider, over an empty Python processor")
    ignored_figures: dict[str, dict[str, float]] = {}
    for what, spans, target in (
        (
            "a span no profile claims (HTTP request, file read)",
            workload.unclaimed_spans(ignored_spans),
            TARGET_IGNORED_NS,
        ),
        (
            "mixed filler (a third model calls outside any prompt)",
            workload.filler_spans(ignored_spans),
            None,
        ),
    ):
        ignored = measure_ignored(spans, ignored_rounds)
        print(f"   {what}; the empty processor itself: {ignored[0].floor_over_bare:.0f} ns")
        for i in ignored:
            print(
                f"     guard ({i.arm}): {i.nanoseconds_over_floor:+6.0f} ns per span over the "
                f"floor ({_bounds(i.nanoseconds_over_floor, target, unit=' ns')})"
            )
        ignored_figures[what] = {i.arm: i.nanoseconds_over_floor for i in ignored}
        ignored_figures[what]["floor_over_bare"] = ignored[0].floor_over_bare
    figures["ignored_span_ns_over_floor"] = ignored_figures

    print("6. One span that is not the guard's, on_start + on_end (minus the bare loop)")
    costs = measure_span_cost(span_count, span_rounds, repeats)
    for c in costs:
        print(f"   {c.kind:<42} {c.nanoseconds:6.0f} ns")
    figures["span_cost_ns"] = {c.kind: c.nanoseconds for c in costs}

    if args.hot_path_only:
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        return 0

    print("7. Memory the guard keeps, prompts in tracking state (tracemalloc)")
    memory = measure_memory(memory_prompts)
    print(
        f"   {memory.bytes_per_prompt:,.0f} B per tracked prompt "
        f"({_bounds(memory.bytes_per_prompt, TARGET_BYTES_PER_PROMPT, unit=' B')}); "
        f"{memory.total_bytes / 2**20:.1f} MiB with {memory.prompts:,} prompts (max_prompts)"
    )
    figures["memory"] = memory.__dict__

    _report_replay(replay_spans, replay_repeats, figures)

    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
