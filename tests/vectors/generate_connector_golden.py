"""Generate the Go connector's golden inputs and the replay's numbers for them.

Run as a script (``python tests/vectors/generate_connector_golden.py``). It writes, under
``collector/repeatedtoolfailureguardconnector/testdata/``:

* ``demo-traces.jsonl``: a copy of ``examples/demo-traces.jsonl`` (the section 3 profile);
* ``genai-traces.jsonl``: GenAI-conventions agents (section 3b) built with the SDK, with fixed IDs
  and times so the file is the same on every run (one of them with the section 3 spans of an
  integration inside its run, which it is handed over to);
* ``openinference-traces.jsonl``: OpenInference agents (section 3c), built the same way: session
  and span-ID prompt IDs, a root chain as the prompt with agent spans nested in it, error types
  from ``error.type`` and from exception events, free text, tools below an ended model call, and
  an integration's section 3 spans below a node span, handed over;
* ``section3-traces.jsonl``: section 3 prompts whose batch spans are traces of their own (a host
  that starts each batch span without a parent): an opted-out prompt, a guarded one, a prompt
  span that ended before its batches, and two prompt spans open at once with one ID;
* ``expected.json``: what ``otel-guard replay --format json`` reports for each of them.

The Go test ``TestDecisionCountsEqualReplay`` asserts the connector's decision counts equal these;
``tests/test_connector_golden.py`` asserts the Python replay still gives them and that this
script's output is committed.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    StatusCode,
    TraceFlags,
    Tracer,
    set_span_in_context,
)

from otel_guard.replay.otlp_json import encode_request

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "collector" / "repeatedtoolfailureguardconnector" / "testdata"
FILES = (
    "demo-traces.jsonl",
    "genai-traces.jsonl",
    "openinference-traces.jsonl",
    "section3-traces.jsonl",
)
BASE_NS = 1_764_633_600_000_000_000  # 2025-12-02T00:00:00Z
MS = 1_000_000


class _Counting(IdGenerator):
    def __init__(self) -> None:
        self._span = 0x1000
        self._trace = 0xA000

    def generate_span_id(self) -> int:
        self._span += 1
        return self._span

    def generate_trace_id(self) -> int:
        self._trace += 1
        return self._trace << 64 | self._trace


class _Clock:
    def __init__(self) -> None:
        self.now = BASE_NS

    def tick(self, ms: int = 1) -> int:
        self.now += ms * MS
        return self.now


def _recorded(resource: Resource, write: Callable[[Tracer, _Clock], None]) -> list[ReadableSpan]:
    """The spans ``write`` makes with a tracer whose IDs count up and a clock that starts at
    :data:`BASE_NS`, so that the file is the same on every run."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, id_generator=_Counting())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    write(provider.get_tracer("golden"), _Clock())
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _tool(
    tracer: Tracer, clock: _Clock, parent: Span, name: str, call: str, error: str | None
) -> Span:
    span = tracer.start_span(
        f"execute_tool {name}",
        context=set_span_in_context(parent),
        start_time=clock.tick(),
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call,
        },
    )
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(StatusCode.ERROR)
    return span


def _chat(tracer: Tracer, clock: _Clock, parent: Span) -> Span:
    return tracer.start_span(
        "chat",
        context=set_span_in_context(parent),
        start_time=clock.tick(),
        attributes={"gen_ai.operation.name": "chat"},
    )


