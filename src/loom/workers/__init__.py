"""Workers: queued runs executed by a fleet of processes sharing one PostgreSQL database.

The queue, the worker pool, per-session ordering, aborts and dead-worker detection are
procrastinate's (a PostgreSQL task queue); what a run does and how a retried run picks up where
a dead one stopped are Loom's (the journal, the ledger, INTAKE recovery).

- ``enqueue_run(app, agent, session_id, message)`` puts a turn on the queue (one job; jobs of a
  session carry the session as their procrastinate ``lock``, so they run one after another, in
  order) and returns the job id;
- ``loom worker --store postgres://... --agents DIR`` (``run_worker``) executes them;
- ``abort_run(app, job_id)`` stops a queued or running job from any process: the worker that
  holds it cancels the Loom turn at its next await (its open calls get ``interrupted`` results,
  the run ends ``cancelled`` with the reason recorded);
- a worker killed mid-run (kill -9, power loss) stops sending heartbeats; another worker finds
  its job stalled and retries it, and the retry resumes from the journal (``loom.workers.tasks``)
  instead of sending the message again; the retry takes the dead attempt's session lease over
  at once (``loom.workers.failover``: the fencing token, not a timeout, keeps the old attempt
  out). A job whose runs keep killing their worker is failed after ``max_attempts``, with the
  reason kept in the store (``job_state``);
- periodic jobs (``PeriodicJob``, ``run_worker(..., periodic=[...])``) run once per tick
  across the fleet on procrastinate's periodic tasks; the stalled-job sweep is one
  (``loom.workers.ticks``).
"""

from __future__ import annotations

from loom.workers.app import (
    JOB_NAMESPACE,
    RUN_TASK,
    abort_run,
    enqueue_run,
    ensure_schema,
    job_state,
    make_app,
)
from loom.workers.runner import WorkerSettings, run_worker
from loom.workers.ticks import PeriodicJob, Tick

__all__ = [
    "JOB_NAMESPACE",
    "RUN_TASK",
    "PeriodicJob",
    "Tick",
    "WorkerSettings",
    "abort_run",
    "enqueue_run",
    "ensure_schema",
    "job_state",
    "make_app",
    "run_worker",
]
