"""Batch assembly for the inferred profiles: prompts, model calls and tool calls of ended spans.

The processor hands every ended span of a *watched* trace here, and any ended span a profile
may claim (:attr:`InferredAssembly.claim_keys`). Each profile (:data:`PROFILES`, in order: the
first claim wins) says what the span is; the assembly keeps, per trace, the little that lineage
and batching need, and when a prompt is settled emits :data:`~otel_guard.spans.events.ProfileEvent`
values: the prompt started, each inferred batch settled, the prompt ended.

**Ended spans only.** Nothing is decided from a span's attributes at start, so a live process
(whose frameworks set ``gen_ai.*`` right after starting a span) and a replay (whose spans carry
their final attributes from the start) see the same claims in the same order, and decide the
same.

**Lineage.** A trace becomes watched when the first span of it is claimed (or an ``acp.*`` prompt
span with a parent ends in it). From then on every span of the trace that ends leaves its link
(span ID -> parent span ID) behind, so a tool or model-call span is joined to its prompt through
intermediates that ended before or after it ("cycle", "Step N", a "tools" chain, a model call
that parents its tools). Children end before their ancestors, so the links a call needs are all
there once its prompt has ended. A span with a claim key that no profile claims (a LangGraph
node span, ``execute_task``) ending before its trace is watched leaves its link too, kept apart
(bounded, all traces together) until the trace is watched: the processor hands such spans here
anyway, and a section 3 prompt span may outlive the node span it started in.

**The outermost prompt.** A prompt span nested in another (OpenLLMetry's ``invoke_agent
LangGraph`` around ``LangGraph.workflow``) is part of the outer one. When a prompt span ends,
its ancestors are usually still open, so it waits for them: it is settled when the trace's
local root ends (or at once when it is that root), unless an ancestor ends that is itself a
prompt, which takes it in. Ancestors that ended before it (a prompt span that outlives the
span it started in, or the outer prompt span) are walked through at once, and an ended prompt
span among them takes it in just the same. Decisions of an inferred prompt therefore come out
when its outermost prompt span (or, below a root that is not a prompt, that root) ends; its
prompt is never enforced, so the host loses no action by waiting, and the decisions depend on
span times only, never on when they were computed.

**Inferred batches**, from span times: the tool calls whose start lies between one model call's
start and the next one's (or before the first). A batch settles at the next model call's start
or at the prompt span's end; a tool call that had not ended by then is late (a ``late_span``
diagnostic, and the batch is incomplete). Calls are in start order; a call ID seen twice in one
batch is a ``duplicate_span`` for the later call; more than ``max_calls_per_batch`` calls make
the batch incomplete (``batch_overflow``). A window without tool calls is not a batch.

**Section 3 spans.** A section 3 prompt or batch span (``acp.prompt.id``) shields its subtree:
its spans are section 3's, so a framework's own tool spans below an integration's batch span
are never read twice, and an inferred prompt span below a section 3 prompt span is no prompt,
wherever that span sits in its trace (as the Collector connector reads them). A trace whose
local root is an ``acp.*`` prompt span is not watched at all while that span is open, so
section 3 hosts pay nothing for the inferred profiles. When a section 3 prompt span is
anywhere below the prompt span (found through the links of ended spans, as lineage), the
host describes that very prompt with section 3 spans (the LangChain integration's prompt span
below OpenLLMetry's ``invoke_agent LangGraph``, through a node span): the inferred prompt is not
evaluated at all, so no call is counted twice. This is decided when the prompt settles, at its
outermost prompt span's or local root's end: the section 3 prompt span and the spans between
it and the prompt span have ended by then, in whatever order, or it is not below the prompt.
The price: an outer agent that calls a section 3 sub-agent has its own tool calls unevaluated
too (its prompt is never enforced, so only shadow decisions are lost).

**Bounded.** Watched traces are capped in number (``max_traces``, oldest first, an ``evicted``
diagnostic) and in bytes of kept data together (``max_bytes``, counted generously per link, call
and prompt; over it the oldest trace is dropped with a ``batch_overflow`` diagnostic). A dropped
trace, and one whose root ended, is remembered (bounded) so that its later spans are not read
as a partial trace: a prompt never decides on part of its calls.

**Local roots under remote parents.** A trace may enter the process several times (a caller
invoking the agent twice in one trace, or at once). When such a local root ends, only its part
of the trace is finished: its prompts settle, the rest below it is orphaned, and its span IDs
are remembered (bounded) so that its spans that end later are orphans too; the trace goes on.

Not thread-safe: the processor calls it under its own lock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Container, Mapping, Sized
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from otel_guard.reducer import Batch, Observation
from otel_guard.spans import attributes as attr
from otel_guard.spans.events import (
    BatchSettled,
    Claim,
    Coverage,
    InferredProfile,
    ProfileDiagnostic,
    ProfileEvent,
    ProfileName,
    PromptEnded,
    PromptStarted,
    ToolCall,
    bounded_id,
)
from otel_guard.spans.genai import PROFILE as GENAI
from otel_guard.spans.openinference import PROFILE as OPENINFERENCE

__all__ = ["CLAIM_KEYS", "PROFILES", "InferredAssembly"]

PROFILES: Final[tuple[InferredProfile, ...]] = (GENAI, OPENINFERENCE)
"""The inferred profiles, in the order they are asked: a new convention is one more module here."""
CLAIM_KEYS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(key for profile in PROFILES for key in profile.claim_keys)
)
"""A span ending with none of these keys (and in no watched trace) is no profile's."""

