"""Periodic ticks on procrastinate's periodic tasks: the stalled-job sweep, and yours.

Every worker runs procrastinate's periodic deferrer; the database keeps one job per task and
tick (``procrastinate_periodic_defers``), so each tick runs exactly once in the whole fleet, on
whichever worker fetches it first. Tick jobs go to their own queue (``TICK_QUEUE``, which every
worker serves besides its own queues) with a high priority, carry a ``queueing_lock`` (at most
one waiting tick per task: a fleet whose every slot is busy does not pile ticks up), and their
finished rows are deleted by the sweep so a tick a second does not grow the jobs table.

``PeriodicJob`` is how other parts register theirs (``run_worker(..., periodic=[...])``): a
name, a cron line (a sixth field counts seconds) and an async function of a ``Tick``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.errors import ConfigurationError
from loom.workers.app import RUN_TASK

if TYPE_CHECKING:
    import procrastinate

    from loom.store.base import Store

__all__ = [
    "SWEEP_TASK",
    "TICK_QUEUE",
    "PeriodicJob",
    "Tick",
    "add_periodic",
    "sweep_job",
    "sweep_stalled",
]

log = logging.getLogger("loom.workers")

TICK_QUEUE = "loom.ticks"
"""The queue of periodic jobs; every ``loom worker`` serves it."""

SWEEP_TASK = "loom.sweep_stalled"
"""The periodic job that retries the runs of dead workers."""

_TICK_PRIORITY = 1000  # fetched before any queued run: a tick is short and failover waits on it


@dataclass(frozen=True, slots=True)
class Tick:
    """What a periodic job's function gets: the tick's time and the worker's app and store."""

    timestamp: int  # the scheduled time of this tick (epoch seconds), the same on every worker
    app: procrastinate.App
    store: Store


@dataclass(frozen=True, slots=True)
class PeriodicJob:
    """A function run once per tick of ``cron`` across the whole fleet.

    ``name`` is the procrastinate task name (unique in the fleet, the same on every worker);
    ``cron`` a cron line, with an optional sixth field for seconds (``"*/2 * * * * *"``: every
    two seconds); ``run`` is awaited with the ``Tick``. A tick whose worker dies is not retried:
    the next tick comes anyway.
    """

    name: str
    cron: str
    run: Callable[[Tick], Awaitable[None]]


def add_periodic(app: procrastinate.App, store: Store, job: PeriodicJob) -> None:
    """Register ``job`` on ``app`` (before the worker starts); a bad cron line or a name already
    taken is a ``ConfigurationError``."""
    import croniter  # type: ignore[import-untyped]

    if not croniter.croniter.is_valid(job.cron):
        raise ConfigurationError(
            f"periodic job {job.name!r}: {job.cron!r} is not a cron line (five fields, or six "
            "with seconds last, e.g. '*/5 * * * * *')"
        )
    if job.name in app.tasks:
        raise ConfigurationError(f"a task named {job.name!r} is already registered; rename it")

    async def tick(timestamp: int) -> None:
        await job.run(Tick(timestamp, app, store))

    tick.__name__ = tick.__qualname__ = job.name.replace(".", "_")
    task = app.task(name=job.name, queue=TICK_QUEUE, priority=_TICK_PRIORITY)(tick)
    app.periodic(cron=job.cron, periodic_id=job.name, queueing_lock=job.name)(task)


async def sweep_stalled(
    app: procrastinate.App, store: Store, stalled_after: float, max_attempts: int
) -> int:
    """Retry the running jobs of workers silent for ``stalled_after`` seconds (procrastinate's
    heartbeat detection); close tick jobs whose worker died. Returns how many jobs it retried
    or closed. A run job is always retried: the retry's ``run_turn`` ends a crash loop (after
    ``max_attempts`` attempts it writes the job's record ``failed`` and fails the job), so a
    job's record has one writer, the task (``max_attempts`` is kept for callers; the workers'
    own setting is the one that counts)."""
    from procrastinate.jobs import Status

    done = 0
    for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after):
        assert job.id is not None
        try:
            if job.queue == TICK_QUEUE:  # the next tick comes anyway
                await app.job_manager.finish_job(job, Status.FAILED, delete_job=True)
            elif job.task_name != RUN_TASK:
                continue  # another part's task: its own policy
            else:
                await app.job_manager.retry_job(job)
                log.warning("job %s: worker %s is gone; retrying", job.id, job.worker_id)
            done += 1
        except Exception as exc:  # another sweep (a previous tick's, still running) got there
            log.debug("job %s: not retried (%s)", job.id, exc)
    # finished ticks: one row a second otherwise accumulates (failed ones stay, to be read)
    await app.connector.execute_query_async(
        "DELETE FROM procrastinate_jobs WHERE queue_name = %(queue)s AND status = 'succeeded'",
        queue=TICK_QUEUE,
    )
    return done


def sweep_job(every: int, stalled_after: float, max_attempts: int) -> PeriodicJob:
    """The stalled-job sweep as a ``PeriodicJob`` every ``every`` seconds."""
    if not 1 <= every <= 59:
        raise ConfigurationError(f"the sweep period must be 1..59 whole seconds, got {every}")

    async def run(tick: Tick) -> None:
        await sweep_stalled(tick.app, tick.store, stalled_after, max_attempts)

    return PeriodicJob(SWEEP_TASK, f"* * * * * */{every}", run)
