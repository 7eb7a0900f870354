"""Log records leave the process by the spans' policy: proven on the OTLP bytes a local receiver
gets from ``install_guard()``, with the canaries asserted present before redaction."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from test_wire import Receiver, receiving

from otel_guard import GuardSpanProcessor, RedactingLogExporter, install_guard
from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT, LOOP_EVENT, SCOPE_NAME, TRANSITION_EVENT
from otel_guard.integrations.producer import prompt_span
from otel_guard.privacy.log_redaction import LOG_BODIES_VARIABLE
from otel_guard.privacy.redaction import MAX_NESTING
from otel_guard.privacy.sensitive import GENAI_CONTENT_EVENTS

# One canary per place the review found leaking.
INPUT_MESSAGES = "CnryLogInputZq what is my SSN 078-05-1120"
TOOL_ARGUMENTS = 'CnryLogArgsZq {"path": "/home/alice/.ssh/id_rsa"}'
USER_BODY = "CnryLogUserZq please read my diary"
CHOICE_BODY = "CnryLogChoiceZq here is the diary"
LOGGING_MESSAGE = "CnryLogMessageZq opened /home/alice/secret.txt"
CANARIES = (INPUT_MESSAGES, TOOL_ARGUMENTS, USER_BODY, CHOICE_BODY, LOGGING_MESSAGE)
# What the process resource detector reports about the agent.
SENSITIVE_RESOURCE = Resource(
    {
        "service.name": "agent",
        "process.command_line": "python agent.py --api-key CnryCmdZq",
        "process.command_args": ["python", "CnryArgZq"],
        "process.executable.path": "/home/alice/CnryExeZq/python",
        "process.owner": "CnryOwnerZq",
    }
)
SENSITIVE_RESOURCE_KEYS = frozenset(SENSITIVE_RESOURCE.attributes) - {"service.name"}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv(LOG_BODIES_VARIABLE, raising=False)
    yield from receiving(monkeypatch)


def _emit_genai_content(provider: LoggerProvider) -> None:
    logger = provider.get_logger("opentelemetry.instrumentation.openai_v2")
    logger.emit(
        LogRecord(
            event_name="gen_ai.client.inference.operation.details",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.input.messages": f'[{{"role": "user", "content": "{INPUT_MESSAGES}"}}]',
                "gen_ai.tool.call.arguments": TOOL_ARGUMENTS,
            },
        )
    )
    logger.emit(
        LogRecord(
            event_name="gen_ai.user.message",
            attributes={"gen_ai.system": "openai"},
            body={"content": USER_BODY},
        )
    )
    logger.emit(
        LogRecord(
            event_name="gen_ai.choice",
            attributes={"gen_ai.system": "openai"},
            body={"index": 0, "message": {"content": CHOICE_BODY}},
        )
    )
    app = logging.getLogger("agent.app")
    handler = LoggingHandler(logger_provider=provider)
    app.addHandler(handler)
    app.propagate = False
    try:
        app.warning(LOGGING_MESSAGE)
    finally:
        app.removeHandler(handler)


def _placed(raw: InMemoryLogRecordExporter) -> bytes:
    return encode_logs(raw.get_finished_logs()).SerializeToString()


def test_no_log_canary_reaches_the_otlp_receiver(receiver: Receiver) -> None:
    otel = install_guard(set_global=False)
    raw = InMemoryLogRecordExporter()  # the records as emitted, to prove the canaries were there
    otel.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(raw))
    _emit_genai_content(otel.logger_provider)
    otel.shutdown()
    placed = _placed(raw)
    assert [c for c in CANARIES if c.encode() not in placed] == []
    received = b"".join(receiver.bodies["/v1/logs"])
    assert len(receiver.logs()) >= 1
    assert [c for c in CANARIES if c[:14].encode() in received] == []
    # The records themselves still arrive, with their structure.
    records = [
        r
        for req in receiver.logs()
        for rl in req.resource_logs
        for sl in rl.scope_logs
        for r in sl.log_records
    ]
    names = sorted(r.event_name for r in records)
    assert names == sorted(
        ["gen_ai.client.inference.operation.details", "gen_ai.user.message", "gen_ai.choice", ""]
    )
    details = next(r for r in records if r.event_name.endswith("operation.details"))
    assert {kv.key for kv in details.attributes} == {
        "gen_ai.operation.name",
        "gen_ai.request.model",
    }
    assert all(r.body.WhichOneof("value") is None for r in records)


def test_bodies_of_other_records_are_exported_when_the_operator_opts_in(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_BODIES_VARIABLE, "true")
    otel = install_guard(set_global=False)
    _emit_genai_content(otel.logger_provider)
    otel.shutdown()
    received = b"".join(receiver.bodies["/v1/logs"])
    # The logging message is not a GenAI record: opted in, its body goes; GenAI bodies never do.
    assert LOGGING_MESSAGE.encode() in received
    assert [c for c in CANARIES[:4] if c[:14].encode() in received] == []


def _redact(exporter: RedactingLogExporter, emit: Any, scope: str = "app") -> ReadableLogRecord:
    provider = LoggerProvider()
    out = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    provider.add_log_record_processor(SimpleLogRecordProcessor(out))
    emit(provider.get_logger(scope))
    provider.shutdown()
    (record,) = out.get_finished_logs()
    return exporter.redact(record)


def _guard_loop(
    logger_provider: LoggerProvider, meter_provider: MeterProvider | None = None
) -> None:
    """A real guard in ``enforce`` stopping a loop: transitions, a loop event, a diagnostic."""
    guard = GuardSpanProcessor(
        mode="enforce",
        meter_provider=meter_provider or MeterProvider(),
        logger_provider=logger_provider,
    )
    GuardSpanProcessor(mode="  ", logger_provider=logger_provider).shutdown()  # invalid_mode
    provider = TracerProvider(resource=SENSITIVE_RESOURCE)
    provider.add_span_processor(guard)
    tracer = provider.get_tracer("agent")
    with prompt_span(tracer, "p-1") as prompt:
        for turn in range(4):
            with prompt.batch() as batch:
                for i in range(4):
                    call = batch.start_call(f"c-{turn}-{i}", "run_shell")
                    call.settle("error", "exit_nonzero")
                    call.finish()
                batch.record_input_drain()
            guard.take_action("p-1")
    guard.shutdown()
    provider.shutdown()


def test_the_guards_own_records_keep_their_attributes_and_lose_sensitive_resource_keys() -> None:
    redacted = InMemoryLogRecordExporter()
    raw = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=SENSITIVE_RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(RedactingLogExporter(redacted)))
    provider.add_log_record_processor(SimpleLogRecordProcessor(raw))
    _guard_loop(provider)
    provider.shutdown()
    before, after = raw.get_finished_logs(), redacted.get_finished_logs()
    assert {r.log_record.event_name for r in before} == {
        TRANSITION_EVENT,
        LOOP_EVENT,
        DIAGNOSTIC_EVENT,
    }
    assert [(r.log_record.event_name, dict(r.log_record.attributes or {})) for r in after] == [
        (r.log_record.event_name, dict(r.log_record.attributes or {})) for r in before
    ]
    assert all(set(r.resource.attributes) & SENSITIVE_RESOURCE_KEYS for r in before)
    assert [dict(r.resource.attributes) for r in after] == [{"service.name": "agent"}] * len(after)


def test_records_named_like_the_guards_by_other_code_are_redacted() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter(), export_bodies=True)
    for name in (TRANSITION_EVENT, DIAGNOSTIC_EVENT, LOOP_EVENT):
        redacted = _redact(
            exporter,
            lambda lg, n=name: lg.emit(
                event_name=n,
                body="CnrySpoofBodyZq",
                attributes={
                    "diagnostic": "evicted",
                    "gen_ai.tool.call.arguments": "CnrySpoofArgsZq",
                    "exception.message": "CnrySpoofExcZq",
                },
            ),
            scope=SCOPE_NAME,
        )
        # The scope and event name are the guard's, the record is not: the GenAI policy applies.
        assert dict(redacted.log_record.attributes or {}) == {}, name
        assert redacted.log_record.body is None, name


def test_no_sensitive_resource_key_reaches_the_receiver_on_any_signal(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    otel = install_guard(mode="enforce", resource=SENSITIVE_RESOURCE, set_global=False)
    tracer = otel.tracer_provider.get_tracer("agent")
    with prompt_span(tracer, "p-1") as prompt, prompt.batch() as batch:
        call = batch.start_call("c-1", "run_shell")
        call.settle("error", "exit_nonzero")
        call.finish()
        batch.record_input_drain()
    otel.shutdown()
    received = receiver.all_bytes()
    assert all(received[path] for path in ("/v1/traces", "/v1/logs", "/v1/metrics"))
    assert b"service.name" in received["/v1/metrics"]  # the resource itself is sent
    leaks = [
        (path, marker)
        for path, data in received.items()
        for marker in (b"CnryCmdZq", b"CnryExeZq", b"CnryOwnerZq", b"CnryArgZq")
        if marker in data
    ]
    assert leaks == []


def test_a_record_named_like_the_guards_from_another_scope_is_redacted() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter())
    redacted = _redact(
        exporter,
        lambda lg: lg.emit(
            event_name=TRANSITION_EVENT, attributes={"prompt_id": "p", "message": "secret"}
        ),
    )
    # Its ``acp.`` event name makes it a GenAI record: only allow-listed keys survive.
    assert dict(redacted.log_record.attributes or {}) == {}


def test_other_records_lose_deny_listed_attributes_and_their_body() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter(), export_bodies=False)
    redacted = _redact(
        exporter,
        lambda lg: lg.emit(
            body="secret body",
            severity_number=SeverityNumber.ERROR,
            attributes={"exception.message": "x", "http.route": "/items", "user.id": "alice"},
        ),
    )
    assert dict(redacted.log_record.attributes or {}) == {"http.route": "/items"}
    assert redacted.log_record.body is None
    assert redacted.log_record.severity_number == SeverityNumber.ERROR


def test_every_genai_content_event_loses_its_body() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter(), export_bodies=True)
    for name in sorted(GENAI_CONTENT_EVENTS):
        redacted = _redact(exporter, lambda lg, n=name: lg.emit(event_name=n, body="content"))
        assert redacted.log_record.body is None, name
        assert redacted.log_record.event_name == name


def _exported(exporter: RedactingLogExporter, emit: Any) -> bytes:
    return encode_logs([_redact(exporter, emit)]).SerializeToString()


def test_deny_listed_keys_inside_map_attributes_are_removed() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter())
    attributes = {
        "request": {
            "user.id": "CnryNestedUserZq",
            "file.path": "/home/CnryNestedPathZq",
            "http.route": "/items",
        },
        "steps": [{"exception.stacktrace": "CnryNestedStackZq", "step": 1}, "plain"],
        "deep": {"a": {"b": {"c": {"exception.message": "CnryDeepZq", "count": 2}}}},
    }
    redacted = _redact(exporter, lambda lg: lg.emit(attributes=attributes))
    assert dict(redacted.log_record.attributes or {}) == {
        "request": {"http.route": "/items"},
        "steps": ({"step": 1}, "plain"),  # attributes keep sequences as tuples
        "deep": {"a": {"b": {"c": {"count": 2}}}},
    }
    data = _exported(exporter, lambda lg: lg.emit(attributes=attributes))
    assert b"Cnry" not in data
    assert b"/items" in data


def test_a_genai_key_inside_a_map_makes_a_genai_record() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter(), export_bodies=True)

    def emit(lg: Any) -> None:
        lg.emit(
            body="CnryBodyZq",
            attributes={
                "details": {"gen_ai.input.messages": "CnryNestedPromptZq"},
                "note": "CnryNoteZq",
            },
        )

    redacted = _redact(exporter, emit)
    # Allow-list: neither the map nor the free-text key survives, nor the body.
    assert dict(redacted.log_record.attributes or {}) == {}
    assert redacted.log_record.body is None


def test_maps_nested_deeper_than_the_bound_are_dropped() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter())
    deep: dict[str, Any] = {"exception.message": "CnryTooDeepZq"}
    for _ in range(MAX_NESTING + 1):
        deep = {"level": deep}
    redacted = _redact(exporter, lambda lg: lg.emit(attributes={"deep": deep, "kept": 1}))
    assert b"Cnry" not in encode_logs([redacted]).SerializeToString()
    assert dict(redacted.log_record.attributes or {})["kept"] == 1


def test_an_opted_in_map_body_loses_deny_listed_keys() -> None:
    exporter = RedactingLogExporter(InMemoryLogRecordExporter(), export_bodies=True)
    redacted = _redact(
        exporter,
        lambda lg: lg.emit(body={"exception.stacktrace": "CnryBodyStackZq", "status": "ok"}),
    )
    assert redacted.log_record.body == {"status": "ok"}
