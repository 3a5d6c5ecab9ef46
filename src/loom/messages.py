"""The data every part of Loom shares: messages, tool calls and results, usage, responses."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from loom.content import Part, UserContent, split_content

__all__ = [
    "Effect",
    "Message",
    "ModelResponse",
    "Role",
    "RunResult",
    "StopReason",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "new_id",
    "utcnow",
]

Role = Literal["system", "user", "assistant", "tool"]

StopReason = Literal[
    "completed",  # the model gave a final answer
    "max_iterations",  # the tool loop hit Agent.max_iterations
    "max_tool_calls",  # the turn hit Agent.max_tool_calls
    "timeout",  # the turn hit Agent.timeout (wall clock)
    "cancelled",  # the caller cancelled, or another turn interrupted this one
    "awaiting_approval",  # a tool call waits for a human decision; resume later
    "awaiting_input",  # the model asked the client something (a server query); answer it
    "model_error",  # the model provider failed after its retries
    "guardrail",  # a guardrail tripped; see the GUARDRAIL event and RunResult.error
    "output_invalid",  # the answer did not fit the output_type after output_retries corrections
    "budget",  # a crew's tree-wide budget refused a model call or a spawn; see ``error``
    "rewound",  # the run moved the session to an earlier point (Rewind) and called no model
    "cost_limit",  # the run's model calls cost more than its max_cost (loom.pricing)
    "loop",  # the model repeated a call or an answer (loom.loop_detection); see ``error``
    "error",  # a fatal hook or an internal error; see the ERROR event
]
"""Why a run ended. ``RunResult.stop_reason`` is always one of these."""


Effect = Literal["pure", "idempotent", "at_most_once"]
"""What re-running a tool after a crash would do.

``pure``: no side effects; ``idempotent``: side effects that are safe to repeat with the same
idempotency key; ``at_most_once``: never re-run automatically (writes, commands, payments).
"""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model is told about a tool: name, description, JSON schema of the arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


# One encoder for the hot paths: ``json.dumps`` with options builds a new encoder on every call.
JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """A short random id such as ``call_3f9a0c1b2d4e``; 48 bits is plenty inside a session."""
    return f"{prefix}_{secrets.token_hex(6)}"


_set = object.__setattr__


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, defer_build=True)

    @classmethod
    def trusted(cls, **values: Any) -> Self:
        """A model from values that are already valid, given for every field: built without
        validation. For the engine's own data on the hot path (a message derived from an
        event it made, a result it shaped), where validating costs more than the step's
        work; input from outside goes through the validating constructor. What
        ``model_construct`` does, without its per-field default and alias handling (which
        costs more than validating)."""
        obj = cls.__new__(cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", set(values))
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj


class Usage(_Model):
    """Tokens a run or a model call used, and what they cost.

    ``cache_read_tokens`` / ``cache_write_tokens`` are the part of ``input_tokens`` the provider
    read from / wrote to its prompt cache (0 when it does not say). ``cost`` is in US dollars
    (``loom.pricing``): ``None`` when the price of a model involved is unknown, never a guess.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def empty(self) -> bool:
        """Nothing was used (no request, no token): its cost does not count in a sum."""
        return not (self.requests or self.input_tokens or self.output_tokens)

    def __add__(self, other: Usage) -> Usage:
        # An unknown cost makes the sum unknown (never a wrong total); an empty side adds nothing.
        if self.empty:
            cost = other.cost
        elif other.empty:
            cost = self.cost
        elif self.cost is None or other.cost is None:
            cost = None
        else:
            cost = round(self.cost + other.cost, 10)
        return Usage.trusted(  # sums of two valid usages
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            requests=self.requests + other.requests,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost=cost,
        )


