"""``GuardSpanProcessor``: settled tool batches from spans, the reducer per prompt, host actions.

Data flows one way: span -> batch assembly -> :func:`otel_guard.reducer.reduce` -> telemetry and
the host action. The reducer runs synchronously inside the batch span's ``end()``; telemetry is
emitted after the guard's lock is released, with instrumentation suppressed.

Span identification (docs/contract.md section 3), decided when a span starts:

* ``gen_ai.operation.name == "execute_tool"``: a tool-call span, kept when it ends under an open
  batch span; its attributes are read when the batch span ends, in call start order (a call ID
  seen twice in one batch is a ``duplicate_span`` diagnostic for the later-started call).
* ``gen_ai.operation.name == "invoke_agent"`` with ``acp.prompt.id``: a prompt span.
* any other span with ``acp.prompt.id`` at start: a batch span candidate. It is evaluated when it
  ends if it then carries ``acp.batch.admitted``; a present but malformed admitted count makes
  the batch incomplete. A batch span must therefore carry ``acp.prompt.id`` from its start; the
  admitted count and the input-drain attributes may be set at any time before it ends.

Spans without ``acp.prompt.id`` that are ``invoke_agent`` spans, or that start while a GenAI
prompt is open, go to :class:`~otel_guard.genai_profile.GenAIProfile` (section 3b), whose events
this processor applies like a batch span's; its module docstring says how it stays bounded.

Every other span costs two dictionary look-ups in ``on_start`` and two in ``on_end``, plus one
truth test of the profile's (usually empty) table of open GenAI spans.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from opentelemetry import context as context_api
from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext

from otel_guard import attributes as attr
from otel_guard.genai_profile import (
    BatchSettled,
    Coverage,
    GenAIProfile,
    ProfileDiagnostic,
    ProfileEvent,
    PromptEnded,
    PromptStarted,
)
from otel_guard.mode import resolve_mode
from otel_guard.reducer import (
    REMINDER,
    STOP_MESSAGE,
    Batch,
    Decision,
    GuardInput,
    GuardState,
    Mode,
    Observation,
    effective_mode,
    reduce,
)
from otel_guard.telemetry import (
    DecisionValue,
    Diagnostic,
    GuardTelemetry,
    Transition,
    decision_value,
)

__all__ = ["BatchEvaluation", "GuardAction", "GuardSpanProcessor", "Profile"]

Profile = Literal["acp", "genai"]

_logger = logging.getLogger(__name__)

DEFAULT_MAX_PROMPTS = 10_000
DEFAULT_PROMPT_TTL_SECONDS = 6 * 60 * 60.0
DEFAULT_MAX_CALLS_PER_BATCH = 1_024
# Longer tool names are treated as missing: they are not plausible registry names and would
# otherwise be kept, unbounded, in the private failure key.
MAX_TOOL_NAME_LENGTH = 256
MAX_CALL_ID_LENGTH = 256

_EMPTY: Mapping[str, Any] = {}
# A SpanContext is a tuple whose second item is the span ID (its declared type); indexing it is
# a plain tuple read, while its ``span_id`` property is a Python call.
_SPAN_ID: Final = 1
# Builds a named tuple from a tuple of its fields without a Python-level call.
_new = tuple.__new__
# Bound once: on_start and on_end run inside every span of the host.
_OPERATION_NAME = attr.OPERATION_NAME
_EXECUTE_TOOL = attr.EXECUTE_TOOL
_INVOKE_AGENT = attr.INVOKE_AGENT
_PROMPT_ID = attr.PROMPT_ID
_BATCH_ADMITTED = attr.BATCH_ADMITTED
_TOOL_CALL_ID = attr.TOOL_CALL_ID
_TOOL_NAME = attr.TOOL_NAME
_TOOL_TYPE = attr.TOOL_TYPE
_TOOL_STATUS = attr.TOOL_STATUS
_TOOL_EXECUTION_STATUS = attr.TOOL_EXECUTION_STATUS
_TOOL_EXECUTION_ERROR_TYPE = attr.TOOL_EXECUTION_ERROR_TYPE
_TOOL_PROVIDER_DUPLICATE = attr.TOOL_PROVIDER_DUPLICATE


@dataclass(frozen=True, slots=True)
class GuardAction:
    """What the host should do before its next model request for a prompt."""

    kind: Literal["reminder", "stop"]
    text: str


@dataclass(frozen=True, slots=True)
class BatchEvaluation:
    """One batch the guard evaluated, for in-process listeners (the CLI's replay report).

    ``decision`` is the reducer's decision; ``decision_value`` is the value of docs/contract.md
    section 5 that was emitted (``None`` for ``none``), which differs from the reducer's kind when
    a ``stop`` is recorded as ``would_stop`` because the host never took the reminder.
    ``profile`` says how the batch was read: ``acp`` (a batch span, section 3) or ``genai``
    (inferred, section 3b); ``span`` is the batch span, or for an inferred batch the model-call
    or prompt span that settled it.
    """

    prompt_id: str
    span: ReadableSpan
    mode: Mode
    batch: Batch
    has_external_input: bool
    has_queued_prompt: bool
    input_reliable: bool
    before: GuardState
    decision: Decision
    decision_value: DecisionValue | None
    action: GuardAction | None
    profile: Profile = "acp"


BatchListener = Callable[[BatchEvaluation], None]
# A GenAI-profile prompt is never enforced: its history starts without an enforceable input.
_GENAI_INITIAL: Final = GuardState.initial()._replace(enforcement_disabled=True)


class _Prompt:
    __slots__ = ("guarded", "last_seen", "pending", "reminded_ordinal", "state")

    def __init__(self, guarded: bool, now: float) -> None:
        self.guarded = guarded
        self.state = GuardState.initial()
        self.pending: GuardAction | None = None
        self.reminded_ordinal = 0
        self.last_seen = now


class _PromptSpan:
    __slots__ = ("prompt_id",)

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id


class _OpenBatch:
    __slots__ = ("calls", "closed", "overflow", "prompt_id")

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        # (start time, arrival, span) of each tool-call span that ended under this batch: read
        # once, when the batch ends, in call start order.
        self.calls: list[tuple[int, int, ReadableSpan]] = []
        self.overflow = False
        self.closed = False


_Tracked = _PromptSpan | _OpenBatch
# Batch spans that ended recently, by span ID, with their prompt: a tool-call span ending under
# one of them is a late frame. Bounded: a frame later than this is ignored as an orphan.
_ENDED_BATCHES = 4096
# What to emit once the lock is released.
_Emission = (
    tuple[Literal["diagnostic"], Diagnostic, str | None, SpanContext | None]
    | tuple[Literal["transition"], Transition]
)


def _attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as cheaply as possible.

    The SDK's public ``attributes`` property wraps the attribute store in a new mapping proxy on
    every call and answers misses by raising ``KeyError`` internally, which costs about ten times
    a dictionary look-up; on the hot path the store's own dictionary is read when it exists.
    """
    store = getattr(span, "_attributes", None)
    if type(store) is dict:  # spans built from recorded data (replay) hold a plain dict
        return store
    inner = getattr(store, "_dict", None)
    if isinstance(inner, dict):
        return inner
    public = span.attributes
    return public if public is not None else _EMPTY


def _opted_out(attributes: Mapping[str, Any]) -> bool:
    """A prompt or batch span marks its prompt as not guarded: a route other than the
    interactive one, or a channel prompt."""
    route = attributes.get(attr.PROMPT_ROUTE)
    return (isinstance(route, str) and route != attr.ROUTE_INTERACTIVE) or attributes.get(
        attr.PROMPT_CHANNEL
    ) is True


class GuardSpanProcessor(SpanProcessor):
    """Watches tool-call spans and runs the repeated-tool-failure guard for each prompt.

    Args:
        mode: ``off``, ``shadow``, ``warn`` or ``enforce``. When omitted, the process environment
            variable ``QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD`` is read once, here; missing or
            invalid values give ``shadow`` (invalid ones record an ``invalid_mode`` diagnostic).
        meter_provider, logger_provider: where guard telemetry goes; the global providers when
            omitted.
        max_prompts: prompts whose state is kept at once; beyond it the least recently active
            idle prompt is evicted first (an ``evicted`` diagnostic).
        prompt_ttl_seconds: a prompt with no guard activity for this long is dropped
            (``expired``), as if its prompt span had ended.
        max_calls_per_batch: tool calls tracked per batch; a batch with more is incomplete.
        listener: called with a :class:`BatchEvaluation` after every evaluated batch, outside
            the guard's lock; its exceptions are counted as ``internal_error``.
        clock: monotonic seconds, for the TTL.

    The processor never raises into ``span.end()``; every exception it catches is counted as an
    ``internal_error`` diagnostic.
    """

    def __init__(
        self,
        *,
        mode: str | None = None,
        meter_provider: MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        max_prompts: int = DEFAULT_MAX_PROMPTS,
        prompt_ttl_seconds: float = DEFAULT_PROMPT_TTL_SECONDS,
        max_calls_per_batch: int = DEFAULT_MAX_CALLS_PER_BATCH,
        listener: BatchListener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_prompts < 1:
            raise ValueError("max_prompts must be at least 1")
        if prompt_ttl_seconds <= 0:
            raise ValueError("prompt_ttl_seconds must be positive")
        if max_calls_per_batch < 1:
            raise ValueError("max_calls_per_batch must be at least 1")
        resolution = resolve_mode(mode)
        self._mode: Mode = resolution.mode
        self._max_prompts = max_prompts
        self._ttl = float(prompt_ttl_seconds)
        self._max_calls = max_calls_per_batch
        # Open prompt and batch spans; bounded so never-ending spans cannot grow the table.
        self._max_tracked = 4 * max_prompts + max_calls_per_batch
        self._listener = listener
        self._clock = clock
        self._lock = threading.Lock()
        self._prompts: OrderedDict[str, _Prompt] = OrderedDict()
        self._tracked: OrderedDict[int, _Tracked] = OrderedDict()
        self._ended_batches: OrderedDict[int, str] = OrderedDict()
        self._seq = 0
        self._diagnostic_counts: Counter[str] = Counter()
        self._shutdown = False
        self._inert = self._mode == "off"
        self._telemetry = GuardTelemetry(meter_provider, logger_provider)
        self._genai = GenAIProfile(
            max_open_spans=self._max_tracked, max_calls_per_batch=max_calls_per_batch
        )
        # Open spans below GenAI prompts: empty (and skipped) while no such prompt is open.
        self._genai_open = self._genai.lineage
        if resolution.invalid:
            self._flush([("diagnostic", "invalid_mode", None, None)])

    # -- public API -------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The configured mode (read once at construction)."""
        return self._mode

    def take_action(self, prompt_id: str) -> GuardAction | None:
        """Return the prompt's pending action once, and clear it.

        A host calls this after each batch settles, before its next model request. Taking a
        ``reminder`` is what later allows a ``stop`` for that candidate in ``enforce`` mode.
        An action that is not taken before the prompt's next batch settles is dropped.
        """
        try:
            with self._lock:
                prompt = self._prompts.get(prompt_id)
                if prompt is None or prompt.pending is None:
                    return None
                action, prompt.pending = prompt.pending, None
                if action.kind == "reminder":
                    prompt.reminded_ordinal = prompt.state.candidate_ordinal
                return action
        except Exception:
            self._internal_error()
            return None

    def state(self, prompt_id: str) -> GuardState | None:
        """The prompt's current guard state, or ``None`` if the guard keeps none for it."""
        with self._lock:
            prompt = self._prompts.get(prompt_id)
            return None if prompt is None else prompt.state

    def diagnostics(self) -> dict[str, int]:
        """Diagnostics recorded so far by this processor, by name."""
        with self._lock:
            return dict(self._diagnostic_counts)

    def genai_coverage(self) -> Coverage:
        """GenAI-profile prompts, model calls and tool calls seen so far (section 3b)."""
        with self._lock:
            return self._genai.coverage()

    # -- SpanProcessor ----------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: context_api.Context | None = None) -> None:
        # Whether the processor is inert is asked only of spans that may matter: an ignored
        # span's path pays for the look-ups that ignore it and nothing else.
        try:
            # _attributes(span), inlined: on this path a call costs as much as the reads.
            try:
                attributes = span._attributes._dict  # type: ignore[union-attr]
            except AttributeError:
                attributes = _attributes(span)
            # Only prompt and batch spans matter here, and both carry the prompt ID from their
            # start: every other span leaves after this one look-up.
            # Membership tests, not get(): on a miss, no method call.
            if _PROMPT_ID not in attributes:
                if (
                    (
                        self._genai_open
                        or (
                            _OPERATION_NAME in attributes
                            and attributes[_OPERATION_NAME] == _INVOKE_AGENT
                        )
                    )
                    and not self._inert
                    and not self._genai.follow(span, attributes)
                ):
                    self._genai_step(span, attributes, starting=True)
                return
            if self._inert:
                return
            prompt_id = attributes[_PROMPT_ID]
            operation = attributes.get(_OPERATION_NAME)
            if operation == _EXECUTE_TOOL or not isinstance(prompt_id, str):
                return  # tool-call spans are read when they end
            if operation == _INVOKE_AGENT and _BATCH_ADMITTED not in attributes:
                if self._genai_open:
                    self._genai_shield(span)
                self._start_prompt(span, prompt_id, attributes)
            else:
                self._start_batch(span, prompt_id)
        except Exception:
            self._internal_error()

    def on_end(self, span: ReadableSpan) -> None:
        try:
            try:
                attributes = span._attributes._dict  # type: ignore[union-attr]
            except AttributeError:
                attributes = _attributes(span)
            if _OPERATION_NAME in attributes and attributes[_OPERATION_NAME] == _EXECUTE_TOOL:
                if not self._inert:
                    self._end_tool(span, attributes)
                return
            if _PROMPT_ID not in attributes:
                # Neither a prompt nor a batch span: the common case ends here. The table of
                # open GenAI spans is empty while the processor is inert.
                if self._genai_open and not self._genai.drop(span, attributes):
                    self._genai_step(span, attributes, starting=False)
                return
            if self._inert:
                return
            if self._genai_open:
                self._genai_step(span, attributes, starting=False)
            try:
                context = span._context
            except AttributeError:
                context = span.context
            if context is None or context[_SPAN_ID] not in self._tracked:
                return
            self._end_tracked(span, context)
        except Exception:
            self._internal_error()

    def shutdown(self) -> None:
        """Stop observing and drop all state. Idempotent."""
        try:
            with self._lock:
                if self._shutdown:
                    return
                self._shutdown = True
                self._inert = True
                self._prompts.clear()
                self._tracked.clear()
                self._ended_batches.clear()
                self._genai.clear()
        except Exception:
            _logger.debug("otel_guard: shutdown failed", exc_info=False)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The guard buffers nothing; its telemetry goes through the providers' own pipelines."""
        return True

    # -- span handling (hot path ends above) ---------------------------------------------------

    def _start_prompt(self, span: Span, prompt_id: str, attributes: Mapping[str, Any]) -> None:
        guarded = not _opted_out(attributes)
        out: list[_Emission] = []
        with self._lock:
            now = self._clock()
            self._prompts.pop(prompt_id, None)  # a new prompt span starts a fresh prompt
            self._admit_prompt(prompt_id, _Prompt(guarded, now), now, out)
            self._track(span.context.span_id, _PromptSpan(prompt_id), out)
        self._flush(out)

    def _start_batch(self, span: Span, prompt_id: str) -> None:
        tracked = self._tracked
        with self._lock:
            tracked[span.context[_SPAN_ID]] = _OpenBatch(prompt_id)
            if len(tracked) <= self._max_tracked:
                return
            out: list[_Emission] = []
            self._evict(out)
        self._flush(out)

    def _track(self, span_id: int, ref: _Tracked, out: list[_Emission]) -> None:
        self._tracked[span_id] = ref
        self._evict(out)

    def _evict(self, out: list[_Emission]) -> None:
        tracked = self._tracked
        while len(tracked) > self._max_tracked:
            _, oldest = tracked.popitem(last=False)
            if type(oldest) is _OpenBatch:
                oldest.closed = True
                out.append(("diagnostic", "evicted", oldest.prompt_id, None))

    def _end_tracked(self, span: ReadableSpan, context: SpanContext) -> None:
        out: list[_Emission] = []
        evaluation: tuple[Transition | None, BatchEvaluation | None] | None = None
        with self._lock:
            ref = self._tracked.pop(context[_SPAN_ID], None)
            if type(ref) is _OpenBatch:
                evaluation = self._end_batch(span, context, ref, out)
            elif type(ref) is _PromptSpan:
                self._prompts.pop(ref.prompt_id, None)
        if evaluation is not None:
            transition, batch_evaluation = evaluation
            if transition is not None:
                out.append(("transition", transition))
            if out:
                self._flush(out)
            if batch_evaluation is not None:
                self._notify(batch_evaluation)
        elif out:
            self._flush(out)

    def _end_tool(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> None:
        # Only kept here; the span's attributes are read when its batch ends, in one pass.
        try:
            parent = span._parent
            start_time = span._start_time
        except AttributeError:
            parent = span.parent
            start_time = span.start_time
        batch = None if parent is None else self._tracked.get(parent[_SPAN_ID])
        if type(batch) is not _OpenBatch:
            prompt_id = None if parent is None else self._ended_batches.get(parent[_SPAN_ID])
            if prompt_id is not None:
                self._flush([("diagnostic", "late_span", prompt_id, span.context)])
                if self._genai_open:
                    with self._lock:
                        self._genai.forget(span)
            else:  # not under a batch span: a GenAI-profile tool call, or an orphan
                self._genai_step(span, attributes, starting=False)
            return
        if self._genai_open:
            with self._lock:
                self._genai.forget(span)  # under a batch span: section 3 reads it
        diagnostic: Diagnostic | None = None
        with self._lock:
            calls = batch.calls
            if batch.closed:
                diagnostic = "late_span"  # its batch span ended while this call was settling
            elif len(calls) < self._max_calls:
                calls.append((start_time or 0, len(calls), span))
                return
            elif not batch.overflow:
                batch.overflow = True
                diagnostic = "batch_overflow"
        if diagnostic is not None:
            self._flush([("diagnostic", diagnostic, batch.prompt_id, span.context)])

    def _observations(
        self, batch: _OpenBatch, out: list[_Emission]
    ) -> tuple[tuple[Observation, ...], int, bool]:
        """The batch's observations in call start order, its distinct call IDs, and whether
        every call carried a usable ID."""
        calls = batch.calls
        if len(calls) > 1:
            calls.sort()  # start time, then arrival (unique, so spans are never compared)
        observations: list[Observation] = []
        call_ids: set[str] = set()
        well_formed = True
        new = _new
        for _, _, span in calls:
            try:
                attributes = span._attributes._dict  # type: ignore[union-attr]
            except AttributeError:
                attributes = _attributes(span)
            get = attributes.get
            call_id = get(_TOOL_CALL_ID)
            if type(call_id) is not str or not call_id or len(call_id) > MAX_CALL_ID_LENGTH:
                call_id = ""
            duplicate = get(_TOOL_PROVIDER_DUPLICATE) is True
            if not duplicate:
                if not call_id:
                    well_formed = False  # a call without an ID cannot prove completeness
                    continue
                if call_id in call_ids:
                    out.append(("diagnostic", "duplicate_span", batch.prompt_id, span.context))
                    continue
                call_ids.add(call_id)
            tool_name = get(_TOOL_NAME)
            tool_type = get(_TOOL_TYPE)
            status = get(_TOOL_STATUS)
            execution = get(_TOOL_EXECUTION_STATUS)
            error_type = get(_TOOL_EXECUTION_ERROR_TYPE)
            observations.append(
                new(
                    Observation,
                    (
                        call_id,
                        tool_name
                        if type(tool_name) is str and len(tool_name) <= MAX_TOOL_NAME_LENGTH
                        else None,
                        tool_type if type(tool_type) is str else None,
                        status if type(status) is str else "",
                        execution if type(execution) is str else None,
                        error_type if type(error_type) is str else None,
                        duplicate,
                    ),
                )
            )
        return tuple(observations), len(call_ids), well_formed

    def _end_batch(
        self, span: ReadableSpan, context: SpanContext, batch: _OpenBatch, out: list[_Emission]
    ) -> tuple[Transition | None, BatchEvaluation | None] | None:
        batch.closed = True
        ended = self._ended_batches
        ended[context[_SPAN_ID]] = batch.prompt_id
        if len(ended) > _ENDED_BATCHES:
            ended.popitem(last=False)
        try:
            attributes = span._attributes._dict  # type: ignore[union-attr]
        except AttributeError:
            attributes = _attributes(span)
        if _BATCH_ADMITTED not in attributes:
            return None  # carried a prompt ID but is not a batch span
        prompt_id = batch.prompt_id
        now = self._clock()
        prompt = self._prompts.get(prompt_id)
        if prompt is None:
            prompt = _Prompt(True, now)
            self._admit_prompt(prompt_id, prompt, now, out)
        else:
            prompt.last_seen = now
            self._prompts.move_to_end(prompt_id)
        if _opted_out(attributes):
            prompt.guarded = False  # a marker on any batch opts the whole prompt out
        if not prompt.guarded:
            return None

        observations, distinct_calls, well_formed = self._observations(batch, out)
        admitted = attributes.get(attr.BATCH_ADMITTED)
        complete = (
            type(admitted) is int
            and admitted >= 0
            and not batch.overflow
            and well_formed
            and distinct_calls == admitted
        )
        # The named tuples' own constructors are Python calls; tuple.__new__ is not.
        guard_input: GuardInput = _new(
            GuardInput,
            (
                self._mode,
                _new(Batch, (complete, observations)),
                attributes.get(attr.INPUT_EXTERNAL) is True,
                attributes.get(attr.INPUT_QUEUED_PROMPT) is True,
                attributes.get(attr.INPUT_RELIABLE) is True,
            ),
        )
        return self._decide(prompt_id, prompt, guard_input, span, context)

    def _decide(
        self,
        prompt_id: str,
        prompt: _Prompt,
        guard_input: GuardInput,
        span: ReadableSpan,
        context: SpanContext,
        profile: Profile = "acp",
    ) -> tuple[Transition | None, BatchEvaluation | None] | None:
        """Run the reducer on one settled batch of a guarded prompt; under the lock."""
        before = prompt.state
        decision = reduce(before, guard_input)
        kind, after, reason = decision
        prompt.state = after
        prompt.pending = None  # an action not taken before this batch settled is stale
        if kind == "none" and self._listener is None:
            return None  # the common case: nothing to emit, nobody to tell
        value = decision_value(kind)
        action: GuardAction | None = None
        if kind == "warn":
            action = GuardAction("reminder", REMINDER)
        elif kind == "stop":
            if prompt.reminded_ordinal == after.candidate_ordinal:
                action = GuardAction("stop", STOP_MESSAGE)
            else:
                value = "would_stop"  # never stop a candidate whose reminder was not delivered
        prompt.pending = action

        transition: Transition | None = None
        if value is not None:
            candidate = before if value == "reset" else after
            key = after.key
            tool_type = None
            if value != "reset" and key is not None:
                tool_type = next(
                    (
                        o.tool_type
                        for o in guard_input.batch.observations
                        if o.policy_tool_name == key.policy_tool_name
                        and o.execution_error_type == key.execution_error_type
                        and not o.provider_duplicate
                    ),
                    None,
                )
            mode = effective_mode(self._mode, after.enforcement_disabled)
            transition = Transition(
                prompt_id=prompt_id,
                mode=mode,  # type: ignore[arg-type]  # never "off" here
                phase_before=before.phase,
                phase_after=after.phase,
                decision=value,
                failure_count=candidate.failure_count,
                batch_count=candidate.batch_count,
                candidate_ordinal=candidate.candidate_ordinal,
                reset_reason=reason,
                tool_type=tool_type,
                execution_error_type=None if key is None else key.execution_error_type,
                span_context=context,
            )
        if self._listener is None:
            return transition, None
        evaluation = BatchEvaluation(
            prompt_id=prompt_id,
            span=span,
            mode=self._mode,
            batch=guard_input.batch,
            has_external_input=guard_input.has_external_input,
            has_queued_prompt=guard_input.has_queued_prompt,
            input_reliable=guard_input.input_reliable,
            before=before,
            decision=decision,
            decision_value=value,
            action=action,
            profile=profile,
        )
        return transition, evaluation

    # -- the GenAI-conventions profile (section 3b) -------------------------------------------

    def _genai_step(
        self, span: ReadableSpan, attributes: Mapping[str, Any], starting: bool
    ) -> None:
        out: list[_Emission] = []
        evaluations: list[BatchEvaluation] = []
        with self._lock:
            genai = self._genai
            events = genai.start(span, attributes) if starting else genai.end(span, attributes)
            for event in events:
                self._apply_genai(event, out, evaluations)
        if out:
            self._flush(out)
        for evaluation in evaluations:
            self._notify(evaluation)

    def _genai_shield(self, span: Span) -> None:
        out: list[_Emission] = []
        with self._lock:
            for event in self._genai.shield(span):
                self._apply_genai(event, out, [])
        if out:
            self._flush(out)

    def _apply_genai(
        self, event: ProfileEvent, out: list[_Emission], evaluations: list[BatchEvaluation]
    ) -> None:
        if type(event) is ProfileDiagnostic:
            out.append(("diagnostic", event.name, event.prompt_id, event.span_context))
        elif type(event) is PromptEnded:
            self._prompts.pop(event.prompt_id, None)
        elif type(event) is PromptStarted:
            now = self._clock()
            self._prompts.pop(event.prompt_id, None)  # a new prompt span starts a fresh prompt
            self._admit_prompt(event.prompt_id, self._genai_prompt(now), now, out)
        elif type(event) is BatchSettled:
            now = self._clock()
            prompt = self._prompts.get(event.prompt_id)
            if prompt is None:  # its state was dropped: rebuilt, still never enforced
                prompt = self._genai_prompt(now)
                self._admit_prompt(event.prompt_id, prompt, now, out)
            else:
                prompt.last_seen = now
                self._prompts.move_to_end(event.prompt_id)
            context = event.span.context
            if not prompt.guarded or context is None:
                return
            # The input drain is taken as reliable with no new input: nothing says otherwise,
            # and the prompt is never enforced.
            guard_input: GuardInput = GuardInput(self._mode, event.batch, False, False, True)
            result = self._decide(
                event.prompt_id, prompt, guard_input, event.span, context, profile="genai"
            )
            if result is not None:
                transition, evaluation = result
                if transition is not None:
                    out.append(("transition", transition))
                if evaluation is not None:
                    evaluations.append(evaluation)

    @staticmethod
    def _genai_prompt(now: float) -> _Prompt:
        prompt = _Prompt(True, now)
        prompt.state = _GENAI_INITIAL
        return prompt

    def _admit_prompt(
        self, prompt_id: str, prompt: _Prompt, now: float, out: list[_Emission]
    ) -> None:
        prompts = self._prompts
        # Expire from the least recently active end.
        while prompts:
            oldest_id, oldest = next(iter(prompts.items()))
            if now - oldest.last_seen < self._ttl:
                break
            del prompts[oldest_id]
            out.append(("diagnostic", "expired", oldest_id, None))
        if len(prompts) >= self._max_prompts:
            victim = next(
                (
                    pid
                    for pid, p in prompts.items()
                    if p.state.phase == "idle" and p.pending is None
                ),
                None,
            )
            if victim is None:
                victim = next(iter(prompts))
            del prompts[victim]
            out.append(("diagnostic", "evicted", victim, None))
        prompts[prompt_id] = prompt

    # -- emission (outside the lock) ----------------------------------------------------------

    def _flush(self, out: list[_Emission]) -> None:
        # No instrumentation suppression is needed here: the SDK's log processors suppress it
        # around their own exports, and nothing else here can create spans.
        telemetry = self._telemetry
        for item in out:
            if item[0] == "diagnostic":
                _, name, prompt_id, span_context = item
                self._count(name)
                ok = telemetry.diagnostic(name, prompt_id, span_context)
            else:
                ok = telemetry.transition(item[1])
            if not ok:
                self._count("telemetry_error")
                telemetry.diagnostic("telemetry_error")

    def _count(self, name: Diagnostic) -> None:
        with self._lock:
            self._diagnostic_counts[name] += 1

    def _notify(self, evaluation: BatchEvaluation) -> None:
        if self._listener is None:
            return
        try:
            self._listener(evaluation)
        except Exception:
            self._internal_error()

    def _internal_error(self) -> None:
        try:
            # No traceback: frames can hold span data, and this logger may be bridged to OTLP.
            _logger.debug("otel_guard: internal error in the guard processor")
            self._flush([("diagnostic", "internal_error", None, None)])
        except Exception:  # the last line of defence: nothing escapes into span.end()
            pass