def _agent(
    tracer: Tracer,
    clock: _Clock,
    conversation: str | None,
    rounds: Sequence[Sequence[tuple[str, str | None]]],
    late_last_tool: bool = False,
    nested: bool = False,
    caller: SpanContext | None = None,
) -> None:
    """One prompt: before each round a model call, then the round's tool calls. ``caller``: the
    remote parent of the prompt span (a propagated ``traceparent``)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent"}
    if conversation is not None:
        attributes["gen_ai.conversation.id"] = conversation
    prompt = tracer.start_span(
        "invoke_agent",
        context=None if caller is None else set_span_in_context(NonRecordingSpan(caller)),
        start_time=clock.tick(),
        attributes=attributes,
    )
    parent = prompt
    if nested:
        parent = tracer.start_span(
            "invoke_agent inner",
            context=set_span_in_context(prompt),
            start_time=clock.tick(),
            attributes={"gen_ai.operation.name": "invoke_agent"},
        )
    held: Span | None = None
    for number, calls in enumerate(rounds):
        model = _chat(tracer, clock, parent)
        if held is not None:
            held.end(end_time=clock.tick())  # ends after the next model call started: late
            held = None
        model.end(end_time=clock.tick(5))
        for index, (name, error) in enumerate(calls):
            span = _tool(tracer, clock, parent, name, f"call-{number}-{index}", error)
            if late_last_tool and number == 1 and index == len(calls) - 1:
                held = span
            else:
                span.end(end_time=clock.tick(2))
    closing = _chat(tracer, clock, parent)
    closing.end(end_time=clock.tick(5))
    if held is not None:
        held.end(end_time=clock.tick())
    if parent is not prompt:
        parent.end(end_time=clock.tick())
    prompt.end(end_time=clock.tick())


def _section_3_run(
    tracer: Tracer,
    clock: _Clock,
    node: Span,
    name: str,
    rounds: int,
    failure: tuple[str, str],
    model: Callable[[], None],
    framework_call: Callable[[str], None],
) -> None:
    """An integration's section 3 run (prompt ID ``name``-1) below an instrumentation's ``node``
    span, which ends right after the integration's prompt span starts. Each round: the
    instrumentation's model call (``model``), then a batch of two calls, each written by the
    instrumentation (``framework_call``) and by the integration, failing with ``failure``
    (tool, classified error type)."""
    prompt_id = f"{name}-1"
    tool, error_type = failure
    acp = tracer.start_span(
        "invoke_agent",
        context=set_span_in_context(node),
        start_time=clock.tick(),
        attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
    )
    node.end(end_time=clock.tick())
    for number in range(rounds):
        model()
        batch = tracer.start_span(
            "tool_batch",
            context=set_span_in_context(acp),
            start_time=clock.tick(),
            attributes={"acp.prompt.id": prompt_id, "acp.batch.admitted": 2},
        )
        for index in range(2):
            call = f"{name}-{number}-{index}"
            framework_call(call)
            section_3 = tracer.start_span(
                f"execute_tool {tool}",
                context=set_span_in_context(batch),
                start_time=clock.tick(),
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": call,
                    "acp.tool.type": "native",
                    "acp.tool.status": "error",
                    "acp.tool.execution.status": "error",
                    "acp.tool.execution.error_type": error_type,
                },
            )
            section_3.end(end_time=clock.tick(2))
        batch.set_attribute("acp.input.reliable", True)
        batch.end(end_time=clock.tick())
    acp.end(end_time=clock.tick())


def _handed_over(tracer: Tracer, clock: _Clock, rounds: int) -> None:
    """OpenLLMetry's LangGraph run around the LangChain integration: ``invoke_agent LangGraph``,
    a nested workflow prompt span, a node span that ends right after the integration's section 3
    prompt span starts below it, the framework's model and tool spans below the workflow and the
    integration's batch spans below its prompt span. The inferred prompt is handed over: only
    the section 3 batches are decided."""
    outer = tracer.start_span(
        "invoke_agent LangGraph",
        start_time=clock.tick(),
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-lg"},
    )
    workflow = tracer.start_span(
        "LangGraph.workflow",
        context=set_span_in_context(outer),
        start_time=clock.tick(),
        attributes={"gen_ai.operation.name": "invoke_agent"},
    )
    node = tracer.start_span(
        "execute_task before_agent",
        context=set_span_in_context(workflow),
        start_time=clock.tick(),
        attributes={"gen_ai.operation.name": "execute_task"},
    )

    def model() -> None:
        _chat(tracer, clock, workflow).end(end_time=clock.tick(5))

    def framework_call(call: str) -> None:
        _tool(tracer, clock, workflow, "read_file", call, "FileNotFoundError").end(
            end_time=clock.tick(2)
        )

    _section_3_run(
        tracer, clock, node, "lg", rounds, ("read_file", "filenotfounderror"), model, framework_call
    )
    workflow.end(end_time=clock.tick())
    outer.end(end_time=clock.tick())


def genai_spans() -> list[ReadableSpan]:
    return _recorded(
        Resource(
            {
                "service.name": "genai-agent",
                "service.version": "2.1.0",
                "deployment.environment.name": "staging",
            }
        ),
        _write_genai,
    )


def _write_genai(tracer: Tracer, clock: _Clock) -> None:
    fail = [("read_file", "FileNotFoundError")] * 4
    # A loop: tracked, would_warn, would_stop, then latched.
    _agent(tracer, clock, "conv-loop", [fail] * 5)
    # A recovery: the failing tool succeeds.
    _agent(tracer, clock, "conv-recover", [fail, fail[:2], [("read_file", None)]])
    # Without a conversation ID (the span ID names the prompt), mixed error types.
    _agent(tracer, clock, None, [fail, [("read_file", "PermissionError"), *fail[:1]]])
    # A free-text error type is unknown.
    _agent(tracer, clock, "conv-free-text", [fail, [("read_file", "No such file!")]])
    # A tool span that ends after the next model call started: its batch is incomplete.
    _agent(tracer, clock, "conv-late", [fail, fail, fail], late_last_tool=True)
    # Nested invoke_agent spans: the outermost is the prompt.
    _agent(tracer, clock, "conv-nested", [fail] * 3, nested=True)
    # Called by another service: the prompt span's parent is remote, so it is the local root.
    caller = SpanContext(0x7E57_C0FFEE, 0xCA11E5, is_remote=True, trace_flags=TraceFlags(1))
    _agent(tracer, clock, "conv-remote", [fail] * 3, caller=caller)
    # A caller invoking the agent twice in one trace: two local roots, two prompts.
    for call in (1, 2):
        caller = SpanContext(
            0x7E57_BEEF, 0xCA11E5 + call, is_remote=True, trace_flags=TraceFlags(1)
        )
        _agent(tracer, clock, None, [fail] * 3, caller=caller)
    # A section 3 prompt span below the GenAI prompt, through an ended node span: handed over.
    _handed_over(tracer, clock, rounds=3)


def _oi(tracer: Tracer, clock: _Clock, kind: str, parent: Span | None, **attributes: Any) -> Span:
    return tracer.start_span(
        kind.lower(),
        context=None if parent is None else set_span_in_context(parent),
        start_time=clock.tick(),
        attributes={"openinference.span.kind": kind, **attributes},
    )


def _oi_tool(
    tracer: Tracer, clock: _Clock, parent: Span, call: str, outcome: tuple[str, str] | None
) -> None:
    """A TOOL span; ``outcome``: None (success), ``("error.type", T)``, ``("event", T)`` (status
    ERROR and an exception event of type T), ``("status", "")`` (status ERROR alone), or with
    the status left unset ``("error.type only", T)`` (an error all the same) and ``("event
    only", T)`` (a success: an exception recorded and handled)."""
    id_key = "tool.id" if call.endswith("-i") else "tool_call.id"
    span = _oi(tracer, clock, "TOOL", parent, **{"tool.name": "read_file", id_key: call})
    if outcome is not None:
        how, error = outcome
        if how.startswith("error.type"):
            span.set_attribute("error.type", error)
        elif how.startswith("event"):
            span.add_event(
                "exception",
                {"exception.type": error, "exception.message": "no such file"},
                timestamp=clock.tick(),
            )
        if not how.endswith(" only"):
            span.set_status(StatusCode.ERROR)
    span.end(end_time=clock.tick(2))


def _oi_agent(
    tracer: Tracer,
    clock: _Clock,
    rounds: Sequence[Sequence[tuple[str, str] | None]],
    *,
    root: str = "AGENT",
    session: str | None = None,
    nested_agent: bool = False,
    under_model: bool = False,
) -> None:
    """One OpenInference prompt: before each round an LLM span, then the round's TOOL spans below
    a ``tools`` chain (or below the LLM span, ended first, with ``under_model``).
    ``nested_agent``: an AGENT node span below the root, ended at once, as LangGraph's
    middleware nodes are (the root stays the prompt)."""
    attributes = {} if session is None else {"session.id": session}
    prompt = _oi(tracer, clock, root, None, **attributes)
    if nested_agent:
        _oi(tracer, clock, "AGENT", prompt).end(end_time=clock.tick())
    for number, calls in enumerate(rounds):
        model = _oi(tracer, clock, "LLM", prompt)
        model.end(end_time=clock.tick(5))
        parent = model if under_model else _oi(tracer, clock, "CHAIN", prompt)
        for index, outcome in enumerate(calls):
            suffix = "-i" if index % 2 else ""
            _oi_tool(tracer, clock, parent, f"oi-{number}-{index}{suffix}", outcome)
        if parent is not model:
            parent.end(end_time=clock.tick())
    _oi(tracer, clock, "LLM", prompt).end(end_time=clock.tick(5))
    prompt.end(end_time=clock.tick())


def _oi_handed_over(tracer: Tracer, clock: _Clock, rounds: int) -> None:
    """OpenInference's LangGraph run around the LangChain integration: a root ``LangGraph``
    chain, the middleware's ``before_agent`` node (an AGENT span) that ends right after the
    integration's section 3 prompt span starts below it, the instrumentation's TOOL spans below
    the root and the integration's batch spans below its prompt span: handed over, only the
    section 3 batches are decided."""
    graph = _oi(tracer, clock, "CHAIN", None)
    node = _oi(tracer, clock, "AGENT", graph)

    def model() -> None:
        _oi(tracer, clock, "LLM", graph).end(end_time=clock.tick(5))

    def framework_call(call: str) -> None:
        _oi_tool(tracer, clock, graph, call, ("error.type", "ToolException"))

    _section_3_run(
        tracer, clock, node, "oi-lg", rounds, ("run_shell", "tool_exception"), model, framework_call
    )
    graph.end(end_time=clock.tick())


def openinference_spans() -> list[ReadableSpan]:
    return _recorded(
        Resource({"service.name": "oi-agent", "service.version": "0.3.0"}), _write_openinference
    )


def _write_openinference(tracer: Tracer, clock: _Clock) -> None:
    typed = ("error.type", "FileNotFoundError")
    event = ("event", "FileNotFoundError")
    # A loop, typed by error.type and by exception events alike: tracked, would_warn, would_stop.
    _oi_agent(tracer, clock, [[typed, event, typed, event]] * 5, session="sess-loop")
    # A trace's root chain is the prompt (no session: the span ID names it), with an agent node
    # nested in it; the tools run below their model call, which ended first.
    _oi_agent(tracer, clock, [[typed] * 4] * 4, root="CHAIN", nested_agent=True, under_model=True)
    # Free text and a bare ERROR status are unknown; a success resets the streak.
    _oi_agent(
        tracer,
        clock,
        [[typed] * 4, [("error.type", "no such file!"), typed], [None, typed], [typed] * 4],
        session="sess-mixed",
    )
    _oi_agent(tracer, clock, [[typed] * 4, [("status", "")] * 2, [typed] * 4], session="s-bare")
    # Status unset: an error.type is an error all the same, an exception event alone is not.
    unset = ("error.type only", "FileNotFoundError")
    _oi_agent(tracer, clock, [[unset] * 4] * 3, session="s-unset")
    handled = ("event only", "FileNotFoundError")
    _oi_agent(tracer, clock, [[typed] * 4, [handled], [typed] * 4], session="s-handled")
    # The LangChain integration's section 3 spans below OpenInference's run: handed over.
    _oi_handed_over(tracer, clock, rounds=5)


def _root_batches(tracer: Tracer, clock: _Clock, prompt_id: str, rounds: int) -> None:
    """``rounds`` batches of four failing calls, each batch span a trace of its own."""
    for number in range(rounds):
        batch = tracer.start_span(
            "tool_batch",
            context=set_span_in_context(NonRecordingSpan(SpanContext(0, 0, False))),
            start_time=clock.tick(),
            attributes={"acp.prompt.id": prompt_id, "acp.batch.admitted": 4},
        )
        for index in range(4):
            tracer.start_span(
                "execute_tool run_shell",
                context=set_span_in_context(batch),
                start_time=clock.tick(),
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "run_shell",
                    "gen_ai.tool.call.id": f"{prompt_id}-{number}-{index}",
                    "acp.tool.type": "native",
                    "acp.tool.status": "error",
                    "acp.tool.execution.status": "error",
                    "acp.tool.execution.error_type": "child_process_error",
                },
            ).end(end_time=clock.tick(2))
        batch.set_attribute("acp.input.reliable", True)
        batch.end(end_time=clock.tick())


