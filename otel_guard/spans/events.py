"""What every profile turns ended spans into, and what batch assembly hands the processor.

A profile module (:mod:`otel_guard.spans.genai`, :mod:`otel_guard.spans.openinference`) reads one
ended span and says what it is, as a :class:`Claim`: a prompt, a model call or a tool call (with
the few fields of its outcome the reducer needs), or nothing. Batch assembly
(:mod:`otel_guard.spans.assembly`) joins the claims of a trace through their lineage and emits
the normalized events below; the processor applies them to the prompt's guard state exactly as
it applies a section 3 batch span.

The helpers here are shared by the profiles so that every convention reads IDs, placeholders
and outcomes the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, StatusCode

from otel_guard.reducer import Batch
from otel_guard.spans import attributes as attr

__all__ = [
    "MAX_ID_LENGTH",
    "PROFILE_NAMES",
    "BatchSettled",
    "Claim",
    "ClaimKind",
    "Coverage",
    "InferredProfile",
    "ProfileDiagnostic",
    "ProfileEvent",
    "ProfileName",
    "PromptEnded",
    "PromptStarted",
    "ToolCall",
    "bounded_id",
    "exception_outcome",
    "usable_call_id",
]

ProfileName = Literal["acp", "genai", "openinference"]
#: Every profile name, in the order reports list them.
PROFILE_NAMES: Final[tuple[ProfileName, ...]] = get_args(ProfileName)
ClaimKind = Literal["prompt", "model_call", "tool_call"]

# Longer call IDs and tool names are treated as missing: no registry or provider writes them,
# and they would otherwise be kept, unbounded, until their batch settles.
MAX_ID_LENGTH: Final = 256
# Prompt IDs longer than this are kept as a fixed-size digest wherever state is kept.
MAX_PROMPT_ID_LENGTH: Final = 256
DIGEST_PREFIX: Final = "sha256:"


def bounded_id(prompt_id: str) -> str:
    """The key under which the guard keeps a prompt's state: the ID itself, or for an ID longer
    than 256 characters ``sha256:`` and the hex digest of its UTF-8 bytes (71 characters), so
    memory does not grow with ID length and equal IDs still meet."""
    if len(prompt_id) <= MAX_PROMPT_ID_LENGTH:
        return prompt_id
    data = prompt_id.encode("utf-8", "surrogatepass")
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def usable_call_id(value: object) -> str | None:
    """A call ID as read from an attribute: ``None`` for a wrong type, an absurd length or a
    placeholder (empty, ``<not specified>``), which are missing IDs, never shared ones."""
    if (
        type(value) is not str
        or len(value) > MAX_ID_LENGTH
        or value.strip() in (attr.PLACEHOLDER_CALL_IDS)
    ):
        return None
    return value


def exception_outcome(span: ReadableSpan, attributes: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a tool span is an execution error, and its error type, lower-cased.

    Status ``ERROR`` or an ``error.type`` is an error; its type is ``error.type``, else the
    ``exception.type`` of the span's last ``exception`` event; neither gives no type (the reducer
    then classifies the call as ``unknown``)."""
    error_type = attributes.get(attr.ERROR_TYPE)
    status = span.status
    failed = error_type is not None or (
        status is not None and status.status_code is StatusCode.ERROR
    )
    if not failed:
        return False, None
    if type(error_type) is str and error_type:
        return True, error_type.lower()
    for event in reversed(span.events or ()):
        if event.name == attr.EXCEPTION_EVENT:
            raised = (event.attributes or {}).get(attr.EXCEPTION_TYPE)
            if type(raised) is str and raised:
                return True, raised.lower()
            break
    return True, None


def has_prefix(attributes: Mapping[str, Any], prefix: str) -> bool:
    return any(type(key) is str and key.startswith(prefix) for key in attributes)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A settled tool call as a profile read it: ``call_id`` ``None`` means the span ID."""

    call_id: str | None
    tool_name: str | None
    tool_type: Literal["native", "mcp"]
    failed: bool
    error_type: str | None


@dataclass(frozen=True, slots=True)
class Claim:
    """What one ended span is to a profile. ``prompt_id`` is set on prompts only, ``None`` when
    the span names none (its span ID is used); ``call`` on tool calls only."""

    kind: ClaimKind
    profile: ProfileName
    prompt_id: str | None = None
    call: ToolCall | None = None


class InferredProfile(Protocol):
    """A convention whose batches are inferred from model calls (sections 3b and 3c).

    ``claim_keys``: a span carrying none of these attribute keys is never claimed, which is how
    the processor turns unclaimed spans away with a few membership tests.
    """

    @property
    def name(self) -> ProfileName: ...

    @property
    def claim_keys(self) -> tuple[str, ...]: ...

    def read(self, span: ReadableSpan, attributes: Mapping[str, Any], root: bool) -> Claim | None:
        """What the ended span is, or ``None``; ``root``: it has no parent in this process."""
        ...

    def model_call(self, attributes: Mapping[str, Any]) -> bool:
        """Whether :meth:`read` would take the span for a model call if it carried no ``acp.*``
        attribute: a few look-ups, so that a model call that is its trace's root (a chat
        completion outside any agent) is turned away without reading it."""
        ...


@dataclass(frozen=True, slots=True)
class PromptStarted:
    """An inferred prompt is about to be evaluated: its state starts never enforcing.
    ``span_id`` is its (outermost) prompt span's: prompts sharing a conversation ID stay apart."""

    prompt_id: str
    profile: ProfileName
    span_id: int = 0


@dataclass(frozen=True, slots=True)
class BatchSettled:
    """An inferred batch settled; ``span`` stands for the model-call or prompt span that settled
    it (its name, context, parent, resource and times)."""

    prompt_id: str
    batch: Batch
    span: ReadableSpan
    profile: ProfileName


@dataclass(frozen=True, slots=True)
class PromptEnded:
    """The inferred prompt is done: its state is discarded (unless it collided)."""

    prompt_id: str


@dataclass(frozen=True, slots=True)
class ProfileDiagnostic:
    name: Literal["late_span", "duplicate_span", "batch_overflow", "evicted", "prompt_collision"]
    prompt_id: str | None
    span_context: SpanContext | None


ProfileEvent = PromptStarted | BatchSettled | PromptEnded | ProfileDiagnostic


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the inferred profiles have seen, for saying why a trace gave the guard nothing."""

    prompts: int
    model_calls: int
    tool_calls: int
    orphan_tool_calls: int
