"""Crash recovery: close what an earlier run of a session left open, at the next turn's INTAKE.

A run that died (SIGKILL, OOM, power cut) can leave three kinds of loose ends:

1. tool calls whose ledger says ``started`` with no end: they were running. The tool's declared
   effect decides: ``pure`` and ``idempotent`` calls run again with the *same* idempotency key
   (``RunContext.idempotency_key`` = ``run_id:tool_call_id``) and their real result is recorded;
   ``at_most_once`` calls (the default) are not repeated and get an ``interrupted`` result that
   says their outcome is unknown;
2. tool calls in a stored assistant message that never reached the ledger: the process died
   between committing the model's answer and starting the tools, so they never ran; they get an
   ``interrupted`` result that says so;
3. the run itself, ``running`` with no end: it gets an end record with status ``"crashed"``
   and an ``AGENT_FINISH`` event, so its journal is complete.

Every tool call then has a result, which every provider requires of a history. Recovery runs
inside the session lock, so no live run of the session can be mistaken for a dead one. It costs
two indexed lookups per turn when there is nothing to recover (stores with ``open_runs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loom.events import AgentEvent, EventType
from loom.messages import Message, ToolCall, ToolResult
from loom.store.base import LedgerEntry, LedgerStatus, RunRecord
from loom.tools.base import RunContext
from loom.tools.executor import error_result, execute_call

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.loop import Turn

__all__ = ["recover_session"]

CRASHED = "crashed"


class _Journal:
    """Next event sequence numbers for the runs recovery writes events for."""

    def __init__(self, agent: Agent, session_id: str) -> None:
        self.store, self.session_id = agent.store, session_id
        self.next: dict[str, int] = {}

    async def event(self, run_id: str, type: EventType, data: dict[str, Any]) -> AgentEvent:
        if run_id not in self.next:
            events = await self.store.load_events(self.session_id, run_id)
            self.next[run_id] = max((e.sequence for e in events), default=-1) + 1
        seq = self.next[run_id]
        self.next[run_id] = seq + 1
        return AgentEvent(type, run_id, self.session_id, 0, seq, {**data, "recovered": True})


async def recover_session(agent: Agent, turn: Turn) -> None:
    """Resolve the loose ends of earlier runs of ``turn.session_id`` (see the module doc)."""
    store, session_id = agent.store, turn.session_id
    find_runs = getattr(store, "open_runs", None)
    open_runs: list[RunRecord] | None = await find_runs(session_id) if find_runs else None
    open_calls = await store.open_tool_calls(session_id)
    if not open_calls and open_runs == []:
        return  # the common case: the last run ended cleanly
    messages = await store.load_messages(session_id)
    answered = {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
    journal = _Journal(agent, session_id)
    fallback_run = (
        open_runs[-1].run_id
        if open_runs
        else (open_calls[-1].run_id if open_calls else turn.run_id)
    )

    for entry in open_calls:
        if entry.tool_call_id in answered:  # result stored but the ledger not closed
            await store.append(session_id, ledger=[entry.ended("interrupted", None)])
            continue
        call = ToolCall(id=entry.tool_call_id, name=entry.name, arguments=entry.arguments)
        if entry.effect in ("pure", "idempotent"):
            result = await _rerun(agent, turn, call, entry)
        else:
            result = error_result(
                call,
                "interrupted",
                f"the run that made this call stopped before it finished; whether {call.name} "
                "took effect is unknown. Check before repeating it.",
            )
        await _record(journal, entry.run_id, call, result, entry)
        answered.add(call.id)

    from loom.policy.approval import pending_approvals

    waiting = {p.tool_call_id for p in await pending_approvals(store, session_id, messages)}
    for call in _dangling(messages, answered | waiting):  # paused calls wait for a decision
        result = error_result(
            call,
            "interrupted",
            f"the run stopped before this call started: {call.name} did not run. Call it "
            "again if it is still needed.",
        )
        await _record(journal, fallback_run, call, result, None)

    for run in open_runs or ():
        finish = await journal.event(
            run.run_id,
            EventType.AGENT_FINISH,
            {
                "stop_reason": CRASHED,
                "output": "",
                "error": "the process running this turn died",
                "recovered_by": turn.run_id,
            },
        )
        await store.append(
            session_id,
            events=[finish],
            run=RunRecord(run.run_id, session_id, CRASHED, data={"recovered_by": turn.run_id}),
        )


def _dangling(messages: list[Message], answered: set[str]) -> list[ToolCall]:
    # Only the last run can have died mid-step: look after the last user message, so calls an
    # earlier turn deliberately left pending (awaiting approval) are not touched.
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    return [
        c
        for m in messages[last_user + 1 :]
        if m.role == "assistant"
        for c in m.tool_calls
        if c.id not in answered
    ]


async def _rerun(agent: Agent, turn: Turn, call: ToolCall, entry: LedgerEntry) -> ToolResult:
    # The same run_id and tool_call_id as the first attempt: the same idempotency key.
    ctx = RunContext(
        turn.session_id,
        entry.run_id,
        entry.tool_call_id,
        agent.name,
        agent.workspace,
        turn.deps,
        store=agent.store,
    )
    result = await execute_call(call, agent.tools, ctx, agent.tool_timeout)
    result.metadata["recovered"] = "rerun"
    return await agent._process_result(turn, call, result)


async def _record(
    journal: _Journal, run_id: str, call: ToolCall, result: ToolResult, entry: LedgerEntry | None
) -> None:
    kind = EventType.TOOL_RESULT if result.success else EventType.TOOL_ERROR
    event = await journal.event(
        run_id,
        kind,
        {
            "tool_name": call.name,
            "tool_call_id": call.id,
            "success": result.success,
            "content": result.to_content(),
            "error_code": result.error_code,
            "duration_ms": result.duration_ms,
        },
    )
    ledger = []
    if entry is not None:
        status: LedgerStatus = (
            "completed"
            if result.success
            else ("interrupted" if result.error_code == "interrupted" else "failed")
        )
        ledger.append(entry.ended(status, result))
    await journal.store.append(
        journal.session_id, messages=[Message.tool(result)], events=[event], ledger=ledger
    )
