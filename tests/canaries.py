"""Canary strings, and an agent that puts them in every sensitive place of its spans."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

from hypothesis import strategies as st
from opentelemetry.trace import Span, Status, StatusCode, Tracer, set_span_in_context

from otel_guard import GuardSpanProcessor


@dataclass(frozen=True)
class Canaries:
    """One canary per sensitive place; each starts with a marker found nowhere else."""

    tool: str
    arguments: str
    result: str
    error_message: str
    status: str
    path: str
    mcp_server: str
    user_id: str
    error_type: str  # free text, as agents put in error.type / the execution error type

    def markers(self) -> Iterator[tuple[str, str]]:
        yield from zip(self.__dataclass_fields__, astuple(self), strict=True)


FIXED = Canaries(
    tool="CnryToolZq-read_secret_notes",
    arguments='CnryArgsZq {"password": "hunter2"}',
    result="CnryResultZq SSN 078-05-1120",
    error_message="CnryErrorZq: permission denied for token sk-live-123",
    status="CnryStatusZq: disk quota exceeded",
    path="CnryPathZq/home/alice/.ssh",
    mcp_server="CnryMcpZq-corp-files",
    user_id="CnryUserZq-alice@example.com",
    error_type="CnryTypeZq Connection reset by peer",
)
MARKER_LENGTH = len("CnryToolZq")


def _canary(tag: str, alphabet: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    # A fixed marker (upper case, so never a classified error type) followed by any text.
    tail = st.text(max_size=16) if alphabet is None else st.text(alphabet, max_size=16)
    return tail.map(lambda tail: f"Cnry{tag}Zq{tail}")


CANARIES = st.builds(
    Canaries,
    tool=_canary("Tool"),
    arguments=_canary("Args"),
    result=_canary("Result"),
    error_message=_canary("Error"),
    status=_canary("Status"),
    # A file name holds neither NUL nor lone surrogates.
    path=_canary("Path", st.characters(exclude_categories=("Cs",), exclude_characters="\x00")),
    mcp_server=_canary("Mcp"),
    user_id=_canary("User"),
    # Free text (a space is never in a classified type); classified types are kept by design.
    error_type=_canary("Type").map(lambda text: f"{text} (free text)"),
)


def leaks(outputs: Mapping[str, bytes], canaries: Canaries) -> list[tuple[str, str]]:
    """(canary place, output) for every canary, or its marker, found in an output."""
    found = []
    for place, value in canaries.markers():
        for needle in {value.encode(), value[:MARKER_LENGTH].encode()}:
            found.extend((place, output) for output, data in outputs.items() if needle in data)
    return found


def failing_exception(c: Canaries) -> OSError:
    """A real exception whose message and stack trace (its source file) carry canaries."""
    code = compile("def call_tool():\n    raise OSError(message)\n\ncall_tool()\n", c.path, "exec")
    try:
        exec(code, {"message": f"{c.error_message} reading {c.path}"})
    except OSError as exc:
        return exc
    raise AssertionError("the tool did not fail")


@dataclass(frozen=True)
class Call:
    """One tool call: the guard's view of it (the canaries are added to every call)."""

    tool: str
    status: str = "error"
    execution: str = "error"
    error_type: str | None = "exit_nonzero"
    tool_type: str = "mcp"


EXPECTED_DECISIONS = {
    "shadow": {"tracked": 3, "would_warn": 1, "would_stop": 1, "reset": 3},
    "warn": {"tracked": 3, "warned": 1, "would_stop": 1, "reset": 3},
    "enforce": {"tracked": 3, "warned": 1, "stopped": 1, "reset": 3},
}
"""The decisions :meth:`CanaryAgent.run` produces in each mode."""

EXPECTED_ACTIONS = {"shadow": [], "warn": ["reminder"], "enforce": ["reminder", "stop"]}
TOOL_SPANS = 4 * 3 + 1 + 2 + 1 + 2 + 2
"""Tool-call spans :meth:`CanaryAgent.run` produces."""


