"""Generated span trees of every profile, run live through a guard and written as OTLP/JSON.

A tree is a list of :class:`Node`: a root and nodes below earlier nodes, each with a kind (a
profile's prompt, model call, tool call or section 3 span, or a plain span), attributes set at
start or just before the end, an outcome, and start and end times in any order a tracer allows
(a child starts after its parent, and may end after it). :func:`build` draws one from any
source of choices: Hypothesis (``tests/test_live_equals_replay.py``) or a seeded generator
(``tests/test_connector_differential.py``, where the Go connector reads the same files).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from harness import Harness
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from otel_guard.guard.telemetry import DECISIONS_METRIC
from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

T = TypeVar("T")

# Each kind: the attributes that classify it (more are added by classify()).
KINDS: dict[str, dict[str, Any]] = {
    "plain": {"db.system": "sqlite"},
    "genai_agent": {"gen_ai.operation.name": "invoke_agent"},
    "genai_chat": {"gen_ai.operation.name": "chat"},
    "genai_tool": {"gen_ai.operation.name": "execute_tool"},
    "genai_named_tool": {},  # named by gen_ai.tool.name and gen_ai.tool.call.id alone
    "oi_agent": {"openinference.span.kind": "AGENT"},
    "oi_chain": {"openinference.span.kind": "CHAIN"},
    "oi_llm": {"openinference.span.kind": "LLM"},
    "oi_tool": {"openinference.span.kind": "TOOL"},
    "acp_prompt": {"gen_ai.operation.name": "invoke_agent"},
    "acp_batch": {"acp.input.reliable": True},
    "acp_tool": {
        "gen_ai.operation.name": "execute_tool",
        "acp.tool.type": "native",
        "acp.tool.status": "error",
        "acp.tool.execution.status": "error",
        "acp.tool.execution.error_type": "timeout",
    },
}
SECTION_3 = ("acp_prompt", "acp_batch", "acp_tool")
# A prompt span carries its prompt ID from its start (contract section 3): never set late. A
# batch span is one when it ends, and a tool-call span is read when it ends.
READ_AT_START = ("acp_prompt",)
TOOLS = ("genai_tool", "genai_named_tool", "oi_tool", "acp_tool")
OUTCOMES = ("error_type", "error_type", "status_only", "event_only", "status_and_event", "success")


@dataclass(frozen=True)
class Node:
    parent: int  # index of an earlier node; -1 for a root
    kind: str
    late: bool  # classifying attributes set just before the end, not at start
    tool: str
    call_id: str
    outcome: str
    prompt_id: str | None
    start: int
    end: int
    admitted: int = 2  # of a section 3 batch span


class Choices(Protocol):
    def boolean(self) -> bool: ...
    def integer(self, low: int, high: int) -> int: ...
    def choice(self, options: Sequence[T]) -> T: ...


class Seeded:
    """Choices from a seeded generator: the same seed gives the same tree."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def boolean(self) -> bool:
        return self._random.random() < 0.5

    def integer(self, low: int, high: int) -> int:
        return self._random.randint(low, high)

    def choice(self, options: Sequence[T]) -> T:
        return self._random.choice(options)


def build(choose: Choices, loops: bool) -> list[Node]:
    """A trace: shapes of any kind, or with ``loops`` agent-shaped ones (a GenAI, OpenInference
    or section 3 agent, maybe below a root of another kind, with turns of failing tools)."""
    nodes: list[Node] = []
    # Mostly the same failure, so that loops go far; every other outcome and call ID too.
    noisy = choose.boolean()
    outcomes = OUTCOMES if noisy else ("error_type",) * 12 + OUTCOMES
    # Placeholders (padded too), a shared ID, and one of 200 characters in 400 bytes.
    call_ids = ("", " <not specified>\t", "same", "\u00e9" * 200) if noisy else ("<not specified>",)
    tools = ("run_shell", "read_file", "\u00e9" * 200) if noisy else ("run_shell",)

    def add(parent: int, kind: str, delay: int, length: int, admitted: int = 2) -> int:
        start = (nodes[parent].start if parent >= 0 else 0) + delay
        nodes.append(
            Node(
                parent=parent,
                kind=kind,
                late=kind not in READ_AT_START and choose.boolean(),
                tool=choose.choice(tools),
                call_id=choose.choice((*call_ids, f"c{len(nodes)}", f"c{len(nodes)}")),
                outcome=choose.choice(outcomes),
                prompt_id=choose.choice((None, "conv-1", "conv-2")),
                start=start,
                end=start + length,
                admitted=admitted,
            )
        )
        return len(nodes) - 1

    if not loops:
        add(-1, choose.choice(sorted(KINDS)), 0, choose.integer(1, 400))
        kinds = [*sorted(KINDS), *TOOLS, *TOOLS, "genai_chat", "oi_llm"]  # more calls
        for _ in range(choose.integer(0, 60)):
            parent = choose.integer(0, len(nodes) - 1)
            kind = choose.choice(kinds)
            add(parent, kind, choose.integer(1, 40), choose.integer(1, 200))
        return _batches_set_late_hold_section_3_calls(nodes)
    family = choose.choice(("genai", "openinference", "acp"))
    agent, chat, tool = {
        "genai": ("genai_agent", "genai_chat", "genai_tool"),
        "openinference": ("oi_agent", "oi_llm", "oi_tool"),
        "acp": ("acp_prompt", "genai_chat", "acp_tool"),
    }[family]
    root = add(-1, choose.choice((agent, "plain", "oi_chain", "genai_agent")), 0, 10_000)
    prompt = root if nodes[root].kind == agent else add(root, agent, 1, 9_000)
    if choose.boolean():
        prompt = add(prompt, agent, 1, 8_000)  # nested agent spans: the outer one is the prompt
    clock = 10
    for _ in range(choose.integer(1, 8)):
        owner = (
            prompt if choose.boolean() else add(prompt, "plain", clock - nodes[prompt].start, 500)
        )
        clock += choose.integer(1, 10)
        add(owner, chat, clock - nodes[owner].start, choose.integer(1, 60))
        clock += 60
        width = choose.integer(1, 4)
        if family == "acp":  # the batch span admits its calls (now and then one more)
            admitted = width + (choose.integer(0, 3) == 0)
            owner = add(owner, "acp_batch", clock - nodes[owner].start, 100, admitted)
            clock += 1
        for _ in range(width):
            length = choose.choice((5, 10, 30, 5, 10, 30, 200))  # 200: outlives its turn
            add(owner, tool, clock - nodes[owner].start + choose.integer(0, 5), length)
        clock += 120
    return nodes


