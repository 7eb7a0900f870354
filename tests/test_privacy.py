"""Nothing sensitive an agent puts on its spans leaves through the guard or the redacting exporter.

Canary strings go into every place an agent could put sensitive data. Full guard sequences run in
shadow, warn and enforce through real SDK pipelines; then every guard metric point, every log
record, every redacted span, and the protobuf bytes the real OTLP encoders make of them, are
searched for the canaries. The unredacted spans must contain every canary, so a canary that was
never placed cannot make the test pass.
"""

from __future__ import annotations

import pytest
from canaries import (
    CANARIES,
    EXPECTED_ACTIONS,
    EXPECTED_DECISIONS,
    FIXED,
    TOOL_SPANS,
    Canaries,
    CanaryAgent,
    leaks,
)
from harness import Harness
from hypothesis import HealthCheck, given, settings
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_guard import RedactingSpanExporter
from otel_guard.guard.telemetry import LOOP_EVENT, TRANSITION_EVENT
from otel_guard.privacy.pseudonym import Pseudonymizer

MODES = ("shadow", "warn", "enforce")


class Agent:
    """A :class:`Harness` pipeline plus a redacting exporter, driven by a :class:`CanaryAgent`."""

    def __init__(self, mode: str, canaries: Canaries) -> None:
        self.h = Harness(mode=mode)
        self.redacted = InMemorySpanExporter()
        self.exporter = RedactingSpanExporter(self.redacted)
        self.h.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.agent = CanaryAgent(self.h.tracer, self.h.guard, canaries)

    def run(self) -> None:
        self.agent.run()


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


def _assert_no_leak(mode: str, canaries: Canaries) -> Agent:
    agent = Agent(mode, canaries)
    agent.run()
    h = agent.h
    # The sequence really ran: every decision of the mode, and the host actions.
    assert h.decision_counts() == EXPECTED_DECISIONS[mode]
    assert agent.agent.actions == EXPECTED_ACTIONS[mode]
    assert h.diagnostic_counts() == {"late_span": 1}
    assert len(h.logs(LOOP_EVENT)) == (1 if mode == "enforce" else 0)
    assert agent.exporter.dropped_spans == 0
    # Every canary was placed: the unredacted spans carry each one.
    raw = encode_spans(h.span_exporter.get_finished_spans()).SerializeToString()
    assert [place for place, value in canaries.markers() if value.encode() not in raw] == []
    assert leaks(_outputs(agent), canaries) == []
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
    assert len(tools) == len(raw_tools) == TOOL_SPANS
    first: ReadableSpan = tools[0]
    # The process's own pseudonym key: the tool and server are pseudonyms, the free-text error
    # type is `_OTHER`, the classified execution error type is kept, for replay.
    pseudonym = Pseudonymizer()
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": pseudonym(FIXED.tool),
        "gen_ai.tool.call.id": "call-1",
        "acp.tool.type": "mcp",
        "acp.tool.status": "error",
        "acp.tool.execution.status": "error",
        "acp.tool.execution.error_type": "exit_nonzero",
        "error.type": "_OTHER",
        "mcp.server.name": pseudonym(FIXED.mcp_server, "mcp_"),
    }
    assert [(e.name, dict(e.attributes or {})) for e in first.events] == [
        ("redacted", {}),  # not a closed name of the conventions
        ("exception", {"exception.type": "OSError", "exception.escaped": "False"}),
    ]
    assert (first.status.status_code, first.status.description) == (StatusCode.ERROR, None)
    second = tools[1]
    assert [(lk.context, dict(lk.attributes or {})) for lk in second.links] == [
        (first.context, {"mcp.server.name": pseudonym(FIXED.mcp_server, "mcp_")})
    ]
