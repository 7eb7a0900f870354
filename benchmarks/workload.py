"""Simulated agent sessions for the benchmarks: generated once, then emitted live or as OTLP/JSON.

A session is a list of prompts; a prompt is a list of turns; a turn is some spans that are not
the guard's (model calls, HTTP requests, file reads) plus one batch of tool calls. The same
generated sessions drive both arms of a measurement, so the only difference between them is the
guard.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from opentelemetry.trace import Tracer, set_span_in_context

# A registry-like set of tool names, and the classified execution error types an agent reports.
TOOLS = ("run_shell", "read_file", "write_file", "search_code", "mcp__github__get_issue")
ERROR_TYPES = ("exit_nonzero", "timeout", "not_found", "permission_denied")


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call: attributes known at start, and its outcome set just before it ends."""

    start: dict[str, Any]
    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """One model round: spans that are not the guard's, then one batch of tool calls."""

    filler: tuple[tuple[str, dict[str, Any]], ...]
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class Prompt:
    prompt_id: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Profile:
    """The shape of a simulated agent."""

    name: str
    filler_per_turn: int  # spans per turn that are not tool calls, besides the batch span
    turns_per_prompt: int = 10
    calls_per_batch: int = 3
    loop_share: float = 0.1  # prompts where one tool keeps failing for the same reason
    failure_rate: float = 0.2  # per call, in the other prompts


# Per turn: 1 model span + 1 batch span + 3 tool calls -> 60% tool-call spans.
TOOL_HEAVY = Profile("tool-heavy", filler_per_turn=1)
# Per turn: 25 model/HTTP/file spans + 1 batch span + 3 tool calls -> 10% tool-call spans.
TYPICAL = Profile("typical", filler_per_turn=25)
# A stress case with no target: tool-heavy, where half the prompts loop and the rest fail often.
FAILURE_HEAVY = Profile("failing", filler_per_turn=1, loop_share=0.5, failure_rate=0.5)


def _filler(rng: random.Random, turn: int, index: int) -> tuple[str, dict[str, Any]]:
    """A span the guard does not follow: a model call, an HTTP request or a file read."""
    kind = index % 3
    if kind == 0:
        return "chat", {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4.1",
            "gen_ai.usage.input_tokens": 1000 + rng.randrange(5000),
            "gen_ai.usage.output_tokens": rng.randrange(800),
        }
    if kind == 1:
        return "GET", {
            "http.request.method": "GET",
            "url.full": f"https://api.example.com/v1/items/{turn}-{index}",
            "http.response.status_code": 200,
            "server.address": "api.example.com",
        }
    return "read", {
        "code.function.name": "read_text",
        "file.size": rng.randrange(1 << 16),
    }


