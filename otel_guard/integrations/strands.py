"""The repeated-tool-failure guard as a Strands Agents hook provider (extra ``strands``).

::

    from strands import Agent
    from otel_guard import GuardSpanProcessor
    from otel_guard.integrations.strands import RepeatedToolFailureHooks

    guard = GuardSpanProcessor(mode="enforce")
    agent = Agent(model=model, tools=[...], hooks=[RepeatedToolFailureHooks(guard)])

Built on the Strands hook system (strands-agents 1.x): one agent invocation is one prompt
(``BeforeInvocationEvent`` to ``AfterInvocationEvent``) and the tool uses of one assistant
message are one batch (``BeforeToolsEvent``), described with
:mod:`otel_guard.integrations.producer` spans and evaluated in ``AfterToolsEvent``, once every
call has settled and before the model is called again. An invocation that stops for an
interrupt (``stop_reason`` ``interrupt``: a hook asks a human) and the invocation that resumes
it are one prompt, and the batch the interrupt split is evaluated once its last call has a
result:

* a tool that raises is an execution ``error`` typed by the exception's class in snake case
  (Strands hands the exception to ``AfterToolCallEvent``); input that fails a decorated tool's
  schema (Strands raises ``ValueError("Validation failed for input parameters: ...")`` from
  pydantic's ``ValidationError`` before the tool runs) is a validation failure, ``not_started``;
* a call cancelled by a hook (``cancel_tool``, a permission denial) or naming an unknown tool is
  ``not_started``; a call of the message that never ran is ``not_started`` too; a result marked
  ``cancelled`` (a running call the agent cancelled) is ``cancelled``; an error result without an
  exception is ``unknown``: none of them counts;
* MCP tools (``MCPAgentTool``) are ``mcp``, every other tool ``native``. Strands' MCP client
  turns a server's failure (an exception, or an ``isError`` result) into an error result without
  an exception, so such a failure is ``unknown``: the guard never counts it, and it disables
  enforcement for the prompt.

``agent.stream_async(...)`` (and ``invoke_async``) runs the same hooks as a call: a streamed
invocation is guarded the same; a stop streams no text, its stop text is the ``result`` event's
final message.

Modes are the guard's: ``shadow`` (and ``off``) never change the run; in ``warn`` and
``enforce`` the reminder is added as a text block to the message carrying the batch's tool
results, so the next model call reads it; in ``enforce`` the invocation then ends normally with
the stop text as the final assistant message (``AfterToolsEvent.end_turn``), without calling the
model again, and :attr:`RepeatedToolFailureHooks.stopped` names the stopped prompt. One instance
serves one agent; its invocations run one at a time, as Strands requires. Guard bookkeeping never
raises into the agent.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from pydantic import ValidationError
from strands.hooks import (
    AfterInvocationEvent,
    AfterToolCallEvent,
    AfterToolsEvent,
    BeforeInvocationEvent,
    BeforeToolCallEvent,
    BeforeToolsEvent,
    HookProvider,
    HookRegistry,
)
from strands.tools.mcp import MCPAgentTool

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

__all__ = ["RepeatedToolFailureHooks"]

_logger = logging.getLogger(__name__)
_SCOPE = "otel_guard.integrations.strands"


_INVALID_INPUT = "Validation failed for input parameters"
"""How a decorated tool's input validation begins its error, before the tool runs."""


def _invalid_input(error: BaseException) -> bool:
    return (
        type(error) is ValueError
        and str(error).startswith(_INVALID_INPUT)
        and isinstance(error.__cause__, ValidationError)
    )


