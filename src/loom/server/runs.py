"""Runs, protocol-neutral: start one, store it before anyone hears of it, stream it, rejoin it
by event id, cancel it, and carry on at start-up what a dead process left unfinished.

Every surface that runs an agent as "a run with an id" (the LangGraph-compatible API, the open
Agent Protocol's paths, the console's approvals) starts it with :func:`start_run` and reads it
with :func:`find_run` / :func:`held_run`; the frames and their ids come from
``loom.server.lg_runs``, a queued run's tail from ``loom.server.queued``.

**One run record.** A run exists in the store before it is acknowledged: :func:`start_run`
writes its record (key-value namespace :data:`RUNS_NAMESPACE`, key = the run id: thread,
assistant, stream modes, options, its input, the run ids of its attempts) before it returns,
so any server of a fleet answers ``GET /runs/{id}`` and replays it with its stream modes.
Its status has one writer, the journal: ``running`` is its ``AGENT_START``, its end is its
``AGENT_FINISH`` (a queued run: the worker's job record); a run this process holds only caches
what its events said. The record gets a status only for a run that ended with nothing in the
journal to say so (its turn was refused or failed before it started): ``ended``, written once.

**Acknowledged means durable.** A background run (``POST /threads/{id}/runs``, ``POST /runs``,
an agent's or a crew's) on a server without ``--queue`` is also listed under
:data:`OPEN_RUNS_NAMESPACE` until its turn ended; so is the run of an A2A task sent without
blocking (:func:`store_open_run`, record ``surface: "a2a"``, carried on by
``loom.server.a2a.recovery`` so that its task follows it). At start-up :func:`recover_runs`
carries on every listed run: one whose message was committed goes on from the journal as a
``carry_on`` turn (the message is never sent twice; the dead attempt's open calls are recovered
under their effect classes; a crew's ``CarryOn`` reuses its finished members and carries the
interrupted ones on), one that committed nothing runs with its message, and one that ended is
unlisted. A run cancelled by a graceful shutdown (``server shutting down``) is carried on the
same way. Each attempt after the first is a turn of its own (``<run id>-a<n>``), listed in the
record before it starts; the run's frames cover every attempt (``attempt_offset``). Several
servers without ``--queue`` on one store would each carry the same runs on: a fleet uses
``--queue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from pydantic_core import to_json
from starlette.exceptions import HTTPException
from starlette.responses import Response

from loom.agent import Agent
from loom.crew import Crew
from loom.engine.gates import OnBusy
from loom.engine.run_inputs import Answer, CarryOn, NewMessage, Resume, RunOptions
from loom.errors import ConfigurationError, InputError, SessionBusy, UnsupportedContent
from loom.events import AgentFinish, EventType
from loom.server.app import ServerState
from loom.server.content_blocks import keep_parts, langchain_parts, parts_from_json, run_input
from loom.server.lg_runs import (
    ALL_MODES,
    LgRun,
    RunManager,
    interrupts_of,
    lc_message,
    query_interrupts,
)
from loom.server.queued import RUNS_NAMESPACE, JournalTail, RunQueue
from loom.server.registry import assistant_uuid
from loom.store.base import KVStore, SessionInfo

if TYPE_CHECKING:
    from loom.crew.turn import CrewTurn
    from loom.engine.loop import Turn
    from loom.messages import RunResult

__all__ = [
    "A2A_SURFACE",
    "BUSY",
    "OPEN_RUNS_NAMESPACE",
    "PROGRESS_MODES",
    "RECOVERY_NOTE",
    "RUNS_NAMESPACE",
    "ApiBody",
    "Carrier",
    "MultitaskStrategy",
    "RunFields",
    "ValuesResponse",
    "agent_named",
    "assistant_uuid",
    "attempt_events",
    "cancel",
    "close_open_run",
    "ended_for_good",
    "final_values",
    "find_run",
    "forget_run",
    "forget_transcript",
    "held_run",
    "last_human",
    "last_human_input",
    "metadata_patch",
    "not_found",
    "note_attempt",
    "open_run_record",
    "pending_calls",
    "queued_run",
    "recover_runs",
    "register_carrier",
    "rehydrate",
    "resume_position",
    "run_locations",
    "run_manager",
    "run_queue",
    "save_metadata_patch",
    "served",
    "shows_progress",
    "sse_response",
    "start_run",
    "store_open_run",
    "stream_modes",
    "thread_info",
    "thread_metadata",
    "thread_values",
    "transcript_values",
    "travel",
]

log = logging.getLogger("loom.server.runs")

OPEN_RUNS_NAMESPACE = "loom.server.open_runs"
"""Key-value namespace of the background runs a server without ``--queue`` acknowledged and
whose turn has not ended (key = run id): what :func:`recover_runs` carries on at start-up."""

RECOVERY_NOTE = (
    "stored before this answer; if the server stops before the run ends, it carries the run "
    "on when it starts again (the message is not sent twice)"
)
"""What the ``Loom-Run-Durability`` header of a background run's acknowledgement says."""

_KV_META = "loom.server.thread_metadata"
_SHUTDOWN = "server shutting down"  # loom.server.lifecycle.SHUTDOWN_REASON (no import circle)

BUSY: dict[str, OnBusy] = {
    "enqueue": "queue",
    "reject": "drop",
    "interrupt": "interrupt",
    "rollback": "interrupt",
}
"""LangGraph's ``multitask_strategy`` as Loom's ``on_busy`` (``rollback`` also rewinds the
thread to before the interrupted run: :func:`travel`)."""

MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]


# -- request bodies ---------------------------------------------------------------------------
class ApiBody(BaseModel):
    """A request body that ignores fields it does not know (clients send more than Loom reads)."""

    model_config = ConfigDict(extra="allow")


