"""Cron monitors (seed 003 §5): check-ins, health, and the detector of missed and stuck runs.

A monitor expects a check-in at each tick of its schedule (or its own cron line / interval,
for an external job that checks in over HTTP). ``checkin`` records ``ok`` / ``error`` /
``in_progress``; ``detect`` (every minute, as a background job) writes a synthetic ``missed``
check-in for a monitor whose expected time plus ``margin`` passed without one, and a
``timeout`` for one in progress longer than ``max_runtime`` (and asks the schedule's running
run to stop). Health follows: ok → ``ok``, error → ``failing``, missed → ``missed``, timeout
→ ``timed_out``. Each change goes to the subscribers (``subscribe``); servers also stream the
check-ins table (``checkins(after=...)``), which every process writes, as SSE.

The detector's writes are gated like the scheduler's claims (``next_expected_at = <read>``),
so several processes running it write each synthetic check-in once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loom.errors import MonitorNotFound, ScheduleError
from loom.schedule.backend import tables_of
from loom.schedule.model import CheckIn, Monitor
from loom.schedule.timing import next_tick
from loom.store.base import ScheduleTables

__all__ = ["MonitorChange", "MonitorState", "MonitorStore"]

log = logging.getLogger("loom.schedule")

_HEALTH = {"ok": "ok", "error": "failing", "missed": "missed", "timeout": "timed_out"}
_STATE_COLS = "data, health, next_expected_at, last_checkin_at, in_progress_since, updated_at"
_CHECKIN_COLS = "id, monitor_id, status, source, at, expected_at, health"


@dataclass(frozen=True, slots=True)
class MonitorState:
    """A monitor with its health and what it expects next."""

    monitor: Monitor
    health: str
    next_expected_at: float | None
    last_checkin_at: float | None
    in_progress_since: float | None
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.monitor.to_dict(),
            "health": self.health,
            "next_expected_at": self.next_expected_at,
            "last_checkin_at": self.last_checkin_at,
            "in_progress_since": self.in_progress_since,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class MonitorChange:
    """What subscribers get: a check-in and the health before and after it."""

    monitor_id: str
    checkin: CheckIn
    before: str
    after: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a webhook's body): ``monitor_id``, ``checkin``, ``before``,
        ``after``."""
        return {
            "monitor_id": self.monitor_id,
            "checkin": self.checkin.to_dict(),
            "before": self.before,
            "after": self.after,
        }


Subscriber = Callable[[MonitorChange], Awaitable[None] | None]


def _state(row: Sequence[Any]) -> MonitorState:
    return MonitorState(
        Monitor.from_dict(json.loads(row[0])), row[1], row[2], row[3], row[4], float(row[5])
    )


def _checkin(row: Sequence[Any]) -> CheckIn:
    return CheckIn(int(row[0]), row[1], row[2], row[3], float(row[4]), row[5], row[6])


