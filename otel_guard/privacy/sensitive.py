"""The one registry of what exported telemetry may and may not carry.

Two policies, one per kind of span, both read from here by the redacting span exporter and, by
test, by the collector configuration in ``collector-config/``:

* **GenAI spans** (:func:`is_genai_key` is true for one of their attribute keys or event names:
  the ``gen_ai.`` and ``acp.`` namespaces and those of the agent frameworks in
  :data:`GENAI_NAMESPACES`) keep only the keys of :data:`GENAI_ALLOWED_KEYS` and
  :data:`GENAI_ALLOWED_PATTERNS`. A deny-list cannot foresee every framework's content keys; an
  allow-list of published structural keys does not have to.
* **Every other span**, and resources, drop the keys of :data:`SENSITIVE_KEYS` and
  :data:`SENSITIVE_KEY_PATTERNS`, matched case-insensitively (``User.Id`` is ``user.id``).

Keys are compared in lower case for the deny-list and exactly for the allow-list: an upper-cased
copy of an allowed key (``GEN_AI.TOOL.NAME``) is not the published key and is dropped.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _gen_ai

from otel_guard.spans import attributes as attr

__all__ = [
    "CLASSIFIED_ERROR_TYPE",
    "CONTENT_WORDS",
    "ERROR_TYPE_KEYS",
    "GENAI_ALLOWED_KEYS",
    "GENAI_ALLOWED_PATTERNS",
    "GENAI_CONTENT_EVENTS",
    "GENAI_EVENT_NAMES",
    "GENAI_MARKER_KEYS",
    "GENAI_NAMESPACES",
    "MCP_MARKER_KEYS",
    "MCP_SERVER_KEYS",
    "MODEL_OPERATIONS",
    "OPENINFERENCE_SPAN_KINDS",
    "PSEUDONYMOUS_KEYS",
    "SENSITIVE_KEYS",
    "SENSITIVE_KEY_PATTERNS",
    "SENSITIVE_RESOURCE_KEYS",
    "UNCLASSIFIED_ERROR_TYPE",
    "AllowedKey",
    "SensitiveKeys",
    "ValueShape",
    "allowed_key",
    "is_genai_key",
    "is_sensitive",
]

# -- the deny-list: every span that is not a GenAI span, and resources -----------------------

SENSITIVE_KEYS: Final[frozenset[str]] = frozenset(
    {
        # GenAI content: arguments, results, messages, instructions, definitions.
        _gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS,
        _gen_ai.GEN_AI_TOOL_CALL_RESULT,
        _gen_ai.GEN_AI_INPUT_MESSAGES,
        _gen_ai.GEN_AI_OUTPUT_MESSAGES,
        _gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS,
        _gen_ai.GEN_AI_TOOL_DEFINITIONS,
        _gen_ai.GEN_AI_TOOL_DESCRIPTION,
        "gen_ai.prompt",
        "gen_ai.completion",
        "gen_ai.request.messages",
        "gen_ai.response.messages",
        # Framework content keys: pydantic-ai/logfire, OpenInference, OpenLLMetry, Langfuse,
        # Vercel AI, Google ADK, MLflow.
        "pydantic_ai.all_messages",
        "final_result",
        "model_request_parameters",
        "logfire.msg",
        "logfire.msg_template",
        "input.value",
        "output.value",
        "llm.prompts",
        "llm.completions",
        "llm.input_messages",
        "llm.output_messages",
        "llm.invocation_parameters",
        "llm.tools",
        "tool.parameters",
        "tool.description",
        "tool.result",
        "tool.output",
        "traceloop.entity.input",
        "traceloop.entity.output",
        "langfuse.observation.input",
        "langfuse.observation.output",
        "langfuse.trace.input",
        "langfuse.trace.output",
        "ai.prompt",
        "ai.prompt.messages",
        "ai.prompt.tools",
        "ai.response.text",
        "ai.response.object",
        "ai.response.toolcalls",
        "ai.toolcall.args",
        "ai.toolcall.result",
        "gcp.vertex.agent.llm_request",
        "gcp.vertex.agent.llm_response",
        "gcp.vertex.agent.tool_call_args",
        "gcp.vertex.agent.tool_response",
        "mlflow.spaninputs",
        "mlflow.spanoutputs",
        "mlflow.traceinputs",
        "mlflow.traceoutputs",
        # Tool identity: a tool name can carry a path, a server name or user data, and the guard
        # promises that it never leaves the process (GenAI spans export a pseudonym instead).
        _gen_ai.GEN_AI_TOOL_NAME,
        "tool.name",
        "mcp.tool.name",
        "ai.toolcall.name",
        "traceloop.entity.name",
        # Error types an agent fills with free text (GenAI spans keep classified ones).
        "error.type",
        "acp.tool.execution.error_type",
        # Raw errors.
        "exception.message",
        "exception.stacktrace",
        "error.message",
        "exception.escaped_message",
        # User identifiers.
        "user.id",
        "user.name",
        "user.email",
        "user.full_name",
        "enduser.id",
        "enduser.pseudo.id",
        "session.user_id",
        "user_id",
        "gen_ai.user.id",
        "langfuse.user.id",
        # Paths.
        "file.path",
        "file.directory",
        "file.name",
        "code.filepath",
        "code.file.path",
        "mcp.resource.uri",
        "file_path",
        "filepath",
        "path",
        "cwd",
        # HTTP, database, messaging and RPC content: URLs carry tokens in their query strings.
        "url.path",
        "url.full",
        "url.query",
        "url.original",
        "http.url",
        "http.target",
        "db.statement",
        "db.query.text",
        "messaging.message.body",
        # The process: its command line holds arguments, its executable path a home directory.
        "process.command",
        "process.command_line",
        "process.command_args",
        "process.executable.path",
        "process.owner",
        "process.user.name",
        "process.real_user.name",
        "process.saved_user.name",
        # MCP server identity.
        "mcp.server.name",
        "acp.mcp.server.name",
        "mcp_server",
        "mcp_server_name",
        # Generic and legacy names agents still emit.
        "content",
        "input",
        "output",
        "command",
        "arguments",
        "query",
        "message",
        "messages",
        "body",
        "text",
        "tool_name",
        "tool_input",
        "tool_output",
        "tool_error",
        "tool_arguments",
        "tool_args",
        "tool_response",
        "tool_result",
        "function_args",
        "function_arguments",
        "function_name",
        "function_response",
        "function_result",
        "error",
        "error_message",
        "prompt",
        "response",
    }
)
"""Keys (lower case) that are always removed from a span that is not a GenAI span."""

CONTENT_WORDS: Final[tuple[str, ...]] = (
    "args",
    "kwargs",
    "argv",
    "arguments",
    "params",
    "parameters",
    "input",
    "inputs",
    "output",
    "outputs",
    "result",
    "results",
    "response",
    "responses",
    "reply",
    "answer",
    "question",
    "prompt",
    "prompts",
    "completion",
    "completions",
    "message",
    "messages",
    "msg",
    "content",
    "contents",
    "body",
    "text",
    "payload",
    "data",
    "query",
    "sql",
    "statement",
    "command",
    "cmd",
    "stdout",
    "stderr",
    "stdin",
    "history",
    "transcript",
    "instructions",
    "traceback",
    "stacktrace",
    "error",
    "errors",
)
"""Words that name content. A key whose **last word** (split on ``.``, ``_``, ``-``, space,
``/`` and ``:``) is one of them is content, whatever namespace it is in (``args``,
``tool_kwargs``, ``user_question``, ``shell.stdout``, ``job-payload``), so keys no list foresaw
are still removed; a key that only qualifies such a word (``message_count``,
``http.response.status_code``, ``stdout_bytes``) measures it and is kept."""

_CONTENT_WORD_PATTERN: Final = "(.*[._ /:-])?(" + "|".join(CONTENT_WORDS) + ")"

SENSITIVE_KEY_PATTERNS: Final[tuple[str, ...]] = (
    _CONTENT_WORD_PATTERN,
    r"gen_ai\.prompt\..+",
    r"gen_ai\.completion\..+",
    r"gen_ai\.tool\.call\.(arguments|result)\..+",
    r"gen_ai\.(input|output)\.messages\..+",
    r"llm\.(input|output)_messages\..+",
    r"llm\.(prompts|completions|tools)\..+",
    r"ai\.prompt\..+",
    r"ai\.response\..+",
    r".*\.(input|output|inputs|outputs|content|contents)",
    r".*\.(prompt|prompts|completion|completions|messages?|body|text)",
    r".*\.(arguments|args|parameters)",
    r".*\.(stacktrace|stack_trace)",
    r".*\.(file_path|filepath|path)",
    r".*\.user_id",
    r".*\.user\.(id|name|email)",
    r"mcp\..*server.*",
    r".*\.mcp\.server\..+",
    r".*\.(cwd|working_directory)",
    r".*\.error[._]message",
    r"(http|rpc|grpc)\.(request|response)\.(header|headers|metadata)\..+",
    r"db\.query\.parameter\..+",
    r"messaging\..*\.body",
)
"""Regular expressions (full match, on the lower-cased key) naming families of sensitive keys."""

SENSITIVE_RESOURCE_KEYS: Final[frozenset[str]] = frozenset(
    key for key in SENSITIVE_KEYS if key.startswith("process.")
)
"""The process detector's keys that the deny-list drops from resources (also matched there)."""

