"""Nothing sensitive an agent puts on its spans leaves through the guard or the redacting exporter.

Canary strings go into every place an agent could put sensitive data. Full guard sequences run in
shadow, warn and enforce through real SDK pipelines; then every guard metric point, every log
record, every redacted span, and the protobuf bytes the real OTLP encoders make of them, are
searched for the canaries. The unredacted spans must contain every canary, so a canary that was
never placed cannot make the test pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Any

import pytest
from harness import OK, Call, Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from otel_guard import RedactingSpanExporter
from otel_guard.telemetry import LOOP_EVENT, TRANSITION_EVENT

MODES = ("shadow", "warn", "enforce")


@dataclass(frozen=True)
class Canaries:
    """One canary per sensitive place; each starts with a marker found nowhere else."""

    tool: str
    arguments: str
    result: str
    error_message: str
    status: str
    path: str
    mcp_server: str
    user_id: str
    error_type: str  # free text, as agents put in error.type / the execution error type

    def markers(self) -> Iterator[tuple[str, str]]:
        yield from zip(self.__dataclass_fields__, astuple(self), strict=True)


FIXED = Canaries(
    tool="CnryToolZq-read_secret_notes",
    arguments='CnryArgsZq {"password": "hunter2"}',
    result="CnryResultZq SSN 078-05-1120",
    error_message="CnryErrorZq: permission denied for token sk-live-123",
    status="CnryStatusZq: disk quota exceeded",
    path="CnryPathZq/home/alice/.ssh",
    mcp_server="CnryMcpZq-corp-files",
    user_id="CnryUserZq-alice@example.com",
    error_type="CnryTypeZq Connection reset by peer",
)
MARKER_LENGTH = len("CnryToolZq")

# Hypothesis canaries: a fixed marker (upper case, so never a classified error type) and any text.
_tail = st.text(max_size=16)


def _canary(tag: str) -> st.SearchStrategy[str]:
    return _tail.map(lambda tail: f"Cnry{tag}Zq{tail}")


CANARIES = st.builds(
    Canaries,
    tool=_canary("Tool"),
    arguments=_canary("Args"),
    result=_canary("Result"),
    error_message=_canary("Error"),
    status=_canary("Status"),
    path=_canary("Path"),
    mcp_server=_canary("Mcp"),
    user_id=_canary("User"),
    error_type=_canary("Type"),
)


def _exception(c: Canaries) -> OSError:
    """A real exception whose message and stack trace (its source file) carry canaries."""
    code = compile("def call_tool():\n    raise OSError(message)\n\ncall_tool()\n", c.path, "exec")
    try:
        exec(code, {"message": f"{c.error_message} reading {c.path}"})
    except OSError as exc:
        return exc
    raise AssertionError("the tool did not fail")


def _sensitive_attributes(c: Canaries) -> dict[str, Any]:
    """Every sensitive attribute key an agent may set on a tool-call span."""
    return {
        "gen_ai.tool.call.arguments": c.arguments,
        "gen_ai.tool.call.result": c.result,
        "tool_arguments": c.arguments,
        "function_args": c.arguments,
        "tool_response": c.result,
        "error": c.error_message,
        "error.type": c.error_type,
        "file.path": c.path,
        "mcp.server.name": c.mcp_server,
        "user.id": c.user_id,
        "enduser.id": c.user_id,
    }


class Agent:
    """Drives a :class:`Harness` like an agent whose spans are full of sensitive data."""

    def __init__(self, mode: str, canaries: Canaries) -> None:
        self.h = Harness(mode=mode)
        self.redacted = InMemorySpanExporter()
        self.exporter = RedactingSpanExporter(self.redacted)
        self.h.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.c = canaries
        self.actions: list[str] = []
        self._last_tool: Span | None = None

    def prompt(self, prompt_id: str) -> Span:
        span = self.h.start_prompt(prompt_id)
        span.set_attributes(
            {
                "gen_ai.input.messages": f"[{self.c.arguments}]",
                "gen_ai.output.messages": f"[{self.c.result}]",
                "user.id": self.c.user_id,
            }
        )
        return span

    def batch(
        self, prompt: Span, prompt_id: str, calls: Sequence[Call], leave_open: int = 0
    ) -> list[Span]:
        batch_span = self.h.tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        context = set_span_in_context(batch_span)
        spans = [self._tool(call, context) for call in calls]
        ending = len(spans) - leave_open
        for span in spans[:ending]:
            span.end()
        batch_span.set_attributes(
            {
                "acp.batch.admitted": len(spans),
                "acp.input.external": False,
                "acp.input.queued_prompt": False,
                "acp.input.reliable": True,
            }
        )
        batch_span.end()
        action = self.h.guard.take_action(prompt_id)
        if action is not None:
            self.actions.append(action.kind)
        return spans[ending:]

    def _tool(self, call: Call, context: Any) -> Span:
        c = self.c
        span = self.h.tool_span(call, context)
        span.update_name(f"execute_tool {call.tool}")
        span.set_attributes(_sensitive_attributes(c))
        if self._last_tool is not None:
            span.add_link(self._last_tool.get_span_context(), {"mcp.server.name": c.mcp_server})
        span.add_event("tool.output", {"gen_ai.tool.call.result": c.result, "file.path": c.path})
        if call.status == "error":
            span.record_exception(_exception(c), attributes={"user.id": c.user_id})
            span.set_status(Status(StatusCode.ERROR, f"{c.status} ({c.error_type})"))
        self._last_tool = span
        return span

    def run(self) -> None:
        """Loop, free-text error type, recovery and a late frame, one prompt each."""
        c = self.c
        looping = Call(tool=c.tool, tool_type="mcp")
        a = self.prompt("prompt-loop")
        for _ in range(3):  # tracked, then (would_)warn, then (would_)stop
            self.batch(a, "prompt-loop", [looping] * 4)
        a.end()

        b = self.prompt("prompt-free-text")  # an unclassified error type: reset `unknown`
        self.batch(b, "prompt-free-text", [Call(tool=c.tool, error_type=c.error_type)])
        b.end()

        d = self.prompt("prompt-recovery")  # tracked, then the tool succeeds: reset `success`
        self.batch(d, "prompt-recovery", [looping] * 2)
        self.batch(d, "prompt-recovery", [replace(OK, tool=c.tool)])
        d.end()

        e = self.prompt("prompt-late")  # tracked, then an incomplete batch and a late frame
        self.batch(e, "prompt-late", [looping] * 2)
        (late,) = self.batch(e, "prompt-late", [looping] * 2, leave_open=1)
        late.end()
        e.end()


EXPECTED_DECISIONS = {
    "shadow": {"tracked": 3, "would_warn": 1, "would_stop": 1, "reset": 3},
    "warn": {"tracked": 3, "warned": 1, "would_stop": 1, "reset": 3},
    "enforce": {"tracked": 3, "warned": 1, "stopped": 1, "reset": 3},
}
EXPECTED_ACTIONS = {"shadow": [], "warn": ["reminder"], "enforce": ["reminder", "stop"]}


def _outputs(agent: Agent) -> dict[str, bytes]:
    """Everything that leaves the process, as text and as the OTLP encoders' bytes."""
    h = agent.h
    metrics = h.metric_reader.get_metrics_data()
    assert metrics is not None
    logs = h.logs()
    redacted = agent.redacted.get_finished_spans()
    return {
        "metric data points": repr(
            [(p.attributes, p) for rm in metrics.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics for p in m.data.data_points]  # type: ignore[union-attr]
        ).encode(),
        "metric names": repr(
            [(m.name, m.description, m.unit) for rm in metrics.resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics]
        ).encode(),
        "log attributes and bodies": repr(
            [(r.log_record.event_name, r.log_record.body, dict(r.log_record.attributes or {}))
             for r in logs]
        ).encode(),
        "redacted spans": "\n".join(s.to_json() for s in redacted).encode(),
        "OTLP metrics bytes": encode_metrics(metrics).SerializeToString(),
        "OTLP logs bytes": encode_logs(logs).SerializeToString(),
        "OTLP spans bytes": encode_spans(redacted).SerializeToString(),
    }  # fmt: skip


