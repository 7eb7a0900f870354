"""The span model the trace readers share: recorded spans, their attributes, the tables of
OTLP enum values, the shape error a reader raises inside one request, and the table that
shares resources and scopes between requests.

Both readers (:mod:`otel_guard.replay.otlp_json` and :mod:`otel_guard.replay.otlp_proto`) build
their spans from these, and neither imports the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    DEFAULT_TRACE_STATE,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import AttributeValue

from otel_guard.spans import attributes as attr

__all__ = [
    "CACHE_LIMIT",
    "HAS_REMOTE_FLAG",
    "ID_CHARS_LIMIT",
    "KINDS",
    "OK_STATUS",
    "REMOTE_PARENT_FLAGS",
    "STATUS",
    "TRACE_FLAGS",
    "UNSET_STATUS",
    "Attributes",
    "Interner",
    "OtherSignal",
    "RecordedSpan",
    "Shape",
    "bound_ids",
    "bounded_id",
    "parent_context",
    "span_context",
]

KINDS: Final = {
    0: SpanKind.INTERNAL,  # SPAN_KIND_UNSPECIFIED
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}
STATUS: Final = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
UNSET_STATUS: Final = Status(StatusCode.UNSET)
OK_STATUS: Final = Status(StatusCode.OK)
TRACE_FLAGS: Final = tuple(TraceFlags(flags) for flags in range(256))
# OTLP span flags above the W3C trace flags (bits 0-7): bit 8 says whether bit 9 is known, and
# bit 9 that the span's parent is remote (in another process). The OpenTelemetry SDKs' OTLP
# exporters set them; without bit 8 the parent is read as local, as it always was.
HAS_REMOTE_FLAG: Final = 0x100
REMOTE_PARENT_FLAGS: Final = 0x300
# Resources and scopes repeat on every line; sharing them keeps memory flat for long files.
CACHE_LIMIT: Final = 4096


class Attributes(dict[str, AttributeValue]):
    """A decoded span's attributes: a plain dictionary that also answers ``_dict`` with itself.

    The SDK's attribute store keeps its entries in ``_dict``; the guard's hot path reads that
    first, and a plain dictionary would make it take a raised ``AttributeError`` per call.
    """

    __slots__ = ()

    @property
    def _dict(self) -> dict[str, AttributeValue]:
        return self


class RecordedSpan(ReadableSpan):
    """A finished span read from a file: a :class:`ReadableSpan` whose fields are set directly.

    ``ReadableSpan.__init__`` takes keywords and defaults that replay has no use for, at a cost
    that counts over hundreds of thousands of spans. Every field it sets is set here too, with
    no events or links (a test compares the two).
    """

    def __init__(  # one argument per field, positional: cheaper to call
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        resource: Resource,
        attributes: Attributes,
        kind: SpanKind,
        status: Status,
        start_time: int,
        end_time: int,
        scope: InstrumentationScope,
    ) -> None:
        # ReadableSpan.__init__ is deliberately not called: these are all the fields it sets.
        self._name = name
        self._context = context
        self._kind = kind
        self._instrumentation_info = None
        self._instrumentation_scope = scope
        self._parent = parent
        self._start_time = start_time
        self._end_time = end_time
        self._attributes = attributes
        self._events = ()
        self._links = ()
        self._resource = resource
        self._status = status


_new_tuple = tuple.__new__


def span_context(trace_id: int, span_id: int, flags: TraceFlags) -> SpanContext:
    """A local span context for IDs already checked to be non-zero and in range.

    ``SpanContext.__new__`` only re-checks that and fills in defaults; the tuple is the same.
    """
    return _new_tuple(SpanContext, (trace_id, span_id, False, flags, DEFAULT_TRACE_STATE, True))


def parent_context(trace_id: int, span_id: int, flags: TraceFlags, span_flags: int) -> SpanContext:
    """The parent's span context, remote when the span's OTLP flags (``span_flags``) say so.

    A remote parent makes the span its process's local root, as it was live: the guard reads
    an inferred prompt under it without waiting for a parent that process never ended.
    """
    remote = span_flags & REMOTE_PARENT_FLAGS == REMOTE_PARENT_FLAGS
    return _new_tuple(SpanContext, (trace_id, span_id, remote, flags, DEFAULT_TRACE_STATE, True))


class Shape(Exception):
    """A shape error inside one line, with its path; the reader adds the file and line.

    Paths are built only when an error is raised (callers prefix their part on the way out),
    so a well-formed line costs no string formatting.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def within(self, prefix: str) -> Shape:
        self.path = prefix + self.path
        return self

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _hashable(attributes: Mapping[str, AttributeValue]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(attributes.items()))


class Interner:
    """Shares equal resources and scopes between lines, within a bounded table."""

    def __init__(self) -> None:
        self._resources: dict[tuple[tuple[str, object], ...], Resource] = {}
        self._scopes: dict[tuple[str, str | None, str | None], InstrumentationScope] = {}

    def resource(self, attributes: dict[str, AttributeValue], schema_url: str) -> Resource:
        key = (*_hashable(attributes), ("", schema_url))
        found = self._resources.get(key)
        if found is None:
            if len(self._resources) >= CACHE_LIMIT:
                self._resources.clear()
            found = self._resources[key] = Resource(attributes, schema_url)
        return found

    def scope(self, name: str, version: str | None, schema_url: str | None) -> InstrumentationScope:
        key = (name, version, schema_url)
        found = self._scopes.get(key)
        if found is None:
            if len(self._scopes) >= CACHE_LIMIT:
                self._scopes.clear()
            found = self._scopes[key] = InstrumentationScope(name, version, schema_url)
        return found


class OtherSignal(Exception):
    """A request of another signal ("logs", "metrics", "profiles"): skipped, not malformed."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


ID_CHARS_LIMIT: Final = 512
"""The longest prompt or conversation ID a replay keeps as written. A longer one is kept as
:func:`bounded_id` gives it, so what a replay buffers and reports does not grow with ID length."""

_ID_PREFIX_CHARS: Final = 64
_ID_KEYS: Final = (attr.PROMPT_ID, attr.CONVERSATION_ID)


def bounded_id(text: str) -> str:
    """``text`` when it is at most :data:`ID_CHARS_LIMIT` characters; else its first 64
    characters, ``~sha256:`` and 32 hex digits of its SHA-256 (the same for the same ID, distinct
    for distinct ones, short enough to be kept as is)."""
    if len(text) <= ID_CHARS_LIMIT:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{text[:_ID_PREFIX_CHARS]}~sha256:{digest}"


def bound_ids(attributes: dict[str, AttributeValue]) -> int:
    """Replace over-long prompt and conversation IDs in ``attributes`` by :func:`bounded_id`;
    returns how many were replaced."""
    replaced = 0
    for key in _ID_KEYS:
        value = attributes.get(key)
        if type(value) is str and len(value) > ID_CHARS_LIMIT:
            attributes[key] = bounded_id(value)
            replaced += 1
    return replaced
