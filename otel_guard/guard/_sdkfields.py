"""The OpenTelemetry SDK's private span fields the guard reads, and nowhere else.

The guard runs inside every ``span.end()``. The SDK's public properties cost a Python call each,
and ``ReadableSpan.attributes`` also wraps the store in a new mapping proxy whose misses raise
``KeyError`` internally (about ten times a dictionary look-up). So the hot path reads the fields
behind them. Each reader here is an ``operator.attrgetter`` (a C call, no Python frame) that
raises ``AttributeError`` when the field is missing; every caller then falls back to the public
property, which is slower but always right.

:func:`check` compares every reader with its public property on a real SDK span: the test suite
runs it, so an SDK release that renames or retypes one of these fields fails the tests loudly
instead of quietly sending the guard down its slow path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

__all__ = [
    "attribute_dict",
    "attributes",
    "call_fields",
    "check",
    "context",
    "end_time",
    "parent",
    "start_time",
]

attribute_dict: Final[Any] = attrgetter("_attributes._dict")
"""The dictionary inside the span's ``BoundedAttributes`` store (also set by replayed spans)."""
context: Final[Any] = attrgetter("_context")
"""``ReadableSpan.context``: the span's ``SpanContext``."""
parent: Final[Any] = attrgetter("_parent")
"""``ReadableSpan.parent``: the parent's ``SpanContext`` or ``None``."""
start_time: Final[Any] = attrgetter("_start_time")
"""``ReadableSpan.start_time``, nanoseconds since the epoch (``None`` before start)."""
end_time: Final[Any] = attrgetter("_end_time")
"""``ReadableSpan.end_time``, nanoseconds since the epoch (``None`` before end)."""

call_fields: Final[Any] = attrgetter("_parent", "_start_time", "_context")
"""``(parent, start_time, context)`` of an ended tool-call span in one C call."""

SPAN_ID: Final = 1
"""A ``SpanContext`` is a tuple with the span ID at this index (its documented layout); the tuple
read is a plain index, its ``span_id`` property a Python call."""

_EMPTY: Final[Mapping[str, Any]] = {}


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes: the store's own dictionary when there is one, else the public
    property (spans of another SDK, or of a future one)."""
    try:
        found = attribute_dict(span)
    except AttributeError:
        store = getattr(span, "_attributes", None)
        if type(store) is dict:  # a span built from recorded data may hold a plain dict
            return store
        public = span.attributes
        return public if public is not None else _EMPTY
    return found if isinstance(found, dict) else (span.attributes or _EMPTY)


def check(replaced: Mapping[str, Callable[[Any], Any]] | None = None) -> list[str]:
    """Which private readers disagree with the public properties on a real SDK span.

    Empty when the installed SDK has every field the hot path reads, with the meaning it assumes.
    ``replaced`` checks other readers in place of some of this module's (by name), as a test
    does; a compiled build binds the module's own readers when it is built.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import set_span_in_context

    tracer = TracerProvider().get_tracer("otel_guard.check")
    outer = tracer.start_span("outer")
    span = tracer.start_span("inner", context=set_span_in_context(outer), attributes={"k": "v"})
    span.end()
    outer.end()
    readable: Any = span
    expected: dict[str, tuple[Any, Any]] = {
        "attribute_dict": (attribute_dict, dict(readable.attributes or {})),
        "context": (context, span.get_span_context()),
        "parent": (parent, readable.parent),
        "start_time": (start_time, readable.start_time),
        "end_time": (end_time, readable.end_time),
        "call_fields": (call_fields, (readable.parent, readable.start_time, readable.context)),
    }
    problems: list[str] = []
    for name, (reader, value) in expected.items():
        if replaced is not None:
            reader = replaced.get(name, reader)
        try:
            found = reader(span)
        except AttributeError as error:
            problems.append(f"{name}: {error}")
            continue
        if found != value or (name == "attribute_dict" and type(found) is not dict):
            problems.append(f"{name}: read {found!r}, the public property gives {value!r}")
    span_context = span.get_span_context()
    if not isinstance(span_context, SpanContext) or span_context[SPAN_ID] != span_context.span_id:
        problems.append("SPAN_ID: the span ID is not at this index of SpanContext")
    return problems
