"""``RedactingSpanExporter``: exports copies of spans with sensitive data removed.

Redaction happens in ``export()``, which the SDK's ``BatchSpanProcessor`` calls on its worker
thread, so the agent's ``span.end()`` pays nothing for it. The spans the SDK handed over are never
modified: every exported span is a new :class:`~opentelemetry.sdk.trace.ReadableSpan`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

from otel_guard.privacy.pseudonym import Pseudonymizer
from otel_guard.privacy.sensitive import (
    CLASSIFIED_ERROR_TYPE,
    ERROR_TYPE_KEYS,
    GENAI_EVENT_NAMES,
    MCP_MARKER_KEYS,
    MCP_SERVER_KEYS,
    MODEL_OPERATIONS,
    OPENINFERENCE_SPAN_KINDS,
    PSEUDONYMOUS_KEYS,
    UNCLASSIFIED_ERROR_TYPE,
    AllowedKey,
    SensitiveKeys,
    allowed_key,
    is_genai_key,
)
from otel_guard.spans import attributes as attr

__all__ = [
    "BATCH_SPAN_NAME",
    "MAX_NESTING",
    "MIN_NAME_MATCH_LENGTH",
    "REDACTED_SPAN_NAME",
    "KeyPredicate",
    "RedactingSpanExporter",
]

_logger = logging.getLogger(__name__)

KeyPredicate = Callable[[str], bool]
"""True for an attribute key that must not be exported."""

REDACTED_SPAN_NAME: Final = "redacted"
"""The exported name of a span or event whose name could hold removed data."""

BATCH_SPAN_NAME: Final = "tool_batch"
"""The exported name of a section 3 batch span (``acp.batch.admitted``) without an operation
name."""

MIN_NAME_MATCH_LENGTH: Final = 3
"""Removed values shorter than this are not searched for in names (too many false hits)."""

# Operation names (the name of a GenAI span that has one).
_OPERATION_NAME: Final = re.compile(r"[a-z][a-z0-9_.]{0,63}")
_WORD: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")
_MAX_TOOL_NAME_LENGTH: Final = 256
_FLAG_TEXTS: Final = frozenset({"True", "False", "true", "false"})
_MAX_ID_LENGTH: Final = 256  # longer IDs are no ID to the guard (processor, GenAI profile)
_CACHE_LIMIT: Final = 4096
_TRACES_REMEMBERED: Final = 1024  # traces whose removed values name-check their other spans
_TRACE_NEEDLES: Final = 64  # removed values kept per trace
_MAX_JSON_LENGTH: Final = 65536  # longer JSON values are searched as text only
_MAX_JSON_LEAVES: Final = 32
_MIN_LEAF_LENGTH: Final = 6  # shorter strings inside JSON ("ls", "true") are too common in names
_HEAD_LENGTH: Final = 12  # a name holding this much of a value's head holds a truncated copy
MAX_NESTING: Final = 8
"""Levels of maps inside maps (log attributes, bodies) the policy follows; deeper is dropped."""
_DROP: Final = object()


class RedactingSpanExporter(SpanExporter):
    """Wraps ``delegate`` and hands it redacted copies of the spans it is asked to export.

    A **GenAI span** (one with an attribute or event in a GenAI namespace of
    :mod:`otel_guard.privacy.sensitive`: ``gen_ai.``, ``acp.``, pydantic-ai/logfire, OpenInference,
    OpenLLMetry, Langfuse, Vercel AI, Google ADK, MLflow, OpenLIT, MCP) keeps only the registry's
    allow-list, on the span, its events and its links; its name becomes its operation name (with
    the model for model calls), else its OpenInference span kind lower-cased, else
    :data:`BATCH_SPAN_NAME` for a batch span, else :data:`REDACTED_SPAN_NAME`, never its own
    name; its event names survive only when in
    :data:`~otel_guard.privacy.sensitive.GENAI_EVENT_NAMES`.
    Every other span loses the registry's deny-list keys (case-insensitive) and any name that
    holds a removed value. Both keep what the guard's replay needs:

    * ``gen_ai.tool.name``, OpenInference's ``tool.name`` and ``mcp.server.name`` become keyed
      pseudonyms
      (:class:`~otel_guard.privacy.pseudonym.Pseudonymizer` under ``pseudonym_key``);
    * classified error types are kept, free text is dropped (``error.type`` becomes ``_OTHER``).

    Also: the status description is dropped and the code kept; the resource loses its sensitive
    keys (process command line, arguments, executable path, owner); ``extra_keys`` and keys fully
    matching ``extra_patterns`` are removed everywhere (None is no keys or patterns; a pattern
    that is not a valid regular expression raises ``ValueError`` naming it, here). With
    ``allow_keys`` the deployment's own list replaces both policies: only the listed keys
    survive, on every span, besides the pseudonyms and classified error types (a listed
    ``gen_ai.tool.name`` keeps the real name).
    Context, parent, kind, times, scope, event times, link contexts and dropped counts are kept.

    ``export()`` never raises. A span that cannot be redacted is dropped, never exported as it
    was, and counted in :attr:`dropped_spans`. ``shutdown()`` and ``force_flush()`` delegate.
    """

    def __init__(
        self,
        delegate: SpanExporter,
        *,
        extra_keys: Iterable[str] | None = (),
        extra_patterns: Iterable[str] | None = (),
        allow_keys: Iterable[str] | None = None,
        pseudonym_key: bytes | str | None = None,
    ) -> None:
        self._delegate = delegate
        extra_keys = frozenset(_names(extra_keys))
        extra_patterns = _patterns(extra_patterns)
        self._allow = None if allow_keys is None else frozenset(_names(allow_keys))
        self._sensitive: KeyPredicate = SensitiveKeys(extra_keys, extra_patterns)
        self._extra: KeyPredicate = _ExtraKeys(extra_keys, extra_patterns)
        self._pseudonym = Pseudonymizer(pseudonym_key)
        self._cache: dict[tuple[bool, str], bool] = {}
        self._resources: dict[int, tuple[Resource, Resource]] = {}
        self._lock = threading.Lock()
        _LIVE.add(self)
        self._dropped_spans = 0
        self._trace_needles: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    @property
    def delegate(self) -> SpanExporter:
        """The exporter that receives the redacted copies."""
        return self._delegate

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because they could not be redacted."""
        with self._lock:
            return self._dropped_spans

    def removes(self, key: str, *, genai: bool = False) -> bool:
        """True when this exporter removes (or rewrites) attribute ``key`` from the spans it
        exports: from GenAI spans when ``genai``, else from other spans."""
        cached = self._cache.get((genai, key))
        if cached is None:
            if self._extra(key):
                cached = True
            elif self._allow is not None:
                cached = key not in self._allow
            elif genai:
                cached = allowed_key(key) is None
            else:
                cached = self._sensitive(key)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # keys are few in practice; this only bounds a flood
            self._cache[(genai, key)] = cached
        return cached

    def redact(self, span: ReadableSpan) -> ReadableSpan:
        """A redacted copy of ``span`` (the original is left untouched)."""
        removed: list[str] = []
        _collect_strings(span.status.description, removed)
        genai = self._allow is None and _is_genai(span)
        attributes = self._filter(span.attributes, genai, removed, span.dropped_attributes)
        filtered_events = [
            (event, self._filter(event.attributes, genai, removed, event.dropped_attributes))
            for event in span.events
        ]
        links = [
            Link(
                link.context,
                self._filter(link.attributes, genai, removed, link.dropped_attributes),
            )
            for link in span.links
        ]
        needles = _needles(removed)
        trace_id = span.context.trace_id if span.context is not None else 0
        if genai:
            self._remember(trace_id, needles)
        else:
            # A plain span below a tool call is often named from the call's content.
            needles += self._trace_needles.get(trace_id, ())
        events = [
            Event(self._event_name(event.name, genai, needles), kept, event.timestamp)
            for event, kept in filtered_events
        ]
        return _RedactedSpan(
            name=self._name(span, attributes, genai, needles),
            context=span.context,
            parent=span.parent,
            resource=self._resource(span.resource),
            attributes=attributes,
            events=events,
            links=links,
            kind=span.kind,
            status=Status(span.status.status_code),
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
            dropped=(span.dropped_attributes, span.dropped_events, span.dropped_links),
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        done: list[ReadableSpan | None] = [None] * len(spans)
        dropped = 0
        # GenAI spans first: the values removed from a tool call are then known when the plain
        # spans of its trace (which usually end before it, in the same batch) are named.
        order = sorted(range(len(spans)), key=lambda i: not _is_genai_safely(spans[i]))
        for index in order:
            try:
                done[index] = self.redact(spans[index])
            except Exception:
                dropped += 1
        redacted = [span for span in done if span is not None]
        if dropped:
            with self._lock:
                self._dropped_spans += dropped
            # The count only: the span itself is what could not be made safe to show.
            _logger.warning("otel_guard: dropped %d span(s) that could not be redacted", dropped)
            if not redacted:
                return SpanExportResult.FAILURE
        try:
            return self._delegate.export(redacted)
        except Exception as exc:
            _logger.warning("otel_guard: span export failed (%s)", type(exc).__name__)
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._delegate.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._delegate.force_flush(timeout_millis)

    def _remember(self, trace_id: int, needles: list[str]) -> None:
        """Keep the values removed from a GenAI span for the names of its trace's other spans
        (bounded: the most recent traces, the longest values)."""
        if not needles:
            return
        with self._lock:
            known = self._trace_needles.pop(trace_id, ())
            merged = sorted({*known, *needles}, key=len, reverse=True)[:_TRACE_NEEDLES]
            self._trace_needles[trace_id] = tuple(merged)
            while len(self._trace_needles) > _TRACES_REMEMBERED:
                self._trace_needles.popitem(last=False)

    # -- attributes ------------------------------------------------------------------------

    def redact_attributes(
        self, attributes: Mapping[str, Any] | None, *, genai: bool, dropped: int = 0
    ) -> tuple[BoundedAttributes, list[str]]:
        """The attributes this exporter keeps of ``attributes`` (by the GenAI allow-list when
        ``genai``, else by the deny-list; a deployment's ``allow_keys`` replaces both), with the
        string values it removed, for searching names that may hold them. The log record
        exporter applies spans' policy to records through this."""
        removed: list[str] = []
        genai = genai and self._allow is None
        return self._filter(attributes, genai, removed, dropped), removed

    def redact_nested(self, value: Any) -> Any:
        """``value`` with the deny-list applied inside the maps it holds, as to attributes (a
        log record's body); a string or number is returned as it is, None when too deep."""
        exported = self._nested(value, False, [], 0)
        return None if exported is _DROP else exported

    def redact_resource(self, resource: Resource) -> Resource:
        """``resource`` without its sensitive keys (the same object when it has none)."""
        return self._resource(resource)

    def _filter(
        self,
        attributes: Mapping[str, Any] | None,
        genai: bool,
        removed: list[str],
        dropped: int,
    ) -> BoundedAttributes:
        kept = self._map(attributes or {}, genai, removed, 0)
        if genai and attributes and any(key in attributes for key in MCP_MARKER_KEYS):
            for key in MCP_SERVER_KEYS:
                value = kept.pop(key, None)
                if value is not None:
                    _collect_strings(value, removed)
        bounded = BoundedAttributes(maxlen=None, attributes=kept, immutable=True)
        bounded.dropped = dropped
        return bounded

    def _map(
        self, attributes: Mapping[str, Any], genai: bool, removed: list[str], depth: int
    ) -> dict[str, Any]:
        """The kept part of ``attributes``. Log record attributes may hold maps (and sequences
        of maps): every key of those is judged as a top-level key would be, down to
        :data:`MAX_NESTING` levels, so ``{"details": {"exception.stacktrace": ...}}`` loses
        what ``{"exception.stacktrace": ...}`` loses."""
        kept: dict[str, Any] = {}
        for key, value in attributes.items():
            exported = self._value(key, value, genai)
            if exported is not value:
                _collect_strings(value, removed)
            elif isinstance(value, (list, tuple, Mapping)):
                exported = self._nested(value, genai, removed, depth)  # collects what it removes
            if exported is not _DROP:
                kept[key] = exported
        return kept

    def _nested(self, value: Any, genai: bool, removed: list[str], depth: int) -> Any:
        """``value`` with the policy applied inside the maps it holds (``value`` itself when it
        holds none)."""
        if isinstance(value, Mapping):
            if depth >= MAX_NESTING:
                return _DROP
            return self._map(value, genai, removed, depth + 1)
        if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
            items = [self._nested(item, genai, removed, depth) for item in value]
            return [item for item in items if item is not _DROP]
        return value

    def _value(self, key: str, value: Any, genai: bool) -> Any:
        """What is exported for ``key``: ``value`` itself, a rewritten value, or ``_DROP``."""
        if not self.removes(key, genai=genai):
            if not genai:
                return value
            rule = allowed_key(key)
            return value if rule is None else self._shaped(rule, value)
        if self._extra(key) or not (genai or self._allow is not None):
            return _DROP
        prefix = PSEUDONYMOUS_KEYS.get(key)
        if prefix is not None:
            if type(value) is not str or len(value) > _MAX_TOOL_NAME_LENGTH:
                return _DROP  # no name to the guard either
            if not value.strip() or value == attr.MERGED_TOOLS:
                # Blank, or Google ADK's "(merged tools)", which the profiles read as no call:
                # a fixed text with no content, kept so that replay reads the span the same.
                return value
            return self._pseudonym(value, prefix)
        case = ERROR_TYPE_KEYS.get(key)
        if case is not None:
            if type(value) is not str:
                # Present but unreadable: still an error of unknown type to the GenAI profile.
                return UNCLASSIFIED_ERROR_TYPE if case == "lower" else _DROP
            if case == "lower":
                # The GenAI profile reads error.type lower-cased: export it as it will be read.
                lowered = value.lower()
                if CLASSIFIED_ERROR_TYPE.fullmatch(lowered):
                    return lowered
                return UNCLASSIFIED_ERROR_TYPE
            return value if CLASSIFIED_ERROR_TYPE.fullmatch(value) else _DROP
        return _DROP

    def _shaped(self, rule: AllowedKey, value: Any) -> Any:
        """``value`` if it has the shape ``rule`` declares, else a content-free value the guard
        reads the same way, or ``_DROP`` (sensitive.ValueShape says which)."""
        shape = rule.shape
        if shape in ("as_is", "count", "word"):
            return value if _fits(rule, value) else _DROP
        if shape == "flag":
            # The SDK records exception.escaped as the text "False"; text is kept as read.
            flag = type(value) is bool or (type(value) is str and value in _FLAG_TEXTS)
            return value if flag else _DROP
        if shape in ("vocabulary", "route"):
            if type(value) is not str:
                return _DROP
            return value if value in rule.values else UNCLASSIFIED_ERROR_TYPE
        if shape == "admitted":
            return value if type(value) is int and value >= 0 else -1
        # call_id, conversation_id: opaque identifiers the guard compares.
        if type(value) is str and len(value) <= _MAX_ID_LENGTH:
            if value.strip() in attr.PLACEHOLDER_CALL_IDS or _WORD.fullmatch(value):
                # A placeholder (blank, "<not specified>") is a missing ID to the profiles: kept
                # as it is, since a pseudonym would read as one ID shared by every call.
                return value
            return self._pseudonym(value, "call_" if shape == "call_id" else "conv_")
        return "" if shape == "call_id" else _DROP

    def _resource(self, resource: Resource) -> Resource:
        key = id(resource)
        cached = self._resources.get(key)
        if cached is not None and cached[0] is resource:
            return cached[1]
        attributes = resource.attributes
        if any(self._sensitive(k) for k in attributes):
            kept = {k: v for k, v in attributes.items() if not self._sensitive(k)}
            redacted = Resource(kept, resource.schema_url)
        else:
            redacted = resource
        with self._lock:
            if len(self._resources) >= _CACHE_LIMIT:
                self._resources.clear()
            # The original is kept alive with its copy, so its id cannot be reused meanwhile.
            self._resources[key] = (resource, redacted)
        return redacted

    # -- names -----------------------------------------------------------------------------

    def _name(
        self, span: ReadableSpan, exported: Mapping[str, Any], genai: bool, needles: list[str]
    ) -> str:
        name = span.name
        operation = exported.get(attr.OPERATION_NAME)
        if not isinstance(operation, str) or not _OPERATION_NAME.fullmatch(operation):
            operation = None
        if genai:
            if operation is None:
                # Never the span's own name, however plain: a closed name, or none.
                kind = exported.get(attr.OPENINFERENCE_SPAN_KIND)
                if isinstance(kind, str) and kind.upper() in OPENINFERENCE_SPAN_KINDS:
                    return kind.lower()
                if attr.BATCH_ADMITTED in exported:
                    return BATCH_SPAN_NAME
                return REDACTED_SPAN_NAME
            model = exported.get("gen_ai.request.model", exported.get("gen_ai.response.model"))
            if operation in MODEL_OPERATIONS and isinstance(model, str):
                return f"{operation} {model}"
            return operation
        tool_name = (span.attributes or {}).get(attr.TOOL_NAME)
        tool_call = operation == attr.EXECUTE_TOOL and exported.get(attr.TOOL_NAME) != tool_name
        if not tool_call and not _holds(name, needles):
            return name
        return operation or REDACTED_SPAN_NAME

    @staticmethod
    def _event_name(name: str, genai: bool, needles: list[str]) -> str:
        if genai:
            return name if name in GENAI_EVENT_NAMES else REDACTED_SPAN_NAME
        return REDACTED_SPAN_NAME if _holds(name, needles) else name


class _ExtraKeys:
    """Only the deployment's own additions."""

    __slots__ = ("_keys", "_pattern")

    def __init__(self, keys: frozenset[str], patterns: tuple[str, ...]) -> None:
        self._keys = keys
        self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None

    def __call__(self, key: str) -> bool:
        return key in self._keys or (
            self._pattern is not None and self._pattern.fullmatch(key) is not None
        )


class _RedactedSpan(ReadableSpan):
    """A redacted copy that keeps the original's dropped counts."""

    def __init__(self, *, dropped: tuple[int, int, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._dropped = dropped

    @property
    def dropped_attributes(self) -> int:
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        return self._dropped[2]


def _is_genai(span: ReadableSpan) -> bool:
    if any(is_genai_key(key) for key in span.attributes or {}):
        return True
    return any(
        is_genai_key(event.name) or any(is_genai_key(key) for key in event.attributes or {})
        for event in span.events
    )


def _is_genai_safely(span: ReadableSpan) -> bool:
    try:
        return _is_genai(span)
    except Exception:  # redact() drops and counts it
        return False


def _fits(rule: AllowedKey, value: Any) -> bool:
    """True when ``value`` has the shape ``rule`` allows."""
    shape = rule.shape
    if shape == "as_is":
        return True
    values = value if isinstance(value, (list, tuple)) else (value,)
    if shape == "count":
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return all(isinstance(v, str) and _WORD.fullmatch(v) is not None for v in values)


def _needles(removed: list[str]) -> list[str]:
    """The lower-cased removed values to search names for, with the last part of each path."""
    needles: set[str] = set()
    for value in _with_json_leaves(removed):
        lowered = value.lower()
        needles.add(lowered)
        base = re.split(r"[/\\]", lowered.rstrip("/\\"))[-1]
        if base != lowered:
            needles.add(base)
        if len(lowered) > _HEAD_LENGTH:
            needles.add(lowered[:_HEAD_LENGTH])  # names built from a truncated value
    return [n for n in needles if len(n) >= MIN_NAME_MATCH_LENGTH]


def _with_json_leaves(removed: list[str]) -> Iterator[str]:
    """The removed values, and the strings inside those that are JSON (tool arguments are):
    a span named from one argument holds that string, not the whole document."""
    for value in removed:
        yield value
        if value[:1] in ("{", "[") and len(value) <= _MAX_JSON_LENGTH:
            try:
                document = json.loads(value)
            except (ValueError, RecursionError):
                continue
            leaves = (leaf for leaf in _json_strings(document) if len(leaf) >= _MIN_LEAF_LENGTH)
            yield from itertools.islice(leaves, _MAX_JSON_LEAVES)


def _json_strings(document: Any) -> Iterator[str]:
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _holds(name: str, needles: list[str]) -> bool:
    lowered = name.lower()
    return any(needle in lowered for needle in needles)


def _names(names: Iterable[str] | None) -> tuple[str, ...]:
    # A lone string is one name, not a sequence of one-letter keys; None is no names.
    if names is None:
        return ()
    return (names,) if isinstance(names, str) else tuple(names)


def _patterns(patterns: Iterable[str] | None) -> tuple[str, ...]:
    """The deployment's key patterns, each checked here: a pattern that does not compile is a
    configuration error the host must see when it starts, not a redaction that fails later."""
    checked = _names(patterns)
    for index, pattern in enumerate(checked):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ValueError(
                f"extra_patterns[{index}] is not a valid regular expression: {exc}"
            ) from None
    return checked


def _collect_strings(value: Any, into: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        if value:
            into.append(value)
    elif isinstance(value, (list, tuple)):
        into.extend(v for v in value if isinstance(v, str) and v)
        if depth < MAX_NESTING:
            for item in value:
                if isinstance(item, Mapping):
                    _collect_strings(item, into, depth + 1)
    elif isinstance(value, Mapping) and depth < MAX_NESTING:
        for item in value.values():
            _collect_strings(item, into, depth + 1)


_LIVE: weakref.WeakSet[RedactingSpanExporter] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # The export worker of the parent may have held a lock at the fork; the child's is new.
    for exporter in list(_LIVE):
        exporter._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_after_fork)
