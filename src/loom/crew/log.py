"""The crew's own journal: its run record and what each member was handed and returned.

A crew run is a run of the crew's session: ``AGENT_START`` (with the task) and a ``running``
run record open it, ``CREW_MEMBER_START`` / ``CREW_MEMBER_FINISH`` record each member run, and
``AGENT_FINISH`` with the end run record closes it. Everything goes through a ``Journal`` under
the crew session's lease (the journal is the only writer); parallel members' records are
committed one at a time so their sequence numbers follow the commit order.

Durability: a crew run that died has a start and no finish (a cancelled one ends with
``cancelled``, one parked on a member's approval with ``awaiting_approval``).
``unfinished_run`` finds it, and the next run of the same task on that session (or
``Crew.resume``) reuses every member run it recorded as completed (by key) instead of running
it again, and carries on every member run it started and never finished (``interrupted``):
the member's message is already in its child session, so its turn goes on from there
(``Runtime.start(agent, CarryOn(), ...)``: the turn's own recovery closes its open calls) and
the message is never sent twice.

The crew session is held like an agent's (``loom.engine.gates``: lease, keep-alive, release),
and the crew run closes what a dead run of the session left open the way a turn does: the open run
records ``loom.engine.recovery.find_loose_ends`` reports get ``RUN_RECOVERED`` and a ``crashed`` end
record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loom.engine.journal import Journal
from loom.engine.recovery import CRASHED, find_loose_ends
from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    CrewMemberFinish,
    CrewMemberStart,
    LlmComplete,
    RunRecovered,
    UserMessage,
)
from loom.messages import Usage
from loom.store.base import Lease, RunRecord, RunStore, Store

__all__ = ["CrewLog", "Unfinished", "asked_by", "unfinished_run"]


@dataclass(slots=True)
class Unfinished:
    """A crew run that started and never finished, and the member runs it completed."""

    run_id: str
    task: str
    state_scope: str
    dead: bool = True  # False: it ended cancelled or awaiting approval (it has its end record)
    done: dict[str, CrewMemberFinish] = field(default_factory=dict)
    # member runs (by key) started and never finished, or stopped by a cancel: carried on
    interrupted: dict[str, CrewMemberStart] = field(default_factory=dict)
    resumed_from: tuple[str, ...] = ()  # the earlier runs this one resumed, newest first

    @property
    def chain(self) -> tuple[str, ...]:
        """This run and every run it resumed, newest first."""
        return (self.run_id, *self.resumed_from)


async def unfinished_run(store: Store, session_id: str) -> Unfinished | None:
    """The newest crew run of ``session_id`` with no ``AGENT_FINISH``, if any."""
    events = await store.load_events(session_id)
    starts: dict[str, AgentStart] = {}
    finished: set[str] = set()
    cancelled: set[str] = set()
    for ev in events:
        if isinstance(ev, AgentStart) and ev.extra.get("crew"):
            starts[ev.run_id] = ev
        elif isinstance(ev, RunRecovered):
            finished.add(ev.recovered_run_id)
        elif isinstance(ev, AgentFinish):  # cancelled (Ctrl-C) or parked on an approval:
            # resumable like a dead run
            paused = ev.stop_reason in ("cancelled", "awaiting_approval")
            (cancelled if paused else finished).add(ev.run_id)
    open_runs = [r for r in starts if r not in finished]
    if not open_runs:
        return None
    run_id = open_runs[-1]
    start = starts[run_id]
    scope = str(start.extra.get("state_scope") or run_id)
    earlier = tuple(str(r) for r in start.extra.get("resumed_from", ()))
    out = Unfinished(
        run_id, start.message_text, scope, dead=run_id not in cancelled, resumed_from=earlier
    )
    chain = set(out.chain)
    for ev in events:  # in commit order: the newest record of each member key wins
        if ev.run_id not in chain:
            continue
        if isinstance(ev, CrewMemberStart) and ev.child_run_id:  # an agent member's turn
            out.interrupted[ev.key] = ev
        elif isinstance(ev, CrewMemberFinish):
            if ev.stop_reason == "completed":  # reused results are carried forward
                out.done[ev.key] = ev
            if ev.stop_reason != "cancelled":  # a cancelled member's turn is carried on too
                out.interrupted.pop(ev.key, None)
    for key in out.done:
        out.interrupted.pop(key, None)
    return out


async def asked_by(store: Store, start: CrewMemberStart) -> str | None:
    """The child run that committed the member's message for the member run ``start`` records
    (a carried-on run names the run it carries on), or None when that message never reached
    the child session (the process died before): then it must be sent."""
    asker = str(start.extra.get("asked_by") or start.child_run_id)
    for ev in await store.load_events(start.child_session_id, asker):
        if isinstance(ev, UserMessage):
            return asker
    return None


class CrewLog:
    """Commits one crew run's events in order (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        run_id: str,
        lease: Lease | None,
        parent_run_id: str | None,
        observers: Any,
        emit: Callable[[AgentEvent], None],
        runs: RunStore | None = None,
    ) -> None:
        self.store, self.runs = store, runs
        self.journal = Journal(
            store,
            session_id,
            run_id,
            [],
            lease=lease,
            parent_run_id=parent_run_id,
            observers=observers,
        )
        self.journal.emit = emit
        self._lock = asyncio.Lock()
        self.crew = ""

    @property
    def run_id(self) -> str:
        return self.journal.run_id

    @property
    def session_id(self) -> str:
        return self.journal.session_id

    async def start(
        self, crew_name: str, task: str, extra: dict[str, Any], recovered: Unfinished | None
    ) -> None:
        j = self.journal
        async with self._lock:
            # what dead runs of the session left open is closed before this run opens, as a
            # turn's INTAKE does (loom.engine.recovery): each open run record ends ``crashed``
            ends = await find_loose_ends(self.store, self.runs, j.session_id, {}, set(), j.run_id)
            dead = [r.run_id for r in ends.dead_runs]
            if recovered is not None and recovered.dead and recovered.run_id not in dead:
                dead.append(recovered.run_id)  # a store that keeps no run records
            for run_id in dead:
                await j.commit(
                    [j.event(RunRecovered, recovered_run_id=run_id, stop_reason=CRASHED)],
                    run=RunRecord(run_id, j.session_id, CRASHED, data={"recovered_by": j.run_id}),
                )
            if recovered is not None and not recovered.dead:  # cancelled or parked: resumed
                await j.commit(
                    [
                        j.event(
                            RunRecovered, recovered_run_id=recovered.run_id, stop_reason="resumed"
                        )
                    ]
                )
            self.crew = crew_name
            events: list[AgentEvent] = [
                j.event(
                    AgentStart, message_text=task, agent=crew_name, extra={"crew": True, **extra}
                )
            ]
            if recovered is None or recovered.task != task:  # a resumed run's task is in already
                # the task joins the crew session's transcript: a crew session reads as a
                # conversation (the task, the crew's answer) wherever sessions are shown
                events.append(j.event(UserMessage, content=task))
            await j.commit(events, run=RunRecord(j.run_id, j.session_id, "running"))

    async def member_start(self, **payload: Any) -> None:
        async with self._lock:
            await self.journal.commit([self.journal.event(CrewMemberStart, **payload)])

    async def member_finish(self, **payload: Any) -> None:
        async with self._lock:
            await self.journal.commit([self.journal.event(CrewMemberFinish, **payload)])

    def warn(self, text: str) -> None:
        self.journal.warn(text, "crew")

    async def finish(
        self,
        stop: str,
        output: str,
        usage: Usage,
        error: str | None,
        duration_ms: float,
        pending: list[dict[str, Any]] | None = None,
    ) -> None:
        j = self.journal
        async with self._lock:
            events: list[AgentEvent] = []
            if stop == "completed" and output:  # the crew's answer joins its transcript
                events.append(
                    j.event(
                        LlmComplete, answer=output, model=f"crew:{self.crew}", extra={"crew": True}
                    )
                )
            events.append(
                j.event(
                    AgentFinish,
                    stop_reason=stop,
                    output=output,
                    usage=usage.model_dump(),
                    error=error,
                    duration_ms=duration_ms,
                    pending_approvals=pending or [],
                    warnings=list(j.warnings),
                )
            )
            await j.commit(
                events, run=RunRecord(j.run_id, j.session_id, stop, usage, data={"error": error})
            )
