"""The server's runtime: it knows its live turns, limits them per API key and drains them.

``ServerRuntime.prepare`` records every turn it makes with the key of the request that made it
(``loom.server.security.current_principal``), refuses a key's turn past
``max_concurrent_runs`` (``QueueFull``, answered 429), and ``drain`` lets the live turns finish
within a grace period, then cancels the rest with the reason ``"server shutting down"``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from loom.errors import QueueFull
from loom.runtime import Runtime
from loom.server.security import current_principal

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.driving import Drivable
    from loom.loop import Turn

__all__ = ["SHUTDOWN_REASON", "ServerRuntime", "drain"]

SHUTDOWN_REASON = "server shutting down"


def _live(turn: Drivable) -> bool:
    if turn.result is not None:
        return False
    task: asyncio.Task[Any] | None = getattr(turn, "_task", None)
    return task is None or not task.done()


class ServerRuntime(Runtime):
    """A ``Runtime`` that tracks its turns by API key (see the module's docstring)."""

    def __init__(self, *args: Any, max_concurrent_runs: int = 0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.max_concurrent_runs = max_concurrent_runs
        # every prepared run: agent turns, and crew runs (``track``), by the key that made it
        self.turns: weakref.WeakKeyDictionary[Drivable, str] = weakref.WeakKeyDictionary()

    def live_turns(self, key: str | None = None) -> list[Drivable]:
        return [t for t, k in list(self.turns.items()) if _live(t) and (key is None or k == key)]

    def _admit(self, nested: bool) -> str:
        """The request's key, once its run is within ``max_concurrent_runs`` (else
        ``QueueFull``)."""
        principal = current_principal.get()
        key = principal.name if principal is not None else ""
        limit = self.max_concurrent_runs
        if principal is not None and limit > 0 and not nested:
            live = len(self.live_turns(key))
            if live >= limit:
                raise QueueFull(
                    f"API key {key!r} has {live} runs in progress, the limit of this server "
                    "(--max-concurrent-runs); wait for one to end and retry"
                )
        return key

    def track(self, run: Drivable) -> None:
        """Count ``run`` (a crew run, ``CrewTurn``) as one of this server's runs: within its
        key's limit, and drained at shutdown like a turn. Its members' turns are made by
        ``prepare`` under the crew run's id, so they do not count against the limit again."""
        self.turns[run] = self._admit(False)

    def prepare(
        self,
        agent: Agent,
        message: str | None,
        session_id: str | None,
        on_busy: str,
        deps: Any,
        resume: Any = None,
        parent_run_id: str | None = None,
        answer: Any = None,
        *,
        run_id: str | None = None,
        carry_on: bool = False,
        output_type: Any = None,
        max_cost: float | None = None,
    ) -> Turn:
        key = self._admit(parent_run_id is not None)
        # a served run's id is a UUID: the run APIs (LangGraph's, the Agent Protocol's) type it so
        run_id = run_id or str(uuid.uuid4())
        turn = super().prepare(
            agent,
            message,
            session_id,
            on_busy,
            deps,
            resume,
            parent_run_id,
            answer,
            run_id=run_id,
            carry_on=carry_on,
            output_type=output_type,
            max_cost=max_cost,
        )
        self.turns[turn] = key
        return turn


async def drain(runtime: Runtime, grace: float, settle: float = 5.0) -> list[str]:
    """Wait up to ``grace`` seconds for the live turns to end, then cancel what is left with
    the reason ``"server shutting down"`` and wait up to ``settle`` seconds for those to record
    their end. Answers the run ids that were cancelled."""
    if not isinstance(runtime, ServerRuntime):
        return []
    await _settle(runtime, grace)
    cancelled = []
    for turn in runtime.live_turns():
        turn.cancel(SHUTDOWN_REASON)
        cancelled.append(turn.run_id)
    await _settle(runtime, settle)
    return cancelled


async def _settle(runtime: ServerRuntime, seconds: float) -> None:
    """Wait until ``runtime`` has no live turn, for ``seconds`` at most."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / 0.05) + 1):
        if not runtime.live_turns() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.05)
