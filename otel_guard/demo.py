"""Simulated agent sessions run through a real ``TracerProvider`` with the guard.

Each session is a scripted prompt: a sequence of tool batches with fixed outcomes. The host side
reads the guard's action after every batch, like an agent would: it shows the reminder to the
model, and on a stop it ends the prompt (so in ``enforce`` mode the loop really stops and later
batches are never run). Nothing leaves the process; with ``out`` every span is also written as
OTLP/JSON lines, one line per trace, which ``otel-guard replay`` reads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes.deployment_attributes import (
    DEPLOYMENT_ENVIRONMENT_NAME,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION
from opentelemetry.trace import Span, Tracer, set_span_in_context

from otel_guard import attributes as attr
from otel_guard.otlp_json import OtlpJsonSpanExporter
from otel_guard.processor import BatchEvaluation, GuardAction
from otel_guard.replay import GuardPipeline, GuardReport

__all__ = ["SESSIONS", "Call", "Session", "Turn", "run_demo"]


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call's settled outcome."""

    tool: str
    status: str
    execution: str
    error_type: str | None = None
    tool_type: str = "native"

    def label(self) -> str:
        if self.status == "success":
            return f"{self.tool} ok"
        if self.status == "cancelled":
            return f"{self.tool} cancelled ({self.execution})"
        return f"{self.tool} {self.status}/{self.error_type}"


def _fail(tool: str, error_type: str, tool_type: str = "native") -> Call:
    return Call(tool, "error", "error", error_type, tool_type)


def _ok(tool: str, tool_type: str = "native") -> Call:
    return Call(tool, "success", "success", None, tool_type)


# A permission denial: the user cancelled before the tool ran.
_DENIED = Call("run_shell", "cancelled", "not_started")
_SHELL = _fail("run_shell", "exit_nonzero")
_EDIT = _fail("edit_file", "patch_rejected")
_SEARCH = _fail("mcp__docs__search", "timeout", "mcp")


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn: a tool batch, and what the host's input drain reported after it."""

    calls: tuple[Call, ...]
    concurrent: bool = False
    reliable: bool | None = True  # None: the host did not report a reliable drain


@dataclass(frozen=True, slots=True)
class Session:
    """One scripted prompt."""

    prompt_id: str
    title: str
    turns: tuple[Turn, ...]
    route: str | None = None
    channel: bool = False
    legacy_host: bool = False


SESSIONS: tuple[Session, ...] = (
    Session(
        "prompt-loop",
        "a shell command that keeps failing: warned, then stopped",
        tuple(Turn((_SHELL,) * 4) for _ in range(5)),
    ),
    Session(
        "prompt-recovery",
        "a failing edit that recovers after the reminder",
        (
            Turn((_EDIT,) * 4),
            Turn((_ok("read_file"), *(_EDIT,) * 4)),
            Turn((_ok("read_file"), _ok("edit_file"))),
        ),
    ),
    Session(
        "prompt-permission",
        "a permission denial is a cancellation, never a failure",
        (
            Turn((_SHELL,) * 3),
            Turn((_DENIED, _SHELL, _SHELL)),
            Turn((_SHELL,) * 3),
            Turn((_ok("write_file"),)),
        ),
    ),
    Session(
        "prompt-siblings",
        "concurrent sibling calls settling out of order",
        (
            Turn((_SEARCH, _ok("read_file"), _SEARCH, _ok("grep"), _SEARCH), concurrent=True),
            Turn((_SEARCH, _ok("read_file"), _SEARCH, _SEARCH), concurrent=True),
            Turn((_SEARCH, _fail("web_fetch", "http_404"), _SEARCH), concurrent=True),
        ),
    ),
    Session(
        "prompt-channel",
        "a channel prompt: the guard is off",
        tuple(Turn((_SHELL,) * 4) for _ in range(3)),
        route="channel",
        channel=True,
    ),
    Session(
        "prompt-old-host",
        "an unreliable host: enforcement disabled for the prompt",
        (
            Turn((_SHELL,) * 4, reliable=None),
            Turn((_SHELL,) * 4, reliable=None),
            Turn((_SHELL,) * 4),
            Turn((_SHELL,) * 4),
            Turn((_SHELL,) * 4),
        ),
        legacy_host=True,
    ),
)


