"""The GenAI-conventions profile: prompts, model calls and tool calls of agents without ``acp.*``.

Most agents are traced by their framework's own instrumentation following the OpenTelemetry
GenAI semantic conventions, with no batch span. This module reads those spans conservatively
(``docs/contract.md`` section 3b) and tells the processor, as :data:`ProfileEvent` values, when a
prompt starts, when an inferred batch settles and when a prompt ends. It decides nothing: the
processor runs the reducer on what it reports, exactly as for a batch span.

* **Prompt**: an ``invoke_agent`` span without ``acp.prompt.id``. Its prompt ID in guard records
  is ``gen_ai.conversation.id`` when present, else its own span ID as 16 hex digits.
* **Model call**: a ``chat``, ``text_completion`` or ``generate_content`` span whose nearest
  ``invoke_agent`` ancestor is the prompt. Its start settles the prompt's current batch and opens
  the next one.
* **Tool call**: an ``execute_tool`` span, or a span carrying both ``gen_ai.tool.name`` and
  ``gen_ai.tool.call.id``, whose nearest ``invoke_agent`` ancestor is the prompt and which carries
  no ``acp.*`` attribute (those follow section 3). It belongs to the batch open when it started.
* **Handed over**: a GenAI prompt whose ``invoke_agent`` span gets an ``acp.*`` prompt span as
  a direct child is read through that prompt's section 3 spans instead, from then on.
* **Inferred batch**: the tool calls started between two model-call starts (or before the first
  one). It settles when the next model call starts or the prompt span ends, and is complete only
  if every tool span of it had ended by then. A window without tool calls is not a batch.
* **Outcome**: span status ``ERROR`` or an ``error.type`` is an execution error; its type is
  ``error.type`` lower-cased, else the ``exception.type`` of the span's last ``exception`` event
  lower-cased (the conventions define ``error.type`` as that class name when an exception ended
  the operation, and several instrumentations record only the event); neither gives no type,
  which the reducer treats as ``unknown``. Anything else is a success. The tool type is ``mcp``
  when the span carries any ``mcp.`` attribute, else ``native``.

Finding the nearest ``invoke_agent`` ancestor with bounded memory
-----------------------------------------------------------------

A span knows only its parent's span ID, so the profile keeps one table, :attr:`lineage`, from the
span ID of every *open* span below an open GenAI prompt to what that span's descendants need: the
prompt itself (for the prompt span and every plain descendant), the tool call and its batch (for
a tool span), or a shield (for an ``acp.*`` prompt span, whose subtree follows section 3). When a
span starts, one look-up of its parent's ID in the table tells whether it is below a GenAI prompt
and which one; a nested ``invoke_agent`` span starts a new entry, so the nearest ancestor wins.
When a span ends its entry is removed, so the table holds only spans that are open now, never a
trace's history. It is bounded (``max_open_spans``, oldest entry evicted first, O(1)); an evicted
tool span leaves its batch incomplete, an evicted prompt span leaves its prompt to the
processor's TTL and eviction, each with an ``evicted`` diagnostic. Spans outside any GenAI prompt
never enter the table, and while it is empty the processor does not consult it at all.

Not thread-safe: the processor calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, StatusCode

from otel_guard.reducer import Batch, Observation
from otel_guard.spans import attributes as attr

__all__ = [
    "BatchSettled",
    "Coverage",
    "GenAIProfile",
    "ProfileDiagnostic",
    "ProfileEvent",
    "PromptEnded",
    "PromptStarted",
]

# Bound once: follow() and drop() run for every span below an open GenAI prompt.
_OPERATION_NAME: Final = attr.OPERATION_NAME
_TOOL_CALL_ID: Final = attr.TOOL_CALL_ID
_EXECUTE_TOOL: Final = attr.EXECUTE_TOOL
# Longer values are treated as missing, as for section 3 spans.
_MAX_ID_LENGTH: Final = 256
_MAX_TOOL_NAME_LENGTH: Final = 256


@dataclass(frozen=True, slots=True)
class PromptStarted:
    """A GenAI prompt span started: the prompt starts with enforcement disabled."""

    prompt_id: str


@dataclass(frozen=True, slots=True)
class BatchSettled:
    """An inferred batch settled; ``span`` is the model-call or prompt span that settled it."""

    prompt_id: str
    batch: Batch
    span: ReadableSpan


@dataclass(frozen=True, slots=True)
class PromptEnded:
    """The last open prompt span with this prompt ID ended."""

    prompt_id: str


@dataclass(frozen=True, slots=True)
class ProfileDiagnostic:
    name: Literal["late_span", "duplicate_span", "batch_overflow", "evicted"]
    prompt_id: str
    span_context: SpanContext | None


ProfileEvent = PromptStarted | BatchSettled | PromptEnded | ProfileDiagnostic


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the profile has seen, for saying why a trace gave the guard nothing to read."""

    prompts: int
    model_calls: int
    tool_calls: int
    orphan_tool_calls: int


