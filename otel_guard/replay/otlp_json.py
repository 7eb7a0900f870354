"""OTLP trace requests, as the OpenTelemetry Collector ``file`` exporter writes them.

Each non-blank line is one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding: trace and
span IDs are hex strings (or, as the Collector's own JSON reader also accepts, the base64 of
the generic protobuf JSON mapping), 64-bit integers may be strings or numbers, enum values are
numbers or names (``"SPAN_KIND_SERVER"``, ``"STATUS_CODE_ERROR"``). :func:`parse_json_request`
reads one such request into :class:`~opentelemetry.sdk.trace.ReadableSpan` objects (the
recorded-span model of :mod:`otel_guard.replay.recorded`);
:class:`otel_guard.replay.reader.TraceReader`
streams whole inputs through it. :func:`encode_request` and :class:`OtlpJsonSpanExporter` write
them. Requests of other signals (logs, metrics, profiles) raise
:class:`~otel_guard.replay.recorded.OtherSignal`, and the reader skips and counts them.

Only what a trace replay needs is reconstructed: IDs, parent, name, kind, times, attributes,
status, resource and scope; events and links must be arrays and are otherwise skipped. Any
line that is not a well-formed request raises :class:`MalformedInput` naming the file and line;
nothing of that line is returned.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Final, NamedTuple, Protocol

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

from otel_guard.replay.recorded import (
    HAS_REMOTE_FLAG,
    KINDS,
    OK_STATUS,
    REMOTE_PARENT_FLAGS,
    STATUS,
    TRACE_FLAGS,
    UNSET_STATUS,
    Attributes,
    Interner,
    OtherSignal,
    RecordedSpan,
    Shape,
    parent_context,
    span_context,
)
from otel_guard.replay.trace_input import (
    MalformedInput,
)
from otel_guard.spans import attributes as attr

__all__ = [
    "Decoded",
    "MalformedInput",
    "OtlpJsonSpanExporter",
    "Router",
    "Skipped",
    "encode_document",
    "encode_line",
    "encode_request",
    "id_number",
    "parse_json_request",
    "parse_request",
]

_HEX: Final = frozenset("0123456789abcdefABCDEF")
_KIND_NUMBERS: Final = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_KIND_NAMES: Final = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_NAMES: Final = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_STATUS_NUMBERS: Final = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_UINT64_LIMIT: Final = 1 << 64
_new_tuple = tuple.__new__


# -- reading ---------------------------------------------------------------------------------

_TYPE_NAMES: Final = {dict: "an object", list: "an array", str: "a string", int: "an integer"}


def _expect(value: object, kind: type, path: str) -> Any:
    if type(value) is kind:
        return value
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise Shape(f"expected {_TYPE_NAMES.get(kind, kind.__name__)}", path)


def _base64_lengths(size: int) -> tuple[int, int]:
    """The lengths of ``size`` bytes in base64, padded and unpadded."""
    return 4 * ((size + 2) // 3), (8 * size + 5) // 6


def id_number(text: str, size: int) -> int | None:
    """An ID of ``size`` bytes written as hex or as base64 (standard or URL-safe alphabet,
    padded or not); ``None`` when it is neither."""
    if len(text) == 2 * size:
        if _HEX.issuperset(text):
            return int(text, 16)
        return None
    if not text.isascii() or len(text) not in _base64_lengths(size):
        return None
    padded = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
    try:
        raw = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return int.from_bytes(raw, "big") if len(raw) == size else None


def _hex_id(value: object, length: int, path: str, *, optional: bool = False) -> int:
    if optional and (value is None or value == ""):
        return 0
    number = None if type(value) is not str else id_number(value, length // 2)
    if number is None:
        if type(value) is str and len(value) in _base64_lengths(length // 2):
            raise Shape(f"expected the base64 of {length // 2} bytes", path)
        raise Shape(f"expected {length} hex digits", path)
    if number == 0 and not optional:
        raise Shape("an all-zero ID is invalid", path)
    return number


def _enum(value: object, names: Mapping[str, int], path: str) -> int:
    if type(value) is str:
        number = names.get(value)
        if number is None:
            raise Shape(f"unknown name {value!r}", path)
        return number
    return _expect(value, int, path)  # type: ignore[no-any-return]


def _uint64(value: object, path: str) -> int:
    if type(value) is str and len(value) <= 20 and value.isdigit() and value.isascii():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise Shape("expected an unsigned integer (number or decimal string)", path)
    if not 0 <= number < 1 << 64:
        raise Shape("out of range", path)
    return number


def _any_value(body: dict[str, Any]) -> AttributeValue | None:
    """An OTLP ``AnyValue`` as a span attribute value; ``None`` for what spans cannot hold."""
    if not body:
        return None
    if len(body) != 1:
        raise Shape("expected exactly one value field")
    ((field, inner),) = body.items()
    if field == "stringValue":
        return _expect(inner, str, ".stringValue")  # type: ignore[no-any-return]
    if field == "boolValue":
        if type(inner) is not bool:
            raise Shape("expected a boolean", ".boolValue")
        return inner
    if field == "intValue":
        if type(inner) is int:
            return inner
        if type(inner) is str:
            try:
                return int(inner, 10)
            except ValueError:
                pass
        raise Shape("expected an integer (number or decimal string)", ".intValue")
    if field == "doubleValue":
        if type(inner) in (int, float):
            return float(inner)
        if inner in ("NaN", "Infinity", "-Infinity"):
            return float(inner)  # Python reads the three JSON spellings itself
        raise Shape("expected a number", ".doubleValue")
    if field == "arrayValue":
        array = _expect(inner, dict, ".arrayValue")
        values = _expect(array.get("values", []), list, ".arrayValue.values")
        kept = []
        for index, item in enumerate(values):
            try:
                converted = _any_value(_expect(item, dict, ""))
            except Shape as error:
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
        except Shape as error:
            raise error.within(".kvlistValue.values") from None
        return None  # a map is not a span attribute value; validated, then left out
    if field == "bytesValue":
        text = _expect(inner, str, ".bytesValue")
        try:
            base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise Shape("expected base64", ".bytesValue") from None
        return None  # bytes are not a span attribute value
    raise Shape(f"unknown value field {field!r}")


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


def _attributes(value: object) -> Attributes:
    entries = _expect(value, list, "")
    result = Attributes()
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
            except Shape as error:
                raise error.within(".value") from None
        except Shape as error:
            raise error.within(f"[{index}]") from None
        if converted is not None:
            result[key] = converted
    return result


# The request keys of the other signals, as the OTLP/JSON encoding names them.
_OTHER_SIGNALS: Final = {
    "resourceLogs": "logs",
    "resourceMetrics": "metrics",
    "resourceProfiles": "profiles",
}
_OTHER_SIGNAL_PREFIXES: Final = tuple(
    (f'{{"{key}"'.encode(), signal) for key, signal in _OTHER_SIGNALS.items()
)


def _load_fast() -> Callable[[bytes], Any] | None:
    """``orjson.loads`` when the ``fast`` extra is installed (it reads a trace line about twice
    as fast as the standard library), else ``None``."""
    try:
        return importlib.import_module("orjson").loads  # type: ignore[no-any-return]
    except ImportError:
        return None


_loads_fast: Final = _load_fast()
# Its encoder, for the parts of decoded requests that replay --jobs hands between processes.
_dumps_fast: Final[Callable[[Any], bytes] | None] = (
    None if _loads_fast is None else importlib.import_module("orjson").dumps
)


def _load(data: bytes) -> Any:
    """The JSON document in ``data``, decoded by the standard library, which words the error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Shape("not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        # Some of the decoder's messages end in "at" already ("Unterminated string starting at").
        message = error.msg.removesuffix(" at")
        raise Shape(f"invalid JSON ({message} at column {error.colno})") from None
    except RecursionError:
        raise Shape("invalid JSON (nested too deeply)") from None
    except ValueError:  # e.g. a number longer than Python converts
        raise Shape("invalid JSON (a value out of range)") from None


def parse_request(text: str | bytes) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest`` line.

    Raises :class:`ValueError` with a description (no file or line) when the line is not one,
    including a request of another signal.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    try:
        return parse_json_request(data, Interner())
    except Shape as error:
        raise ValueError(str(error)) from None
    except OtherSignal as other:
        raise ValueError(f"not a trace export request ({other.signal})") from None


def parse_json_request(
    data: bytes,
    interner: Interner,
    router: Router | None = None,
    documents: list[Decoded] | None = None,
) -> list[Any]:
    """The spans of one OTLP/JSON line (with a ``router``, placeholders for the spans of traces
    another process replays). With ``documents``, the decoded request is appended to it, so that
    :func:`encode_document` can write a part of it again."""
    for prefix, signal in _OTHER_SIGNAL_PREFIXES:
        if data.startswith(prefix):  # skipped without decoding: log lines can be large
            raise OtherSignal(signal)
    if _loads_fast is not None:
        # The fast decoder declines some lines (a bare NaN, deep nesting) and reads integers
        # beyond 64 bits as floats; a line it declines, or whose reading finds a fault, is read
        # again by the standard library and judged on that, so both accept the same lines and
        # word the same errors.
        try:
            document = _loads_fast(data)
            spans = _request(document, interner, router)
        except (ValueError, Shape):
            pass
        else:
            if documents is not None:
                documents.append(Decoded(document, fast=True))
            return spans
    document = _load(data)
    spans = _request(document, interner, router)
    if documents is not None:
        documents.append(Decoded(document, fast=False))
    return spans


class Decoded(NamedTuple):
    """A request as :func:`parse_json_request` decoded it, and by which decoder."""

    document: Any
    fast: bool


def encode_document(document: Any, fast: bool) -> bytes:
    """JSON text that :func:`parse_json_request` decodes to ``document`` again, a document (or a
    part of one) that the decoder named by ``fast`` produced: the fast decoder's output is
    written by the fast encoder, the standard library's (which may hold integers beyond 64 bits,
    NaN and infinities) by the standard library."""
    if fast and _dumps_fast is not None:
        return _dumps_fast(document)
    return json.dumps(document, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _request(document: Any, interner: Interner, router: Router | None = None) -> list[Any]:
    request = _expect(document, dict, "request")
    if "resourceSpans" not in request:
        for key, signal in _OTHER_SIGNALS.items():
            if key in request:
                raise OtherSignal(signal)
        raise Shape("not a trace export request (no resourceSpans)")
    if router is None:
        return _request_spans(request, interner, None)
    others, decided = _route(request, router)
    spans = _request_spans(request, interner, others)
    for trace_id, owned in decided.items():  # the line is whole: its decisions hold
        router.decide(trace_id, owned)
    return spans


def _request_spans(
    request: dict[str, Any], interner: Interner, others: dict[str, int] | None
) -> list[Any]:
    spans: list[Any] = []
    # IDs repeat within a line (every span of a trace, every child of a parent): each is read,
    # checked and turned into a SpanContext once per line.
    contexts: _Contexts = ({}, {})
    for r, resource_spans in enumerate(_expect(request["resourceSpans"], list, "resourceSpans")):
        try:
            _resource_spans(resource_spans, interner, spans, contexts, others)
        except Shape as error:
            raise error.within(f"resourceSpans[{r}]") from None
    return spans


class Router(Protocol):
    """Which traces a reader builds spans for, when a process replays one shard of them.

    The reader asks :meth:`owner_of` for each trace of a line before it builds a span; a trace
    that is not decided yet is decided by its first prompt key in the line (:meth:`owns_key`),
    and the decisions of a line that decoded whole are handed back through :meth:`decide`.
    """

    def owner_of(self, trace_id: int) -> bool | None:
        """Whether this process replays the trace; ``None`` while that is not decided."""

    def owns_key(self, key: str) -> bool:
        """Whether this process replays the prompt named ``key``."""

    def decide(self, trace_id: int, owned: bool) -> None:
        """Record the owner of a trace, decided by the prompt key of one of its spans."""


def _route(request: dict[str, Any], router: Router) -> tuple[dict[str, int], dict[int, bool]]:
    """The traces of this line that another process replays (trace ID text -> trace ID), and the
    decisions this line makes (trace ID -> owned).

    A first look at the decoded line, tolerant of any shape: what it cannot read it leaves
    undecided, and the full reading then builds (or describes) it as without a router.
    """
    seen: dict[str, int] = {}  # trace ID text -> trace ID, or 0 when undecided and unreadable
    others: dict[str, int] = {}
    decided: dict[int, bool] = {}
    undecided: set[str] = set()
    blocks = request.get("resourceSpans")
    for block in blocks if type(blocks) is list else ():
        scopes = block.get("scopeSpans") if type(block) is dict else None
        for scope in scopes if type(scopes) is list else ():
            spans = scope.get("spans") if type(scope) is dict else None
            for span in spans if type(spans) is list else ():
                text = span.get("traceId") if type(span) is dict else None
                if type(text) is not str:
                    continue
                if text in seen:
                    if text not in undecided:
                        continue
                    trace_id = seen[text]
                else:
                    trace_id = seen[text] = id_number(text, 16) or 0
                    if not trace_id:
                        continue
                    owned = router.owner_of(trace_id)
                    if owned is not None:
                        if not owned:
                            others[text] = trace_id
                        continue
                    undecided.add(text)
                key = _raw_prompt_key(span.get("attributes"))
                if key is not None:
                    owned = decided[trace_id] = router.owns_key(key)
                    undecided.discard(text)
                    if not owned:
                        others[text] = trace_id
    return others, decided


def _raw_prompt_key(entries: object) -> str | None:
    """The prompt a span's undecoded attributes name, as the replay routes it: ``acp.prompt.id``,
    or the conversation ID of an agent invocation."""
    if type(entries) is not list:
        return None
    prompt = operation = conversation = None
    for item in entries:
        if type(item) is not dict:
            continue
        key = item.get("key")
        if key == attr.PROMPT_ID or key == attr.OPERATION_NAME or key == attr.CONVERSATION_ID:
            body = item.get("value")
            value = body.get("stringValue") if type(body) is dict else None
            text = value if type(value) is str else None
            if key == attr.PROMPT_ID:
                prompt = text
            elif key == attr.OPERATION_NAME:
                operation = text
            else:
                conversation = text
    if prompt is not None:
        return prompt
    return conversation if operation == attr.INVOKE_AGENT else None


# Per line: trace ID text -> trace ID, and span ID text -> the SpanContext last built for it.
_Contexts = tuple[dict[str, int], dict[str, SpanContext]]


def _resource_spans(
    value: object,
    interner: Interner,
    spans: list[Any],
    contexts: _Contexts,
    others: dict[str, int] | None,
) -> None:
    block = _expect(value, dict, "")
    resource_body = _expect(block.get("resource", {}), dict, ".resource")
    try:
        resource_attributes = _attributes(resource_body.get("attributes", []))
    except Shape as error:
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
            if others and type(span) is dict:
                text = span.get("traceId")
                trace_id = others.get(text) if type(text) is str else None
                if trace_id is not None:
                    # Another process replays this trace: not built, only its place kept (and,
                    # for a root, its trace ID, which times the trace's replay).
                    parent = span.get("parentSpanId")
                    append(trace_id if parent is None or parent == "" else None)
                    continue
            read = _common_span(span, resource, scope, contexts)
            if read is None:
                # Anything uncommon, valid or not, is read (or described) by the full reader.
                try:
                    read = _span(span, resource, scope)
                except Shape as error:
                    raise error.within(f"{prefix}.spans[{i}]") from None
            if type(span) is dict and "events" in span:
                read._events = _exception_events(span["events"])
            append(read)


_EXCEPTION_EVENT: Final = "exception"
_EXCEPTION_TYPE: Final = "exception.type"


def _exception_events(events: list[Any]) -> tuple[Event, ...]:
    """The span's ``exception`` events with their ``exception.type`` only: the guard's reading
    of GenAI tool spans takes the error type from them when ``error.type`` is missing.

    ``events`` is an array: both span readers refuse a span whose events are anything else.
    """
    found: list[Event] = []
    for event in events:
        if type(event) is not dict or event.get("name") != _EXCEPTION_EVENT:
            continue
        try:
            attributes = _attributes(event.get("attributes", _NO_ATTRIBUTES))
        except Shape:
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
        trace_id = id_number(trace_text, 16)
        if not trace_id:
            return None
        trace_ids[trace_text] = trace_id
    flags = get("flags", 1)
    if type(flags) is not int or not 0 <= flags < _UINT64_LIMIT:
        return None
    trace_flags = TRACE_FLAGS[flags & 0xFF]
    remote = flags & REMOTE_PARENT_FLAGS == REMOTE_PARENT_FLAGS

    if type(span_text) is not str:
        return None
    context = by_span_id.get(span_text)
    if context is None or context[0] != trace_id or context[3] is not trace_flags:
        # id_number, its hex case inlined: a span ID is new on every span.
        if len(span_text) == 16 and _HEX.issuperset(span_text):
            span_id: int | None = int(span_text, 16)
        else:
            span_id = id_number(span_text, 8)
        if not span_id:
            return None
        context = by_span_id[span_text] = _new_tuple(
            SpanContext, (trace_id, span_id, False, trace_flags, DEFAULT_TRACE_STATE, True)
        )  # span_context, inlined: one call fewer per span

    parent_text = get("parentSpanId")
    parent: SpanContext | None = None
    if parent_text is not None and parent_text != "":
        if type(parent_text) is not str:
            return None
        parent = by_span_id.get(parent_text)
        if remote or parent is None or parent[0] != trace_id or parent[3] is not trace_flags:
            if len(parent_text) == 16 and _HEX.issuperset(parent_text):
                parent_id: int | None = int(parent_text, 16)
            else:
                parent_id = id_number(parent_text, 8)
            if parent_id is None:
                return None
            if parent_id:
                fields = (trace_id, parent_id, remote, trace_flags, DEFAULT_TRACE_STATE, True)
                parent = _new_tuple(SpanContext, fields)
                if not remote:  # the cache holds local contexts only: a span's own is local
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
        kind_number = _KIND_NAMES.get(kind_number, -1) if type(kind_number) is str else -1
    kind = KINDS.get(kind_number)
    if kind is None:
        return None
    status_body = get("status", _NO_STATUS)
    if type(status_body) is not dict:
        return None
    status = UNSET_STATUS
    if status_body:
        code = status_body.get("code", 0)
        message = status_body.get("message", "")
        if type(code) is str:
            code = _STATUS_NAMES.get(code)
        if type(code) is not int or type(message) is not str:
            return None
        if code == 2:
            status = Status(StatusCode.ERROR, message or None)
        elif code == 1:
            status = OK_STATUS
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
    return RecordedSpan(
        name, context, parent, resource, attributes, kind, status, start, end, scope
    )


def _common_attributes(entries: list[Any]) -> Attributes | None:
    """The attributes as :func:`_attributes` reads them, or ``None`` when one is malformed."""
    result = Attributes()
    for item in entries:
        # Most values are strings, the rest mostly decimal-string integers: read here. A decoded
        # JSON document holds no mapping but dict, and only a dict has get().
        try:
            key = item["key"]
            body = item["value"]
            value = body.get("stringValue")
        except (KeyError, TypeError, AttributeError):
            pass
        else:
            if type(key) is str and len(body) == 1:
                if type(value) is str:
                    result[key] = value
                    continue
                value = body.get("intValue")  # checked as _scalar checks it
                if type(value) is str and len(value) <= 18 and value.isdigit() and value.isascii():
                    result[key] = int(value)
                    continue
                value = body.get("boolValue")  # batch spans carry three
                if type(value) is bool:
                    result[key] = value
                    continue
        # The others as _attributes reads them.
        if type(item) is not dict:
            return None
        key = item.get("key")
        body = item.get("value")
        if type(key) is not str or type(body) is not dict or len(body) != 1:
            return None
        value = _scalar(body)
        if value is None:
            try:
                value = _any_value(body)
            except Shape:
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
        raise Shape("endTimeUnixNano is before startTimeUnixNano")
    kind = KINDS.get(_enum(get("kind", 0), _KIND_NAMES, ".kind"))
    if kind is None:
        raise Shape("unknown span kind", ".kind")
    all_flags = _uint64(get("flags", 1), ".flags")
    flags = TraceFlags(all_flags & 0xFF)
    status_body = _expect(get("status", _NO_STATUS), dict, ".status")
    status = UNSET_STATUS
    if status_body:
        code = STATUS.get(_enum(status_body.get("code", 0), _STATUS_NAMES, ".status.code"))
        if code is None:
            raise Shape("unknown status code", ".status.code")
        message = _expect(status_body.get("message", ""), str, ".status.message")
        status = Status(code, message or None) if code is StatusCode.ERROR else Status(code)
    if "events" in body:
        _expect(body["events"], list, ".events")
    if "links" in body:
        _expect(body["links"], list, ".links")
    try:
        attributes = _attributes(get("attributes", _NO_ATTRIBUTES))
    except Shape as error:
        raise error.within(".attributes") from None
    return RecordedSpan(
        _expect(get("name", ""), str, ".name"),
        span_context(trace_id, span_id, flags),
        parent_context(trace_id, parent_id, flags, all_flags) if parent_id else None,
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


Skipped = int | None
"""A span a reader with a :class:`Router` did not build: its trace ID when it is a root, else
``None``."""


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
    parent = span.parent
    body["flags"] = int(context.trace_flags) | (
        REMOTE_PARENT_FLAGS if parent is not None and parent.is_remote else HAS_REMOTE_FLAG
    )
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


def encode_line(spans: Iterable[ReadableSpan]) -> str:
    """One OTLP/JSON line (newline included) of ``spans``, as :class:`OtlpJsonSpanExporter`
    writes it: for a writer that must see its own write errors, which an exporter swallows."""
    return json.dumps(encode_request(spans), separators=(",", ":")) + "\n"


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
            self._stream.write(encode_line(spans))
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