class CanaryAgent:
    """Emits an agent's prompt, batch and tool-call spans, canaries everywhere, to a guard."""

    def __init__(self, tracer: Tracer, guard: GuardSpanProcessor, canaries: Canaries) -> None:
        self.tracer = tracer
        self.guard = guard
        self.c = canaries
        self.actions: list[str] = []
        self._calls = 0
        self._last_tool: Span | None = None

    def run(self) -> None:
        """Loop, free-text error type, recovery and a late frame, one prompt each."""
        c = self.c
        looping = Call(c.tool)
        a = self.prompt("prompt-loop")
        for _ in range(3):  # tracked, then (would_)warn, then (would_)stop
            self.batch(a, "prompt-loop", [looping] * 4)
        a.end()

        b = self.prompt("prompt-free-text")  # an unclassified error type: reset `unknown`
        self.batch(b, "prompt-free-text", [Call(c.tool, error_type=c.error_type)])
        b.end()

        d = self.prompt("prompt-recovery")  # tracked, then the tool succeeds: reset `success`
        self.batch(d, "prompt-recovery", [looping] * 2)
        self.batch(d, "prompt-recovery", [Call(c.tool, "success", "success", None)])
        d.end()

        e = self.prompt("prompt-late")  # tracked, then an incomplete batch and a late frame
        self.batch(e, "prompt-late", [looping] * 2)
        (late,) = self.batch(e, "prompt-late", [looping] * 2, leave_open=1)
        late.end()
        e.end()

    def prompt(self, prompt_id: str) -> Span:
        return self.tracer.start_span(
            "invoke_agent",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "acp.prompt.id": prompt_id,
                "gen_ai.input.messages": f"[{self.c.arguments}]",
                "gen_ai.output.messages": f"[{self.c.result}]",
                "user.id": self.c.user_id,
            },
        )

    def batch(
        self, prompt: Span, prompt_id: str, calls: Sequence[Call], leave_open: int = 0
    ) -> list[Span]:
        """One settled batch; returns the tool spans left open (they end late)."""
        batch_span = self.tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        context = set_span_in_context(batch_span)
        spans = [self._tool(call, context) for call in calls]
        ending = len(spans) - leave_open
        for span in spans[:ending]:
            span.end()
        batch_span.set_attributes(
            {
                "acp.batch.admitted": len(spans),
                "acp.input.external": False,
                "acp.input.queued_prompt": False,
                "acp.input.reliable": True,
            }
        )
        batch_span.end()
        action = self.guard.take_action(prompt_id)
        if action is not None:
            self.actions.append(action.kind)
        return spans[ending:]

    def _tool(self, call: Call, context: Any) -> Span:
        c = self.c
        self._calls += 1
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "gen_ai.tool.call.id": f"call-{self._calls}",
            "acp.tool.type": call.tool_type,
            "acp.tool.status": call.status,
            "acp.tool.execution.status": call.execution,
            # Every sensitive key an agent may set on a tool-call span.
            "gen_ai.tool.call.arguments": c.arguments,
            "gen_ai.tool.call.result": c.result,
            "tool_arguments": c.arguments,
            "function_args": c.arguments,
            "tool_response": c.result,
            "error": c.error_message,
            "error.type": c.error_type,
            "file.path": c.path,
            "mcp.server.name": c.mcp_server,
            "user.id": c.user_id,
            "enduser.id": c.user_id,
        }
        if call.error_type is not None:
            attributes["acp.tool.execution.error_type"] = call.error_type
        span = self.tracer.start_span(
            f"execute_tool {call.tool}", context=context, attributes=attributes
        )
        if self._last_tool is not None:
            span.add_link(self._last_tool.get_span_context(), {"mcp.server.name": c.mcp_server})
        span.add_event("tool.output", {"gen_ai.tool.call.result": c.result, "file.path": c.path})
        if call.status == "error":
            span.record_exception(failing_exception(c), attributes={"user.id": c.user_id})
            span.set_status(Status(StatusCode.ERROR, f"{c.status} ({c.error_type})"))
        self._last_tool = span
        return span
