"""otel-guard: an OpenTelemetry span processor that stops AI agents looping on a failing tool."""

from otel_guard.activation.setup import GuardInstallation, install_guard
from otel_guard.guard.processor import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.privacy.redaction import RedactingSpanExporter
from otel_guard.version import __version__

__all__ = [
    "BatchEvaluation",
    "GuardAction",
    "GuardInstallation",
    "GuardSpanProcessor",
    "RedactingSpanExporter",
    "__version__",
    "install_guard",
]
