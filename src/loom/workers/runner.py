"""``run_worker``: one worker process (``loom worker``).

Failover with the default settings takes about 6 s (at most ~8 s) from a kill -9 to the run's
next event on another worker: the dead worker's last heartbeat is at most ``heartbeat`` old, its
jobs are stalled ``stalled_after`` seconds after it, the sweep (a periodic tick every
``sweep_every`` seconds, ``loom.workers.ticks``) retries them, a free worker polls them within
``poll_every``, and the retry takes the dead attempt's session lease over at once
(``loom.workers.failover``) instead of waiting ``lease_ttl`` for it to expire.

A database restart does not end a worker: when its connections drop (procrastinate's worker
stops, or raises), it logs it, waits for the database (up to ``db_wait`` seconds, polling with
backoff), and runs again; the jobs its old registration held are retried by the sweep like a
dead worker's. It exits with an error (non-zero, so ``Restart=on-failure`` restarts it) only
when the database stays away longer than ``db_wait``, or drops more than ``db_retries`` times
in a row without a minute of work between. SIGTERM / SIGINT give running turns ``grace``
seconds to finish, then they are aborted (cancelled; committed steps stay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.errors import ConfigurationError, StoreError
from loom.workers.app import ensure_schema, make_app
from loom.workers.tasks import WorkerContext, set_context
from loom.workers.ticks import TICK_QUEUE, PeriodicJob, add_periodic, sweep_job, sweep_stalled

if TYPE_CHECKING:
    import procrastinate

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
    grace: float = 30.0
    db_wait: float = 300.0
    db_retries: int = 10

    def check(self) -> None:
        """Raise ``ConfigurationError`` for settings a fleet cannot work with."""
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ConfigurationError("concurrency and max_attempts must be at least 1")
        if min(self.lease_ttl, self.heartbeat, self.stalled_after, self.poll_every) <= 0:
            raise ConfigurationError("lease_ttl, heartbeat, stalled_after, poll_every must be > 0")
        if self.grace < 0 or self.db_wait <= 0 or self.db_retries < 0:
            raise ConfigurationError(
                f"grace must be >= 0 and db_wait > 0 seconds, db_retries >= 0; got grace="
                f"{self.grace:g}, db_wait={self.db_wait:g}, db_retries={self.db_retries}"
            )
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
    """Execute queued turns and periodic ticks until SIGINT / SIGTERM (then the running ones
    get ``settings.grace`` seconds to finish), riding out database restarts. ``periodic``
    adds jobs run once per tick across the fleet (every worker must be given the same ones);
    with ``settings.scheduler`` the store's schedules fire too."""
    from loom.engine.runtime import Runtime
    from loom.store.postgres import PostgresStore
    from loom.workers.fenced_jobs import FencedJobManager

    settings.check()
    store = PostgresStore(settings.conninfo, max_size=settings.pool_size)
    await store.open()
    await ensure_schema(settings.conninfo)
    runtime = Runtime(store, lease_ttl=settings.lease_ttl)
    set_context(WorkerContext(runtime, agents, settings.max_attempts))
    # a lost database fails a queue call in 10 s (the store's timeout), not the pool's 30 s
    app = make_app(settings.conninfo, max_size=max(4, settings.concurrency + 2), timeout=10.0)
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
            log.info(
                "loom worker started: pid %d, agents %s, queues %s, concurrency %d, grace %g s, "
                "database %s",
                os.getpid(),
                ", ".join(sorted(agents)) or "(none)",
                ", ".join(settings.queues),
                settings.concurrency,
                settings.grace,
                _where(settings.conninfo),
            )
            try:
                await _work(app, settings)
            finally:
                if scheduler is not None:  # its queued runs go on: other workers take them over
                    try:
                        await scheduler.aclose(cancel_runs=False)
                    except StoreError as exc:  # the database is gone: the lease runs out instead
                        log.warning("could not hand this worker's schedule runs over: %s", exc)
    finally:
        set_context(None)
        await runtime.aclose()
        await store.close()
    log.info("loom worker stopped")


def _db_errors() -> tuple[type[BaseException], ...]:
    """What a lost database connection raises, through procrastinate or psycopg."""
    import psycopg
    from procrastinate.exceptions import ConnectorException
    from psycopg_pool import PoolTimeout

    return (ConnectorException, psycopg.OperationalError, PoolTimeout, StoreError, OSError)


async def _work(app: procrastinate.App, settings: WorkerSettings) -> None:
    """Run procrastinate's worker until SIGTERM / SIGINT; when the database drops, wait for it
    and run again (see the module docstring for the bounds)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    errors, failures = _db_errors(), 0
    try:
        while not stop.is_set():
            began = loop.time()
            work = asyncio.ensure_future(
                app.run_worker_async(
                    queues=[*settings.queues, TICK_QUEUE],
                    concurrency=settings.concurrency,
                    update_heartbeat_interval=settings.heartbeat,
                    stalled_worker_timeout=settings.stalled_after,
                    fetch_job_polling_interval=settings.poll_every,
                    abort_job_polling_interval=min(5.0, settings.heartbeat),
                    shutdown_graceful_timeout=settings.grace,
                    install_signal_handlers=False,  # ours: a stop is told from a lost database
                )
            )
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if stop.is_set():
                log.info("stopping: running turns get %g s to finish", settings.grace)
                work.cancel()  # procrastinate's graceful stop, bounded by shutdown_graceful_timeout
                with contextlib.suppress(asyncio.CancelledError, *errors):
                    await work
                return
            try:
                work.result()
                why = "procrastinate's worker stopped (its connection to the database failed)"
            except errors as exc:
                why = (
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                )
            failures = 1 if loop.time() - began > 60 else failures + 1
            if failures > settings.db_retries:
                raise StoreError(
                    f"the worker lost its database {failures} times in a row ({why}); giving "
                    "up so that the service manager restarts it. Check the database server."
                )
            log.warning(
                "database unreachable (%s); waiting up to %g s for it (attempt %d of %d)",
                why,
                settings.db_wait,
                failures,
                settings.db_retries,
            )
            await _wait_for_database(settings, stop)
            if not stop.is_set():
                log.warning("database reachable again; taking runs again")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _wait_for_database(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Return once a connection to the database works (or a stop was asked); raise
    ``StoreError`` after ``settings.db_wait`` seconds of failed attempts."""
    import psycopg

    loop = asyncio.get_running_loop()
    give_up, delay, last = loop.time() + settings.db_wait, 0.2, ""
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(settings.conninfo, connect_timeout=2)
        except psycopg.Error as exc:
            last = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        else:
            await conn.close()
            return
        if loop.time() + delay > give_up:
            raise StoreError(
                f"the worker's database stayed unreachable for {settings.db_wait:g} s "
                f"(--db-wait); last error: {last}. Exiting so that the service manager restarts "
                "it; check the database server."
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 5.0)


def _where(conninfo: str) -> str:
    """The database as a log line may show it: host, port and name, never a password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(conninfo)
    except Exception:
        return "(unparsable connection string)"
    host, port, name = (
        parts.get("host", "localhost"),
        parts.get("port", "5432"),
        parts.get("dbname"),
    )
    return f"{host}:{port}/{name or '(default)'}"