class RunFields(ApiBody):
    """What every run request carries (LangGraph's run-create fields Loom reads)."""

    input: dict[str, Any] | str | None = None
    command: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream_mode: str | list[str] = "values"
    multitask_strategy: MultitaskStrategy = "enqueue"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    if_not_exists: Literal["create", "reject"] = "reject"
    checkpoint_id: str | None = None
    checkpoint: dict[str, Any] | None = None

    def wanted_checkpoint(self) -> str | dict[str, Any] | None:
        """The checkpoint the run starts from (``checkpoint_id``, or LangGraph's
        ``checkpoint`` object); None: the thread's latest state."""
        if self.checkpoint_id:
            return self.checkpoint_id
        if self.checkpoint and self.checkpoint.get("checkpoint_id"):
            return self.checkpoint
        return None


# -- lookups ----------------------------------------------------------------------------------
def run_manager(state: ServerState) -> RunManager:
    """The server's runs (made on first use)."""
    manager = state.extra.get("langgraph_runs")
    if manager is None:
        manager = state.extra["langgraph_runs"] = RunManager(state.runtime.store)
        manager.on_end = lambda run: _close_record(state, run)
        manager.transcript = lambda thread_id: transcript_values(state, thread_id)
    assert isinstance(manager, RunManager)
    return manager


def not_found(what: str) -> HTTPException:
    """A 404 that says what was not found and what to do."""
    return HTTPException(404, what)


def served(state: ServerState, assistant_id: str) -> Agent | Crew:
    """The agent or crew served as ``assistant_id`` (its name or its UUID form)."""
    registry = state.registry
    found = registry.find(assistant_id)
    if found is not None:
        return found
    raise not_found(
        f"no assistant {assistant_id!r}; this server's assistants: {', '.join(registry.names())}"
    )


def agent_named(state: ServerState, assistant_id: str) -> Agent:
    """The agent served as ``assistant_id``; ``InputError`` for a crew."""
    found = served(state, assistant_id)
    if not isinstance(found, Agent):
        raise InputError(f"{assistant_id!r} is a crew; this operation takes an agent")
    return found


def last_human(payload: dict[str, Any] | str | None) -> str | None:
    """The text of the newest human message of a LangGraph input (``{"messages": [...]}``),
    for what keeps text only (a cron's message): ``UnsupportedContent`` when the message has
    images, files or audio (refused, never dropped)."""
    given = last_human_input(payload)
    if isinstance(given, NewMessage):
        raise UnsupportedContent(
            "a scheduled run's message is text: it cannot keep images, files or audio; send "
            "them in a run on the thread instead",
            part=f"input.messages content ({len(given.parts)} media)",
        )
    return given


def last_human_input(payload: dict[str, Any] | str | None) -> str | NewMessage | None:
    """The newest human message of a LangGraph input: its text, or ``NewMessage(text,
    parts)`` when its content blocks hold images, files or audio (``ContentError`` names a
    block that cannot be used)."""
    if payload is None:
        return None
    if isinstance(payload, str):
        return payload
    messages = payload.get("messages")
    if isinstance(messages, dict | str):
        messages = [messages]
    if not isinstance(messages, list):
        raise InputError('input must be {"messages": [{"role": "user", "content": "..."}]}')
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, str):
            return m
        if isinstance(m, dict) and (m.get("role") or m.get("type")) in ("human", "user"):
            where = f"input.messages[{i}].content"
            text, parts = langchain_parts(m.get("content", ""), where)
            return run_input(text, parts)
    raise InputError("input.messages holds no human message to run the agent on")


async def _given(
    state: ServerState, thread_id: str, given: str | NewMessage
) -> tuple[str, list[dict[str, Any]] | None]:
    """A run's message as a record or a job keeps it (for a run that may start after this
    request: queued, or carried on after a restart): its text, and its parts stored now and
    named by reference (``keep_parts``)."""
    if isinstance(given, str):
        return given, None
    return given.text, await keep_parts(state.runtime.store, thread_id, given.parts)


PROGRESS_MODES = frozenset({"events", "messages", "messages-tuple"})
"""The stream modes that show a run's progress notices (every event; the answer's deltas)."""


def shows_progress(modes: Sequence[str]) -> bool:
    """Whether a run streamed in ``modes`` shows progress notices. A run whose modes show none
    (``values``, ``updates``: a blocking ``/runs/wait``) does not build them (``RunOptions.
    progress``): a state change, an iteration or context notice costs a step more than its
    work and would be journaled for nobody; a client joining such a run later sees what it was
    created to stream, as on LangGraph."""
    return not PROGRESS_MODES.isdisjoint(modes)


def stream_modes(stream_mode: str | list[str] | None, default: list[str]) -> list[str]:
    """The stream modes asked for; ``default`` when none (``langgraph-sdk`` sends an empty
    ``stream_mode=`` when its caller names none)."""
    if isinstance(stream_mode, str):
        stream_mode = [stream_mode]
    modes = [m for m in stream_mode or [] if m.strip()]
    if not modes:
        return default
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise InputError(f"unknown stream_mode {unknown[0]!r}; use any of {', '.join(ALL_MODES)}")
    return modes


def resume_position(run: LgRun, last_event_id: str | None) -> int:
    """Where a client that last received ``last_event_id`` reads on in ``run``'s frames; a
    typed 422 (``InputError``) for an id that is malformed or that this run never sent."""
    try:
        return run.start_at(last_event_id)
    except ValueError as exc:
        raise InputError(f"{exc}; reconnect without Last-Event-ID to read the whole run") from None


# -- threads ----------------------------------------------------------------------------------
async def metadata_patch(state: ServerState, thread_id: str) -> dict[str, Any]:
    """The metadata the run API added to a thread (on top of the session's own)."""
    kv = state.runtime.capabilities.kv
    if kv is not None:
        value = await kv.get_value(_KV_META, thread_id)
        return dict(value) if isinstance(value, dict) else {}
    patches: dict[str, dict[str, Any]] = state.extra.setdefault("langgraph_meta", {})
    return dict(patches.get(thread_id, {}))