# What each kept item is counted as (deliberately above its CPython size).
_LINK_BYTES: Final = 160
_CALL_BYTES: Final = 480
_SPAN_BYTES: Final = 480
_NO_EVENTS: Final[list[ProfileEvent]] = []  # never appended to
# Dropped traces remembered, so their later spans are not read as a whole trace.
_MAX_DROPPED_TRACES: Final = 4096
# Span IDs of finished parts of traces (below a local root under a remote parent) remembered.
_MAX_ENDED_SPANS: Final = 16384
# Links of spans with a claim key that no profile claimed, ended before their trace was
# watched, kept (all traces together, oldest trace first out) until it is.
_MAX_EARLY_LINKS: Final = 16384
_NO_SHIELDS: Final[frozenset[int]] = frozenset()


def _below(
    span_id: int,
    links: Mapping[int, int | None],
    shields: Container[int],
    memo: dict[int, bool],
) -> bool:
    """Whether ``span_id`` is below a span ``memo`` holds as True, through ``links`` (span ->
    parent), not through a span of ``shields``; ``memo`` learns every span walked."""
    path: list[int] = []
    current: int | None = span_id
    found = False
    while current is not None:
        known = memo.get(current)
        if known is not None:
            found = known
            break
        if current in shields or len(path) > len(links):
            break  # a section 3 subtree, or a malformed parent cycle
        path.append(current)
        current = links.get(current)
    for step in path:
        memo[step] = found
    return found


class _Stand:
    """What is kept of a model-call or prompt span that may settle a batch: enough to stand for
    it in records and listener calls, none of its attributes."""

    __slots__ = ("context", "end", "name", "parent", "resource", "start")

    def __init__(self, span: ReadableSpan) -> None:
        self.name = span.name
        self.context = span.context
        self.parent = span.parent
        self.resource = span.resource
        self.start = span.start_time or 0
        self.end = span.end_time or self.start

    def readable(self) -> ReadableSpan:
        return ReadableSpan(
            name=self.name,
            context=self.context,
            parent=self.parent,
            resource=self.resource,
            start_time=self.start,
            end_time=self.end,
        )


class _PromptSpan:
    __slots__ = ("profile", "prompt_id", "stand")

    def __init__(self, prompt_id: str, profile: ProfileName, stand: _Stand) -> None:
        self.prompt_id = prompt_id
        self.profile = profile
        self.stand = stand