class _Agent:
    """The span-producing side of the simulated agent."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._calls = 0

    def prompt(self, session: Session) -> Span:
        attributes: dict[str, Any] = {
            attr.OPERATION_NAME: attr.INVOKE_AGENT,
            attr.PROMPT_ID: session.prompt_id,
        }
        if session.route is not None:
            attributes[attr.PROMPT_ROUTE] = session.route
        if session.channel:
            attributes[attr.PROMPT_CHANNEL] = True
        return self._tracer.start_span("invoke_agent", attributes=attributes)

    def batch(self, prompt: Span, prompt_id: str, turn: Turn) -> None:
        batch = self._tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={attr.PROMPT_ID: prompt_id},
        )
        context = set_span_in_context(batch)
        spans = [self._tool(call, context) for call in turn.calls]
        if turn.concurrent:
            # Siblings settle on their own threads, in whatever order the threads finish.
            gate = threading.Barrier(len(spans))

            def settle(span: Span) -> None:
                gate.wait()
                span.end()

            with ThreadPoolExecutor(max_workers=len(spans)) as pool:
                list(pool.map(settle, spans))
        else:
            for span in spans:
                span.end()
        batch.set_attribute(attr.BATCH_ADMITTED, len(spans))
        batch.set_attribute(attr.INPUT_EXTERNAL, False)
        batch.set_attribute(attr.INPUT_QUEUED_PROMPT, False)
        if turn.reliable is not None:
            batch.set_attribute(attr.INPUT_RELIABLE, turn.reliable)
        batch.end()

    def _tool(self, call: Call, context: Any) -> Span:
        self._calls += 1
        attributes: dict[str, Any] = {
            attr.OPERATION_NAME: attr.EXECUTE_TOOL,
            attr.TOOL_NAME: call.tool,
            attr.TOOL_CALL_ID: f"call-{self._calls:04d}",
            attr.TOOL_TYPE: call.tool_type,
            attr.TOOL_STATUS: call.status,
            attr.TOOL_EXECUTION_STATUS: call.execution,
        }
        if call.error_type is not None:
            attributes[attr.TOOL_EXECUTION_ERROR_TYPE] = call.error_type
        return self._tracer.start_span(
            f"execute_tool {call.tool}", context=context, attributes=attributes
        )


def _calls_text(calls: Sequence[Call]) -> str:
    groups: list[tuple[str, int]] = []
    for call in calls:
        label = call.label()
        if groups and groups[-1][0] == label:
            groups[-1] = (label, groups[-1][1] + 1)
        else:
            groups.append((label, 1))
    return ", ".join(label if n == 1 else f"{label} x{n}" for label, n in groups)


def _decision_text(evaluation: BatchEvaluation | None) -> str:
    if evaluation is None:
        return "not guarded (guard off for this prompt)"
    value = evaluation.decision_value
    state = evaluation.decision.state
    if value is None:
        text = "no change"
    elif value == "reset":
        text = f"reset ({evaluation.decision.reason})"
    else:
        text = value
    if state.phase != "idle":
        batches = "batch" if state.batch_count == 1 else "batches"
        text += f"  [{state.failure_count} failures in {state.batch_count} {batches}]"
    elif not evaluation.input_reliable:
        text += "  [input drain unreliable: enforcement off]"
    return text


def _action_text(action: GuardAction | None, evaluation: BatchEvaluation | None) -> str:
    if action is not None and action.kind == "reminder":
        return "host: reminder sent to the model"
    if action is not None and action.kind == "stop":
        return "host: automatic continuation stopped"
    if evaluation is not None and evaluation.decision_value in ("would_warn", "would_stop"):
        return "host: no action (recorded only)"
    return ""


def run_demo(mode: str, out: IO[str], spans_out: IO[str] | None = None) -> GuardReport:
    """Run every session in :data:`SESSIONS` with the guard in ``mode``; print the timeline.

    Returns the report (the same one ``replay`` computes). With ``spans_out``, every span is
    written there as OTLP/JSON lines.
    """
    evaluations: list[BatchEvaluation] = []
    pipeline = GuardPipeline(mode, host=False, listener=evaluations.append)
    guard = pipeline.guard
    recorded = InMemorySpanExporter()
    agents: dict[bool, _Agent] = {}
    providers = []
    for legacy, version in ((False, "2.4.0"), (True, "2.3.1")):
        resource = Resource.create(
            {
                SERVICE_NAME: "demo-agent",
                SERVICE_VERSION: version,
                DEPLOYMENT_ENVIRONMENT_NAME: "demo",
            }
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(guard)
        provider.add_span_processor(SimpleSpanProcessor(recorded))
        providers.append(provider)
        agents[legacy] = _Agent(provider.get_tracer("demo-agent"))

    print(f"otel-guard demo, mode {guard.mode}", file=out)
    for session in SESSIONS:
        agent = agents[session.legacy_host]
        print(f"\n{session.prompt_id}: {session.title}", file=out)
        prompt = agent.prompt(session)
        for number, turn in enumerate(session.turns, start=1):
            seen = len(evaluations)
            agent.batch(prompt, session.prompt_id, turn)
            evaluation = evaluations[-1] if len(evaluations) > seen else None
            action = guard.take_action(session.prompt_id)
            print(f"  batch {number}  {_calls_text(turn.calls)}", file=out)
            line = f"           -> {_decision_text(evaluation)}"
            note = _action_text(action, evaluation)
            print(f"{line}   {note}" if note else line, file=out)
            if action is not None and action.kind == "stop":
                break
        prompt.end()

    for provider in providers:
        provider.shutdown()
    finished = recorded.get_finished_spans()
    for span in finished:
        pipeline.report.count_span(span)
    pipeline.report.traces = len({s.context.trace_id for s in finished if s.context})
    if spans_out is not None:
        _write_by_trace(finished, spans_out)
    report = pipeline.close()
    print("\nsummary", file=out)
    print(report.render_text(), file=out)
    return report


def _write_by_trace(spans: Sequence[ReadableSpan], stream: IO[str]) -> None:
    """One OTLP/JSON line per trace, traces in the order they finished."""
    traces: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.context is not None:
            traces.setdefault(span.context.trace_id, []).append(span)
    exporter = OtlpJsonSpanExporter(stream)
    for trace_spans in traces.values():
        exporter.export(trace_spans)
    exporter.force_flush()
