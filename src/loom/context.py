"""CONTEXT stage: the one place that compiles what the model sees for a call.

``ContextBuilder.build`` is a pure function of the session's persisted messages plus the agent's
configuration; nothing else changes what the model sees (DESIGN principle 1). The default
builder sends the system prompt and the whole history; ``loom.memory`` provides the budgeted,
segmented one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from loom.content_tokens import media_rule_for, part_tokens
from loom.events import EventType
from loom.messages import Message, ToolSpec

if TYPE_CHECKING:
    from loom.memory.recall import Recalled
    from loom.spec import AgentSpec

__all__ = ["AssembledContext", "ContextBuilder", "ContextRequest", "FullHistoryBuilder"]


@dataclass(slots=True)
class ContextRequest:
    """What the builder may read: the agent, the committed transcript, turn identity, this
    turn's tool specs and model (from the turn's ``RunDeps``), and its recalled memories."""

    agent: AgentSpec
    history: Sequence[Message]
    session_id: str
    run_id: str
    iteration: int
    user_message: str
    extra_system: list[str] = field(default_factory=list)  # e.g. matched patterns for ROM
    tool_specs: list[ToolSpec] = field(default_factory=list)
    model: Any = None
    recalled: Recalled | None = None
    """Memories from earlier sessions the turn recalled (``loom.memory.recall``: searched once
    per turn, for the run's owner), for the builder to place in the Kernel; None: recall off."""


@dataclass(slots=True)
class AssembledContext:
    """The compiled context: messages and tools for the call, its token estimate, and notes.

    ``notes`` are (event type, data) pairs the loop emits in order: component decisions,
    compression progress. ``persist`` are messages the builder derived (summaries, memory
    bookkeeping) that the loop appends to the transcript, together with the notes' events,
    before it calls the model, so the next context is again a function of the transcript.

    ``cache_points`` are indices into ``messages``, each ending a segment of the stable prefix
    the next request is expected to repeat (``loom.models.cache``); the loop hands them to the
    provider in ``ModelSettings.cache_points``. Empty: nothing to mark.
    """

    messages: list[Message]
    tools: list[ToolSpec]
    token_estimate: int
    notes: list[tuple[EventType, dict[str, Any]]] = field(default_factory=list)
    persist: list[Message] = field(default_factory=list)
    cache_points: list[int] = field(default_factory=list)


class ContextBuilder(Protocol):
    """Compiles the context for one model call."""

    async def build(self, request: ContextRequest) -> AssembledContext:
        """Return the messages and tools to send."""
        ...


def system_prompt(request: ContextRequest) -> str:
    parts = [request.agent.instructions, *request.extra_system]
    return "\n\n".join(p for p in parts if p)


class FullHistoryBuilder:
    """Sends the system prompt and the whole history, with a rough token estimate: text at
    4 characters a token, and each image, file, audio and reasoning part by the rules of the
    model it goes to (``loom.content_tokens``, the memory layer's rules too), so a history
    with a 5 MB image is not estimated as its caption."""

    async def build(self, request: ContextRequest) -> AssembledContext:
        system = system_prompt(request)
        messages = (
            [Message(role="system", content=system), *request.history]
            if system
            else list(request.history)
        )
        chars = sum(len(m.content) for m in messages)
        rule = media_rule_for(request.model)
        media = sum(
            part_tokens(part, rule, text_tokens) for m in messages if m.parts for part in m.parts
        )
        # the whole history is the prefix: the system prompt's end, and the last message,
        # which the next request repeats
        points = sorted({0, len(messages) - 1} if system else {len(messages) - 1})
        return AssembledContext(
            messages=messages,
            tools=request.tool_specs,
            token_estimate=chars // 4 + 4 * len(messages) + media,
            cache_points=[p for p in points if p >= 0],
        )


def text_tokens(text: str) -> int:
    """``text``'s tokens at 4 characters a token, rounded up: the estimate of
    ``FullHistoryBuilder``, for the text it counts apart from a message's (a reasoning part's,
    a placeholder's)."""
    return -(-len(text) // 4)
