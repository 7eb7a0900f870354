"""``RedactingMetricExporter``: exports metrics whose resource has its sensitive keys removed.

The guard's metrics carry closed vocabularies only (docs/contract.md section 5), but every batch
of metrics is sent with its provider's resource, and a resource built by
``Resource.create()`` with the process detector holds the command line, arguments, executable
path and owner of the agent. The resource passes the spans' policy
(:meth:`~otel_guard.privacy.redaction.RedactingSpanExporter.redact_resource`); names, points,
scopes and schema URLs are handed over as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
)

from otel_guard.privacy.log_redaction import _Discard
from otel_guard.privacy.redaction import RedactingSpanExporter

__all__ = ["RedactingMetricExporter"]

_logger = logging.getLogger(__name__)


class RedactingMetricExporter(MetricExporter):
    """Wraps ``delegate`` and hands it each batch of metrics with a redacted resource.

    The delegate's preferred temporality and aggregation are this exporter's, so a
    ``PeriodicExportingMetricReader`` around it aggregates as it would around the delegate.
    ``extra_keys`` and ``extra_patterns`` are as for :class:`RedactingSpanExporter` (resource keys
    they name are removed too). ``export()`` never raises; ``shutdown()`` and ``force_flush()``
    delegate.
    """

    def __init__(
        self,
        delegate: MetricExporter,
        *,
        extra_keys: Iterable[str] | None = (),
        extra_patterns: Iterable[str] | None = (),
    ) -> None:
        super().__init__(
            preferred_temporality=delegate._preferred_temporality,
            preferred_aggregation=delegate._preferred_aggregation,
        )
        self._delegate = delegate
        self._policy = RedactingSpanExporter(
            _Discard(), extra_keys=extra_keys, extra_patterns=extra_patterns
        )

    @property
    def delegate(self) -> MetricExporter:
        """The exporter that receives the redacted batches."""
        return self._delegate

    def redact(self, metrics_data: MetricsData) -> MetricsData:
        """``metrics_data`` with each resource redacted (the same object when none changes)."""
        redacted = [
            ResourceMetrics(
                resource=self._policy.redact_resource(block.resource),
                scope_metrics=block.scope_metrics,
                schema_url=block.schema_url,
            )
            for block in metrics_data.resource_metrics
        ]
        if all(
            new.resource is old.resource
            for new, old in zip(redacted, metrics_data.resource_metrics, strict=True)
        ):
            return metrics_data
        return MetricsData(resource_metrics=redacted)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            redacted = self.redact(metrics_data)
        except Exception as exc:
            # Never the data: a batch that cannot be made safe is not sent.
            _logger.warning("otel_guard: metrics not exported (%s)", type(exc).__name__)
            return MetricExportResult.FAILURE
        try:
            return self._delegate.export(redacted, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            _logger.warning("otel_guard: metric export failed (%s)", type(exc).__name__)
            return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._delegate.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._delegate.shutdown(timeout_millis=timeout_millis, **kwargs)
