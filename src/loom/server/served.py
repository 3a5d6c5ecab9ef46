"""Running what a server serves by name, agent or crew, for the protocols that run one turn
and answer (the OpenAI-compatible API, Weave).

An agent runs through the runtime (``Runtime.run`` / ``Runtime.stream``). A crew runs as its
``CrewTurn`` (``Runtime.start``), counted like a turn by the server (limits, drain). Streamed,
a crew shows as one model: its own events only (not its members'), its answer as one text
delta when it has it (members' deltas are not the crew's answer), then its ``AGENT_FINISH``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from loom.engine.driving import discard, drive
from loom.events import AgentEvent, LlmComplete, LlmDelta

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.crew import Crew
    from loom.crew.turn import CrewTurn
    from loom.engine.run_inputs import NewMessage
    from loom.engine.runtime import Runtime
    from loom.messages import RunResult

__all__ = ["run_served", "stream_served"]


async def _crew_turn(
    runtime: Runtime, crew: Crew, message: str | NewMessage, session_id: str | None
) -> CrewTurn:
    return await runtime.start(crew, message, session_id=session_id)


async def run_served(
    runtime: Runtime, target: Agent | Crew, message: str | NewMessage, session_id: str | None
) -> RunResult:
    """One turn of ``target`` on ``message`` (text, or ``NewMessage(text, parts)``), to its
    end."""
    from loom.crew import Crew

    if not isinstance(target, Crew):
        return await runtime.run(target, message, session_id=session_id)
    turn = await _crew_turn(runtime, target, message, session_id)
    await turn.run(discard)
    assert turn.result is not None
    return turn.result


async def stream_served(
    runtime: Runtime, target: Agent | Crew, message: str | NewMessage, session_id: str | None
) -> AsyncGenerator[AgentEvent, None]:
    """The events of one turn of ``target`` (a crew's as in the module docstring)."""
    from loom.crew import Crew

    if not isinstance(target, Crew):
        async for ev in runtime.stream(target, message, session_id=session_id):
            yield ev
        return
    events = drive(await _crew_turn(runtime, target, message, session_id))
    try:
        async for ev in events:
            if ev.extra.get("member_path", target.name) != target.name:
                continue  # a member's: not the crew's answer
            if isinstance(ev, LlmComplete) and ev.answer:  # the crew's answer, as one delta
                yield LlmDelta(
                    run_id=ev.run_id,
                    session_id=ev.session_id,
                    sequence=ev.sequence,
                    delta=ev.answer,
                    extra=dict(ev.extra),
                )
            yield ev
    finally:
        await events.aclose()
