"""What runs a fired tick: an agent turn on a ``Runtime`` (``RuntimeLauncher``) or a queued job
on the workers (``QueueLauncher``). Implement ``Launcher`` to run ticks some other way."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loom.engine.run_inputs import Drivable
from loom.engine.runtime import NamedRunnable
from loom.errors import UnknownTarget

if TYPE_CHECKING:
    from loom.engine.runtime import Runtime
    from loom.schedule.model import Schedule, ScheduleRun

Target = NamedRunnable[Drivable]
"""What a schedule runs: an agent (``Agent``) or a crew (``Crew``), seen through the front
door's Protocol so that the schedule modules know neither."""

__all__ = [
    "JOBS_NAMESPACE",
    "Launcher",
    "Outcome",
    "QueueLauncher",
    "RuntimeLauncher",
    "Target",
]

JOBS_NAMESPACE = "loom.schedule.jobs"
"""Key-value namespace of the queued job of each scheduled run (key: the run id)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a tick's run ended: ``error`` (``None``: it succeeded) after ``attempts`` tries."""

    error: str | None = None
    attempts: int = 1


class Launcher(Protocol):
    """Runs one fired tick to its end. Cancelling the awaiting task stops the run."""

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome: ...


class RuntimeLauncher:
    """Runs the schedule's agent (or crew) in this process on ``runtime`` (``loom serve``),
    started by ``Runtime.start``: the run is named ``run_id`` and runs on the tick's session
    (its gate queues runs of one session; a crew's is its crew session). ``agents`` are looked
    up by name; ``add`` makes one more agent or crew known here (``Scheduler.schedule``)."""

    def __init__(self, runtime: Runtime, agents: Mapping[str, Target]) -> None:
        self.runtime = runtime
        self.agents = agents
        self.added: dict[str, Target] = {}

    def add(self, target: Target) -> None:
        """Run ``target`` for schedules naming it (it wins over an ``agents`` entry)."""
        self.added[target.name] = target

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        from loom.engine.driving import discard
        from loom.engine.run_inputs import RunOptions

        target = self.added.get(schedule.agent) or self.agents.get(schedule.agent)
        if target is None:
            raise UnknownTarget(f"no agent named {schedule.agent!r} in this process", field="agent")
        session = run.session_id or schedule.session_for(run.tick)
        # agent or crew, through the front door; the tick's run is named ``run_id``
        started = await self.runtime.start(
            target,
            schedule.message,
            session_id=session,
            # the run acts for the schedule's key: its memories are that key's
            options=RunOptions(run_id=run_id, owner=schedule.principal),
        )
        await started.run(discard)
        result = started.result
        if result is None or result.stop_reason in ("error", "cancelled"):
            error = (result.error or result.stop_reason) if result else None
            return Outcome(error=error or "the run did not finish")
        return Outcome()


class QueueLauncher:
    """Queues the tick's turn on the workers (``loom.workers.enqueue_run``, the run named
    ``run_id``) and waits for the job's end (its record in the store); cancelling aborts the
    job. ``loom worker`` fires schedules with it.

    It re-attaches (``reattaches``): run again for a tick whose job exists, it waits for that
    job instead of queueing another. The job's id is kept in the store (key-value namespace
    ``loom.schedule.jobs``, key = run id); a job queued by a process that died before keeping
    its id is found by its queueing lock while it waits, or by its run in the session's
    journal once it ran. After ``detach()`` (the process shuts down) a cancelled wait leaves
    the job running.
    """

    reattaches = True

    def __init__(
        self, app: Any, store: Any, *, queue: str = "loom", poll_every: float = 0.2
    ) -> None:
        self.app = app
        self.store = store
        self.queue = queue
        self.poll_every = poll_every
        self.detached = False

    def detach(self) -> None:
        """From now on a cancelled wait stops waiting and leaves the job alone."""
        self.detached = True

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        from loom.workers.app import abort_run, job_state, kv_of

        session = run.session_id or schedule.session_for(run.tick)
        kv = kv_of(self.store)
        job = await kv.get_value(JOBS_NAMESPACE, run_id)
        if not isinstance(job, int):
            ran = await self._ran(session, run_id)
            if ran is not None:
                return ran  # queued and run before its id was kept: not again
            job = await self._enqueue(schedule, session, run_id)
            await kv.put_value(JOBS_NAMESPACE, run_id, job)
        try:
            while True:
                state = await job_state(self.store, job)
                if state is not None and state.get("status") in ("finished", "failed"):
                    if state.get("status") == "failed" or state.get("stop_reason") in (
                        "error",
                        "cancelled",
                    ):
                        return Outcome(error=str(state.get("error") or "the run failed"))
                    return Outcome()
                await asyncio.sleep(self.poll_every)
        except asyncio.CancelledError:
            if not self.detached:
                await abort_run(self.app, job)
            raise

    async def _enqueue(self, schedule: Schedule, session: str, run_id: str) -> int:
        from procrastinate.exceptions import AlreadyEnqueued

        from loom.workers.app import enqueue_run

        lock = f"loom-schedule:{run_id}"
        try:
            return await enqueue_run(
                self.app,
                schedule.agent,
                session,
                schedule.message,
                queue=self.queue,
                run_id=run_id,
                queueing_lock=lock,
                owner=schedule.principal,
            )
        except AlreadyEnqueued:  # queued by a process that died before it kept the job's id
            waiting = await self.app.job_manager.list_jobs_async(queueing_lock=lock)
            return int(next(iter(waiting)).id)

    async def _ran(self, session: str, run_id: str) -> Outcome | None:
        list_runs = getattr(self.store, "list_runs", None)
        if list_runs is None:
            return None
        records = [r for r in await list_runs(session) if r.run_id == run_id]
        if not records:
            return None
        ended = [r for r in records if r.status != "running"]
        if not ended:  # started, never ended: its job is gone or still going; not again
            return Outcome(
                error="its job ended without the run's end; the session's next "
                "turn recovers the run"
            )
        reason = ended[-1].status
        return Outcome(
            error=f"the run ended: {reason}" if reason in ("error", "cancelled") else None
        )