# (start, arrival, span ID, end, call, context)
_CallRecord = tuple[int, int, int, int, ToolCall, SpanContext]
# (start, arrival, span ID, stand)
_ModelRecord = tuple[int, int, int, _Stand]


class _Trace:
    __slots__ = ("bytes", "calls", "links", "models", "pending", "prompts", "shields")

    def __init__(self) -> None:
        self.links: dict[int, int | None] = {}  # ended span -> its parent in this process
        self.calls: list[_CallRecord] = []
        self.models: list[_ModelRecord] = []
        self.prompts: dict[int, _PromptSpan] = {}  # ended prompt spans not settled yet
        # Nearest open ancestor -> the ended prompt spans waiting for it to end.
        self.pending: dict[int, list[int]] = {}
        # Ended section 3 prompt (True) and batch (False) spans: their subtrees are section 3's.
        self.shields: dict[int, bool] = {}
        self.bytes = 0


class InferredAssembly:
    """Inferred prompts and batches from the ended spans of the profiles in :data:`PROFILES`."""

    def __init__(self, *, max_traces: int, max_bytes: int, max_calls_per_batch: int) -> None:
        self.traces: OrderedDict[int, _Trace] = OrderedDict()
        self._max_traces = max_traces
        self._max_bytes = max_bytes
        self._max_calls = max_calls_per_batch
        self._bytes = 0
        self._dropped: OrderedDict[int, None] = OrderedDict()
        self._section_3_roots: OrderedDict[int, None] = OrderedDict()
        # Span IDs below local roots under remote parents that ended (bounded, oldest first).
        self._ended_spans: OrderedDict[int, None] = OrderedDict()
        # Inferred prompts settled, by ID: their prompt span's (start, end), bounded.
        self._settled: OrderedDict[str, tuple[int, int]] = OrderedDict()
        # Links of unclaimed spans with a claim key that ended before their trace was watched.
        self._early: OrderedDict[int, dict[int, int | None]] = OrderedDict()
        self._early_links = 0
        self._arrivals = 0
        self._prompts = 0
        self._model_calls = 0
        self._tool_calls = 0
        self._orphans = 0
        self.claim_keys = CLAIM_KEYS

    def section_3_root(self, trace_id: int, open_now: bool) -> None:
        """A section 3 prompt span that is its trace's local root started (``open_now``) or
        ended. Below it every span is section 3's, so its trace is never watched meanwhile."""
        roots = self._section_3_roots
        if open_now:
            roots[trace_id] = None
            if len(roots) > self._max_traces:
                roots.popitem(last=False)
        else:
            roots.pop(trace_id, None)

    @property
    def watched(self) -> Sized:
        """The watched traces: while not empty, every ending span may leave a link."""
        return self.traces

    def coverage(self) -> Coverage:
        return Coverage(self._prompts, self._model_calls, self._tool_calls, self._orphans)

    def clear(self) -> None:
        self.traces.clear()
        self._dropped.clear()
        self._section_3_roots.clear()
        self._ended_spans.clear()
        self._settled.clear()
        self._early.clear()
        self._early_links = 0
        self._bytes = 0

    def turns_away(self, trace_id: int) -> bool:
        """Whether :meth:`end` would do nothing at all with a span of this trace that carries a
        claim key and no ``acp.prompt.id``: the trace is below an open section 3 root prompt
        span and not watched (it is never watched while that span is open). Two look-ups,
        before any profile reads the span, so a section 3 host's model-call spans cost next to
        nothing. Safe without the processor's lock: each is one dictionary read, and neither
        table gains this trace while its root is open."""
        return trace_id in self._section_3_roots and trace_id not in self.traces

    def link(self, trace_id: int, span_id: int, parent: SpanContext | None) -> list[ProfileEvent]:
        """An ended span no profile claims, without ``acp.prompt.id``: only its link matters, and
        only in a watched trace (the fast path of :meth:`end` for plain spans)."""
        trace = self.traces.get(trace_id)
        if trace is None:
            return _NO_EVENTS
        # A SpanContext is a tuple (trace ID, span ID, is remote, ...): indexing it is a plain
        # read, while its properties are Python calls.
        parent_id = None if parent is None or parent[2] else parent[1]
        links = trace.links
        if span_id not in links:  # a span ended twice is counted once
            trace.bytes += _LINK_BYTES
            self._bytes += _LINK_BYTES
        links[span_id] = parent_id
        within = self._bytes <= self._max_bytes
        if within and parent_id is not None and span_id not in trace.pending:
            return _NO_EVENTS
        events: list[ProfileEvent] = []
        remote_root = parent is not None and parent[2]
        self._after(trace_id, trace, span_id, parent_id, None, events, remote_root)
        return events

    def end(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> list[ProfileEvent]:
        """One ended span: claimed, a link of a watched trace, or nothing."""
        events: list[ProfileEvent] = []
        context = span.context
        if context is None:
            return events
        parent = span.parent
        parent_id = None if parent is None or parent.is_remote else parent.span_id
        trace_id = context.trace_id
        span_id = context.span_id
        traces = self.traces
        trace = traces.get(trace_id)
        claim: Claim | None = None
        shield = prompt = False
        if attr.PROMPT_ID in attributes:
            # A section 3 prompt or batch span: its subtree is section 3's. Only a prompt span
            # may hand over an inferred prompt above it, so only one starts watching a trace.
            operation = attributes.get(attr.OPERATION_NAME)
            shield = operation != attr.EXECUTE_TOOL and isinstance(attributes[attr.PROMPT_ID], str)
            prompt = (
                shield and operation == attr.INVOKE_AGENT and attr.BATCH_ADMITTED not in attributes
            )
            if trace is None and (not prompt or parent_id is None):
                return events  # a section 3 span outside any watched trace
        else:
            if trace is None and parent_id is None and self._root_model_call(attributes):
                # A model call that is its trace's local root (a chat completion outside any
                # agent): no prompt can hold it. Its trace is remembered as one whose root
                # ended, as reading it in full would leave it, without building anything
                # (under a remote parent the trace may enter the process again: not then).
                if (
                    parent is None
                    and trace_id not in self._section_3_roots
                    and trace_id not in self._dropped
                ):
                    self._remember(trace_id)
                return events
            for profile in PROFILES:
                claim = profile.read(span, attributes, parent_id is None)
                if claim is not None:
                    break
        if trace is None:
            if claim is None and not shield:
                self._early_link(trace_id, span_id, parent_id)
                return events
            if trace_id in self._section_3_roots:
                return events  # below a section 3 prompt span: never an inferred prompt's
            if trace_id in self._dropped:
                # Part of a trace given up, or ended after its root: never read as a whole.
                if claim is not None and claim.kind == "tool_call":
                    self._orphans += 1
                return events
            if parent_id is not None and parent_id in self._ended_spans:
                # Ended after its local root (under a remote parent) was read: an orphan.
                if claim is not None and claim.kind == "tool_call":
                    self._orphans += 1
                return events
            trace = traces[trace_id] = _Trace()
            early = self._early.pop(trace_id, None)
            if early is not None:
                self._early_links -= len(early)
                trace.links.update(early)
                trace.bytes += len(early) * _LINK_BYTES
                self._bytes += len(early) * _LINK_BYTES
            if len(traces) > self._max_traces:
                self._drop_oldest("evicted", events)
        elif claim is not None:
            if parent_id is not None and parent_id in self._ended_spans:
                if claim.kind == "tool_call":
                    self._orphans += 1
                return events
            traces.move_to_end(trace_id)
        size = 0 if span_id in trace.links else _LINK_BYTES
        trace.links[span_id] = parent_id
        if shield:
            trace.shields[span_id] = prompt
        elif claim is not None:
            size += self._keep(trace, claim, span, span_id, parent_id, context, events)
        trace.bytes += size
        self._bytes += size
        remote_root = parent is not None and parent.is_remote
        self._after(trace_id, trace, span_id, parent_id, claim, events, remote_root)
        return events

    def _early_link(self, trace_id: int, span_id: int, parent_id: int | None) -> None:
        """A span with a claim key that no profile claims ended in a trace not watched (yet): its
        link is kept, bounded, for when the trace is (a LangGraph node span that ends before the
        first model call while a section 3 prompt span started in it is still open)."""
        early = self._early
        if parent_id is None:
            # Its trace's local root: nothing below it can be watched as a whole any more.
            gone = early.pop(trace_id, None)
            if gone is not None:
                self._early_links -= len(gone)
            return
        if trace_id in self._section_3_roots or trace_id in self._dropped:
            return
        links = early.get(trace_id)
        if links is None:
            links = early[trace_id] = {}
        if span_id not in links:
            self._early_links += 1
        links[span_id] = parent_id
        while self._early_links > _MAX_EARLY_LINKS and early:
            self._early_links -= len(early.popitem(last=False)[1])

    def _after(
        self,
        trace_id: int,
        trace: _Trace,
        span_id: int,
        parent_id: int | None,
        claim: Claim | None,
        events: list[ProfileEvent],
        remote_root: bool = False,
    ) -> None:
        """Prompts waiting for this span to end move up, and a local root finishes its trace
        (``remote_root``: its part of the trace, when the root's parent is remote)."""
        traces = self.traces
        waiting = trace.pending.pop(span_id, None)
        if waiting is not None:
            if claim is not None and claim.kind == "prompt":
                for nested in waiting:
                    trace.prompts.pop(nested, None)  # part of this, the outer prompt
            else:
                self._wait(trace, waiting, parent_id, events)
        if parent_id is None:
            if remote_root:
                self._finish_part(trace_id, trace, span_id, events)
            else:
                self._finish(trace_id, trace, events)
        elif self._bytes > self._max_bytes:
            while self._bytes > self._max_bytes and traces:
                self._drop_oldest("batch_overflow", events)

    def _keep(
        self,
        trace: _Trace,
        claim: Claim,
        span: ReadableSpan,
        span_id: int,
        parent_id: int | None,
        context: SpanContext,
        events: list[ProfileEvent],
    ) -> int:
        self._arrivals += 1
        start = span.start_time or 0
        if claim.kind == "tool_call":
            assert claim.call is not None
            end = span.end_time or start
            trace.calls.append((start, self._arrivals, span_id, end, claim.call, context))
            return _CALL_BYTES + len(claim.call.call_id or "") + len(claim.call.tool_name or "")
        stand = _Stand(span)
        if claim.kind == "model_call":
            trace.models.append((start, self._arrivals, span_id, stand))
            return _SPAN_BYTES + len(stand.name)
        prompt_id = bounded_id(claim.prompt_id or f"{span_id:016x}")
        trace.prompts[span_id] = _PromptSpan(prompt_id, claim.profile, stand)
        self._wait(trace, [span_id], parent_id, events)
        return _SPAN_BYTES + len(stand.name) + len(prompt_id)

    def _wait(
        self, trace: _Trace, waiting: list[int], parent_id: int | None, events: list[ProfileEvent]
    ) -> None:
        """Ended prompt spans wait for their nearest open ancestor (settled at once when there
        is none). Ancestors that ended already (a span that outlives its parent) are walked
        through, and an ended prompt span among them is the outer prompt: it takes them in."""
        links = trace.links
        steps = len(links)
        for step in range(steps + 1):
            if parent_id is None:
                for prompt_span_id in waiting:
                    self._settle(trace, prompt_span_id, events)
                return
            if parent_id not in links or step == steps:  # open, or a malformed parent cycle
                trace.pending.setdefault(parent_id, []).extend(waiting)
                return
            if parent_id in trace.prompts:
                for nested in waiting:
                    trace.prompts.pop(nested, None)  # part of the outer prompt
                return
            parent_id = links[parent_id]

    def _finish(self, trace_id: int, trace: _Trace, events: list[ProfileEvent]) -> None:
        """The trace's local root ended: waiting prompts are outermost; what is left is orphaned."""
        for waiting in list(trace.pending.values()):
            for prompt_span_id in waiting:
                self._settle(trace, prompt_span_id, events)
        trace.pending.clear()
        self._orphans += len(trace.calls)
        # Spans of it that end later (after their root) are orphans: never a new partial trace.
        self._forget(trace_id, trace, remember=True)

    def _finish_part(
        self, trace_id: int, trace: _Trace, root_id: int, events: list[ProfileEvent]
    ) -> None:
        """A local root under a remote parent ended: the trace entered this process there, and
        may enter it again (a caller invoking the agent twice in one trace), or be in it through
        another such root right now. Prompts below this root are settled; what else is below it
        is orphaned and dropped, its span IDs remembered (bounded) so that spans ending after
        the root are orphans too; the rest of the trace goes on."""
        links = trace.links
        memo: dict[int, bool] = {root_id: True}
        no_shields: set[int] = set()  # a section 3 subtree below the root is below it too

        def below(span_id: int) -> bool:
            return _below(span_id, links, no_shields, memo)

        for key in [key for key in trace.pending if below(key)]:
            for prompt_span_id in trace.pending.pop(key):
                self._settle(trace, prompt_span_id, events)
        released = 0
        calls = [call for call in trace.calls if below(call[2])]
        if calls:
            self._orphans += len(calls)
            gone = {call[2] for call in calls}
            trace.calls = [call for call in trace.calls if call[2] not in gone]
            released += sum(
                _CALL_BYTES + len(c[4].call_id or "") + len(c[4].tool_name or "") for c in calls
            )
        models = [model for model in trace.models if below(model[2])]
        if models:
            gone = {model[2] for model in models}
            trace.models = [model for model in trace.models if model[2] not in gone]
            released += sum(_SPAN_BYTES + len(model[3].name) for model in models)
        for prompt_span_id in [p for p in trace.prompts if below(p)]:
            del trace.prompts[prompt_span_id]
        ended = self._ended_spans
        for span_id in [span_id for span_id in links if below(span_id)]:
            del links[span_id]
            trace.shields.pop(span_id, None)
            released += _LINK_BYTES
            ended[span_id] = None
        while len(ended) > _MAX_ENDED_SPANS:
            ended.popitem(last=False)
        released = min(released, trace.bytes)
        trace.bytes -= released
        self._bytes -= released
        if not (links or trace.calls or trace.models or trace.prompts or trace.pending):
            self._forget(trace_id, trace, remember=False)

    def _drop_oldest(self, diagnostic: Any, events: list[ProfileEvent]) -> None:
        trace_id, trace = next(iter(self.traces.items()))
        prompt_id = next((p.prompt_id for p in trace.prompts.values()), None)
        events.append(ProfileDiagnostic(diagnostic, prompt_id, None))
        self._forget(trace_id, trace, remember=True)

    def _forget(self, trace_id: int, trace: _Trace, *, remember: bool) -> None:
        del self.traces[trace_id]
        self._bytes -= trace.bytes
        if remember:
            self._remember(trace_id)

    def _remember(self, trace_id: int) -> None:
        dropped = self._dropped
        dropped[trace_id] = None
        if len(dropped) > _MAX_DROPPED_TRACES:
            dropped.popitem(last=False)

    @staticmethod
    def _root_model_call(attributes: Mapping[str, Any]) -> bool:
        """The profile that would read the span reads it as a model call (the profiles' claims
        never overlap: OpenInference leaves spans with ``gen_ai.operation.name`` alone)."""
        return any(profile.model_call(attributes) for profile in PROFILES)

    # -- settling a prompt ------------------------------------------------------------------

    def _settle(self, trace: _Trace, prompt_span_id: int, events: list[ProfileEvent]) -> None:
        prompt = trace.prompts.pop(prompt_span_id, None)
        if prompt is None:
            return  # taken in by an outer prompt
        links = trace.links
        shields = trace.shields
        memo: dict[int, bool] = {prompt_span_id: True}

        def below(span_id: int) -> bool:
            return _below(span_id, links, shields, memo)

        # Through any span, section 3 ones included: a section 3 span above (the prompt span is
        # in its subtree), or a section 3 prompt span anywhere below.
        above: dict[int, bool] = dict.fromkeys(shields, True)
        reach: dict[int, bool] = {prompt_span_id: True}
        handed_over = _below(prompt_span_id, links, _NO_SHIELDS, above) or any(
            _below(shield, links, _NO_SHIELDS, reach)
            for shield, is_prompt in shields.items()
            if is_prompt
        )
        calls = [call for call in trace.calls if below(call[2])]
        models = [model for model in trace.models if below(model[2])]
        if calls:
            mine = {call[2] for call in calls}
            trace.calls = [call for call in trace.calls if call[2] not in mine]
        if models:
            taken = {model[2] for model in models}
            trace.models = [model for model in trace.models if model[2] not in taken]
        released = len(calls) * _CALL_BYTES + len(models) * _SPAN_BYTES
        trace.bytes -= released
        self._bytes -= released
        if handed_over:
            return  # section 3 spans describe this prompt
        self._prompts += 1
        self._model_calls += len(models)
        self._tool_calls += len(calls)
        prompt_id = prompt.prompt_id
        # Two prompt spans with one ID open at once (a conversation ID on concurrent turns)
        # collide; each is still evaluated on its own, as it settles whole (docs/design.md).
        span = (prompt.stand.start, prompt.stand.end)
        settled = self._settled
        earlier = settled.pop(prompt_id, None)
        if earlier is not None and earlier[0] < span[1] and span[0] < earlier[1]:
            events.append(ProfileDiagnostic("prompt_collision", prompt_id, None))
        settled[prompt_id] = span
        if len(settled) > self._max_traces:
            settled.popitem(last=False)
        events.append(PromptStarted(prompt_id, prompt.profile, prompt_span_id))
        self._batches(prompt, calls, models, events)
        events.append(PromptEnded(prompt_id))

    def _batches(
        self,
        prompt: _PromptSpan,
        calls: list[_CallRecord],
        models: list[_ModelRecord],
        events: list[ProfileEvent],
    ) -> None:
        calls.sort(key=lambda call: (call[0], call[1]))
        models.sort(key=lambda model: (model[0], model[1]))
        starts = [model[0] for model in models]
        windows: dict[int, list[_CallRecord]] = {}
        for call in calls:
            windows.setdefault(bisect_right(starts, call[0]), []).append(call)
        prompt_id = prompt.prompt_id
        for index in sorted(windows):
            settler = models[index][3] if index < len(models) else prompt.stand
            settled_at = settler.start if index < len(models) else prompt.stand.end
            complete = True
            seen: set[str] = set()
            observations: list[Observation] = []
            for _, _, span_id, end, tool, context in windows[index]:
                if end > settled_at:
                    complete = False  # still running when its batch settled
                    events.append(ProfileDiagnostic("late_span", prompt_id, context))
                    continue
                if len(observations) >= self._max_calls:
                    if complete:
                        events.append(ProfileDiagnostic("batch_overflow", prompt_id, context))
                    complete = False
                    break
                call_id = tool.call_id or f"{span_id:016x}"
                if call_id in seen:
                    events.append(ProfileDiagnostic("duplicate_span", prompt_id, context))
                    continue
                seen.add(call_id)
                status = "error" if tool.failed else "success"
                observations.append(
                    Observation(
                        call_id=call_id,
                        policy_tool_name=tool.tool_name,
                        tool_type=tool.tool_type,
                        terminal_status=status,
                        execution_status=status,
                        execution_error_type=tool.error_type,
                    )
                )
            events.append(
                BatchSettled(
                    prompt_id,
                    Batch(complete, tuple(observations)),
                    settler.readable(),
                    prompt.profile,
                )
            )
