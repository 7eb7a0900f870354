"""Replay throughput: generate a large OTLP/JSON trace file, replay it, print spans per second.

Usage: ``python benchmarks/replay_throughput.py [--spans N] [--mode MODE] [--keep FILE]``

The generated file holds interactive prompts (one trace each: a prompt span, tool batches as its
children, tool calls as theirs) written one trace per line in the Collector ``file`` exporter's
encoding. Outcomes are mixed so that the guard tracks, warns, stops and resets. The figure covers
everything ``otel-guard replay`` does: reading, JSON parsing, span reconstruction, ordering,
the guard itself, telemetry and the report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from typing import Any

from otel_guard.otlp_json import OtlpJsonReader
from otel_guard.replay import Replayer

_RESOURCE = {
    "attributes": [
        {"key": "service.name", "value": {"stringValue": "agent"}},
        {"key": "service.version", "value": {"stringValue": "2.4.0"}},
        {"key": "deployment.environment.name", "value": {"stringValue": "bench"}},
    ]
}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            out.append({"key": key, "value": {"boolValue": value}})
        elif isinstance(value, int):
            out.append({"key": key, "value": {"intValue": str(value)}})
        else:
            out.append({"key": key, "value": {"stringValue": value}})
    return out


def _span(
    trace: str,
    span: str,
    parent: str | None,
    name: str,
    start: int,
    end: int,
    attributes: dict[str, Any],
) -> dict[str, Any]:
    body: dict[str, Any] = {"traceId": trace, "spanId": span}
    if parent:
        body["parentSpanId"] = parent
    body.update(
        name=name,
        kind=1,
        startTimeUnixNano=str(start),
        endTimeUnixNano=str(end),
        attributes=_attributes(attributes),
        status={},
    )
    return body


def generate(path: str, target: int, seed: int = 7) -> int:
    """Write at least ``target`` spans to ``path``; returns the number written."""
    rng = random.Random(seed)
    written = 0
    clock = 1_750_000_000_000_000_000
    prompt_number = 0
    with open(path, "w", encoding="utf-8") as stream:
        while written < target:
            prompt_number += 1
            prompt_id = f"prompt-{prompt_number}"
            trace = f"{rng.getrandbits(128) | 1:032x}"
            root = f"{rng.getrandbits(64) | 1:016x}"
            spans = []
            start = clock
            tool = rng.choice(["run_shell", "edit_file", "mcp__docs__search"])
            failing = rng.random() < 0.5
            for _ in range(rng.randint(1, 6)):
                batch = f"{rng.getrandbits(64) | 1:016x}"
                batch_start = clock = clock + 1_000_000
                calls = rng.randint(1, 6)
                for _ in range(calls):
                    clock += 10_000
                    fails = failing and rng.random() < 0.9
                    attributes: dict[str, Any] = {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": tool if fails or rng.random() < 0.5 else "read_file",
                        "gen_ai.tool.call.id": f"call-{rng.getrandbits(48):x}",
                        "acp.tool.type": "mcp" if tool.startswith("mcp__") else "native",
                        "acp.tool.status": "error" if fails else "success",
                        "acp.tool.execution.status": "error" if fails else "success",
                    }
                    if fails:
                        attributes["acp.tool.execution.error_type"] = "exit_nonzero"
                    spans.append(
                        _span(
                            trace,
                            f"{rng.getrandbits(64) | 1:016x}",
                            batch,
                            "execute_tool",
                            clock,
                            clock + 5_000,
                            attributes,
                        )
                    )
                clock += 100_000
                spans.append(
                    _span(
                        trace,
                        batch,
                        root,
                        "tool_batch",
                        batch_start,
                        clock,
                        {
                            "acp.prompt.id": prompt_id,
                            "acp.batch.admitted": calls,
                            "acp.input.external": False,
                            "acp.input.queued_prompt": False,
                            "acp.input.reliable": True,
                        },
                    )
                )
            clock += 1_000_000
            spans.append(
                _span(
                    trace,
                    root,
                    None,
                    "invoke_agent",
                    start,
                    clock,
                    {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
                )
            )
            request = {
                "resourceSpans": [
                    {
                        "resource": _RESOURCE,
                        "scopeSpans": [{"scope": {"name": "agent"}, "spans": spans}],
                    }
                ]
            }
            stream.write(json.dumps(request, separators=(",", ":")) + "\n")
            written += len(spans)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--mode", default="shadow")
    parser.add_argument("--keep", metavar="FILE", help="write the generated file here and keep it")
    args = parser.parse_args()

    path = args.keep or os.path.join(tempfile.mkdtemp(), "spans.jsonl")
    began = time.perf_counter()
    spans = generate(path, args.spans)
    generated = time.perf_counter() - began
    size = os.path.getsize(path)
    print(f"generated {spans:,} spans ({size / 1e6:.1f} MB) in {generated:.1f} s")

    began = time.perf_counter()
    began_cpu = time.process_time()
    replayer = Replayer(args.mode)
    for line in OtlpJsonReader([path]):
        replayer.add(line.spans)
    report = replayer.finish()
    elapsed = time.perf_counter() - began
    cpu = time.process_time() - began_cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    spans_read = report.total.spans
    print(
        f"replayed {spans_read:,} spans, {report.traces:,} traces, "
        f"{report.total.batches:,} batches in {elapsed:.2f} s wall, {cpu:.2f} s CPU: "
        f"{spans_read / elapsed:,.0f} spans/s wall, {spans_read / cpu:,.0f} spans/s per CPU "
        f"second (peak RSS {peak:.0f} MB)"
    )
    print("decisions:", dict(report.total.decisions), "violations:", report.invariant_violations)
    if not args.keep:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
