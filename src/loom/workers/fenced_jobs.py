"""``FencedJobManager``: a stalled worker that comes back cannot report a job it lost.

procrastinate's ``finish_job`` sets a job's final status whatever worker runs it now. After a
stall (SIGSTOP, a long pause) the sweep retries the job on another worker; when the stalled
worker wakes, its attempt ends (its writes are refused by the lease fence) and procrastinate
would mark the job failed under the retry's feet. This manager finishes a job only while it is
still running on the worker that fetched it, and drops (logs) a stale outcome instead. Imported
by ``run_worker`` only: it needs procrastinate (the ``postgres`` extra).
"""

from __future__ import annotations

import logging

from procrastinate import jobs
from procrastinate.manager import JobManager

__all__ = ["FencedJobManager"]

log = logging.getLogger("loom.workers")

# Locked first, so a concurrent retry by the sweep (procrastinate_retry_job locks the same row)
# lands either before (no row: the outcome is dropped) or after (it finds the job finished).
_FINISH_IF_MINE = (
    "SELECT procrastinate_finish_job_v1(mine.id, %(status)s, %(delete_job)s) FROM ("
    "SELECT id FROM procrastinate_jobs WHERE id = %(job_id)s AND status = 'doing' "
    "AND worker_id = %(worker_id)s FOR UPDATE) AS mine"
)


class FencedJobManager(JobManager):
    """procrastinate's ``JobManager``, except that a worker reports a job's outcome only while
    the job is still running *on that worker*: after a stall and a retry elsewhere, the job is
    the retry's, and the stale outcome is dropped (logged) instead of overwriting it."""

    async def finish_job(self, job: jobs.Job, status: jobs.Status, delete_job: bool) -> None:
        """Finish ``job`` with ``status`` if this worker still runs it; else log and drop."""
        if job.worker_id is None:  # not fetched by a worker (tooling): procrastinate's own way
            await super().finish_job(job, status, delete_job)
            return
        rows = await self.connector.execute_query_all_async(
            _FINISH_IF_MINE,
            job_id=job.id,
            worker_id=job.worker_id,
            status=status.value,
            delete_job=delete_job,
        )
        if not rows:
            log.warning(
                "job %s was retried on another worker while this one (worker %s) was stalled; "
                "its outcome here (%s) is dropped",
                job.id,
                job.worker_id,
                status.value,
            )