_COMPILED: Final = re.compile("|".join(f"(?:{p})" for p in SENSITIVE_KEY_PATTERNS))


def is_sensitive(key: str) -> bool:
    """True when ``key``, lower-cased, is in :data:`SENSITIVE_KEYS` or fully matches a pattern."""
    lowered = key.lower()
    return lowered in SENSITIVE_KEYS or _COMPILED.fullmatch(lowered) is not None


class SensitiveKeys:
    """The deny-list plus a deployment's own additions; a callable key predicate.

    The additions are matched as given (``extra_keys`` exactly, ``extra_patterns`` by full match);
    the registry's own keys case-insensitively.
    """

    __slots__ = ("_extra", "_pattern")

    def __init__(self, extra_keys: Iterable[str] = (), extra_patterns: Iterable[str] = ()) -> None:
        self._extra = frozenset(extra_keys)
        patterns = tuple(extra_patterns)
        self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None

    def __call__(self, key: str) -> bool:
        return (
            is_sensitive(key)
            or key in self._extra
            or (self._pattern is not None and self._pattern.fullmatch(key) is not None)
        )


# -- which spans are GenAI spans --------------------------------------------------------------

GENAI_NAMESPACES: Final[Mapping[str, str]] = {
    "gen_ai.": "OpenTelemetry GenAI semantic conventions (also OpenLIT, pydantic-ai)",
    "acp.": "the guard's own input attributes",
    "pydantic_ai.": "pydantic-ai",
    "logfire.": "Logfire, pydantic-ai's native instrumentation",
    "openinference.": "OpenInference (Arize Phoenix)",
    "llm.": "OpenInference and OpenLLMetry model-call keys",
    "input.": "OpenInference span input (input.value, input.mime_type)",
    "output.": "OpenInference span output",
    "tool.": "OpenInference tool keys",
    "traceloop.": "OpenLLMetry (Traceloop)",
    "langfuse.": "Langfuse",
    "ai.": "Vercel AI SDK",
    "gcp.vertex.agent.": "Google Agent Development Kit",
    "mlflow.": "MLflow tracing",
    "openlit.": "OpenLIT",
    "mcp.": "Model Context Protocol",
}
"""Key prefixes (lower case) whose presence on a span, its events or its event names makes it a
GenAI span, with the framework each one comes from."""