async def save_metadata_patch(
    state: ServerState, thread_id: str, patch: dict[str, Any] | None
) -> None:
    """Replace the thread's added metadata (None: drop it)."""
    kv = state.runtime.capabilities.kv
    if kv is not None:
        if patch is None:
            await kv.delete_value(_KV_META, thread_id)
        else:
            await kv.put_value(_KV_META, thread_id, patch)
        return
    patches: dict[str, dict[str, Any]] = state.extra.setdefault("langgraph_meta", {})
    if patch is None:
        patches.pop(thread_id, None)
    else:
        patches[thread_id] = patch


async def thread_info(state: ServerState, thread_id: str) -> SessionInfo:
    """The thread's session; 404 when there is none."""
    info = await state.runtime.store.get_session(thread_id)
    if info is None:
        raise not_found(f"no thread {thread_id!r}; create it with POST /threads")
    return info


async def thread_metadata(state: ServerState, info: SessionInfo) -> dict[str, Any]:
    """The session's metadata with what the run API added."""
    patch = await metadata_patch(state, info.id)
    if "assistant_id" not in patch and info.agent_name:  # see _note_assistant: not stored
        patch = {"assistant_id": info.agent_name, "graph_id": info.agent_name, **patch}
    return {**info.metadata, **patch}


def thread_values(thread_id: str, messages: list[Any]) -> dict[str, Any]:
    """A thread's ``values``: its transcript in LangChain's message form."""
    return {"messages": [lc_message(m, f"{thread_id}:{i}") for i, m in enumerate(messages)]}


@dataclass(slots=True)
class _Transcript:
    created_at: datetime  # the session's: a thread deleted and made again is another one
    messages: list[dict[str, Any]]  # its messages in LangChain form, oldest first
    branches: int = 0  # the session's rewinds when read (SessionInfo.branches)


_TRANSCRIPTS_KEPT = 64
"""Threads whose transcript (LangChain form) the server keeps between runs: the values a
blocking run answers then cost the messages added since, not the whole thread."""


async def transcript_values(state: ServerState, thread_id: str) -> list[dict[str, Any]]:
    """The thread's messages in LangChain form (``thread_values``' list), reading from the
    store only what was added since the last read here (a thread's messages are only ever
    appended; one whose count shrank or whose session was made again is read anew). The
    newest ``_TRANSCRIPTS_KEPT`` threads' lists are kept; the answer is a copy of the list
    (its message dicts are shared: nobody changes them)."""
    store = state.runtime.store
    kept: OrderedDict[str, _Transcript] = state.extra.setdefault("transcripts", OrderedDict())
    info = await store.get_session(thread_id)
    if info is None:
        kept.pop(thread_id, None)
        messages = await store.load_messages(thread_id)
        return [lc_message(m, f"{thread_id}:{i}") for i, m in enumerate(messages)]
    entry = kept.get(thread_id)
    if (
        entry is None
        or entry.created_at != info.created_at
        or len(entry.messages) > (info.message_count)
        or entry.branches != info.branches  # a branch rewrote messages it holds
    ):
        entry = kept[thread_id] = _Transcript(info.created_at, [], info.branches)
    have = len(entry.messages)
    if have < info.message_count:
        added = await store.load_messages(thread_id, start=have)
        entry.messages.extend(lc_message(m, f"{thread_id}:{have + i}") for i, m in enumerate(added))
    kept.move_to_end(thread_id)
    while len(kept) > _TRANSCRIPTS_KEPT:
        kept.popitem(last=False)
    return list(entry.messages)


async def pending_calls(state: ServerState, thread_id: str) -> list[dict[str, Any]]:
    """The calls the thread waits on a human for (a crew thread: its members' calls)."""
    pending = [p.to_dict() for p in await state.runtime.pending_approvals(thread_id)]
    if not pending and state.registry.crews:
        from loom.crew.turn import crew_pending

        pending = await crew_pending(state.runtime.store, thread_id)
    return pending


async def _note_assistant(
    state: ServerState,
    thread_id: str,
    name: str,
    session_agent: str | None = None,
    graph: str | None = None,
) -> None:
    """Note in the thread's metadata that ``name`` ran on it last. Nothing is stored when the
    session's own agent name says it (``session_agent``: the name it has, or will have once
    the turn starts, for an agent's run on a thread that names none or names ``name``):
    ``thread_metadata`` reads it from there, one key-value row per thread less."""
    patch = await metadata_patch(state, thread_id)
    current = patch.get("assistant_id")
    if current == name or (current is None and session_agent == name):
        return
    graph_id = graph or name  # an assistant made with POST /assistants: its agent's name
    await save_metadata_patch(
        state, thread_id, {**patch, "assistant_id": name, "graph_id": graph_id}
    )


# -- the run record ---------------------------------------------------------------------------
def _record(
    run: LgRun,
    body: RunFields | None,
    message: str | None,
    parts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run's record, without what a reader assumes when a field is absent (the defaults
    of ``_from_record``) and, for a run nobody carries on (not a background one), without its
    message, which its journal holds: a 1-step run's record is about 130 bytes, not 330."""
    record: dict[str, Any] = {
        "thread_id": run.thread_id,
        "assistant_id": run.assistant_id,
        "created_at": run.created_at.isoformat(),
    }
    optional: dict[str, Any] = {
        "multitask_strategy": run.multitask_strategy,
        "metadata": run.metadata,
        "stream_mode": run.stream_modes,
        "on_disconnect": run.on_disconnect,
        "background": run.background,
        "message": message if run.background else None,
        "parts": parts if run.background else None,  # references: the bytes are stored
        "command": body.command if body is not None and run.background else None,
        "attempts": run.attempt_ids(),
        "job": run.job_id,
        "revision": run.revision,
        "assistant_version": run.assistant_version,
    }
    absent = _RECORD_DEFAULTS | {"attempts": [run.run_id]}
    record.update((k, v) for k, v in optional.items() if v != absent[k])
    return record


