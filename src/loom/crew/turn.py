"""A crew run ready for a driver: what ``Runtime.start(crew, ...)`` answers and a server runs.

``CrewTurn`` has the driving interface of ``loom.engine.loop.Turn`` — ``run_id``, ``session_id``,
``run(emit)``, ``cancel(reason)`` and ``result`` (a ``RunResult``) — so whatever drives a turn
(``loom.engine.driving.drive``, the server's run manager, graceful shutdown) drives a crew
unchanged.
``crew_result`` keeps the whole ``CrewResult`` (member runs, budget) once it ended.

``crew_pending`` lists the calls a crew session waits on — the parked calls of its members,
each with its ``member_path`` — as the session's own pending approvals: ``session_id`` is the
crew session (where the decision is given), ``child_session_id`` the member's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loom.crew.log import unfinished_run
from loom.errors import InputError
from loom.events import AgentEvent, CrewMemberFinish
from loom.messages import Message, RunResult, Usage, new_id

if TYPE_CHECKING:
    from loom.crew.result import CrewResult
    from loom.crew.spec import CrewSpec
    from loom.engine.runtime import Runtime
    from loom.store.base import Store

__all__ = ["CrewTurn", "by_member", "crew_pending"]


class CrewTurn:
    """One crew run, prepared and not started (see the module docstring)."""

    def __init__(
        self,
        crew: CrewSpec,
        runtime: Runtime,
        task: str,
        session_id: str | None,
        *,
        deps: Any = None,
        approvals: Any = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        owner: str | None = None,
    ) -> None:
        if not isinstance(task, str) or not task.strip():
            raise InputError("a crew's task must be non-empty text")
        self.crew, self.runtime, self.task = crew, runtime, task
        self.session_id = session_id or new_id("session")
        self.run_id = run_id or new_id("run")
        self.deps, self.approvals, self.parent_run_id = deps, approvals, parent_run_id
        self.owner = owner  # the crew run's owner (RunOptions.owner), its members' too
        self.result: RunResult | None = None
        self.crew_result: CrewResult | None = None
        self.cancel_reason: str | None = None
        self._task: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        return f"CrewTurn(crew={self.crew.name!r}, run_id={self.run_id!r})"

    async def run(self, emit: Callable[[AgentEvent], None]) -> None:
        """Run the crew to its end in the current task, handing every event of the crew and of
        its members (tagged with ``extra["member_path"]``) to ``emit``."""
        self._task = asyncio.current_task()
        try:
            res = await self.crew.execute(
                self.runtime,
                self.task,
                session_id=self.session_id,
                emit=emit,
                deps=self.deps,
                approvals=self.approvals,
                run_id=self.run_id,
                parent_run_id=self.parent_run_id,
                owner=self.owner,
            )
        except asyncio.CancelledError:
            if self.cancel_reason is None or self._task is None:
                raise  # not ours: whoever cancelled the task wants it to stop
            self._task.uncancel()  # ours: the crew recorded its end; answer like a turn does
            self.result = RunResult(
                output="",
                messages=[],
                usage=Usage(),
                session_id=self.session_id,
                run_id=self.run_id,
                stop_reason="cancelled",
                error=self.cancel_reason,
            )
            return
        self.crew_result = res
        messages = [Message(role="assistant", content=res.output)] if res.output else []
        self.result = RunResult(
            output=res.output,
            text=res.output,
            messages=messages,
            usage=res.usage,
            session_id=res.session_id,
            run_id=res.run_id,
            stop_reason=res.stop_reason,
            error=res.error,
            pending_approvals=as_crew_session(res.pending_approvals, res.session_id),
            warnings=list(res.warnings),
        )

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        """Stop the crew at its next await: running members are cancelled and recorded, the
        crew run ends ``cancelled`` (a later run of the same task resumes it)."""
        if self.cancel_reason is not None or self.result is not None:
            return
        if self._task is not None and not self._task.done():
            self.cancel_reason = reason
            self._task.cancel()


def as_crew_session(parked: list[dict[str, Any]], crew_session: str) -> list[dict[str, Any]]:
    """Parked member calls as the crew session's: ``session_id`` the crew session (where they
    are decided), ``child_session_id`` the member's own."""
    return [
        {
            **p,
            "child_session_id": p.get("child_session_id", p.get("session_id")),
            "session_id": crew_session,
        }
        for p in parked
    ]


async def crew_pending(store: Store, session_id: str) -> list[dict[str, Any]]:
    """The calls the crew session ``session_id`` waits on: its members' parked calls, each with
    its ``member_path`` (empty when its last crew run is not waiting for a human)."""
    from loom.policy.approval import pending_approvals

    prior = await unfinished_run(store, session_id)
    if prior is None:
        return []
    parked: dict[str, str] = {}  # child session -> member path, the latest run's
    for ev in await store.load_events(session_id, prior.run_id):
        if isinstance(ev, CrewMemberFinish) and ev.stop_reason == "awaiting_approval":
            parked[ev.child_session_id] = ev.path
    out = []
    for child, path in parked.items():
        for p in await pending_approvals(store, child):
            out.append({**p.to_dict(), "member_path": path})
    return as_crew_session(out, session_id)


def by_member(
    decisions: Any, pending: list[dict[str, Any]], session_id: str, root: str | None = None
) -> Any:
    """``decisions`` keyed by tool call id (as an API collects them) regrouped by member path,
    which is what the crew's runner takes; one decision for all is returned as it is, and a
    key that is a member path (one of ``pending``'s, or under ``root``, the crew's name: that
    member, not parked, stays as it is) is kept. ``InputError`` for any other key."""
    if not isinstance(decisions, Mapping) or not decisions:
        return decisions
    if "decision" in decisions and not any(
        k == p["tool_call_id"] for p in pending for k in decisions
    ):
        return decisions  # one decision ({"decision": ...}) for every parked call
    paths = {p["member_path"] for p in pending}
    where = {p["tool_call_id"]: p["member_path"] for p in pending}
    out: dict[str, Any] = {}
    for key, decision in decisions.items():
        path = where.get(key)
        if path is not None:
            if not isinstance(out.setdefault(path, {}), dict):
                raise InputError(f"member {path!r} was given a decision and one for call {key!r}")
            out[path][key] = decision
        elif key in paths or (root is not None and str(key).startswith(f"{root}/")):
            if key in out:
                raise InputError(f"member {key!r} was given a decision and one for its calls")
            out[key] = decision
        else:
            raise InputError(
                f"crew session {session_id!r} has no pending call {key!r}; "
                f"pending calls: {', '.join(where) or 'none'}"
            )
    return out
