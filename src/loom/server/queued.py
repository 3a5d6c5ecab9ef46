"""Background runs through the queue (``loom serve --store postgres://... --queue``).

A background run is not run by the server that took it: it is a procrastinate job
(``loom.workers.enqueue_run``) that some ``loom worker`` executes. The client gets a run id at
once (``run_<uuid>``); the job carries it, its first attempt's Loom run uses it (a retry's is
``<run id>-a<attempt>``), and the key-value store maps it to the job (:data:`RUNS_NAMESPACE`),
so every server process can answer for the run:

- its status and frames come from the journal: a :class:`JournalTail` reads the run's events
  as the worker commits them and turns them into the same frames, with the same ids, that a
  replay gives (``loom.server.lg_runs``), so a client may stream from one server, drop, and
  rejoin on another with ``Last-Event-ID``;
- it learns of new events by PostgreSQL ``LISTEN``/``NOTIFY`` (every append with events
  notifies :data:`loom.store.postgres.EVENTS_CHANNEL` with the session id, at its commit),
  with a slow poll as the safety net (a lost listener connection, a missed notification);
- the end of a run the journal cannot tell (a job cancelled before a worker took it, a crash
  loop) comes from the job's record and the queue's job status;
- cancelling aborts the job (``abort_run``): the worker holding it cancels the turn at its next
  await, the run ends ``cancelled`` with the reason in its ``AgentFinish``.

Tuning (environment of ``loom serve``): ``LOOM_QUEUE_TAIL`` is ``notify`` (default) or
``poll``; ``LOOM_QUEUE_POLL`` the seconds between journal reads without a notification (default
1.0 with ``notify``, 0.1 with ``poll``). ``benchmarks/stream_tail.py`` measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from loom.engine.journal import transcript
from loom.errors import ConfigurationError
from loom.events import AgentEvent, AgentFinish, AgentStart
from loom.server.lg_runs import Frame, FrameMaker, LgRun, attempt_offset, run_status

if TYPE_CHECKING:
    import procrastinate

    from loom.store.base import KVStore, Store

__all__ = ["RUNS_NAMESPACE", "JournalTail", "RunQueue", "attempt_offset"]

log = logging.getLogger("loom.server.queue")

RUNS_NAMESPACE = "loom.server.runs"
"""Key-value namespace of queued runs, by client run id: the job, thread, assistant, options."""

_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "aborted"})


class RunQueue:
    """The server's handle on the queue: enqueue, abort, job status, and journal wake-ups."""

    def __init__(self, conninfo: str, *, mode: str | None = None, poll: float | None = None):
        mode = mode or os.environ.get("LOOM_QUEUE_TAIL", "notify")
        if mode not in ("notify", "poll"):
            raise ConfigurationError(f"LOOM_QUEUE_TAIL is notify or poll, got {mode!r}")
        self.conninfo, self.mode = conninfo, mode
        default = 1.0 if mode == "notify" else 0.1
        self.poll = float(poll if poll is not None else os.environ.get("LOOM_QUEUE_POLL", default))
        if self.poll <= 0:
            raise ConfigurationError(f"LOOM_QUEUE_POLL must be positive, got {self.poll}")
        self._app: procrastinate.App | None = None
        self._stack = AsyncExitStack()
        self._listener: asyncio.Task[None] | None = None
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self.listening = asyncio.Event()  # set while LISTEN is in effect

    @property
    def app(self) -> procrastinate.App:
        if self._app is None:
            raise ConfigurationError("the run queue is not open (the server has not started)")
        return self._app

    async def open(self) -> None:
        """Create the queue's tables if needed, open its pool, start listening."""
        from loom.workers import ensure_schema, make_app

        await ensure_schema(self.conninfo)
        app = make_app(self.conninfo)
        await self._stack.enter_async_context(app.open_async())
        self._app = app
        if self.mode == "notify":
            self._listener = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self._stack.aclose()
        self._app = None

    async def enqueue(
        self,
        agent: str,
        thread_id: str,
        message: str,
        run_id: str,
        *,
        parts: list[dict[str, Any]] | None = None,
    ) -> int:
        """Queue the run; ``parts``: its media in JSON form, naming bytes already stored."""
        from loom.workers import enqueue_run

        return await enqueue_run(
            self.app, agent, thread_id, message, run_id=run_id, parts=parts or None
        )

    async def abort(self, job_id: int) -> bool:
        from loom.workers import abort_run

        return await abort_run(self.app, job_id)

    async def status(self, job_id: int) -> str:
        return str((await self.app.job_manager.get_job_status_async(job_id)).value)

    async def live_jobs(self, thread_id: str) -> list[int]:
        """The thread's jobs queued or running, oldest first."""
        from loom.workers.app import session_lock

        out: list[int] = []
        for status in ("doing", "todo"):
            jobs = await self.app.job_manager.list_jobs_async(
                lock=session_lock(thread_id), status=status
            )
            out += [j.id for j in jobs if j.id is not None]
        return sorted(out)

    # -- wake-ups -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, session_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever ``session_id``'s journal may have grown (while in the block)."""
        wake = asyncio.Event()
        self._waiters.setdefault(session_id, set()).add(wake)
        try:
            yield wake
        finally:
            waiters = self._waiters.get(session_id)
            if waiters is not None:
                waiters.discard(wake)
                if not waiters:
                    del self._waiters[session_id]

    async def wait(self, wake: asyncio.Event) -> None:
        """Until ``wake`` is set or the poll interval passed; clears ``wake``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), self.poll)
        wake.clear()

    async def _listen(self) -> None:
        import psycopg

        from loom.store.postgres import EVENTS_CHANNEL

        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self.listening.set()
                    self._wake_all()  # whatever committed while nobody listened
                    async for note in conn.notifies():
                        for wake in self._waiters.get(note.payload, ()):
                            wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the poll carries on; listen again soon
                log.warning("LISTEN %s lost (%s); polling until it is back", EVENTS_CHANNEL, exc)
            self.listening.clear()
            await asyncio.sleep(self.poll)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for wake in waiters:
                wake.set()


class JournalTail:
    """Feeds an :class:`LgRun` from the journal: the frames of a queued run's events as the
    worker commits them, and its end (from the journal, the job record or the queue)."""

    def __init__(self, queue: RunQueue, store: Store, kv: KVStore, run: LgRun, job: int) -> None:
        self.queue, self.store, self.kv, self.run, self.job = queue, store, kv, run, job
        self.maker = FrameMaker(run.thread_id, run.run_id, run.assistant_id)
        self.seen: dict[str, int] = {}  # attempt run id -> last sequence turned into frames
        self.started = False
        self.caught_up = asyncio.Event()  # the first read is done (status is current)

    async def __call__(self, run: LgRun) -> None:
        failures = 0
        with self.queue.watch(run.thread_id) as wake:
            while True:
                try:
                    if await self.step():
                        return
                    failures = 0
                except Exception as exc:  # a database hiccup: read again, a bounded number of times
                    failures += 1
                    if failures > 10:
                        raise
                    log.warning("tailing run %s: %s; reading again", run.run_id, exc)
                finally:
                    self.caught_up.set()
                await self.queue.wait(wake)

    async def _attempts(self) -> list[str]:
        from loom.workers import JOB_NAMESPACE

        record = await self.kv.get_value(JOB_NAMESPACE, str(self.job))
        runs = list(record.get("runs", [])) if isinstance(record, dict) else []
        return runs or [self.run.run_id]

    async def _read(self, attempts: list[str]) -> bool | None:
        """Turn the attempts' new events into frames; True when one of them finished, None
        when there was nothing new."""
        finished: bool | None = None
        for index, run_id in enumerate(attempts):
            last = self.seen.get(run_id, -1)
            fresh = [
                e
                for e in await self.store.load_events(self.run.thread_id, run_id)
                if e.sequence > last
            ]
            for ev in fresh:
                self.seen[run_id] = ev.sequence
                await self._add(ev, attempt_offset(index))
                finished = bool(finished) or isinstance(ev, AgentFinish)
        return finished

    async def _add(self, ev: AgentEvent, offset: int) -> None:
        run = self.run
        if not self.started:
            self.started = True
            events = await self.store.load_events(run.thread_id)
            first = next((i for i, e in enumerate(events) if e.run_id == ev.run_id), len(events))
            self.maker.start(transcript(events[:first]))
        ev.sequence += offset
        if isinstance(ev, AgentStart) and run.status == "pending":
            run.status = "running"
        run.add(self.maker.frames(ev))
        if isinstance(ev, AgentFinish):
            run.stop_reason, run.error = ev.stop_reason, ev.error
            run.status = run_status(ev.stop_reason)

    async def step(self) -> bool:
        """Read what is new; True (and the run ended) when the run is over."""
        from loom.workers import JOB_NAMESPACE

        fresh = await self._read(await self._attempts())
        if fresh:
            return self._end()
        if fresh is not None:  # it is making progress: no need to ask the queue
            return False
        status = await self.queue.status(self.job)
        if status not in _TERMINAL:
            return False
        # the queue says it is over: what the worker committed before is in the journal now
        if await self._read(await self._attempts()):
            return self._end()
        record = await self.kv.get_value(JOB_NAMESPACE, str(self.job))
        record = record if isinstance(record, dict) else {}
        run = self.run
        if status == "cancelled":
            run.status, run.stop_reason = "interrupted", "cancelled"
            run.error = f"cancelled before a worker took it (job {self.job})"
        else:
            run.status = "error" if status == "failed" else "interrupted"
            run.stop_reason = record.get("stop_reason") or (
                "error" if status == "failed" else "cancelled"
            )
            run.error = record.get("error") or f"job {self.job} ended {status} without a result"
        if run.status == "error":
            run.add([Frame(None, "error", {"error": "RunError", "message": run.error})])
        return self._end()

    def _end(self) -> bool:
        self.run.updated_at = datetime.now(UTC)
        return True
