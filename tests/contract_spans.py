"""The contract's section 3 spans of a run, in a shape two runs of one script compare equal by.

Prompt IDs are fresh per run, so each is replaced by its prompt's ordinal; a batch's tool calls
run in parallel, so they are listed by call ID. Parentage is part of the shape: a batch lists the
tool-call spans that are its direct children, and a batch or call span without the expected
parent is listed apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

_KEPT = ("gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id")


def _attributes(span: ReadableSpan, prompts: dict[str, int]) -> tuple[tuple[str, Any], ...]:
    found = dict(span.attributes or {})
    kept = {k: v for k, v in found.items() if k.startswith("acp.") or k in _KEPT}
    if "acp.prompt.id" in kept:
        kept["acp.prompt.id"] = prompts.setdefault(str(kept["acp.prompt.id"]), len(prompts))
    return (("name", span.name), ("status", span.status.status_code.name), *sorted(kept.items()))


def contract_spans(spans: Iterable[ReadableSpan]) -> dict[str, list[Any]]:
    """Prompts, batches (each with its calls) and stray spans of the ``acp`` profile."""
    ended = sorted(spans, key=lambda s: s.end_time or 0)
    prompts: dict[str, int] = {}
    prompt_spans = {
        s.context.span_id: s
        for s in ended
        if (s.attributes or {}).get("gen_ai.operation.name") == "invoke_agent"
        and "acp.prompt.id" in (s.attributes or {})
    }
    batch_spans = {
        s.context.span_id: s for s in ended if "acp.batch.admitted" in (s.attributes or {})
    }
    # Ordinals in prompt start order, so they do not depend on which prompt ended first.
    for span in sorted(prompt_spans.values(), key=lambda s: s.start_time or 0):
        _attributes(span, prompts)
    shape: dict[str, list[Any]] = {"prompts": [], "batches": [], "stray": []}
    for span in prompt_spans.values():
        shape["prompts"].append(_attributes(span, prompts))
    calls: dict[int, list[Any]] = {batch_id: [] for batch_id in batch_spans}
    for span in ended:
        attributes = span.attributes or {}
        if attributes.get("gen_ai.operation.name") != "execute_tool":
            continue
        if "acp.tool.status" not in attributes and "acp.tool.type" not in attributes:
            continue  # another instrumentation's tool span
        parent = span.parent.span_id if span.parent is not None else None
        if parent in calls:
            calls[parent].append(_attributes(span, prompts))
        else:
            shape["stray"].append(_attributes(span, prompts))
    for batch_id, span in batch_spans.items():
        parent = span.parent.span_id if span.parent is not None else None
        entry = (_attributes(span, prompts), sorted(calls[batch_id], key=repr))
        shape["batches" if parent in prompt_spans else "stray"].append(entry)
    return shape
