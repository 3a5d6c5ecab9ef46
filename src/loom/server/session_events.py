"""A session's events, stored then live: what ``SubscribeToSession`` (gRPC) and
``GET /v1/sessions/{id}/events`` (SSE) serve.

The server's runtime has an observer (:meth:`SessionHub.publish`) that hands every event of every
run to the subscribers of its session. A subscriber registers first, then reads the journal
(``Store.load_events``), sends the stored events after its cursor, then the live ones; a live
event that was already sent from the journal is skipped by its ``(run_id, sequence)``, so nothing
is missed or sent twice across the boundary.

An event's id is ``"<run_id>:<sequence>"`` (``sequence`` counts within a run). Over SSE only a
run's steps (``loom.engine.journal.STEP_TYPES``, committed before they are emitted) carry their id
(:func:`sse_id`): lifecycle events (``stage``, …) and token deltas are sent without one, since
a crash may lose them, so every id a client received can be found again after a restart. A
cursor naming an event that was not journaled resumes at the next journaled event of its run.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from loom.engine.journal import STEP_TYPES
from loom.errors import InputError
from loom.events import AgentEvent, AgentFinish
from loom.store.base import Store
from loom.text import whole_number

__all__ = [
    "SessionHub",
    "Subscription",
    "event_id",
    "parse_cursor",
    "session_events",
    "sse_id",
]

QUEUE_LIMIT = 10_000
"""Live events a subscriber may fall behind by before its stream is ended (it reconnects)."""


def event_id(ev: AgentEvent) -> str:
    """The id a client reconnects with: ``"<run_id>:<sequence>"``."""
    return f"{ev.run_id}:{ev.sequence}"


def sse_id(ev: AgentEvent) -> str:
    """The SSE ``id:`` line of ``ev``: its :func:`event_id` for a journaled step, nothing for
    an event a crash may lose (a client never holds an id the journal cannot find)."""
    return f"id: {event_id(ev)}\n" if ev.type in STEP_TYPES else ""


def parse_cursor(value: str | None) -> tuple[str, int] | None:
    """``"<run_id>:<sequence>"`` as a pair (None for none); ``InputError`` when malformed."""
    if value is None or not value.strip():
        return None
    run_id, sep, seq = value.strip().rpartition(":")
    if not sep or not run_id or whole_number(seq) is None:
        raise InputError(
            f"an event id is '<run_id>:<sequence>' (as sent in each event), got {value!r}; "
            "subscribe without one to read the whole session"
        )
    return run_id, int(seq)


class Lagged(Exception):
    """The subscriber fell more than ``QUEUE_LIMIT`` events behind."""


@dataclass(eq=False)
class Subscription:
    session_id: str
    queue: asyncio.Queue[AgentEvent | None] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_LIMIT)
    )
    lagged: bool = False


class SessionHub:
    """Per-session fan-out of live events, fed by a ``Runtime`` observer."""

    def __init__(self) -> None:
        self.subs: dict[str, set[Subscription]] = {}
        self.recent: OrderedDict[str, str] = OrderedDict()  # run_id -> session of live runs
        self.closed = False

    def publish(self, ev: AgentEvent) -> None:
        """The runtime observer: called with every event, after it is committed (or, for
        announcements and deltas, as it is emitted)."""
        self.recent[ev.run_id] = ev.session_id
        self.recent.move_to_end(ev.run_id)
        if len(self.recent) > 4096:
            self.recent.popitem(last=False)
        for sub in self.subs.get(ev.session_id, ()):
            if sub.lagged:
                continue
            try:
                sub.queue.put_nowait(ev)
            except asyncio.QueueFull:
                sub.lagged = True

    def subscribe(self, session_id: str) -> Subscription:
        sub = Subscription(session_id)
        self.subs.setdefault(session_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self.subs.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subs[sub.session_id]

    def close(self) -> None:
        """End every subscriber's stream (server shutdown)."""
        self.closed = True
        for subs in self.subs.values():
            for sub in subs:
                sub.lagged = False
                while True:
                    try:
                        sub.queue.put_nowait(None)
                        break
                    except asyncio.QueueFull:
                        sub.queue.get_nowait()


async def session_events(
    hub: SessionHub, store: Store, session_id: str, after: str | None = None
) -> AsyncGenerator[tuple[AgentEvent, bool], None]:
    """The session's events after the ``after`` event id: the stored ones (``True``), then the
    live ones as they happen (``False``), until the caller stops or the server shuts down.
    ``SessionNotFound``-like errors come from the store (ownership); ``InputError`` for a cursor
    this session never sent; ``Lagged`` when the subscriber fell too far behind."""
    cursor = parse_cursor(after)
    sub = hub.subscribe(session_id)  # first: nothing emitted from here on is missed
    try:
        stored = await store.load_events(session_id)
        seen: set[tuple[str, int]] = {(e.run_id, e.sequence) for e in stored}
        start, skip_run = _start(stored, cursor, hub, session_id)
        for ev in stored[start:]:
            if skip_run is not None and ev.run_id == skip_run[0] and ev.sequence <= skip_run[1]:
                continue
            yield ev, True
        while not hub.closed:
            live = await sub.queue.get()
            if live is None:
                return
            key = (live.run_id, live.sequence)
            if key in seen:
                continue
            if skip_run is not None and live.run_id == skip_run[0] and live.sequence <= skip_run[1]:
                continue
            yield live, False
            if sub.lagged and sub.queue.empty():
                raise Lagged(
                    f"this subscriber fell more than {QUEUE_LIMIT} events behind; reconnect "
                    f"with the id of the last event it received ({event_id(live)})"
                )
    finally:
        hub.unsubscribe(sub)


def _start(
    stored: list[AgentEvent], cursor: tuple[str, int] | None, hub: SessionHub, session_id: str
) -> tuple[int, tuple[str, int] | None]:
    """Where the stored events resume after ``cursor``, and the run whose events up to a
    sequence are still to skip (stored or live)."""
    if cursor is None:
        return 0, None
    run_id, seq = cursor
    first = next((i for i, e in enumerate(stored) if e.run_id == run_id), None)
    if first is None:
        if hub.recent.get(run_id) == session_id:  # a live run that has committed nothing yet
            return len(stored), cursor
        raise InputError(
            f"session {session_id!r} has no event {run_id}:{seq}; subscribe without an event "
            "id to read the whole session"
        )
    end = next(
        (e.sequence for e in stored[first:] if e.run_id == run_id and isinstance(e, AgentFinish)),
        None,
    )
    if end is not None and seq > end:
        raise InputError(
            f"event {run_id}:{seq} is past the end of its run (its last event is "
            f"{run_id}:{end}); subscribe without an event id to read the whole session"
        )
    return first, cursor
