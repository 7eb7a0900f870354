"""The GenAI-conventions profile (docs/contract.md section 3b): agents without ``acp.*``.

Reads one *ended* span, never its attributes at start (Strands, Google ADK and OpenLLMetry set
``gen_ai.*`` right after starting a span):

* **Prompt**: an ``invoke_agent`` span; its prompt ID is ``gen_ai.conversation.id`` when present,
  else the span ID (batch assembly writes it as 16 hex digits).
* **Model call**: ``gen_ai.operation.name`` in ``chat``, ``text_completion``,
  ``generate_content``.
* **Tool call**: an ``execute_tool`` span, or one carrying both ``gen_ai.tool.name`` and
  ``gen_ai.tool.call.id`` (unless section 3c claims it: ``openinference.span.kind`` and no
  ``gen_ai.operation.name``). Google ADK's ``execute_tool (merged)`` span (tool name
  ``(merged tools)``) wraps the parallel calls of a turn and is not a call. Call ID:
  ``gen_ai.tool.call.id`` unless it is a placeholder; tool type ``mcp`` when the span carries any
  ``mcp.`` attribute, else ``native``.

A span carrying any ``acp.*`` attribute follows section 3, never this profile.
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

__all__ = ["PROFILE", "GenAIProfile"]

_MODEL_CALL: Final = Claim("model_call", "genai")


def _openinference(attributes: Mapping[str, Any]) -> bool:
    """Whether section 3c claims the span: an ``openinference.span.kind`` and no
    ``gen_ai.operation.name`` make it OpenInference's, even when it also carries
    ``gen_ai.tool.name`` and ``gen_ai.tool.call.id`` (an OpenInference processor layered on a
    framework's own spans): its tool is then named by ``tool.name``."""
    return (
        type(attributes.get(attr.OPENINFERENCE_SPAN_KIND)) is str
        and attr.OPERATION_NAME not in attributes
    )


class GenAIProfile:
    """Section 3b spans, read when they end."""

    name: Final[ProfileName] = "genai"
    claim_keys: Final = (attr.OPERATION_NAME, attr.TOOL_CALL_ID)

    def model_call(self, attributes: Mapping[str, Any]) -> bool:
        return attributes.get(attr.OPERATION_NAME) in attr.MODEL_OPERATIONS

    def read(self, span: ReadableSpan, attributes: Mapping[str, Any], root: bool) -> Claim | None:
        operation = attributes.get(attr.OPERATION_NAME)
        if operation in attr.MODEL_OPERATIONS:
            kind = "model_call"
        elif operation == attr.INVOKE_AGENT:
            kind = "prompt"
        elif operation == attr.EXECUTE_TOOL or (
            attr.TOOL_NAME in attributes
            and attr.TOOL_CALL_ID in attributes
            and not _openinference(attributes)
        ):
            kind = "tool_call"
        else:
            return None
        if has_prefix(attributes, attr.ACP_PREFIX):
            return None  # section 3's, wherever it is
        if kind == "model_call":
            return _MODEL_CALL
        if kind == "prompt":
            conversation = attributes.get(attr.CONVERSATION_ID)
            if type(conversation) is not str or not conversation:
                conversation = None
            return Claim("prompt", "genai", prompt_id=conversation)
        tool_name = attributes.get(attr.TOOL_NAME)
        if tool_name == attr.MERGED_TOOLS:
            return None
        if type(tool_name) is not str or len(tool_name) > MAX_ID_LENGTH:
            tool_name = None
        failed, error_type = exception_outcome(span, attributes)
        call = ToolCall(
            call_id=usable_call_id(attributes.get(attr.TOOL_CALL_ID)),
            tool_name=tool_name,
            tool_type="mcp" if has_prefix(attributes, attr.MCP_PREFIX) else "native",
            failed=failed,
            error_type=error_type,
        )
        return Claim("tool_call", "genai", call=call)


PROFILE: Final = GenAIProfile()
