"""Zero-code start: ``opentelemetry-instrument`` installs the guard (extra ``instrument``).

With the package installed, either variable starts the guard in an auto-instrumented agent,
in the mode of ``QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD`` (``shadow`` when unset)::

    OTEL_PYTHON_DISTRO=otel_guard opentelemetry-instrument python agent.py
    OTEL_PYTHON_CONFIGURATOR=otel_guard opentelemetry-instrument python agent.py

The configurator calls :func:`otel_guard.install_guard`, which builds the providers (or joins
those already set) with the redacting span export path, and honours the usual
``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` and ``OTEL_EXPORTER_OTLP_*`` variables. The distro only
makes sure that the configurator named ``otel_guard`` is the one that runs, so no other
configurator exports spans unredacted beside it: a leftover ``OTEL_PYTHON_CONFIGURATOR`` naming
another configurator is overridden, with a warning that names it.
With ``OTEL_SDK_DISABLED=true`` the start builds nothing and installs no guard
(:func:`installation` stays None), as the SDK's own configurator does.

``OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED=true`` bridges Python ``logging`` as the
SDK's own configurator does: one ``LoggingHandler`` on the root logger, into the logger provider
the start installed, so the records pass its :class:`~otel_guard.RedactingLogExporter` (deny-listed
attributes removed, bodies exported only when asked for). The SDK deprecates the variable in
favour of ``opentelemetry-instrumentation-logging``, whose handler writes to the global logger
provider and so takes the same redacted path; the variable is honoured all the same, with the
same deprecation warning, because an operator who set it expects the agent's logs exported.

Entry points (``pyproject.toml``): ``opentelemetry_distro`` and ``opentelemetry_configurator``,
both named ``otel_guard``. ``opentelemetry-instrument`` loads the first configurator it finds
when none is named; when the guard's is loaded that way, unnamed, it configures the SDK exactly
as the SDK's own configurator does and starts no guard.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Final

# Typed as far as the extra is installed; without it, mypy sees these names as Any.
from opentelemetry.instrumentation.distro import (  # type: ignore[attr-defined, unused-ignore]
    BaseDistro,
)
from opentelemetry.instrumentation.environment_variables import (
    OTEL_PYTHON_CONFIGURATOR,
    OTEL_PYTHON_DISTRO,
)
from opentelemetry.sdk import _configuration as _sdk_configuration
from opentelemetry.sdk._configuration import _BaseConfigurator, _OTelSDKConfigurator
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler

from otel_guard.activation.setup import GuardInstallation, install_guard

__all__ = ["LOGGING_VARIABLE", "NAME", "GuardConfigurator", "GuardDistro", "installation"]

_logger = logging.getLogger(__name__)

NAME: Final = "otel_guard"
"""The entry point name that ``OTEL_PYTHON_DISTRO`` / ``OTEL_PYTHON_CONFIGURATOR`` select."""

LOGGING_VARIABLE: Final = "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED"
"""``true`` (case-insensitive) bridges Python ``logging`` into the installed logger provider."""

_installation: GuardInstallation | None = None


def installation() -> GuardInstallation | None:
    """What the zero-code start installed in this process, if it ran."""
    return _installation


def _named() -> bool:
    return NAME in (
        os.environ.get(OTEL_PYTHON_DISTRO, "").strip(),
        os.environ.get(OTEL_PYTHON_CONFIGURATOR, "").strip(),
    )


class GuardDistro(BaseDistro):  # type: ignore[misc, unused-ignore]  # an untyped base class
    """Selected by ``OTEL_PYTHON_DISTRO=otel_guard``: names the guard's configurator."""

    def _configure(self, **kwargs: Any) -> None:
        if os.environ.get(OTEL_PYTHON_DISTRO, "").strip() != NAME:
            return
        other = os.environ.get(OTEL_PYTHON_CONFIGURATOR, "").strip()
        if other and other != NAME:
            # Another configurator would export spans unredacted while the operator asked for
            # the guard: the guard's wins, and says so.
            _logger.warning(
                "otel_guard: OTEL_PYTHON_DISTRO=%s overrides OTEL_PYTHON_CONFIGURATOR=%r: the "
                "guard's configurator runs instead, with redacted export (unset %s to silence "
                "this)",
                NAME,
                other,
                OTEL_PYTHON_CONFIGURATOR,
            )
        os.environ[OTEL_PYTHON_CONFIGURATOR] = NAME


class GuardConfigurator(_BaseConfigurator):
    """Installs the guard when named; otherwise configures the SDK as its own configurator."""

    def _configure(self, **kwargs: Any) -> None:
        global _installation
        if not _named():
            _OTelSDKConfigurator().configure(**kwargs)  # type: ignore[no-untyped-call]
            return
        if _installation is None:
            _installation = install_guard()
            if _installation is not None:
                _bridge_logging(_installation.logger_provider)


def _bridge_logging(provider: LoggerProvider) -> None:
    """Attach one ``LoggingHandler`` for ``provider`` to the root logger when
    :data:`LOGGING_VARIABLE` asks for it (the start runs once per process)."""
    if os.environ.get(LOGGING_VARIABLE, "false").strip().lower() != "true":
        return
    warnings.warn(
        f"{LOGGING_VARIABLE} and the SDK's LoggingHandler it controls are deprecated; "
        "opentelemetry-instrumentation-logging replaces them",
        DeprecationWarning,
        stacklevel=2,
    )
    handler = LoggingHandler(level=logging.NOTSET, logger_provider=provider)
    logging.getLogger().addHandler(handler)
    # As the SDK's configurator does: logging.basicConfig(force=True) and the config functions
    # keep the handler (the SDK's own wrapper, where this SDK version has it).
    keep = getattr(_sdk_configuration, "_overwrite_logging_config_fns", None)
    if callable(keep):
        keep(handler)