_RECORD_DEFAULTS: dict[str, Any] = {
    "multitask_strategy": "enqueue",
    "metadata": {},
    "stream_mode": ["values"],
    "on_disconnect": "continue",
    "background": False,
    "message": None,
    "parts": None,
    "command": None,
    "job": None,
    "revision": None,  # records written before runs recorded their revision have none
    "assistant_version": None,
}
"""What a run record's absent field means (``_from_record`` reads these defaults)."""


def _from_record(run_id: str, record: dict[str, Any]) -> LgRun:
    run = LgRun(
        run_id,
        str(record["thread_id"]),
        str(record["assistant_id"]),
        str(record.get("multitask_strategy", "enqueue")),
        list(record.get("stream_mode") or ["values"]),
        metadata=dict(record.get("metadata") or {}),
        on_disconnect=str(record.get("on_disconnect", "continue")),
        attempts=list(record.get("attempts") or []),
        background=bool(record.get("background")),
        revision=record.get("revision"),
        assistant_version=record.get("assistant_version"),
    )
    if record.get("created_at"):
        run.created_at = datetime.fromisoformat(str(record["created_at"]))
    return run


async def _store_record(
    state: ServerState,
    run: LgRun,
    body: RunFields | None,
    message: str | NewMessage | None,
    kept: list[dict[str, Any]] | None = None,
) -> None:
    """Commit ``run``'s record (and, for a background run, its open mark) before anyone is
    told of it; ``kept``: a background run's media, already stored (``keep_parts``)."""
    kv = state.runtime.capabilities.kv
    if kv is None:  # an in-memory store: nothing outlives the process anyway
        return
    if isinstance(message, NewMessage):
        message = message.text
    await kv.put_value(RUNS_NAMESPACE, run.run_id, _record(run, body, message, kept))
    if run.background:
        await kv.put_value(OPEN_RUNS_NAMESPACE, run.run_id, {"thread_id": run.thread_id})


async def _close_record(state: ServerState, run: LgRun) -> None:
    """After a background run's turn ended: unlist it, unless a graceful shutdown cut it
    short (then the next start carries it on)."""
    kv = state.runtime.capabilities.kv
    if kv is None or run.job_id is not None:
        return
    if run.stop_reason is None:  # it ended before its turn journaled an end (refused, failed)
        record = await kv.get_value(RUNS_NAMESPACE, run.run_id)
        if isinstance(record, dict):  # the journal cannot say it: the record does, once
            ended = {"status": run.status, "error": run.error}
            await kv.put_value(RUNS_NAMESPACE, run.run_id, {**record, "ended": ended})
    if not run.background:
        return
    if run.stop_reason == "cancelled" and run.error == _SHUTDOWN and state.draining:
        return
    await kv.delete_value(OPEN_RUNS_NAMESPACE, run.run_id)


async def _stored_run(state: ServerState, run_id: str, thread_id: str | None) -> LgRun | None:
    """A run this process does not hold, from its record and the journal (None: no record)."""
    kv = state.runtime.capabilities.kv
    if kv is None:
        return None
    record = await kv.get_value(RUNS_NAMESPACE, run_id)
    if not isinstance(record, dict) or record.get("job") is not None:
        return None
    if thread_id is not None and record.get("thread_id") != thread_id:
        return None
    template = _from_record(run_id, record)
    if await state.runtime.store.get_session(template.thread_id) is None:
        return None  # its thread was deleted (a stateless run's, or by a client)
    still_open = await kv.get_value(OPEN_RUNS_NAMESPACE, run_id) is not None
    replayed = await run_manager(state).replay(
        template.thread_id, run_id, template.assistant_id, template=template
    )
    ended = record.get("ended")
    if replayed is not None and replayed.stop_reason is None:
        if isinstance(ended, dict):  # it ended without a journaled end (refused, failed)
            replayed.status, replayed.error = str(ended.get("status")), ended.get("error")
        elif still_open:  # acknowledged, not ended: another server runs it, or the next
            # start carries it on
            replayed.status = "running" if replayed.status == "interrupted" else replayed.status
    return replayed


# -- starting runs ----------------------------------------------------------------------------
def run_queue(state: ServerState) -> RunQueue | None:
    """The run queue of a ``loom serve --queue`` server (None: background runs run here)."""
    queue = state.extra.get("run_queue")
    return queue if isinstance(queue, RunQueue) else None


