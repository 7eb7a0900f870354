"""Helpers with which a Python agent emits the spans the guard reads (docs/contract.md section 3).

A host describes each model turn's tool calls with three nested scopes::

    tracer = tracer_provider.get_tracer("my-agent")
    with prompt_span(tracer, prompt_id) as prompt:            # one user prompt
        with prompt.batch() as batch:                         # one model response's tool calls
            with batch.call(call_id, "run_shell") as call:    # one admitted call
                run_the_tool()                                # raising settles an execution error
            batch.record_input_drain()                        # nothing new arrived meanwhile
        action = guard.take_action(prompt_id)                 # after the batch span ended

The helpers write every attribute name from :mod:`otel_guard.spans.attributes` and enforce the
contract's ordering rules, so a batch the guard evaluates is exactly what the host did:

* the batch span carries ``acp.prompt.id`` (and the route markers) from its start, and its
  admitted count and input-drain result before it ends;
* tool-call spans are direct children of their batch span; the batch span itself is never made
  the current span, so other instrumentation's spans cannot become its children by accident;
* a call's execution status and execution error type are frozen when execution settles
  (:meth:`ToolCall.settle`); finalisation (:meth:`ToolCall.finish`) may change the terminal
  status but never the frozen error type;
* a cancellation wins arbitration: a call cancelled before it finishes ends as terminal
  ``cancelled`` whatever its execution did;
* provider duplicates are flagged and never admitted.

Misuse raises a specific :class:`ProducerError` subclass instead of producing a misleading
batch. When a batch is ended with calls still open, the batch span still ends first (as an
incomplete batch, which the guard resets on) and the open calls end after it as late frames, so
no span is leaked; then the error is raised.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, get_args

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from otel_guard.spans import attributes as attr

__all__ = [
    "ERROR_TYPE_PATTERN",
    "AdmissionClosedError",
    "BatchEndedError",
    "CallAlreadySettledError",
    "CallNotSettledError",
    "CallsStillOpenError",
    "DuplicateCallError",
    "ExecutionStatus",
    "InputDrainMissingError",
    "InvalidErrorTypeError",
    "InvalidStatusError",
    "InvalidValueError",
    "ProducerError",
    "PromptScope",
    "TerminalStatus",
    "ToolBatch",
    "ToolCall",
    "ToolType",
    "error_type_of",
    "is_structured_error_type",
    "prompt_span",
    "start_batch",
    "start_prompt",
]

TerminalStatus = Literal["success", "error", "cancelled"]
ExecutionStatus = Literal["not_started", "success", "error", "cancelled", "unknown"]
ToolType = Literal["native", "mcp"]

_TERMINAL_STATUSES: Final = frozenset(get_args(TerminalStatus))
_EXECUTION_STATUSES: Final = frozenset(get_args(ExecutionStatus))
_TOOL_TYPES: Final = frozenset(get_args(ToolType))

ERROR_TYPE_PATTERN: Final = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
"""A structured execution error type, as the reducer accepts it (matched in full)."""

# The terminal status a call gets when finalisation does not say otherwise.
_DEFAULT_TERMINAL: Final[dict[str, TerminalStatus]] = {
    "success": "success",
    "error": "error",
    "cancelled": "cancelled",
    "not_started": "error",
    "unknown": "error",
}

_CAMEL_BOUNDARY: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_ALLOWED: Final = re.compile(r"[^a-z0-9_.-]+")
_LEADING_NON_LETTERS: Final = re.compile(r"^[^a-z]+")


# -- errors -------------------------------------------------------------------------------------


class ProducerError(RuntimeError):
    """The producer helpers were used in a way that would give the guard a wrong picture."""


class InvalidValueError(ProducerError, ValueError):
    """An argument is outside the contract's value set (route, tool type, identifiers)."""


class InvalidStatusError(InvalidValueError):
    """A terminal or execution status outside the contract, or a contradictory combination."""


class InvalidErrorTypeError(InvalidValueError):
    """An execution error type that is not a structured identifier, or one where none belongs."""


