"""OTLP/JSON trace lines, as the OpenTelemetry Collector ``file`` exporter writes them.

Each non-blank line is one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding: trace and
span IDs are hex strings (not the base64 of the generic protobuf JSON mapping), 64-bit integers
may be strings or numbers, enum values are numbers. :class:`OtlpJsonReader` streams such files
(plain or gzip, detected by content) into :class:`~opentelemetry.sdk.trace.ReadableSpan` objects;
:func:`encode_request` and :class:`OtlpJsonSpanExporter` write them.

Only what a trace replay needs is reconstructed: IDs, parent, name, kind, times, attributes,
status, resource and scope; events and links must be arrays and are otherwise skipped. Any
line that is not a well-formed request raises :class:`MalformedInput` naming the file and line;
nothing of that line is returned.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
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

__all__ = [
    "MalformedInput",
    "OtlpJsonReader",
    "OtlpJsonSpanExporter",
    "SpanLine",
    "encode_request",
    "parse_request",
]

_GZIP_MAGIC: Final = b"\x1f\x8b"
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_KINDS: Final = {
    0: SpanKind.INTERNAL,  # SPAN_KIND_UNSPECIFIED
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
}
_KIND_NUMBERS: Final = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_STATUS: Final = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_STATUS_NUMBERS: Final = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_UNSET_STATUS: Final = Status(StatusCode.UNSET)
_OK_STATUS: Final = Status(StatusCode.OK)
_TRACE_FLAGS: Final = tuple(TraceFlags(flags) for flags in range(256))
_TRACE_ID: Final = re.compile(r"[0-9a-fA-F]{32}").fullmatch
_SPAN_ID: Final = re.compile(r"[0-9a-fA-F]{16}").fullmatch
_UINT64_LIMIT: Final = 1 << 64
# Resources and scopes repeat on every line; sharing them keeps memory flat for long files.
_CACHE_LIMIT: Final = 4096


class MalformedInput(Exception):
    """A file that cannot be read, or a line that is not an OTLP/JSON trace request.

    ``str()`` is the one-line message ``FILE:LINE: what`` (``FILE: what`` without a line).
    """

    def __init__(self, path: str, line: int | None, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.message = message

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


class _Attributes(dict[str, AttributeValue]):
    """A decoded span's attributes: a plain dictionary that also answers ``_dict`` with itself.

    The SDK's attribute store keeps its entries in ``_dict``; the guard's hot path reads that
    first, and a plain dictionary would make it take a raised ``AttributeError`` per call.
    """

    __slots__ = ()

    @property
    def _dict(self) -> dict[str, AttributeValue]:
        return self


class _RecordedSpan(ReadableSpan):
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
        attributes: _Attributes,
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


def _context(trace_id: int, span_id: int, flags: TraceFlags) -> SpanContext:
    """A local span context for IDs already checked to be non-zero and in range.

    ``SpanContext.__new__`` only re-checks that and fills in defaults; the tuple is the same.
    """
    return _new_tuple(SpanContext, (trace_id, span_id, False, flags, DEFAULT_TRACE_STATE, True))


class _Shape(Exception):
    """A shape error inside one line, with its path; the reader adds the file and line.

    Paths are built only when an error is raised (callers prefix their part on the way out),
    so a well-formed line costs no string formatting.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def within(self, prefix: str) -> _Shape:
        self.path = prefix + self.path
        return self

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


# -- reading ---------------------------------------------------------------------------------

_TYPE_NAMES: Final = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def _expect(value: object, kind: type, path: str) -> Any:
    if type(value) is kind:
        return value
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise _Shape(f"expected {_TYPE_NAMES.get(kind, kind.__name__)}", path)


def _hex_id(value: object, length: int, path: str, *, optional: bool = False) -> int:
    if optional and (value is None or value == ""):
        return 0
    if type(value) is not str or len(value) != length or not _HEX.issuperset(value):
        raise _Shape(f"expected {length} hex digits", path)
    number = int(value, 16)
    if number == 0 and not optional:
        raise _Shape("an all-zero ID is invalid", path)
    return number


