"""The procrastinate app Loom's queue runs on, and what servers and tools call on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loom.errors import ConfigurationError, StoreError
from loom.workers.records import JOB_NAMESPACE, RUN_TASK, kv_of

if TYPE_CHECKING:
    import procrastinate

    from loom.store.base import Store

__all__ = [
    "JOB_NAMESPACE",
    "RUN_TASK",
    "abort_run",
    "enqueue_run",
    "ensure_schema",
    "job_state",
    "kv_of",
    "make_app",
    "session_lock",
]


_SCHEMA_LOCK = 0x6C6F6F6D  # advisory lock key ("loom") held while the queue's schema is made


def make_app(conninfo: str, **pool: Any) -> procrastinate.App:
    """A procrastinate ``App`` on ``conninfo`` (a libpq URL or ``key=value`` string) with Loom's
    turn task registered. Open it (``async with app.open_async():``) before use."""
    try:
        import procrastinate
    except ImportError as exc:  # pragma: no cover - the postgres extra
        raise ConfigurationError(
            "the queue needs procrastinate: pip install 'loom-agents[postgres]'"
        ) from exc
    from loom.workers.tasks import run_turn

    connector = procrastinate.PsycopgConnector(conninfo=conninfo, **pool)
    app = procrastinate.App(connector=connector)
    app.task(name=RUN_TASK, pass_context=True)(run_turn)
    return app


async def ensure_schema(conninfo: str) -> bool:
    """Create procrastinate's tables in the database (schema) of ``conninfo`` unless they are
    there; several processes starting at once create them once. True when it created them."""
    import psycopg
    from procrastinate.schema import SchemaManager

    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise StoreError(f"cannot reach the queue's database: {exc}") from exc
    async with conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK,))
        try:
            cur = await conn.execute("SELECT to_regclass('procrastinate_jobs')")
            row = await cur.fetchone()
            if row is not None and row[0] is not None:
                return False
            sql = SchemaManager.get_schema()
            await conn.execute(sql.encode())
            return True
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK,))


async def enqueue_run(
    app: procrastinate.App,
    agent: str,
    session_id: str,
    message: str,
    *,
    queue: str = "loom",
    priority: int = 0,
    run_id: str | None = None,
    queueing_lock: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    owner: str | None = None,
) -> int:
    """Queue one turn of ``agent`` on ``session_id`` with ``message``; return the job id.

    Turns of one session run one after another in the order queued (the job's procrastinate
    ``lock`` is the session), on whichever worker is free. ``run_id`` names the run its first
    attempt makes (a retry's is ``<run_id>-a<attempt>``), so a server can hand the id out
    before any worker took the job; without it, attempts are ``run_j<job>a<attempt>``.
    ``queueing_lock``: procrastinate refuses (``AlreadyEnqueued``) a second waiting job with it.
    ``parts``: the message's images, files and audio in their JSON form (``loom.content``),
    naming bytes already in the store by reference (``BlobStore.put_blobs`` first): the job's
    arguments never hold the bytes. ``owner``: whom the run acts for (``RunOptions.owner``;
    default the session's recorded owner)."""
    deferrer = app.configure_task(
        RUN_TASK,
        lock=session_lock(session_id),
        queue=queue,
        priority=priority,
        queueing_lock=queueing_lock,
    )
    extra: dict[str, Any] = {} if run_id is None else {"run_id": run_id}
    if parts:
        extra["parts"] = parts
    if owner is not None:
        extra["owner"] = owner
    return int(
        await deferrer.defer_async(agent=agent, session_id=session_id, message=message, **extra)
    )


def session_lock(session_id: str) -> str:
    """The procrastinate ``lock`` of a session's jobs (one of them runs at a time)."""
    return f"loom-session:{session_id}"


async def abort_run(app: procrastinate.App, job_id: int) -> bool:
    """Stop job ``job_id`` from any process: a queued job is cancelled, a running one aborted
    (its worker cancels the turn at its next await). False when the job is already over."""
    return bool(await app.job_manager.cancel_job_by_id_async(job_id, abort=True))


async def job_state(store: Store, job_id: int) -> dict[str, Any] | None:
    """What Loom recorded of job ``job_id``: its session, the runs its attempts made
    (``runs``), and at the end ``status`` (``finished`` or ``failed``), ``stop_reason``,
    ``error``."""
    value = await kv_of(store).get_value(JOB_NAMESPACE, str(job_id))
    return value if isinstance(value, dict) else None