GENAI_MARKER_KEYS: Final[tuple[str, ...]] = (
    _gen_ai.GEN_AI_OPERATION_NAME,
    _gen_ai.GEN_AI_PROVIDER_NAME,
    "gen_ai.system",
    _gen_ai.GEN_AI_TOOL_NAME,
    _gen_ai.GEN_AI_TOOL_CALL_ID,
    _gen_ai.GEN_AI_REQUEST_MODEL,
    attr.PROMPT_ID,
    attr.BATCH_ADMITTED,
    attr.TOOL_STATUS,
    "pydantic_ai.all_messages",
    "logfire.msg",
    "openinference.span.kind",
    "input.value",
    "llm.request.type",
    "traceloop.span.kind",
    "traceloop.entity.name",
    "langfuse.observation.type",
    "ai.operationId",
    "gcp.vertex.agent.invocation_id",
    "mlflow.spanType",
)
"""One key per framework that its GenAI spans always carry. The collector cannot test a key's
prefix in a condition, so it recognises GenAI spans by these; the process uses the prefixes."""

_NAMESPACE_PREFIXES: Final = tuple(GENAI_NAMESPACES)

GENAI_CONTENT_EVENTS: Final[frozenset[str]] = frozenset(
    {
        "gen_ai.client.inference.operation.details",
        "gen_ai.user.message",
        "gen_ai.system.message",
        "gen_ai.assistant.message",
        "gen_ai.tool.message",
        "gen_ai.choice",
        "gen_ai.content.prompt",
        "gen_ai.content.completion",
        "gen_ai.evaluation.result",
    }
)
"""Event names of the GenAI conventions whose records (or span events) carry content in their
attributes or body. They are in the ``gen_ai.`` namespace, so :func:`is_genai_key` is true for
each; they are listed for the log record exporter's documentation and tests."""