def _uint64(value: object, path: str) -> int:
    if type(value) is str and len(value) <= 20 and value.isdigit() and value.isascii():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise _Shape("expected an unsigned integer (number or decimal string)", path)
    if not 0 <= number < 1 << 64:
        raise _Shape("out of range", path)
    return number


def _any_value(body: dict[str, Any]) -> AttributeValue | None:
    """An OTLP ``AnyValue`` as a span attribute value; ``None`` for what spans cannot hold."""
    if not body:
        return None
    if len(body) != 1:
        raise _Shape("expected exactly one value field")
    ((field, inner),) = body.items()
    if field == "stringValue":
        return _expect(inner, str, ".stringValue")  # type: ignore[no-any-return]
    if field == "boolValue":
        if type(inner) is not bool:
            raise _Shape("expected a boolean", ".boolValue")
        return inner
    if field == "intValue":
        if type(inner) is int:
            return inner
        if type(inner) is str:
            try:
                return int(inner, 10)
            except ValueError:
                pass
        raise _Shape("expected an integer (number or decimal string)", ".intValue")
    if field == "doubleValue":
        if type(inner) in (int, float):
            return float(inner)
        if inner in ("NaN", "Infinity", "-Infinity"):
            return float(inner)  # Python reads the three JSON spellings itself
        raise _Shape("expected a number", ".doubleValue")
    if field == "arrayValue":
        array = _expect(inner, dict, ".arrayValue")
        values = _expect(array.get("values", []), list, ".arrayValue.values")
        kept = []
        for index, item in enumerate(values):
            try:
                converted = _any_value(_expect(item, dict, ""))
            except _Shape as error:
                raise error.within(f".arrayValue.values[{index}]") from None
            if converted is not None:
                kept.append(converted)
        # Span attributes hold homogeneous arrays of primitives only.
        if any(isinstance(v, tuple) for v in kept) or len({type(v) for v in kept}) > 1:
            return None
        return tuple(kept)
    if field == "kvlistValue":
        kvlist = _expect(inner, dict, ".kvlistValue")
        try:
            _attributes(kvlist.get("values", []))
        except _Shape as error:
            raise error.within(".kvlistValue.values") from None
        return None  # a map is not a span attribute value; validated, then left out
    if field == "bytesValue":
        text = _expect(inner, str, ".bytesValue")
        try:
            base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise _Shape("expected base64", ".bytesValue") from None
        return None  # bytes are not a span attribute value
    raise _Shape(f"unknown value field {field!r}")


def _scalar(body: dict[str, Any]) -> str | int | bool | None:
    """A one-field AnyValue holding a string, a decimal-string integer or a boolean, decoded and
    fully checked; ``None`` for any other shape, which the full decoder then reads."""
    inner = body.get("stringValue")
    if type(inner) is str:
        return inner
    inner = body.get("intValue")
    if type(inner) is str and len(inner) <= 18 and inner.isdigit() and inner.isascii():
        return int(inner)
    inner = body.get("boolValue")
    if type(inner) is bool:
        return inner
    return None


def _attributes(value: object) -> _Attributes:
    entries = _expect(value, list, "")
    result = _Attributes()
    for index, item in enumerate(entries):
        # The common case first: a string-keyed string or integer value, fully checked here.
        if type(item) is dict:
            key = item.get("key")
            body = item.get("value")
            if type(key) is str and type(body) is dict and len(body) == 1:
                scalar = _scalar(body)
                if scalar is not None:
                    result[key] = scalar
                    continue
        try:
            entry = _expect(item, dict, "")
            key = _expect(entry.get("key"), str, ".key")
            try:
                converted = _any_value(_expect(entry.get("value", {}), dict, ""))
            except _Shape as error:
                raise error.within(".value") from None
        except _Shape as error:
            raise error.within(f"[{index}]") from None
        if converted is not None:
            result[key] = converted
    return result


def _hashable(attributes: Mapping[str, AttributeValue]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(attributes.items()))


