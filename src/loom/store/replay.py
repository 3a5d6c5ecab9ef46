"""Rebuild a session's transcript from its event journal.

The journal (``Store.load_events``) records every step a turn took, in order, and the loop
commits each step's messages and events in one transaction, so the messages can be derived
from the events alone: ``AGENT_START`` carries the user message, ``LLM_TOOL_CALLS`` +
``LLM_COMPLETE`` an assistant message, ``TOOL_RESULT`` / ``TOOL_ERROR`` a tool result (also
the ones crash recovery wrote). Messages written to a store without events (by code other than
the loop) cannot be rebuilt this way.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from loom.events import AgentEvent, EventType
from loom.messages import Message, ToolCall
from loom.store.base import Store

__all__ = ["messages_from_events", "replay_session"]


def messages_from_events(events: Iterable[AgentEvent]) -> list[Message]:
    """The messages the given events (in journal order) describe."""
    out: list[Message] = []
    pending: list[ToolCall] = []
    for ev in events:
        d, at = ev.data, datetime.fromtimestamp(ev.timestamp, UTC)
        if ev.type == EventType.AGENT_START:
            out.append(Message(role="user", content=str(d.get("message", "")), timestamp=at))
        elif ev.type == EventType.LLM_TOOL_CALLS:
            pending = [ToolCall.model_validate(c) for c in d.get("tool_calls", [])]
        elif ev.type == EventType.LLM_COMPLETE:
            out.append(
                Message(
                    role="assistant",
                    content=str(d.get("text") or ""),
                    tool_calls=pending,
                    timestamp=at,
                )
            )
            pending = []
        elif ev.type in (EventType.TOOL_RESULT, EventType.TOOL_ERROR):
            ok = bool(d.get("success"))
            out.append(
                Message(
                    role="tool",
                    content=str(d.get("content", "")),
                    tool_call_id=d.get("tool_call_id"),
                    name=d.get("tool_name"),
                    timestamp=at,
                    metadata={} if ok else {"success": False, "error_code": d.get("error_code")},
                )
            )
    return out


async def replay_session(store: Store, session_id: str) -> list[Message]:
    """The session's transcript as rebuilt from its journal (compare with ``load_messages``)."""
    return messages_from_events(await store.load_events(session_id))
