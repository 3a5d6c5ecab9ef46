"""``ScheduleStore``: schedules and their runs in Loom's store (the read API the console and the
servers use, and the claims the poller makes)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loom.errors import ScheduleError, ScheduleNotFound
from loom.schedule.backend import tables_of
from loom.schedule.model import ACTIVE, Schedule, ScheduleRun
from loom.schedule.timing import next_tick
from loom.store.base import ScheduleTables, Statement

__all__ = ["ScheduleState", "ScheduleStore"]

_RUN_COLS = (
    "id, schedule_id, tick, status, run_id, session_id, owner, claimed_at, started_at, "
    "finished_at, attempts, error, lease_until"
)
_TIMING = frozenset({"cron", "interval", "timezone", "start_at", "end_at", "enabled"})


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A stored schedule with its next tick (``None``: disabled, or past its end)."""

    schedule: Schedule
    next_fire_at: float | None
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.schedule.to_dict(),
            "next_fire_at": self.next_fire_at,
            "updated_at": self.updated_at,
        }


def _run(row: Sequence[Any]) -> ScheduleRun:
    return ScheduleRun(
        int(row[0]),
        row[1],
        float(row[2]),
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        int(row[10]),
        row[11],
        row[12],
    )


def _state(row: Sequence[Any]) -> ScheduleState:
    return ScheduleState(Schedule.from_dict(json.loads(row[0])), row[1], float(row[2]))