async def start_run(
    state: ServerState,
    thread_id: str,
    body: RunFields,
    assistant_id: str | None = None,
    *,
    background: bool = False,
) -> LgRun:
    """Start a run on ``thread_id``: here, or (a background run on a ``--queue`` server) as a
    job of the queue. The run's record is in the store when this returns. A stored assistant
    (``loom.server.assistants``) runs its latest version, or the ``assistant_version`` the body
    names, with that version's settings; the record keeps the version and the revision."""
    from loom.server.assistants import resolve

    pinned = (body.model_extra or {}).get("assistant_version")
    chosen = await resolve(state, assistant_id or getattr(body, "assistant_id", None) or "", pinned)
    agent = chosen.target
    modes = stream_modes(body.stream_mode, ["values"])
    store = state.runtime.store
    info = await store.get_session(thread_id)
    if info is None:
        if body.if_not_exists != "create":
            raise not_found(
                f"no thread {thread_id!r}; create it with POST /threads or pass "
                '"if_not_exists": "create"'
            )
        await store.create_session(thread_id, agent_name=agent.name)
    manager = run_manager(state)
    queue = run_queue(state)
    await travel(state, thread_id, agent, body)
    if isinstance(agent, Crew):  # a crew runs in this process, also on a --queue server
        return await _start_crew_run(state, thread_id, agent, body, modes, background)
    # a stored assistant's settings live in this process: its runs run here, also on a --queue
    # server (a worker knows the served agents only)
    if queue is not None and background and not body.command and chosen.assistant_id is None:
        return await _enqueue(state, queue, thread_id, agent, body, modes)
    if body.multitask_strategy == "reject" and manager.active_on(thread_id):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run; wait for it (GET .../runs/{{id}}/join), "
            'or use multitask_strategy "enqueue" or "interrupt"'
        )
    runtime = state.runtime
    message: str | NewMessage | None = None
    kept: list[dict[str, Any]] | None = None
    shown = RunOptions(progress=None if shows_progress(modes) else False, **chosen.options)
    if body.command and "answer" in body.command:  # the client answers a server query
        answer = Answer(body.command["answer"], body.command.get("query_id"))
        turn = await runtime.start(agent, answer, session_id=thread_id, options=shown)
    elif body.command and "resume" in body.command:
        if isinstance(body.command["resume"], str) and await runtime.pending_query(thread_id):
            answer = Answer(body.command["resume"])
            turn = await runtime.start(agent, answer, session_id=thread_id, options=shown)
        else:
            resume = Resume(body.command["resume"])
            turn = await runtime.start(agent, resume, session_id=thread_id, options=shown)
    elif body.input is None and not body.command and await _awaits_answer(state, thread_id):
        # a user message a state update added: the run answers it (LangGraph's null input)
        options = RunOptions(on_busy=BUSY[body.multitask_strategy], progress=shown.progress)
        turn = await runtime.start(agent, CarryOn(), session_id=thread_id, options=options)
    else:
        message = last_human_input(body.input)
        if message is None:
            raise InputError(
                'a run needs input {"messages": [...]} or command {"resume": ...} (input null '
                "answers a thread whose last message is a user's, as a state update leaves it)"
            )
        if background and runtime.capabilities.kv is not None and isinstance(message, NewMessage):
            # its media stored before its turn starts (a store that cannot keep them refuses
            # here): a start-up that carries the run on finds them by its record's references
            kept = (await _given(state, thread_id, message))[1]
        options = RunOptions(
            on_busy=BUSY[body.multitask_strategy], progress=shown.progress, **chosen.options
        )
        turn = await runtime.start(agent, message, session_id=thread_id, options=options)
    # the turn names an unnamed session after its agent (loom.engine.loop, at its intake)
    session_agent = (info.agent_name if info is not None else None) or agent.name
    named = chosen.assistant_id or agent.name
    await _note_assistant(state, thread_id, named, session_agent, agent.name)
    run = LgRun(
        turn.run_id,
        thread_id,
        named,
        body.multitask_strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
        # a store without key-value data (MemoryStore) keeps nothing past the process: such a
        # run is not announced as carried on
        background=background and state.runtime.capabilities.kv is not None,
        revision=chosen.revision,
        assistant_version=chosen.version,
    )
    await _store_record(state, run, body, message, kept)
    manager.start(run, turn)
    return run


async def travel(state: ServerState, thread_id: str, agent: Agent | Crew, body: RunFields) -> None:
    """What a run asks of the thread before it starts (``loom.server.checkpoints``): with
    ``multitask_strategy="rollback"``, the runs in flight are interrupted, waited for, and the
    thread rewound to the state the first of them started from (their turns leave the
    transcript and stay in the journal); with a checkpoint, the thread is rewound to it (a
    ``Rewind`` turn of its own: the client sees one run). A checkpoint on a thread with a run
    in flight is a 409 unless the strategy interrupts it."""
    from loom.server.checkpoints import move_to, roll_back

    point = body.wanted_checkpoint()
    strategy = body.multitask_strategy
    active = run_manager(state).active_on(thread_id)
    if point is None and not (strategy == "rollback" and active):
        return
    if not isinstance(agent, Agent):
        if point is None:  # a crew's rollback interrupts (its members' sessions stay)
            return
        raise InputError(
            f"{agent.name!r} is a crew: its threads cannot move to a checkpoint; start the "
            "run without checkpoint_id"
        )
    if active and strategy not in ("interrupt", "rollback"):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run: a run from a checkpoint waits for none; "
            'wait for it (GET .../runs/{id}/join), or use multitask_strategy "interrupt" or '
            '"rollback"'
        )
    for other in active:
        await cancel(state, other, wait=True)
    moved = False
    if strategy == "rollback" and active:
        ids = [a for r in active for a in r.attempt_ids()]
        moved = await roll_back(state.runtime, agent, thread_id, ids)
    if point is not None:
        moved = await move_to(state.runtime, agent, thread_id, point) or moved
    if moved:
        forget_transcript(state, thread_id)


def forget_transcript(state: ServerState, thread_id: str) -> None:
    """Drop the thread's kept transcript (``transcript_values``): after a branch its messages
    are not the kept ones plus those added since."""
    kept: OrderedDict[str, _Transcript] = state.extra.setdefault("transcripts", OrderedDict())
    kept.pop(thread_id, None)


async def _awaits_answer(state: ServerState, thread_id: str) -> bool:
    """Whether the thread's last message is a user's that nothing answered yet."""
    count = await state.runtime.store.message_count(thread_id)
    if not count:
        return False
    last = await state.runtime.store.load_messages(thread_id, start=count - 1)
    return bool(last) and last[-1].role == "user"


