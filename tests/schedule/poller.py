"""A polling process for the scheduling tests: ``python poller.py STORE T0 [WALL0 SPEED UNTIL]``.

STORE is a SQLite path or a PostgreSQL DSN. With only T0 it makes one pass at that time and
waits for the runs it started (the crash tests set LOOM_SCHEDULE_FAULT). With WALL0, SPEED and
UNTIL its clock is T0 + (time.time() - WALL0) * SPEED, and it polls until that clock passes
UNTIL, then finishes its runs and one more pass.
"""

from __future__ import annotations

import asyncio
import sys
import time

from loom import Agent
from loom.engine.runtime import Runtime
from loom.schedule import RuntimeLauncher, Scheduler, ScheduleStore
from loom.testing import FunctionModel


def open_store(spec: str) -> object:
    if spec.startswith("postgresql://") or "dbname=" in spec or "host=" in spec:
        from loom.store.postgres import PostgresStore

        return PostgresStore(spec, max_size=4)
    from loom.store import SQLiteStore

    return SQLiteStore(spec, busy_timeout=30)


async def main(argv: list[str]) -> None:
    store = open_store(argv[0])
    t0 = float(argv[1])
    if len(argv) > 2:
        wall0, speed, until = float(argv[2]), float(argv[3]), float(argv[4])

        def clock() -> float:
            return min(until, t0 + (time.time() - wall0) * speed)  # stops at UNTIL
    else:
        until = t0

        def clock() -> float:
            return t0

    echo = Agent(name="echo", model=FunctionModel(lambda m, t: "ok"))
    runtime = Runtime(store=store)  # type: ignore[arg-type]
    schedules = ScheduleStore(store, clock=clock, agents={"echo": echo})
    scheduler = Scheduler(
        schedules, RuntimeLauncher(runtime, {"echo": echo}), clock=clock, lease=1e9
    )
    while True:
        await scheduler.poll()
        if clock() >= until:
            break
        await asyncio.sleep(0.003)
    while await schedules.schedule_runs(
        status=("claimed", "queued", "running"), owner=scheduler.owner
    ):  # finish what is ours
        await scheduler.drain()
        await scheduler.poll()
        await asyncio.sleep(0.003)
    await runtime.aclose()
    await store.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