class ScheduleStore:
    """Schedules and schedule runs on a ``SQLiteStore`` or ``PostgresStore``.

    ``clock`` gives the time (epoch seconds); tests inject one. ``agents`` (names) makes
    ``add`` refuse a schedule for an agent this process does not know.
    """

    def __init__(
        self, store: Any, *, clock: Callable[[], float] = time.time, agents: Any = None
    ) -> None:
        self.store = store  # the Loom store: its ScheduleTables run the SQL
        self.db: ScheduleTables = tables_of(store)
        self.clock = clock
        self.agents = agents

    # -- schedules ------------------------------------------------------------------------------
    async def add(self, schedule: Schedule, *, known: bool = False) -> ScheduleState:
        """Store a new schedule (checked first: ``ScheduleError`` names a bad field).
        ``known``: the caller holds the agent itself (``Scheduler.schedule``), so its name is
        not looked up in ``agents``."""
        now = self.clock()
        if not schedule.created_at:
            schedule = schedule.replace(created_at=now)
        schedule.check(self.agents if schedule.job is None and not known else None)
        nxt = next_tick(schedule, now) if schedule.enabled else None
        thread = schedule.session_id if schedule.session == "per_schedule" else None
        inserted = await self.db.schedule_execute(
            "adding a schedule",
            "INSERT INTO schedules (id, agent, thread_id, enabled, next_fire_at, data, "
            "created_at, updated_at, principal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (
                schedule.id,
                schedule.job or schedule.agent,
                thread,
                int(schedule.enabled),
                nxt,
                json.dumps(schedule.to_dict()),
                now,
                now,
                schedule.principal,
            ),
        )
        if inserted != 1:
            raise ScheduleError(f"a schedule with id {schedule.id!r} exists already", field="id")
        return ScheduleState(schedule, nxt, now)

    async def ensure(self, schedule: Schedule) -> None:
        """Add ``schedule`` unless one with its id exists (built-in jobs, at every start)."""
        try:
            await self.add(schedule)
        except ScheduleError as exc:
            if exc.field != "id":
                raise

    async def get(self, schedule_id: str) -> ScheduleState:
        rows = await self.db.schedule_rows(
            "reading a schedule",
            "SELECT data, next_fire_at, updated_at FROM schedules WHERE id = ?",
            (schedule_id,),
        )
        if not rows:
            raise ScheduleNotFound(f"no schedule {schedule_id!r}", field="id")
        return _state(rows[0])

    async def list_schedules(
        self,
        *,
        agent: str | None = None,
        thread_id: str | None = None,
        enabled: bool | None = None,
        jobs: bool = False,
        principal: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[ScheduleState]:
        """Stored schedules, oldest first; ``jobs=True`` includes the built-in background jobs;
        ``principal`` keeps only that API key's."""
        where, params = ["1 = 1"], []  # constant fragments only; values are bound
        for clause, value in (
            ("agent = ?", agent),
            ("thread_id = ?", thread_id),
            ("principal = ?", principal),
            ("enabled = ?", None if enabled is None else int(enabled)),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        if not jobs:
            where.append("id NOT LIKE 'job:%'")
        rows = await self.db.schedule_rows(
            "listing schedules",
            f"SELECT data, next_fire_at, updated_at FROM schedules WHERE {' AND '.join(where)} "
            "ORDER BY created_at, id LIMIT ? OFFSET ?",
            (*params, limit if limit > 0 else 1 << 31, max(0, offset)),
        )
        return [_state(r) for r in rows]

    async def update(self, schedule_id: str, **changes: Any) -> ScheduleState:
        """Change fields of a schedule (checked); a change of its timing or ``enabled``
        computes the next tick from now."""
        current = await self.get(schedule_id)
        if "id" in changes and changes["id"] != schedule_id:
            raise ScheduleError("a schedule's id cannot change", field="id")
        changed = current.schedule.replace(**changes)
        changed.check(self.agents if changed.job is None else None)
        now = self.clock()
        nxt = current.next_fire_at
        if _TIMING & changes.keys() or (changed.enabled and nxt is None):
            nxt = next_tick(changed, now) if changed.enabled else None
        if not changed.enabled:
            nxt = None
        thread = changed.session_id if changed.session == "per_schedule" else None
        await self.db.schedule_execute(
            "updating a schedule",
            "UPDATE schedules SET agent = ?, thread_id = ?, enabled = ?, next_fire_at = ?, "
            "data = ?, updated_at = ? WHERE id = ?",
            (
                changed.job or changed.agent,
                thread,
                int(changed.enabled),
                nxt,
                json.dumps(changed.to_dict()),
                now,
                schedule_id,
            ),
        )
        return ScheduleState(changed, nxt, now)

    async def pause(self, schedule_id: str) -> ScheduleState:
        return await self.update(schedule_id, enabled=False)

    async def resume(self, schedule_id: str) -> ScheduleState:
        """Enable a schedule again; ticks while it was paused are not caught up."""
        return await self.update(schedule_id, enabled=True)

    async def remove(self, schedule_id: str) -> None:
        """Delete a schedule and its run history (``ScheduleNotFound`` if there is none)."""
        n = await self.db.schedule_execute(
            "deleting a schedule", "DELETE FROM schedules WHERE id = ?", (schedule_id,)
        )
        if n == 0:
            raise ScheduleNotFound(f"no schedule {schedule_id!r}", field="id")
        await self.db.schedule_execute(
            "deleting a schedule's runs",
            "DELETE FROM schedule_runs WHERE schedule_id = ?",
            (schedule_id,),
        )

    async def due(self, now: float) -> list[ScheduleState]:
        """Enabled schedules whose next tick is at or before ``now``."""
        rows = await self.db.schedule_rows(
            "finding due schedules",
            "SELECT data, next_fire_at, updated_at FROM schedules "
            "WHERE enabled = 1 AND next_fire_at <= ? ORDER BY next_fire_at",
            (now,),
        )
        return [_state(r) for r in rows]

    # -- claims ---------------------------------------------------------------------------------
    async def claim(
        self,
        schedule_id: str,
        expected: float,
        new_next: float | None,
        fired: Sequence[float],
        missed: Sequence[float],
        *,
        owner: str,
        lease_until: float,
        session_of: Callable[[float], str],
    ) -> bool:
        """Move ``next_fire_at`` from ``expected`` to ``new_next`` and record the ticks (fired
        ones ``claimed`` by ``owner``, dropped ones ``missed``), in one transaction; False when
        another process claimed first (nothing written)."""
        now = self.clock()
        then: list[Statement] = [
            (
                "INSERT INTO schedule_runs (schedule_id, tick, status, session_id, owner, "
                "lease_until, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (schedule_id, tick) DO NOTHING",
                (
                    schedule_id,
                    t,
                    "queued" if i else "claimed",
                    session_of(t),
                    owner,
                    lease_until,
                    now,
                ),
            )
            for i, t in enumerate(fired)  # catch-up runs go one after another: all but one wait
        ]
        then += [
            (
                "INSERT INTO schedule_runs (schedule_id, tick, status, claimed_at, finished_at) "
                "VALUES (?, ?, 'missed', ?, ?) ON CONFLICT (schedule_id, tick) DO NOTHING",
                (schedule_id, t, now, now),
            )
            for t in missed
        ]
        return await self.db.schedule_gated(
            "claiming a tick",
            (
                "UPDATE schedules SET next_fire_at = ? WHERE id = ? AND next_fire_at = ?",
                (new_next, schedule_id, expected),
            ),
            then,
        )

    async def transition(
        self,
        row: int,
        to: str,
        *,
        expect: Sequence[str],
        owner: str | None = None,
        **fields: Any,
    ) -> bool:
        """Move run row ``row`` to status ``to`` if it is in one of ``expect`` (and belongs to
        ``owner`` when given), setting ``fields`` (run_id, started_at, finished_at, error,
        attempts, lease_until, owner); False when it was not."""
        allowed = {
            "run_id",
            "started_at",
            "finished_at",
            "error",
            "attempts",
            "lease_until",
            "owner",
            "session_id",
        }
        sets = ["status = ?"] + [f"{k} = ?" for k in fields if k in allowed]
        values = [to] + [v for k, v in fields.items() if k in allowed]
        where = f"id = ? AND status IN ({', '.join('?' for _ in expect)})"
        params = [*values, row, *expect]
        if owner is not None:
            where += " AND owner = ?"
            params.append(owner)
        n = await self.db.schedule_execute(
            "updating a schedule run",
            f"UPDATE schedule_runs SET {', '.join(sets)} WHERE {where}",
            params,
        )
        return n == 1

    async def take_over(self, run: ScheduleRun, owner: str, lease_until: float) -> bool:
        """Make ``owner`` the owner of ``run`` if it is still as read (its owner dead or its
        lease run out): exactly one process takes a stranded tick over."""
        return (
            await self.db.schedule_execute(
                "taking a schedule run over",
                "UPDATE schedule_runs SET owner = ?, lease_until = ? "
                "WHERE id = ? AND status = ? AND owner = ?",
                (owner, lease_until, run.id, run.status, run.owner),
            )
            == 1
        )

    async def renew(self, owner: str, lease_until: float) -> None:
        """Extend the lease of ``owner``'s active runs (the poller does it every pass)."""
        await self.db.schedule_execute(
            "renewing schedule runs",
            "UPDATE schedule_runs SET lease_until = ? WHERE owner = ? AND status IN "
            "('claimed', 'queued', 'running', 'cancelling')",
            (lease_until, owner),
        )

    async def schedule_runs(
        self,
        schedule_id: str | None = None,
        *,
        status: Sequence[str] | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[ScheduleRun]:
        """Runs, newest tick first (``limit`` 0: all), filtered by schedule, status, owner."""
        where, params = ["1 = 1"], []
        if schedule_id is not None:
            where.append("schedule_id = ?")
            params.append(schedule_id)
        if status:
            where.append(f"status IN ({', '.join('?' for _ in status)})")
            params.extend(status)
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        rows = await self.db.schedule_rows(
            "listing schedule runs",
            f"SELECT {_RUN_COLS} FROM schedule_runs WHERE {' AND '.join(where)} "
            "ORDER BY tick DESC, id DESC LIMIT ?",
            (*params, limit if limit > 0 else 1 << 31),
        )
        return [_run(r) for r in rows]

    async def active_runs(self, schedule_id: str) -> list[ScheduleRun]:
        """The schedule's runs that are claimed, running or being cancelled."""
        return await self.schedule_runs(schedule_id, status=ACTIVE, limit=0)

    async def stranded(self, now: float) -> list[ScheduleRun]:
        """Unfinished runs whose owner's lease ran out (the poller renews live ones)."""
        rows = await self.db.schedule_rows(
            "finding stranded schedule runs",
            f"SELECT {_RUN_COLS} FROM schedule_runs WHERE status IN "
            "('claimed', 'queued', 'running', 'cancelling') AND lease_until < ? ORDER BY tick",
            (now,),
        )
        return [_run(r) for r in rows]

    async def delete_runs(self, older_than: float) -> int:
        """Delete finished run rows whose tick is before ``older_than`` (job-history cleanup)."""
        return await self.db.schedule_execute(
            "deleting old schedule runs",
            "DELETE FROM schedule_runs WHERE tick < ? AND status NOT IN "
            "('claimed', 'queued', 'running', 'cancelling')",
            (older_than,),
        )
