"""The repeated-tool-failure guard as a pydantic-ai capability (extra ``pydantic-ai``).

::

    from pydantic_ai import Agent
    from otel_guard import GuardSpanProcessor
    from otel_guard.integrations.pydantic_ai import RepeatedToolFailureGuard

    guard = GuardSpanProcessor(mode="enforce")
    agent = Agent(model, capabilities=[RepeatedToolFailureGuard(guard)])

Each agent run is one prompt (its ``run_id`` is the prompt ID) and each model response's tool
calls are one batch, described with :mod:`otel_guard.integrations.producer` spans that the guard
evaluates when the batch has settled, before the next model request:

* a tool that raises, ``ModelRetry`` and ``ToolFailed`` included, is an execution ``error``
  whose error type is the snake-case class name (``model_retry``, ``file_not_found_error``);
* a call whose arguments fail validation, names an unknown tool, or is never run (deferred,
  skipped) is ``not_started``, which the guard never counts;
* a call interrupted by cancellation ends ``cancelled``;
* a call ID repeated within one response is flagged a provider duplicate (pydantic-ai then
  refuses the response, so the batch is incomplete); a later response may reuse an ID.

With pydantic-ai's own ``Instrumentation`` on (its agent run span is current when the run
starts), its ``invoke_agent``, model-request and ``execute_tool`` spans are the ones exported:
the capability's prompt, batch and tool-call spans then go to a provider holding only the guard,
and pydantic-ai's spans stay below pydantic-ai's run span, so each tool call is exported once
and the exported trace replays to the same decisions through the GenAI-conventions profile.
The guard's records then carry the trace ID of the run and the span ID of a batch span that is
not exported.

pydantic-ai (2.68 to 2.78) marks no tool definition as coming from an MCP server (its tool
definitions carry no toolset kind, and MCP toolset IDs are masked for telemetry), so every call
is ``native``.

Modes are the guard's: in ``shadow`` (and ``off``) the run goes exactly as without the
capability; in ``warn`` and ``enforce`` the reminder reaches the model as a system part of the
next request (a :data:`RepeatedToolFailureReminderPart` where pydantic-ai has capability parts,
else a ``SystemPromptPart``); in ``enforce`` the run then raises
:class:`RepeatedToolFailureStopped` once the next matching failing batch has settled, instead of
sending another request.

Streaming runs are guarded the same: ``run_stream()`` (which runs a streamed response's tools
before ``wrap_node_run``, after ``before_node_run``), ``run_stream_events()``, and ``iter()`` with
nodes streamed by hand (``node.stream(run.ctx)`` runs a tools node's tools before any node hook,
so the batch opens at its first tool call, from the latest response in ``ctx.messages``). The
tools of ``run_stream()``'s final streamed response, which no node hook encloses, are closed
with the run.

Built on the capability hooks of pydantic-ai 2.x (``wrap_run``, ``wrap_node_run``,
``before_node_run``, ``wrap_tool_validate``, ``wrap_tool_execute``) and ``RunContext.enqueue``.
Guard bookkeeping never raises into the agent: a failure there is logged at debug level and the
batch is left for the guard to judge incomplete.
"""

from __future__ import annotations

