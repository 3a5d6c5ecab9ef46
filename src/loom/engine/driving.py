"""Running a turn for a caller: a task for the turn, a cheap channel for its events.

``Agent.stream`` drives the turn in its own task so that a slow consumer never holds up the
turn's timeouts; ``Agent.run`` needs no events and runs the turn in the caller's task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

from loom.engine.run_inputs import Drivable
from loom.events import AgentEvent

__all__ = ["Drivable", "discard", "drive", "watch"]


_DONE = object()


def discard(event: AgentEvent) -> None:
    """The event sink of a run nobody streams."""
    return None


class _Channel:
    """A one-consumer event queue that is cheaper than ``asyncio.Queue`` on the hot path."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.items.popleft()


def watch(cancel: asyncio.Event | None, turn: Drivable) -> asyncio.Future[Any] | None:
    """Cancel ``turn`` when ``cancel`` is set."""
    if cancel is None:
        return None
    watcher = asyncio.ensure_future(cancel.wait())
    watcher.add_done_callback(lambda f: None if f.cancelled() else turn.cancel())
    return watcher


async def drive(
    turn: Drivable, cancel: asyncio.Event | None = None
) -> AsyncGenerator[AgentEvent, None]:
    """Run the turn in its own task and hand its events over as they come."""
    channel = _Channel()
    task = asyncio.ensure_future(turn.run(channel.put))
    task.add_done_callback(lambda _: channel.put(_DONE))
    watcher = watch(cancel, turn)
    try:
        while (item := await channel.get()) is not _DONE:
            yield item
        await task  # re-raise what the turn raised
    finally:
        if watcher is not None:
            watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
