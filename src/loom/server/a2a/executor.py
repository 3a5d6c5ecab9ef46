"""The A2A SDK's ``AgentExecutor`` for a Loom agent: one A2A task runs as Loom runs.

The task's ``contextId`` is the Loom session; each message on the task is one Loom turn (its
run id is in the task's metadata as ``loomRunId``: Loom's metadata keys are camelCase, like
every field of A2A's JSON). States follow the run: ``working`` while it runs (a status update
per tool call), ``completed`` with the answer as an artifact, ``input-required`` when a call
waits for approval (or the model asked the client something), ``canceled`` and ``failed``. A
follow-up message on an ``input-required`` task resumes it, whatever it says: the answer to a
query, or a decision (``approve`` / ``reject[: reason]`` as text, or a data part
``{"decision": ...}`` / ``{call_id: decision}``; any other text rejects the calls with that
text as the reason the model reads), so a generic A2A client can always continue the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from a2a.helpers.proto_helpers import new_data_part, new_task, new_text_part
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import Message, Part, Task, TaskState
from google.protobuf.json_format import MessageToDict

from loom.engine.driving import drive
from loom.engine.run_inputs import Answer, NewMessage, Resume
from loom.errors import InputError
from loom.events import AgentEvent, ToolErrorEvent, ToolExecutionStart, ToolResultEvent
from loom.server.a2a.parts import content_of, media_parts
from loom.server.content_blocks import keep_parts
from loom.server.surface_media import answer_media

if TYPE_CHECKING:
    from loom.content import Part as LoomPart
    from loom.engine.loop import Turn
    from loom.engine.runtime import Runtime
    from loom.messages import RunResult
    from loom.server.app import ServerState

__all__ = ["CANCEL_WAIT", "LoomExecutor", "decision_of", "text_of"]

CANCEL_WAIT = 30.0
"""Seconds ``CancelTask`` waits for the task's run to record its end."""


def text_of(message: Message) -> str:
    """The text of a message's text parts, joined by new lines."""
    return "\n".join(p.text for p in message.parts if p.HasField("text"))


_REJECT_WORDS = ("reject", "rejected", "no", "n", "deny")


def decision_of(message: Message) -> Any:
    """The approval decision a follow-up message carries. A data part is taken as it is
    (``{"decision": ...}`` or ``{call_id: ...}``); text is ``approve`` / ``reject`` with an
    optional ``: reason``, and any other text rejects, with the text as the reason (what a
    person typing into a generic A2A client means by "not now, because ..."). An empty
    message is an ``InputError`` saying how to write one."""
    from loom.policy.approval import coerce_decision

    for part in message.parts:
        if part.HasField("data"):
            value = MessageToDict(part.data)
            return value
    text = text_of(message).strip()
    if not text:
        raise InputError(
            "this task waits for approval; reply 'approve' or 'reject' (optionally "
            "'reject: reason', or any text as the reason to reject), or a data part "
            "{'decision': 'approve'}"
        )
    word, _, reason = text.replace(":", " ", 1).partition(" ")
    word = word.strip(".,;!").lower()
    try:
        decided = coerce_decision(word)
    except InputError:  # not a decision word: the whole text is why the calls are rejected
        return {"decision": "reject", "reason": text}
    if reason.strip() and word in _REJECT_WORDS:
        return {"decision": "reject", "reason": reason.strip()}
    return decided


def _as_json(decisions: Any) -> Any:
    """Decisions as a run record stores them (JSON): an ``Approve`` / ``Reject`` / ``Edit`` as
    the mapping ``coerce_decision`` reads back; anything else is JSON already (a data part, a
    ``{"decision": ..., "reason": ...}`` mapping)."""
    from loom.policy.approval import Approve, Edit, Reject

    if isinstance(decisions, Approve | Reject | Edit):
        kind = {Approve: "approve", Reject: "reject", Edit: "edit"}[type(decisions)]
        return {"decision": kind, **dataclasses.asdict(decisions)}
    return decisions


def _agent_message(updater: TaskUpdater, text: str, data: dict[str, Any] | None = None) -> Message:
    parts: list[Part] = [new_text_part(text)]
    if data is not None:
        parts.append(new_data_part(data))
    return updater.new_agent_message(parts)