GENAI_EVENT_NAMES: Final[frozenset[str]] = GENAI_CONTENT_EVENTS | {"exception"}
"""The only event names a GenAI span's events (and a GenAI log record) are exported with; any
other becomes ``redacted``. Closed names of the conventions carry no content, whereas a name an
instrumentation made up may be built from it (``called read_file('/home/alice/...')``).
``exception`` is the event the GenAI profile reads an error type from, so replay needs it."""

OPENINFERENCE_SPAN_KINDS: Final[frozenset[str]] = frozenset(
    {
        "LLM",
        "EMBEDDING",
        "CHAIN",
        "RETRIEVER",
        "RERANKER",
        "TOOL",
        "AGENT",
        "GUARDRAIL",
        "EVALUATOR",
        "PROMPT",
        "UNKNOWN",
    }
)
"""Values of ``openinference.span.kind``: a GenAI span without an operation name is exported
named by its kind, lower-cased (``chain``, ``agent``)."""


def is_genai_key(key: str) -> bool:
    """True when ``key`` (an attribute key or an event name) belongs to a GenAI namespace."""
    return key.lower().startswith(_NAMESPACE_PREFIXES)


# -- the allow-list: GenAI spans ---------------------------------------------------------------

ValueShape = Literal[
    "as_is",
    "count",
    "word",
    "flag",
    "vocabulary",
    "route",
    "admitted",
    "call_id",
    "conversation_id",
]
"""How an allowed key's value is checked. Values of another shape are dropped, or rewritten to a
content-free value the guard reads the same way, so replay sees what the guard saw:

* ``as_is``: kept unchanged (the prompt ID, which the guard's own records carry raw);
* ``count``: numbers; ``word``: a short token of letters, digits and ``_.-:/@+``, or a list of
  them; ``flag``: a boolean, or its text ``true``/``false`` (the SDK writes ``exception.escaped``
  so; the guard reads ``is True``);
* ``vocabulary``: one of :attr:`AllowedKey.values` is kept, any other string becomes
  :data:`UNCLASSIFIED_ERROR_TYPE`'s ``_OTHER`` (a value outside the closed set, as it was: a
  declared but unresolved tool type stays declared, so replay counts no ``missing_attribute``
  the live guard did not), anything else is dropped (the guard reads it as missing either way);
* ``route``: as ``vocabulary``; ``_OTHER`` is still a route other than the interactive one, so
  the prompt stays opted out;
* ``admitted``: a count that is not negative; any other value becomes ``-1`` (the key's presence
  marks a batch span; a value that is not a count makes the batch incomplete either way);
* ``call_id``, ``conversation_id``: an identifier: a word of at most 256 characters is kept,
  another string of at most 256 becomes a keyed pseudonym (equal IDs stay equal, different stay
  different); anything else becomes ``""`` for a call ID (its presence marks a tool span) and is
  dropped for a conversation ID."""


