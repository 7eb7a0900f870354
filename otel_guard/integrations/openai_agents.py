"""The repeated-tool-failure guard as OpenAI Agents SDK run hooks (extra ``openai-agents``).

::

    from agents import Agent, Runner
    from otel_guard import GuardSpanProcessor
    from otel_guard.integrations.openai_agents import RepeatedToolFailureHooks

    guard = GuardSpanProcessor(mode="enforce")
    with RepeatedToolFailureHooks(guard) as hooks:   # one run at a time
        result = await Runner.run(agent, "...", hooks=hooks, run_config=hooks.run_config())

Built on the SDK's ``RunHooks`` and two ``RunConfig`` callbacks (openai-agents 0.24): one run is
one prompt (first ``on_agent_start`` to ``on_agent_end``), and the function calls of one model
response (``on_llm_end``) are one batch, described with :mod:`otel_guard.integrations.producer`
spans and evaluated in ``call_model_input_filter``, before the next model call:

* a function tool that raises is an execution ``error`` typed by the exception's class in snake
  case; the SDK turns the exception into a message for the model and hands it to
  ``RunConfig.tool_error_formatter`` first, which is where the guard reads it (a formatter
  already in the base ``RunConfig`` still decides the message);
* arguments the SDK cannot parse or that fail the tool's schema (it raises
  ``ModelBehaviorError("Invalid JSON input for tool ...")`` before the tool runs) are a
  validation failure, ``not_started``;
* an approval rejection and a call to an unknown tool are ``not_started``; a cancelled call
  (the SDK answers it with its default failure message without calling the formatter) is
  ``cancelled``; a call of the response that never ran (the run ended first) is
  ``not_started``: none of them counts;
* handoffs and hosted tools are not tool calls of a batch.

Modes are the guard's: ``shadow`` (and ``off``) never change the run; in ``warn`` and
``enforce`` the reminder is appended to the next model request's input as a ``system`` message
(that request only: the SDK's filter does not write history); in ``enforce`` the run then raises
:class:`RepeatedToolFailureStopped` from the input filter once the next matching failing batch
has settled, instead of calling the model again.

Limits: a tool with its own ``failure_error_function`` bypasses the formatter, so its failures
reach the guard as successes (never counted as failures, but they may reset a streak).

A function tool the SDK listed from one of the agent's ``mcp_servers`` is recorded ``mcp`` (its
tool origin, ``get_function_tool_origin``, is of type ``mcp``), every other call ``native``; a
call that never reached a tool is ``native``. The SDK hands an MCP tool's exception to the tool's
failure function, never to the formatter, so the hooks wrap that function of each MCP tool when
it starts (its message is unchanged): a server failure is an execution ``error`` typed by the
exception (the cause of the SDK's wrapping ``AgentsException``), an MCP cancellation
``cancelled``. A result the server flags ``isError`` reaches the model as ordinary output and
the guard as a success. Streamed runs (``Runner.run_streamed``) are
guarded the same: the SDK calls the same hooks and callbacks, and a stop raises from
``stream_events()``. Guard bookkeeping never raises into the agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from agents import (
    Agent,
    AgentsException,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Tool,
    default_tool_error_function,
)
from agents.exceptions import MCPToolCancellationError, ModelBehaviorError
from agents.handoffs import Handoff, handoff
from agents.items import ModelResponse, TResponseInputItem
from agents.run_config import CallModelData, ModelInputData, ToolErrorFormatterArgs
from agents.tool import (
    FunctionTool,
    ToolOriginType,
    get_function_tool_origin,
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from otel_guard.guard.processor import GuardSpanProcessor
from otel_guard.integrations._hooks import (
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

__all__ = ["RepeatedToolFailureHooks", "RepeatedToolFailureStopped"]

_logger = logging.getLogger(__name__)
_SCOPE = "otel_guard.integrations.openai_agents"


class RepeatedToolFailureStopped(AgentsException):
    """An ``enforce`` guard stopped the run after its reminder did not change the failing approach.

    Raised from ``Runner.run`` instead of the next model call. ``message`` is the guard's fixed
    stop text; ``input`` is the model input the call would have had (the tool outputs of the
    settled batch included) with the stop text as a final ``system`` message: pass it as the next
    run's input, with new user input, to go on.
    """

    def __init__(self, message: str, *, prompt_id: str, input: list[TResponseInputItem]) -> None:
        super().__init__(message)
        self.message = message
        self.prompt_id = prompt_id
        self.input = input


class RepeatedToolFailureHooks(RunHooks[Any]):
    """Run hooks that report each tool batch of one run to a :class:`GuardSpanProcessor`.

    Pass the instance as ``hooks=`` and :meth:`run_config` as ``run_config=`` of the same
    ``Runner.run`` call. Each run is one prompt: an instance serves one run at a time, and a run
    started after the previous one ended (its last agent ended, it was stopped, or
    :meth:`close` was called) is a new prompt, with a new ID unless ``prompt_id`` was given.

    Args:
        guard: the guard processor; its mode decides what the hooks do.
        tracer_provider: where the spans go. It must have ``guard`` among its span processors.
            When omitted, a private provider holding only the guard is used.
        route, channel: the prompt route markers of docs/contract.md section 3; only
            interactive prompts without the channel marker are guarded.
        prompt_id: the prompt ID of every run (a new UUID for each run when omitted).
    """

    def __init__(
        self,
        guard: GuardSpanProcessor,
        *,
        tracer_provider: TracerProvider | None = None,
        route: str | None = None,
        channel: bool = False,
        prompt_id: str | None = None,
    ) -> None:
        check_route(route)
        self.guard = guard
        self.tracer_provider = tracer_provider or guard_only_provider(guard)
        self.route = route
        self.channel = channel
        self._fixed_id = prompt_id
        self.prompt_id = prompt_id or str(uuid.uuid4())
        self._tracer: Tracer = self.tracer_provider.get_tracer(_SCOPE)
        self._lock = threading.RLock()
        self._prompt: PromptScope | None = None
        self._ended = False
        self._warned = False  # a run without run_config() was logged
        self._batch: ToolBatch | None = None
        self._names: dict[str, str] = {}
        self._calls: dict[str, ToolCall] = {}

    def run_config(self, base: RunConfig | None = None) -> RunConfig:
        """``base`` (or a default ``RunConfig``) with the guard's input filter and error formatter.

        A filter or formatter already in ``base`` still runs: the filter first, then the guard's
        additions; the formatter's message is the one the model sees.
        """
        base = base or RunConfig()
        inner_filter, inner_formatter = base.call_model_input_filter, base.tool_error_formatter

        async def call_model_input_filter(data: CallModelData[Any]) -> ModelInputData:
            if inner_filter is not None:
                filtered = inner_filter(data)
                data.model_data = await filtered if inspect.isawaitable(filtered) else filtered
            return self._before_model(data.model_data)

        async def tool_error_formatter(args: ToolErrorFormatterArgs[Any]) -> str | None:
            quietly(_logger, lambda: self._tool_error(args))
            if inner_formatter is None:
                return None
            message = inner_formatter(args)
            return await message if inspect.isawaitable(message) else message

        return dataclasses.replace(
            base,
            call_model_input_filter=call_model_input_filter,
            tool_error_formatter=tool_error_formatter,
        )

    def close(self, error: BaseException | None = None) -> None:
        """End the prompt now (for a run that raised: the SDK calls no hook then). Idempotent.

        ``error`` is what the run raised, if known: a call it left running ends ``cancelled``
        when that was a cancellation.
        """
        quietly(_logger, lambda: self._end(error))

    def __enter__(self) -> RepeatedToolFailureHooks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(exc)

    # -- run: one prompt ------------------------------------------------------------------

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        quietly(_logger, self._start)

    async def on_agent_end(self, context: Any, agent: Agent[Any], output: Any) -> None:
        quietly(_logger, lambda: self._end(None))

    def _start(self) -> None:
        with self._lock:
            if self._prompt is None:
                if self._ended:  # the previous run ended: this is the next one, a new prompt
                    self.prompt_id = self._fixed_id or str(uuid.uuid4())
                    self._ended = False
                self._prompt = start_prompt(
                    self._tracer, self.prompt_id, route=self.route, channel=self.channel
                )

    def _end(self, error: BaseException | None) -> None:
        with self._lock:
            prompt, self._prompt, self._ended = self._prompt, None, True
            if prompt is None:
                return
            try:
                self._settle(error)
            finally:
                prompt.span.end()

    # -- model calls: a response's function calls are a batch -----------------------------

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        quietly(_logger, lambda: self._open(agent, response))

    def _open(self, agent: Agent[Any], response: ModelResponse) -> None:
        handoffs = {(h if isinstance(h, Handoff) else handoff(h)).tool_name for h in agent.handoffs}
        calls = [
            (item.call_id, item.name)
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall) and item.name not in handoffs
        ]
        with self._lock:
            if self._prompt is None or not calls:
                return
            if self._batch is not None:
                # The previous response's batch never settled: no model call went through the
                # guard's input filter, so the run lacks hooks.run_config() and its failures
                # never reached the formatter. Its outcomes cannot be trusted.
                if not self._warned:
                    self._warned = True
                    _logger.warning(
                        "otel_guard: RepeatedToolFailureHooks needs run_config=hooks.run_config() "
                        "on the same run; without it tool failures are not seen and nothing is "
                        "enforced"
                    )
                self._batch.abandon()  # unreliable: enforcement off for the prompt
            batch = self._batch = self._prompt.batch()
            self._names, self._calls = {}, {}
            for call_id, name in calls:
                if call_id in self._names:
                    batch.record_duplicate(call_id, name)
                else:
                    self._names[call_id] = name
                    batch.admit(call_id)

    def _before_model(self, data: ModelInputData) -> ModelInputData:
        evaluated = quietly(_logger, self._settle)
        if not evaluated or self.guard.mode not in ("warn", "enforce"):
            return data  # shadow never acts
        action = quietly(_logger, lambda: self.guard.take_action(self.prompt_id))
        if action is None:
            return data
        note: TResponseInputItem = {"role": "system", "content": action.text}
        if action.kind == "reminder":
            return ModelInputData(input=[*data.input, note], instructions=data.instructions)
        quietly(_logger, lambda: self._end(None))
        raise RepeatedToolFailureStopped(
            action.text, prompt_id=self.prompt_id, input=[*data.input, note]
        )

    def _settle(self, error: BaseException | None = None) -> bool:
        """Evaluate the open batch, if any: calls that never ran are ``not_started``.

        A call that started and never settled (the run raised out of it, ``error`` if known)
        did not run to an outcome: the batch is torn down, incomplete, and such calls end after
        it (``cancelled`` for a cancellation, else of unknown execution), never ``not_started``.
        """
        with self._lock:
            batch = self._batch
            if batch is None:
                return False
            names, calls = self._names, self._calls
            self._batch, self._names, self._calls = None, {}, {}
            if any(not call.finished for call in calls.values()):
                batch.abandon(error, reliable=True)
                return True
            for call_id, name in names.items():
                settle(calls.get(call_id) or batch.start_call(call_id, name), "not_started")
            # Nothing reaches a run from outside between its turns.
            batch.record_input_drain(external=False, queued_prompt=False, reliable=True)
            batch.end()
            return True

    # -- tool calls -----------------------------------------------------------------------

    def _call(self, call_id: object, start: bool, tool: object = None) -> ToolCall | None:
        with self._lock:
            batch = self._batch
            if batch is None or not isinstance(call_id, str) or call_id not in self._names:
                return None
            call = self._calls.get(call_id)
            if call is None and start:
                name = self._names[call_id]
                call = batch.start_call(call_id, name, tool_type=_tool_type(tool))
                self._calls[call_id] = call
            return call

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Tool) -> None:
        if isinstance(context, ToolContext):
            quietly(_logger, lambda: self._call(context.tool_call_id, start=True, tool=tool))
            if _tool_type(tool) == "mcp":
                quietly(_logger, lambda: self._watch_mcp_failures(tool))

    def _watch_mcp_failures(self, tool: Tool) -> None:
        """Read an MCP tool's failures where the SDK formats them.

        The SDK hands an MCP tool's exception to the tool's own failure function (the server's,
        else the default message), never to ``tool_error_formatter``; without this, a failure
        would end with the default message, which only a cancellation gives other tools.
        """
        if not isinstance(tool, FunctionTool):
            return
        current = resolve_function_tool_failure_error_function(tool)
        if isinstance(current, _WatchedFailures):
            if current.hooks is self:
                return
            current = current.inner  # a tool object kept from an earlier run's hooks
        if current is None:
            return  # no failure function: the exception ends the run
        set_function_tool_failure_error_function(tool, _WatchedFailures(self, current))

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Any, tool: Tool, result: object
    ) -> None:
        if not isinstance(context, ToolContext):
            return
        call = quietly(_logger, lambda: self._call(context.tool_call_id, start=False))
        if call is None or call.execution_status is not None:
            return
        if result == default_tool_error_function(context, Exception()):
            # The SDK's default failure message without a formatter call: only a cancellation
            # (which the SDK keeps from the formatter) is handled that way.
            quietly(_logger, lambda: cancel(call))
        else:
            quietly(_logger, lambda: settle(call, "success"))

    def _mcp_failure(self, context: RunContextWrapper[Any], error: Exception) -> None:
        if not isinstance(context, ToolContext):
            return
        call = self._call(context.tool_call_id, start=True)
        if call is None or call.finished or call.execution_status is not None:
            return
        if isinstance(error, MCPToolCancellationError) or isinstance(
            getattr(error, "cancelled_error", None), asyncio.CancelledError
        ):
            cancel(call)
            return
        # The SDK wraps a server call's unexpected exception; the cause names the failure.
        cause = error.__cause__
        typed = cause if type(error) is AgentsException and cause is not None else error
        settle(call, "error", error_type_of(typed))

    def _tool_error(self, args: ToolErrorFormatterArgs[Any]) -> None:
        if args.kind == "tool_exception":
            call = self._call(args.call_id, start=True)
            if call is None or call.finished:
                return
            if args.error is None:
                settle(call, "unknown")
            elif _invalid_arguments(args.error):
                settle(call, "not_started")  # the tool never ran: a validation failure
            else:
                settle(call, "error", error_type_of(args.error))
        else:  # approval_rejected, tool_not_found: the tool never ran
            call = self._call(args.call_id, start=True)
            if call is not None:
                settle(call, "not_started")


_INVALID_ARGUMENTS = "Invalid JSON input for tool"
"""How the SDK's argument parsing and schema validation begin their error, before the tool runs
(the SDK itself tells these errors apart by this prefix)."""


def _invalid_arguments(error: BaseException) -> bool:
    return isinstance(error, ModelBehaviorError) and str(error).startswith(_INVALID_ARGUMENTS)


def _tool_type(tool: object) -> ToolType:
    """``mcp`` for a function tool the SDK listed from an MCP server, else ``native``.

    The SDK marks the tools it converts from an MCP server's list (``MCPUtil``) with a tool
    origin of type ``mcp``; every other function tool has origin ``function``.
    """
    if isinstance(tool, FunctionTool):
        origin = get_function_tool_origin(tool)
        if origin is not None and origin.type == ToolOriginType.MCP:
            return "mcp"
    return "native"


class _WatchedFailures:
    """An MCP tool's failure function that tells the hooks of the failure first."""

    def __init__(self, hooks: RepeatedToolFailureHooks, inner: Callable[..., Any]) -> None:
        self.hooks = hooks
        self.inner = inner

    def __call__(self, context: RunContextWrapper[Any], error: Exception) -> Any:
        quietly(_logger, lambda: self.hooks._mcp_failure(context, error))
        return self.inner(context, error)
