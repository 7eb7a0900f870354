"""Fused dispatch: the provider's span processors, with the guard's "not mine" test first.

A ``TracerProvider`` calls each span processor in turn for every span: ``on_start``,
``_on_ending`` and ``on_end``, a Python call each. Most spans are not the guard's, and for those
the guard's calls do nothing but one or two dictionary reads. :class:`GuardFirstSpanProcessor`
takes the place of the provider's ``SynchronousMultiSpanProcessor``
(``TracerProvider(active_span_processor=...)``): it makes the guard's test inline, calls the
guard only for spans that may be its own, then calls the other processors in the order they were
added, exactly as the SDK's multi-processor would.

The test comes from the guard itself (:attr:`GuardSpanProcessor.START_INTEREST` and
:attr:`GuardSpanProcessor.END_INTEREST`), so the guard's hooks and this dispatch cannot drift
apart silently: a test checks that every span the filter turns away leaves the guard unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from time import time_ns

from opentelemetry import context as context_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)

from otel_guard._compiled import mypyc_attr
from otel_guard.guard import _sdkfields as _sdk
from otel_guard.guard.processor import ANY_VALUE, GuardSpanProcessor

__all__ = ["GuardFirstSpanProcessor", "guarded_tracer_provider"]

_MISSING = object()


@mypyc_attr(allow_interpreted_subclasses=True)
class GuardFirstSpanProcessor(SynchronousMultiSpanProcessor):
    """A ``SynchronousMultiSpanProcessor`` whose first processor is the guard, called only for
    spans it may follow.

    ``processors`` (and any added later with :meth:`add_span_processor`) are called for every
    span, after the guard, in order, as the SDK's multi-processor calls them. ``shutdown()`` and
    ``force_flush()`` go to the guard first, then to the others in order, sharing the timeout.
    """

    def __init__(self, guard: GuardSpanProcessor, processors: Iterable[SpanProcessor] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._guard = guard
        self._start_interest = guard.START_INTEREST
        self._end_interest = guard.END_INTEREST
        # While the guard watches a trace every ending span may leave a link (its descendants'
        # prompt is found through it), so the filter then lets every span end through.
        self._lineage = guard.genai_lineage
        self._others: tuple[SpanProcessor, ...] = tuple(processors)
        self._span_processors = (guard, *self._others)
        self._lock = threading.Lock()

    @property
    def guard(self) -> GuardSpanProcessor:
        return self._guard

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        with self._lock:
            # Tuples, replaced whole: a span ending meanwhile iterates a consistent one.
            self._others += (span_processor,)
            self._span_processors = (self._guard, *self._others)

    def on_start(self, span: Span, parent_context: context_api.Context | None = None) -> None:
        try:
            attributes = _sdk.attribute_dict(span)
        except AttributeError:  # not an SDK span as the guard knows it: let the guard decide
            self._guard.on_start(span, parent_context)
        else:
            # Written out rather than calling a helper: this runs for every span of the host.
            # The inferred profiles read ended spans only, so starts never need the lineage.
            for key, value in self._start_interest:
                found = attributes.get(key, _MISSING)
                if found is not _MISSING and (value is ANY_VALUE or found == value):
                    self._guard.on_start(span, parent_context)
                    break
        for processor in self._others:
            processor.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        # The guard does nothing when a span is ending; the others keep their hook.
        for processor in self._others:
            processor._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            attributes = _sdk.attribute_dict(span)
        except AttributeError:
            self._guard.on_end(span)
        else:
            # Written out rather than calling a helper: this runs for every span of the host.
            wanted = bool(self._lineage)
            if not wanted:
                for key, value in self._end_interest:
                    found = attributes.get(key, _MISSING)
                    if found is not _MISSING and (value is ANY_VALUE or found == value):
                        wanted = True
                        break
            if wanted:
                self._guard.on_end(span)
        for processor in self._others:
            processor.on_end(span)

    def shutdown(self) -> None:
        self._guard.shutdown()
        for processor in self._others:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time_ns() + timeout_millis * 1_000_000
        flushed = True
        for processor in self._span_processors:
            now = time_ns()
            if now >= deadline:
                return False
            if processor.force_flush((deadline - now) // 1_000_000) is False:
                flushed = False
        return flushed


def guarded_tracer_provider(
    guard: GuardSpanProcessor, *, resource: Resource | None = None, fused: bool = True
) -> TracerProvider:
    """A new ``TracerProvider`` whose first span processor is ``guard``.

    With ``fused`` its processors are dispatched by :class:`GuardFirstSpanProcessor`; without,
    the guard is added as any processor is. Add the other processors with
    ``add_span_processor`` either way.
    """
    if not fused:
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(guard)
        return provider
    return TracerProvider(resource=resource, active_span_processor=GuardFirstSpanProcessor(guard))