async def _start_crew_run(
    state: ServerState,
    thread_id: str,
    crew: Crew,
    body: RunFields,
    modes: list[str],
    background: bool,
) -> LgRun:
    """A run of ``crew`` on ``thread_id`` (the crew's session): a ``CrewTurn`` driven by the run
    manager like a turn, framed by ``CrewFrameMaker`` (member frames tagged with their path).
    Its record is stored; a background one is listed open and carried on at start-up like an
    agent's (a ``CarryOn`` of the crew run: finished members reused, interrupted ones carried
    on)."""
    from loom.server.lg_crews import CrewFrameMaker

    manager = run_manager(state)
    runtime = state.runtime
    if body.multitask_strategy == "reject" and manager.active_on(thread_id):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run; wait for it (GET .../runs/{{id}}/join), "
            'or use multitask_strategy "enqueue" or "interrupt"'
        )
    if body.command and "answer" in body.command:
        raise InputError(f"{crew.name!r} is a crew; a crew asks no server queries to answer")
    message: str | NewMessage | None = None
    if body.command and "resume" in body.command:
        turn = await runtime.start(crew, Resume(body.command["resume"]), session_id=thread_id)
    else:
        message = last_human_input(body.input)
        if message is None:
            raise InputError('a run needs input {"messages": [...]} or command {"resume": ...}')
        turn = await runtime.start(crew, message, session_id=thread_id)
    if body.multitask_strategy in ("interrupt", "rollback"):  # the new run waits for their end
        for other in manager.active_on(thread_id):
            other.cancel.set()
    await _note_assistant(state, thread_id, crew.name)
    run = LgRun(
        turn.run_id,
        thread_id,
        crew.name,
        body.multitask_strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
        # carried on at start-up by a server without --queue (one with a queue carries on
        # nothing itself: its workers retry jobs, and a crew run is no job)
        background=background
        and state.runtime.capabilities.kv is not None
        and run_queue(state) is None,
    )
    run.maker = CrewFrameMaker(thread_id, turn.run_id, crew.name, crew.name)
    run.revision = state.registry.revision(crew.name)
    await _store_record(state, run, body, message)
    manager.start(run, turn)
    return run


async def _enqueue(
    state: ServerState,
    queue: RunQueue,
    thread_id: str,
    agent: Agent,
    body: RunFields,
    modes: list[str],
) -> LgRun:
    """A background run as a job of the queue; this server tails it like any other. Its
    media are stored now and the job names them by reference (``keep_parts``)."""
    given = last_human_input(body.input)
    if given is None:
        raise InputError('a run needs input {"messages": [...]} or command {"resume": ...}')
    manager = run_manager(state)
    strategy = body.multitask_strategy
    live = await queue.live_jobs(thread_id)
    here = [r for r in manager.active_on(thread_id) if r.job_id is None]  # turns of this server
    busy = live or here
    if strategy == "reject" and busy:
        raise SessionBusy(
            f"thread {thread_id!r} has a run queued or running; wait for it "
            '(GET .../runs/{id}/join), or use multitask_strategy "enqueue" or "interrupt"'
        )
    if strategy in ("interrupt", "rollback"):  # stop what runs; the new job waits for its end
        for job in live:
            await queue.abort(job)
        for other in here:
            other.cancel.set()
    await _note_assistant(state, thread_id, agent.name)
    run = LgRun(
        f"run_{uuid.uuid4().hex}",
        thread_id,
        agent.name,
        strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
        background=True,
        revision=state.registry.revision(agent.name),
    )
    message, parts = await _given(state, thread_id, given)
    run.job_id = await queue.enqueue(agent.name, thread_id, message, run.run_id, parts=parts)
    # before the client hears of the run id: any server it asks finds the job by it
    await _kv(state).put_value(RUNS_NAMESPACE, run.run_id, _record(run, body, message, parts))
    _tail(state, queue, run)
    return run


def _kv(state: ServerState) -> KVStore:
    kv = state.runtime.capabilities.kv
    if kv is None:
        raise ConfigurationError("--queue needs a store with key-value data (PostgreSQL)")
    return kv


def _tail(state: ServerState, queue: RunQueue, run: LgRun) -> JournalTail:
    assert run.job_id is not None
    job = run.job_id
    run.abort = lambda: queue.abort(job)
    tail = JournalTail(queue, state.runtime.store, _kv(state), run, job)
    run_manager(state).attach(run, tail)
    return tail


async def queued_run(state: ServerState, run_id: str, thread_id: str | None) -> LgRun | None:
    """A queued run this process does not hold, followed from the journal from now on."""
    queue = run_queue(state)
    if queue is None:
        return None
    mapping = await _kv(state).get_value(RUNS_NAMESPACE, run_id)
    if not isinstance(mapping, dict) or mapping.get("job") is None:
        return None
    if thread_id is not None and mapping["thread_id"] != thread_id:
        return None
    run = _from_record(run_id, mapping)
    run.job_id = int(mapping["job"])
    run.attempts = []  # a job's attempts are in its job record (loom.server.queued)
    tail = _tail(state, queue, run)
    await tail.caught_up.wait()  # its status is current before anyone reads it
    return run


# -- reading, streaming, cancelling -----------------------------------------------------------
async def find_run(state: ServerState, thread_id: str, run_id: str) -> LgRun:
    """Run ``run_id`` of ``thread_id``: held here, queued, or from its record and the
    journal; 404 when it is none of these."""
    manager = run_manager(state)
    run = manager.get(run_id)
    if run is not None and run.thread_id == thread_id:
        return await rehydrate(state, run)
    queued = await queued_run(state, run_id, thread_id)
    if queued is not None:
        return queued
    stored = await _stored_run(state, run_id, thread_id)
    if stored is not None:
        return stored
    info = await thread_info(state, thread_id)
    assistant = (await thread_metadata(state, info)).get("assistant_id") or info.agent_name
    replayed = await manager.replay(thread_id, run_id, str(assistant))
    if replayed is None:
        raise not_found(f"thread {thread_id!r} has no run {run_id!r}")
    return replayed


async def held_run(state: ServerState, run_id: str) -> LgRun | None:
    """Run ``run_id`` by its id alone: held here, queued, or from its stored record (any
    server of a fleet finds it); None when there is no such run."""
    held = run_manager(state).get(run_id)
    if held is not None:
        return await rehydrate(state, held)
    run = await queued_run(state, run_id, None)
    return run or await _stored_run(state, run_id, None)


