"""otel-guard: an OpenTelemetry span processor that stops AI agents looping on a failing tool.

The package follows the one-way flow of a span:

- ``reducer``: the pure state machine (no OpenTelemetry import);
- ``spans/``: span input, the ``acp`` attribute names and the GenAI profile;
- ``guard/``: the span processor, its dispatch and mode, and the guard's telemetry;
- ``privacy/``: the sensitive-key registry, redaction and pseudonyms;
- ``replay/``: trace readers, the replayer, the report, its HTML page and shard merging;
- ``activation/``: ``install_guard`` and the zero-code start;
- ``integrations/``: span producers for any Python agent and for agent frameworks;
- ``cli``, ``demo``: the ``otel-guard`` command.

``attributes`` and ``telemetry`` keep the module names the contract gives the input and output
names; they re-export ``spans.attributes`` and ``guard.telemetry``.
"""

from otel_guard.activation.setup import GuardInstallation, install_guard
from otel_guard.guard.processor import BatchEvaluation, GuardAction, GuardSpanProcessor
from otel_guard.privacy.log_redaction import RedactingLogExporter
from otel_guard.privacy.redaction import RedactingSpanExporter
from otel_guard.version import __version__

__all__ = [
    "BatchEvaluation",
    "GuardAction",
    "GuardInstallation",
    "GuardSpanProcessor",
    "RedactingLogExporter",
    "RedactingSpanExporter",
    "__version__",
    "install_guard",
]