def _prompt_span(tracer: Tracer, clock: _Clock, prompt_id: str, **attributes: Any) -> Span:
    return tracer.start_span(
        "invoke_agent",
        context=set_span_in_context(NonRecordingSpan(SpanContext(0, 0, False))),
        start_time=clock.tick(),
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "acp.prompt.id": prompt_id,
            **attributes,
        },
    )


def section_3_spans() -> list[ReadableSpan]:
    return _recorded(
        Resource({"service.name": "section3-agent", "service.version": "0.4.0"}), _write_section_3
    )


def _write_section_3(tracer: Tracer, clock: _Clock) -> None:
    # Opted out: its batches, exported before its prompt span, are never guarded.
    cron = _prompt_span(tracer, clock, "cron-1", **{"acp.prompt.route": "cron"})
    _root_batches(tracer, clock, "cron-1", 3)
    cron.end(end_time=clock.tick())
    # Guarded: tracked, then a reminder, then a stop (would_stop in shadow).
    live = _prompt_span(tracer, clock, "live-1")
    _root_batches(tracer, clock, "live-1", 3)
    live.end(end_time=clock.tick())
    # A prompt span that ended before its batches: they are a prompt of batch spans only.
    _prompt_span(tracer, clock, "ended-1").end(end_time=clock.tick())
    _root_batches(tracer, clock, "ended-1", 2)
    # Two prompt spans open at once with one ID: a collision, enforcement disabled.
    first = _prompt_span(tracer, clock, "dup-1")
    second = _prompt_span(tracer, clock, "dup-1")
    _root_batches(tracer, clock, "dup-1", 3)
    second.end(end_time=clock.tick())
    first.end(end_time=clock.tick())


