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

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from otel_guard.version import __version__

if TYPE_CHECKING:
    from otel_guard.activation.setup import GuardInstallation, install_guard
    from otel_guard.guard.processor import BatchEvaluation, GuardAction, GuardSpanProcessor
    from otel_guard.privacy.log_redaction import RedactingLogExporter
    from otel_guard.privacy.redaction import RedactingSpanExporter

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

# Where each public name lives. They are imported on first use, so that importing a module that
# needs no OpenTelemetry (``otel_guard.reducer``, whose contract is to import none) does not
# load the SDK through this package's own import.
_PUBLIC = {
    "BatchEvaluation": "otel_guard.guard.processor",
    "GuardAction": "otel_guard.guard.processor",
    "GuardSpanProcessor": "otel_guard.guard.processor",
    "GuardInstallation": "otel_guard.activation.setup",
    "install_guard": "otel_guard.activation.setup",
    "RedactingLogExporter": "otel_guard.privacy.log_redaction",
    "RedactingSpanExporter": "otel_guard.privacy.redaction",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_guard' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups find it directly
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
