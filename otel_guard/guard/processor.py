"""``GuardSpanProcessor``: settled tool batches from spans, the reducer per prompt, host actions.

Data flows one way: span -> profile (which convention, what the span is) -> batch assembly ->
:func:`otel_guard.reducer.reduce` -> telemetry and the host action. Telemetry is emitted after
the guard's lock is released, with instrumentation suppressed.

* **Section 3 spans** (:mod:`otel_guard.spans.acp` reads their attributes): the processor keeps
  their open prompt and batch spans itself, because the reducer runs synchronously inside the
  batch span's ``end()``. A span with ``acp.prompt.id`` at start is a prompt span
  (``invoke_agent``) or a batch span candidate, evaluated when it ends if it then carries
  ``acp.batch.admitted``. An ``execute_tool`` span ending under an open batch span is reduced to
  the few fields the reducer needs; they become observations, in call start order, when the
  batch span ends.
* **Inferred profiles** (sections 3b and 3c; :mod:`otel_guard.spans.assembly` and the profile
  modules it lists): every other span is handed over when it *ends*, if it carries one of the
  profiles' claim keys or belongs to a trace the assembly watches. The assembly emits normalized
  events (prompt started, batch settled, prompt ended, diagnostics), which this processor applies
  like a batch span's evaluation. A new convention is a new profile module: nothing here changes.

An unclaimed span costs one membership test in ``on_start`` and a few in ``on_end`` (the
profiles' claim keys), plus one truth test of the (usually empty) table of watched traces.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from opentelemetry import context as context_api
from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext

from otel_guard._compiled import mypyc_attr
from otel_guard.guard import _sdkfields as _sdk
from otel_guard.guard.mode import resolve_mode
from otel_guard.guard.telemetry import (
    Decided,
    DecisionValue,
    Diagnostic,
    GuardTelemetry,
    QueueItem,
    decision_value,
)
from otel_guard.reducer import (
    REMINDER,
    STOP_MESSAGE,
    Batch,
    Decision,
    GuardInput,
    GuardState,
    Mode,
    Observation,
    reduce,
)
from otel_guard.spans import attributes as attr
from otel_guard.spans.acp import opted_out as _opted_out
from otel_guard.spans.acp import read_call
from otel_guard.spans.assembly import CLAIM_KEYS, InferredAssembly
from otel_guard.spans.events import (
    MAX_ID_LENGTH,
    MAX_PROMPT_ID_LENGTH,
    BatchSettled,
    Coverage,
    ProfileDiagnostic,
    ProfileEvent,
    ProfileName,
    PromptEnded,
    PromptStarted,
    bounded_id,
)

__all__ = [
    "ANY_VALUE",
    "BatchEvaluation",
    "GuardAction",
    "GuardSpanProcessor",
    "Interest",
    "Profile",
]

ANY_VALUE: Final = object()
"""In an :data:`Interest`, matches any value of the key."""
Interest = tuple[tuple[str, object], ...]
"""(attribute key, value) pairs: a span with any of them (any value for :data:`ANY_VALUE`) may be
the guard's; a span with none of them is not (unless a GenAI prompt is open: see
:attr:`GuardSpanProcessor.genai_lineage`)."""

Profile = ProfileName

_logger = logging.getLogger(__name__)

DEFAULT_MAX_PROMPTS = 10_000
DEFAULT_PROMPT_TTL_SECONDS = 6 * 60 * 60.0
DEFAULT_MAX_CALLS_PER_BATCH = 1_024
# Tool-call data kept for all open batches together (docs/contract.md section 4: bounded in bytes).
DEFAULT_MAX_CALL_BYTES = 16 * 1024 * 1024
# Longer tool names are treated as missing: they are not plausible registry names and would
# otherwise be kept, unbounded, in the private failure key.
MAX_TOOL_NAME_LENGTH = MAX_ID_LENGTH
MAX_CALL_ID_LENGTH = MAX_ID_LENGTH

_EMPTY: Mapping[str, Any] = {}
# A SpanContext is a tuple whose second item is the span ID (its declared type); indexing it is
# a plain tuple read, while its ``span_id`` property is a Python call.
_SPAN_ID: Final = 1
# Builds a named tuple from a tuple of its fields without a Python-level call.
_new = tuple.__new__


def _frame(context: SpanContext, span_id: int) -> SpanContext:
    """The context a diagnostic names for one call span of a batch: the batch's trace ID and
    flags with the call's span ID (not the trace state, which a record never carries)."""
    return SpanContext(context.trace_id, span_id, False, context.trace_flags)


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
    or prompt span that settled it. ``prompt_serial`` is the span ID of the prompt span that
    started the prompt's state afresh (0 when none did: a batch-only prompt, or a state rebuilt
    after a loss), so that prompts sharing an ID one after another are told apart.
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
    prompt_serial: int = 0


BatchListener = Callable[[BatchEvaluation], None]


class _Prompt:
    """The guard state of one prompt ID, with what the host did with its actions."""

    __slots__ = ("guarded", "last_seen", "pending", "reminded_ordinal", "serial", "state")

    def __init__(self, guarded: bool, now: float, rebuilt: bool = False, serial: int = 0) -> None:
        self.guarded = guarded
        # The span ID of the prompt span that started this state afresh (0: none did, as for
        # a batch-only prompt or a state rebuilt after a loss): tells listeners apart prompts
        # that share an ID one after another (turns of one conversation).
        self.serial = serial
        # A rebuilt state lost its history, so it never enforces (docs/contract.md section 4).
        self.state = _REBUILT_STATE if rebuilt else _INITIAL_STATE
        self.pending: GuardAction | None = None
        self.reminded_ordinal = 0
        self.last_seen = now


class _Life:
    """The open prompt spans of one prompt ID: the facts that outlive a dropped state.

    It lives exactly as long as one of its prompt spans is open and tracked, so the table of
    lives is bounded by the table of open spans.
    """

    __slots__ = ("guarded", "open")

    def __init__(self, guarded: bool) -> None:
        self.open = 1  # its prompt spans open now (more than one after a collision)
        self.guarded = guarded


class _Forgotten:
    """Open prompt spans whose facts the table of lost IDs could not keep (its bound was
    reached): per slot of a fixed array, chosen by a hash of the prompt ID, how many such spans
    may still be open, and whether one of their IDs opted out.

    It errs only towards caution (docs/contract.md section 4: losing state never widens what
    the guard may do). An ID that shares a slot with a forgotten one is read as that one: a
    collision, enforcement disabled, off if the slot holds an opt-out. A count that reaches 255
    stays there. The slot forgets when the untracked end of a prompt span with an ID of that
    slot brings its count to zero (so a half-written prompt span ending there, with no prompt ID
    at its start, can take one count too early). The hash is CRC-32, the same in every process,
    so runs repeat exactly.
    """

    __slots__ = ("_mask", "_off", "_open")

    def __init__(self, slots: int) -> None:
        self._mask = slots - 1  # a power of two
        self._open = bytearray(slots)
        self._off = bytearray(slots)

    def _slot(self, prompt_id: str) -> int:
        return zlib.crc32(prompt_id.encode("utf-8", "surrogatepass")) & self._mask

    def add(self, prompt_id: str, spans: int, guarded: bool) -> None:
        slot = self._slot(prompt_id)
        self._open[slot] = min(255, self._open[slot] + spans)
        if not guarded:
            self._off[slot] = 1

    def guarded(self, prompt_id: str) -> bool | None:
        """None when no forgotten span of the ID's slot may be open, else whether it is
        guarded (no ID of the slot opted out)."""
        slot = self._slot(prompt_id)
        if not self._open[slot]:
            return None
        return not self._off[slot]

    def opt_out(self, prompt_id: str) -> None:
        slot = self._slot(prompt_id)
        if self._open[slot]:
            self._off[slot] = 1

    def end(self, prompt_id: str) -> bool:
        """A prompt span with the ID ended that the guard did not track: one fewer of the
        slot's spans may be open. True when the slot held one."""
        slot = self._slot(prompt_id)
        count = self._open[slot]
        if not count:
            return False
        if count < 255:
            self._open[slot] = count - 1
            if count == 1:
                self._off[slot] = 0
        return True


