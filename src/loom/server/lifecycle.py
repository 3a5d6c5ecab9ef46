"""The server's runtime: it knows its live turns, limits them per API key and drains them.

``ServerRuntime.start`` (the front door, ``Runtime.start``) records every run it starts, of an
agent or a crew, with the key of the request that made it
(``loom.server.security.current_principal``), refuses a key's run past
``max_concurrent_runs`` (``QueueFull``, answered 429), and ``drain`` lets the live turns finish
within a grace period, then cancels the rest with the reason ``"server shutting down"``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from loom.engine.run_inputs import RunOptions
from loom.engine.runtime import Runtime
from loom.errors import QueueFull
from loom.server.ownership import current_principal

if TYPE_CHECKING:
    from loom.engine.run_inputs import Drivable, Input
    from loom.engine.runtime import Runnable, RunT

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
        # every run started here (agent turns and crew runs), by the key that started it
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
        """Count ``run`` as one of this server's runs (within its key's limit, drained at
        shutdown). ``start`` does it for every run it starts; a run already counted is left
        as it is."""
        if run not in self.turns:
            self.turns[run] = self._admit(False)

    async def start(
        self,
        target: Runnable[RunT],
        input: Input,
        *,
        session_id: str | None = None,
        options: RunOptions | None = None,
    ) -> RunT:
        """``Runtime.start``, admitted first: the request's key must be within
        ``max_concurrent_runs`` (``QueueFull`` else; a member run of a crew, one with a
        ``parent_run_id``, counts as its crew's), and the run is counted under that key. A
        served run's id is a UUID unless the caller names it: the run APIs (LangGraph's, the
        Agent Protocol's) type it so. A run that names no owner acts for its session's owner,
        else for the request's key (``RunOptions.owner``)."""
        from dataclasses import replace

        if options is None or options.run_id is None:
            options = replace(options or RunOptions(), run_id=str(uuid.uuid4()))
        if options.owner is None:  # the run acts for its session's owner, else the request's key
            principal = current_principal.get()
            recorded = await self.session_owner(session_id) if session_id is not None else None
            owner = recorded or (principal.name if principal is not None else None)
            if owner is not None:
                options = replace(options, owner=owner)
        nested = options.parent_run_id is not None
        key = self._admit(nested)
        run = await super().start(target, input, session_id=session_id, options=options)
        self.turns[run] = key
        return run


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