class RepeatedToolFailureHooks(HookProvider):
    """A Strands hook provider that reports each tool batch to a :class:`GuardSpanProcessor`.

    Args:
        guard: the guard processor; its mode decides what the hooks do.
        tracer_provider: where the spans go. It must have ``guard`` among its span processors.
            When omitted, a private provider holding only the guard is used.
        route, channel: the prompt route markers of docs/contract.md section 3; only
            interactive prompts without the channel marker are guarded.
    """

    def __init__(
        self,
        guard: GuardSpanProcessor,
        *,
        tracer_provider: TracerProvider | None = None,
        route: str | None = None,
        channel: bool = False,
    ) -> None:
        check_route(route)
        self.guard = guard
        self.tracer_provider = tracer_provider or guard_only_provider(guard)
        self.route = route
        self.channel = channel
        self.stopped: str | None = None
        """The prompt ID of the last invocation the guard stopped, else ``None``."""
        self._tracer: Tracer = self.tracer_provider.get_tracer(_SCOPE)
        self._lock = threading.RLock()
        self._prompt: PromptScope | None = None
        self._batch: ToolBatch | None = None
        self._message: tuple[str, ...] | None = None  # tool use IDs of the open batch's message
        self._paused = False  # the last invocation stopped for an interrupt: the next resumes it
        self._names: dict[str, tuple[str, ToolType]] = {}
        self._calls: dict[str, ToolCall] = {}

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._before_invocation)
        registry.add_callback(AfterInvocationEvent, self._after_invocation)
        registry.add_callback(BeforeToolsEvent, self._before_tools)
        registry.add_callback(BeforeToolCallEvent, self._before_tool_call)
        registry.add_callback(AfterToolCallEvent, self._after_tool_call)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    # -- invocation: one prompt -----------------------------------------------------------

    def _before_invocation(self, event: BeforeInvocationEvent) -> None:
        quietly(_logger, self._start)

    def _start(self) -> None:
        with self._lock:
            if self._paused and self._prompt is not None:
                # Resuming from an interrupt (Strands accepts nothing else then): the same
                # prompt, and the batch the interrupt split goes on.
                self._paused = False
                return
            self._end()  # an invocation whose end hook never ran
            self.stopped = None
            self._prompt = start_prompt(
                self._tracer, str(uuid.uuid4()), route=self.route, channel=self.channel
            )

    def _after_invocation(self, event: AfterInvocationEvent) -> None:
        if getattr(event.result, "stop_reason", None) == "interrupt":
            self._paused = True  # a human is asked: the prompt stays open for the resume
            return
        quietly(_logger, self._end)

    def _end(self) -> None:
        with self._lock:
            prompt, self._prompt, self._paused = self._prompt, None, False
            if prompt is None:
                return
            try:
                if self._batch is not None:
                    self._batch.abandon(reliable=True)  # the invocation ended mid-batch
                    self._batch = None
            finally:
                prompt.span.end()

    # -- one assistant message's tool uses are one batch -----------------------------------

    def _before_tools(self, event: BeforeToolsEvent) -> None:
        quietly(_logger, lambda: self._open(event))

    def _open(self, event: BeforeToolsEvent) -> None:
        with self._lock:
            message = _tool_use_ids(event.message)
            if self._prompt is None or (self._batch is not None and self._message == message):
                return  # a batch split by an interrupt stays one batch
            if self._batch is not None:
                self._batch.abandon(reliable=True)
            registry = getattr(event.agent, "tool_registry", None)
            tools = getattr(registry, "registry", {})
            batch = self._batch = self._prompt.batch()
            self._message, self._names, self._calls = message, {}, {}
            for block in event.message.get("content", []):
                use = block.get("toolUse")
                if use is None:
                    continue
                call_id, name = use.get("toolUseId"), use.get("name")
                if not call_id or not name:
                    continue
                if call_id in self._names:
                    batch.record_duplicate(call_id, name)
                    continue
                kind: ToolType = "mcp" if isinstance(tools.get(name), MCPAgentTool) else "native"
                self._names[call_id] = (name, kind)
                batch.admit(call_id)

    def _call(self, call_id: object) -> ToolCall | None:
        with self._lock:
            batch = self._batch
            if batch is None or not isinstance(call_id, str) or call_id not in self._names:
                return None
            call = self._calls.get(call_id)
            if call is None:
                name, kind = self._names[call_id]
                call = self._calls[call_id] = batch.start_call(call_id, name, tool_type=kind)
            return call

    def _before_tool_call(self, event: BeforeToolCallEvent) -> None:
        quietly(_logger, lambda: self._call(event.tool_use.get("toolUseId")))

    def _after_tool_call(self, event: AfterToolCallEvent) -> None:
        quietly(_logger, lambda: self._settle_call(event))

    def _settle_call(self, event: AfterToolCallEvent) -> None:
        call = self._call(event.tool_use.get("toolUseId"))
        if call is None or call.finished:
            return
        if event.retry:
            return  # discarded: the tool runs again
        if event.result.get("cancelled") is True:
            cancel(call)  # cancelled while it ran (an MCP call the agent cancelled)
        elif event.cancel_message is not None or event.selected_tool is None:
            settle(call, "not_started")  # denied by a hook before it ran, or an unknown tool
        elif event.exception is not None and _invalid_input(event.exception):
            settle(call, "not_started")  # the tool never ran: a validation failure
        elif event.exception is not None:
            settle(call, "error", error_type_of(event.exception))
        elif event.result.get("status") == "error":
            settle(call, "unknown")  # an error result with no exception to classify
        else:
            settle(call, "success")

    def _after_tools(self, event: AfterToolsEvent) -> None:
        with self._lock:
            prompt = self._prompt
            answered = _tool_result_ids(event.message)
            if any(call_id not in answered for call_id in self._names):
                return  # interrupted: the rest of the batch runs when the invocation resumes
            evaluated = quietly(_logger, self._settle)
        if prompt is None or not evaluated or self.guard.mode not in ("warn", "enforce"):
            return  # shadow never acts
        action = quietly(_logger, lambda: self.guard.take_action(prompt.prompt_id))
        if action is None:
            return
        if action.kind == "reminder":
            event.message["content"].append({"text": action.text})
        else:
            event.end_turn = action.text
            self.stopped = prompt.prompt_id

    def _settle(self) -> bool:
        batch = self._batch
        if batch is None:
            return False
        for call_id, (name, kind) in self._names.items():
            call = self._calls.get(call_id) or batch.start_call(call_id, name, tool_type=kind)
            settle(call, "not_started")
        self._batch, self._message, self._names, self._calls = None, None, {}, {}
        # Nothing reaches an invocation from outside while its tools run.
        batch.record_input_drain(external=False, queued_prompt=False, reliable=True)
        batch.end()
        return True


def _tool_use_ids(message: Any) -> tuple[str, ...]:
    content = message.get("content", []) if isinstance(message, dict) else []
    return tuple(
        str(block["toolUse"].get("toolUseId"))
        for block in content
        if isinstance(block, dict) and isinstance(block.get("toolUse"), dict)
    )


def _tool_result_ids(message: Any) -> set[str]:
    content = message.get("content", []) if isinstance(message, dict) else []
    return {
        str(block["toolResult"].get("toolUseId"))
        for block in content
        if isinstance(block, dict) and isinstance(block.get("toolResult"), dict)
    }
