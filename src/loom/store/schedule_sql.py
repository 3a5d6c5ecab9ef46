"""The tables of schedules, their runs, cron monitors and check-ins (``loom.schedule``).

Both stores create them in a named migration (SQLite ``0005_schedules``, PostgreSQL
``0003_schedules``) and give schedules and monitors their owning API key's name in another
(``principal``: SQLite ``0007_schedule_principals``, PostgreSQL ``0006_schedule_principals``);
``loom.schedule.storage`` runs its queries on the store's connection.
A schedule's definition is JSON in ``data``; the columns beside it are what queries filter on.
``next_fire_at`` is the claim: a poller fires a tick by moving it forward with a conditional
UPDATE (``WHERE next_fire_at = <the value it read>``), so one process wins each tick.
``schedule_runs`` has one row per (schedule, tick): the unique key is a second guard.
"""

from __future__ import annotations

__all__ = ["POSTGRES", "PRINCIPALS", "SQLITE"]


def _ddl(serial: str, real: str) -> list[str]:
    return [
        f"""CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            thread_id TEXT,
            enabled INTEGER NOT NULL,
            next_fire_at {real},
            data TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )""",
        "CREATE INDEX schedules_due ON schedules (next_fire_at)",
        f"""CREATE TABLE schedule_runs (
            id {serial},
            schedule_id TEXT NOT NULL,
            tick {real} NOT NULL,
            status TEXT NOT NULL,
            run_id TEXT,
            session_id TEXT,
            owner TEXT,
            lease_until {real},
            claimed_at {real},
            started_at {real},
            finished_at {real},
            attempts INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            UNIQUE (schedule_id, tick)
        )""",
        "CREATE INDEX schedule_runs_status ON schedule_runs (status, schedule_id)",
        f"""CREATE TABLE monitors (
            id TEXT PRIMARY KEY,
            schedule_id TEXT,
            data TEXT NOT NULL,
            health TEXT NOT NULL,
            next_expected_at {real},
            last_checkin_at {real},
            in_progress_since {real},
            updated_at {real} NOT NULL
        )""",
        f"""CREATE TABLE monitor_checkins (
            id {serial},
            monitor_id TEXT NOT NULL,
            status TEXT NOT NULL,
            source TEXT NOT NULL,
            at {real} NOT NULL,
            expected_at {real},
            health TEXT NOT NULL
        )""",
        "CREATE INDEX monitor_checkins_monitor ON monitor_checkins (monitor_id, id)",
    ]


SQLITE = ";".join(_ddl("INTEGER PRIMARY KEY", "REAL"))
POSTGRES = _ddl("BIGSERIAL PRIMARY KEY", "DOUBLE PRECISION")


# Why: schedules and monitors belonged to no API key, so any key could list, edit, pause or
# delete another key's (issue #24). ``principal`` is the name of the key that made the row
# (NULL: made without keys, e.g. from code or the CLI, which only admin keys then see).
PRINCIPALS = [
    "ALTER TABLE schedules ADD COLUMN principal TEXT",
    "ALTER TABLE monitors ADD COLUMN principal TEXT",
    "CREATE INDEX schedules_principal ON schedules (principal, created_at)",
]