class _PromptSpan:
    __slots__ = ("prompt_id",)

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id


# One settled tool call, as the reducer needs it, and nothing more of its span: (start time,
# arrival, its observation, span ID). The observation is built once, when the call ends; the
# span ID is kept for the ``duplicate_span`` record.
_CallRecord = tuple[int, int, Observation, int]


def _arrival(call: _CallRecord) -> int:
    return call[1]


class _OpenBatch:
    __slots__ = ("bytes", "calls", "missing", "off", "overflow", "prompt_id", "span_id")

    def __init__(self, prompt_id: str, span_id: int, off: bool = False) -> None:
        self.prompt_id = prompt_id
        self.span_id = span_id
        # The batch span opted its prompt out at its start: nothing it does is reported.
        self.off = off
        # The tool calls that ended under this batch: read once, when the batch ends, in call
        # start order.
        self.calls: list[_CallRecord] = []
        self.bytes = 0  # estimated bytes of ``calls``, counted against the shared budget
        self.overflow = False
        # Span IDs of its tool calls that lack a required attribute (reported when it ends,
        # unless its prompt is off).
        self.missing: list[int] | None = None


_Tracked = _PromptSpan | _OpenBatch
_INITIAL_STATE: Final = GuardState.initial()
_REBUILT_STATE: Final = _INITIAL_STATE._replace(enforcement_disabled=True)
# Batch spans that ended recently, by span ID, with their prompt: a tool-call span ending under
# one of them is a late frame. Bounded: a frame later than this is ignored as an orphan.
_ENDED_BATCHES = 4096
_TOGETHER: Final = 8
"""More emissions than this from one span's end are queued together (GuardTelemetry.together):
an inferred prompt's end decides all its batches at once."""
_KEPT: Final = object()  # a span ID's absence from the table of evicted spans
# What to emit once the lock is released.
_Emission = (
    tuple[Literal["diagnostic"], Diagnostic, str | None, SpanContext | None]
    | tuple[Literal["decision"], Decided]
    | tuple[Literal["observations"], tuple[Observation, ...]]
)


# The slow path when a span lacks the SDK's private fields (otel_guard.guard._sdkfields reads them).
_attributes = _sdk.attributes