async def rehydrate(state: ServerState, run: LgRun) -> LgRun:
    """``run`` with its frames: itself, or (a finished run this process released) a copy
    replayed from the journal, with the same frames and ids, that nobody else holds."""
    if not run.released:
        return run
    replayed = await run_manager(state).replay(
        run.thread_id, run.run_id, run.assistant_id, template=run.template()
    )
    if replayed is None:  # its thread is gone: the run as this process last knew it
        return run
    if replayed.stop_reason is None:  # it ended before its turn journaled an end
        replayed.status, replayed.error = run.status, run.error
    replayed.final, replayed.updated_at = run.final, run.updated_at
    return replayed


async def cancel(state: ServerState, run: LgRun, wait: bool) -> None:
    """Cancel ``run`` wherever it runs: here (the turn's cancel) or on a worker (the job's
    abort), and with ``wait`` until it ended."""
    if not run.active:
        return
    stopping = run.stop()
    if stopping is not None:
        await stopping
    if wait:
        await run.done.wait()


async def forget_run(state: ServerState, run: LgRun) -> None:
    """Forget a finished run: this process's copy and its stored record (its events stay in
    the thread's journal)."""
    run_manager(state).runs.pop(run.run_id, None)
    kv = state.runtime.capabilities.kv
    if kv is not None:
        await kv.delete_value(RUNS_NAMESPACE, run.run_id)
        await kv.delete_value(OPEN_RUNS_NAMESPACE, run.run_id)


def run_locations(run: LgRun) -> dict[str, str]:
    """The headers that name a run (and, for a background run, what a crash does to it)."""
    base = f"/threads/{quote(run.thread_id, safe='')}/runs/{run.run_id}"
    headers = {"Location": f"{base}/stream", "Content-Location": base}
    if run.background and run.job_id is None:
        headers["Loom-Run-Durability"] = RECOVERY_NOTE
    return headers


class ValuesResponse(JSONResponse):
    """A JSON response encoded by pydantic-core (a thread's values can be large: its whole
    transcript; about 4x faster than ``json.dumps``, the same compact UTF-8 text)."""

    def render(self, content: Any) -> bytes:
        return to_json(content)


_background: set[asyncio.Future[Any]] = set()  # aborts sent after a client went (kept alive)


def sse_response(run: LgRun, start: int, modes: list[str], cancel_on_disconnect: bool) -> Response:
    """``run``'s frames from position ``start`` on, in ``modes``, as an SSE response."""
    wanted = set(modes)
    followed = run.follow(start)  # read from now on: its frames stay until this is done

    async def frames() -> Any:
        finished = False
        try:
            async for f in followed:
                if f.mode is None or f.mode in wanted:
                    yield f.encode()
            finished = True
        finally:
            if not finished and cancel_on_disconnect and run.active:
                stopping = run.stop()
                if stopping is not None:  # a queued run: its job is aborted in the background
                    _background.add(asyncio.ensure_future(stopping))
                    _background.difference_update([t for t in _background if t.done()])

    headers = {**run_locations(run), "Cache-Control": "no-store"}
    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)


async def final_values(state: ServerState, run: LgRun) -> dict[str, Any]:
    """The thread's values after ``run`` (with its interrupt or error, if any)."""
    if run.final is not None:  # a stateless run whose thread is deleted
        return run.final
    values: dict[str, Any] = {"messages": await transcript_values(state, run.thread_id)}
    if run.stop_reason == "awaiting_approval":
        values["__interrupt__"] = interrupts_of(await pending_calls(state, run.thread_id))
    elif run.stop_reason == "awaiting_input":
        query = await state.runtime.pending_query(run.thread_id)
        if query is not None:
            values["__interrupt__"] = query_interrupts(run.thread_id, query.to_dict())
    if run.status == "error":
        values["__error__"] = {"error": "RunError", "message": run.error or "the run failed"}
    return values


# -- runs other surfaces acknowledge ----------------------------------------------------------
A2A_SURFACE = "a2a"
"""The ``surface`` of a run record an A2A endpoint stored (``loom.server.a2a.recovery``
carries it on, and its task with it)."""


async def store_open_run(state: ServerState, run_id: str, record: dict[str, Any]) -> bool:
    """Commit the record of a run another surface is about to acknowledge (an A2A task sent
    with ``returnImmediately``) and list it open, before the acknowledgement: the next start
    carries it on if this process dies first. ``record`` holds what :func:`recover_runs` reads
    (``thread_id``, ``assistant_id``, ``created_at``, ``attempts``, ``message`` or ``command``,
    and ``surface``, naming who carries it on). False on a store without key-value data
    (nothing outlives the process there) and on a ``--queue`` server (which carries on nothing
    itself: its workers retry jobs, and such a run is no job)."""
    kv = state.runtime.capabilities.kv
    if kv is None or run_queue(state) is not None:
        return False
    await kv.put_value(RUNS_NAMESPACE, run_id, {**record, "background": True})
    await kv.put_value(OPEN_RUNS_NAMESPACE, run_id, {"thread_id": record["thread_id"]})
    return True


async def open_run_record(state: ServerState, run_id: str) -> dict[str, Any] | None:
    """The stored record of run ``run_id`` (None: none, or no key-value data)."""
    kv = state.runtime.capabilities.kv
    record = None if kv is None else await kv.get_value(RUNS_NAMESPACE, run_id)
    return record if isinstance(record, dict) else None


async def note_attempt(state: ServerState, run_id: str, attempts: list[str]) -> None:
    """Write a run's attempts into its record before the newest one starts (a crash now is
    carried on again, from the journal of every attempt)."""
    kv = state.runtime.capabilities.kv
    record = await open_run_record(state, run_id)
    if kv is not None and record is not None:
        await kv.put_value(RUNS_NAMESPACE, run_id, {**record, "attempts": attempts})


async def close_open_run(state: ServerState, run_id: str, result: RunResult | None) -> None:
    """Unlist an open run whose turn ended (``result``; None: it ended with nothing to say),
    unless a graceful shutdown cut it short: then the next start carries it on (or, if the
    journal says it ended, unlists it)."""
    kv = state.runtime.capabilities.kv
    if kv is None:
        return
    if state.draining and (
        result is None or (result.stop_reason == "cancelled" and result.error == _SHUTDOWN)
    ):
        return
    await kv.delete_value(OPEN_RUNS_NAMESPACE, run_id)