class _Prompt:
    __slots__ = ("batch", "ended", "prompt_id", "span_id")

    def __init__(self, prompt_id: str, span_id: int, started_at: int) -> None:
        self.prompt_id = prompt_id
        self.span_id = span_id
        self.batch = _Batch(started_at)
        self.ended = False


class _Batch:
    __slots__ = ("calls", "open_tools", "overflow", "settled", "started_at")

    def __init__(self, started_at: int) -> None:
        self.started_at = started_at
        # (start time, arrival, span) of each ended tool span, read when the batch settles.
        self.calls: list[tuple[int, int, ReadableSpan]] = []
        self.open_tools = 0
        self.overflow = False
        self.settled = False


class _Tool:
    __slots__ = ("batch", "prompt")

    def __init__(self, prompt: _Prompt, batch: _Batch) -> None:
        self.prompt = prompt
        self.batch = batch


class _Shield:
    """Marks an ``acp.*`` prompt's subtree: section 3 spans, never this profile's."""


_SHIELD: Final = _Shield()
_Node = _Prompt | _Tool | _Shield


def _is_tool(attributes: Mapping[str, Any], operation: object) -> bool:
    return operation == attr.EXECUTE_TOOL or (
        attr.TOOL_NAME in attributes and attr.TOOL_CALL_ID in attributes
    )


def _has_prefix(attributes: Mapping[str, Any], prefix: str) -> bool:
    return any(type(key) is str and key.startswith(prefix) for key in attributes)


