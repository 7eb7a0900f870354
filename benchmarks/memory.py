"""What the guard holds when spans never end, and what a prompt start costs with a full table.

Run from the repository root after ``pip install .``::

    python benchmarks/memory.py           # 5,000 open batch spans x 100 calls; 10,000 prompts
    python benchmarks/memory.py --quick   # 1,000 x 100 and 2,000 prompts: indicative only

1. **Never-ending batch spans.** A host opens 5,000 batch spans that never end, each with 100
   tool-call children that do end. The same scenario runs in fresh processes with and without
   the guard; each process reports its resident-size growth (``/proc/self/statm``, or the peak
   from ``getrusage`` elsewhere) and, in a second process, the bytes ``tracemalloc`` sees still
   allocated. The guard's share is the difference.
2. **Prompt start with the table full of tracking prompts.** ``max_prompts`` prompts each have a
   failing batch (phase ``tracking``, so none is idle), then new prompt spans start, each one
   evicting a prompt. The benchmark counts the Python lines the guard executes per prompt start
   (``sys.settrace``, deterministic) at 100 and at the full table size and asserts they are the
   same: a start does no scan of the prompts. Median wall time per start is reported beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, set_span_in_context

from otel_guard import GuardSpanProcessor

RESOURCE = Resource.create({"service.name": "agent"})
GUARD_DIR = str(Path(__import__("otel_guard").__file__).resolve().parent)

FAILING_CALL = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "run_shell",
    "acp.tool.type": "native",
    "acp.tool.status": "error",
    "acp.tool.execution.status": "error",
    "acp.tool.execution.error_type": "exit_nonzero",
}


def _provider(guard: GuardSpanProcessor | None) -> TracerProvider:
    provider = TracerProvider(resource=RESOURCE)
    if guard is not None:
        provider.add_span_processor(guard)
    return provider


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def never_ending_batches(batches: int, calls: int, with_guard: bool) -> list[Span]:
    """Open ``batches`` batch spans that never end, each with ``calls`` ended tool-call spans.

    Returns the open batch spans: the host holds them, so the caller keeps them alive too.
    """
    guard = GuardSpanProcessor(mode="enforce") if with_guard else None
    tracer = _provider(guard).get_tracer("agent")
    open_batches: list[Span] = []
    for b in range(batches):
        batch = tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"prompt-{b}"})
        context = set_span_in_context(batch)
        for c in range(calls):
            attributes = dict(FAILING_CALL)
            attributes["gen_ai.tool.call.id"] = f"call-{b}-{c}"
            tracer.start_span("execute_tool", context=context, attributes=attributes).end()
        open_batches.append(batch)
    return open_batches


def _child(batches: int, calls: int, with_guard: bool, measure: str) -> dict[str, Any]:
    gc.collect()
    if measure == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = never_ending_batches(batches, calls, with_guard)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del held
        return {"traced_bytes": after - before}
    before = _rss_bytes()
    held = never_ending_batches(batches, calls, with_guard)
    gc.collect()
    after = _rss_bytes()
    del held
    return {"rss_bytes": after - before}


def _measure_in_child(batches: int, calls: int, with_guard: bool, measure: str) -> int:
    argv = [sys.executable, __file__, "--child", measure, str(batches), str(calls)]
    if with_guard:
        argv.append("--guard")
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900)
    result = json.loads(done.stdout)
    return int(result["traced_bytes" if measure == "tracemalloc" else "rss_bytes"])


def _fill_with_tracking_prompts(size: int) -> tuple[GuardSpanProcessor, Any, list[Span]]:
    guard = GuardSpanProcessor(mode="enforce", max_prompts=size)
    tracer = _provider(guard).get_tracer("agent")
    prompts: list[Span] = []
    for p in range(size):
        prompt_id = f"tracking-{p}"
        prompt = tracer.start_span(
            "invoke_agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
        )
        prompts.append(prompt)
        batch = tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        context = set_span_in_context(batch)
        for c in range(4):
            attributes = dict(FAILING_CALL)
            attributes["gen_ai.tool.call.id"] = f"call-{p}-{c}"
            tracer.start_span("execute_tool", context=context, attributes=attributes).end()
        batch.set_attributes({"acp.batch.admitted": 4, "acp.input.reliable": True})
        batch.end()
    states = [guard.state(f"tracking-{p}") for p in range(size)]
    assert all(s is not None and s.phase == "tracking" for s in states), "table not full"
    return guard, tracer, prompts


def _lines_per_start(tracer: Any, starts: int, tag: str) -> list[int]:
    """Python lines executed inside ``otel_guard`` by each of ``starts`` prompt starts."""
    counts: list[int] = []
    lines = 0

    def local(frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def global_(frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        return local if frame.f_code.co_filename.startswith(GUARD_DIR) else None

    for i in range(starts):
        lines = 0
        attributes = {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": f"{tag}-{i}"}
        sys.settrace(global_)
        try:
            tracer.start_span("invoke_agent", attributes=attributes)
        finally:
            sys.settrace(None)
        counts.append(lines)
    return counts


def _seconds_per_start(tracer: Any, starts: int, tag: str) -> float:
    times: list[float] = []
    for i in range(starts):
        attributes = {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": f"{tag}-{i}"}
        begin = time.perf_counter()
        tracer.start_span("invoke_agent", attributes=attributes)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def prompt_start_cost(size: int, starts: int) -> dict[str, Any]:
    guard, tracer, held = _fill_with_tracking_prompts(size)
    seconds = _seconds_per_start(tracer, starts, f"timed-{size}")
    lines = _lines_per_start(tracer, 20, f"traced-{size}")
    del held, guard
    return {"table": size, "median_start_us": seconds * 1e6, "lines_per_start": max(lines)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller scenarios")
    parser.add_argument("--child", nargs=3, metavar=("MEASURE", "BATCHES", "CALLS"))
    parser.add_argument("--guard", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.child:
        measure, batches, calls = args.child
        print(json.dumps(_child(int(batches), int(calls), args.guard, measure)))
        return 0

    batches, calls = (1_000, 100) if args.quick else (5_000, 100)
    table = 2_000 if args.quick else 10_000
    mib = 1024 * 1024
    figures: dict[str, Any] = {"batches": batches, "calls_per_batch": calls}
    print(f"1. {batches:,} never-ending batch spans x {calls} ended tool-call spans")
    for measure, unit in (("rss", "RSS growth"), ("tracemalloc", "traced")):
        without = _measure_in_child(batches, calls, False, measure)
        with_guard = _measure_in_child(batches, calls, True, measure)
        figures[measure] = {"without_guard": without, "with_guard": with_guard}
        print(
            f"   {unit:>10}: without guard {without / mib:8.1f} MiB, with guard "
            f"{with_guard / mib:8.1f} MiB, guard's share {(with_guard - without) / mib:8.1f} MiB"
        )

    print("2. prompt start with the table full of tracking prompts (max_prompts = table size)")
    small = prompt_start_cost(100, 200)
    full = prompt_start_cost(table, 200)
    figures["prompt_start"] = [small, full]
    for row in (small, full):
        print(
            f"   table {row['table']:>6,}: median {row['median_start_us']:8.1f} us per start, "
            f"{row['lines_per_start']} guard lines executed"
        )
    ratio = full["median_start_us"] / small["median_start_us"]
    print(f"   start cost ratio {table:,} / 100: {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    # The deterministic check: a start executes the same guard code whatever the table size.
    assert full["lines_per_start"] == small["lines_per_start"], (
        f"a prompt start scans the prompts: {small['lines_per_start']} guard lines at 100, "
        f"{full['lines_per_start']} at {table:,}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
