"""``RedactingSpanExporter``: exports copies of spans with sensitive attributes removed.

Redaction happens in ``export()``, which the SDK's ``BatchSpanProcessor`` calls on its worker
thread, so the agent's ``span.end()`` pays nothing for it. The spans the SDK handed over are never
modified: every exported span is a new :class:`~opentelemetry.sdk.trace.ReadableSpan`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

from otel_guard import attributes as attr
from otel_guard.sensitive import SensitiveKeys

__all__ = ["MIN_NAME_MATCH_LENGTH", "REDACTED_SPAN_NAME", "KeyPredicate", "RedactingSpanExporter"]

_logger = logging.getLogger(__name__)

KeyPredicate = Callable[[str], bool]
"""True for an attribute key that must not be exported."""

REDACTED_SPAN_NAME: Final = "redacted"
"""The exported name of a span whose name held a removed value and that has no operation name."""

MIN_NAME_MATCH_LENGTH: Final = 3
"""Removed values shorter than this are not searched for in span names (too many false hits)."""

# GenAI operation names are short identifiers; anything else is not used as a span name.
_OPERATION_NAME: Final = re.compile(r"[a-z][a-z0-9_.]{0,63}")
_CACHE_LIMIT: Final = 4096


class RedactingSpanExporter(SpanExporter):
    """Wraps ``delegate`` and hands it redacted copies of the spans it is asked to export.

    In each copy:

    * span, event and link attributes named sensitive are removed: the keys of
      :mod:`otel_guard.sensitive` plus ``extra_keys`` and keys fully matching ``extra_patterns``;
    * with ``allow_keys`` (allow-list mode) only the keys listed there survive, minus any named
      by ``extra_keys``/``extra_patterns``; the registry is not consulted, the list is the policy;
    * the status description is dropped and the status code kept;
    * the span name is replaced by its ``gen_ai.operation.name`` (or by :data:`REDACTED_SPAN_NAME`
      when it has none) when the span is a tool-call span whose tool name is removed, or when the
      name contains a removed string value of at least :data:`MIN_NAME_MATCH_LENGTH` characters:
      GenAI span names embed the tool name (``execute_tool {gen_ai.tool.name}``);
    * everything else is unchanged: context, parent, kind, times, resource, scope, event names and
      times, link contexts, and the dropped counts.

    ``export()`` never raises. A span that cannot be redacted is dropped, never exported as it
    was, and counted in :attr:`dropped_spans`. ``shutdown()`` and ``force_flush()`` delegate.
    """

    def __init__(
        self,
        delegate: SpanExporter,
        *,
        extra_keys: Iterable[str] = (),
        extra_patterns: Iterable[str] = (),
        allow_keys: Iterable[str] | None = None,
    ) -> None:
        self._delegate = delegate
        extra_keys = frozenset(_names(extra_keys))
        extra_patterns = _names(extra_patterns)
        self._allow = None if allow_keys is None else frozenset(_names(allow_keys))
        self._sensitive: KeyPredicate
        if self._allow is None:
            self._sensitive = SensitiveKeys(extra_keys, extra_patterns)
        else:
            self._sensitive = _ExtraKeys(extra_keys, extra_patterns)
        self._cache: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._dropped_spans = 0

    @property
    def delegate(self) -> SpanExporter:
        """The exporter that receives the redacted copies."""
        return self._delegate

    @property
    def dropped_spans(self) -> int:
        """Spans dropped because they could not be redacted."""
        with self._lock:
            return self._dropped_spans

    def removes(self, key: str) -> bool:
        """True when this exporter removes attribute ``key`` from the spans it exports."""
        removed = self._cache.get(key)
        if removed is None:
            if self._allow is None:
                removed = self._sensitive(key)
            else:
                removed = key not in self._allow or self._sensitive(key)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # keys are few in practice; this only bounds a flood
            self._cache[key] = removed
        return removed

    def redact(self, span: ReadableSpan) -> ReadableSpan:
        """A redacted copy of ``span`` (the original is left untouched)."""
        removed_values: list[str] = []
        _collect_strings(span.status.description, removed_values)
        attributes = self._filter(span.attributes, removed_values, span.dropped_attributes)
        events = [
            Event(
                event.name,
                self._filter(event.attributes, removed_values, _dropped(event)),
                event.timestamp,
            )
            for event in span.events
        ]
        links = [
            Link(link.context, self._filter(link.attributes, removed_values, _dropped(link)))
            for link in span.links
        ]
        return _RedactedSpan(
            name=self._name(span, removed_values),
            context=span.context,
            parent=span.parent,
            resource=span.resource,
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
        redacted: list[ReadableSpan] = []
        dropped = 0
        for span in spans:
            try:
                redacted.append(self.redact(span))
            except Exception:
                dropped += 1
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

    def _filter(
        self, attributes: Mapping[str, Any] | None, removed_values: list[str], dropped: int
    ) -> BoundedAttributes:
        kept: dict[str, Any] = {}
        for key, value in (attributes or {}).items():
            if self.removes(key):
                _collect_strings(value, removed_values)
            else:
                kept[key] = value
        bounded = BoundedAttributes(maxlen=None, attributes=kept, immutable=True)
        bounded.dropped = dropped
        return bounded

    def _name(self, span: ReadableSpan, removed_values: list[str]) -> str:
        name = span.name
        span_attributes = span.attributes or {}
        operation = span_attributes.get(attr.OPERATION_NAME)
        tool_call = operation == attr.EXECUTE_TOOL and self.removes(attr.TOOL_NAME)
        if not tool_call and not any(
            len(value) >= MIN_NAME_MATCH_LENGTH and value in name for value in removed_values
        ):
            return name
        if isinstance(operation, str) and _OPERATION_NAME.fullmatch(operation):
            return operation
        return REDACTED_SPAN_NAME


class _ExtraKeys:
    """Only the deployment's own additions: the deny part of allow-list mode."""

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


def _names(names: Iterable[str]) -> tuple[str, ...]:
    # A lone string is one name, not a sequence of one-letter keys.
    return (names,) if isinstance(names, str) else tuple(names)


def _dropped(item: Event | Link | Any) -> int:
    dropped = getattr(item, "dropped_attributes", 0)
    return dropped if type(dropped) is int else 0


def _collect_strings(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        if value:
            into.append(value)
    elif isinstance(value, (list, tuple)):
        into.extend(v for v in value if isinstance(v, str) and v)
