"""Scheduling wired up for a process: ``loom serve`` polls on SQLite (and PostgreSQL), and
``loom worker`` runs the same pass as a procrastinate periodic tick (``schedule_tick``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loom.schedule.jobs import JobRunner, MaintenanceSettings, builtin_jobs, job_schedule
from loom.schedule.launch import Launcher, RuntimeLauncher, Target
from loom.schedule.monitors import MonitorStore
from loom.schedule.scheduler import Scheduler
from loom.schedule.storage import ScheduleStore

if TYPE_CHECKING:
    from loom.engine.runtime import Runtime
    from loom.workers.ticks import PeriodicJob

__all__ = ["SCHEDULE_TASK", "build_scheduler", "schedule_tick"]

SCHEDULE_TASK = "loom.schedule_poll"
"""The worker's periodic task that runs the scheduler's pass."""


async def build_scheduler(
    runtime: Runtime,
    agents: Mapping[str, Target],
    *,
    launcher: Launcher | None = None,
    clock: Callable[[], float] = time.time,
    maintenance: MaintenanceSettings | None = None,
    lease: float = 60.0,
) -> Scheduler:
    """A ``Scheduler`` on ``runtime``'s store that runs ``agents`` (in process, unless
    ``launcher`` says otherwise), with the built-in background jobs registered."""
    store: Any = runtime.store
    schedules = ScheduleStore(store, clock=clock, agents=agents)
    monitors = MonitorStore(store, clock=clock)
    jobs = builtin_jobs(
        store, schedules, monitors, maintenance, prices=runtime.prices, agents=agents
    )
    for job in jobs:
        await schedules.ensure(job_schedule(job))
    return Scheduler(
        schedules,
        launcher or RuntimeLauncher(runtime, agents),
        clock=clock,
        lease=lease,
        jobs=JobRunner({j.name: j for j in jobs}),
        monitors=monitors,
    )


def schedule_tick(scheduler: Scheduler, every: int = 1) -> PeriodicJob:
    """The scheduler's pass as a worker ``PeriodicJob`` every ``every`` seconds: procrastinate
    runs each tick on one worker (its queueing lock), and the pass's claims are conditional
    updates anyway, so a tick is never fired twice."""
    from loom.workers.ticks import PeriodicJob, Tick

    async def run(tick: Tick) -> None:
        await scheduler.poll()

    return PeriodicJob(SCHEDULE_TASK, f"* * * * * */{every}", run)