@dataclass(frozen=True, slots=True)
class AllowedKey:
    """One published key a GenAI span keeps, the shape its value must have, and why it is safe."""

    shape: ValueShape
    why: str
    values: frozenset[str] = frozenset()


_STRUCTURE = "a closed vocabulary or a configuration value, never content"
_MODEL = "the model the deployment chose, an identifier from the provider's catalogue"
_TOKENS = "a number of tokens; numbers carry no content"
_ID = "an opaque identifier generated by the provider, the framework or the host"
# What the reducer reads as a terminal or execution status, and the tool types it resolves;
# anything else is read as missing (otel_guard.reducer, otel_guard.guard.processor).
_STATUSES: Final = frozenset({"success", "error", "cancelled", "not_started", "unknown"})
_TOOL_TYPES: Final = frozenset({"native", "mcp"})
_GUARD = "read by the guard (docs/contract.md section 3); replay needs it as it was"

GENAI_ALLOWED_KEYS: Final[Mapping[str, AllowedKey]] = {
    # OpenTelemetry GenAI semantic conventions.
    _gen_ai.GEN_AI_OPERATION_NAME: AllowedKey("word", "closed vocabulary; " + _GUARD),
    _gen_ai.GEN_AI_PROVIDER_NAME: AllowedKey("word", _STRUCTURE),
    "gen_ai.system": AllowedKey("word", _STRUCTURE + " (the provider's older key)"),
    _gen_ai.GEN_AI_REQUEST_MODEL: AllowedKey("word", _MODEL),
    _gen_ai.GEN_AI_RESPONSE_MODEL: AllowedKey("word", _MODEL),
    _gen_ai.GEN_AI_RESPONSE_ID: AllowedKey("word", _ID),
    _gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: AllowedKey("word", _STRUCTURE),
    _gen_ai.GEN_AI_OUTPUT_TYPE: AllowedKey("word", _STRUCTURE),
    _gen_ai.GEN_AI_REQUEST_TEMPERATURE: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_REQUEST_TOP_P: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_REQUEST_TOP_K: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_REQUEST_MAX_TOKENS: AllowedKey("count", _TOKENS),
    _gen_ai.GEN_AI_REQUEST_SEED: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_REQUEST_CHOICE_COUNT: AllowedKey("count", "a count"),
    _gen_ai.GEN_AI_REQUEST_FREQUENCY_PENALTY: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_REQUEST_PRESENCE_PENALTY: AllowedKey("count", "a sampling setting, a number"),
    _gen_ai.GEN_AI_TOOL_CALL_ID: AllowedKey("call_id", _ID + "; " + _GUARD),
    _gen_ai.GEN_AI_TOOL_TYPE: AllowedKey("word", _STRUCTURE),
    _gen_ai.GEN_AI_CONVERSATION_ID: AllowedKey(
        "conversation_id", _ID + "; the prompt ID of GenAI traces"
    ),
    _gen_ai.GEN_AI_AGENT_ID: AllowedKey("word", _ID),
    _gen_ai.GEN_AI_AGENT_NAME: AllowedKey("word", "the agent's configured name, " + _STRUCTURE),
    "gen_ai.agent.call.id": AllowedKey("word", _ID + " (pydantic-ai's run ID)"),
    _gen_ai.GEN_AI_DATA_SOURCE_ID: AllowedKey("word", _ID),
    _gen_ai.GEN_AI_TOKEN_TYPE: AllowedKey("word", _STRUCTURE),
    "gen_ai.embeddings.dimension.count": AllowedKey("count", "a count"),
    # Where the model call went: infrastructure, as on any client span.
    "server.address": AllowedKey(
        "word", "the model endpoint's host, infrastructure (not on MCP spans: MCP_SERVER_KEYS)"
    ),
    "server.port": AllowedKey("count", "the model endpoint's port"),
    # MCP structure (the server name is pseudonymous, see PSEUDONYMOUS_KEYS).
    "mcp.method.name": AllowedKey("word", _STRUCTURE + " (tools/call, ...)"),
    "mcp.protocol.version": AllowedKey("word", _STRUCTURE),
    "mcp.session.id": AllowedKey("word", _ID),
    # Framework span kinds and model identifiers.
    "openinference.span.kind": AllowedKey("word", _STRUCTURE + " (LLM, TOOL, AGENT, ...)"),
    # The OpenInference profile's identifiers (docs/contract.md section 3c); its tool name is
    # pseudonymous (PSEUDONYMOUS_KEYS).
    attr.OPENINFERENCE_TOOL_CALL_ID: AllowedKey("call_id", _ID + "; " + _GUARD),
    attr.OPENINFERENCE_TOOL_ID: AllowedKey("call_id", _ID + "; " + _GUARD),
    attr.SESSION_ID: AllowedKey("conversation_id", _ID + "; the prompt ID of OpenInference traces"),
    "llm.model_name": AllowedKey("word", _MODEL),
    "llm.provider": AllowedKey("word", _STRUCTURE),
    "llm.system": AllowedKey("word", _STRUCTURE),
    "llm.request.type": AllowedKey("word", _STRUCTURE + " (chat, completion)"),
    "traceloop.span.kind": AllowedKey("word", _STRUCTURE + " (workflow, task, agent, tool)"),
    "langfuse.observation.type": AllowedKey("word", _STRUCTURE + " (span, generation, event)"),
    "ai.operationId": AllowedKey("word", _STRUCTURE + " (ai.generateText, ...)"),
    "ai.model.id": AllowedKey("word", _MODEL),
    "ai.model.provider": AllowedKey("word", _STRUCTURE),
    "ai.toolCall.id": AllowedKey("word", _ID),
    "ai.response.finishReason": AllowedKey("word", _STRUCTURE),
    "gcp.vertex.agent.invocation_id": AllowedKey("word", _ID),
    "gcp.vertex.agent.event_id": AllowedKey("word", _ID),
    "mlflow.spanType": AllowedKey("word", _STRUCTURE + " (LLM, TOOL, AGENT, ...)"),
    "logfire.span_type": AllowedKey("word", _STRUCTURE + " (span, log)"),
    "logfire.level_num": AllowedKey("count", "a severity number"),
    # The guard's own input attributes.
    attr.PROMPT_ID: AllowedKey("as_is", "the host's prompt ID; " + _GUARD),
    attr.PROMPT_ROUTE: AllowedKey("route", "closed vocabulary; " + _GUARD, attr.PROMPT_ROUTES),
    attr.PROMPT_CHANNEL: AllowedKey("flag", "a flag; " + _GUARD),
    attr.BATCH_ADMITTED: AllowedKey("admitted", "a count; " + _GUARD),
    attr.INPUT_EXTERNAL: AllowedKey("flag", "a flag; " + _GUARD),
    attr.INPUT_QUEUED_PROMPT: AllowedKey("flag", "a flag; " + _GUARD),
    attr.INPUT_RELIABLE: AllowedKey("flag", "a flag; " + _GUARD),
    attr.TOOL_TYPE: AllowedKey("vocabulary", "closed vocabulary; " + _GUARD, _TOOL_TYPES),
    attr.TOOL_STATUS: AllowedKey("vocabulary", "closed vocabulary; " + _GUARD, _STATUSES),
    attr.TOOL_EXECUTION_STATUS: AllowedKey("vocabulary", "closed vocabulary; " + _GUARD, _STATUSES),
    attr.TOOL_PROVIDER_DUPLICATE: AllowedKey("flag", "a flag; " + _GUARD),
    # Span events: an exception keeps what it was, never what it said.
    "exception.type": AllowedKey("word", "the exception's class name, never its message"),
    "exception.escaped": AllowedKey("flag", "a flag"),
}
"""Exact keys a GenAI span (and its events and links) keeps, with why each one is safe.

Everything else on a GenAI span is dropped. Three keys are not dropped but rewritten, because
replaying redacted traces needs them (:data:`PSEUDONYMOUS_KEYS`, :data:`ERROR_TYPE_KEYS`)."""

