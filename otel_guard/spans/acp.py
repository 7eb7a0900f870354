"""The section 3 profile: prompt, batch and tool-call spans a host writes with ``acp.*`` keys.

Unlike the inferred profiles, a section 3 batch is explicit (a batch span with its admitted
count) and is decided synchronously inside the batch span's ``end()``, so the processor keeps
this profile's open spans itself; this module only reads the attributes:

* :func:`opted_out`: a prompt or batch span's route or channel marker;
* :func:`read_call`: the fields of a tool-call span the reducer needs, validated;
* :func:`batch_input`: the admitted count and the input drain of an ended batch span.

Values of the wrong type or absurd length are missing values (docs/contract.md section 3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from otel_guard.reducer import Observation
from otel_guard.spans import attributes as attr
from otel_guard.spans.events import MAX_ID_LENGTH, usable_call_id

__all__ = ["CALL_RECORD_BYTES", "batch_input", "opted_out", "read_call"]

RESOLVED_TOOL_TYPES: Final = frozenset({"native", "mcp"})
# Longest kept status or tool type: longer values are not in any closed set, so they are kept
# as missing values, which the reducer classifies the same way.
MAX_STATUS_LENGTH: Final = 64
# What a kept call is counted as, besides its strings' characters. Deliberately above what it
# costs: tracemalloc shows about 280 bytes per kept call, strings included, on CPython 3.11,
# against some 430 counted; the budget errs towards keeping less.
CALL_RECORD_BYTES: Final = 400

_TOOL_CALL_ID: Final = attr.TOOL_CALL_ID
_TOOL_NAME: Final = attr.TOOL_NAME
_TOOL_TYPE: Final = attr.TOOL_TYPE
_TOOL_STATUS: Final = attr.TOOL_STATUS
_TOOL_EXECUTION_STATUS: Final = attr.TOOL_EXECUTION_STATUS
_TOOL_EXECUTION_ERROR_TYPE: Final = attr.TOOL_EXECUTION_ERROR_TYPE
_TOOL_PROVIDER_DUPLICATE: Final = attr.TOOL_PROVIDER_DUPLICATE

# Builds a named tuple from a tuple of its fields without a Python-level call.
_new = tuple.__new__


def opted_out(attributes: Mapping[str, Any]) -> bool:
    """A prompt or batch span marks its prompt as not guarded: a route other than the
    interactive one, or a channel prompt."""
    route = attributes.get(attr.PROMPT_ROUTE)
    return (isinstance(route, str) and route != attr.ROUTE_INTERACTIVE) or attributes.get(
        attr.PROMPT_CHANNEL
    ) is True


def read_call(attributes: Mapping[str, Any]) -> tuple[Observation, int, bool]:
    """A tool-call span's observation, the bytes it is counted as, and whether it lacks one of
    the attributes section 3 requires of a tool-call span (call ID, tool name, tool type,
    status, execution status; a wrongly typed value is a missing one).

    A missing call ID is ``""``. A tool type other than ``native``/``mcp`` is not resolved from
    the host's registry: the tool name is dropped, so the call is never eligible."""
    get = attributes.get
    call_id = usable_call_id(get(_TOOL_CALL_ID)) or ""
    tool_name = get(_TOOL_NAME)
    named = True
    if type(tool_name) is not str or len(tool_name) > MAX_ID_LENGTH:
        named = False
        tool_name = None
    tool_type = get(_TOOL_TYPE)
    missing = not call_id or not named or type(tool_type) is not str
    if tool_type not in RESOLVED_TOOL_TYPES:
        tool_name = None
        if type(tool_type) is not str or len(tool_type) > MAX_STATUS_LENGTH:
            tool_type = None
    status = get(_TOOL_STATUS)
    if type(status) is not str or len(status) > MAX_STATUS_LENGTH:
        status = ""
    execution = get(_TOOL_EXECUTION_STATUS)
    if type(execution) is not str or len(execution) > MAX_STATUS_LENGTH:
        execution = None
    error_type = get(_TOOL_EXECUTION_ERROR_TYPE)
    if type(error_type) is not str or len(error_type) > MAX_STATUS_LENGTH:
        error_type = None  # longer than the reducer's pattern allows: unknown either way
    size = (
        CALL_RECORD_BYTES
        + len(call_id)
        + (len(tool_name) if tool_name else 0)
        + (len(error_type) if error_type else 0)
    )
    duplicate = get(_TOOL_PROVIDER_DUPLICATE) is True
    fields = (call_id, tool_name, tool_type, status, execution, error_type, duplicate)
    return _new(Observation, fields), size, missing or not status or execution is None


def batch_input(attributes: Mapping[str, Any]) -> tuple[int | None, bool, bool, bool]:
    """An ended batch span's admitted count (``None`` when missing or malformed) and its input
    drain: external input, a queued prompt, and whether the drain was reliable."""
    admitted = attributes.get(attr.BATCH_ADMITTED)
    return (
        admitted if type(admitted) is int and admitted >= 0 else None,
        attributes.get(attr.INPUT_EXTERNAL) is True,
        attributes.get(attr.INPUT_QUEUED_PROMPT) is True,
        attributes.get(attr.INPUT_RELIABLE) is True,
    )
