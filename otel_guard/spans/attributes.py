"""Names of the span attributes the guard reads (docs/contract.md sections 3, 3b and 3c).

No other module knows them.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai

__all__ = [
    "ACP_PREFIX",
    "BATCH_ADMITTED",
    "CONVERSATION_ID",
    "ERROR_TYPE",
    "EXCEPTION_EVENT",
    "EXCEPTION_TYPE",
    "EXECUTE_TOOL",
    "INPUT_EXTERNAL",
    "INPUT_QUEUED_PROMPT",
    "INPUT_RELIABLE",
    "INVOKE_AGENT",
    "MCP_PREFIX",
    "MERGED_TOOLS",
    "MODEL_OPERATIONS",
    "OPENINFERENCE_SPAN_KIND",
    "OPENINFERENCE_TOOL_CALL_ID",
    "OPENINFERENCE_TOOL_ID",
    "OPENINFERENCE_TOOL_NAME",
    "OPERATION_NAME",
    "PLACEHOLDER_CALL_IDS",
    "PROMPT_CHANNEL",
    "PROMPT_ID",
    "PROMPT_ROUTE",
    "PROMPT_ROUTES",
    "ROUTE_INTERACTIVE",
    "SESSION_ID",
    "TOOL_CALL_ID",
    "TOOL_EXECUTION_ERROR_TYPE",
    "TOOL_EXECUTION_STATUS",
    "TOOL_NAME",
    "TOOL_PROVIDER_DUPLICATE",
    "TOOL_STATUS",
    "TOOL_TYPE",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
]

# OpenTelemetry GenAI semantic conventions.
OPERATION_NAME: Final = _gen_ai.GEN_AI_OPERATION_NAME  # "gen_ai.operation.name"
INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL: Final = "execute_tool"
TOOL_NAME: Final = _gen_ai.GEN_AI_TOOL_NAME  # "gen_ai.tool.name", the resolved policy tool name
TOOL_CALL_ID: Final = _gen_ai.GEN_AI_TOOL_CALL_ID  # "gen_ai.tool.call.id"

# The GenAI-conventions profile (agents without acp.* attributes).
ERROR_TYPE: Final = "error.type"
EXCEPTION_EVENT: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
MCP_PREFIX: Final = "mcp."
ACP_PREFIX: Final = "acp."

# Prompt lifecycle and routing.
PROMPT_ID: Final = "acp.prompt.id"
PROMPT_ROUTE: Final = "acp.prompt.route"
PROMPT_CHANNEL: Final = "acp.prompt.channel"
ROUTE_INTERACTIVE: Final = "interactive"
PROMPT_ROUTES: Final = frozenset(
    {"interactive", "channel", "cron", "notification", "background", "subagent", "continuation"}
)

# Batch span: admitted count, and the mid-turn input drain done after the batch settled.
BATCH_ADMITTED: Final = "acp.batch.admitted"
INPUT_EXTERNAL: Final = "acp.input.external"
INPUT_QUEUED_PROMPT: Final = "acp.input.queued_prompt"
INPUT_RELIABLE: Final = "acp.input.reliable"

# Tool-call span outcome, frozen when execution settled.
TOOL_TYPE: Final = "acp.tool.type"
TOOL_STATUS: Final = "acp.tool.status"
TOOL_EXECUTION_STATUS: Final = "acp.tool.execution.status"
TOOL_EXECUTION_ERROR_TYPE: Final = "acp.tool.execution.error_type"
TOOL_PROVIDER_DUPLICATE: Final = "acp.tool.provider_duplicate"

# Model calls: the GenAI profile's batch boundaries, and the work a stop would have saved.
MODEL_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})
USAGE_INPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_INPUT_TOKENS  # "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = _gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS  # "gen_ai.usage.output_tokens"
CONVERSATION_ID: Final = _gen_ai.GEN_AI_CONVERSATION_ID  # "gen_ai.conversation.id"

# The OpenInference conventions (docs/contract.md section 3c).
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_TOOL_NAME: Final = "tool.name"
OPENINFERENCE_TOOL_CALL_ID: Final = "tool_call.id"
OPENINFERENCE_TOOL_ID: Final = "tool.id"
SESSION_ID: Final = "session.id"

# Values some instrumentations write where a call ID is unknown: missing IDs, not shared ones.
PLACEHOLDER_CALL_IDS: Final = frozenset({"", "<not specified>"})
# Google ADK's span around the parallel calls of one turn: not a call of its own.
MERGED_TOOLS: Final = "(merged tools)"
