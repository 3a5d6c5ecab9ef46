"""``run_worker``: one worker process (``loom worker``).

Failover with the default settings takes about 6 s (at most ~8 s) from a kill -9 to the run's
next event on another worker: the dead worker's last heartbeat is at most ``heartbeat`` old, its
jobs are stalled ``stalled_after`` seconds after it, the sweep (a periodic tick every
``sweep_every`` seconds, ``loom.workers.ticks``) retries them, a free worker polls them within
``poll_every``, and the retry takes the dead attempt's session lease over at once
(``loom.workers.failover``) instead of waiting ``lease_ttl`` for it to expire.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.errors import ConfigurationError
from loom.workers.app import ensure_schema, make_app
from loom.workers.tasks import WorkerContext, set_context
from loom.workers.ticks import TICK_QUEUE, PeriodicJob, add_periodic, sweep_job, sweep_stalled

if TYPE_CHECKING:
    from loom.workers.tasks import ServedAgent

__all__ = ["WorkerSettings", "run_worker", "sweep_stalled"]

log = logging.getLogger("loom.workers")


@dataclass(slots=True)
class WorkerSettings:
    """How a worker runs (the ``loom worker`` options). Give every worker of a fleet the same
    ``heartbeat`` and ``stalled_after``: a worker judges the others by its own.

    ``heartbeat`` seconds between this worker's heartbeats; a worker silent for
    ``stalled_after`` seconds is dead and its running jobs are retried (the sweep runs every
    ``sweep_every`` whole seconds, on one worker of the fleet per tick); an idle worker looks
    for retried jobs every ``poll_every`` seconds (new jobs wake it at once); ``lease_ttl`` is
    the Loom session lease, renewed every third of it while a turn runs (a retry does not wait
    for it: it takes the dead attempt's lease over); a job is attempted at most
    ``max_attempts`` times. ``scheduler`` fires the store's schedules and background jobs
    (``loom.schedule``): the scheduler's pass is a periodic task every ``schedule_every``
    seconds, run on one worker per tick, and each fired tick is a queued run.
    """

    conninfo: str
    concurrency: int = 4
    queues: tuple[str, ...] = ("loom",)
    lease_ttl: float = 30.0
    heartbeat: float = 1.0
    stalled_after: float = 5.0
    sweep_every: int = 1
    poll_every: float = 1.0
    max_attempts: int = 3
    pool_size: int = 10
    scheduler: bool = True
    schedule_every: int = 1

    def check(self) -> None:
        """Raise ``ConfigurationError`` for settings a fleet cannot work with."""
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ConfigurationError("concurrency and max_attempts must be at least 1")
        if min(self.lease_ttl, self.heartbeat, self.stalled_after, self.poll_every) <= 0:
            raise ConfigurationError("lease_ttl, heartbeat, stalled_after, poll_every must be > 0")
        if self.stalled_after < 2 * self.heartbeat:
            raise ConfigurationError(
                f"stalled_after ({self.stalled_after:g} s) must be at least twice the heartbeat "
                f"({self.heartbeat:g} s): one late heartbeat would otherwise pass a live worker "
                "for dead and its runs would be retried elsewhere"
            )
        if not 1 <= self.sweep_every <= 59:
            raise ConfigurationError(f"sweep_every must be 1..59 seconds, got {self.sweep_every}")
        if not 1 <= self.schedule_every <= 59:
            raise ConfigurationError(
                f"schedule_every must be 1..59 seconds, got {self.schedule_every}"
            )


async def run_worker(
    settings: WorkerSettings,
    agents: Mapping[str, ServedAgent],
    periodic: Iterable[PeriodicJob] = (),
) -> None:
    """Execute queued turns and periodic ticks until SIGINT / SIGTERM (then finish the running
    ones). ``periodic`` adds jobs run once per tick across the fleet (every worker must be
    given the same ones); with ``settings.scheduler`` the store's schedules fire too."""
    from loom.runtime import Runtime
    from loom.store.postgres import PostgresStore
    from loom.workers.fenced_jobs import FencedJobManager

    settings.check()
    store = PostgresStore(settings.conninfo, max_size=settings.pool_size)
    await store.open()
    await ensure_schema(settings.conninfo)
    runtime = Runtime(store, lease_ttl=settings.lease_ttl)
    set_context(WorkerContext(runtime, agents, settings.max_attempts))
    app = make_app(settings.conninfo, max_size=max(4, settings.concurrency + 2))
    app.job_manager = FencedJobManager(app.connector)  # a stalled worker cannot finish lost jobs
    sweep = sweep_job(settings.sweep_every, settings.stalled_after, settings.max_attempts)
    scheduler = None
    ticks = [sweep, *periodic]
    if settings.scheduler:
        from loom.schedule import QueueLauncher, build_scheduler, schedule_tick

        launcher = QueueLauncher(app, store, queue=settings.queues[0])
        scheduler = await build_scheduler(runtime, agents, launcher=launcher)
        ticks.append(schedule_tick(scheduler, settings.schedule_every))
    for job in ticks:
        add_periodic(app, store, job)
    try:
        async with app.open_async():
            if scheduler is not None:  # this worker's own runs, whichever worker has the tick
                scheduler.start(float(settings.schedule_every), claim=False)
            try:
                await app.run_worker_async(
                    queues=[*settings.queues, TICK_QUEUE],
                    concurrency=settings.concurrency,
                    update_heartbeat_interval=settings.heartbeat,
                    stalled_worker_timeout=settings.stalled_after,
                    fetch_job_polling_interval=settings.poll_every,
                    abort_job_polling_interval=min(5.0, settings.heartbeat),
                    install_signal_handlers=True,
                )
            finally:
                if scheduler is not None:  # its queued runs go on: other workers take them over
                    await scheduler.aclose(cancel_runs=False)
    finally:
        set_context(None)
        await runtime.aclose()
        await store.close()