GENAI_ALLOWED_PATTERNS: Final[Mapping[str, AllowedKey]] = {
    r"gen_ai\.usage\.[a-z0-9_.]+": AllowedKey("count", _TOKENS),
    r"gen_ai\.aggregated_usage\.[a-z0-9_.]+": AllowedKey("count", _TOKENS + " (pydantic-ai)"),
    r"llm\.token_count\.[a-z0-9_.]+": AllowedKey("count", _TOKENS + " (OpenInference)"),
    r"llm\.usage\.[a-z0-9_.]+": AllowedKey("count", _TOKENS + " (OpenLLMetry)"),
    r"ai\.usage\.[a-zA-Z0-9_.]+": AllowedKey("count", _TOKENS + " (Vercel AI)"),
}
"""Families of allowed keys (full match, exact case): token counts under each framework's name.
Their values must be numbers, so content put under such a key is still dropped."""

PSEUDONYMOUS_KEYS: Final[Mapping[str, str]] = {
    attr.TOOL_NAME: "tool_",
    attr.OPENINFERENCE_TOOL_NAME: "tool_",
    "mcp.server.name": "mcp_",
}
"""Keys whose string value a GenAI span exports as a keyed pseudonym
(``otel_guard.privacy.pseudonym``), with the pseudonym's prefix:
equal names stay equal and different names stay different, so the guard's decisions (which only
compare tool names) replay unchanged, and an MCP tool stays recognisable as one."""

