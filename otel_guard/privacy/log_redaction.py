"""``RedactingLogExporter``: exports copies of log records with sensitive data removed.

GenAI content lives in log records as much as in spans: the attributes of a
``gen_ai.client.inference.operation.details`` event, the bodies of ``gen_ai.user.message`` and
``gen_ai.choice`` events, any message of Python ``logging`` bridged through ``LoggingHandler``.
Records pass the policy spans pass (:mod:`otel_guard.privacy.sensitive`, applied by a
:class:`~otel_guard.privacy.redaction.RedactingSpanExporter` built with the same arguments), in
``export()``, on the log pipeline's worker thread. The records handed over are never modified.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_guard.guard.telemetry import (
    DIAGNOSTIC_EVENT,
    LOOP_EVENT,
    TRANSITION_EVENT,
    emitted_by_guard,
)
from otel_guard.privacy.redaction import (
    MAX_NESTING,
    REDACTED_SPAN_NAME,
    RedactingSpanExporter,
    _holds,
    _needles,
)
from otel_guard.privacy.sensitive import GENAI_CONTENT_EVENTS, GENAI_EVENT_NAMES, is_genai_key

__all__ = ["GUARD_RECORD_PREFIX", "LOG_BODIES_VARIABLE", "RedactingLogExporter", "log_bodies"]

_logger = logging.getLogger(__name__)

LOG_BODIES_VARIABLE: Final = "OTEL_GUARD_EXPORT_LOG_BODIES"
"""Set to ``true`` to export the bodies of log records that are not GenAI records (default: not
exported). GenAI records never keep their body."""

GUARD_RECORD_PREFIX: Final = "acp.repeated_tool_failure_guard."
"""The prefix of the guard's own event names (with ``acp.loop_detected``). A name only: records
are recognised as the guard's by :func:`~otel_guard.guard.telemetry.emitted_by_guard`."""


def log_bodies(explicit: bool | None = None) -> bool:
    """Whether bodies of non-GenAI records are exported: ``explicit`` when given, else
    :data:`LOG_BODIES_VARIABLE` (``true``/``1``/``yes``, case-insensitive); off otherwise."""
    if explicit is not None:
        return explicit
    return os.environ.get(LOG_BODIES_VARIABLE, "").strip().lower() in ("true", "1", "yes")