class CallsStillOpenError(ProducerError):
    """A batch was ended (or its input drained) while admitted calls had not finished."""

    def __init__(self, message: str, call_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.call_ids = call_ids


class CallAlreadySettledError(ProducerError):
    """A call's execution was settled twice, or the call was finished twice."""


class CallNotSettledError(ProducerError):
    """A call was finished before its execution settled (and it was not cancelled)."""


class BatchEndedError(ProducerError):
    """A call was started, settled or finished after its batch span had ended."""


class AdmissionClosedError(ProducerError):
    """A call was admitted after the batch's input drain was recorded."""


class DuplicateCallError(ProducerError):
    """A call ID was admitted twice in one batch without being flagged a provider duplicate."""


class InputDrainMissingError(ProducerError):
    """A batch ended without its input drain recorded (the guard reads that as unreliable)."""


# -- error types --------------------------------------------------------------------------------


def is_structured_error_type(value: object) -> bool:
    """Whether ``value`` is a structured execution error type (``^[a-z][a-z0-9_.-]{0,63}$``)."""
    return isinstance(value, str) and ERROR_TYPE_PATTERN.fullmatch(value) is not None


def error_type_of(error: BaseException | type[BaseException]) -> str:
    """The snake-case execution error type of an exception or exception class.

    ``FileNotFoundError`` gives ``file_not_found_error``, ``OSError`` gives ``os_error`` and
    ``HTTP2Error`` gives ``http2_error``. The result always matches :data:`ERROR_TYPE_PATTERN`:
    characters outside it become ``_``, leading non-letters are dropped (a name with no letter
    left gives ``error``) and it is cut to 64 characters. Only the class name is used, never the
    message, so no raw error text reaches the guard.
    """
    cls = error if isinstance(error, type) else type(error)
    name = _CAMEL_BOUNDARY.sub("_", cls.__name__).lower()
    name = _LEADING_NON_LETTERS.sub("", _NOT_ALLOWED.sub("_", name))
    return name[:64] or "error"


def _is_cancellation(error: BaseException | None) -> bool:
    return isinstance(error, asyncio.CancelledError)


# -- validation ---------------------------------------------------------------------------------


def _identifier(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{what} must be a non-empty string, got {type(value).__name__}")
    return value


def _route_attributes(route: str | None, channel: bool) -> dict[str, str | bool]:
    if route is not None and route not in attr.PROMPT_ROUTES:
        raise InvalidValueError(f"route must be one of {sorted(attr.PROMPT_ROUTES)}, got {route!r}")
    if not isinstance(channel, bool):
        raise InvalidValueError(f"channel must be a bool, got {type(channel).__name__}")
    found: dict[str, str | bool] = {}
    if route is not None:
        found[attr.PROMPT_ROUTE] = route
    if channel:
        found[attr.PROMPT_CHANNEL] = True
    return found


# -- prompt -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptScope:
    """An open prompt span; :meth:`batch` starts its tool batches."""

    tracer: Tracer
    prompt_id: str
    span: Span
    route: str | None = None
    channel: bool = False

    def batch(self) -> ToolBatch:
        """Start a batch span for this prompt, as a child of the prompt span."""
        return start_batch(
            self.tracer,
            self.prompt_id,
            parent=trace.set_span_in_context(self.span),
            route=self.route,
            channel=self.channel,
        )


@contextmanager
def prompt_span(
    tracer: Tracer,
    prompt_id: str,
    *,
    route: str | None = None,
    channel: bool = False,
    name: str = attr.INVOKE_AGENT,
) -> Iterator[PromptScope]:
    """A prompt span (``invoke_agent`` with ``acp.prompt.id``) that is current inside the block.

    ``route`` is one of the contract's routes (absent means ``interactive``); ``channel`` marks a
    channel-driven prompt. Only interactive prompts without the channel marker are guarded. When
    the span ends, the guard discards the prompt's state and any pending action.
    """
    scope = start_prompt(tracer, prompt_id, route=route, channel=channel, name=name)
    # Exception messages stay out of the span, as events and as the status description (which
    # use_span would set to the message): they may carry paths, arguments or secrets.
    with trace.use_span(
        scope.span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield scope
        except Exception:  # as use_span: not GeneratorExit, KeyboardInterrupt, cancellation
            scope.span.set_status(Status(StatusCode.ERROR))
            raise


def start_prompt(
    tracer: Tracer,
    prompt_id: str,
    *,
    parent: context_api.Context | None = None,
    route: str | None = None,
    channel: bool = False,
    name: str = attr.INVOKE_AGENT,
) -> PromptScope:
    """Start a prompt span without making it current; end it with ``scope.span.end()``.

    For hosts whose run starts and ends in different callbacks (framework hooks), where a
    ``with`` block cannot span the run. ``parent`` is the context to start it in (the current
    context when omitted); the other arguments are those of :func:`prompt_span`.
    """
    _identifier(prompt_id, "prompt_id")
    start_attributes: dict[str, str | bool] = {
        attr.OPERATION_NAME: attr.INVOKE_AGENT,
        attr.PROMPT_ID: prompt_id,
        **_route_attributes(route, channel),
    }
    span = tracer.start_span(name, context=parent, attributes=start_attributes)
    return PromptScope(tracer, prompt_id, span, route, channel)


# -- batch --------------------------------------------------------------------------------------


def start_batch(
    tracer: Tracer,
    prompt_id: str,
    *,
    parent: context_api.Context | None = None,
    route: str | None = None,
    channel: bool = False,
    name: str = "tool_batch",
) -> ToolBatch:
    """Start a batch span carrying ``acp.prompt.id`` (and any route markers) from its start.

    ``parent`` is the context to start it in (the current context when omitted). Use the result
    as a context manager, or call :meth:`ToolBatch.end` yourself.
    """
    _identifier(prompt_id, "prompt_id")
    start_attributes: dict[str, str | bool] = {
        attr.PROMPT_ID: prompt_id,
        **_route_attributes(route, channel),
    }
    span = tracer.start_span(name, context=parent, attributes=start_attributes)
    return ToolBatch(tracer, prompt_id, span)


class ToolBatch:
    """One model response's admitted tool calls, settled together, then one input drain.

    Build it with :func:`start_batch` or :meth:`PromptScope.batch`. Thread-safe: calls may be
    started, settled and finished from several threads or tasks.
    """

    def __init__(self, tracer: Tracer, prompt_id: str, span: Span) -> None:
        self._tracer = tracer
        self.prompt_id = prompt_id
        self.span = span
        self._lock = threading.RLock()
        self._parent = trace.set_span_in_context(span)
        self._admitted: dict[str, ToolCall | None] = {}
        self._duplicates = 0
        self._drain: tuple[bool, bool, bool] | None = None
        self._ended = False

    # -- admission ------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """Whether the batch span has ended."""
        return self._ended

    @property
    def admitted(self) -> int:
        """The number of admitted, deduplicated calls (provider duplicates excluded)."""
        with self._lock:
            return len(self._admitted)

    def open_call_ids(self) -> tuple[str, ...]:
        """Admitted calls that have not finished, in admission order."""
        with self._lock:
            return tuple(
                call_id
                for call_id, call in self._admitted.items()
                if call is None or not call.finished
            )

    def admit(self, call_id: str) -> None:
        """Admit a call before it starts (so an admitted call that never starts is noticed).

        Admitting an already admitted call ID is a no-op; :meth:`start_call` admits implicitly.
        """
        _identifier(call_id, "call_id")
        with self._lock:
            self._check_admission()
            self._admitted.setdefault(call_id, None)

    def start_call(
        self, call_id: str, tool_name: str, *, tool_type: ToolType = "native"
    ) -> ToolCall:
        """Start the tool-call span of an admitted call, a direct child of this batch span.

        ``tool_name`` is the resolved policy tool name (for MCP tools, the server-qualified
        registered name), never a model-provided display name.
        """
        _identifier(call_id, "call_id")
        _identifier(tool_name, "tool_name")
        if tool_type not in _TOOL_TYPES:
            raise InvalidValueError(f"tool_type must be 'native' or 'mcp', got {tool_type!r}")
        with self._lock:
            self._check_admission()
            if self._admitted.get(call_id) is not None:
                raise DuplicateCallError(
                    f"call {call_id!r} was already started in this batch; "
                    "flag a repeated provider frame with record_duplicate()"
                )
            span = self._start_span(call_id, tool_name, tool_type, duplicate=False)
            call = ToolCall(self, call_id, tool_name, span)
            self._admitted[call_id] = call
            return call

    @contextmanager
    def call(
        self, call_id: str, tool_name: str, *, tool_type: ToolType = "native"
    ) -> Iterator[ToolCall]:
        """Start a call whose span is current inside the block, and settle and finish it at exit.

        Unless the block settled it itself: leaving normally settles execution ``success``;
        raising settles execution ``error`` with :func:`error_type_of` the exception, and an
        :class:`asyncio.CancelledError` cancels the call instead. The exception propagates.
        A failure before the tool was entered (validation, permission) must be settled
        ``not_started`` inside the block before raising.
        """
        tool_call = self.start_call(call_id, tool_name, tool_type=tool_type)
        token = context_api.attach(trace.set_span_in_context(tool_call.span))
        error: BaseException | None = None
        try:
            yield tool_call
        except BaseException as caught:
            error = caught
            raise
        finally:
            context_api.detach(token)
            tool_call._close_after(error)  # raises only when the block itself succeeded

    def record_duplicate(
        self, call_id: str, tool_name: str, *, tool_type: ToolType = "native"
    ) -> None:
        """Emit the span of a provider duplicate: flagged, never admitted, no outcome.

        The guard neither counts nor resets on it; it exists so traces show the repeated frame.
        """
        _identifier(call_id, "call_id")
        _identifier(tool_name, "tool_name")
        if tool_type not in _TOOL_TYPES:
            raise InvalidValueError(f"tool_type must be 'native' or 'mcp', got {tool_type!r}")
        with self._lock:
            if self._ended:
                raise BatchEndedError("cannot record a duplicate after the batch ended")
            self._start_span(call_id, tool_name, tool_type, duplicate=True).end()
            self._duplicates += 1

    def _start_span(self, call_id: str, tool_name: str, tool_type: str, *, duplicate: bool) -> Span:
        start_attributes: dict[str, str | bool] = {
            attr.OPERATION_NAME: attr.EXECUTE_TOOL,
            attr.TOOL_NAME: tool_name,
            attr.TOOL_CALL_ID: call_id,
            attr.TOOL_TYPE: tool_type,
        }
        if duplicate:
            start_attributes[attr.TOOL_PROVIDER_DUPLICATE] = True
        return self._tracer.start_span(
            f"{attr.EXECUTE_TOOL} {tool_name}", context=self._parent, attributes=start_attributes
        )

    def _check_admission(self) -> None:
        if self._ended:
            raise BatchEndedError("cannot admit a call after the batch ended")
        if self._drain is not None:
            raise AdmissionClosedError("cannot admit a call after the input drain was recorded")

    # -- settling -------------------------------------------------------------------------

    def record_input_drain(
        self, *, external: bool = False, queued_prompt: bool = False, reliable: bool = True
    ) -> None:
        """Record the mid-turn input drain done after every admitted call finished.

        ``external``: new user input arrived; ``queued_prompt``: a full prompt is queued;
        ``reliable``: the drain itself worked (``False`` disables enforcement for the prompt).
        """
        for name, value in (
            ("external", external),
            ("queued_prompt", queued_prompt),
            ("reliable", reliable),
        ):
            if not isinstance(value, bool):
                raise InvalidValueError(f"{name} must be a bool, got {type(value).__name__}")
        with self._lock:
            if self._ended:
                raise BatchEndedError("cannot record the input drain after the batch ended")
            open_ids = self.open_call_ids()
            if open_ids:
                raise CallsStillOpenError(
                    f"the input drain follows the settled batch, but {len(open_ids)} admitted "
                    f"call(s) have not finished: {list(open_ids)}",
                    open_ids,
                )
            if self._drain is not None:
                raise ProducerError("the input drain was already recorded for this batch")
            self._drain = (external, queued_prompt, reliable)

    def end(self) -> None:
        """End the batch span, setting the admitted count and the input-drain result.

        Raises :class:`CallsStillOpenError` if admitted calls had not finished (they end after the
        batch span, as late frames, so the guard sees an incomplete batch) and
        :class:`InputDrainMissingError` if no input drain was recorded (the guard then treats the
        drain as unreliable). The batch span ends in every case.
        """
        open_ids, drained = self._end(None)
        if open_ids:
            raise CallsStillOpenError(
                f"batch ended with {len(open_ids)} admitted call(s) not finished: {list(open_ids)}",
                open_ids,
            )
        if not drained:
            raise InputDrainMissingError(
                "batch ended without record_input_drain(); the guard reads it as unreliable"
            )

    def abandon(
        self,
        error: BaseException | None = None,
        *,
        external: bool = False,
        queued_prompt: bool = False,
        reliable: bool | None = None,
    ) -> None:
        """End the batch span now, for a batch that will not settle (the host was interrupted).

        No misuse error: calls still open end after the batch span as late frames (``cancelled``
        when ``error`` is a cancellation), so the guard resets on the incomplete batch. Without
        an input drain the guard reads the input as unreliable, which also disables enforcement
        for the prompt; a host whose input channel is intact (only the batch failed) passes
        ``reliable=True`` and what it drained, so the reset says ``incomplete``. A drain already
        recorded wins. A no-op when the batch already ended.
        """
        with self._lock:
            if self._ended:
                return
            if self._drain is None and reliable is not None:
                self._drain = (external, queued_prompt, reliable)
            self._end(error)

    def _end(self, error: BaseException | None) -> tuple[tuple[str, ...], bool]:
        with self._lock:
            if self._ended:
                raise BatchEndedError("the batch span already ended")
            open_calls = [
                (call_id, call)
                for call_id, call in self._admitted.items()
                if call is None or not call.finished
            ]
            self.span.set_attribute(attr.BATCH_ADMITTED, len(self._admitted))
            if self._drain is not None:
                external, queued, reliable = self._drain
                self.span.set_attribute(attr.INPUT_EXTERNAL, external)
                self.span.set_attribute(attr.INPUT_QUEUED_PROMPT, queued)
                self.span.set_attribute(attr.INPUT_RELIABLE, reliable)
            else:
                # Said, not left out: a batch span without it is a half-written one.
                self.span.set_attribute(attr.INPUT_RELIABLE, False)
            if error is not None:
                self.span.set_status(Status(StatusCode.ERROR))
            self._ended = True
            self.span.end()
            # After the batch span: late frames the guard ignores, but no span is leaked.
            for _, call in open_calls:
                if call is not None:
                    call._abandon(error)
            return tuple(call_id for call_id, _ in open_calls), self._drain is not None

    def __enter__(self) -> ToolBatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            if not self._ended:
                self.end()
            return
        # The original exception wins; the guard sees the batch as it is (likely incomplete).
        self.abandon(exc)


# -- tool call ----------------------------------------------------------------------------------


class ToolCall:
    """One admitted call's span: execution settles once, then the call finishes once."""

    def __init__(self, batch: ToolBatch, call_id: str, tool_name: str, span: Span) -> None:
        self._batch = batch
        self.call_id = call_id
        self.tool_name = tool_name
        self.span = span
        self._execution: ExecutionStatus | None = None
        self._error_type: str | None = None
        self._cancel_requested = False
        self._terminal: TerminalStatus | None = None
        self._abandoned = False

    @property
    def execution_status(self) -> ExecutionStatus | None:
        """The frozen execution status, or ``None`` before execution settled."""
        return self._execution

    @property
    def execution_error_type(self) -> str | None:
        """The execution error type frozen when execution settled."""
        return self._error_type

    @property
    def terminal_status(self) -> TerminalStatus | None:
        """The terminal status, once the call finished."""
        return self._terminal

    @property
    def finished(self) -> bool:
        """Whether the call's span has ended."""
        return self._terminal is not None

    def settle(self, execution: ExecutionStatus, error_type: str | None = None) -> None:
        """Freeze the execution outcome: status and, for ``error`` only, its structured type.

        ``error_type`` must match :data:`ERROR_TYPE_PATTERN` (see :func:`error_type_of`); it is
        the repeated-failure key's second half and never changes afterwards.
        """
        if execution not in _EXECUTION_STATUSES:
            raise InvalidStatusError(
                f"execution status must be one of {sorted(_EXECUTION_STATUSES)}, got {execution!r}"
            )
        if execution == "error":
            if not is_structured_error_type(error_type):
                raise InvalidErrorTypeError(
                    "an execution error needs a structured error type matching "
                    f"^[a-z][a-z0-9_.-]{{0,63}}$ (see error_type_of), got {error_type!r}"
                )
        elif error_type is not None:
            raise InvalidErrorTypeError(
                f"only an execution error has an error type; got {error_type!r} for {execution!r}"
            )
        with self._batch._lock:
            self._check_open("settle")
            if self._execution is not None:
                raise CallAlreadySettledError(
                    f"call {self.call_id!r} already settled as {self._execution!r}"
                )
            self._execution = execution
            self._error_type = error_type
            self.span.set_attribute(attr.TOOL_EXECUTION_STATUS, execution)
            if error_type is not None:
                self.span.set_attribute(attr.TOOL_EXECUTION_ERROR_TYPE, error_type)

    def cancel(self) -> bool:
        """Request cancellation; it wins arbitration when the call finishes.

        Returns whether it took effect: a cancel that arrives after the call finished (or its
        batch ended) is a lost race, not misuse, and changes nothing.
        """
        with self._batch._lock:
            if self.finished or self._batch.ended:
                return False
            self._cancel_requested = True
            return True

    def finish(self, status: TerminalStatus | None = None) -> TerminalStatus:
        """End the call's span with its terminal status, and return that status.

        ``status`` defaults from the execution status (``not_started`` and ``unknown`` give
        ``error``); a finalisation step may pass another one (a post-execution failure is
        execution ``success`` with terminal ``error``), but ``success`` after an execution error
        or cancellation is a contract violation. A requested cancellation wins: the call ends
        ``cancelled``, and an unsettled execution is settled ``cancelled``.
        """
        if status is not None and status not in _TERMINAL_STATUSES:
            raise InvalidStatusError(
                f"terminal status must be one of {sorted(_TERMINAL_STATUSES)}, got {status!r}"
            )
        with self._batch._lock:
            self._check_open("finish")
            if self._cancel_requested:
                terminal: TerminalStatus = "cancelled"
                if self._execution is None:
                    self.settle("cancelled")
            elif self._execution is None:
                raise CallNotSettledError(
                    f"call {self.call_id!r} must settle (or be cancelled) before it finishes"
                )
            else:
                terminal = status or _DEFAULT_TERMINAL[self._execution]
                if terminal == "success" and self._execution in ("error", "cancelled"):
                    raise InvalidStatusError(
                        f"terminal success after execution {self._execution!r} "
                        "is a contract violation"
                    )
            self._end_span(terminal)
            return terminal

    def _end_span(self, terminal: TerminalStatus) -> None:
        self._terminal = terminal
        self.span.set_attribute(attr.TOOL_STATUS, terminal)
        if terminal == "error":
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()

    def _check_open(self, verb: str) -> None:
        if self._batch.ended:
            raise BatchEndedError(f"cannot {verb} call {self.call_id!r}: its batch ended")
        if self.finished:
            raise CallAlreadySettledError(f"call {self.call_id!r} already finished")

    def _close_after(self, error: BaseException | None) -> None:
        """Settle (unless settled) and finish at the end of a :meth:`ToolBatch.call` block."""
        with self._batch._lock:
            if self._abandoned:
                if error is None:
                    raise BatchEndedError(f"call {self.call_id!r} outlived its batch")
                return
            if self.finished:
                return
            if _is_cancellation(error):
                self._cancel_requested = True
            elif self._execution is None:
                if error is None:
                    self.settle("success")
                else:
                    self.settle("error", error_type_of(error))
            self.finish()

    def _abandon(self, error: BaseException | None) -> None:
        """End a call left open when its batch ended: a late frame, described honestly."""
        if self._cancel_requested or _is_cancellation(error):
            terminal: TerminalStatus = "cancelled"
            execution: ExecutionStatus = "cancelled"
        else:
            terminal, execution = "error", "unknown"
        self._abandoned = True
        if self._execution is None:
            self._execution = execution
            self.span.set_attribute(attr.TOOL_EXECUTION_STATUS, execution)
        self._end_span(terminal)