import asyncio
import logging
import types
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Tracer
from pydantic import ValidationError
from pydantic_ai import CallToolsNode, ModelRequestNode, RunContext
from pydantic_ai import messages as _messages
from pydantic_ai.capabilities import (
    AbstractCapability,
    AgentNode,
    NodeResult,
    RawToolArgs,
    ValidatedToolArgs,
    WrapNodeRunHandler,
    WrapRunHandler,
    WrapToolExecuteHandler,
    WrapToolValidateHandler,
)
from pydantic_ai.exceptions import (
    AgentRunError,
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    SkipToolExecution,
    ToolFailed,
    ToolFailedError,
    ToolRetryError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition

from otel_guard.guard.processor import GuardSpanProcessor
from otel_guard.integrations.producer import (
    PromptScope,
    ToolBatch,
    ToolCall,
    error_type_of,
    prompt_span,
)
from otel_guard.spans.attributes import INVOKE_AGENT, OPERATION_NAME, PROMPT_ID, PROMPT_ROUTES

if TYPE_CHECKING:
    from pydantic_ai.run import AgentRunResult

__all__ = [
    "RepeatedToolFailureGuard",
    "RepeatedToolFailureReminderPart",
    "RepeatedToolFailureStopped",
]

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# Exceptions pydantic-ai raises on a tool's behalf; the tool's own exception is their cause.
_WRAPPERS = (ToolRetryError, ToolFailedError, UnexpectedModelBehavior)
# Control flow: the call was not run in this batch, and is settled not_started at the batch end.
_NOT_RUN = (CallDeferred, ApprovalRequired)


# pydantic-ai's capability parts (2.78 has them, 2.68 does not), looked up by name so that the
# module imports, and type-checks, against either version. Where they exist, a capability says
# what it has to say mid-run as a part of a kind it defines, which the framework renders in the
# voice the part's source allows; a bare SystemPromptPart it enqueues draws a UserWarning.
_INSTRUCTION_PART: Any = getattr(_messages, "InstructionCapabilityPart", None)
_OPERATOR_SOURCE: Any = getattr(_messages, "OperatorSource", None)
_OPERATOR_TEXT: Any = getattr(_messages, "OperatorText", str)


def _define_reminder_part() -> Any:
    if _INSTRUCTION_PART is None or _OPERATOR_SOURCE is None:
        return None
    kind = types.new_class(
        "RepeatedToolFailureReminderPart",
        (_INSTRUCTION_PART,),
        {"namespace": "otel_guard", "name": "repeated_tool_failure_reminder"},
        lambda body: body.update(
            __module__=__name__,
            __doc__="The guard's reminder, told to the model in the application's voice.",
        ),
    )
    return dataclass(kw_only=True, repr=False)(kind)


RepeatedToolFailureReminderPart: Any = _define_reminder_part()
"""The guard's reminder in a run's history: an instruction capability part of kind
``otel_guard.repeated_tool_failure_reminder``, or ``None`` with a pydantic-ai that has no
capability parts, where the reminder is a ``SystemPromptPart``.

Its source is an ``OperatorSource``, whose authority lets pydantic-ai render it to the model as
a mid-conversation system message, in the application's voice (a lower one would move it to the
user's turn or frame it as data). Code finds the reminder in ``result.all_messages()`` by type.
"""


def _reminder_part(text: str) -> Any:
    """The reminder, as ``ctx.enqueue`` takes it, for the next model request's system voice."""
    if RepeatedToolFailureReminderPart is None:
        return SystemPromptPart(text)
    return RepeatedToolFailureReminderPart(content=_OPERATOR_TEXT(text), source=_OPERATOR_SOURCE())


class RepeatedToolFailureStopped(AgentRunError):
    """An ``enforce`` guard stopped the run after its reminder did not change the failing approach.

    Raised from the agent run instead of the next model request. ``message`` is the guard's fixed
    stop text. ``messages`` is the run's history with the settled batch's tool results and the
    stop text as a final system part: pass it as ``message_history`` with new user input to go on.

    The stop text is a plain ``SystemPromptPart`` on every pydantic-ai version, unlike the reminder:
    it is never enqueued into the run (no model sees it as part of this run), it is the history the
    application owns and sends on as its own, and code that handles the stop finds it there by
    ``SystemPromptPart`` as documented. The reminder before it is a
    :data:`RepeatedToolFailureReminderPart` where pydantic-ai has capability parts.
    """

    def __init__(self, message: str, *, prompt_id: str, messages: list[ModelMessage]) -> None:
        super().__init__(message)
        self.prompt_id = prompt_id
        self.messages = messages


class RepeatedToolFailureGuard(AbstractCapability[Any]):
    """A pydantic-ai capability that reports each tool batch to a :class:`GuardSpanProcessor`.

    Args:
        guard: the guard processor; its mode decides what the capability does.
        tracer_provider: where the spans go. It must have ``guard`` among its span processors.
            When omitted, a private provider holding only the guard is used, so the guard works
            without exporting any span.
        route, channel: the prompt route markers of docs/contract.md section 3 for every run of
            the agent; only interactive prompts without the channel marker are guarded.
    """

    def __init__(
        self,
        guard: GuardSpanProcessor,
        *,
        tracer_provider: TracerProvider | None = None,
        route: str | None = None,
        channel: bool = False,
        _guard_only: Tracer | None = None,
    ) -> None:
        if route is not None and route not in PROMPT_ROUTES:
            raise ValueError(f"route must be one of {sorted(PROMPT_ROUTES)}, got {route!r}")
        own_provider = tracer_provider is None
        if tracer_provider is None:
            tracer_provider = _guard_only_provider(guard)
        self.guard = guard
        self.tracer_provider = tracer_provider
        self.route = route
        self.channel = channel
        self._tracer: Tracer = tracer_provider.get_tracer(_SCOPE)
        # For runs that pydantic-ai's instrumentation traces: spans seen by the guard only.
        if _guard_only is None:
            _guard_only = (
                self._tracer if own_provider else _guard_only_provider(guard).get_tracer(_SCOPE)
            )
        self._guard_only = _guard_only
        # Per-run state; only the instance returned by for_run() holds any.
        self._prompt: PromptScope | None = None
        self._batch: ToolBatch | None = None
        self._response: ModelResponse | None = None  # the response whose calls form the batch
        self._pending: dict[str, ToolCallPart] = {}
        self._calls: dict[str, ToolCall] = {}
        self._reminder_lost = False
        # User prompt parts still queued when the last batch closed (counted then, as its input
        # drain), and whether a batch of this run has closed: what arrives between batches is
        # in the request before the next batch's response.
        self._carried = 0
        self._closed_any = False

    async def for_run(self, ctx: RunContext[Any]) -> RepeatedToolFailureGuard:
        """A fresh instance per run, so concurrent runs of one agent never share a batch."""
        return RepeatedToolFailureGuard(
            self.guard,
            tracer_provider=self.tracer_provider,
            route=self.route,
            channel=self.channel,
            _guard_only=self._guard_only,
        )

    # -- run: one prompt ------------------------------------------------------------------

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        prompt_id = ctx.run_id or str(uuid.uuid4())
        run_span = trace.get_current_span()
        instrumented = _is_instrumented_run(run_span)
        tracer = self._guard_only if instrumented else self._tracer
        with prompt_span(tracer, prompt_id, route=self.route, channel=self.channel) as prompt:
            self._prompt = prompt
            # pydantic-ai's own spans stay below its run span, where they are exported.
            token = (
                context_api.attach(trace.set_span_in_context(run_span)) if instrumented else None
            )
            error: BaseException | None = None
            try:
                return await handler()
            except BaseException as caught:
                error = caught
                raise
            finally:
                if token is not None:
                    context_api.detach(token)
                # A batch no node hook closed: tools of run_stream()'s final streamed response.
                if self._batch is not None:
                    self._close_quietly(ctx, self._batch, error)
                self._prompt = None

    # -- node: one model response's tool calls form one batch ---------------------------

    async def wrap_node_run(
        self,
        ctx: RunContext[Any],
        *,
        node: AgentNode[Any],
        handler: WrapNodeRunHandler[Any],
    ) -> NodeResult[Any]:
        batch = None
        if isinstance(node, CallToolsNode) and self._prompt is not None:
            batch = self._quietly(lambda: self._batch_for(ctx, node.model_response))
        if batch is None:
            return await handler(node)
        prompt_id = batch.prompt_id
        try:
            result = await handler(node)
        except BaseException as error:
            self._close_quietly(ctx, batch, error)
            raise
        self._close_quietly(ctx, batch, None)
        if self.guard.mode not in ("warn", "enforce") or not isinstance(result, ModelRequestNode):
            return result  # shadow never acts; a run that ends here needs no reminder or stop
        action = self.guard.take_action(prompt_id)
        if action is None:
            return result
        if action.kind == "reminder":
            delivered = self._quietly(lambda: ctx.enqueue(_reminder_part(action.text)))
            self._reminder_lost = delivered is None
            return result
        if self._reminder_lost:
            return result  # never stop a model that was not shown the reminder
        request = result.request
        stopped = ModelRequest(parts=[*request.parts, SystemPromptPart(action.text)])
        raise RepeatedToolFailureStopped(
            action.text, prompt_id=prompt_id, messages=[*ctx.messages, stopped]
        )

    async def before_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any]
    ) -> AgentNode[Any]:
        # run_stream() runs a streamed node's tools before wrap_node_run, which then only
        # advances the graph: the batch opens here, and wrap_node_run finds it open.
        if isinstance(node, CallToolsNode) and self._prompt is not None:
            self._quietly(lambda: self._batch_for(ctx, node.model_response))
        return node

    def _batch_for(self, ctx: RunContext[Any], response: ModelResponse) -> ToolBatch | None:
        """The open batch of ``response``'s tool calls, opened by whichever hook comes first."""
        if response is self._response:
            return self._batch
        if self._batch is not None:  # a response whose node hooks never came (driven by hand)
            self._close_batch(ctx, self._batch, None)
        self._response = response
        return self._open_batch(ctx, response.parts)

    def _open_batch(
        self, ctx: RunContext[Any], parts: Sequence[ModelResponsePart]
    ) -> ToolBatch | None:
        assert self._prompt is not None
        tools = ctx.tools
        calls = [
            part
            for part in parts
            if isinstance(part, ToolCallPart)
            and (tools.get(part.tool_name) is None or tools[part.tool_name].kind != "output")
        ]
        if not calls:
            return None
        batch = self._prompt.batch()
        self._batch, self._pending, self._calls = batch, {}, {}
        for part in calls:
            # Only a repeat within one response is a duplicate frame (pydantic-ai then refuses
            # the whole response); a later response may reuse an ID for a new call.
            if part.tool_call_id in self._pending:
                batch.record_duplicate(part.tool_call_id, part.tool_name)
            else:
                self._pending[part.tool_call_id] = part
                batch.admit(part.tool_call_id)
        return batch

    def _close_quietly(
        self, ctx: RunContext[Any], batch: ToolBatch, error: BaseException | None
    ) -> None:
        self._quietly(lambda: self._close_batch(ctx, batch, error))

    def _close_batch(
        self, ctx: RunContext[Any], batch: ToolBatch, error: BaseException | None
    ) -> None:
        pending, calls = self._pending, self._calls
        self._batch, self._pending, self._calls = None, {}, {}
        if error is None:
            # Admitted but never run: an unknown tool, a deferral, or skipped after a final result.
            for call_id, part in pending.items():
                call = calls.get(call_id) or batch.start_call(call_id, part.tool_name)
                if not call.finished:
                    if call.execution_status is None:
                        call.settle("not_started")
                    call.finish()
        # The pending-message queue is in process: reading it is always a reliable drain. Input
        # queued after the previous batch closed and drained into the request before this
        # batch's response (``enqueue`` at that ModelRequestNode) is this drain's too.
        queued = _queued_user_parts(ctx)
        between = _user_parts_before(ctx.messages, self._response) if self._closed_any else 0
        external = queued > 0 or between > self._carried
        self._carried, self._closed_any = queued, True
        if batch.open_call_ids():
            batch.abandon(error, external=external, reliable=True)  # reset: incomplete
            return
        batch.record_input_drain(external=external, queued_prompt=False, reliable=True)
        batch.end()

    # -- calls ----------------------------------------------------------------------------

    def _call_for(self, ctx: RunContext[Any], part: ToolCallPart) -> ToolCall | None:
        if self._batch is None and self._prompt is not None:
            # A node streamed by hand from iter() runs its tools before any node hook.
            response = _response_calling(ctx.messages, part.tool_call_id)
            if response is not None:
                self._batch_for(ctx, response)
        batch = self._batch
        if batch is None or part.tool_call_id not in self._pending:
            return None  # not a call of this batch (an output tool, a duplicate frame)
        call = self._calls.get(part.tool_call_id)
        if call is None:
            call = batch.start_call(part.tool_call_id, part.tool_name)
            self._calls[part.tool_call_id] = call
        return None if call.finished else call

    async def wrap_tool_validate(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: RawToolArgs,
        handler: WrapToolValidateHandler,
    ) -> ValidatedToolArgs:
        tracked = self._quietly(lambda: self._call_for(ctx, call))
        if tracked is None:
            return await handler(args)
        try:
            return await handler(args)
        except asyncio.CancelledError:
            self._quietly(lambda: _cancel(tracked))
            raise
        except (ValidationError, ModelRetry, ToolFailed):
            self._quietly(lambda: _settle(tracked, "not_started", None))
            raise

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        tracked = self._quietly(lambda: self._call_for(ctx, call))
        if tracked is None:
            return await handler(args)
        try:
            result = await handler(args)
        except asyncio.CancelledError:
            self._quietly(lambda: _cancel(tracked))
            raise
        except _NOT_RUN:
            raise
        except SkipToolExecution:
            self._quietly(lambda: _settle(tracked, "not_started", "success"))
            raise
        except BaseException as error:
            cause = error.__cause__ if isinstance(error, _WRAPPERS) else None
            error_type = error_type_of(cause if isinstance(cause, BaseException) else error)
            self._quietly(lambda: _settle(tracked, "error", None, error_type))
            raise
        self._quietly(lambda: _settle(tracked, "success", None))
        return result

    def _quietly(self, step: Callable[[], _T]) -> _T | None:
        try:
            return step()
        except Exception:
            # No traceback: frames can hold tool arguments.
            _logger.debug("otel_guard: pydantic-ai guard bookkeeping failed")
            return None


