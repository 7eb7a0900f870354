"""The OpenInference profile (docs/contract.md section 3c): Arize's conventions.

Spans with ``openinference.span.kind`` and neither ``gen_ai.operation.name`` (the GenAI profile
reads those) nor any ``acp.*`` attribute (section 3), read when they end:

* ``AGENT``, or a ``CHAIN`` with no parent in this process (the trace's root), is a prompt; its
  prompt ID is ``session.id`` when present, else the span ID.
* ``LLM`` is a model call.
* ``TOOL`` is a tool call: tool name ``tool.name``; call ID ``tool_call.id``, else ``tool.id``
  (placeholders are missing), else the span ID; outcome as in the GenAI profile (status
  ``ERROR`` or ``error.type``, typed by ``error.type``, else the last exception event's
  ``exception.type``, lower-cased); tool type ``mcp`` with any ``mcp.`` attribute.

Batches are inferred as in section 3b, and such prompts are never enforced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.spans import attributes as attr
from otel_guard.spans.events import (
    MAX_ID_LENGTH,
    Claim,
    ProfileName,
    ToolCall,
    exception_outcome,
    has_prefix,
    usable_call_id,
)

__all__ = ["PROFILE", "OpenInferenceProfile"]

_MODEL_CALL: Final = Claim("model_call", "openinference")


class OpenInferenceProfile:
    """Section 3c spans, read when they end."""

    name: Final[ProfileName] = "openinference"
    claim_keys: Final = (attr.OPENINFERENCE_SPAN_KIND,)

    def model_call(self, attributes: Mapping[str, Any]) -> bool:
        kind = attributes.get(attr.OPENINFERENCE_SPAN_KIND)
        return type(kind) is str and kind.upper() == "LLM" and attr.OPERATION_NAME not in attributes

    def read(self, span: ReadableSpan, attributes: Mapping[str, Any], root: bool) -> Claim | None:
        kind = attributes.get(attr.OPENINFERENCE_SPAN_KIND)
        if type(kind) is not str or attr.OPERATION_NAME in attributes:
            return None
        kind = kind.upper()
        if kind not in ("AGENT", "LLM", "TOOL") and not (kind == "CHAIN" and root):
            return None
        if has_prefix(attributes, attr.ACP_PREFIX):
            return None
        if kind == "LLM":
            return _MODEL_CALL
        if kind != "TOOL":
            session = attributes.get(attr.SESSION_ID)
            if type(session) is not str or not session:
                session = None
            return Claim("prompt", "openinference", prompt_id=session)
        tool_name = attributes.get(attr.OPENINFERENCE_TOOL_NAME)
        if type(tool_name) is not str or len(tool_name) > MAX_ID_LENGTH:
            tool_name = None
        call_id = usable_call_id(attributes.get(attr.OPENINFERENCE_TOOL_CALL_ID))
        if call_id is None:
            call_id = usable_call_id(attributes.get(attr.OPENINFERENCE_TOOL_ID))
        failed, error_type = exception_outcome(span, attributes)
        call = ToolCall(
            call_id=call_id,
            tool_name=tool_name,
            tool_type="mcp" if has_prefix(attributes, attr.MCP_PREFIX) else "native",
            failed=failed,
            error_type=error_type,
        )
        return Claim("tool_call", "openinference", call=call)


PROFILE: Final = OpenInferenceProfile()
