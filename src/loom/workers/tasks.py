"""The queued turn: ``run_turn``, executed by ``loom worker`` processes.

A job may be attempted more than once: a worker killed mid-run (kill -9, power loss) stops
sending heartbeats and another worker retries the job. Each attempt is a Loom run of its own,
named ``run_j<job>a<attempt>`` and listed in the job's record (``Store.put_value`` under
``loom.jobs``, key = job id) *before* it starts, so a retry knows what its predecessors did from
the journal alone:

- one of them finished (``AGENT_FINISH`` committed; the worker died before the queue heard of
  it): nothing runs again, the job ends with that run's outcome;
- one of them committed the user's message: the message is **not** sent again; the retry is a
  ``CarryOn()`` run (``Runtime.start``): its INTAKE closes the dead run (finished steps stay
  done, ``pure`` / ``idempotent`` calls that were running are re-run with their idempotency key,
  ``at_most_once`` calls get ``interrupted`` results) and the model goes on from there;
- none did: the turn starts with the message, and its INTAKE closes the dead run.

A job whose attempts keep dying stops after ``max_attempts``: its record says ``failed`` with
the reason and the task raises ``JobFailed`` (the queue marks the job failed, without retry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loom.engine.driving import discard
from loom.engine.run_inputs import CarryOn, Drivable, NewMessage, RunOptions
from loom.engine.runtime import NamedRunnable
from loom.engine.turn_spec import TurnSpec
from loom.errors import ConfigurationError, LeaseLost, LoomError
from loom.events import AgentFinish, EventType, parts_of
from loom.workers.failover import take_over
from loom.workers.records import JOB_NAMESPACE, kv_of

if TYPE_CHECKING:
    from procrastinate.job_context import JobContext

    from loom.engine.runtime import Runtime

__all__ = ["JobFailed", "ServedAgent", "WorkerContext", "new_message", "run_turn", "set_context"]


class JobFailed(LoomError):
    """A queued run that will not be attempted again (crash loop, unknown agent)."""


class ServedAgent(TurnSpec, NamedRunnable[Drivable], Protocol):
    """An agent as a worker serves it (``Agent``): its definition, started through the front
    door (``Runtime.start``)."""


@dataclass(slots=True)
class WorkerContext:
    """What the turns of a worker process run with."""

    runtime: Runtime
    agents: Mapping[str, ServedAgent]
    max_attempts: int = 3

    def agent(self, name: str) -> ServedAgent:
        try:
            return self.agents[name]
        except KeyError:
            raise JobFailed(
                f"this worker serves no agent named {name!r} (it has: "
                f"{', '.join(sorted(self.agents)) or 'none'})"
            ) from None


_CONTEXT: WorkerContext | None = None


def set_context(context: WorkerContext | None) -> None:
    """Set what ``run_turn`` runs with in this process (``run_worker`` does)."""
    global _CONTEXT
    _CONTEXT = context


async def _save(ctx: WorkerContext, job_id: int, record: dict[str, Any]) -> None:
    await kv_of(ctx.runtime.store).put_value(JOB_NAMESPACE, str(job_id), record)


async def run_turn(
    context: JobContext,
    agent: str,
    session_id: str,
    message: str,
    run_id: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """Run (or, on a retry, finish) one queued turn; returns the job's record. ``run_id`` (a
    server's queued run) names the first attempt's run; later attempts derive from it.
    ``parts``: the message's media, as references to bytes stored at enqueue. ``owner``: whom
    the run acts for (None: the session's recorded owner, read by ``Runtime.start``)."""
    ctx = _CONTEXT
    if ctx is None:
        raise ConfigurationError("loom.run_turn runs only in a `loom worker` process")
    job_id = context.job.id
    assert job_id is not None
    store = ctx.runtime.store
    record = await kv_of(store).get_value(JOB_NAMESPACE, str(job_id))
    if not isinstance(record, dict):
        record = {"session_id": session_id, "agent": agent, "runs": []}
    if record.get("status") in ("finished", "failed"):
        return record  # an attempt ended it; the queue did not hear before its worker died
    runs: list[str] = list(record["runs"])
    if runs:  # a retry: its worker was declared dead; fence the old attempts off before reading
        await take_over(store, session_id, runs, ctx.runtime.lease_ttl)
    finished: AgentFinish | None = None
    committed = False
    for earlier in runs:  # not `run_id`: that is the client's name for the first attempt
        for event in await store.load_events(session_id, earlier):
            if isinstance(event, AgentFinish):
                finished = event
            elif event.type == EventType.USER_MESSAGE:
                committed = True
    if finished is not None:
        record.update(
            status="finished",
            run_id=finished.run_id,
            stop_reason=finished.stop_reason,
            error=finished.error,
            output=finished.output,
        )
        await _save(ctx, job_id, record)
        return record
    if len(runs) >= ctx.max_attempts:
        record.update(
            status="failed",
            error=(
                f"job {job_id} was attempted {len(runs)} times and its worker died each time "
                f"(max_attempts={ctx.max_attempts}); not retrying. The session's next turn closes "
                "the dead runs."
            ),
        )
        await _save(ctx, job_id, record)
        raise JobFailed(record["error"])
    try:
        a = ctx.agent(agent)
    except JobFailed as exc:
        record.update(status="failed", error=str(exc))
        await _save(ctx, job_id, record)
        raise
    if run_id is None:
        run_id = f"run_j{job_id}a{len(runs) + 1}"
    elif runs:  # a retry: its own run, named after the client's
        run_id = f"{run_id}-a{len(runs) + 1}"
    record["runs"] = [*runs, run_id]
    await _save(ctx, job_id, record)  # before the run starts: a retry must know of it
    # a retry whose message is committed carries the dead attempt on, with no new message
    turn = await ctx.runtime.start(
        a,
        CarryOn() if committed else new_message(message, parts),
        session_id=session_id,
        # a retry may wait for a dead worker's lease to expire: let this run wait that long
        # the server streams this run from the journal: it keeps the progress notices too
        options=RunOptions(
            run_id=run_id,
            queue_timeout=max(a.queue_timeout, 2 * ctx.runtime.lease_ttl),
            progress=True,
            owner=owner,
        ),
    )
    inner = asyncio.ensure_future(turn.run(discard))
    try:
        await asyncio.shield(inner)
    except asyncio.CancelledError:  # procrastinate abort (or shutdown): stop the turn cleanly
        reason = context.abort_reason()
        why = (
            f"aborted through the queue (job {job_id})"
            if reason is None or reason.value == "user_request"
            else f"the worker shut down (job {job_id})"
        )
        turn.cancel(why)
        superseded = False
        try:
            await inner
        except LeaseLost:
            superseded = True  # by a retry elsewhere: the job's record is the retry's now
            raise
        finally:
            result = turn.result
            record.update(
                status="finished",
                run_id=run_id,
                stop_reason=result.stop_reason if result else "cancelled",
                error=result.error if result else why,
            )
            if not superseded:
                await asyncio.shield(_save(ctx, job_id, record))
        raise
    except LeaseLost:
        raise  # superseded by a retry elsewhere: the job's record is the retry's now
    except BaseException as exc:
        record.update(status="failed", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        await _save(ctx, job_id, record)
        raise
    result = turn.result
    assert result is not None
    record.update(
        status="finished",
        run_id=run_id,
        stop_reason=result.stop_reason,
        error=result.error,
        output=result.text,
    )
    await _save(ctx, job_id, record)
    return record


def new_message(message: str, parts: list[dict[str, Any]] | None) -> str | NewMessage:
    """The queued message, with its media (references the run's model request loads)."""
    if not parts:
        return message
    return NewMessage(message, tuple(parts_of(parts)))
