"""Periodic jobs on procrastinate's periodic tasks: each tick runs once in the whole fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from loom.errors import ConfigurationError
from loom.store.memory import MemoryStore
from loom.workers import PeriodicJob, Tick, make_app
from loom.workers.ticks import TICK_QUEUE, add_periodic, sweep_job

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


async def _nothing(tick: Tick) -> None:
    pass


def test_a_bad_periodic_job_is_refused_with_what_to_fix() -> None:
    pytest.importorskip("procrastinate", reason="the postgres extra is not installed")
    app = make_app("dbname=unused")
    with pytest.raises(ConfigurationError, match="not a cron line"):
        add_periodic(app, MemoryStore(), PeriodicJob("x.tick", "every second", _nothing))
    add_periodic(app, MemoryStore(), PeriodicJob("x.tick", "*/2 * * * * *", _nothing))
    with pytest.raises(ConfigurationError, match="already registered"):
        add_periodic(app, MemoryStore(), PeriodicJob("x.tick", "* * * * *", _nothing))
    with pytest.raises(ConfigurationError, match=r"1\.\.59"):
        sweep_job(0, 5, 3)


async def test_each_tick_runs_once_across_the_fleet(fleet: Any) -> None:
    import psycopg

    from loom.workers import ensure_schema

    await ensure_schema(fleet.dsn)
    script = str(HERE / "tick_worker.py")
    fleet.start(script, fleet.dsn)
    fleet.start(script, fleet.dsn)
    log = fleet.dir / "ticks.log"

    def ticks() -> list[tuple[int, int]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [(int(t), int(p)) for t, p in (line.split() for line in lines)]

    loop = asyncio.get_running_loop()
    end = loop.time() + 40
    while len(ticks()) < 6:
        assert loop.time() < end, f"ticks so far: {ticks()}"
        await asyncio.sleep(0.2)
    fleet.stop()
    seen = [t for t, _ in ticks()]
    assert len(seen) == len(set(seen)), seen  # two workers, each tick ran once
    assert sorted(seen) == list(range(min(seen), max(seen) + 1)), seen  # none skipped
    async with await psycopg.AsyncConnection.connect(fleet.dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s AND status = "
            "'succeeded'",
            (TICK_QUEUE,),
        )
        row = await cur.fetchone()
    # the sweep deletes finished ticks: the table does not grow a row a second
    assert row is not None and row[0] <= 4, row
