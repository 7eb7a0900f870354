"""The repeated-tool-failure guard as LangChain agent middleware (extra ``langchain``).

::

    from langchain.agents import create_agent
    from otel_guard import GuardSpanProcessor
    from otel_guard.integrations.langchain import RepeatedToolFailureMiddleware

    guard = GuardSpanProcessor(mode="enforce")
    agent = create_agent(model, tools, middleware=[RepeatedToolFailureMiddleware(guard)])

Built on LangChain 1.x agent middleware (``create_agent``, which runs on LangGraph): each agent
run is one prompt (``before_agent`` to ``after_agent``) and each model response's tool calls, the
``tool_calls`` of one ``AIMessage`` that LangGraph runs in parallel, are one batch, described with
:mod:`otel_guard.integrations.producer` spans. The batch is evaluated in ``before_model``, once
every call of it has settled and before the next model call:

* an exception raised through the middleware's ``wrap_tool_call`` is an execution ``error``
  whose type is the snake-case class name (``ToolException`` gives ``tool_exception``);
* an error ``ToolMessage`` returned without an exception (the exception was turned into a
  message before it reached the guard) is ``not_started`` when the tool is unknown or its
  arguments fail the tool's schema, else ``unknown``: list the guard *after* (inside) any
  middleware that turns exceptions into messages, such as ``ToolErrorMiddleware``, and do not
  use a tool's own ``handle_tool_error``, so that the guard sees the exception class;
* a call of the response that never ran (rejected by ``HumanInTheLoopMiddleware``, skipped) is
  ``not_started``, a cancelled or interrupted call ``cancelled``: neither ever counts;
* a call ID repeated within one response is flagged a provider duplicate.

Modes are the guard's: ``shadow`` (and ``off``) never change the run; in ``warn`` and
``enforce`` the reminder is added to the conversation as a ``SystemMessage`` before the next
model call; in ``enforce`` the run then raises :class:`RepeatedToolFailureStopped` from
``before_model`` once the next matching failing batch has settled, instead of calling the model
again. A tool loaded from an MCP server by langchain-mcp-adapters is recorded ``mcp`` (told by
the module its function comes from, without importing the adapters), every other tool
``native``; a call that never reached a tool is ``native``. The adapters turn an MCP server's
error result into an error ``ToolMessage`` by default (``handle_tool_errors=True``), which the
guard can only record ``unknown``: load the tools with ``handle_tool_errors=False`` so that the
``ToolException`` reaches the guard.

Beside OpenInference's LangChain instrumentation, whose spans are never made current, the
prompt span starts below its span of the running node (see :func:`_instrumented_parent`), so the
run is one trace and the guard decides it once, from the section 3 spans.

Streaming runs are guarded the same (``stream``/``astream`` in every ``stream_mode``): the
hooks are graph nodes, which run alike however the graph is driven; a stop raises from the
iteration. Guard bookkeeping never raises into the agent.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ToolCallRequest
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime
from langgraph.types import Command
from opentelemetry import context as context_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, Tracer, set_span_in_context
from pydantic import BaseModel, ValidationError
from typing_extensions import NotRequired

from otel_guard.guard.processor import GuardSpanProcessor
from otel_guard.integrations._hooks import (
    BoundedRuns,
    cancel,
    check_route,
    guard_only_provider,
    quietly,
    settle,
)
from otel_guard.integrations.producer import (
    PromptScope,
    ToolBatch,
    ToolCall,
    ToolType,
    error_type_of,
    start_prompt,
)

__all__ = ["RepeatedToolFailureMiddleware", "RepeatedToolFailureStopped"]

_logger = logging.getLogger(__name__)
_SCOPE = "otel_guard.integrations.langchain"
_KEY = "otel_guard_prompt_id"
# Runs whose end hook never ran (an exception out of the agent) are closed past this many.
_MAX_OPEN_RUNS = 1024
_MCP_ADAPTERS = "langchain_mcp_adapters"
_OPENINFERENCE = "openinference.instrumentation.langchain"


class RepeatedToolFailureStopped(RuntimeError):
    """An ``enforce`` guard stopped the run after its reminder did not change the failing approach.

    Raised from the agent run (``invoke``/``ainvoke``/``stream``) instead of the next model call.
    ``message`` is the guard's fixed stop text; ``messages`` is the run's conversation with the
    settled batch's tool results and the stop text as a final ``SystemMessage``: pass it with new
    user input to go on.
    """

    def __init__(self, message: str, *, prompt_id: str, messages: list[AnyMessage]) -> None:
        super().__init__(message)
        self.message = message
        self.prompt_id = prompt_id
        self.messages = messages


class GuardState(AgentState[Any]):
    """The agent state with the run's prompt ID, so every hook of a run finds its prompt."""

    otel_guard_prompt_id: NotRequired[str]


