"""The one registry of sensitive attribute keys.

The redacting span exporter removes these keys from exported spans, and the collector
configuration in ``collector-config/`` is tested against this same registry, so the process and
the collector agree on what must never leave.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai

__all__ = [
    "SENSITIVE_KEYS",
    "SENSITIVE_KEY_PATTERNS",
    "SensitiveKeys",
    "is_sensitive",
]

SENSITIVE_KEYS: Final[frozenset[str]] = frozenset(
    {
        # GenAI content: arguments, results, messages, instructions.
        _gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS,
        _gen_ai.GEN_AI_TOOL_CALL_RESULT,
        _gen_ai.GEN_AI_INPUT_MESSAGES,
        _gen_ai.GEN_AI_OUTPUT_MESSAGES,
        _gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS,
        _gen_ai.GEN_AI_TOOL_DEFINITIONS,
        "gen_ai.prompt",
        "gen_ai.completion",
        # Raw errors.
        "exception.message",
        "exception.stacktrace",
        "error.message",
        # User identifiers.
        "user.id",
        "user.name",
        "user.email",
        "user.full_name",
        "enduser.id",
        "enduser.pseudo.id",
        "session.user_id",
        # Paths.
        "file.path",
        "file.directory",
        "file.name",
        "code.filepath",
        "code.file.path",
        "process.executable.path",
        "process.command_line",
        "process.command_args",
        "url.path",
        "url.full",
        # MCP server identity.
        "mcp.server.name",
        "acp.mcp.server.name",
        # Legacy names agents still emit.
        "tool_arguments",
        "tool_args",
        "tool_response",
        "tool_result",
        "function_args",
        "function_arguments",
        "function_response",
        "error",
        "error_message",
        "prompt",
        "response",
    }
)
"""Exact attribute keys that are always removed."""

SENSITIVE_KEY_PATTERNS: Final[tuple[str, ...]] = (
    r"gen_ai\.prompt\..+",
    r"gen_ai\.completion\..+",
    r"gen_ai\.tool\.call\.(arguments|result)\..+",
    r".*\.(arguments|args)",
    r".*\.(stacktrace|stack_trace)",
    r".*\.(file_path|filepath|path)",
    r".*\.user_id",
    r"mcp\..*server.*",
)
"""Regular expressions (full match) naming families of sensitive keys."""

_COMPILED: Final = re.compile("|".join(f"(?:{p})" for p in SENSITIVE_KEY_PATTERNS))


def is_sensitive(key: str) -> bool:
    """True when ``key`` is in :data:`SENSITIVE_KEYS` or fully matches a registry pattern."""
    return key in SENSITIVE_KEYS or _COMPILED.fullmatch(key) is not None


class SensitiveKeys:
    """The registry plus a deployment's own additions; a callable key predicate."""

    __slots__ = ("_keys", "_pattern")

    def __init__(self, extra_keys: Iterable[str] = (), extra_patterns: Iterable[str] = ()) -> None:
        self._keys = SENSITIVE_KEYS | frozenset(extra_keys)
        patterns = (*SENSITIVE_KEY_PATTERNS, *extra_patterns)
        self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def __call__(self, key: str) -> bool:
        return key in self._keys or self._pattern.fullmatch(key) is not None