async def attempt_events(state: ServerState, thread_id: str, attempts: list[str]) -> list[Any]:
    """The journaled events of a run's attempts on ``thread_id``, oldest first."""
    return [e for e in await state.runtime.store.load_events(thread_id) if e.run_id in attempts]


def ended_for_good(events: list[Any]) -> bool:
    """Whether a run's attempts' events end it (anything but a graceful shutdown's cancel,
    which the next start carries on)."""
    finish = next((e for e in reversed(events) if isinstance(e, AgentFinish)), None)
    return finish is not None and not (
        finish.stop_reason == "cancelled" and finish.error == _SHUTDOWN
    )


# -- recovery at start-up ---------------------------------------------------------------------
Carrier = Callable[[ServerState, str, dict[str, Any]], Awaitable[bool]]
"""Carries one acknowledged run of a surface on (True) or finds nothing left to do (False)."""

_CARRIERS: dict[str, Carrier] = {}


def register_carrier(surface: str, carrier: Carrier) -> None:
    """Let ``surface``'s own module carry its acknowledged runs on at start-up (an A2A task
    follows its run: ``loom.server.a2a`` registers ``A2A_SURFACE``), so this module never
    imports a protocol."""
    _CARRIERS[surface] = carrier


async def recover_runs(state: ServerState) -> list[str]:
    """Carry on every background run this store lists as acknowledged and unfinished (see the
    module docstring); answers the run ids carried on. Runs on a ``--queue`` server are the
    queue's (workers retry them) and are left alone."""
    kv = state.runtime.capabilities.kv
    if kv is None or run_queue(state) is not None:
        return []
    records: list[tuple[str, str, dict[str, Any]]] = []
    for run_id in await kv.list_keys(OPEN_RUNS_NAMESPACE):
        record = await kv.get_value(RUNS_NAMESPACE, run_id)
        record = record if isinstance(record, dict) else {}
        records.append((str(record.get("created_at", "")), run_id, record))
    carried = []
    for _, run_id, record in sorted(records):  # a thread's runs queue in the order taken
        try:
            surface = record.get("surface")
            if surface is not None:  # a protocol's own run (an A2A task): its module carries it
                carrier = _CARRIERS.get(str(surface))
                if carrier is not None and await carrier(state, run_id, record):
                    carried.append(run_id)
                    continue
            elif record and await _carry_on(state, run_id, record):
                carried.append(run_id)
                continue
        except Exception:  # one run's trouble must not keep the server from starting
            log.exception("carrying on run %s at start-up failed; it stays listed", run_id)
            continue
        await kv.delete_value(OPEN_RUNS_NAMESPACE, run_id)
    if carried:
        log.warning(
            "carried on %d acknowledged run(s) a stopped server left unfinished: %s",
            len(carried),
            ", ".join(carried),
        )
    return carried


async def _carry_on(state: ServerState, run_id: str, record: dict[str, Any]) -> bool:
    """Start what is left of one acknowledged run; False when nothing is (it ended, or its
    agent is no longer served)."""
    run = _from_record(run_id, record)
    attempts = run.attempt_ids()
    events = await attempt_events(state, run.thread_id, attempts)
    if ended_for_good(events):
        return False  # it ended; only its unlisting was lost
    target: Agent | Crew | None = state.registry.served(run.assistant_id)
    settings: dict[str, Any] = {}
    if target is None and run.assistant_version is not None:  # a stored assistant's run
        from loom.server.assistants import resolve

        with contextlib.suppress(HTTPException):  # deleted since, or its agent no longer served
            chosen = await resolve(
                state, run.assistant_id, run.assistant_version, check_owner=False
            )
            target, settings = chosen.target, chosen.options
    if target is None:
        log.warning(
            "run %s cannot be carried on: this server no longer serves %r",
            run_id,
            run.assistant_id,
        )
        return False
    # a crew's journal holds its run's AGENT_START (the task); an agent's its USER_MESSAGE
    crew = isinstance(target, Crew)
    committed = any(
        e.type == (EventType.AGENT_START if crew else EventType.USER_MESSAGE) for e in events
    )
    # the dead attempt stays as it is: the next one is a turn of its own (an attempt that
    # committed nothing is simply run again under its id)
    attempt = f"{run_id}-a{len(attempts) + 1}" if events else attempts[-1]
    message = record.get("message")
    command = record.get("command")
    runtime = state.runtime
    turn: Turn | CrewTurn
    if committed or (command and events):
        options = RunOptions(run_id=attempt, **settings)
        turn = await runtime.start(target, CarryOn(), session_id=run.thread_id, options=options)
    elif command and "resume" in command:
        turn = await runtime.start(target, Resume(command["resume"]), session_id=run.thread_id)
    elif isinstance(message, str):
        options = RunOptions(run_id=attempt, **settings)
        parts = parts_from_json(record.get("parts"))  # stored with the record: references
        again = NewMessage(message, parts) if parts else message
        turn = await runtime.start(target, again, session_id=run.thread_id, options=options)
    else:
        return False
    if turn.run_id not in attempts:
        run.attempts = [*attempts, turn.run_id]
    await note_attempt(state, run_id, run.attempt_ids())
    manager = run_manager(state)
    replayed = await manager.replay(
        run.thread_id, run_id, run.assistant_id, template=run, ended=False
    )
    assert replayed is not None
    if crew:  # member frames tagged with their path, like the first attempt's
        from loom.server.lg_crews import CrewFrameMaker

        replayed.maker = CrewFrameMaker(run.thread_id, run_id, run.assistant_id, target.name)
    replayed.status = "pending"
    replayed.stop_reason = replayed.error = None
    manager.start(replayed, turn)
    return True
