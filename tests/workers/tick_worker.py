"""A worker process with one extra periodic job (tests/workers/test_ticks.py):
``python tick_worker.py DSN`` runs ``run_worker`` with ``test.tick`` every second, which appends
``<tick timestamp> <pid>`` to ``$LOOM_FLEET_DIR/ticks.log``."""

from __future__ import annotations

import asyncio
import os
import sys

from fleet_app import agents

from loom.workers import PeriodicJob, Tick, WorkerSettings, run_worker


async def record(tick: Tick) -> None:
    fd = os.open(
        os.path.join(os.environ["LOOM_FLEET_DIR"], "ticks.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, f"{tick.timestamp} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


if __name__ == "__main__":
    settings = WorkerSettings(sys.argv[1], heartbeat=0.5, stalled_after=2)
    tick = PeriodicJob("test.tick", "* * * * * *", record)
    asyncio.run(run_worker(settings, {a.name: a for a in agents}, periodic=[tick]))