MCP_MARKER_KEYS: Final[tuple[str, ...]] = (
    "mcp.method.name",
    "mcp.protocol.version",
    "mcp.resource.uri",
    "mcp.server.name",
    "mcp.session.id",
)
"""Keys that mark a span as an MCP client's call (the MCP semantic conventions, and the MCP
server name some instrumentations add)."""

MCP_SERVER_KEYS: Final[tuple[str, ...]] = ("server.address",)
"""Allowed keys dropped from a span that carries an :data:`MCP_MARKER_KEYS` key: on a model
call the host is the model endpoint, on an MCP call it names the MCP server, which never leaves
(contract section 6)."""

CLASSIFIED_ERROR_TYPE: Final = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
"""A classified error type (the reducer's pattern, docs/contract.md section 2)."""

UNCLASSIFIED_ERROR_TYPE: Final = "_OTHER"
"""What a free-text ``error.type`` becomes: the GenAI conventions' own fallback value. It is not a
classified type, so a replay still sees an error of unknown type, never a success."""

ERROR_TYPE_KEYS: Final[Mapping[str, Literal["exact", "lower"]]] = {
    attr.TOOL_EXECUTION_ERROR_TYPE: "exact",
    "error.type": "lower",
}
"""Error-type keys a GenAI span keeps when their value is classified: the execution error type as
the reducer reads it (exactly), ``error.type`` as the GenAI profile reads it (lower-cased, and
exported lower-cased, so the exported value itself matches :data:`CLASSIFIED_ERROR_TYPE`).
Unclassified values are dropped (execution error type) or become :data:`UNCLASSIFIED_ERROR_TYPE`
(``error.type``, whose presence alone marks an error)."""

_ALLOWED_PATTERN: Final = re.compile("|".join(f"(?:{p})" for p in GENAI_ALLOWED_PATTERNS))
_PATTERN_RULES: Final = tuple(
    (re.compile(pattern), rule) for pattern, rule in GENAI_ALLOWED_PATTERNS.items()
)

MODEL_OPERATIONS: Final[frozenset[str]] = frozenset(
    {"chat", "text_completion", "generate_content", "embeddings"}
)
"""Operations that call a model: their exported span name is the operation and the model."""


@functools.lru_cache(maxsize=4096)
def allowed_key(key: str) -> AllowedKey | None:
    """The allow-list entry for ``key`` on a GenAI span, or None when the key is dropped."""
    rule = GENAI_ALLOWED_KEYS.get(key)
    if rule is not None or _ALLOWED_PATTERN.fullmatch(key) is None:
        return rule
    return next(rule for pattern, rule in _PATTERN_RULES if pattern.fullmatch(key))