class _Interner:
    """Shares equal resources and scopes between lines, within a bounded table."""

    def __init__(self) -> None:
        self._resources: dict[tuple[tuple[str, object], ...], Resource] = {}
        self._scopes: dict[tuple[str, str | None, str | None], InstrumentationScope] = {}

    def resource(self, attributes: dict[str, AttributeValue], schema_url: str) -> Resource:
        key = (*_hashable(attributes), ("", schema_url))
        found = self._resources.get(key)
        if found is None:
            if len(self._resources) >= _CACHE_LIMIT:
                self._resources.clear()
            found = self._resources[key] = Resource(attributes, schema_url)
        return found

    def scope(self, name: str, version: str | None, schema_url: str | None) -> InstrumentationScope:
        key = (name, version, schema_url)
        found = self._scopes.get(key)
        if found is None:
            if len(self._scopes) >= _CACHE_LIMIT:
                self._scopes.clear()
            found = self._scopes[key] = InstrumentationScope(name, version, schema_url)
        return found


def parse_request(text: str) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest`` line.

    Raises :class:`ValueError` with a description (no file or line) when the line is not one.
    """
    try:
        return _parse_request(text, _Interner())
    except _Shape as error:
        raise ValueError(str(error)) from None


def _parse_request(text: str, interner: _Interner) -> list[ReadableSpan]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise _Shape(f"invalid JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise _Shape("invalid JSON (nested too deeply)") from None
    except ValueError:  # e.g. a number longer than Python converts
        raise _Shape("invalid JSON (a value out of range)") from None
    request = _expect(document, dict, "request")
    if "resourceSpans" not in request:
        raise _Shape("not a trace export request (no resourceSpans)")
    spans: list[ReadableSpan] = []
    # IDs repeat within a line (every span of a trace, every child of a parent): each is read,
    # checked and turned into a SpanContext once per line.
    contexts: _Contexts = ({}, {})
    for r, resource_spans in enumerate(_expect(request["resourceSpans"], list, "resourceSpans")):
        try:
            _resource_spans(resource_spans, interner, spans, contexts)
        except _Shape as error:
            raise error.within(f"resourceSpans[{r}]") from None
    return spans


# Per line: trace ID text -> trace ID, and span ID text -> the SpanContext last built for it.
_Contexts = tuple[dict[str, int], dict[str, SpanContext]]


def _resource_spans(
    value: object, interner: _Interner, spans: list[ReadableSpan], contexts: _Contexts
) -> None:
    block = _expect(value, dict, "")
    resource_body = _expect(block.get("resource", {}), dict, ".resource")
    try:
        resource_attributes = _attributes(resource_body.get("attributes", []))
    except _Shape as error:
        raise error.within(".resource.attributes") from None
    resource = interner.resource(
        resource_attributes, _expect(block.get("schemaUrl", ""), str, ".schemaUrl")
    )
    for s, scope_spans in enumerate(_expect(block.get("scopeSpans", []), list, ".scopeSpans")):
        prefix = f".scopeSpans[{s}]"
        scope_block = _expect(scope_spans, dict, prefix)
        scope_body = _expect(scope_block.get("scope", {}), dict, f"{prefix}.scope")
        scope = interner.scope(
            _expect(scope_body.get("name", ""), str, f"{prefix}.scope.name"),
            _expect(scope_body.get("version", ""), str, f"{prefix}.scope.version") or None,
            _expect(scope_block.get("schemaUrl", ""), str, f"{prefix}.schemaUrl") or None,
        )
        append = spans.append
        for i, span in enumerate(_expect(scope_block.get("spans", []), list, f"{prefix}.spans")):
            read = _common_span(span, resource, scope, contexts)
            if read is None:
                # Anything uncommon, valid or not, is read (or described) by the full reader.
                try:
                    read = _span(span, resource, scope)
                except _Shape as error:
                    raise error.within(f"{prefix}.spans[{i}]") from None
            if type(span) is dict and "events" in span:
                read._events = _exception_events(span["events"])
            append(read)


_EXCEPTION_EVENT: Final = "exception"
_EXCEPTION_TYPE: Final = "exception.type"


def _exception_events(value: object) -> tuple[Event, ...]:
    """The span's ``exception`` events with their ``exception.type`` only: the guard's reading
    of GenAI tool spans takes the error type from them when ``error.type`` is missing."""
    if type(value) is not list:
        return ()
    found: list[Event] = []
    for event in value:
        if type(event) is not dict or event.get("name") != _EXCEPTION_EVENT:
            continue
        try:
            attributes = _attributes(event.get("attributes", _NO_ATTRIBUTES))
        except _Shape:
            continue
        raised = attributes.get(_EXCEPTION_TYPE)
        time = event.get("timeUnixNano")
        found.append(
            Event(
                _EXCEPTION_EVENT,
                {_EXCEPTION_TYPE: raised} if type(raised) is str else {},
                int(time) if type(time) is str and time.isdigit() else None,
            )
        )
    return tuple(found)


def _common_span(
    body: object, resource: Resource, scope: InstrumentationScope, contexts: _Contexts
) -> ReadableSpan | None:
    """The span as :func:`_span` reads it, for the shapes the Collector writes; else ``None``.

    Every check here is one :func:`_span` makes, so whatever this accepts, :func:`_span` accepts
    and reads the same; what it declines goes to :func:`_span`, which reads it or describes the
    fault. It exists because replay reads hundreds of thousands of spans.
    """
    if type(body) is not dict:
        return None
    try:
        trace_text = body["traceId"]
        span_text = body["spanId"]
        start = body["startTimeUnixNano"]
        end = body["endTimeUnixNano"]
    except KeyError:
        return None
    get = body.get
    trace_ids, by_span_id = contexts

    if type(trace_text) is not str:
        return None
    trace_id = trace_ids.get(trace_text)
    if trace_id is None:
        if _TRACE_ID(trace_text) is None:
            return None
        trace_id = int(trace_text, 16)
        if not trace_id:
            return None
        trace_ids[trace_text] = trace_id
    flags = get("flags", 1)
    if type(flags) is not int or not 0 <= flags < _UINT64_LIMIT:
        return None
    trace_flags = _TRACE_FLAGS[flags & 0xFF]

    if type(span_text) is not str:
        return None
    context = by_span_id.get(span_text)
    if context is None or context[0] != trace_id or context[3] is not trace_flags:
        if _SPAN_ID(span_text) is None:
            return None
        span_id = int(span_text, 16)
        if not span_id:
            return None
        context = by_span_id[span_text] = _context(trace_id, span_id, trace_flags)

    parent_text = get("parentSpanId")
    parent: SpanContext | None = None
    if parent_text is not None and parent_text != "":
        if type(parent_text) is not str:
            return None
        parent = by_span_id.get(parent_text)
        if parent is None or parent[0] != trace_id or parent[3] is not trace_flags:
            if _SPAN_ID(parent_text) is None:
                return None
            parent_id = int(parent_text, 16)
            parent = None if not parent_id else _context(trace_id, parent_id, trace_flags)
            if parent is not None:
                by_span_id[parent_text] = parent

    if type(start) is str and start.isdigit() and start.isascii() and len(start) <= 20:
        start = int(start)
    elif type(start) is not int:
        return None
    if type(end) is str and end.isdigit() and end.isascii() and len(end) <= 20:
        end = int(end)
    elif type(end) is not int:
        return None
    if not 0 <= start <= end < _UINT64_LIMIT:
        return None

    kind_number = get("kind", 0)
    if type(kind_number) is not int:
        return None
    kind = _KINDS.get(kind_number)
    if kind is None:
        return None
    status_body = get("status", _NO_STATUS)
    if type(status_body) is not dict:
        return None
    status = _UNSET_STATUS
    if status_body:
        code = status_body.get("code", 0)
        message = status_body.get("message", "")
        if type(code) is not int or type(message) is not str:
            return None
        if code == 2:
            status = Status(StatusCode.ERROR, message or None)
        elif code == 1:
            status = _OK_STATUS
        elif code != 0:
            return None
    if "events" in body and type(body["events"]) is not list:
        return None
    if "links" in body and type(body["links"]) is not list:
        return None
    name = get("name", "")
    if type(name) is not str:
        return None
    entries = get("attributes", _NO_ATTRIBUTES)
    if type(entries) is not list:
        return None
    attributes = _common_attributes(entries)
    if attributes is None:
        return None
    return _RecordedSpan(
        name, context, parent, resource, attributes, kind, status, start, end, scope
    )


def _common_attributes(entries: list[Any]) -> _Attributes | None:
    """The attributes as :func:`_attributes` reads them, or ``None`` when one is malformed."""
    result = _Attributes()
    for item in entries:
        if type(item) is not dict:
            return None
        try:
            key = item["key"]
            body = item["value"]
        except KeyError:
            return None
        if type(key) is not str or type(body) is not dict or len(body) != 1:
            return None
        # Most values are strings: read here; the others as _attributes reads them.
        value = body.get("stringValue")
        if type(value) is not str:
            value = _scalar(body)
            if value is None:
                try:
                    value = _any_value(body)
                except _Shape:
                    return None
                if value is None:
                    continue
        result[key] = value
    return result


def _span(value: object, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    body = _expect(value, dict, "")
    get = body.get
    trace_id = _hex_id(get("traceId"), 32, ".traceId")
    span_id = _hex_id(get("spanId"), 16, ".spanId")
    parent_id = _hex_id(get("parentSpanId"), 16, ".parentSpanId", optional=True)
    start = _uint64(get("startTimeUnixNano"), ".startTimeUnixNano")
    end = _uint64(get("endTimeUnixNano"), ".endTimeUnixNano")
    if end < start:
        raise _Shape("endTimeUnixNano is before startTimeUnixNano")
    kind = _KINDS.get(_expect(get("kind", 0), int, ".kind"))
    if kind is None:
        raise _Shape("unknown span kind", ".kind")
    flags = TraceFlags(_uint64(get("flags", 1), ".flags") & 0xFF)
    status_body = _expect(get("status", _NO_STATUS), dict, ".status")
    status = _UNSET_STATUS
    if status_body:
        code = _STATUS.get(_expect(status_body.get("code", 0), int, ".status.code"))
        if code is None:
            raise _Shape("unknown status code", ".status.code")
        message = _expect(status_body.get("message", ""), str, ".status.message")
        status = Status(code, message or None) if code is StatusCode.ERROR else Status(code)
    if "events" in body:
        _expect(body["events"], list, ".events")
    if "links" in body:
        _expect(body["links"], list, ".links")
    try:
        attributes = _attributes(get("attributes", _NO_ATTRIBUTES))
    except _Shape as error:
        raise error.within(".attributes") from None
    return _RecordedSpan(
        _expect(get("name", ""), str, ".name"),
        _context(trace_id, span_id, flags),
        _context(trace_id, parent_id, flags) if parent_id else None,
        resource,
        attributes,
        kind,
        status,
        start,
        end,
        scope,
    )


_NO_STATUS: Final[dict[str, Any]] = {}
_NO_ATTRIBUTES: Final[list[Any]] = []


@dataclass(frozen=True, slots=True)
class SpanLine:
    """The spans of one non-blank input line, and where it was read."""

    path: str
    line: int
    spans: list[ReadableSpan]


class OtlpJsonReader:
    """Streams OTLP/JSON trace files, one line at a time, as one input.

    Files are read in the order given; gzip files are recognised by their content. Progress is
    visible through :attr:`bytes_read` (bytes of the files as stored) and :attr:`total_bytes`.
    Iteration raises :class:`MalformedInput` at the first unreadable file or malformed line; the
    lines already yielded stay valid.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self.total_bytes = sum(_size(p) for p in self.paths)
        self.bytes_read = 0
        self._interner = _Interner()

    def __iter__(self) -> Iterator[SpanLine]:
        done = 0
        for path in self.paths:
            yield from self._read(path, done)
            done += _size(path)
            self.bytes_read = done

    def _read(self, path: str, done: int) -> Iterator[SpanLine]:
        try:
            raw = open(path, "rb")  # noqa: SIM115  # closed below; the stream is re-wrapped
        except OSError as error:
            raise MalformedInput(path, None, f"cannot read ({error.strerror or error})") from None
        with raw:
            stream: Iterable[bytes] = raw
            if raw.read(2) == _GZIP_MAGIC:
                raw.seek(0)
                stream = gzip.GzipFile(fileobj=raw, mode="rb")
            else:
                raw.seek(0)
            number = 0
            lines = iter(stream)
            while True:
                try:
                    data = next(lines)
                except StopIteration:
                    return
                except (OSError, EOFError, zlib.error) as error:
                    raise MalformedInput(path, number + 1, _read_error(error)) from None
                number += 1
                self.bytes_read = done + raw.tell()
                if not data.strip():
                    continue
                try:
                    text = data.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    raise MalformedInput(path, number, "not UTF-8 text") from None
                try:
                    spans = _parse_request(text, self._interner)
                except _Shape as error:
                    raise MalformedInput(path, number, str(error)) from None
                yield SpanLine(path, number, spans)


