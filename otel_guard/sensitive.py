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
        _gen_ai.GEN_AI_TOOL_DESCRIPTION,
        "gen_ai.prompt",
        "gen_ai.completion",
        # Tool identity: a tool name can itself carry a path, a server name or user data, and the
        # guard's promise is that the tool name never leaves the process.
        _gen_ai.GEN_AI_TOOL_NAME,
        # Error types an agent fills with free text (the guard's key is private to the process).
        "error.type",
        "acp.tool.execution.error_type",
        # Raw errors.
        "exception.message",
        "exception.stacktrace",
        "error.message",
        "exception.escaped_message",
        # User identifiers.
        "user.id",
        "user.name",
        "user.email",
        "user.full_name",
        "enduser.id",
        "enduser.pseudo.id",
        "session.user_id",
        "user_id",
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
        "url.query",
        "mcp.resource.uri",
        "file_path",
        "filepath",
        "path",
        "cwd",
        # MCP server identity.
        "mcp.server.name",
        "acp.mcp.server.name",
        "mcp_server",
        "mcp_server_name",
        # Legacy names agents still emit.
        "tool_name",
        "tool_input",
        "tool_output",
        "tool_error",
        "tool_arguments",
        "tool_args",
        "tool_response",
        "tool_result",
        "function_args",
        "function_arguments",
        "function_name",
        "function_response",
        "function_result",
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
    r".*\.mcp\.server\..+",
    r".*\.(cwd|working_directory)",
    r".*\.error[._]message",
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
