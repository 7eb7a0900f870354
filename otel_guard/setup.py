"""Ready-made wiring: the guard, OTLP exporters and span redaction in one call.

Endpoints, headers, timeouts, compression, TLS files and metric temporality come from the standard
``OTEL_EXPORTER_OTLP_*`` environment variables, read by the exporters themselves; the resource
comes from ``Resource.create()``, which reads ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_SERVICE_NAME``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Final, Literal, cast

from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from otel_guard.dispatch import guarded_tracer_provider
from otel_guard.processor import GuardSpanProcessor
from otel_guard.redaction import RedactingSpanExporter

__all__ = ["DEFAULT_PROTOCOL", "PROTOCOLS", "GuardInstallation", "OTLPProtocol", "install_guard"]

_logger = logging.getLogger(__name__)

OTLPProtocol = Literal["http/protobuf", "grpc"]
PROTOCOLS: Final[tuple[OTLPProtocol, ...]] = ("http/protobuf", "grpc")
DEFAULT_PROTOCOL: Final[OTLPProtocol] = "http/protobuf"
"""The OTLP protocol used when neither the argument nor the environment names one."""

Signal = Literal["traces", "metrics", "logs"]
_PROTOCOL_VARIABLES: Final[dict[Signal, str]] = {
    "traces": OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    "metrics": OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    "logs": OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
}


class GuardInstallation:
    """What :func:`install_guard` built: the guard, the three providers and the span exporter."""

    __slots__ = (
        "_lock",
        "_shutdown",
        "guard",
        "logger_provider",
        "meter_provider",
        "span_exporter",
        "tracer_provider",
    )

    def __init__(
        self,
        guard: GuardSpanProcessor,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        logger_provider: LoggerProvider,
        span_exporter: RedactingSpanExporter,
    ) -> None:
        self.guard = guard
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.logger_provider = logger_provider
        self.span_exporter = span_exporter
        self._lock = threading.Lock()
        self._shutdown = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything buffered in the three pipelines; False if any did not finish."""
        spans = self.tracer_provider.force_flush(timeout_millis)
        logs = self.logger_provider.force_flush(timeout_millis)
        points = self.meter_provider.force_flush(timeout_millis)
        return spans and logs and points

    def shutdown(self) -> None:
        """Flush and shut down traces, then logs, then metrics. Idempotent.

        Traces go first so that guard records produced by the last span ends are still exported
        by the log and metric pipelines.
        """
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()


def install_guard(
    *,
    mode: str | None = None,
    resource: Resource | None = None,
    protocol: str | None = None,
    extra_keys: Iterable[str] = (),
    extra_patterns: Iterable[str] = (),
    allow_keys: Iterable[str] | None = None,
    pseudonym_key: bytes | str | None = None,
    set_global: bool = True,
    fused_dispatch: bool = True,
) -> GuardInstallation:
    """Build tracer, meter and logger providers that export over OTLP, with the guard installed.

    * Spans go through a :class:`GuardSpanProcessor` (``mode`` as for it: the environment decides
      when omitted) and a ``BatchSpanProcessor`` whose exporter is a
      :class:`RedactingSpanExporter` (``extra_keys``, ``extra_patterns``, ``allow_keys``,
      ``pseudonym_key`` as for it) around the OTLP span exporter.
    * Guard metrics go through a ``PeriodicExportingMetricReader`` (interval from
      ``OTEL_METRIC_EXPORT_INTERVAL``) to the OTLP metric exporter; guard logs through a
      ``BatchLogRecordProcessor`` to the OTLP log exporter.
    * ``resource`` defaults to ``Resource.create()`` (``OTEL_RESOURCE_ATTRIBUTES``,
      ``OTEL_SERVICE_NAME``).
    * ``protocol`` is ``http/protobuf`` or ``grpc``; when omitted each signal reads
      ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then uses
      :data:`DEFAULT_PROTOCOL`. An unsupported value in the environment is logged and replaced by
      the default (telemetry settings never stop the agent); an unsupported argument raises
      ``ValueError``.
    * ``set_global`` also makes the three providers the process-wide ones, so instrumentation
      that calls ``trace.get_tracer()`` reaches the guard.
    * ``fused_dispatch`` dispatches the tracer provider's processors through
      :class:`otel_guard.dispatch.GuardFirstSpanProcessor`: spans that are not the guard's skip
      its hooks; the other processors are called as before.

    Call :meth:`GuardInstallation.shutdown` before the process exits to export what is buffered.
    """
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unsupported OTLP protocol {protocol!r}; use one of {PROTOCOLS}")
    if resource is None:
        resource = Resource.create()

    metric_reader = PeriodicExportingMetricReader(_metric_exporter(_protocol("metrics", protocol)))
    meter_provider = MeterProvider(resource=resource, metric_readers=[metric_reader])
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(_log_exporter(_protocol("logs", protocol)))
    )
    guard = GuardSpanProcessor(
        mode=mode, meter_provider=meter_provider, logger_provider=logger_provider
    )
    span_exporter = RedactingSpanExporter(
        _span_exporter(_protocol("traces", protocol)),
        extra_keys=extra_keys,
        extra_patterns=extra_patterns,
        allow_keys=allow_keys,
        pseudonym_key=pseudonym_key,
    )
    tracer_provider = guarded_tracer_provider(guard, resource=resource, fused=fused_dispatch)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        _logs.set_logger_provider(logger_provider)
    return GuardInstallation(guard, tracer_provider, meter_provider, logger_provider, span_exporter)


def _protocol(signal: Signal, explicit: str | None) -> OTLPProtocol:
    if explicit is not None:
        return cast(OTLPProtocol, explicit)
    for variable in (_PROTOCOL_VARIABLES[signal], OTEL_EXPORTER_OTLP_PROTOCOL):
        value = os.environ.get(variable, "").strip().lower()
        if not value:
            continue
        if value in PROTOCOLS:
            return value
        _logger.warning(
            "otel_guard: %s=%r is not supported (use %s); using %s",
            variable,
            value,
            " or ".join(PROTOCOLS),
            DEFAULT_PROTOCOL,
        )
        break
    return DEFAULT_PROTOCOL


# Exporters are imported on use: the gRPC ones pull in grpcio, which an http deployment never needs.


def _span_exporter(protocol: OTLPProtocol) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HTTPSpanExporter,
    )

    return HTTPSpanExporter()


def _metric_exporter(protocol: OTLPProtocol) -> MetricExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )

    return HTTPMetricExporter()


def _log_exporter(protocol: OTLPProtocol) -> LogRecordExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HTTPLogExporter,
    )

    return HTTPLogExporter()