def _read_error(error: BaseException) -> str:
    if isinstance(error, EOFError):
        return "compressed data ends early (truncated gzip file)"
    if isinstance(error, gzip.BadGzipFile | zlib.error):
        return "corrupt gzip data"
    return f"cannot read ({getattr(error, 'strerror', None) or error})"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- writing ---------------------------------------------------------------------------------


def _encode_value(value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {
            "doubleValue": "NaN"
            if math.isnan(value)
            else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_encode_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _encode_attributes(attributes: Mapping[str, object] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _encode_value(v)} for k, v in (attributes or {}).items()]


def _encode_span(span: ReadableSpan) -> dict[str, Any]:
    context = span.context
    if context is None:
        raise ValueError("a span without a context cannot be encoded")
    body: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
    }
    if span.parent is not None:
        body["parentSpanId"] = f"{span.parent.span_id:016x}"
    body["flags"] = int(context.trace_flags)
    body["name"] = span.name
    body["kind"] = _KIND_NUMBERS.get(span.kind, 1)
    body["startTimeUnixNano"] = str(span.start_time or 0)
    body["endTimeUnixNano"] = str(span.end_time or span.start_time or 0)
    attributes = _encode_attributes(span.attributes)
    if attributes:
        body["attributes"] = attributes
    status: dict[str, Any] = {}
    if span.status.status_code is not StatusCode.UNSET:
        status["code"] = _STATUS_NUMBERS[span.status.status_code]
        if span.status.description:
            status["message"] = span.status.description
    body["status"] = status
    if span.events:
        body["events"] = [
            {
                "timeUnixNano": str(event.timestamp or 0),
                "name": event.name,
                "attributes": _encode_attributes(event.attributes),
            }
            for event in span.events
        ]
    return body