def filler_spans(count: int, seed: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """``count`` spans the guard does not follow, as (name, attributes) pairs."""
    rng = random.Random(seed)
    return [_filler(rng, i // 3, i) for i in range(count)]


def unclaimed_spans(count: int, seed: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """``count`` spans no profile claims (HTTP requests and file reads, no model calls)."""
    rng = random.Random(seed)
    return [_filler(rng, i // 2, 1 + i % 2) for i in range(count)]


def _outcome(rng: random.Random, fail: bool, error_type: str) -> dict[str, Any]:
    if not fail:
        return {"acp.tool.status": "success", "acp.tool.execution.status": "success"}
    if rng.random() < 0.15:  # refused before execution: never counts
        return {"acp.tool.status": "error", "acp.tool.execution.status": "not_started"}
    return {
        "acp.tool.status": "error",
        "acp.tool.execution.status": "error",
        "acp.tool.execution.error_type": error_type,
        "error.type": "tool_error",
    }


def generate(profile: Profile, prompts: int, seed: int = 7, prefix: str = "p") -> list[Prompt]:
    """``prompts`` prompts of ``profile``; deterministic for a seed."""
    rng = random.Random(seed)
    out: list[Prompt] = []
    call_seq = 0
    for p in range(prompts):
        looping = rng.random() < profile.loop_share
        loop_tool, loop_error = rng.choice(TOOLS), rng.choice(ERROR_TYPES)
        turns: list[Turn] = []
        for t in range(profile.turns_per_prompt):
            filler = tuple(_filler(rng, t, i) for i in range(profile.filler_per_turn))
            calls: list[Call] = []
            for _ in range(profile.calls_per_batch):
                call_seq += 1
                if looping:
                    tool, fail, error = loop_tool, True, loop_error
                else:
                    tool = rng.choice(TOOLS)
                    fail = rng.random() < profile.failure_rate
                    error = rng.choice(ERROR_TYPES)
                start = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": f"call_{call_seq:08x}",
                    "acp.tool.type": "mcp" if tool.startswith("mcp__") else "native",
                }
                calls.append(Call(start, _outcome(rng, fail, error)))
            turns.append(Turn(filler, tuple(calls)))
        out.append(Prompt(f"{prefix}-{p:06d}", tuple(turns)))
    return out


def span_count(prompts: Sequence[Prompt]) -> int:
    """Spans one emission of ``prompts`` produces."""
    return sum(1 + sum(1 + len(t.filler) + len(t.calls) for t in p.turns) for p in prompts)


def tool_share(prompts: Sequence[Prompt]) -> float:
    calls = sum(len(t.calls) for p in prompts for t in p.turns)
    return calls / span_count(prompts)


def emit(tracer: Tracer, prompts: Sequence[Prompt], suffix: str = "") -> None:
    """Emit the sessions live through ``tracer``, as an instrumented agent would.

    ``suffix`` makes prompt IDs distinct between repetitions.
    """
    for prompt in prompts:
        prompt_id = prompt.prompt_id + suffix
        prompt_span = tracer.start_span(
            "invoke_agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
        )
        prompt_context = set_span_in_context(prompt_span)
        for turn in prompt.turns:
            for name, attributes in turn.filler:
                tracer.start_span(name, context=prompt_context, attributes=attributes).end()
            batch = tracer.start_span(
                "tool_batch", context=prompt_context, attributes={"acp.prompt.id": prompt_id}
            )
            batch_context = set_span_in_context(batch)
            for call in turn.calls:
                span = tracer.start_span(
                    "execute_tool", context=batch_context, attributes=call.start
                )
                span.set_attributes(call.outcome)
                span.end()
            batch.set_attributes(
                {
                    "acp.batch.admitted": len(turn.calls),
                    "acp.input.external": False,
                    "acp.input.queued_prompt": False,
                    "acp.input.reliable": True,
                }
            )
            batch.end()
        prompt_span.end()


# -- OTLP/JSON, as the OpenTelemetry Collector's file exporter writes it ----------------------


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 is a string in the OTLP/JSON encoding
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _key_values(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


class _Ids:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def trace_id(self) -> str:
        return f"{self._rng.getrandbits(128) or 1:032x}"

    def span_id(self) -> str:
        return f"{self._rng.getrandbits(64) or 1:016x}"


def _otlp_prompt(prompt: Prompt, ids: _Ids, clock: int) -> tuple[list[dict[str, Any]], int]:
    """The spans of one prompt's trace, in the order they end, and the clock after it."""
    trace_id = ids.trace_id()
    spans: list[dict[str, Any]] = []

    def span(
        name: str, span_id: str, parent: str, start: int, end: int, attributes: dict[str, Any]
    ) -> None:
        record: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": name,
            "kind": 1,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end),
            "attributes": _key_values(attributes),
            "status": {},
        }
        if parent:
            record["parentSpanId"] = parent
        spans.append(record)

    prompt_id, prompt_start = ids.span_id(), clock
    for turn in prompt.turns:
        for name, attributes in turn.filler:
            clock += 1_000
            span(name, ids.span_id(), prompt_id, clock, clock + 800, attributes)
        batch_id, batch_start = ids.span_id(), clock + 1_000
        clock = batch_start
        for call in turn.calls:
            clock += 1_000
            span(
                "execute_tool",
                ids.span_id(),
                batch_id,
                clock,
                clock + 500,
                call.start | call.outcome,
            )
        clock += 1_000
        span(
            "tool_batch",
            batch_id,
            prompt_id,
            batch_start,
            clock,
            {
                "acp.prompt.id": prompt.prompt_id,
                "acp.batch.admitted": len(turn.calls),
                "acp.input.external": False,
                "acp.input.queued_prompt": False,
                "acp.input.reliable": True,
            },
        )
    clock += 1_000
    span(
        "invoke_agent",
        prompt_id,
        "",
        prompt_start,
        clock,
        {"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt.prompt_id},
    )
    return spans, clock


def _request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _key_values({"service.name": "agent"})},
                "scopeSpans": [{"scope": {"name": "agent"}, "spans": spans}],
            }
        ]
    }


def write_otlp_json(
    out: TextIO, profile: Profile, min_spans: int, seed: int = 11, spans_per_line: int = 512
) -> int:
    """Write sessions of ``profile`` as OTLP/JSON lines until at least ``min_spans`` spans.

    Like the Collector's file exporter, each line is one ``ExportTraceServiceRequest`` holding
    the spans of one export batch, in the order they ended; a trace may span several lines.
    Returns the number of spans written.
    """
    ids = _Ids(seed)
    clock = 1_700_000_000_000_000_000
    written = 0
    pending: list[dict[str, Any]] = []
    for prompt in _endless(profile, seed):
        spans, clock = _otlp_prompt(prompt, ids, clock)
        pending.extend(spans)
        written += len(spans)
        while len(pending) >= spans_per_line:
            out.write(json.dumps(_request(pending[:spans_per_line]), separators=(",", ":")))
            out.write("\n")
            del pending[:spans_per_line]
        if written >= min_spans:
            break
    if pending:
        out.write(json.dumps(_request(pending), separators=(",", ":")))
        out.write("\n")
    return written


def _endless(profile: Profile, seed: int) -> Iterator[Prompt]:
    chunk = 0
    while True:
        yield from generate(profile, 100, seed=seed + chunk, prefix=f"r{chunk}")
        chunk += 1