class GenAIProfile:
    """Prompt, model-call and tool-call spans of the GenAI conventions, as profile events.

    ``max_open_spans`` bounds :attr:`lineage`; ``max_calls_per_batch`` bounds the ended tool spans
    kept per inferred batch (a batch with more is incomplete, with a ``batch_overflow``
    diagnostic).
    """

    def __init__(self, *, max_open_spans: int, max_calls_per_batch: int) -> None:
        self.lineage: OrderedDict[int, _Node] = OrderedDict()
        self._max_open = max_open_spans
        self._max_calls = max_calls_per_batch
        self._open_prompt_ids: dict[str, int] = {}
        self._prompts = 0
        self._model_calls = 0
        self._tool_calls = 0
        self._orphans = 0

    def coverage(self) -> Coverage:
        return Coverage(self._prompts, self._model_calls, self._tool_calls, self._orphans)

    def clear(self) -> None:
        self.lineage.clear()
        self._open_prompt_ids.clear()

    # -- lock-free paths for plain descendants ----------------------------------------------

    def follow(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> bool:
        """Handle a starting span that cannot produce an event; False if :meth:`start` must.

        Most spans below a prompt are neither model calls nor tool calls (HTTP, database,
        framework steps): they only pass their prompt on to their children. That is one
        look-up and one insertion, done without the processor's lock (each is atomic).
        """
        if _OPERATION_NAME in attributes or _TOOL_CALL_ID in attributes:
            return False
        try:
            parent = span._parent
            span_id = span._context[1]  # type: ignore[index]
        except (AttributeError, TypeError):
            return False
        lineage = self.lineage
        node = None if parent is None else lineage.get(parent[1])
        if node is None:
            return True  # not below a GenAI prompt
        lineage[span_id] = node.prompt if type(node) is _Tool else node
        return len(lineage) <= self._max_open  # over the bound: start() evicts, with events

    def drop(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> bool:
        """Handle an ending span that cannot produce an event; False if :meth:`end` must."""
        try:
            span_id = span._context[1]  # type: ignore[index]
        except (AttributeError, TypeError):
            return False
        lineage = self.lineage
        node = lineage.get(span_id)
        if node is None:
            return attributes.get(_OPERATION_NAME) != _EXECUTE_TOOL
        if type(node) is _Shield or (
            type(node) is _Prompt
            and node.span_id != span_id
            and _TOOL_CALL_ID not in attributes
            and attributes.get(_OPERATION_NAME) != _EXECUTE_TOOL
        ):
            lineage.pop(span_id, None)
            return True
        return False

    # -- span starts ------------------------------------------------------------------------

    def start(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> list[ProfileEvent]:
        """A span without ``acp.prompt.id`` started."""
        events: list[ProfileEvent] = []
        context = span.context
        if context is None:
            return events
        span_id = context.span_id
        operation = attributes.get(attr.OPERATION_NAME)
        if operation == attr.INVOKE_AGENT:
            self._start_prompt(span, span_id, attributes, events)
            return events
        parent = span.parent
        node = None if parent is None else self.lineage.get(parent.span_id)
        if node is None:
            return events
        if type(node) is _Shield:
            self._remember(span_id, _SHIELD, events)
            return events
        prompt = node.prompt if type(node) is _Tool else node
        assert type(prompt) is _Prompt
        if operation in attr.MODEL_OPERATIONS:
            self._model_calls += 1
            self._settle(prompt, span, events)
            prompt.batch = _Batch(span.start_time or 0)
            self._remember(span_id, prompt, events)
        elif _is_tool(attributes, operation) and not _has_prefix(attributes, attr.ACP_PREFIX):
            batch = prompt.batch
            batch.open_tools += 1
            self._remember(span_id, _Tool(prompt, batch), events)
        else:
            self._remember(span_id, prompt, events)
        return events

    def forget(self, span: ReadableSpan) -> None:
        """A span below a GenAI prompt ended as a section 3 tool call: not this profile's."""
        context = span.context
        node = None if context is None else self.lineage.pop(context.span_id, None)
        if type(node) is _Tool:
            node.batch.open_tools -= 1

    def shield(self, span: ReadableSpan) -> list[ProfileEvent]:
        """An ``acp.*`` prompt span started: if it is below a GenAI prompt, its subtree is not.

        When its parent is the ``invoke_agent`` span of a GenAI prompt itself, the host describes
        that very prompt with section 3 spans (an integration inside a framework's instrumented
        run): the GenAI reading of the prompt steps aside, so no call is evaluated twice.
        """
        events: list[ProfileEvent] = []
        parent = span.parent
        context = span.context
        if parent is None or context is None:
            return events
        node = self.lineage.get(parent.span_id)
        if node is None:
            return events
        if type(node) is _Prompt and node.span_id == parent.span_id and not node.ended:
            node.ended = True
            self.lineage[parent.span_id] = _SHIELD
            self._close_prompt_id(node, events)
        self.lineage[context.span_id] = _SHIELD  # bounded by the next _remember
        return events

    def _start_prompt(
        self,
        span: ReadableSpan,
        span_id: int,
        attributes: Mapping[str, Any],
        events: list[ProfileEvent],
    ) -> None:
        conversation = attributes.get(attr.CONVERSATION_ID)
        if type(conversation) is str and conversation and len(conversation) <= _MAX_ID_LENGTH:
            prompt_id = conversation
        else:
            prompt_id = f"{span_id:016x}"
        self._prompts += 1
        prompt = _Prompt(prompt_id, span_id, span.start_time or 0)
        open_ids = self._open_prompt_ids
        open_ids[prompt_id] = open_ids.get(prompt_id, 0) + 1
        if open_ids[prompt_id] == 1:
            events.append(PromptStarted(prompt_id))
        self._remember(span_id, prompt, events)

    def _remember(self, span_id: int, node: _Node, events: list[ProfileEvent]) -> None:
        lineage = self.lineage
        lineage[span_id] = node
        while len(lineage) > self._max_open:
            evicted_id, evicted = lineage.popitem(last=False)
            if type(evicted) is _Tool:
                # Its batch can no longer see it end: open_tools stays up, the batch incomplete.
                events.append(ProfileDiagnostic("evicted", evicted.prompt.prompt_id, None))
            elif type(evicted) is _Prompt and evicted.span_id == evicted_id:
                self._close_prompt_id(evicted, events)
                events.append(ProfileDiagnostic("evicted", evicted.prompt_id, None))

    # -- span ends --------------------------------------------------------------------------

    def end(self, span: ReadableSpan, attributes: Mapping[str, Any]) -> list[ProfileEvent]:
        """A span ended that is not a section 3 prompt, batch or tool-call span."""
        events: list[ProfileEvent] = []
        context = span.context
        if context is None:
            return events
        span_id = context.span_id
        node = self.lineage.pop(span_id, None)
        if node is None or type(node) is _Shield:
            if node is None and attributes.get(attr.OPERATION_NAME) == attr.EXECUTE_TOOL:
                self._orphans += 1  # under no invoke_agent span and no batch span
            return events
        if type(node) is _Tool:
            node.batch.open_tools -= 1
            if not _has_prefix(attributes, attr.ACP_PREFIX):
                self._add_call(node.prompt, node.batch, span, events)
            return events
        assert type(node) is _Prompt
        if node.span_id == span_id:
            self._settle(node, span, events)
            node.ended = True
            self._close_prompt_id(node, events)
        elif _is_tool(attributes, attributes.get(attr.OPERATION_NAME)) and not _has_prefix(
            attributes, attr.ACP_PREFIX
        ):
            # Named a tool call only by attributes set after it started: it belongs to the
            # batch that was open when it started, if that batch is still open.
            batch = node.batch
            if (span.start_time or 0) >= batch.started_at:
                self._add_call(node, batch, span, events)
            else:
                events.append(ProfileDiagnostic("late_span", node.prompt_id, context))
        return events

    def _add_call(
        self, prompt: _Prompt, batch: _Batch, span: ReadableSpan, events: list[ProfileEvent]
    ) -> None:
        if batch.settled or prompt.ended:
            events.append(ProfileDiagnostic("late_span", prompt.prompt_id, span.context))
            return
        calls = batch.calls
        if len(calls) < self._max_calls:
            self._tool_calls += 1
            calls.append((span.start_time or 0, len(calls), span))
        elif not batch.overflow:
            batch.overflow = True
            events.append(ProfileDiagnostic("batch_overflow", prompt.prompt_id, span.context))

    def _close_prompt_id(self, prompt: _Prompt, events: list[ProfileEvent]) -> None:
        open_ids = self._open_prompt_ids
        left = open_ids.get(prompt.prompt_id, 0) - 1
        if left > 0:
            open_ids[prompt.prompt_id] = left
            return
        open_ids.pop(prompt.prompt_id, None)
        events.append(PromptEnded(prompt.prompt_id))

    # -- settling ---------------------------------------------------------------------------

    def _settle(self, prompt: _Prompt, span: ReadableSpan, events: list[ProfileEvent]) -> None:
        batch = prompt.batch
        if batch.settled or prompt.ended:
            return
        batch.settled = True
        if not batch.calls and not batch.open_tools and not batch.overflow:
            return  # no tool call since the last model call: not a batch
        observations = self._observations(prompt, batch, events)
        complete = batch.open_tools == 0 and not batch.overflow
        events.append(BatchSettled(prompt.prompt_id, Batch(complete, observations), span))

    def _observations(
        self, prompt: _Prompt, batch: _Batch, events: list[ProfileEvent]
    ) -> tuple[Observation, ...]:
        calls = batch.calls
        if len(calls) > 1:
            calls.sort(key=lambda call: (call[0], call[1]))
        seen: set[str] = set()
        observations: list[Observation] = []
        for _, _, span in calls:
            attributes = span.attributes or {}
            context = span.context
            call_id = attributes.get(attr.TOOL_CALL_ID)
            if type(call_id) is not str or not call_id or len(call_id) > _MAX_ID_LENGTH:
                call_id = f"{context.span_id:016x}" if context is not None else ""
            if call_id in seen:
                events.append(ProfileDiagnostic("duplicate_span", prompt.prompt_id, context))
                continue
            seen.add(call_id)
            tool_name = attributes.get(attr.TOOL_NAME)
            failed, error_type = _outcome(span, attributes)
            status = "error" if failed else "success"
            observations.append(
                Observation(
                    call_id=call_id,
                    policy_tool_name=tool_name
                    if type(tool_name) is str and len(tool_name) <= _MAX_TOOL_NAME_LENGTH
                    else None,
                    tool_type="mcp" if _has_prefix(attributes, attr.MCP_PREFIX) else "native",
                    terminal_status=status,
                    execution_status=status,
                    execution_error_type=error_type,
                )
            )
        return tuple(observations)


def _outcome(span: ReadableSpan, attributes: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether the tool span is an execution error, and its error type (lower-cased)."""
    error_type = attributes.get(attr.ERROR_TYPE)
    status = span.status
    failed = error_type is not None or (
        status is not None and status.status_code is StatusCode.ERROR
    )
    if not failed:
        return False, None
    if type(error_type) is str and error_type:
        return True, error_type.lower()
    for event in reversed(span.events or ()):
        if event.name == attr.EXCEPTION_EVENT:
            raised = (event.attributes or {}).get(attr.EXCEPTION_TYPE)
            if type(raised) is str and raised:
                return True, raised.lower()
            break
    return True, None