class ToolCall(_Model):
    """A model's request to run one tool.

    ``arguments`` is the parsed JSON object. When the model produced text that is not a JSON
    object, ``arguments`` is empty and ``raw_arguments`` keeps the text, so the loop can tell the
    model exactly what it got wrong.
    """

    id: str = Field(default_factory=lambda: new_id("call"))
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None

    @classmethod
    def from_json(cls, name: str, text: str, id: str | None = None) -> ToolCall:
        """Build a call from the argument text a provider streamed, keeping bad JSON visible."""
        call_id = id or new_id("call")
        try:
            parsed = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            return cls(id=call_id, name=name, raw_arguments=text)
        if not isinstance(parsed, dict):
            return cls(id=call_id, name=name, raw_arguments=text)
        return cls(id=call_id, name=name, arguments=parsed)


class ToolResult(_Model):
    """What one tool call produced: data on success, an error code and message on failure.

    ``parts``: the images, files and audio the tool returned (``loom.tools.media``); the
    data names them, the tool message carries them (stored as references)."""

    tool_call_id: str
    name: str
    success: bool = True
    data: Any = None
    error_code: str | None = None
    error_message: str | None = None
    duration_ms: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)
    parts: list[Part] = Field(default_factory=list)

    def to_content(self) -> str:
        """The text the model reads for this result."""
        if not self.success:
            return f"Error ({self.error_code}): {self.error_message}"
        if isinstance(self.data, str):
            return self.data
        try:
            return JSON_ENCODER.encode(self.data)
        except (TypeError, ValueError):
            return str(self.data)


class Message(_Model):
    """One entry of a conversation, as stored and as sent to a model.

    ``content`` is the message's text; ``parts`` holds what is not text (``loom.content``):
    a user message's or a tool result's images, files and audio (shown after the text), an
    assistant message's reasoning (before its text)."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    timestamp: datetime = Field(default_factory=utcnow)
    metadata: dict[str, Any] = Field(default_factory=dict)
    parts: list[Part] = Field(default_factory=list)

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str | Sequence[UserContent]) -> Message:
        """A user message of text, or of text and media (``["Describe:", Image(...)]``)."""
        text, parts = split_content(content)
        return cls(role="user", content=text, parts=parts)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=content, tool_calls=tool_calls or [])

    @classmethod
    def tool(
        cls, result: ToolResult, content: str | None = None, parts: Sequence[Part] = ()
    ) -> Message:
        """The message carrying ``result`` to the model (``content`` if already rendered;
        ``parts``: the media the tool returned, by default ``result.parts``)."""
        return cls(
            role="tool",
            content=result.to_content() if content is None else content,
            tool_call_id=result.tool_call_id,
            name=result.name,
            metadata={"success": result.success, "error_code": result.error_code}
            if not result.success
            else {},
            parts=list(parts) if parts else list(result.parts),
        )


class ModelResponse(_Model):
    """One complete answer of a model: text, tool calls, or both; ``parts`` holds the
    reasoning it returned (``loom.content.Reasoning``), kept to send back unchanged."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str | None = None
    parts: list[Part] = Field(default_factory=list)

    def to_message(self) -> Message:
        return Message(
            role="assistant",
            content=self.text,
            tool_calls=list(self.tool_calls),
            parts=list(self.parts),
        )


class RunResult(_Model):
    """The outcome of one turn (``Agent.run``).

    ``stop_reason`` is one of :data:`StopReason`. ``messages`` are the messages this turn added
    to the session (user message, assistant messages, tool results), in order.

    ``output`` is the answer: its text, or for an agent with an ``output_type`` the validated
    typed value (``None`` when the run ended without one). ``text`` is always the answer's
    text (for a typed answer, the JSON it was parsed from); the server's APIs send ``text``.
    """

    output: Any
    text: str = ""
    messages: list[Message]
    usage: Usage
    session_id: str
    run_id: str
    stop_reason: StopReason
    iterations: int = 0
    error: str | None = None
    verdict: dict[str, Any] | None = None
    pending_approvals: list[dict[str, Any]] = Field(default_factory=list)
    pending_query: dict[str, Any] | None = None
    """With ``stop_reason="awaiting_input"``: the server query (``loom.queries``) to answer."""
    warnings: list[str] = Field(default_factory=list)
    """What the user should know that did not stop the run: a tool server that failed to
    start, text that had to be escaped to be stored, ..."""
