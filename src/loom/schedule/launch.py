"""What runs a fired tick: an agent turn on a ``Runtime`` (``RuntimeLauncher``) or a queued job
on the workers (``QueueLauncher``). Implement ``Launcher`` to run ticks some other way."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loom.errors import ScheduleError

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.runtime import Runtime
    from loom.schedule.model import Schedule, ScheduleRun

__all__ = ["Launcher", "Outcome", "QueueLauncher", "RuntimeLauncher"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a tick's run ended: ``error`` (``None``: it succeeded) after ``attempts`` tries."""

    error: str | None = None
    attempts: int = 1


class Launcher(Protocol):
    """Runs one fired tick to its end. Cancelling the awaiting task stops the run."""

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome: ...


class RuntimeLauncher:
    """Runs the schedule's agent in this process on ``runtime`` (``loom serve``): the turn is
    named ``run_id`` and runs on the tick's session (its gate queues turns of one session)."""

    def __init__(self, runtime: Runtime, agents: Mapping[str, Agent]) -> None:
        self.runtime = runtime
        self.agents = agents

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        from loom.driving import discard

        agent = self.agents.get(schedule.agent)
        if agent is None:
            raise ScheduleError(f"no agent named {schedule.agent!r} in this process", field="agent")
        session = run.session_id or schedule.session_for(run.tick)
        turn = self.runtime.prepare(agent, schedule.message, session, "queue", None, run_id=run_id)
        await turn.run(discard)
        result = turn.result
        if result is None or result.stop_reason in ("error", "cancelled"):
            return Outcome(error=(result.error if result else None) or "the run did not finish")
        return Outcome()


class QueueLauncher:
    """Queues the tick's turn on the workers (``loom.workers.enqueue_run``) and waits for the
    job's end (its record in the store); cancelling aborts the job."""

    def __init__(self, app: Any, store: Any, *, poll_every: float = 0.5) -> None:
        self.app = app
        self.store = store
        self.poll_every = poll_every

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        from loom.workers.app import abort_run, enqueue_run, job_state

        session = run.session_id or schedule.session_for(run.tick)
        job = await enqueue_run(self.app, schedule.agent, session, schedule.message)
        try:
            while True:
                state = await job_state(self.store, job)
                if state is not None and state.get("status") in ("finished", "failed"):
                    failed = state.get("status") == "failed"
                    return Outcome(error=str(state.get("error") or "failed") if failed else None)
                await asyncio.sleep(self.poll_every)
        except asyncio.CancelledError:
            await abort_run(self.app, job)
            raise