def encode_request(spans: Iterable[ReadableSpan]) -> dict[str, Any]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` holding ``spans``, grouped by resource and scope.

    IDs are hex, 64-bit integers are decimal strings, as the Collector ``file`` exporter writes.
    """
    by_resource: dict[int, tuple[Resource, dict[object, tuple[Any, list[dict[str, Any]]]]]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        scope_key = None if scope is None else (scope.name, scope.version, scope.schema_url)
        scopes.setdefault(scope_key, (scope, []))[1].append(_encode_span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for scope, encoded in scopes.values():
            block: dict[str, Any] = {"scope": {}}
            if scope is not None:
                block["scope"] = {"name": scope.name}
                if scope.version:
                    block["scope"]["version"] = scope.version
                if scope.schema_url:
                    block["schemaUrl"] = scope.schema_url
            block["spans"] = encoded
            scope_spans.append(block)
        entry: dict[str, Any] = {
            "resource": {"attributes": _encode_attributes(resource.attributes)},
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans}


class OtlpJsonSpanExporter(SpanExporter):
    """Writes each exported batch of spans as one OTLP/JSON line to a text stream.

    The stream is not closed by :meth:`shutdown`; whoever opened it closes it.
    """

    def __init__(self, stream: io.TextIOBase | IO[str]) -> None:
        self._stream = stream
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            self._stream.write(json.dumps(encode_request(spans), separators=(",", ":")) + "\n")
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            return False
        return True
