"""Session gates: exactly one execution per session (seed 004), in a process and across them.

A turn that finds its session busy either waits (``on_busy="queue"``, FIFO, bounded depth and
wait), gives up (``"drop"``), or cancels the running turn and takes over (``"interrupt"``).
Within a runtime the gate is an asyncio lock per session; across runtimes and processes the
store's lease is taken as well (``Store.acquire_lease``): it expires so a dead process cannot
hold a session for ever, the runtime renews it while the turn runs, and its fencing token is
checked by every append, so a holder whose lease was taken over cannot write.

``held`` is the whole envelope in one ``async with``: enter the gate, keep the lease alive while
the body runs, release it (and forget an idle gate) however the body ends. A crew run holds its
session with it; the body writes the run's end record before it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from loom.errors import InputError, LeaseLost, QueueFull, QueueTimeout, SessionBusy
from loom.store.base import Lease, Store

__all__ = ["GateKeeper", "OnBusy", "SessionGate", "acquire", "held", "keep_alive", "release"]

OnBusy = Literal["queue", "drop", "interrupt"]


@dataclass(slots=True)
class SessionGate:
    """The in-process gate of one session: an asyncio lock plus what interrupts need."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0
    holder_interrupt: Callable[[], None] | None = None
    holder_run: str | None = None  # the run holding (or still taking) the gate
    interrupt_target: str | None = None  # interrupted while it was still taking the store lock
    tickets: int = 0
    newest_interrupt: int = 0  # ticket of the newest waiting on_busy="interrupt" turn
    lease: Lease | None = None


async def acquire(
    gate: SessionGate,
    store: Store,
    session_id: str,
    run_id: str,
    *,
    on_busy: OnBusy,
    interrupt: Callable[[], None],
    queue_timeout: float,
    max_queue_depth: int,
    lock_ttl: float,
) -> SessionGate:
    """Enter the session's gate according to ``on_busy``; raise a typed error if refused.

    ``interrupt`` cancels a running turn and the newest interrupting turn wins: turns with
    ``on_busy="interrupt"`` that were still waiting when a newer one arrived give up with
    ``SessionBusy`` without running, so a burst of interrupts runs only the last one.
    """
    if on_busy not in ("queue", "drop", "interrupt"):
        raise InputError(f"on_busy must be 'queue', 'drop' or 'interrupt', got {on_busy!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + queue_timeout
    ticket: int | None = None
    if gate.lock.locked():
        if on_busy == "drop":
            raise SessionBusy(
                f"session {session_id!r} is running another turn; retry later or use "
                "on_busy='queue'"
            )
        if on_busy == "interrupt":
            gate.tickets += 1
            ticket = gate.newest_interrupt = gate.tickets
            if gate.holder_interrupt is not None:
                gate.holder_interrupt()
            else:  # the holder is still taking the store lock: it stops as soon as it starts
                gate.interrupt_target = gate.holder_run
        elif gate.waiting >= max_queue_depth:
            raise QueueFull(
                f"session {session_id!r} already has {gate.waiting} turns waiting (max "
                f"{max_queue_depth}); retry later"
            )
    gate.waiting += 1
    try:
        async with asyncio.timeout_at(deadline):
            await gate.lock.acquire()
    except TimeoutError:
        raise QueueTimeout(
            f"waited {queue_timeout:g} s for session {session_id!r} to be free; retry later"
        ) from None
    finally:
        gate.waiting -= 1
    if ticket is not None and ticket != gate.newest_interrupt:
        gate.lock.release()
        raise SessionBusy(
            f"a newer turn with on_busy='interrupt' replaced this one on session "
            f"{session_id!r} before it started; it did not run"
        )
    gate.holder_run, gate.holder_interrupt = run_id, None
    try:
        delay = 0.01
        while (lease := await store.acquire_lease(session_id, run_id, lock_ttl)) is None:
            if on_busy == "drop":
                raise SessionBusy(
                    f"session {session_id!r} is running a turn in another process; retry later "
                    "or use on_busy='queue'"
                )
            if loop.time() + delay > deadline:
                raise QueueTimeout(
                    f"session {session_id!r} is locked by another process; waited "
                    f"{queue_timeout:g} s. Retry later."
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
    except BaseException:
        gate.holder_run = None
        gate.lock.release()
        raise
    gate.lease = lease
    gate.holder_interrupt = interrupt
    if gate.interrupt_target == run_id:
        gate.interrupt_target = None
        interrupt()
    return gate


async def keep_alive(
    store: Store, gate: SessionGate, ttl: float, lost: Callable[[str], None]
) -> None:
    """Renew the gate's lease every third of its ``ttl`` while the turn runs; call ``lost``
    with the reason when another holder took it over (the turn then stops: it cannot write)."""
    while True:
        await asyncio.sleep(ttl / 3)
        lease = gate.lease
        if lease is None:
            return
        try:
            gate.lease = await store.renew_lease(lease, ttl)
        except LeaseLost as exc:
            lost(f"the session's lease was taken over by another process: {exc}")
            return
        except Exception:  # a failed renewal is retried at the next tick; appends still fence
            continue


async def release(store: Store, gate: SessionGate) -> None:
    """Release the lease and the in-process lock; always runs, even when the store fails."""
    gate.holder_interrupt = None
    lease, gate.lease = gate.lease, None
    try:
        if lease is not None:
            with contextlib.suppress(LeaseLost):
                await store.release_lease(lease)
    finally:
        gate.holder_run = None
        gate.lock.release()


class GateKeeper(Protocol):
    """What keeps a process's session gates (a ``Runtime``): the store, the lease's time to
    live, and the gate of each session."""

    @property
    def store(self) -> Store: ...

    @property
    def lease_ttl(self) -> float: ...

    def gate(self, session_id: str) -> SessionGate: ...

    def forget_gate(self, session_id: str, gate: SessionGate) -> None: ...


@contextlib.asynccontextmanager
async def held(
    keeper: GateKeeper,
    session_id: str,
    run_id: str,
    *,
    on_busy: OnBusy,
    interrupt: Callable[[], None],
    lost: Callable[[str], None],
    queue_timeout: float,
    max_queue_depth: int,
) -> AsyncIterator[SessionGate]:
    """Hold ``session_id`` for the run ``run_id`` while the body runs: ``acquire`` (per
    ``on_busy``), a ``keep_alive`` that calls ``lost`` if another holder takes the lease over,
    and ``release`` when the body ends, however it ends."""
    store = keeper.store
    gate = keeper.gate(session_id)
    try:
        await acquire(
            gate,
            store,
            session_id,
            run_id,
            on_busy=on_busy,
            interrupt=interrupt,
            queue_timeout=queue_timeout,
            max_queue_depth=max_queue_depth,
            lock_ttl=keeper.lease_ttl,
        )
    except BaseException:
        keeper.forget_gate(session_id, gate)
        raise
    renew = asyncio.ensure_future(keep_alive(store, gate, keeper.lease_ttl, lost))
    try:
        yield gate
    finally:
        renew.cancel()
        try:
            await release(store, gate)
        finally:
            keeper.forget_gate(session_id, gate)
