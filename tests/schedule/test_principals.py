"""Schedules and monitors carry the API key that made them (``principal``, issue #24), kept in
a column of their tables on SQLite and PostgreSQL, and listings filter on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loom.schedule import Monitor, MonitorStore, Schedule, ScheduleStore


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        from loom.store import SQLiteStore

        made: Any = SQLiteStore(tmp_path / "loom.db")
    else:
        from loom.store.postgres import PostgresStore

        made = PostgresStore(request.getfixturevalue("pg_schema_dsn"))
    yield made
    await made.close()


async def test_listings_keep_one_keys_schedules_and_monitors(store: Any) -> None:
    schedules, monitors = ScheduleStore(store), MonitorStore(store)
    for owner in ("alice", "bob", None):
        name = owner or "nobody"
        await schedules.add(
            Schedule(agent="a", message="hi", cron="0 9 * * *", id=f"s-{name}", principal=owner)
        )
        await monitors.add(Monitor(id=f"m-{name}", interval=60, principal=owner))
    mine = await schedules.list_schedules(principal="alice")
    assert [(s.schedule.id, s.schedule.principal) for s in mine] == [("s-alice", "alice")]
    assert len(await schedules.list_schedules()) == 3  # no filter: every key's and nobody's
    assert [m.monitor.id for m in await monitors.list_monitors(principal="bob")] == ["m-bob"]
    assert len(await monitors.list_monitors()) == 3
    # the owner survives a change and a read
    await schedules.pause("s-alice")
    assert (await schedules.get("s-alice")).schedule.principal == "alice"
    assert (await monitors.get("m-bob")).monitor.principal == "bob"
    assert [s.schedule.id for s in await schedules.list_schedules(principal="alice")] == ["s-alice"]