def _leaks(outputs: dict[str, bytes], canaries: Canaries) -> list[tuple[str, str]]:
    found = []
    for place, value in canaries.markers():
        for needle in {value.encode(), value[:MARKER_LENGTH].encode()}:
            for output, data in outputs.items():
                if needle in data:
                    found.append((place, output))
    return found


def _assert_no_leak(mode: str, canaries: Canaries) -> Agent:
    agent = Agent(mode, canaries)
    agent.run()
    h = agent.h
    # The sequence really ran: every decision of the mode, and the host actions.
    assert h.decision_counts() == EXPECTED_DECISIONS[mode]
    assert agent.actions == EXPECTED_ACTIONS[mode]
    assert h.diagnostic_counts() == {"late_span": 1}
    assert len(h.logs(LOOP_EVENT)) == (1 if mode == "enforce" else 0)
    assert agent.exporter.dropped_spans == 0
    # Every canary was placed: the unredacted spans carry each one.
    raw = encode_spans(h.span_exporter.get_finished_spans()).SerializeToString()
    assert [place for place, value in canaries.markers() if value.encode() not in raw] == []
    assert _leaks(_outputs(agent), canaries) == []
    return agent


@pytest.mark.parametrize("mode", MODES)
def test_no_canary_leaves_through_guard_telemetry_or_redacted_spans(mode: str) -> None:
    _assert_no_leak(mode, FIXED)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(canaries=CANARIES)
def test_no_generated_canary_leaves(mode: str, canaries: Canaries) -> None:
    _assert_no_leak(mode, canaries)


def test_transition_log_carries_the_classified_error_type_only() -> None:
    agent = _assert_no_leak("enforce", FIXED)
    error_types = {
        (r.log_record.attributes or {}).get("execution_error_type")
        for r in agent.h.logs(TRANSITION_EVENT)
    }
    assert error_types == {"exit_nonzero", None}  # None: resets carry no error type


def test_redacted_tool_spans_keep_the_structure_a_backend_needs() -> None:
    agent = _assert_no_leak("enforce", FIXED)
    tools = [s for s in agent.redacted.get_finished_spans() if s.name == "execute_tool"]
    raw_tools = [
        s for s in agent.h.span_exporter.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.operation.name") == "execute_tool"
    ]  # fmt: skip
    assert len(tools) == len(raw_tools) == 4 * 3 + 1 + 2 + 1 + 2 + 2
    first: ReadableSpan = tools[0]
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": "call-1",
        "acp.tool.type": "mcp",
        "acp.tool.status": "error",
        "acp.tool.execution.status": "error",
    }
    assert [(e.name, dict(e.attributes or {})) for e in first.events] == [
        ("tool.output", {}),
        ("exception", {"exception.type": "OSError", "exception.escaped": "False"}),
    ]
    assert (first.status.status_code, first.status.description) == (StatusCode.ERROR, None)
    second = tools[1]
    assert [(lk.context, dict(lk.attributes or {})) for lk in second.links] == [(first.context, {})]