class _Run:
    """One agent run: its prompt span and the batch of the latest model response."""

    def __init__(self, prompt: PromptScope) -> None:
        self.prompt = prompt
        self.lock = threading.RLock()
        self.batch: ToolBatch | None = None
        self.message_id: str | None = None  # the AIMessage whose calls form the open batch
        self.evaluated: str | None = None  # the AIMessage whose batch was last evaluated
        self.names: dict[str, str] = {}  # admitted call ID -> tool name
        self.calls: dict[str, ToolCall] = {}


class RepeatedToolFailureMiddleware(AgentMiddleware[GuardState, Any, Any]):
    """LangChain agent middleware that reports each tool batch to a :class:`GuardSpanProcessor`.

    Args:
        guard: the guard processor; its mode decides what the middleware does.
        tracer_provider: where the spans go. It must have ``guard`` among its span processors.
            When omitted, a private provider holding only the guard is used, so the guard works
            without exporting any span.
        route, channel: the prompt route markers of docs/contract.md section 3 for every run of
            the agent; only interactive prompts without the channel marker are guarded.

    One instance may serve many agents and concurrent runs: each run's state carries its own
    prompt ID.
    """

    state_schema = GuardState

    def __init__(
        self,
        guard: GuardSpanProcessor,
        *,
        tracer_provider: TracerProvider | None = None,
        route: str | None = None,
        channel: bool = False,
    ) -> None:
        super().__init__()
        check_route(route)
        self.guard = guard
        self.tracer_provider = tracer_provider or guard_only_provider(guard)
        self.route = route
        self.channel = channel
        self.tools = []
        self._tracer: Tracer = self.tracer_provider.get_tracer(_SCOPE)
        self._runs: BoundedRuns[_Run] = BoundedRuns(_MAX_OPEN_RUNS)

    # -- run: one prompt ------------------------------------------------------------------

    def before_agent(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        prompt_id = str(uuid.uuid4())
        earlier = _last_ai(state.get("messages", ()))
        started = quietly(_logger, lambda: self._start(prompt_id, earlier))
        return None if started is None else {_KEY: prompt_id}

    async def abefore_agent(
        self, state: GuardState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    def after_agent(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        run = self._runs.pop(state.get(_KEY))
        if run is not None:
            quietly(_logger, lambda: self._end(run, state["messages"]))
        return None

    async def aafter_agent(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    def _start(self, prompt_id: str, earlier: AIMessage | None) -> bool:
        prompt = start_prompt(
            self._tracer,
            prompt_id,
            parent=_instrumented_parent(),
            route=self.route,
            channel=self.channel,
        )
        run = _Run(prompt)
        # The latest response of the history the run starts from (a checkpointed thread, or a
        # stopped run's messages passed back) belongs to an earlier prompt: its calls are not
        # a batch of this one.
        run.evaluated = None if earlier is None else earlier.id
        for evicted in self._runs.add(prompt_id, run):
            self._end(evicted, None)
        return True

    def _end(self, run: _Run, messages: Sequence[AnyMessage] | None) -> None:
        try:
            if messages is not None:
                self._settle(run, messages)
            elif run.batch is not None:
                run.batch.abandon(reliable=True)  # the run was lost: an incomplete batch
        finally:
            run.prompt.span.end()

    # -- model call: the previous response's batch settles, the guard may act -------------

    def before_model(self, state: GuardState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        run = self._runs.get(state.get(_KEY))
        if run is None:
            return None
        messages = state["messages"]
        if not quietly(_logger, lambda: self._settle(run, messages)):
            return None
        if self.guard.mode not in ("warn", "enforce"):
            return None  # shadow never acts
        action = quietly(_logger, lambda: self.guard.take_action(run.prompt.prompt_id))
        if action is None:
            return None
        if action.kind == "reminder":
            return {"messages": [SystemMessage(action.text)]}
        self._runs.pop(run.prompt.prompt_id)
        quietly(_logger, run.prompt.span.end)
        raise RepeatedToolFailureStopped(
            action.text,
            prompt_id=run.prompt.prompt_id,
            messages=[*messages, SystemMessage(action.text)],
        )

    async def abefore_model(
        self, state: GuardState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    def _settle(self, run: _Run, messages: Sequence[AnyMessage]) -> bool:
        """Evaluate the latest response's batch if it has not been; whether one was evaluated."""
        with run.lock:
            batch = run.batch
            if batch is None:
                # A response whose calls never reached the tools (all rejected, or skipped).
                batch = self._batch_for(run, _last_ai(messages))
                if batch is None:
                    return False
            for call_id, name in run.names.items():
                call = run.calls.get(call_id)
                if call is None:
                    call = batch.start_call(call_id, name)
                if not call.finished:
                    settle(call, "not_started")
            run.evaluated, run.batch, run.message_id = run.message_id, None, None
            run.names, run.calls = {}, {}
            # Nothing reaches a LangChain run from outside while its tools run.
            batch.record_input_drain(external=False, queued_prompt=False, reliable=True)
            batch.end()
            return True

    def _batch_for(self, run: _Run, message: AIMessage | None) -> ToolBatch | None:
        """The open batch of ``message``'s tool calls, opened on first use (under the lock)."""
        if message is None or not message.tool_calls or message.id is None:
            return None
        if run.message_id == message.id:
            return run.batch
        if message.id == run.evaluated:
            return None
        if run.batch is not None:  # a response replaced before its batch settled
            run.batch.abandon(reliable=True)
        batch = run.prompt.batch()
        run.batch, run.message_id, run.names, run.calls = batch, message.id, {}, {}
        for tool_call in message.tool_calls:
            call_id, name = tool_call.get("id"), tool_call["name"]
            if not call_id:
                continue  # a call without an ID cannot be told apart; the batch stays honest
            if call_id in run.names:
                batch.record_duplicate(call_id, name)
            else:
                run.names[call_id] = name
                batch.admit(call_id)
        return batch

    # -- tool calls -----------------------------------------------------------------------

    def _call_for(self, request: ToolCallRequest) -> ToolCall | None:
        state = request.state
        if not isinstance(state, dict):
            return None
        run = self._runs.get(state.get(_KEY))
        if run is None:
            return None
        call_id = request.tool_call.get("id")
        with run.lock:
            batch = self._batch_for(run, _last_ai(state.get("messages", ())))
            if batch is None or call_id not in run.names or call_id in run.calls:
                return None  # not a call of this batch, or a re-run of one (a resumed interrupt)
            name = run.names[call_id]
            call = batch.start_call(call_id, name, tool_type=_tool_type(request.tool))
            run.calls[call_id] = call
            return call

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        call = quietly(_logger, lambda: self._call_for(request))
        if call is None:
            return handler(request)
        try:
            result = handler(request)
        except BaseException as error:
            quietly(_logger, partial(_settle_raised, call, error))
            raise
        quietly(_logger, partial(_settle_returned, call, request, result))
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call = quietly(_logger, lambda: self._call_for(request))
        if call is None:
            return await handler(request)
        try:
            result = await handler(request)
        except BaseException as error:
            quietly(_logger, partial(_settle_raised, call, error))
            raise
        quietly(_logger, partial(_settle_returned, call, request, result))
        return result


def _last_ai(messages: Sequence[AnyMessage]) -> AIMessage | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message
    return None


def _instrumented_parent() -> context_api.Context | None:
    """The context of OpenInference's span for the running LangChain node, when OpenInference's
    LangChain instrumentation is loaded and on; else ``None`` (the current context).

    That instrumentation builds its spans from LangChain callbacks and never makes them current,
    so without this the prompt span would start a trace of its own, unrelated to the run's
    OpenInference spans, and the guard would decide the run twice: once from the section 3
    spans, once (never enforced) from OpenInference's. Started below the node's span, the
    prompt span is below OpenInference's prompt, which the guard then hands over to it, as it
    does OpenLLMetry's. Read through the instrumentation's public ``get_current_span()``; its
    module is never imported here (it may not be installed), and any failure of the look-up
    leaves the current context.
    """
    module = sys.modules.get(_OPENINFERENCE)
    if module is None:
        return None
    try:
        instrumentor = module.LangChainInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            return None
        span = module.get_current_span()
    except Exception:  # a changed or broken instrumentation never costs the prompt span
        _logger.debug("OpenInference's current LangChain span not read", exc_info=True)
        return None
    if not isinstance(span, Span) or not span.get_span_context().is_valid:
        return None
    return set_span_in_context(span)


def _tool_type(tool: object) -> ToolType:
    """``mcp`` for a tool made by langchain-mcp-adapters, else ``native``.

    Read from where its function was defined, so the adapters package is never imported (it may
    not be installed): it builds each MCP tool as a ``StructuredTool`` around a coroutine of its
    own ``langchain_mcp_adapters.tools`` module, and marks it no other way.
    """
    for function in (getattr(tool, "coroutine", None), getattr(tool, "func", None)):
        module = getattr(function, "__module__", None)
        if isinstance(module, str) and module.split(".", 1)[0] == _MCP_ADAPTERS:
            return "mcp"
    return "native"


def _settle_raised(call: ToolCall, error: BaseException) -> None:
    if isinstance(error, (asyncio.CancelledError, GraphBubbleUp)):
        cancel(call)  # cancelled, or interrupted to wait for a human: never counted
    else:
        settle(call, "error", error_type_of(error))


def _settle_returned(call: ToolCall, request: ToolCallRequest, result: object) -> None:
    if not (isinstance(result, ToolMessage) and result.status == "error"):
        settle(call, "success")
    elif request.tool is None or _arguments_invalid(request):
        settle(call, "not_started")  # an unknown tool, or arguments refused before it ran
    else:
        settle(call, "unknown")  # failed, but the exception was handled before the guard saw it


def _arguments_invalid(request: ToolCallRequest) -> bool:
    tool = request.tool
    schema = getattr(tool, "tool_call_schema", None)
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return False
    try:
        schema.model_validate(request.tool_call.get("args", {}))
    except ValidationError:
        return True
    return False
