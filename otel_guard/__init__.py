"""otel-guard: an OpenTelemetry span processor that stops AI agents looping on a failing tool."""

from otel_guard.processor import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.redaction import RedactingSpanExporter
from otel_guard.version import __version__

__all__ = [
    "BatchEvaluation",
    "GuardAction",
    "GuardSpanProcessor",
    "RedactingSpanExporter",
    "__version__",
]
