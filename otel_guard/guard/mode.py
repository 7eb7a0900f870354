"""Where the guard's mode comes from: an explicit value, else the process environment.

The mode is an operator-controlled deployment policy. It is read from the process environment
only (``os.environ`` as the process received it); no dotenv file of a project or workspace is
ever opened for it, so a repository cannot raise its own guard level.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from otel_guard.reducer import Mode, parse_mode

__all__ = ["DEFAULT_MODE", "MODE_ENV_VAR", "ModeResolution", "resolve_mode"]

MODE_ENV_VAR = "QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD"
DEFAULT_MODE: Mode = "shadow"


@dataclass(frozen=True, slots=True)
class ModeResolution:
    """The resolved mode, and whether a non-empty value was given that names no mode.

    ``invalid`` is a flag only: the raw value is deliberately not kept, so it cannot reach a
    diagnostic.
    """

    mode: Mode
    invalid: bool


def resolve_mode(
    explicit: object = None, environ: Mapping[str, str] | None = None
) -> ModeResolution:
    """Resolve the mode: ``explicit`` wins, else ``environ[MODE_ENV_VAR]`` (default ``os.environ``).

    A missing or empty value gives ``shadow``. Any other value that names no mode (also one of
    whitespace only, and an explicit value that is not a string at all) gives ``shadow`` with
    ``invalid=True`` so the caller can record an ``invalid_mode`` diagnostic. Never raises.
    """
    raw = (
        explicit
        if explicit is not None
        else (os.environ if environ is None else environ).get(MODE_ENV_VAR)
    )
    if raw is None or raw == "":
        return ModeResolution(DEFAULT_MODE, invalid=False)
    mode = parse_mode(raw)
    if mode is None:
        return ModeResolution(DEFAULT_MODE, invalid=True)
    return ModeResolution(mode, invalid=False)