@mypyc_attr(allow_interpreted_subclasses=True)
class GuardSpanProcessor(SpanProcessor):
    """Watches tool-call spans and runs the repeated-tool-failure guard for each prompt.

    Args:
        mode: ``off``, ``shadow``, ``warn`` or ``enforce``. When omitted, the process environment
            variable ``QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD`` is read once, here; missing,
            empty or invalid values give ``shadow``, and an invalid one (whitespace only, or not
            a string) records an ``invalid_mode`` diagnostic instead of raising.
        meter_provider, logger_provider: where guard telemetry goes; the global providers when
            omitted.
        max_prompts: prompts whose state is kept at once; beyond it the least recently active
            idle prompt is evicted first (an ``evicted`` diagnostic), else the least recently
            active prompt.
        prompt_ttl_seconds: a prompt with no guard activity for this long loses its state
            (an ``expired`` diagnostic).
        max_calls_per_batch: tool calls tracked per batch; a batch with more is incomplete.
        max_call_bytes: estimated bytes of tool-call data kept for all open batches together;
            beyond it the open batch that has held data the longest drops it and becomes
            incomplete (a ``batch_overflow`` diagnostic).
        listener: called with a :class:`BatchEvaluation` after every evaluated batch, outside
            the guard's lock; its exceptions are counted as ``internal_error``.
        clock: monotonic seconds, for the TTL.
        background_telemetry: emit log records and counts from a worker thread (the default),
            off the agent's thread; ``False`` emits them inside ``span.end()``.
        reducer: the decision function; :func:`~otel_guard.reducer.reduce` unless a replay asks
            what other constants would have done
            (:func:`~otel_guard.reducer.reduce_with_thresholds`). Analysis only.

    The processor never raises into ``span.end()``; every exception it catches is counted as an
    ``internal_error`` diagnostic.

    **Losing state never widens what the guard may do.** A prompt's state is dropped by eviction
    or the TTL, never silently. What must survive it are two facts: whether the prompt opted
    out, and that its history is gone. While one of the prompt's spans is open they live on the
    prompt's open-span record (bounded by the open-span table, ``4 * max_prompts +
    max_calls_per_batch`` spans); for a prompt with no open prompt span (batch spans only) they
    go to a table of dropped prompt IDs, bounded at ``4 * max_prompts`` entries, oldest
    forgotten first. A state rebuilt from either always has ``enforcement_disabled`` (at most a
    reminder, never a stop) and stays off if the prompt had opted out. An open prompt span
    pushed out of the span table leaves its ID in a table of lost IDs (same bound), counting the
    ID's lost spans: a later prompt span with the ID collides, an opt-out learned later is
    written there too (:meth:`_opt_out`), a state kept meanwhile never enforces again (the
    span's end may go unseen), and the end of the last of them discards the state as a tracked
    span's end does. What the table of lost IDs cannot keep goes to a coarser table
    (:class:`_Forgotten`) that errs only towards caution. A new prompt span with an ID nobody has
    open starts a fresh prompt and clears those facts.

    **Collisions.** A prompt span that starts while another with the same prompt ID is open is
    a ``prompt_collision``: the ID's state keeps going but with enforcement disabled, a pending
    stop is withdrawn (its host is ambiguous), an opt-out of either span applies to both, and
    the state is discarded only when the last of those spans ends.

    **Bytes.** A tool-call span is reduced, when it ends, to the few fields the reducer needs
    (counted as 400 bytes plus its strings, more than the ~280 it takes), and these records are
    capped across all open batches by ``max_call_bytes`` (default 16 MiB, some 39,000 calls: far
    beyond the open batches of any real host, and small beside the host's own span data). The
    batch that has held data the longest gives it up first, so batch spans a host never ends are
    the ones that lose it.

    **Eviction is O(1) amortised.** Prompts are kept in activity order, and the idle ones also
    in an ordered table of their own, so the next victim is always at the front of one of them;
    expiry pops from the front of the activity order. Nothing scans the prompts.
    """

    START_INTEREST: ClassVar[Interest] = ((attr.PROMPT_ID, ANY_VALUE),)
    """Spans whose ``on_start`` can matter: section 3 prompt and batch spans carry the prompt ID
    from their start. The inferred profiles read nothing at start."""
    END_INTEREST: ClassVar[Interest] = (
        (attr.PROMPT_ID, ANY_VALUE),
        *((key, ANY_VALUE) for key in CLAIM_KEYS),
    )
    """Spans whose ``on_end`` can matter while no trace is watched: section 3 prompt, batch and
    tool-call spans, and any span an inferred profile may claim. The fused dispatch
    (:mod:`otel_guard.guard.dispatch`) calls ``on_end`` for these spans only, and for every span
    while :attr:`genai_lineage` is not empty; keep both in step with the hooks."""

    def __init__(
        self,
        *,
        # object, not str | None: the compiled build checks argument types, and a mode of
        # another type is an invalid mode (shadow, the diagnostic), never an exception.
        mode: object = None,
        meter_provider: MeterProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        max_prompts: int = DEFAULT_MAX_PROMPTS,
        prompt_ttl_seconds: float = DEFAULT_PROMPT_TTL_SECONDS,
        max_calls_per_batch: int = DEFAULT_MAX_CALLS_PER_BATCH,
        max_call_bytes: int = DEFAULT_MAX_CALL_BYTES,
        listener: BatchListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        reducer: Callable[[GuardState, GuardInput], Decision] = reduce,
        background_telemetry: bool = True,
    ) -> None:
        if max_prompts < 1:
            raise ValueError("max_prompts must be at least 1")
        if prompt_ttl_seconds <= 0:
            raise ValueError("prompt_ttl_seconds must be positive")
        if max_calls_per_batch < 1:
            raise ValueError("max_calls_per_batch must be at least 1")
        if max_call_bytes < 1:
            raise ValueError("max_call_bytes must be at least 1")
        resolution = resolve_mode(mode)
        self._mode: Mode = resolution.mode
        self._max_prompts = max_prompts
        self._ttl = float(prompt_ttl_seconds)
        self._max_calls = max_calls_per_batch
        self._max_call_bytes = max_call_bytes
        # Open prompt and batch spans; bounded so never-ending spans cannot grow the table.
        self._max_tracked = 4 * max_prompts + max_calls_per_batch
        self._max_dropped = 4 * max_prompts
        self._listener = listener
        self._clock = clock
        self._reduce = reducer  # the replay's what-if swaps in other constants; never live
        self._lock = threading.Lock()
        _LIVE.add(self)
        # Every prompt with a state, least recently active first (the TTL pops from the front).
        self._prompts: OrderedDict[str, _Prompt] = OrderedDict()
        # The idle ones among them, in the same order: eviction takes the front one.
        self._idle: OrderedDict[str, None] = OrderedDict()
        # Prompt IDs with an open prompt span.
        self._lives: dict[str, _Life] = {}
        # Prompt IDs with no open prompt span whose state was dropped -> whether it was guarded.
        self._dropped: OrderedDict[str, bool] = OrderedDict()
        self._tracked: OrderedDict[int, _Tracked] = OrderedDict()
        # Open batches holding call data, longest holder first, and their bytes together.
        self._holding: OrderedDict[int, _OpenBatch] = OrderedDict()
        # Section 3 tool calls that ended below a span the guard does not track, by that span's
        # ID: it may still become a batch span (its prompt ID set after its start), and is then
        # read with them as a tracked one would be. Bounded like the open spans; their bytes
        # count in the same budget.
        self._unclaimed: OrderedDict[int, _OpenBatch] = OrderedDict()
        self._call_bytes = 0
        self._ended_batches: OrderedDict[int, str] = OrderedDict()
        self._evicted: OrderedDict[int, None] = OrderedDict()
        # Span IDs of untracked spans below which a tool-call span with no acp.tool.* key ended
        # (another profile's call, or a half-written one of a batch span named late), bounded.
        self._bare_parents: OrderedDict[int, None] = OrderedDict()
        # The last ended prompt span of each opted-out prompt ID, (start, end) in ns, bounded: a
        # batch span named after its start, which started inside one, is that prompt's.
        self._ended_off: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._diagnostic_counts: Counter[str] = Counter()
        self._inert = self._mode == "off"
        self._telemetry = GuardTelemetry(
            meter_provider,
            logger_provider,
            background=background_telemetry,
            on_failure=self._telemetry_failed,
        )
        # Prompt IDs whose open prompt span left the span table to its bound -> guarded: a
        # later prompt span with the ID is a collision, never a fresh enforcing prompt.
        # The value: (lost spans still open as far as the guard knows, guarded).
        self._lost_open: OrderedDict[str, tuple[int, bool]] = OrderedDict()
        # What that table could not keep: made at its first overflow (_forget).
        self._forgotten: _Forgotten | None = None
        self._assembly = InferredAssembly(
            max_traces=self._max_tracked,
            max_bytes=max_call_bytes,
            max_calls_per_batch=max_calls_per_batch,
        )
        # The operation name is tested first on every ended span: the claim keys left to test
        # after it are the others.
        self._claim_keys = tuple(key for key in CLAIM_KEYS if key != _OPERATION_NAME)
        self._operation_claims = _OPERATION_NAME in CLAIM_KEYS
        self._turns_away = self._assembly.turns_away
        # Traces the inferred profiles watch: empty (and skipped) while none is.
        self._genai_open = self._assembly.watched
        if resolution.invalid:
            self._flush([("diagnostic", "invalid_mode", None, None)])

    # -- public API -------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The configured mode (read once at construction)."""
        return self._mode

    @property
    def genai_lineage(self) -> Sized:
        """The traces the inferred profiles watch: while it is not empty, every ending span may
        be the guard's (it leaves the link its descendants' prompt is found through); it is the
        same object for the processor's life, so a dispatcher may keep it and test its length
        per span."""
        return self._genai_open

    def take_action(self, prompt_id: str) -> GuardAction | None:
        """Return the prompt's pending action once, and clear it.

        A host calls this after each batch settles, before its next model request. Taking a
        ``reminder`` is what later allows a ``stop`` for that candidate in ``enforce`` mode.
        An action that is not taken before the prompt's next batch settles is dropped.
        """
        try:
            with self._lock:
                prompt = self._prompts.get(bounded_id(prompt_id))
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
        key = bounded_id(prompt_id)
        with self._lock:
            prompt = self._prompts.get(key)
            return None if prompt is None else prompt.state

    def diagnostics(self) -> dict[str, int]:
        """Diagnostics recorded so far by this processor, by name."""
        with self._lock:
            return dict(self._diagnostic_counts)

    def genai_coverage(self) -> Coverage:
        """Prompts, model calls and tool calls the inferred profiles (sections 3b, 3c) have
        evaluated so far, and tool calls that belonged to no prompt."""
        with self._lock:
            return self._assembly.coverage()

    # -- SpanProcessor ----------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: context_api.Context | None = None) -> None:
        # Whether the processor is inert is asked only of spans that may matter: an ignored
        # span's path pays for the look-ups that ignore it and nothing else.
        try:
            # _attributes(span), inlined: on this path a call costs as much as the reads.
            try:
                attributes = _sdk.attribute_dict(span)
            except AttributeError:
                attributes = _attributes(span)
            # Section 3 prompt and batch spans carry the prompt ID from their start; the
            # inferred profiles read ended spans only. A membership test: no call on a miss.
            if _PROMPT_ID not in attributes or self._inert:
                return
            prompt_id = attributes[_PROMPT_ID]
            operation = attributes.get(_OPERATION_NAME)
            if operation == _EXECUTE_TOOL or not isinstance(prompt_id, str):
                return  # tool-call spans are read when they end
            long_id = len(prompt_id) > MAX_PROMPT_ID_LENGTH
            if long_id:
                # Kept as its digest wherever state is kept; the ID itself is never named.
                prompt_id = bounded_id(prompt_id)
            if operation == _INVOKE_AGENT and _BATCH_ADMITTED not in attributes:
                self._start_prompt(span, prompt_id, attributes, long_id)
            else:
                self._start_batch(span, prompt_id, attributes, long_id)
        except Exception:
            self._internal_error()

    def on_end(self, span: ReadableSpan) -> None:
        try:
            try:
                attributes = _sdk.attribute_dict(span)
            except AttributeError:
                attributes = _attributes(span)
            named = _OPERATION_NAME in attributes
            if named and attributes[_OPERATION_NAME] == _EXECUTE_TOOL:
                if not self._inert:
                    self._end_tool(span, attributes)
                return
            if _PROMPT_ID not in attributes:
                # Neither a prompt nor a batch span: the common case ends here. The table of
                # watched traces is empty while the processor is inert.
                if not (named and self._operation_claims):
                    for key in self._claim_keys:
                        if key in attributes:
                            break
                    else:
                        if self._genai_open:
                            self._inferred_link(span)
                        return
                if not self._inert:
                    try:
                        context = _sdk.context(span)
                    except AttributeError:
                        context = span.context
                    if context is not None and not self._turns_away(context[0]):
                        self._inferred_end(span, attributes)
                return
            if self._inert:
                return
            try:
                context = _sdk.context(span)
            except AttributeError:
                context = span.context
            if context is None:
                return
            # Most spans here are tracked: _end_tracked's look-up under the lock is the only one.
            self._end_tracked(span, context, attributes)
            # A section 3 prompt or batch span shields its subtree from inferred prompts.
            if self._genai_open or (
                attributes.get(_OPERATION_NAME) == _INVOKE_AGENT and span.parent is not None
            ):
                self._inferred_end(span, attributes)
        except Exception:
            self._internal_error()

    def shutdown(self) -> None:
        """Stop observing and drop all state. Idempotent: once inert, nothing fills the tables
        again, and closing the telemetry twice is harmless."""
        try:
            with self._lock:
                self._inert = True
                self._prompts.clear()
                self._idle.clear()
                self._lives.clear()
                self._dropped.clear()
                self._tracked.clear()
                self._holding.clear()  # the byte count is not read again once inert
                self._unclaimed.clear()
                self._ended_batches.clear()
                self._evicted.clear()
                self._bare_parents.clear()
                self._ended_off.clear()
                self._lost_open.clear()
                self._forgotten = None
                self._assembly.clear()
            self._telemetry.close()
        except Exception:
            _logger.debug("otel_guard: shutdown failed", exc_info=False)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand every pending guard record and count to the logger and meter providers.

        They go on through the providers' own pipelines: flush those to export them. Records
        handed over after the call are left to the telemetry's worker, so agent threads that
        keep ending spans cannot keep the flush going; False when ``timeout_millis`` passed
        first. The telemetry's flush never raises (it counts a failed emission as
        ``telemetry_error``).
        """
        return self._telemetry.flush(timeout_millis)

    # -- span handling (hot path ends above) ---------------------------------------------------

    def _start_prompt(
        self, span: Span, prompt_id: str, attributes: Mapping[str, Any], long_id: bool = False
    ) -> None:
        """A section 3 prompt span started. ``long_id``: its prompt ID was over the bound (a
        ``long_prompt_id`` diagnostic, naming nothing, unless the prompt is off)."""
        guarded = not _opted_out(attributes)
        out: list[_Emission] = []
        with self._lock:
            now = self._clock()
            life = self._lives.get(prompt_id)
            lost_entry = self._lost_facts(prompt_id) if life is None else None
            if lost_entry is not None:
                lost = lost_entry[1]
                # A prompt span with this ID may still be open, its record lost to the span
                # table's bound: this one collides with it (docs/contract.md section 4).
                life = self._lives[prompt_id] = _Life(lost)
                life.open = 0  # _collide counts this span
                if prompt_id not in self._prompts:
                    self._admit_prompt(prompt_id, _Prompt(lost, now, rebuilt=True), now, out)
                self._collide(prompt_id, life, guarded, span.context, out)
            elif life is None:
                # A new prompt span starts a fresh prompt: nothing of an earlier one carries over.
                self._lives[prompt_id] = _Life(guarded)
                self._dropped.pop(prompt_id, None)
                self._discard(prompt_id)
                fresh = _Prompt(guarded, now, serial=span.context[_SPAN_ID])
                self._admit_prompt(prompt_id, fresh, now, out)
            else:
                self._collide(prompt_id, life, guarded, span.context, out)
            self._track(span.context[_SPAN_ID], _PromptSpan(prompt_id), out)
            if long_id and guarded and not self._known_off(prompt_id):
                out.insert(0, ("diagnostic", "long_prompt_id", None, None))
            parent = span.parent
            if parent is None or parent.is_remote:
                self._assembly.section_3_root(span.context.trace_id, True)
        self._flush(out)

    def _collide(
        self,
        prompt_id: str,
        life: _Life,
        guarded: bool,
        context: SpanContext,
        out: list[_Emission],
    ) -> None:
        """A second prompt span opened with an ID that is already open."""
        life.open += 1
        life.guarded = life.guarded and guarded
        prompt = self._prompts.get(prompt_id)
        if prompt is not None:
            prompt.guarded = prompt.guarded and guarded
            life.guarded = life.guarded and prompt.guarded
            prompt.state = prompt.state._replace(enforcement_disabled=True)
            if prompt.pending is not None and prompt.pending.kind == "stop":
                prompt.pending = None  # which host would take it is unknown
        if not life.guarded:
            self._opt_out(prompt_id)
            return  # an opted-out prompt gets no telemetry at all, diagnostics included
        out.append(("diagnostic", "prompt_collision", prompt_id, context))

    def _opt_out(self, prompt_id: str) -> None:
        """Record an opt-out in every fact kept of the ID: its state, its tracked prompt spans,
        those lost to the span table's bound (which may outlive the others: a lost span's
        entry stays while the tracked spans of a collision end) and a dropped state."""
        prompt = self._prompts.get(prompt_id)
        if prompt is not None:
            prompt.guarded = False
        life = self._lives.get(prompt_id)
        if life is not None:
            life.guarded = False
        lost = self._lost_open.get(prompt_id)
        if lost is not None:
            self._lost_open[prompt_id] = (lost[0], False)
        if prompt_id in self._dropped:
            self._dropped[prompt_id] = False
        if self._forgotten is not None:
            self._forgotten.opt_out(prompt_id)

    def _known_off(self, prompt_id: str) -> bool:
        """Whether a fact kept of the prompt ID says it opted out; under the lock. An opted-out
        prompt gets no telemetry at all, so diagnostics about its spans are not emitted."""
        prompt = self._prompts.get(prompt_id)
        if prompt is not None and not prompt.guarded:
            return True
        life = self._lives.get(prompt_id)
        if life is not None and not life.guarded:
            return True
        lost = self._lost_open.get(prompt_id)
        if lost is not None and not lost[1]:
            return True
        if self._forgotten is not None and self._forgotten.guarded(prompt_id) is False:
            return True
        return self._dropped.get(prompt_id) is False

    def _batch_off(self, batch: _OpenBatch) -> bool:
        """Whether an open batch belongs to an opted-out prompt, as far as is known now."""
        return batch.off or self._known_off(batch.prompt_id)

    def _start_batch(
        self, span: Span, prompt_id: str, attributes: Mapping[str, Any], long_id: bool = False
    ) -> None:
        """A span that may be a batch span started (``long_id`` as for :meth:`_start_prompt`)."""
        tracked = self._tracked
        span_id = span.context[_SPAN_ID]
        off = _opted_out(attributes)
        with self._lock:
            if not off:
                # Inside an open prompt span that opted out, it stays off even if that span
                # ends first (docs/contract.md section 3: no telemetry at all).
                life = self._lives.get(prompt_id)
                off = life is not None and not life.guarded
            tracked[span_id] = _OpenBatch(prompt_id, span_id, off)
            report_long = long_id and not off and not self._known_off(prompt_id)
            if len(tracked) <= self._max_tracked and not report_long:
                return
            out: list[_Emission] = []
            if report_long:
                out.append(("diagnostic", "long_prompt_id", None, None))
            self._evict_tracked(out)
        self._flush(out)

    def _track(self, span_id: int, ref: _Tracked, out: list[_Emission]) -> None:
        self._tracked[span_id] = ref
        self._evict_tracked(out)

    def _evict_tracked(self, out: list[_Emission]) -> None:
        tracked = self._tracked
        evicted = self._evicted
        while len(tracked) > self._max_tracked:
            span_id, oldest = tracked.popitem(last=False)
            # Remembered (bounded), so that its end is not read as a half-written span's.
            evicted[span_id] = None
            if len(evicted) > _ENDED_BATCHES:
                evicted.popitem(last=False)
            if type(oldest) is _OpenBatch:
                self._release(oldest)
                if not self._batch_off(oldest):  # an opted-out prompt gets no telemetry
                    out.append(("diagnostic", "evicted", oldest.prompt_id, None))
            elif type(oldest) is _PromptSpan:
                self._forget_prompt_span(oldest.prompt_id)

    def _forget_prompt_span(self, prompt_id: str) -> None:
        """An open prompt span left the bounded span table: its facts must not leave with it."""
        life = self._lives.get(prompt_id)
        if life is None:
            return
        lost = self._lost_open
        count, guarded = lost.get(prompt_id, (0, True))
        lost[prompt_id] = (count + 1, guarded and life.guarded)
        lost.move_to_end(prompt_id)
        if len(lost) > self._max_dropped:
            self._forget(*lost.popitem(last=False))
        prompt = self._prompts.get(prompt_id)
        if prompt is not None:
            # The span's end may now go unseen (its entry above is bounded too), so the state
            # may outlive its prompt: it never enforces again, as a rebuilt one.
            prompt.state = prompt.state._replace(enforcement_disabled=True)
        life.open -= 1
        if life.open > 0:
            return
        del self._lives[prompt_id]
        if prompt is None:
            self._remember(prompt_id, life.guarded)

    def _lost_facts(self, prompt_id: str) -> tuple[int, bool] | None:
        """What is kept of the ID's prompt spans lost to the span table: (spans lost and still
        open as far as the guard knows, guarded), from the table of lost IDs, else from the
        coarser table its overflow went to (a count of 0: not known exactly); None when
        neither holds the ID."""
        lost = self._lost_open.get(prompt_id)
        if lost is None and self._forgotten is not None:
            kept = self._forgotten.guarded(prompt_id)
            if kept is not None:
                return (0, kept)
        return lost

    def _forget(self, prompt_id: str, entry: tuple[int, bool]) -> None:
        """The table of lost IDs is full: its oldest entry's facts go to a coarser table."""
        forgotten = self._forgotten
        if forgotten is None:
            # Sixteen slots per entry the exact table holds, 65,536 to 4,194,304 (two bytes
            # each): holding as many IDs as that table, a new ID is mistaken for a forgotten
            # one about once in sixteen.
            slots = 1 << min(22, max(16, (16 * self._max_dropped - 1).bit_length()))
            forgotten = self._forgotten = _Forgotten(slots)
        forgotten.add(prompt_id, entry[0], entry[1])

    def _end_prompt_span(self, prompt_id: str, span: ReadableSpan) -> None:
        life = self._lives.get(prompt_id)
        if life is not None:
            life.open -= 1
            if life.open > 0:
                return  # a colliding span is still open: the state stays
            del self._lives[prompt_id]
            if not life.guarded:
                # Remembered (bounded): a batch span named late that started inside it is off.
                ended_off = self._ended_off
                ended_off[prompt_id] = (span.start_time or 0, span.end_time or 0)
                ended_off.move_to_end(prompt_id)
                if len(ended_off) > _ENDED_BATCHES:
                    ended_off.popitem(last=False)
        self._discard(prompt_id)

    def _end_tracked(
        self, span: ReadableSpan, context: SpanContext, attributes: Mapping[str, Any]
    ) -> None:
        out: list[_Emission] = []
        evaluation: BatchEvaluation | None = None
        with self._lock:
            ref = self._tracked.pop(context[_SPAN_ID], None)
            if type(ref) is _OpenBatch:
                evaluation = self._end_batch(span, context, attributes, ref, out)
            elif type(ref) is _PromptSpan:
                self._end_prompt_span(ref.prompt_id, span)
                parent = span.parent
                if parent is None or parent.is_remote:
                    self._assembly.section_3_root(context.trace_id, False)
            elif ref is None:
                unfollowed = self._untracked_end(context, attributes, out, span.start_time or 0)
                if unfollowed is not None:
                    evaluation = self._end_batch(
                        span, context, attributes, unfollowed[0], out, blind=unfollowed[1]
                    )
        if out:
            self._flush(out)
        if evaluation is not None:
            self._notify(evaluation)

    def _untracked_end(
        self, context: SpanContext, attributes: Mapping[str, Any], out: list[_Emission], start: int
    ) -> tuple[_OpenBatch, bool] | None:
        """A span with a prompt ID ended that was not tracked; under the lock. Returns the batch
        to evaluate when the span is a batch span the guard did not follow, and whether some of
        its calls went unseen (it was pushed out of the span table, or a tool-call span with no
        ``acp.tool.*`` key ended below it: neither kept).

        A prompt span whose record was lost to the span table's bound ends that record's
        facts. A prompt span that was not lost, but had no prompt ID at its start (a
        half-written hand-made span), is a ``missing_attribute`` diagnostic, unless it opts out
        (an off prompt has no telemetry).

        A batch span is one when it ends (docs/contract.md section 3): one whose prompt ID was
        set after its start is read with the section 3 calls that ended below it
        (``_unclaimed``), as a tracked one; a replay, which sees the attributes from the
        start, reads the same batch. A batch span whose record was pushed out of the span table
        still settled a batch of its prompt, whose calls the guard does not all know: an
        incomplete batch. Skipping it would let a reset it held (a success of the candidate's
        tool, new input) go unseen, and the guard could then remind or stop sooner than with
        full knowledge (docs/contract.md section 4: losing state never widens what the guard
        may do)."""
        prompt_id = attributes.get(_PROMPT_ID)
        if not isinstance(prompt_id, str):
            return None
        key = bounded_id(prompt_id)
        span_id = context[_SPAN_ID]
        evicted = self._evicted.pop(span_id, _KEPT) is not _KEPT
        if attributes.get(_OPERATION_NAME) != _INVOKE_AGENT:
            if _BATCH_ADMITTED not in attributes:
                return None  # a span that only names its prompt
            batch = self._unclaimed.pop(span_id, None)
            if batch is None:
                batch = _OpenBatch(key, span_id)
            batch.prompt_id = key
            if evicted:
                batch.overflow = True  # the calls kept before it was pushed out are gone
            ended_off = self._ended_off.get(key)
            if ended_off is not None and ended_off[0] <= start <= ended_off[1]:
                # It started inside an opted-out prompt span that has ended since: off, as a
                # batch span named from its start is (and as a replay reads it).
                batch.off = True
            bare = self._bare_parents.pop(span_id, _KEPT) is not _KEPT
            return batch, evicted or bare
        entry = self._lost_open.get(key)
        if entry is not None:
            # An untracked prompt span ended: one whose record was lost.
            if entry[0] > 1:
                self._lost_open[key] = (entry[0] - 1, entry[1])
            else:
                del self._lost_open[key]
                if key not in self._lives:
                    # The ID's last open prompt span ended: as a tracked one's end.
                    self._discard(key)
            return None
        if self._forgotten is not None and self._forgotten.end(key):
            return None  # one whose facts went to the coarser table; its state stays
        if not evicted and not _opted_out(attributes) and not self._known_off(key):
            out.append(("diagnostic", "missing_attribute", key, context))
        return None

    def _end_tool(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> None:
        try:
            parent, start_time, context = _sdk.call_fields(span)
        except AttributeError:
            parent = span.parent
            start_time = span.start_time
            context = span.context
        parent_id = None if parent is None else parent[_SPAN_ID]
        out: list[_Emission] | None = None
        # The batch is looked up under the lock that also ends batches, so a call and its batch
        # span ending at once resolve one way or the other: the call is kept, or it is late.
        with self._lock:
            batch = self._tracked.get(parent_id) if parent_id is not None else None
            if type(batch) is not _OpenBatch:
                batch = None
                genai = True  # an inferred profile's tool call, or an orphan
                if parent_id is None:
                    pass  # a root: no batch, no late frame
                elif parent_id in self._ended_batches:
                    owner = self._ended_batches[parent_id]
                    # An opted-out prompt has no telemetry ("": its batch ended off).
                    if owner and not self._known_off(owner):
                        out = [("diagnostic", "late_span", owner, context)]
                    genai = bool(self._genai_open)
                elif (
                    _TOOL_STATUS in attributes
                    or _TOOL_TYPE in attributes
                    or _TOOL_EXECUTION_STATUS in attributes
                ):
                    # A section 3 call below a span that may become a batch span when it ends.
                    batch = self._unclaimed_batch(parent_id)
                else:
                    # Another profile's call, or a half-written one below a span that may yet
                    # become a batch span: not kept, but its parent is noted (bounded).
                    bare = self._bare_parents
                    bare[parent_id] = None
                    if len(bare) > _ENDED_BATCHES:
                        bare.popitem(last=False)
            else:
                genai = bool(self._genai_open)  # still a link of a watched trace
            if batch is not None:
                calls = batch.calls
                if batch.overflow:
                    pass  # already incomplete and reported
                elif len(calls) < self._max_calls:
                    # Only what the reducer needs is kept, so the span itself can be freed
                    # (docs/contract.md section 4: bounded in bytes).
                    observation, size, missing = read_call(attributes)
                    if not calls:
                        self._holding[batch.span_id] = batch
                    span_id = context[_SPAN_ID] if context is not None else 0
                    calls.append((start_time or 0, len(calls), observation, span_id))
                    batch.bytes += size
                    self._call_bytes += size
                    if missing:
                        # A half-written tool-call span, read as section 3 says all the same.
                        if batch.missing is None:
                            batch.missing = []
                        batch.missing.append(span_id)
                    if self._call_bytes > self._max_call_bytes:
                        out = []
                        self._shed_call_data(out)
                else:
                    batch.overflow = True  # incomplete; the calls kept so far stay for listeners
                    # An opted-out prompt has no telemetry; an unclaimed batch no prompt yet.
                    if batch.prompt_id and not self._batch_off(batch):
                        out = [("diagnostic", "batch_overflow", batch.prompt_id, context)]
        if out:
            self._flush(out)
        if genai:
            self._inferred_end(span, attributes)

    def _unclaimed_batch(self, span_id: int) -> _OpenBatch:
        """The calls kept below an untracked span (under the lock); its prompt is unknown
        (``""``) until it ends as a batch span. The oldest such span goes first past the span
        table's bound: its batch, if it is one, is then incomplete."""
        unclaimed = self._unclaimed
        batch = unclaimed.get(span_id)
        if batch is None:
            batch = unclaimed[span_id] = _OpenBatch("", span_id)
            if len(unclaimed) > self._max_tracked:
                self._release(unclaimed.popitem(last=False)[1])
        return batch

    def _shed_call_data(self, out: list[_Emission]) -> None:
        """Over the byte budget: the batches that have held call data longest give it up."""
        holding = self._holding
        while self._call_bytes > self._max_call_bytes and holding:
            _, victim = holding.popitem(last=False)
            victim.overflow = True  # it can no longer prove completeness
            self._call_bytes -= victim.bytes
            # Its bytes are not read again: an overflowed batch never keeps another call, and
            # _release skips a batch without calls.
            victim.calls = []
            # An opted-out prompt gets no telemetry; one not yet known is counted, not named.
            if not self._batch_off(victim):
                reported = victim.prompt_id or None
                out.append(("diagnostic", "batch_overflow", reported, None))

    def _release(self, batch: _OpenBatch) -> None:
        """Give back the byte budget of a batch that ended or was evicted: nothing reads it
        again. A batch holding calls is always in ``_holding`` (until it is shed of them)."""
        if batch.calls:
            del self._holding[batch.span_id]
            self._call_bytes -= batch.bytes

    def _observations(
        self, batch: _OpenBatch, context: SpanContext, out: list[_Emission]
    ) -> tuple[tuple[Observation, ...], int, bool]:
        """The batch's observations in call start order, its distinct call IDs, and whether
        every call carried a usable ID."""
        calls = batch.calls
        if len(calls) > 1:
            calls.sort()  # start time, then arrival (unique, so later fields are never compared)
        observations: list[Observation] = []
        # Call ID -> the arrival of the span kept for it.
        call_ids: dict[str, int] = {}
        duplicates: list[int] | None = None
        well_formed = True
        for _, arrival, observation, span_id in calls:
            if not observation[6]:  # not a provider duplicate
                call_id = observation[0]
                if not call_id:
                    well_formed = False  # a call without an ID cannot prove completeness
                    continue
                first = call_ids.get(call_id)
                if first is not None:
                    if arrival < first:
                        # The later-started span ended first: it is the one kept (rare).
                        return self._observations_by_arrival(batch, context, out)
                    if duplicates is None:
                        duplicates = []
                    duplicates.append(span_id)
                    continue
                call_ids[call_id] = arrival
            observations.append(observation)
        if duplicates is not None:
            for span_id in duplicates:
                frame = _frame(context, span_id)
                out.append(("diagnostic", "duplicate_span", batch.prompt_id, frame))
        return tuple(observations), len(call_ids), well_formed

    def _observations_by_arrival(
        self, batch: _OpenBatch, context: SpanContext, out: list[_Emission]
    ) -> tuple[tuple[Observation, ...], int, bool]:
        """:meth:`_observations` when two spans share a call ID and the later-started one ended
        first: the span that ended first is the call (docs/contract.md section 3, "a second
        terminal span for a call ID already seen is ignored"), wherever it started. The others
        of each call ID leave the batch as ``duplicate_span``; the rest is read as usual."""
        calls = batch.calls  # sorted by start time, then arrival
        first_of: dict[str, int] = {}
        for _, arrival, observation, _ in sorted(calls, key=_arrival):
            call_id = observation[0]
            if not observation[6] and call_id and call_id not in first_of:
                first_of[call_id] = arrival
        kept: list[_CallRecord] = []
        for call in calls:
            observation = call[2]
            if not observation[6] and observation[0] and first_of[observation[0]] != call[1]:
                frame = _frame(context, call[3])
                out.append(("diagnostic", "duplicate_span", batch.prompt_id, frame))
            else:
                kept.append(call)
        batch.calls = kept  # no call ID twice now: read in one pass
        return self._observations(batch, context, out)

    def _prompt_for_batch(self, prompt_id: str, now: float, out: list[_Emission]) -> _Prompt:
        """The prompt's state, rebuilt if it was dropped (never enforcing), or a new one."""
        prompt = self._prompts.get(prompt_id)
        if prompt is not None:
            prompt.last_seen = now
            self._prompts.move_to_end(prompt_id)
            return prompt
        life = self._lives.get(prompt_id)
        if life is not None:
            # Its prompt span is open, so its state was dropped (eviction or the TTL).
            prompt = _Prompt(life.guarded, now, rebuilt=True)
        else:
            # Never seen, or forgotten: guarded as new. Else dropped: rebuilt. A prompt span
            # whose record was lost may still be open: rebuilt, keeping its opt-out.
            guarded = self._dropped.pop(prompt_id, None)
            lost = self._lost_facts(prompt_id)
            if lost is not None:
                guarded = lost[1] and guarded is not False
            prompt = _Prompt(True, now) if guarded is None else _Prompt(guarded, now, rebuilt=True)
        self._admit_prompt(prompt_id, prompt, now, out)
        return prompt

    def _end_batch(
        self,
        span: ReadableSpan,
        context: SpanContext,
        attributes: Mapping[str, Any],
        batch: _OpenBatch,
        out: list[_Emission],
        blind: bool = False,
    ) -> BatchEvaluation | None:
        """A batch span ended (under the lock). ``blind``: the guard did not follow it and some
        of its calls went unseen (see :meth:`_untracked_end`)."""
        ended = self._ended_batches
        span_id = context[_SPAN_ID]
        ended[span_id] = batch.prompt_id
        if len(ended) > _ENDED_BATCHES:
            ended.popitem(last=False)
        if _BATCH_ADMITTED not in attributes:
            self._release(batch)
            return None  # carried a prompt ID but is not a batch span
        prompt_id = batch.prompt_id
        opted_out = _opted_out(attributes)
        if batch.off and not opted_out:
            # Started while its prompt was off (its prompt span open and opted out): off still,
            # though that span may have ended first and taken the prompt's facts with it.
            ended[span_id] = ""  # its late calls are an off prompt's: no diagnostic
            self._release(batch)
            return None
        now = self._clock()
        if opted_out:
            # A marker on any batch opts the whole prompt out, before anything here names it.
            self._opt_out(prompt_id)
        self._expire(now, out)
        prompt = self._prompt_for_batch(prompt_id, now, out)
        if opted_out:
            prompt.guarded = False
        if not prompt.guarded:
            prompt.pending = None  # stale once a later batch settled, and the prompt is off now
            ended[span_id] = ""  # its late calls are an off prompt's: no diagnostic
            self._release(batch)
            return None

        observations, distinct_calls, well_formed = self._observations(batch, context, out)
        self._release(batch)
        admitted = attributes.get(attr.BATCH_ADMITTED)
        reliable = attributes.get(attr.INPUT_RELIABLE)
        counted = type(admitted) is int and admitted >= 0
        if type(reliable) is not bool or not counted:
            # Half-written: the drain's reliability (missing means unreliable) or the count.
            out.append(("diagnostic", "missing_attribute", prompt_id, context))
        if batch.missing is not None:
            for span_id in batch.missing:
                out.append(("diagnostic", "missing_attribute", prompt_id, _frame(context, span_id)))
        complete = counted and not batch.overflow and well_formed and distinct_calls == admitted
        if blind and not complete:
            # Calls below it went unseen (pushed out of the span table, or carrying no section 3
            # tool attribute while it had no prompt ID: they may have been another profile's);
            # a replay, which reads them all, may find an unknown outcome among them. The guard
            # then never enforces this prompt: losing sight never widens what it may do.
            prompt.state = prompt.state._replace(enforcement_disabled=True)
        # The named tuples' own constructors are Python calls; tuple.__new__ is not.
        guard_input: GuardInput = _new(
            GuardInput,
            (
                self._mode,
                _new(Batch, (complete, observations)),
                attributes.get(attr.INPUT_EXTERNAL) is True,
                attributes.get(attr.INPUT_QUEUED_PROMPT) is True,
                reliable is True,
            ),
        )
        return self._decide(prompt_id, prompt, guard_input, span, context, out)

    def _decide(
        self,
        prompt_id: str,
        prompt: _Prompt,
        guard_input: GuardInput,
        span: ReadableSpan,
        context: SpanContext,
        out: list[_Emission],
        profile: Profile = "acp",
    ) -> BatchEvaluation | None:
        """Run the reducer on one settled batch of a guarded prompt; under the lock.

        What leaves the process is queued as compact tuples (the batch's observations, and a
        :class:`~otel_guard.guard.telemetry.Decided` for a transition): the telemetry builds
        the records from them, on its worker unless it emits in the foreground."""
        before = prompt.state
        decision = self._reduce(before, guard_input)
        kind, after, reason = decision
        prompt.state = after
        prompt.pending = None  # an action not taken before this batch settled is stale
        if after[0] == "idle":
            self._idle[prompt_id] = None
            self._idle.move_to_end(prompt_id)
        else:
            self._idle.pop(prompt_id, None)
        observations = guard_input[1][1]
        if observations:
            out.append(("observations", observations))
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
        if reason == "contract_violation" and kind == "reset":
            out.append(("diagnostic", "contract_violation", prompt_id, context))
        if value is not None:
            try:
                timestamp = _sdk.end_time(span)
            except AttributeError:
                timestamp = span.end_time
            out.append(
                (
                    "decision",
                    _new(
                        Decided,
                        (
                            prompt_id,
                            self._mode,
                            before,
                            after,
                            value,
                            reason,
                            observations,
                            context,
                            timestamp,
                        ),
                    ),
                )
            )
        if self._listener is None:
            return None
        return BatchEvaluation(
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
            prompt_serial=prompt.serial,
        )

    # -- the inferred profiles (sections 3b and 3c) ------------------------------------------

    def _inferred_end(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> None:
        out: list[_Emission] = []
        evaluations: list[BatchEvaluation] = []
        with self._lock:
            if self._inert:
                return
            events = self._assembly.end(span, attributes)
            collided: set[str] = set()
            for event in events:
                self._apply_inferred(event, out, evaluations, collided)
        if out:
            self._flush(out)
        for evaluation in evaluations:
            self._notify(evaluation)

    def _inferred_link(self, span: ReadableSpan) -> None:
        """A plain span ended while traces are watched: it may be a link of one of them."""
        try:
            context = _sdk.context(span)
            parent = _sdk.parent(span)
        except AttributeError:
            context = span.context
            parent = span.parent
        if context is None:
            return
        with self._lock:
            if self._inert:
                return
            events = self._assembly.link(context[0], context[_SPAN_ID], parent)
            if not events:
                return
            out: list[_Emission] = []
            evaluations: list[BatchEvaluation] = []
            collided: set[str] = set()
            for event in events:
                self._apply_inferred(event, out, evaluations, collided)
        if out:
            self._flush(out)
        for evaluation in evaluations:
            self._notify(evaluation)

    def _apply_inferred(
        self,
        event: ProfileEvent,
        out: list[_Emission],
        evaluations: list[BatchEvaluation],
        collided: set[str],
    ) -> None:
        """Apply one assembly event, under the lock. An inferred prompt's state starts as a
        rebuilt one does (enforcement disabled): such a prompt is never enforced.

        Its prompt ID may be one a section 3 prompt span has open (or had open, its record lost
        to a bound), or whose section 3 state is kept: prompt spans of different profiles with
        one ID are a collision. The ID's state then has enforcement disabled and loses a
        pending stop, the inferred batches are decided on it, and it is not discarded when the
        inferred prompt ends."""
        if type(event) is ProfileDiagnostic:
            out.append(("diagnostic", event.name, event.prompt_id, event.span_context))
        elif type(event) is PromptEnded:
            if event.prompt_id not in collided:
                self._discard(event.prompt_id)
        elif type(event) is PromptStarted:
            now = self._clock()
            prompt_id = event.prompt_id
            life = self._lives.get(prompt_id)
            known = self._prompts.get(prompt_id)
            lost = self._lost_facts(prompt_id)
            dropped = self._dropped.get(prompt_id)
            if life is not None or lost is not None or known is not None or dropped is not None:
                collided.add(prompt_id)
                if known is None:
                    # Every fact kept of the ID's section 3 spans: an opt-out stays.
                    guarded = (
                        (life is None or life.guarded)
                        and (lost is None or lost[1])
                        and dropped is not False
                    )
                    known = _Prompt(guarded, now, rebuilt=True)
                    self._admit_prompt(prompt_id, known, now, out)
                known.state = known.state._replace(enforcement_disabled=True)
                if known.pending is not None and known.pending.kind == "stop":
                    known.pending = None
                if known.guarded:  # an opted-out prompt gets no telemetry
                    out.append(("diagnostic", "prompt_collision", prompt_id, None))
                return
            fresh = _Prompt(True, now, rebuilt=True, serial=event.span_id)
            self._admit_prompt(prompt_id, fresh, now, out)
        elif type(event) is BatchSettled:
            now = self._clock()
            prompt = self._prompts.get(event.prompt_id)
            if prompt is None:  # its state was dropped: rebuilt, still never enforced
                prompt = _Prompt(True, now, rebuilt=True)
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
            evaluation = self._decide(
                event.prompt_id, prompt, guard_input, event.span, context, out, event.profile
            )
            if evaluation is not None:
                evaluations.append(evaluation)

    def _discard(self, prompt_id: str) -> None:
        """Forget a prompt's state without a trace: its prompt span ended, or a new one starts."""
        if self._prompts.pop(prompt_id, None) is not None:
            self._idle.pop(prompt_id, None)

    def _admit_prompt(
        self, prompt_id: str, prompt: _Prompt, now: float, out: list[_Emission]
    ) -> None:
        prompts = self._prompts
        self._expire(now, out)
        if len(prompts) >= self._max_prompts:
            # O(1): the oldest idle prompt is the front of its own table, else the oldest.
            idle = self._idle
            victim = next(iter(idle)) if idle else next(iter(prompts))
            self._drop(victim, "evicted", out)
        prompts[prompt_id] = prompt
        if prompt.state.phase == "idle":
            self._idle[prompt_id] = None

    def _expire(self, now: float, out: list[_Emission]) -> None:
        """Drop the prompts inactive for the TTL, from the least recently active end."""
        prompts = self._prompts
        ttl = self._ttl
        while prompts:
            oldest_id = next(iter(prompts))
            if now - prompts[oldest_id].last_seen < ttl:
                return
            self._drop(oldest_id, "expired", out)

    def _drop(self, prompt_id: str, diagnostic: Diagnostic, out: list[_Emission]) -> None:
        """Discard a prompt's state, keeping the facts a rebuilt state must honour."""
        prompt = self._prompts.pop(prompt_id)
        self._idle.pop(prompt_id, None)
        life = self._lives.get(prompt_id)
        guarded = prompt.guarded
        if life is not None:
            life.guarded = life.guarded and guarded
        else:
            self._remember(prompt_id, guarded)
        if guarded:  # an opted-out prompt gets no telemetry at all, diagnostics included
            out.append(("diagnostic", diagnostic, prompt_id, None))

    def _remember(self, prompt_id: str, guarded: bool) -> None:
        dropped = self._dropped
        dropped[prompt_id] = guarded
        dropped.move_to_end(prompt_id)
        if len(dropped) > self._max_dropped:
            dropped.popitem(last=False)

    # -- emission (outside the lock) ----------------------------------------------------------

    def _flush(self, out: list[_Emission]) -> None:
        # No instrumentation suppression is needed here: the SDK's log processors suppress it
        # around their own exports, and nothing else here can create spans.
        telemetry = self._telemetry
        if len(out) > _TOGETHER:
            items: list[QueueItem] = []
            for item in out:
                if item[0] == "diagnostic":
                    _, name, prompt_id, span_context = item
                    self._count(name)
                    items.append(telemetry.diagnostic_item(name, prompt_id, span_context))
                elif item[0] == "observations":
                    items.append(("observations", item[1]))
                else:
                    items.append(("decided", item[1]))
            telemetry.together(items)
            return
        for item in out:
            if item[0] == "diagnostic":
                _, name, prompt_id, span_context = item
                self._count(name)
                telemetry.diagnostic(name, prompt_id, span_context)
            elif item[0] == "observations":
                telemetry.observations(item[1])
            else:
                telemetry.decided(item[1])

    def _count(self, name: Diagnostic) -> None:
        with self._lock:
            self._diagnostic_counts[name] += 1

    def _telemetry_failed(self) -> None:
        self._count("telemetry_error")

    def _notify(self, evaluation: BatchEvaluation) -> None:
        if self._listener is None:
            return
        try:
            self._listener(evaluation)
        except Exception:
            self._internal_error()

    def _after_fork_in_child(self) -> None:
        # Only the forking thread lives on in the child: a lock another thread held at the
        # fork would stay held forever. The tables may be mid-update from such a thread; the
        # child keeps them (its agent's prompts), and a broken entry is an internal_error.
        self._lock = threading.Lock()

    def _internal_error(self) -> None:
        try:
            # No traceback: frames can hold span data, and this logger may be bridged to OTLP.
            _logger.debug("otel_guard: internal error in the guard processor")
            self._flush([("diagnostic", "internal_error", None, None)])
        except Exception:  # the last line of defence: nothing escapes into span.end()
            pass


_LIVE: weakref.WeakSet[GuardSpanProcessor] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for processor in list(_LIVE):
        processor._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_after_fork)
