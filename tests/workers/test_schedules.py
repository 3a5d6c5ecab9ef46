"""`loom worker` fires schedules: three real worker processes, a schedule every second, exactly
one run per tick (issue #18: on PostgreSQL a procrastinate periodic task does it)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from typing import Any

import pytest

from loom.events import EventType
from loom.schedule import Schedule, ScheduleStore

pytestmark = pytest.mark.anyio

TICKS = 12


async def _until(what: str, check: Any, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not await check():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_three_workers_fire_a_schedule_once_per_tick(fleet: Any) -> None:
    from loom.store.postgres import PostgresStore

    store = PostgresStore(fleet.dsn, max_size=2)
    await store.open()
    schedules = ScheduleStore(store)
    try:
        options = ["--concurrency", "3", "--heartbeat", "0.5", "--stalled-after", "2"]
        workers = [
            fleet.start(
                "-m", "loom", "worker", "--store", fleet.dsn, "--app", "sched_app:agents", *options
            )
            for _ in range(3)
        ]

        async def all_up() -> bool:  # each worker registered in procrastinate's table
            import psycopg

            async with await psycopg.AsyncConnection.connect(fleet.dsn) as conn:
                cur = await conn.execute("SELECT to_regclass('procrastinate_workers')")
                if (await cur.fetchone()) == (None,):
                    return False
                cur = await conn.execute("SELECT count(*) FROM procrastinate_workers")
                row = await cur.fetchone()
                return row is not None and row[0] >= 3

        await _until("three workers", all_up, 20)
        start = math.ceil(time.time()) + 1
        await schedules.add(
            Schedule(
                agent="stamp",
                message="stamp it",
                interval=1,
                start_at=start,
                id="every-second",
                session="per_run",
                misfire="catch_up",
                catch_up=10,
                overlap="queue",
            )
        )

        async def enough() -> bool:
            runs = await schedules.schedule_runs("every-second", limit=0)
            return sum(r.status == "finished" for r in runs) >= TICKS

        await _until(f"{TICKS} finished runs", enough, 25)
        await schedules.pause("every-second")

        async def settled() -> bool:
            return not await schedules.active_runs("every-second") and not [
                r
                for r in await schedules.schedule_runs("every-second", limit=0)
                if r.status == "queued"
            ]

        await _until("the last runs to end", settled, 10)
        runs = sorted(await schedules.schedule_runs("every-second", limit=0), key=lambda r: r.tick)
        ticks = [r.tick for r in runs]
        assert ticks == [start + i for i in range(len(runs))], ticks  # every tick, in a row
        assert len(runs) >= TICKS
        assert [r.status for r in runs] == ["finished"] * len(runs), [
            (r.tick, r.status, r.error) for r in runs
        ]
        # the journal: each tick's run started once, with the message once, in its own session
        for r in runs:
            assert r.run_id == f"run_sched_every-second_{int(r.tick)}"
            events = await store.load_events(r.session_id)  # type: ignore[arg-type]
            starts = [e.run_id for e in events if e.type == EventType.AGENT_START]
            asked = [e for e in events if e.type == EventType.USER_MESSAGE]
            assert (starts, len(asked)) == ([r.run_id], 1), (r.tick, starts, len(asked))
        # the tool ran once per tick, in one of the workers
        stamps = [line.split() for line in (fleet.dir / "stamps.log").read_text().splitlines()]
        by_run = Counter(run_id for run_id, _, _ in stamps)
        assert by_run == Counter({r.run_id: 1 for r in runs}), by_run
        pids = {int(pid) for _, _, pid in stamps}
        assert pids <= {w.pid for w in workers}, pids
        owners = {r.owner for r in runs}
        print(f"{len(runs)} ticks, claimed by {len(owners)} worker(s), run by {len(pids)}")
    finally:
        fleet.stop()
        await store.close()
