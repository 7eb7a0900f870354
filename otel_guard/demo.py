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
from typing import IO, TYPE_CHECKING

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes.deployment_attributes import (
    DEPLOYMENT_ENVIRONMENT_NAME,
)
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION
from opentelemetry.trace import Tracer

from otel_guard.guard.processor import BatchEvaluation, GuardAction
from otel_guard.integrations.producer import (
    ExecutionStatus,
    PromptScope,
    TerminalStatus,
    ToolCall,
    ToolType,
    prompt_span,
)
from otel_guard.replay.otlp_json import encode_line
from otel_guard.replay.replayer import GuardPipeline, GuardReport

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["SESSIONS", "Call", "Session", "Turn", "run_demo"]


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call's settled outcome."""

    tool: str
    status: TerminalStatus
    execution: ExecutionStatus
    error_type: str | None = None
    tool_type: ToolType = "native"

    def label(self) -> str:
        if self.status == "success":
            return f"{self.tool} ok"
        if self.status == "cancelled":
            return f"{self.tool} cancelled ({self.execution})"
        return f"{self.tool} {self.status}/{self.error_type}"


def _fail(tool: str, error_type: str, tool_type: ToolType = "native") -> Call:
    return Call(tool, "error", "error", error_type, tool_type)


def _ok(tool: str, tool_type: ToolType = "native") -> Call:
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
    reliable: bool = True  # False: the host could not prove its input drain


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
            Turn((_SHELL,) * 4, reliable=False),
            Turn((_SHELL,) * 4, reliable=False),
            Turn((_SHELL,) * 4),
            Turn((_SHELL,) * 4),
            Turn((_SHELL,) * 4),
        ),
        legacy_host=True,
    ),
)


class _Agent:
    """The span-producing side of the simulated agent.

    Written with :mod:`otel_guard.integrations.producer`.
    """

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self._calls = 0

    def batch(self, prompt: PromptScope, turn: Turn) -> None:
        with prompt.batch() as batch:
            calls = []
            for call in turn.calls:
                self._calls += 1
                call_id = f"call-{self._calls:04d}"
                calls.append((call, batch.start_call(call_id, call.tool, tool_type=call.tool_type)))
            if turn.concurrent:
                # Siblings settle on their own threads, in whatever order the threads finish.
                gate = threading.Barrier(len(calls))

                def settle(item: tuple[Call, ToolCall]) -> None:
                    gate.wait()
                    _settle(*item)

                with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                    list(pool.map(settle, calls))
            else:
                for item in calls:
                    _settle(*item)
            # A legacy host cannot prove its input drain: the guard reads that as unreliable.
            batch.record_input_drain(reliable=turn.reliable)


def _settle(call: Call, tool_call: ToolCall) -> None:
    tool_call.settle(call.execution, call.error_type)
    tool_call.finish(call.status)


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


def run_demo(mode: str, out: SupportsWrite[str], spans_out: IO[str] | None = None) -> GuardReport:
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
        with prompt_span(
            agent.tracer, session.prompt_id, route=session.route, channel=session.channel
        ) as prompt:
            for number, turn in enumerate(session.turns, start=1):
                seen = len(evaluations)
                agent.batch(prompt, turn)
                evaluation = evaluations[-1] if len(evaluations) > seen else None
                action = guard.take_action(session.prompt_id)
                print(f"  batch {number}  {_calls_text(turn.calls)}", file=out)
                line = f"           -> {_decision_text(evaluation)}"
                note = _action_text(action, evaluation)
                print(f"{line}   {note}" if note else line, file=out)
                if action is not None and action.kind == "stop":
                    break

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
    """One OTLP/JSON line per trace, traces in the order they finished; a write error raises
    (an exporter would swallow it, and the file would be left short without a word)."""
    traces: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.context is not None:
            traces.setdefault(span.context.trace_id, []).append(span)
    for trace_spans in traces.values():
        stream.write(encode_line(trace_spans))
    stream.flush()
