"""Crash recovery: close the tool calls an earlier run of a session left open.

A call found ``started`` in the ledger without an end was in flight when its process died (or
its run was cancelled before cleanup). The session's history would be invalid for every
provider with a tool call and no result, so each one is resolved before the new turn reads the
history: the call gets an ``interrupted`` result saying its outcome is unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loom.messages import Message, ToolCall
from loom.store.base import LedgerEntry
from loom.tools.executor import error_result

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.loop import Turn

__all__ = ["recover_session"]


async def recover_session(agent: Agent, turn: Turn) -> None:
    store = agent.store
    open_calls = await store.open_tool_calls(turn.session_id)
    if not open_calls:
        return
    answered = {
        m.tool_call_id
        for m in await store.load_messages(turn.session_id)
        if m.role == "tool" and m.tool_call_id
    }
    for entry in open_calls:
        call = ToolCall(id=entry.tool_call_id, name=entry.name, arguments=entry.arguments)
        result = error_result(
            call,
            "interrupted",
            f"the run that made this call stopped before it finished; whether {call.name} "
            "took effect is unknown. Check before repeating it.",
        )
        await store.append(
            turn.session_id,
            messages=[] if entry.tool_call_id in answered else [Message.tool(result)],
            ledger=[
                LedgerEntry(
                    entry.run_id,
                    entry.session_id,
                    entry.tool_call_id,
                    entry.name,
                    "interrupted",
                    entry.arguments,
                    entry.effect,
                    result,
                )
            ],
        )
