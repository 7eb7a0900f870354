"""The real OTLP/HTTP exporters, wired by ``install_guard``, against a receiver on 127.0.0.1.

The receiver is a standard-library HTTP server started and stopped by each test; it decodes what
arrives with ``opentelemetry-proto``. No canary may be in the received bytes, and the guard's
metrics and logs must carry exactly the names and values of docs/contract.md section 5.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from canaries import EXPECTED_ACTIONS, FIXED, TOOL_SPANS, CanaryAgent, leaks
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import GuardInstallation, install_guard
from otel_guard.guard.telemetry import (
    DECISIONS_METRIC,
    DIAGNOSTIC_EVENT,
    DIAGNOSTICS_METRIC,
    LOOP_EVENT,
    OBSERVATIONS_METRIC,
    SCOPE_NAME,
    TRANSITION_EVENT,
)
from otel_guard.privacy.pseudonym import PSEUDONYM_KEY_ENV, Pseudonymizer

README = Path(__file__).resolve().parent.parent / "README.md"
RESOURCE_ATTRIBUTES = "service.name=wire-agent,service.version=2.0.0,deployment.environment.name=ci"
DEPLOYMENT = {
    "service.name": "wire-agent",
    "service.version": "2.0.0",
    "deployment.environment.name": "ci",
}

_RESPONSES = {
    "/v1/traces": ExportTraceServiceResponse,
    "/v1/metrics": ExportMetricsServiceResponse,
    "/v1/logs": ExportLogsServiceResponse,
}


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1 that keeps every request body it is sent."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {path: [] for path in _RESPONSES}
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                response = _RESPONSES.get(self.path)
                if response is None or self.headers.get("Content-Type") != (
                    "application/x-protobuf"
                ):
                    self.send_response(404)
                    self.end_headers()
                    return
                received[self.path].append(body)
                payload = response().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def all_bytes(self) -> dict[str, bytes]:
        return {path: b"".join(bodies) for path, bodies in self.bodies.items()}

    def traces(self) -> list[ExportTraceServiceRequest]:
        return [ExportTraceServiceRequest.FromString(b) for b in self.bodies["/v1/traces"]]

    def metrics(self) -> list[ExportMetricsServiceRequest]:
        return [ExportMetricsServiceRequest.FromString(b) for b in self.bodies["/v1/metrics"]]

    def logs(self) -> list[ExportLogsServiceRequest]:
        return [ExportLogsServiceRequest.FromString(b) for b in self.bodies["/v1/logs"]]


def receiving(
    monkeypatch: pytest.MonkeyPatch, resource_attributes: str | None = None
) -> Iterator[Receiver]:
    """A started receiver, with the OTLP exporters pointed at it and no other OTLP, resource or
    pseudonym-key setting of the environment in play (but ``resource_attributes``); stopped
    afterwards."""
    server = Receiver()
    server.start()
    for name in list(os.environ):
        if name.startswith(("OTEL_EXPORTER_OTLP_", "OTEL_SERVICE_NAME", "OTEL_RESOURCE")):
            monkeypatch.delenv(name)
    monkeypatch.delenv(PSEUDONYM_KEY_ENV, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.endpoint)
    if resource_attributes is not None:
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", resource_attributes)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    yield from receiving(monkeypatch, RESOURCE_ATTRIBUTES)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _resources(requests: list[Any], field: str) -> list[dict[str, Any]]:
    return [_attributes(r.resource.attributes) for req in requests for r in getattr(req, field)]


def _deployment(resource: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resource.items() if k in DEPLOYMENT}


def _run(mode: str) -> tuple[GuardInstallation, CanaryAgent, InMemorySpanExporter]:
    otel = install_guard(mode=mode, set_global=False)
    raw = InMemorySpanExporter()  # the unredacted spans, to prove the canaries were placed
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(raw))
    agent = CanaryAgent(otel.tracer_provider.get_tracer("agent"), otel.guard, FIXED)
    agent.run()
    otel.shutdown()
    otel.shutdown()  # idempotent
    return otel, agent, raw


def _series(requests: list[ExportMetricsServiceRequest], name: str) -> list[tuple[Any, int]]:
    found: list[tuple[Any, int]] = []
    for request in requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        assert metric.WhichOneof("data") == "sum"
                        assert metric.sum.is_monotonic
                        found.extend(
                            (_attributes(p.attributes), p.as_int) for p in metric.sum.data_points
                        )
    return sorted(found, key=lambda item: sorted(item[0].items()))


def _point(n: int, **attributes: str) -> tuple[dict[str, str], int]:
    base = {"route": "acp_foreground"}
    if attributes["decision"] != "reset":
        base |= {"terminal_status": "error", "execution_status": "error", "tool_type": "mcp"}
    return base | attributes, n


def _t(mode: str, before: str, after: str, decision: str, fc: str, bc: str, **rest: str) -> Any:
    return _point(
        1,
        mode=mode,
        phase_before=before,
        phase_after=after,
        decision=decision,
        failure_count_bucket=fc,
        batch_count_bucket=bc,
        **rest,
    )


def test_received_bytes_hold_no_canary_and_every_signal_arrives(receiver: Receiver) -> None:
    _, agent, raw = _run("enforce")
    assert agent.actions == EXPECTED_ACTIONS["enforce"]
    placed = encode_spans(raw.get_finished_spans()).SerializeToString()
    assert [p for p, v in FIXED.markers() if v.encode() not in placed] == []
    assert all(receiver.bodies[path] for path in ("/v1/traces", "/v1/metrics", "/v1/logs"))
    assert leaks(receiver.all_bytes(), FIXED) == []


def test_received_guard_metrics_carry_exactly_the_spec_names_and_values(
    receiver: Receiver,
) -> None:
    _run("enforce")
    requests = receiver.metrics()
    assert [_deployment(r) for r in _resources(requests, "resource_metrics")] == [DEPLOYMENT]
    guard_metrics = {
        (sm.scope.name, m.name, m.unit)
        for req in requests
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert guard_metrics == {
        (SCOPE_NAME, DECISIONS_METRIC, "{decision}"),
        (SCOPE_NAME, DIAGNOSTICS_METRIC, "{diagnostic}"),
        (SCOPE_NAME, OBSERVATIONS_METRIC, "{call}"),
    }
    expected = [
        _t("enforce", "idle", "tracking", "tracked", "3-4", "1"),
        _t("enforce", "tracking", "warned", "warned", "8+", "2"),
        _t("enforce", "warned", "latched", "stopped", "8+", "3+"),
        _t("warn", "idle", "idle", "reset", "0", "0", reset_reason="unknown"),
        _point(
            2,
            mode="enforce",
            phase_before="idle",
            phase_after="tracking",
            decision="tracked",
            failure_count_bucket="1-2",
            batch_count_bucket="1",
        ),
        _t("enforce", "tracking", "idle", "reset", "1-2", "1", reset_reason="success"),
        _t("enforce", "tracking", "idle", "reset", "1-2", "1", reset_reason="incomplete"),
    ]
    assert _series(requests, DECISIONS_METRIC) == sorted(
        expected, key=lambda item: sorted(item[0].items())
    )
    assert _series(requests, DIAGNOSTICS_METRIC) == [({"diagnostic": "late_span"}, 1)]
    # Every settled call of an evaluated batch: 3x4 looping, 1 free-text, 2 failing and 1
    # succeeding on recovery, 2 + 1 on the late prompt (its late frame is not an observation).
    assert _series(requests, OBSERVATIONS_METRIC) == [
        ({"execution_status": "error", "tool_type": "mcp"}, 18),
        ({"execution_status": "success", "tool_type": "mcp"}, 1),
    ]


def test_received_guard_logs_carry_exactly_the_spec_names_and_values(
    receiver: Receiver,
) -> None:
    _run("enforce")
    records = [
        (sl.scope.name, lr)
        for req in receiver.logs()
        for rl in req.resource_logs
        for sl in rl.scope_logs
        for lr in sl.log_records
    ]
    assert {scope for scope, _ in records} == {SCOPE_NAME}
    logs = [lr for _, lr in records]
    transitions = [
        (lr.severity_text, lr.severity_number, _attributes(lr.attributes))
        for lr in logs
        if lr.event_name == TRANSITION_EVENT
    ]
    common = {"route": "acp_foreground"}
    failing = {"terminal_status": "error", "execution_status": "error", "tool_type": "mcp"}

    def record(prompt: str, ordinal: int, **attributes: str) -> tuple[str, int, dict[str, Any]]:
        extra: dict[str, Any] = {}
        if attributes["decision"] != "reset":
            extra = failing | {"execution_error_type": "exit_nonzero"}
        attrs = common | attributes | extra | {"prompt_id": prompt, "candidate_ordinal": ordinal}
        return ("INFO", 9, attrs)

    def buckets(fc: str, bc: str) -> dict[str, str]:
        return {"failure_count_bucket": fc, "batch_count_bucket": bc}

    tracked = {"mode": "enforce", "phase_before": "idle", "phase_after": "tracking"}
    tracked |= {"decision": "tracked"}
    reset = {"mode": "enforce", "phase_before": "tracking", "phase_after": "idle"}
    reset |= {"decision": "reset"}
    assert transitions == [
        record("prompt-loop", 1, **tracked, **buckets("3-4", "1")),
        record(
            "prompt-loop",
            1,
            mode="enforce",
            phase_before="tracking",
            phase_after="warned",
            decision="warned",
            **buckets("8+", "2"),
        ),
        record(
            "prompt-loop",
            1,
            mode="enforce",
            phase_before="warned",
            phase_after="latched",
            decision="stopped",
            **buckets("8+", "3+"),
        ),
        record(
            "prompt-free-text",
            0,
            mode="warn",
            phase_before="idle",
            phase_after="idle",
            decision="reset",
            reset_reason="unknown",
            **buckets("0", "0"),
        ),
        record("prompt-recovery", 1, **tracked, **buckets("1-2", "1")),
        record("prompt-recovery", 1, **reset, reset_reason="success", **buckets("1-2", "1")),
        record("prompt-late", 1, **tracked, **buckets("1-2", "1")),
        record("prompt-late", 1, **reset, reset_reason="incomplete", **buckets("1-2", "1")),
    ]
    loops = [_attributes(lr.attributes) for lr in logs if lr.event_name == LOOP_EVENT]
    assert loops == [{"loop_type": "repeated_tool_execution_failure", "prompt_id": "prompt-loop"}]
    diagnostics = [_attributes(lr.attributes) for lr in logs if lr.event_name == DIAGNOSTIC_EVENT]
    assert diagnostics == [{"diagnostic": "late_span", "prompt_id": "prompt-late"}]
    assert {lr.event_name for lr in logs} == {TRANSITION_EVENT, LOOP_EVENT, DIAGNOSTIC_EVENT}
    assert [_value(lr.body) for lr in logs] == [None] * len(logs)


def test_every_transition_log_joins_its_settled_batch_span(receiver: Receiver) -> None:
    _run("shadow")
    batch_spans = {
        (span.trace_id, span.span_id)
        for req in receiver.traces()
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == "tool_batch"
    }
    transition_contexts = [
        (lr.trace_id, lr.span_id)
        for req in receiver.logs()
        for rl in req.resource_logs
        for sl in rl.scope_logs
        for lr in sl.log_records
        if lr.event_name == TRANSITION_EVENT
    ]
    assert len(transition_contexts) == 8
    assert set(transition_contexts) <= batch_spans


def test_received_spans_are_redacted_copies_with_the_resource_from_the_environment(
    receiver: Receiver,
) -> None:
    _run("warn")
    spans = [
        span
        for req in receiver.traces()
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    tools = [s for s in spans if s.name == "execute_tool"]
    assert len(tools) == TOOL_SPANS
    pseudonym = Pseudonymizer()  # install_guard's exporter uses the process's own key
    assert _attributes(tools[0].attributes) == {
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
    assert tools[0].status.message == ""
    assert [_deployment(r) for r in _resources(receiver.traces(), "resource_spans")] == [DEPLOYMENT]


def test_unsupported_protocol_in_the_environment_falls_back_to_http(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    _run("shadow")
    assert receiver.bodies["/v1/traces"] and receiver.bodies["/v1/logs"]


def test_grpc_is_used_when_the_environment_asks_for_it(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    otel = install_guard(set_global=False)
    assert isinstance(otel.span_exporter.delegate, OTLPSpanExporter)
    otel.shutdown()  # nothing was recorded, so nothing is sent


def test_an_unsupported_protocol_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported OTLP protocol 'http/json'"):
        install_guard(protocol="http/json", set_global=False)


def test_readme_setup_example_runs_as_a_script_against_the_receiver(receiver: Receiver) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "install_guard(" in b]
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", example], env=env, check=True, timeout=60)
    names = [
        span.name
        for req in receiver.traces()
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert names == ["invoke_agent"]
    (resource,) = _resources(receiver.traces(), "resource_spans")
    assert resource["service.name"] == "wire-agent"