class LoomExecutor(AgentExecutor):
    """Runs one served agent's A2A tasks on the server's runtime."""

    def __init__(self, state: ServerState, agent_name: str) -> None:
        self.state, self.agent_name = state, agent_name
        # shared by every executor of this agent on this server: a task carried on at
        # start-up (loom.server.a2a.recovery) is cancelled like one started here
        running = state.extra.setdefault("a2a_running", {})
        self._running: dict[str, tuple[asyncio.Event, asyncio.Event]] = running.setdefault(
            agent_name, {}
        )

    @property
    def runtime(self) -> Runtime:
        return self.state.runtime

    async def _turn(
        self, task: Task | None, session_id: str, message: Message
    ) -> tuple[Turn, dict[str, Any], list[LoomPart]]:
        """The turn ``message`` asks for, what it is for as a run record holds it
        (``message``, or a ``command``: ``resume`` / ``answer``), and the message's media."""
        agent = self.state.registry[self.agent_name]
        runtime = self.runtime
        if task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            if await runtime.pending_approvals(session_id):
                decisions = decision_of(message)
                turn = await runtime.start(agent, Resume(decisions), session_id=session_id)
                return turn, {"message": None, "command": {"resume": _as_json(decisions)}}, []
            if await runtime.pending_query(session_id) is not None:
                answer = Answer(text_of(message))
                turn = await runtime.start(agent, answer, session_id=session_id)
                return turn, {"message": None, "command": {"answer": answer.text}}, []
        text, parts = content_of(message)
        turn = await runtime.start(agent, NewMessage(text, tuple(parts)), session_id=session_id)
        return turn, {"message": text, "command": None}, parts

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Run the message as a Loom turn and publish the task's updates. A task sent with
        ``returnImmediately`` (v0.3: ``blocking: false``) is acknowledged before its run ends:
        its run record is stored and listed open first (``loom.server.runs.store_open_run``),
        so a server that dies before the run ends carries it on at its next start
        (``loom.server.a2a.recovery``)."""
        from loom.server.runs import A2A_SURFACE, RECOVERY_NOTE, close_open_run, store_open_run

        task_id, session_id, message = context.task_id, context.context_id, context.message
        assert task_id and session_id and message is not None  # the SDK fills them in
        turn, what, parts = await self._turn(context.current_task, session_id, message)
        durable = False
        if context.configuration is not None and context.configuration.return_immediately:
            record = {
                "surface": A2A_SURFACE,
                "thread_id": session_id,
                "assistant_id": self.agent_name,
                "task_id": task_id,
                "created_at": datetime.now(UTC).isoformat(),
                "attempts": [turn.run_id],
                **what,
                # its media stored now and named by reference, as for every background run:
                # a run carried on after a crash gets this message's files (a follow-up's on
                # an open task too), whatever the task's history holds
                "parts": await keep_parts(self.runtime.store, session_id, parts) or None,
            }
            # before the first task event: the client's acknowledgement waits for that event
            durable = await store_open_run(self.state, turn.run_id, record)
        if context.current_task is None:
            task = new_task(task_id, session_id, TaskState.TASK_STATE_SUBMITTED, history=[message])
            if durable:  # the acknowledgement says what a crash does to it
                task.metadata.update({"loomRunId": turn.run_id, "loomDurability": RECOVERY_NOTE})
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task_id, session_id)
        try:
            await self.follow(turn, task_id, session_id, updater, durable=durable)
        finally:
            if durable:
                await close_open_run(self.state, turn.run_id, turn.result)

    def track(self, task_id: str) -> tuple[asyncio.Event, asyncio.Event]:
        """The (cancel, done) pair of task ``task_id``'s run, registered now (before its run
        starts: a ``CancelTask`` from then on reaches it)."""
        return self._running.setdefault(task_id, (asyncio.Event(), asyncio.Event()))

    async def follow(
        self,
        turn: Turn,
        task_id: str,
        session_id: str,
        updater: TaskUpdater,
        *,
        durable: bool = False,
    ) -> None:
        """Run ``turn`` (task ``task_id``'s run) to its end, publishing the task's updates
        through ``updater``; ``CancelTask`` stops it meanwhile. A ``durable`` run (listed
        open: the next start carries it on) that a graceful shutdown cancels leaves its task
        ``working``, saying so, not ``canceled``."""
        from loom.server.lifecycle import SHUTDOWN_REASON

        cancel, done = self.track(task_id)
        meta = {
            "loomSessionId": session_id,
            "loomRunId": turn.run_id,
            "loomAgent": self.agent_name,
        }
        try:
            await updater.update_status(TaskState.TASK_STATE_WORKING, metadata=meta)
            async for event in drive(turn, cancel):
                await self._relay(event, updater)
            result = turn.result
            assert result is not None
            stopped = result.stop_reason == "cancelled" and result.error == SHUTDOWN_REASON
            if durable and stopped and self.state.draining:
                note = "the server is stopping; it carries this task on when it starts again"
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING, _agent_message(updater, note), metadata=meta
                )
            else:
                await self.finish(result, updater, meta)
        finally:
            self._running.pop(task_id, None)
            done.set()

    async def _relay(self, event: AgentEvent, updater: TaskUpdater) -> None:
        """Tool calls as ``working`` status updates (what a streaming client sees move)."""
        data: dict[str, Any]
        if isinstance(event, ToolExecutionStart):
            data = {
                "loomEvent": "tool_start",
                "tool": event.tool_name,
                "toolCallId": event.tool_call_id,
            }
            text = f"calling {event.tool_name}"
        elif isinstance(event, ToolResultEvent | ToolErrorEvent):
            data = {
                "loomEvent": "tool_end",
                "tool": event.tool_name,
                "toolCallId": event.tool_call_id,
                "success": event.success,
            }
            text = f"{event.tool_name} {'finished' if event.success else 'failed'}"
        else:
            return
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, message=_agent_message(updater, text, data)
        )

    async def finish(self, result: RunResult, updater: TaskUpdater, meta: dict[str, Any]) -> None:
        """Publish the task's state after its run ended with ``result`` (``completed`` with the
        answer as an artifact, ``input-required``, ``canceled`` or ``failed``)."""
        meta = {**meta, "loomStopReason": result.stop_reason}
        stop = result.stop_reason
        if stop == "completed":
            # the answer's images and files as raw parts beside its text (its reasoning stays)
            media = media_parts(await answer_media(result.messages, self.runtime.store))
            await updater.add_artifact(
                [new_text_part(result.text), *media],
                name="answer",
                metadata={"loomRunId": result.run_id},
            )
            done = updater.new_agent_message([new_text_part(result.text), *media])
            await updater.update_status(TaskState.TASK_STATE_COMPLETED, done, metadata=meta)
        elif stop == "awaiting_approval":
            pending = list(result.pending_approvals)
            calls = ", ".join(
                f"{p.get('tool_name')}({json.dumps(p.get('arguments', {}))})" for p in pending
            )
            text = (
                f"waiting for approval of {calls}; reply on this task: 'approve', or "
                "'reject' (optionally 'reject: reason'); any other reply rejects the "
                "call(s) with your text as the reason"
            )
            await updater.update_status(
                TaskState.TASK_STATE_INPUT_REQUIRED,
                _agent_message(updater, text, {"pendingApprovals": pending}),
                metadata=meta,
            )
        elif stop == "awaiting_input":
            query = result.pending_query or {}
            await updater.update_status(
                TaskState.TASK_STATE_INPUT_REQUIRED,
                _agent_message(
                    updater,
                    (result.text or "the agent asks for input")
                    + "\n(reply on this task: your reply is the answer)",
                    {"pendingQuery": query},
                ),
                metadata=meta,
            )
        elif stop == "cancelled":
            await updater.update_status(
                TaskState.TASK_STATE_CANCELED,
                _agent_message(updater, "the run was cancelled"),
                metadata=meta,
            )
        else:
            why = result.error or stop
            await updater.update_status(
                TaskState.TASK_STATE_FAILED,
                _agent_message(updater, f"the run ended with {stop}: {why}"),
                metadata=meta,
            )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Cancel the task's running turn (it records its end as ``cancelled``) and wait for
        it; a task parked on an approval or a query is marked canceled at once."""
        task_id = context.task_id or ""
        running = self._running.get(task_id)
        if running is None:
            updater = TaskUpdater(event_queue, task_id, context.context_id or "")
            await updater.update_status(
                TaskState.TASK_STATE_CANCELED, _agent_message(updater, "the task was cancelled")
            )
            return
        cancel, done = running
        cancel.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), CANCEL_WAIT)
