"""``run_worker``: one worker process (``loom worker``), and its dead-worker sweeper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.workers.app import JOB_NAMESPACE, RUN_TASK, ensure_schema, kv_of, make_app
from loom.workers.tasks import WorkerContext, set_context

if TYPE_CHECKING:
    import procrastinate

    from loom.agent import Agent
    from loom.store.base import Store

__all__ = ["WorkerSettings", "run_worker", "sweep_stalled"]

log = logging.getLogger("loom.workers")


@dataclass(slots=True)
class WorkerSettings:
    """How a worker runs (the ``loom worker`` options).

    ``heartbeat`` seconds between this worker's heartbeats; a worker silent for
    ``stalled_after`` seconds is dead and its running jobs are retried (checked every
    ``sweep_every`` seconds by every worker); ``lease_ttl`` is the Loom session lease (a retry
    waits for a dead run's lease to expire, so failover takes about ``stalled_after`` +
    ``lease_ttl`` at worst); a job is attempted at most ``max_attempts`` times.
    """

    conninfo: str
    concurrency: int = 4
    queues: tuple[str, ...] = ("loom",)
    lease_ttl: float = 30.0
    heartbeat: float = 5.0
    stalled_after: float = 20.0
    sweep_every: float = 5.0
    max_attempts: int = 3
    pool_size: int = 10


async def sweep_stalled(
    app: procrastinate.App, store: Store, stalled_after: float, max_attempts: int
) -> int:
    """Retry the running jobs of workers silent for ``stalled_after`` seconds (procrastinate's
    heartbeat detection), failing those already attempted ``max_attempts`` times. Returns how
    many jobs it retried or failed."""
    from procrastinate.jobs import Status

    done = 0
    jobs = await app.job_manager.get_stalled_jobs(
        task_name=RUN_TASK, seconds_since_heartbeat=stalled_after
    )
    for job in jobs:
        assert job.id is not None
        try:
            if job.attempts + 1 >= max_attempts:
                record = await kv_of(store).get_value(JOB_NAMESPACE, str(job.id))
                record = dict(record) if isinstance(record, dict) else {"runs": []}
                record.update(status="failed", error=(
                    f"job {job.id}: its worker died on each of {job.attempts + 1} attempts "
                    f"(max_attempts={max_attempts}); not retrying. The session's next turn "
                    "closes the dead runs."))  # fmt: skip
                await kv_of(store).put_value(JOB_NAMESPACE, str(job.id), record)
                await app.job_manager.finish_job(job, Status.FAILED, delete_job=False)
                log.warning("job %s failed: crash loop", job.id)
            else:
                await app.job_manager.retry_job(job)
                log.warning("job %s: worker %s is gone; retrying", job.id, job.worker_id)
            done += 1
        except Exception as exc:  # another worker's sweep got there first
            log.debug("job %s: not retried (%s)", job.id, exc)
    return done


async def run_worker(settings: WorkerSettings, agents: Mapping[str, Agent]) -> None:
    """Execute queued turns until SIGINT / SIGTERM (then finish the running ones)."""
    from loom.runtime import Runtime
    from loom.store.postgres import PostgresStore

    store = PostgresStore(settings.conninfo, max_size=settings.pool_size)
    await store.open()
    await ensure_schema(settings.conninfo)
    runtime = Runtime(store, lease_ttl=settings.lease_ttl)
    set_context(WorkerContext(runtime, agents, settings.max_attempts))
    app = make_app(settings.conninfo, max_size=max(4, settings.concurrency + 2))

    async def sweeper() -> None:
        while True:
            await asyncio.sleep(settings.sweep_every)
            try:
                await sweep_stalled(app, store, settings.stalled_after, settings.max_attempts)
            except Exception:
                log.exception("sweeping stalled jobs failed; trying again")

    try:
        async with app.open_async():
            sweep = asyncio.ensure_future(sweeper())
            try:
                await app.run_worker_async(
                    queues=list(settings.queues),
                    concurrency=settings.concurrency,
                    update_heartbeat_interval=settings.heartbeat,
                    stalled_worker_timeout=settings.stalled_after,
                    abort_job_polling_interval=min(5.0, settings.heartbeat),
                    install_signal_handlers=True,
                )
            finally:
                sweep.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweep
    finally:
        set_context(None)
        await runtime.aclose()
        await store.close()
