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
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
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


class _Shape(Exception):
    """A shape error inside one line; the reader adds the file and line."""


# -- reading ---------------------------------------------------------------------------------


def _expect(value: object, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Shape(f"{where}: expected {_TYPE_NAMES.get(kind, kind.__name__)}")
    return value


_TYPE_NAMES: Final = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def _hex_id(value: object, length: int, where: str, *, optional: bool = False) -> int:
    if optional and (value is None or value == ""):
        return 0
    if not isinstance(value, str) or len(value) != length or not _HEX.issuperset(value):
        raise _Shape(f"{where}: expected {length} hex digits")
    number = int(value, 16)
    if number == 0 and not optional:
        raise _Shape(f"{where}: an all-zero ID is invalid")
    return number


def _uint64(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isdigit() and value.isascii():
        number = int(value)
    else:
        raise _Shape(f"{where}: expected an unsigned integer (number or decimal string)")
    if not 0 <= number < 1 << 64:
        raise _Shape(f"{where}: out of range")
    return number


def _any_value(value: object, where: str) -> AttributeValue | None:
    """An OTLP ``AnyValue`` as a span attribute value; ``None`` for what spans cannot hold."""
    body = _expect(value, dict, where)
    if not body:
        return None
    if len(body) != 1:
        raise _Shape(f"{where}: expected exactly one value field")
    ((field, inner),) = body.items()
    if field == "stringValue":
        return _expect(inner, str, f"{where}.stringValue")  # type: ignore[no-any-return]
    if field == "boolValue":
        return _expect(inner, bool, f"{where}.boolValue")  # type: ignore[no-any-return]
    if field == "intValue":
        if isinstance(inner, int) and not isinstance(inner, bool):
            return inner
        if isinstance(inner, str):
            try:
                return int(inner, 10)
            except ValueError:
                pass
        raise _Shape(f"{where}.intValue: expected an integer (number or decimal string)")
    if field == "doubleValue":
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return float(inner)
        if inner in ("NaN", "Infinity", "-Infinity"):
            return float(inner)  # Python reads the three JSON spellings itself
        raise _Shape(f"{where}.doubleValue: expected a number")
    if field == "arrayValue":
        array = _expect(inner, dict, f"{where}.arrayValue")
        values = _expect(array.get("values", []), list, f"{where}.arrayValue.values")
        items = [_any_value(v, f"{where}.arrayValue.values[{i}]") for i, v in enumerate(values)]
        kept = [v for v in items if v is not None]
        # Span attributes hold homogeneous arrays of primitives only.
        if any(isinstance(v, (tuple, list)) for v in kept) or len({type(v) for v in kept}) > 1:
            return None
        return tuple(kept)
    if field == "kvlistValue":
        kvlist = _expect(inner, dict, f"{where}.kvlistValue")
        _attributes(kvlist.get("values", []), f"{where}.kvlistValue.values")
        return None  # a map is not a span attribute value; validated, then left out
    if field == "bytesValue":
        text = _expect(inner, str, f"{where}.bytesValue")
        try:
            base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise _Shape(f"{where}.bytesValue: expected base64") from None
        return None  # bytes are not a span attribute value
    raise _Shape(f"{where}: unknown value field {field!r}")


def _attributes(value: object, where: str) -> dict[str, AttributeValue]:
    entries = _expect(value, list, where)
    result: dict[str, AttributeValue] = {}
    for index, entry in enumerate(entries):
        item = _expect(entry, dict, f"{where}[{index}]")
        key = _expect(item.get("key"), str, f"{where}[{index}].key")
        converted = _any_value(item.get("value", {}), f"{where}[{index}].value")
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


def parse_request(text: str, interner: _Interner | None = None) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest`` line.

    Raises :class:`ValueError` with a description (no file or line) when the line is not one.
    """
    try:
        return _parse_request(text, interner or _Interner())
    except _Shape as error:
        raise ValueError(str(error)) from None


def _parse_request(text: str, interner: _Interner) -> list[ReadableSpan]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise _Shape(f"invalid JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise _Shape("invalid JSON (nested too deeply)") from None
    request = _expect(document, dict, "request")
    if "resourceSpans" not in request:
        raise _Shape("not a trace export request (no resourceSpans)")
    spans: list[ReadableSpan] = []
    for r, resource_spans in enumerate(_expect(request["resourceSpans"], list, "resourceSpans")):
        where_r = f"resourceSpans[{r}]"
        block = _expect(resource_spans, dict, where_r)
        resource_body = _expect(block.get("resource", {}), dict, f"{where_r}.resource")
        resource = interner.resource(
            _attributes(resource_body.get("attributes", []), f"{where_r}.resource.attributes"),
            _expect(block.get("schemaUrl", ""), str, f"{where_r}.schemaUrl"),
        )
        for s, scope_spans in enumerate(_expect(block.get("scopeSpans", []), list, where_r)):
            where_s = f"{where_r}.scopeSpans[{s}]"
            scope_block = _expect(scope_spans, dict, where_s)
            scope_body = _expect(scope_block.get("scope", {}), dict, f"{where_s}.scope")
            scope = interner.scope(
                _expect(scope_body.get("name", ""), str, f"{where_s}.scope.name"),
                _expect(scope_body.get("version", ""), str, f"{where_s}.scope.version") or None,
                _expect(scope_block.get("schemaUrl", ""), str, f"{where_s}.schemaUrl") or None,
            )
            for i, span in enumerate(_expect(scope_block.get("spans", []), list, where_s)):
                spans.append(_span(span, f"{where_s}.spans[{i}]", resource, scope))
    return spans


def _span(
    value: object, where: str, resource: Resource, scope: InstrumentationScope
) -> ReadableSpan:
    body = _expect(value, dict, where)
    trace_id = _hex_id(body.get("traceId"), 32, f"{where}.traceId")
    span_id = _hex_id(body.get("spanId"), 16, f"{where}.spanId")
    parent_id = _hex_id(body.get("parentSpanId"), 16, f"{where}.parentSpanId", optional=True)
    start = _uint64(body.get("startTimeUnixNano"), f"{where}.startTimeUnixNano")
    end = _uint64(body.get("endTimeUnixNano"), f"{where}.endTimeUnixNano")
    if end < start:
        raise _Shape(f"{where}: endTimeUnixNano is before startTimeUnixNano")
    kind = _KINDS.get(_expect(body.get("kind", 0), int, f"{where}.kind"))
    if kind is None:
        raise _Shape(f"{where}.kind: unknown span kind")
    flags = _uint64(body.get("flags", 1), f"{where}.flags") & 0xFF
    status_body = _expect(body.get("status", {}), dict, f"{where}.status")
    status = _UNSET_STATUS
    if status_body:
        code = _STATUS.get(_expect(status_body.get("code", 0), int, f"{where}.status.code"))
        if code is None:
            raise _Shape(f"{where}.status.code: unknown status code")
        message = _expect(status_body.get("message", ""), str, f"{where}.status.message")
        status = Status(code, message or None) if code is StatusCode.ERROR else Status(code)
    _expect(body.get("events", []), list, f"{where}.events")
    _expect(body.get("links", []), list, f"{where}.links")
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags))
    parent = (
        SpanContext(trace_id, parent_id, is_remote=False, trace_flags=TraceFlags(flags))
        if parent_id
        else None
    )
    return ReadableSpan(
        name=_expect(body.get("name", ""), str, f"{where}.name"),
        context=context,
        parent=parent,
        resource=resource,
        attributes=_attributes(body.get("attributes", []), f"{where}.attributes"),
        kind=kind,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


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