def _batches_set_late_hold_section_3_calls(nodes: list[Node]) -> list[Node]:
    """A batch span whose prompt ID is set only after its start is read as one when it ends,
    with the section 3 calls below it; a GenAI ``execute_tool`` span without ``acp.tool.*`` keys
    below it goes to the inferred profiles instead, while a replay (which sees the prompt ID
    from the start) reads it as a half-written call of the batch (docs/design.md, "Batch spans
    named after their start"). Such a batch is set at its start here."""
    for node in nodes:
        if node.kind == "genai_tool" and node.parent >= 0:
            parent = nodes[node.parent]
            if parent.kind == "acp_batch" and parent.late:
                nodes[node.parent] = replace(parent, late=False)
    return nodes


def read_whole(nodes: list[Node]) -> bool:
    """Whether the guard, reading ended spans, sees every link the Collector connector (which
    sees whole traces) sees: no span that parents others and is no profile's ends before the
    trace's first span a profile claims, and no section 3 prompt span sits below a section 3
    batch or tool span (docs/design.md, "What reading ended spans cannot see")."""
    claimed = [n.end for n in nodes if n.kind not in ("plain", *SECTION_3)]
    first = min(claimed, default=None)
    parents = {n.parent for n in nodes}
    for index, node in enumerate(nodes):
        lost = first is not None and node.end <= first and index in parents
        if lost and node.kind in ("plain", "acp_batch", "acp_tool"):
            return False
        if node.kind == "acp_prompt":
            parent = node.parent
            while parent >= 0:
                if nodes[parent].kind in ("acp_batch", "acp_tool"):
                    return False
                parent = nodes[parent].parent
    return True


def classify(node: Node) -> dict[str, Any]:
    """The node's attributes: its kind's, its IDs, and its outcome's."""
    attributes = dict(KINDS[node.kind])
    if node.kind in ("acp_prompt", "acp_batch"):
        attributes["acp.prompt.id"] = node.prompt_id or "acp-1"
        if node.kind == "acp_batch":
            attributes["acp.batch.admitted"] = node.admitted
    elif node.kind == "acp_tool":
        attributes["gen_ai.tool.name"] = node.tool
        attributes["gen_ai.tool.call.id"] = node.call_id
        if node.outcome == "success":
            attributes["acp.tool.status"] = attributes["acp.tool.execution.status"] = "success"
            del attributes["acp.tool.execution.error_type"]
    elif node.kind == "genai_agent" and node.prompt_id is not None:
        attributes["gen_ai.conversation.id"] = node.prompt_id
    elif node.kind == "oi_agent" and node.prompt_id is not None:
        attributes["session.id"] = node.prompt_id
    elif node.kind in ("genai_tool", "genai_named_tool", "oi_tool"):
        genai = node.kind != "oi_tool"
        attributes["gen_ai.tool.name" if genai else "tool.name"] = node.tool
        attributes["gen_ai.tool.call.id" if genai else "tool_call.id"] = node.call_id
        if node.outcome in ("error_type", "status_and_event"):
            attributes["error.type"] = "timeout"
    return attributes


def run(nodes: list[Node], path: Path) -> Harness:
    """Run the tree live through a guard, in the order of its times, and write its finished
    spans to ``path`` as OTLP/JSON lines."""
    harness = Harness()
    events = sorted(
        [(node.start, 0, i) for i, node in enumerate(nodes)]
        + [(node.end, 1, i) for i, node in enumerate(nodes)]
    )
    spans: dict[int, Span] = {}
    base = 1_700_000_000_000_000_000
    for rank, (_, is_end, index) in enumerate(events):
        node = nodes[index]
        when = base + rank * 1_000
        attributes = classify(node)
        if not is_end:
            parent = spans[node.parent] if node.parent >= 0 else None
            spans[index] = harness.tracer.start_span(
                node.kind,
                context=None if parent is None else set_span_in_context(parent),
                attributes={} if node.late else attributes,
                start_time=when,
            )
            continue
        span = spans[index]
        if node.late:
            span.set_attributes(attributes)
        if node.kind in TOOLS and node.outcome != "success":
            if node.outcome in ("event_only", "status_and_event"):
                span.add_event("exception", {"exception.type": "TimeoutError"}, when - 1)
            if node.outcome != "event_only":
                span.set_status(Status(StatusCode.ERROR, "free text"))
        span.end(end_time=when)
    with open(path, "w", encoding="utf-8") as stream:
        OtlpJsonSpanExporter(stream).export(harness.span_exporter.get_finished_spans())
    return harness


def reset_counts(harness: Harness) -> dict[str, int]:
    """Resets by reason, counted by the guard's decisions counter."""
    resets: dict[str, int] = {}
    for attributes, value in harness.points(DECISIONS_METRIC):
        if attributes["decision"] == "reset":
            reason = str(attributes["reset_reason"])
            resets[reason] = resets.get(reason, 0) + value
    return resets