def _render(spans: Sequence[ReadableSpan]) -> str:
    lines = []
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span)
    for trace in by_trace.values():
        lines.append(json.dumps(encode_request(trace), sort_keys=True))
    return "\n".join(lines) + "\n"


def replay_numbers(path: Path) -> dict[str, Any]:
    import contextlib
    import io

    from otel_guard.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["replay", "--format", "json", str(path)])
    report = json.loads(out.getvalue())
    return {
        key: report[key]
        for key in ("spans", "prompts", "batches", "decisions", "reset_reasons", "diagnostics")
    }


def render_genai() -> str:
    return _render(genai_spans())


def render_openinference() -> str:
    return _render(openinference_spans())


def render_section_3() -> str:
    return _render(section_3_spans())


def render_expected() -> str:
    files = {name: replay_numbers(TESTDATA / name) for name in FILES}
    document = {
        "about": "otel-guard replay --format json FILE for each file here; written by "
        "tests/vectors/generate_connector_golden.py, checked by tests/test_connector_golden.py",
        "files": files,
    }
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def main() -> int:
    TESTDATA.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "examples" / "demo-traces.jsonl", TESTDATA / "demo-traces.jsonl")
    (TESTDATA / "genai-traces.jsonl").write_text(render_genai(), encoding="utf-8")
    (TESTDATA / "openinference-traces.jsonl").write_text(render_openinference(), encoding="utf-8")
    (TESTDATA / "section3-traces.jsonl").write_text(render_section_3(), encoding="utf-8")
    (TESTDATA / "expected.json").write_text(render_expected(), encoding="utf-8")
    print(f"wrote {', '.join(FILES)} and expected.json in {TESTDATA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
