"""Carrying on, at start-up, the run of an A2A task acknowledged before it ended.

A task sent with ``returnImmediately`` (v0.3: ``blocking: false``) is answered ``submitted``
while its run goes on; ``LoomExecutor.execute`` stores the run's record and lists it open first
(``loom.server.runs.store_open_run``). If the process dies before the run ends, the next start
(``loom.server.runs.recover_runs``) hands the record here: the run goes on from the journal as a
``CarryOn`` turn when its message was committed (the message is never sent twice), or runs with
its message when nothing was (its media named by reference in the record, their bytes stored
before the acknowledgement); the task's status updates and its answer are written to the task
store as they would have been, so ``GetTask`` reads the task ``completed`` (or wherever the run
ends). ``CancelTask`` stops a carried-on task like any other.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event, EventQueue
from a2a.server.tasks.task_manager import TaskManager
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import TaskState

from loom.agent import Agent
from loom.engine.loop import Turn
from loom.engine.run_inputs import Answer, CarryOn, NewMessage, Resume, RunOptions
from loom.events import AgentFinish, EventType
from loom.messages import RunResult, StopReason, Usage
from loom.server.a2a.executor import LoomExecutor
from loom.server.a2a.store import LoomTaskStore
from loom.server.app import ServerState
from loom.server.content_blocks import parts_from_json
from loom.server.runs import attempt_events, close_open_run, ended_for_good, note_attempt

__all__ = ["carry_on_task"]

log = logging.getLogger("loom.server.a2a")

_UNSETTLED = (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
_CARRIED = "a2a_carried_on"  # state.extra: the tasks of runs carried on (kept alive)


class _TaskStoreQueue(EventQueue):
    """An event queue with no reader: each task event is applied to the stored task at once
    (what the SDK's consumer does for a task a request is running)."""

    def __init__(self, manager: TaskManager) -> None:
        self.manager = manager

    async def enqueue_event(self, event: Event) -> None:
        await self.manager.process(event)


async def _settle(
    store: LoomTaskStore,
    executor: LoomExecutor,
    updater: TaskUpdater,
    events: list[Any],
    record: dict[str, Any],
) -> None:
    """Give a task whose run ended (its journal says so) the state that run ended in, when the
    process died before the task was updated."""
    task = await store.get(str(record["task_id"]), ServerCallContext())
    if task is None or task.status.state not in _UNSETTLED:
        return
    finish = next(e for e in reversed(events) if isinstance(e, AgentFinish))
    result = RunResult(
        output=finish.output,
        text=finish.output,
        messages=[],
        usage=Usage(),
        session_id=str(record["thread_id"]),
        run_id=finish.run_id,
        stop_reason=cast("StopReason", finish.stop_reason),
        error=finish.error,
        pending_approvals=list(finish.pending_approvals),
        pending_query=finish.pending_query,
    )
    meta = {
        "loomSessionId": result.session_id,
        "loomRunId": result.run_id,
        "loomAgent": executor.agent_name,
    }
    await executor.finish(result, updater, meta)


async def _with_media(store: LoomTaskStore, task_id: str, new: NewMessage) -> NewMessage:
    """The message of task ``task_id`` with its media, read back from the task's stored
    history (the user's message, as the task was created with it): for a run record written
    before records named their media by reference."""
    from a2a.types.a2a_pb2 import Role

    from loom.server.a2a.parts import content_of

    task = await store.get(task_id, ServerCallContext())
    first = next((m for m in task.history if m.role == Role.ROLE_USER), None) if task else None
    if first is None:
        return new
    text, parts = content_of(first)
    return NewMessage(text, tuple(parts))


async def carry_on_task(state: ServerState, run_id: str, record: dict[str, Any]) -> bool:
    """Start what is left of the acknowledged run ``run_id`` of an A2A task (``record``: its
    stored run record) and follow it into the task; False when nothing is left (it ended, or
    its agent is no longer served), so the run is unlisted."""
    kv = state.runtime.capabilities.kv
    session_id, agent_name = str(record["thread_id"]), str(record["assistant_id"])
    task_id = str(record["task_id"])
    attempts = [str(a) for a in record.get("attempts") or [run_id]]
    events = await attempt_events(state, session_id, attempts)
    store = LoomTaskStore(kv, agent_name)
    manager = TaskManager(store, ServerCallContext(), task_id, session_id, None)
    updater = TaskUpdater(_TaskStoreQueue(manager), task_id, session_id)
    executor = LoomExecutor(state, agent_name)
    if ended_for_good(events):  # only its unlisting, or its task's last update, was lost
        await _settle(store, executor, updater, events, record)
        return False
    agent = state.registry.served(agent_name)
    if not isinstance(agent, Agent):
        log.warning("A2A task %s cannot be carried on: agent %r is not served", task_id, agent_name)
        return False
    committed = any(e.type == EventType.USER_MESSAGE for e in events)
    command = record.get("command") or {}
    message = record.get("message")
    # the dead attempt stays as it is; one that committed nothing runs again under its id
    options = RunOptions(run_id=f"{run_id}-a{len(attempts) + 1}" if events else attempts[-1])
    runtime = state.runtime
    turn: Turn
    if committed or (command and events):
        turn = await runtime.start(agent, CarryOn(), session_id=session_id, options=options)
    elif "resume" in command:
        turn = await runtime.start(agent, Resume(command["resume"]), session_id=session_id)
    elif "answer" in command:
        turn = await runtime.start(agent, Answer(command["answer"]), session_id=session_id)
    elif isinstance(message, str):
        new = NewMessage(message, parts_from_json(record.get("parts")))  # stored: references
        if record.get("media") and not new.parts:  # a record an older server wrote: its
            new = await _with_media(store, task_id, new)  # files are in the task's history
        turn = await runtime.start(agent, new, session_id=session_id, options=options)
    else:
        return False
    if turn.run_id not in attempts:
        attempts.append(turn.run_id)
    await note_attempt(state, run_id, attempts)  # a crash from now on is carried on again

    async def follow() -> None:
        try:
            await executor.follow(turn, task_id, session_id, updater, durable=True)
        except Exception:  # logged; the journal keeps what the run did, and the run stays
            # listed only if a graceful shutdown cut it (close_open_run decides)
            log.exception("carrying on A2A task %s failed", task_id)
        finally:
            await close_open_run(state, run_id, turn.result)

    executor.track(task_id)  # CancelTask reaches it from now on
    carried: set[asyncio.Task[None]] = state.extra.setdefault(_CARRIED, set())
    job = asyncio.ensure_future(follow())
    carried.add(job)
    job.add_done_callback(carried.discard)
    return True