class MonitorStore:
    """Monitors and check-ins on a ``SQLiteStore`` or ``PostgresStore``; ``clock`` gives the
    time; ``cancel_schedule_runs`` (set by the scheduler's owner) stops a timed-out run."""

    def __init__(self, store: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store  # the Loom store: its ScheduleTables run the SQL
        self.db: ScheduleTables = tables_of(store)
        self.clock = clock
        self.subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn`` (sync or async) with every check-in this ``MonitorStore`` records, as a
        ``MonitorChange`` (health before and after), right after its commit; returns a function
        that unsubscribes. A subscriber that raises is logged and the others still run.

        This is where webhooks attach (``server.schedule_api.monitors_of(state)`` is the
        server's instance). It sees what this process records; ``follow`` sees every process's
        check-ins (a worker fleet's detector, another server)."""
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn) if fn in self.subscribers else None

    async def follow(
        self, *, after: int = 0, every: float = 1.0, stop: asyncio.Event | None = None
    ) -> AsyncIterator[MonitorChange]:
        """Every check-in with an id above ``after`` as a ``MonitorChange``, oldest first, from
        whichever process recorded it (it tails the table every ``every`` seconds, as the SSE
        stream does) until ``stop`` is set. ``before`` is the health of the monitor's previous
        check-in (``new`` for its first). A consumer that keeps the last id it handled
        resumes after a restart without losing or repeating one."""
        last: dict[str, str] = {}
        while stop is None or not stop.is_set():
            batch = await self.checkins(after=after, limit=500)
            for c in batch:
                before = last.get(c.monitor_id)
                if before is None:
                    rows = await self.db.schedule_rows(
                        "reading a check-in",
                        "SELECT health FROM monitor_checkins WHERE monitor_id = ? AND id < ? "
                        "ORDER BY id DESC LIMIT 1",
                        (c.monitor_id, c.id),
                    )
                    before = rows[0][0] if rows else "new"
                last[c.monitor_id] = c.health
                after = c.id
                yield MonitorChange(c.monitor_id, c, before, c.health)
            if not batch:
                if stop is None:
                    await asyncio.sleep(every)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), every)

    async def _notify(self, change: MonitorChange) -> None:
        for fn in list(self.subscribers):
            try:
                out = fn(change)
                if out is not None:
                    await out
            except Exception:  # one bad subscriber must not stop the others or the detector
                log.exception("monitor subscriber %r failed", fn)

    async def _expected(self, monitor: Monitor, after: float) -> float | None:
        if monitor.schedule_id is None:
            return next_tick(monitor, after)
        rows = await self.db.schedule_rows(
            "reading a schedule", "SELECT data FROM schedules WHERE id = ?", (monitor.schedule_id,)
        )
        if not rows:
            return None
        from loom.schedule.model import Schedule

        return next_tick(Schedule.from_dict(json.loads(rows[0][0])), after)

    # -- monitors -------------------------------------------------------------------------------
    async def add(self, monitor: Monitor) -> MonitorState:
        """Store a new monitor (checked: ``ScheduleError`` names a bad field; a monitor of an
        unknown schedule is refused)."""
        monitor.check()
        if monitor.schedule_id is not None:
            rows = await self.db.schedule_rows(
                "reading a schedule",
                "SELECT id FROM schedules WHERE id = ?",
                (monitor.schedule_id,),
            )
            if not rows:
                raise ScheduleError(f"no schedule {monitor.schedule_id!r}", field="schedule_id")
        now = self.clock()
        expected = await self._expected(monitor, now)
        n = await self.db.schedule_execute(
            "adding a monitor",
            f"INSERT INTO monitors (id, schedule_id, principal, {_STATE_COLS}) VALUES (?, ?, ?, "
            "?, 'new', ?, NULL, NULL, ?) ON CONFLICT (id) DO NOTHING",
            (
                monitor.id,
                monitor.schedule_id,
                monitor.principal,
                json.dumps(monitor.to_dict()),
                expected,
                now,
            ),
        )
        if n != 1:
            raise ScheduleError(f"a monitor with id {monitor.id!r} exists already", field="id")
        return MonitorState(monitor, "new", expected, None, None, now)

    async def get(self, monitor_id: str) -> MonitorState:
        rows = await self.db.schedule_rows(
            "reading a monitor", f"SELECT {_STATE_COLS} FROM monitors WHERE id = ?", (monitor_id,)
        )
        if not rows:
            raise MonitorNotFound(f"no monitor {monitor_id!r}", field="monitor_id")
        return _state(rows[0])

    async def list_monitors(self, *, principal: str | None = None) -> list[MonitorState]:
        """Every monitor, by id; ``principal`` keeps only that API key's."""
        if principal is None:
            rows = await self.db.schedule_rows(
                "listing monitors", f"SELECT {_STATE_COLS} FROM monitors ORDER BY id"
            )
        else:
            rows = await self.db.schedule_rows(
                "listing monitors",
                f"SELECT {_STATE_COLS} FROM monitors WHERE principal = ? ORDER BY id",
                (principal,),
            )
        return [_state(r) for r in rows]

    async def remove(self, monitor_id: str) -> None:
        if not await self.db.schedule_execute(
            "deleting a monitor", "DELETE FROM monitors WHERE id = ?", (monitor_id,)
        ):
            raise MonitorNotFound(f"no monitor {monitor_id!r}", field="monitor_id")
        await self.db.schedule_execute(
            "deleting check-ins", "DELETE FROM monitor_checkins WHERE monitor_id = ?", (monitor_id,)
        )

    async def checkins(
        self, monitor_id: str | None = None, *, after: int = 0, limit: int = 100
    ) -> list[CheckIn]:
        """Check-ins with ids above ``after``, oldest first (the SSE stream tails this)."""
        where, params = "id > ?", [after]
        if monitor_id is not None:
            where += " AND monitor_id = ?"
            params.append(monitor_id)  # type: ignore[arg-type]
        rows = await self.db.schedule_rows(
            "listing check-ins",
            f"SELECT {_CHECKIN_COLS} FROM monitor_checkins WHERE {where} ORDER BY id LIMIT ?",
            (*params, limit),
        )
        return [_checkin(r) for r in rows]

    async def delete_checkins(self, older_than: float) -> int:
        """Delete check-ins recorded before ``older_than`` (the ``history`` job)."""
        return await self.db.schedule_execute(
            "deleting old check-ins", "DELETE FROM monitor_checkins WHERE at < ?", (older_than,)
        )

    # -- check-ins ------------------------------------------------------------------------------
    async def checkin(self, monitor_id: str, status: str, *, source: str = "client") -> CheckIn:
        """Record ``ok`` / ``error`` / ``in_progress`` for ``monitor_id`` (``MonitorNotFound``,
        or ``ScheduleError`` for another status)."""
        if status not in ("ok", "error", "in_progress"):
            raise ScheduleError(
                f"must be 'ok', 'error' or 'in_progress', got {status!r}", field="status"
            )
        state = await self.get(monitor_id)
        now = self.clock()
        sql: tuple[str, tuple[Any, ...]]
        if status == "in_progress":
            health = state.health
            sql = (
                "UPDATE monitors SET in_progress_since = ?, updated_at = ? WHERE id = ?",
                (now, now, monitor_id),
            )
        else:
            health = _HEALTH[status]
            since, limit = state.in_progress_since, state.monitor.max_runtime
            if status == "ok" and since is not None and limit is not None and now - since > limit:
                # a late "ok" (the detector did not pass in time) still broke max_runtime
                health = "timed_out"
            expected = await self._expected(state.monitor, now)
            sql = (
                "UPDATE monitors SET health = ?, last_checkin_at = ?, in_progress_since = NULL,"
                " next_expected_at = ?, updated_at = ? WHERE id = ?",
                (health, now, expected, now, monitor_id),
            )
        await self.db.schedule_gated(
            "recording a check-in",
            sql,
            [self._insert(monitor_id, status, source, now, state.next_expected_at, health)],
        )
        return await self._recorded(monitor_id, state.health, health)

    async def schedule_checkin(self, schedule_id: str, status: str) -> None:
        """The scheduler's check-in for every monitor of ``schedule_id``."""
        rows = await self.db.schedule_rows(
            "finding monitors", "SELECT id FROM monitors WHERE schedule_id = ?", (schedule_id,)
        )
        for (monitor_id,) in rows:
            await self.checkin(monitor_id, status, source="schedule")

    @staticmethod
    def _insert(
        monitor_id: str, status: str, source: str, at: float, expected: float | None, health: str
    ) -> tuple[str, tuple[Any, ...]]:
        return (
            "INSERT INTO monitor_checkins (monitor_id, status, source, at, expected_at, "
            "health) VALUES (?, ?, ?, ?, ?, ?)",
            (monitor_id, status, source, at, expected, health),
        )

    async def _recorded(self, monitor_id: str, before: str, after: str) -> CheckIn:
        rows = await self.db.schedule_rows(
            "reading a check-in",
            f"SELECT {_CHECKIN_COLS} FROM monitor_checkins WHERE "
            "monitor_id = ? ORDER BY id DESC LIMIT 1",
            (monitor_id,),
        )
        checkin = _checkin(rows[0])
        await self._notify(MonitorChange(monitor_id, checkin, before, after))
        return checkin

    # -- the detector ---------------------------------------------------------------------------
    async def detect(self, now: float | None = None) -> list[CheckIn]:
        """Write the synthetic ``missed`` and ``timeout`` check-ins due at ``now``; a timed-out
        schedule run is asked to stop (status ``cancelling``). Returns what it wrote."""
        now = self.clock() if now is None else now
        written: list[CheckIn] = []
        for state in await self.list_monitors():
            m = state.monitor
            expected = state.next_expected_at
            gate: tuple[str, tuple[Any, ...]]
            if (
                expected is not None
                and expected + m.margin < now
                and state.in_progress_since is None
            ):
                new_expected = await self._expected(m, now)
                gate = (
                    "UPDATE monitors SET health = 'missed', next_expected_at = ?, "
                    "updated_at = ? WHERE id = ? AND next_expected_at = ?",
                    (new_expected, now, m.id, expected),
                )
                if await self.db.schedule_gated(
                    "recording a missed check-in",
                    gate,
                    [self._insert(m.id, "missed", "system", now, expected, "missed")],
                ):
                    written.append(await self._recorded(m.id, state.health, "missed"))
            since = state.in_progress_since
            if m.max_runtime is not None and since is not None and since + m.max_runtime < now:
                gate = (
                    "UPDATE monitors SET health = 'timed_out', in_progress_since = NULL, "
                    "updated_at = ? WHERE id = ? AND in_progress_since = ?",
                    (now, m.id, since),
                )
                then = [self._insert(m.id, "timeout", "system", now, expected, "timed_out")]
                if m.schedule_id is not None:  # its owner's poller cancels the run
                    then.append(
                        (
                            "UPDATE schedule_runs SET status = 'cancelling' WHERE "
                            "schedule_id = ? AND status = 'running'",
                            (m.schedule_id,),
                        )
                    )
                if await self.db.schedule_gated("recording a timeout", gate, then):
                    written.append(await self._recorded(m.id, state.health, "timed_out"))
        return written
