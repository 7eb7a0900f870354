"""Ready-made wiring: the guard, OTLP exporters and span redaction in one call.

Endpoints, headers, timeouts, compression, TLS files and metric temporality come from the standard
``OTEL_EXPORTER_OTLP_*`` environment variables, read by the exporters themselves; the resource
comes from ``Resource.create()``, which reads ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_SERVICE_NAME``; which exporters run comes from ``OTEL_TRACES_EXPORTER``,
``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER`` (``otlp``, ``console``, ``none``).

In a process whose global SDK providers are already set (by ``opentelemetry-instrument``, a
distro or the host's own setup), :func:`install_guard` joins them instead of building its own:
see its docstring.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Literal, cast

from opentelemetry import _logs, metrics, trace
from opentelemetry._logs import _internal as _logs_internal
from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    ConsoleLogRecordExporter,
    LogRecordExporter,
)
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.util._once import Once

from otel_guard.guard.dispatch import guarded_tracer_provider
from otel_guard.guard.mode import resolve_mode
from otel_guard.guard.processor import GuardSpanProcessor
from otel_guard.privacy.log_redaction import RedactingLogExporter, _Discard
from otel_guard.privacy.metric_redaction import RedactingMetricExporter
from otel_guard.privacy.redaction import RedactingSpanExporter, _names

__all__ = [
    "DEFAULT_PROTOCOL",
    "EXPORTERS",
    "PROTOCOLS",
    "GuardInstallation",
    "OTLPProtocol",
    "install_guard",
    "sdk_disabled",
]

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
_EXPORTER_VARIABLES: Final[dict[Signal, str]] = {
    "traces": OTEL_TRACES_EXPORTER,
    "metrics": OTEL_METRICS_EXPORTER,
    "logs": OTEL_LOGS_EXPORTER,
}
Exporter = Literal["otlp", "console"]
EXPORTERS: Final = ("otlp", "console", "none")
"""Values of ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` that :func:`install_guard` honours (comma
separated; unset means ``otlp``)."""


class GuardInstallation:
    """What :func:`install_guard` built or joined: the guard, the three providers, and the
    redacting span exporter of the export path it owns (``None`` when it owns none).

    ``joined`` names the signals whose provider was already set and was joined, not built.
    """

    __slots__ = (
        "_lock",
        "_owned_processors",
        "_shutdown",
        "guard",
        "joined",
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
        span_exporter: RedactingSpanExporter | None,
        *,
        joined: frozenset[Signal] = frozenset(),
        owned_processors: Sequence[SpanProcessor] = (),
    ) -> None:
        self.guard = guard
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.logger_provider = logger_provider
        self.span_exporter = span_exporter
        self.joined = joined
        self._owned_processors = tuple(owned_processors)
        self._lock = threading.Lock()
        self._shutdown = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what the three pipelines buffered when called, traces first (their end hands
        the guard's last records to the logs), within ``timeout_millis`` in all; False if any
        did not finish in time.

        The SDK's batch processors export until their queue is empty whatever the timeout, so
        with agent threads still producing (or an exporter that hangs) their flush may not end:
        each runs on a helper thread, waited for until the deadline, and left to finish there.
        """
        deadline = time.monotonic() + max(0, timeout_millis) / 1000
        return all(
            _flush_within(provider.force_flush, deadline)
            for provider in (self.tracer_provider, self.logger_provider, self.meter_provider)
        )

    def shutdown(self) -> None:
        """Flush and shut down traces, then logs, then metrics. Idempotent.

        Traces go first so that guard records produced by the last span ends are still exported
        by the log and metric pipelines.
        """
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
        # A joined provider belongs to the host: only what was added to it is shut down here.
        if "traces" in self.joined:
            self.tracer_provider.force_flush()
            for processor in self._owned_processors:
                processor.shutdown()
        else:
            self.tracer_provider.shutdown()
        if "logs" in self.joined:
            self.logger_provider.force_flush()
        else:
            self.logger_provider.shutdown()
        if "metrics" in self.joined:
            self.meter_provider.force_flush()
        else:
            self.meter_provider.shutdown()


# The installation on each global tracer provider: a second call returns it. Only global
# providers are entered, and those live as long as the process.
_INSTALLED: weakref.WeakKeyDictionary[TracerProvider, GuardInstallation] = (
    weakref.WeakKeyDictionary()
)
_INSTALL_LOCK = threading.RLock()


def install_guard(
    *,
    mode: str | None = None,
    resource: Resource | None = None,
    protocol: str | None = None,
    extra_keys: Iterable[str] | None = (),
    extra_patterns: Iterable[str] | None = (),
    allow_keys: Iterable[str] | None = None,
    pseudonym_key: bytes | str | None = None,
    set_global: bool = True,
    span_processors: Iterable[SpanProcessor] | None = (),
    metric_readers: Iterable[MetricReader] | None = (),
    export_spans: bool | None = None,
    fused_dispatch: bool = True,
    export_log_bodies: bool | None = None,
) -> GuardInstallation | None:
    """Install the guard with exporters, in a fresh process or one whose SDK is already set up.

    * Spans go through a :class:`GuardSpanProcessor` (``mode`` as for it: the environment decides
      when omitted), then ``span_processors``, then the export path the guard owns: one
      ``BatchSpanProcessor`` per exporter named by ``OTEL_TRACES_EXPORTER`` (``otlp`` when unset,
      ``console``, ``none``), each behind a :class:`RedactingSpanExporter` (``extra_keys``,
      ``extra_patterns``, ``allow_keys``, ``pseudonym_key`` as for it).
    * Guard metrics go through a ``PeriodicExportingMetricReader`` (interval from
      ``OTEL_METRIC_EXPORT_INTERVAL``) per exporter of ``OTEL_METRICS_EXPORTER``, and through
      ``metric_readers`` (a Prometheus reader, say); log records (the guard's and any other
      the logger provider carries) through a ``BatchLogRecordProcessor`` per exporter of
      ``OTEL_LOGS_EXPORTER``, each behind a :class:`RedactingLogExporter` with the spans' policy.
      Bodies of records that are not GenAI records are exported only with
      ``export_log_bodies=True`` (None: the ``OTEL_GUARD_EXPORT_LOG_BODIES`` variable decides;
      off when unset). A joined ``LoggerProvider`` keeps its own log export, unredacted by the
      guard, with a warning.
    * ``resource`` defaults to ``Resource.create()`` (``OTEL_RESOURCE_ATTRIBUTES``,
      ``OTEL_SERVICE_NAME``).
    * ``protocol`` is ``http/protobuf`` or ``grpc``; when omitted each signal reads
      ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then uses
      :data:`DEFAULT_PROTOCOL`. An unsupported value in the environment is logged and replaced by
      the default (telemetry settings never stop the agent); an unsupported argument raises
      ``ValueError``.
    * ``set_global`` makes the providers the process-wide ones, so instrumentation that calls
      ``trace.get_tracer()`` reaches the guard. A global SDK provider that is already set is
      **joined** instead: the guard (and ``span_processors``) are added to the existing
      ``TracerProvider``, and the existing meter and logger providers carry the guard's
      telemetry. On a joined ``TracerProvider`` the guard adds its own redacting export path
      only if the provider exports nothing yet (``export_spans`` overrides: ``True`` always,
      ``False`` never), so spans are not exported twice; otherwise a warning says that the
      host's existing span export is not redacted by the guard. Metric readers cannot be added
      to an existing ``MeterProvider``: given ``metric_readers`` are then not used, with a
      warning. A no-op global provider is replaced. Any other global provider that is not the
      SDK's can be neither joined nor replaced: a warning says so, and the guard sees only the
      spans of the returned ``tracer_provider``.
    * ``fused_dispatch`` dispatches a new tracer provider's processors through
      :class:`otel_guard.guard.dispatch.GuardFirstSpanProcessor`: spans that are not the
      guard's skip its hooks; the other processors are called as before. A joined provider keeps
      its own dispatch.

    * ``OTEL_SDK_DISABLED=true`` (case-insensitive) is honoured: nothing is built, no global
      provider is set, no guard runs, and the return value is None.
    * **Once per provider.** With ``set_global`` (the default), a call made when the global
      ``TracerProvider`` already carries a guard that ``install_guard`` (or the zero-code start)
      put there returns that installation, builds and adds nothing, and ignores its own
      arguments (a warning says so when its ``mode`` differs from the installed guard's). After
      that installation's ``shutdown()`` a call installs anew. With ``set_global=False`` every
      call builds its own providers, so no provider ever carries two guards.
    * Every signal's export loses the resource's sensitive keys (process command line,
      arguments, executable path, owner...): spans and log records through their redacting
      exporters, metrics through a :class:`RedactingMetricExporter`; a ``MeterProvider`` built
      here is given the redacted resource itself, so ``metric_readers`` (a Prometheus reader's
      ``target_info``) see no more.
    * Arguments: None is accepted for ``extra_keys``, ``extra_patterns``, ``span_processors``
      and ``metric_readers`` (nothing given). A pattern of ``extra_patterns`` that is not a
      valid regular expression raises ``ValueError``, and a ``pseudonym_key`` that is neither
      bytes nor text ``TypeError``, before anything is built: they are the host's own
      configuration and a guard that silently redacted less would be worse. ``mode`` never
      raises (an invalid one gives ``shadow`` and the ``invalid_mode`` diagnostic). Unusable
      ``OTEL_BSP_*`` values are logged and the SDK's defaults used, like other environment
      settings.

    Call :meth:`GuardInstallation.shutdown` before the process exits to export what is buffered.
    """
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unsupported OTLP protocol {protocol!r}; use one of {PROTOCOLS}")
    # Read once: every exporter gets the same names, even from a one-shot iterator.
    extra_keys = _names(extra_keys)
    extra_patterns = _names(extra_patterns)
    allow_keys = None if allow_keys is None else _names(allow_keys)
    # Checks the arguments (patterns, key) before anything is built, and redacts resources.
    policy = RedactingSpanExporter(
        _Discard(),
        extra_keys=extra_keys,
        extra_patterns=extra_patterns,
        allow_keys=allow_keys,
        pseudonym_key=pseudonym_key,
    )
    if sdk_disabled():
        _logger.info("otel_guard: %s is true; no guard or provider installed", OTEL_SDK_DISABLED)
        return None
    install = functools.partial(
        _install,
        mode=mode,
        resource=resource,
        protocol=protocol,
        extra_keys=extra_keys,
        extra_patterns=extra_patterns,
        allow_keys=allow_keys,
        pseudonym_key=pseudonym_key,
        set_global=set_global,
        span_processors=span_processors,
        metric_readers=metric_readers,
        export_spans=export_spans,
        fused_dispatch=fused_dispatch,
        export_log_bodies=export_log_bodies,
        policy=policy,
    )
    if not set_global:
        return install()
    with _INSTALL_LOCK:
        existing = trace.get_tracer_provider()
        installed = _INSTALLED.get(existing) if isinstance(existing, TracerProvider) else None
        if installed is not None and not installed._shutdown:
            _already_installed(installed, mode)
            return installed
        installation = install()
        if trace.get_tracer_provider() is installation.tracer_provider:
            _INSTALLED[installation.tracer_provider] = installation
        return installation


def _already_installed(installed: GuardInstallation, mode: object) -> None:
    if mode is not None and resolve_mode(mode).mode != installed.guard.mode:
        _logger.warning(
            "otel_guard: a guard is already installed on the global providers (mode %s); this "
            "call returns it and its arguments, mode included, are not applied (shut the "
            "installation down first to install anew)",
            installed.guard.mode,
        )
    else:
        _logger.info("otel_guard: a guard is already installed on the global providers")


def _install(
    *,
    mode: str | None,
    resource: Resource | None,
    protocol: str | None,
    extra_keys: tuple[str, ...],
    extra_patterns: tuple[str, ...],
    allow_keys: tuple[str, ...] | None,
    pseudonym_key: bytes | str | None,
    set_global: bool,
    span_processors: Iterable[SpanProcessor] | None,
    metric_readers: Iterable[MetricReader] | None,
    export_spans: bool | None,
    fused_dispatch: bool,
    export_log_bodies: bool | None,
    policy: RedactingSpanExporter,
) -> GuardInstallation:
    if resource is None:
        resource = Resource.create()
    readers = list(metric_readers or ())
    joined: set[Signal] = set()

    existing_meters = metrics.get_meter_provider() if set_global else None
    if isinstance(existing_meters, MeterProvider):
        meter_provider = existing_meters
        joined.add("metrics")
        if readers:
            _logger.warning(
                "otel_guard: the global MeterProvider is already set and takes no new metric "
                "readers; %d given reader(s) are not used (add them where it is built)",
                len(readers),
            )
    else:
        for name in _exporter_names("metrics"):
            readers.append(
                PeriodicExportingMetricReader(
                    RedactingMetricExporter(
                        _metric_exporter(name, _protocol("metrics", protocol)),
                        extra_keys=extra_keys,
                        extra_patterns=extra_patterns,
                    )
                )
            )
        meter_provider = MeterProvider(
            resource=policy.redact_resource(resource), metric_readers=readers
        )

    existing_loggers = _logs.get_logger_provider() if set_global else None
    if isinstance(existing_loggers, LoggerProvider):
        logger_provider = existing_loggers
        joined.add("logs")
        _logger.warning(
            "otel_guard: joined the global LoggerProvider that is already set; its existing log "
            "export is not redacted by the guard (wrap its exporters in RedactingLogExporter, "
            "or start with OTEL_PYTHON_DISTRO=otel_guard)"
        )
    else:
        logger_provider = LoggerProvider(resource=resource)
        for name in _exporter_names("logs"):
            logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(
                    RedactingLogExporter(
                        _log_exporter(name, _protocol("logs", protocol)),
                        extra_keys=extra_keys,
                        extra_patterns=extra_patterns,
                        allow_keys=allow_keys,
                        pseudonym_key=pseudonym_key,
                        export_bodies=export_log_bodies,
                    )
                )
            )

    guard = GuardSpanProcessor(
        mode=mode, meter_provider=meter_provider, logger_provider=logger_provider
    )
    existing_tracers = trace.get_tracer_provider() if set_global else None
    if isinstance(existing_tracers, TracerProvider):
        tracer_provider = existing_tracers
        joined.add("traces")
        exports_already = _has_span_processors(tracer_provider)
        own_path = not exports_already if export_spans is None else export_spans
        if exports_already and not own_path:
            _logger.warning(
                "otel_guard: joined the global TracerProvider that is already set; the guard "
                "watches its spans, but its existing span export is not redacted by the guard "
                "(set OTEL_TRACES_EXPORTER=none there and let install_guard export, or start "
                "with OTEL_PYTHON_DISTRO=otel_guard)"
            )
    else:
        # The guard comes first, with fused dispatch when asked: it is added here.
        tracer_provider = guarded_tracer_provider(guard, resource=resource, fused=fused_dispatch)
        own_path = True if export_spans is None else export_spans
    owned: list[SpanProcessor] = [guard, *(span_processors or ())]
    span_exporter: RedactingSpanExporter | None = None
    if own_path:
        for name in _exporter_names("traces"):
            redacting = RedactingSpanExporter(
                _span_exporter(name, _protocol("traces", protocol)),
                extra_keys=extra_keys,
                extra_patterns=extra_patterns,
                allow_keys=allow_keys,
                pseudonym_key=pseudonym_key,
            )
            span_exporter = span_exporter or redacting
            owned.append(_batch_span_processor(redacting))
    for processor in owned:
        if processor is not guard or "traces" in joined:
            tracer_provider.add_span_processor(processor)

    if set_global:
        if "traces" not in joined:
            _set_global("traces", tracer_provider)
        if "metrics" not in joined:
            _set_global("metrics", meter_provider)
        if "logs" not in joined:
            _set_global("logs", logger_provider)
    return GuardInstallation(
        guard,
        tracer_provider,
        meter_provider,
        logger_provider,
        span_exporter,
        joined=frozenset(joined),
        owned_processors=owned,
    )


def _batch_span_processor(exporter: SpanExporter) -> BatchSpanProcessor:
    """A ``BatchSpanProcessor`` configured by ``OTEL_BSP_*``; with the SDK's defaults when those
    are rejected (a negative queue size raises in the SDK): telemetry settings never stop the
    agent."""
    try:
        return BatchSpanProcessor(exporter)
    except ValueError as exc:
        _logger.warning(
            "otel_guard: the OTEL_BSP_* settings are not usable (%s); the SDK's defaults are used",
            exc,
        )
        # The SDK's own defaults.
        return BatchSpanProcessor(
            exporter,
            max_queue_size=2048,
            schedule_delay_millis=5000,
            max_export_batch_size=512,
            export_timeout_millis=30000,
        )


def sdk_disabled() -> bool:
    """True when ``OTEL_SDK_DISABLED`` is ``true`` (case-insensitive), as the SDK reads it."""
    return os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def _flush_within(flush: Callable[[int], bool], deadline: float) -> bool:
    """Run ``flush(remaining milliseconds)`` on a helper thread; False unless it returned True
    before ``deadline`` (``time.monotonic()``)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    outcome: list[bool] = []

    def run() -> None:
        try:
            outcome.append(bool(flush(int(remaining * 1000))))
        except Exception:
            outcome.append(False)

    helper = threading.Thread(target=run, name="otel_guard flush", daemon=True)
    try:
        helper.start()
    except RuntimeError:  # no new threads (the interpreter is exiting): flush here
        run()
        return outcome == [True]
    helper.join(max(0.0, deadline - time.monotonic()))
    return outcome == [True]


def _has_span_processors(provider: TracerProvider) -> bool:
    active = getattr(provider, "_active_span_processor", None)
    return bool(getattr(active, "_span_processors", ()))


def _forget_noop_global(signal: Signal) -> None:
    """Let a no-op global provider that was set explicitly be replaced.

    The API sets each global provider once; a no-op one does nothing, so replacing it changes
    nothing that anything relies on. Its set-once guard is the API's module state.
    """
    if signal == "traces":
        if isinstance(trace.get_tracer_provider(), trace.NoOpTracerProvider):
            trace._TRACER_PROVIDER_SET_ONCE = Once()
            trace._TRACER_PROVIDER = None
    elif signal == "metrics":
        if isinstance(metrics.get_meter_provider(), metrics.NoOpMeterProvider):
            _metrics_internal._METER_PROVIDER_SET_ONCE = Once()
            _metrics_internal._METER_PROVIDER = None
    elif isinstance(_logs.get_logger_provider(), _logs.NoOpLoggerProvider):
        _logs_internal._LOGGER_PROVIDER_SET_ONCE = Once()
        _logs_internal._LOGGER_PROVIDER = None


def _set_global(signal: Signal, provider: TracerProvider | MeterProvider | LoggerProvider) -> None:
    """Make ``provider`` the global one (replacing a no-op one), warning loudly when another
    provider is already set."""
    _forget_noop_global(signal)
    if signal == "traces":
        trace.set_tracer_provider(cast(TracerProvider, provider))
        current: object = trace.get_tracer_provider()
    elif signal == "metrics":
        metrics.set_meter_provider(cast(MeterProvider, provider))
        current = metrics.get_meter_provider()
    else:
        _logs.set_logger_provider(cast(LoggerProvider, provider))
        current = _logs.get_logger_provider()
    if current is not provider:
        _logger.warning(
            "otel_guard: a global %s provider that is not the SDK's (%s) is already set and "
            "cannot be replaced; the guard's %s go only through the provider install_guard "
            "returned",
            signal,
            type(current).__name__,
            "spans" if signal == "traces" else signal,
        )


def _exporter_names(signal: Signal) -> list[Exporter]:
    """The exporters ``OTEL_<SIGNAL>_EXPORTER`` names (``otlp`` when unset); others are logged."""
    variable = _EXPORTER_VARIABLES[signal]
    raw = os.environ.get(variable, "")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()] or ["otlp"]
    if "none" in names:
        return []
    chosen: list[Exporter] = []
    for name in names:
        if name in ("otlp", "console"):
            if name not in chosen:
                chosen.append(cast(Exporter, name))
        else:
            _logger.warning(
                "otel_guard: %s=%r is not supported (use %s); ignored",
                variable,
                name,
                ", ".join(EXPORTERS),
            )
    return chosen


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


def _span_exporter(name: Exporter, protocol: OTLPProtocol) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HTTPSpanExporter,
    )

    return HTTPSpanExporter()


def _metric_exporter(name: Exporter, protocol: OTLPProtocol) -> MetricExporter:
    if name == "console":
        return ConsoleMetricExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )

    return HTTPMetricExporter()


def _log_exporter(name: Exporter, protocol: OTLPProtocol) -> LogRecordExporter:
    if name == "console":
        return ConsoleLogRecordExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HTTPLogExporter,
    )

    return HTTPLogExporter()