class _Discard(SpanExporter):
    """The span policy's delegate: the log exporter only borrows its redaction."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class RedactingLogExporter(LogRecordExporter):
    """Wraps ``delegate`` and hands it redacted copies of the log records it is asked to export.

    * The guard's own records pass with their attributes, body and names unchanged: they carry
      closed vocabularies only (docs/contract.md section 5). They are recognised by the record
      object the guard's telemetry emits
      (:func:`~otel_guard.guard.telemetry.emitted_by_guard`), never by scope or event name, which
      any code can choose: a record named like the guard's (scope ``otel_guard``, event
      ``acp.repeated_tool_failure_guard.*``) by other code is redacted like any other.
    * A **GenAI record** (an event name or attribute key in a GenAI namespace, which includes
      :data:`~otel_guard.privacy.sensitive.GENAI_CONTENT_EVENTS`) keeps only allow-listed
      attributes whose values have their declared shape, and loses its body; its event name is
      kept only when it is one of the conventions' (or the guard's) closed names, else it
      becomes ``redacted``.
    * **Every other record** loses the deny-listed attributes (``exception.message``,
      ``code.file.path``, ...); its body is exported only when ``export_bodies`` (or
      :data:`LOG_BODIES_VARIABLE` when it is None) says so, and a body that is a map loses
      deny-listed keys like the attributes; an event name that holds a removed value becomes
      ``redacted``.
    * Attribute values that are maps (or sequences of maps) are followed: every nested key is
      judged as a top-level key would be, and a nested GenAI key makes a GenAI record, down to
      :data:`~otel_guard.privacy.redaction.MAX_NESTING` levels (deeper maps are dropped).

    Resources lose their sensitive keys on every record, the guard's included; times, severity,
    trace context and scope are kept.
    ``extra_keys``, ``extra_patterns``, ``allow_keys`` and ``pseudonym_key`` are as for
    :class:`RedactingSpanExporter` (give both exporters the same key so tool-name pseudonyms
    agree). ``export()`` never raises: a record that cannot be redacted is dropped and counted in
    :attr:`dropped_records`. ``shutdown()`` and ``force_flush()`` delegate.
    """

    def __init__(
        self,
        delegate: LogRecordExporter,
        *,
        extra_keys: Iterable[str] | None = (),
        extra_patterns: Iterable[str] | None = (),
        allow_keys: Iterable[str] | None = None,
        pseudonym_key: bytes | str | None = None,
        export_bodies: bool | None = None,
    ) -> None:
        self._delegate = delegate
        self._policy = RedactingSpanExporter(
            _Discard(),
            extra_keys=extra_keys,
            extra_patterns=extra_patterns,
            allow_keys=allow_keys,
            pseudonym_key=pseudonym_key,
        )
        self._bodies = log_bodies(export_bodies)
        self._lock = threading.Lock()
        _LIVE.add(self)
        self._dropped_records = 0

    @property
    def delegate(self) -> LogRecordExporter:
        """The exporter that receives the redacted copies."""
        return self._delegate

    @property
    def exports_bodies(self) -> bool:
        """Whether bodies of non-GenAI records are exported."""
        return self._bodies

    @property
    def dropped_records(self) -> int:
        """Records dropped because they could not be redacted."""
        with self._lock:
            return self._dropped_records

    def redact(self, record: ReadableLogRecord) -> ReadableLogRecord:
        """A redacted copy of ``record`` (the original is left untouched); the guard's own
        records keep everything but their resource's sensitive keys."""
        log = record.log_record
        if emitted_by_guard(log):
            # Closed vocabularies only (section 5): the record is kept, its resource is not.
            resource = self._policy.redact_resource(record.resource)
            if resource is record.resource:
                return record
            return ReadableLogRecord(
                log_record=log,
                resource=resource,
                instrumentation_scope=record.instrumentation_scope,
                limits=record.limits,
            )
        attributes = log.attributes or {}
        genai = _is_genai(log.event_name, attributes)
        kept, removed = self._policy.redact_attributes(
            attributes, genai=genai, dropped=record.dropped_attributes
        )
        event_name = log.event_name
        if event_name:
            if genai:
                if event_name not in _GENAI_RECORD_NAMES:
                    event_name = REDACTED_SPAN_NAME
            elif _holds(event_name, _needles(removed)):
                event_name = REDACTED_SPAN_NAME
        body = None if genai or not self._bodies else self._policy.redact_nested(log.body)
        copy = LogRecord(
            timestamp=log.timestamp,
            observed_timestamp=log.observed_timestamp,
            context=log.context,
            severity_text=log.severity_text,
            severity_number=log.severity_number,
            body=body,
            attributes=kept,
            event_name=event_name,
        )
        # The record's own trace fields win over its context, as on the original.
        copy.trace_id, copy.span_id = log.trace_id, log.span_id
        copy.trace_flags = log.trace_flags
        return ReadableLogRecord(
            log_record=copy,
            resource=self._policy.redact_resource(record.resource),
            instrumentation_scope=record.instrumentation_scope,
            limits=record.limits,
        )

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        redacted: list[ReadableLogRecord] = []
        dropped = 0
        for record in batch:
            try:
                redacted.append(self.redact(record))
            except Exception:
                dropped += 1
        if dropped:
            with self._lock:
                self._dropped_records += dropped
            # The count only: the record is what could not be made safe to show.
            _logger.warning(
                "otel_guard: dropped %d log record(s) that could not be redacted", dropped
            )
            if not redacted:
                return LogRecordExportResult.FAILURE
        try:
            return self._delegate.export(redacted)
        except Exception as exc:
            _logger.warning("otel_guard: log export failed (%s)", type(exc).__name__)
            return LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        self._delegate.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._delegate.force_flush(timeout_millis)


def _is_genai(event_name: str | None, attributes: Mapping[str, Any]) -> bool:
    if event_name and (event_name in GENAI_CONTENT_EVENTS or is_genai_key(event_name)):
        return True
    return _holds_genai_key(attributes, 0)


def _holds_genai_key(attributes: Mapping[str, Any], depth: int) -> bool:
    """True when a key of ``attributes``, or of a map inside it (also in a sequence), is in a
    GenAI namespace: ``{"details": {"gen_ai.input.messages": ...}}`` is a GenAI record."""
    nested: list[Mapping[str, Any]] = []
    for key, value in attributes.items():
        if is_genai_key(key):
            return True
        if isinstance(value, Mapping):
            nested.append(value)
        elif isinstance(value, (list, tuple)):
            nested.extend(item for item in value if isinstance(item, Mapping))
    if depth >= MAX_NESTING:
        return False
    return any(_holds_genai_key(inner, depth + 1) for inner in nested)


# Closed names: the conventions', and the guard's (a record named like the guard's by other code
# is a GenAI record by its acp. name, and keeps that name, never its attributes).
_GENAI_RECORD_NAMES: Final = GENAI_EVENT_NAMES | {TRANSITION_EVENT, DIAGNOSTIC_EVENT, LOOP_EVENT}

_LIVE: weakref.WeakSet[RedactingLogExporter] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # The export worker of the parent may have held a lock at the fork; the child's is new.
    for exporter in list(_LIVE):
        exporter._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_after_fork)