_SCOPE = "otel_guard.integrations.pydantic_ai"


def _guard_only_provider(guard: GuardSpanProcessor) -> TracerProvider:
    provider = TracerProvider(shutdown_on_exit=False)  # the guard's owner shuts it down
    provider.add_span_processor(guard)
    return provider


def _is_instrumented_run(span: Span) -> bool:
    """Whether ``span`` is the run span of pydantic-ai's own instrumentation (the outermost
    capability, so its span is current when other capabilities' ``wrap_run`` starts)."""
    if not span.is_recording():
        return False
    attributes = getattr(span, "attributes", None)
    return (
        attributes is not None
        and attributes.get(OPERATION_NAME) == INVOKE_AGENT
        and PROMPT_ID not in attributes
    )


def _settle(call: ToolCall, execution: Any, terminal: Any, error_type: str | None = None) -> None:
    if not call.finished:  # a run torn down mid-batch already ended it as a late frame
        call.settle(execution, error_type)
        call.finish(terminal)


def _cancel(call: ToolCall) -> None:
    if call.cancel():
        call.finish()


def _response_calling(messages: Sequence[ModelMessage], call_id: str) -> ModelResponse | None:
    """The latest model response of ``messages``, if it made the call ``call_id``."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            calls = (p for p in message.parts if isinstance(p, ToolCallPart))
            return message if any(p.tool_call_id == call_id for p in calls) else None
    return None


def _queued_user_parts(ctx: RunContext[Any]) -> int:
    """User content queued into the run and not yet drained (``AgentRun.enqueue`` and the
    like): the user prompt parts of the pending messages."""
    pending = ctx.pending_messages or []
    return sum(
        isinstance(part, UserPromptPart)
        for message in pending
        for request in message.messages
        if isinstance(request, ModelRequest)
        for part in request.parts
    )


def _user_parts_before(messages: Sequence[ModelMessage], response: ModelResponse | None) -> int:
    """The user prompt parts of the requests between ``response`` and the response before it
    in ``messages`` (0 when ``response`` is not there): what the model was told since the
    previous batch besides that batch's tool results. The guard's reminder is not a user part."""
    # From the end: the response is the run's latest or close to it, however long the history.
    found = False
    count = 0
    for message in reversed(messages):
        if not found:
            found = message is response
        elif isinstance(message, ModelResponse):
            return count
        elif isinstance(message, ModelRequest):
            count += sum(isinstance(part, UserPromptPart) for part in message.parts)
    return count
