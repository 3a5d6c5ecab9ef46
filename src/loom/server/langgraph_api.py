"""The run API on the paths of LangGraph's Agent Server, so ``langgraph-sdk`` works unchanged.

Terms: an assistant is a Loom agent (``assistant_id`` = the agent's name, or its UUID form
``uuid5(NAMESPACE_URL, "loom:agent:<name>")``), or a versioned configuration over one made
with ``POST /assistants`` (``loom.server.assistants``); a thread is a Loom session (``thread_id`` =
``session_id``); a run is one Loom turn (``run_id`` = the turn's run id). A thread's ``values``
are ``{"messages": [...]}``, the session's transcript in LangChain's message form.

``multitask_strategy`` maps onto Loom's ``on_busy``: ``enqueue`` = queue, ``reject`` = drop
(409 while this server runs a turn on the thread), ``interrupt`` = interrupt (Loom keeps what
the interrupted turn committed), ``rollback`` = interrupt, then rewind the thread to before
the interrupted run (its turns leave the transcript and stay in the journal).

Checkpoints are stored events (``"<run_id>.<sequence>"``, ``loom.server.checkpoints``): the
state at one, history with parents, state updates, copies and runs from a checkpoint are
branches of the session (``loom.engine.branching``).

A run that parks on an approval ends with an ``__interrupt__`` (values / updates modes) that
carries the pending calls; ``GET /threads/{id}/approvals`` lists them and
``POST /threads/{id}/approvals/{call_id}`` decides one, which resumes the turn as a new run
once every pending call is decided. ``command: {"resume": ...}`` on a run does the same.

On a ``loom serve --queue`` server, background runs (``POST /threads/{id}/runs``, ``POST
/runs``) are jobs of the queue that ``loom worker`` processes run; every server reads, streams
and cancels them by their run id (``loom.server.queued``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field
from starlette.exceptions import HTTPException

from loom.errors import InputError, SessionBusy
from loom.messages import Message
from loom.server import assistants, checkpoints, runs
from loom.server.app import ServerState, state_of, view_for
from loom.server.lg_runs import LgRun, interrupts_of, run_status
from loom.server.ownership import ClientId
from loom.server.runs import (
    MultitaskStrategy,
    assistant_uuid,
    cancel,
    resume_position,
    stream_modes,
)
from loom.server.security import current_principal
from loom.server.thread_stream import CHANNELS, BusRegistry, encode, follow_run
from loom.store.base import SessionInfo

__all__ = ["MultitaskStrategy", "assistant_uuid", "cancel", "on_start", "router"]

# The run helpers live in loom.server.runs; this module's handlers call them by these names.
_Body = runs.ApiBody
_RunFields = runs.RunFields
_final_values = runs.final_values
_find_run = runs.find_run
_metadata_patch = runs.metadata_patch
_not_found = runs.not_found
_pending = runs.pending_calls
_locations = runs.run_locations
_manager = runs.run_manager
_save_patch = runs.save_metadata_patch
_served = runs.served
_sse = runs.sse_response
_start_run = runs.start_run
_session = runs.thread_info
_metadata = runs.thread_metadata
_values = runs.thread_values

router: APIRouter = APIRouter(tags=["langgraph"])

on_start = runs.recover_runs
"""Awaited by the server before it is ready: acknowledged runs a stopped server left
unfinished are carried on (``loom.server.runs``)."""

# -- request bodies ---------------------------------------------------------------------------


class AssistantSearch(_Body):
    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


class AssistantCreate(_Body):
    graph_id: Any = None  # checked by loom.server.assistants: a typed error names what is wrong
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    assistant_id: str | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    name: str | None = None
    description: str | None = None


class AssistantPatch(_Body):
    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class VersionSearch(_Body):
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


class LatestVersion(_Body):
    version: int


class ThreadCreate(_Body):
    thread_id: ClientId | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"


class ThreadPatch(_Body):
    metadata: dict[str, Any] = Field(default_factory=dict)


class ThreadSearch(_Body):
    metadata: dict[str, Any] | None = None
    ids: list[ClientId] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


class HistoryRequest(_Body):
    limit: int = Field(10, ge=0)
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class RunCreate(_RunFields):
    """A run on a thread (LangGraph's ``RunCreateStateful``; unknown fields are ignored)."""

    assistant_id: str


class StatelessRunCreate(_RunFields):
    """A run without a thread (LangGraph's ``RunCreateStateless``), or the open Agent
    Protocol's ``RunCreate``: ``agent_id`` for ``assistant_id``, ``messages`` for the input,
    and ``thread_id`` to run on a thread instead of a fresh one."""

    assistant_id: str | None = None
    agent_id: str | None = None
    thread_id: ClientId | None = None
    messages: list[dict[str, Any]] | None = None
    on_completion: Literal["delete", "keep"] = "delete"


class ApprovalDecision(_Body):
    decision: Literal["approve", "reject"]
    reason: str | None = None


# -- helpers ----------------------------------------------------------------------------------


async def _thread(state: ServerState, info: SessionInfo) -> dict[str, Any]:
    pending = await _pending(state, info.id)
    interrupts = interrupts_of(pending)
    busy = bool(_manager(state).active_on(info.id))
    status = "busy" if busy else "interrupted" if pending else "idle"
    messages = await state.runtime.store.load_messages(info.id)
    return {
        "thread_id": info.id,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
        "metadata": await _metadata(state, info),
        "status": status,
        "values": _values(info.id, messages),
        "interrupts": {"approvals": interrupts} if interrupts else {},
    }


def _thread_state(
    thread_id: str,
    messages: list[Message],
    metadata: dict[str, Any],
    checkpoint_id: str | None,
    pending: list[dict[str, Any]],
    created_at: str | None,
    parent: str | None = None,
) -> dict[str, Any]:
    interrupts = interrupts_of(pending)
    tasks = (
        [
            {
                "id": "approvals",
                "name": "tools",
                "error": None,
                "interrupts": interrupts,
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
        if interrupts
        else []
    )
    parent_checkpoint = (
        None
        if parent is None
        else {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": parent}
    )
    return {
        "values": _values(thread_id, messages),
        "next": checkpoints.next_nodes(messages, bool(interrupts)),
        "tasks": tasks,
        "checkpoint": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id},
        "metadata": metadata,
        "created_at": created_at,
        "parent_checkpoint": parent_checkpoint,
        "interrupts": interrupts,
    }


# -- assistants -------------------------------------------------------------------------------
# Served agents and crews, and assistants made with POST /assistants (loom.server.assistants).
@router.post("/assistants", summary="Create an assistant (a configuration over an agent)")
async def create_assistant(request: Request, body: AssistantCreate) -> dict[str, Any]:
    return await assistants.create(
        state_of(request),
        graph_id=body.graph_id,
        config=body.config,
        context=body.context,
        metadata=body.metadata,
        assistant_id=body.assistant_id,
        if_exists=body.if_exists,
        name=body.name,
        description=body.description,
    )


@router.post("/assistants/search", summary="Search assistants (served agents and made ones)")
async def search_assistants(request: Request, body: AssistantSearch) -> list[dict[str, Any]]:
    found = await assistants.search(state_of(request), body.graph_id, body.name, body.metadata)
    return found[body.offset : body.offset + body.limit]


@router.post("/assistants/count", summary="Count assistants")
async def count_assistants(request: Request, body: AssistantSearch) -> int:
    return len(await search_assistants(request, body.model_copy(update={"limit": 1 << 30})))


@router.get("/assistants/{assistant_id}", summary="Get an assistant (its latest version)")
async def get_assistant(request: Request, assistant_id: str) -> dict[str, Any]:
    return await assistants.get(state_of(request), assistant_id)


@router.patch("/assistants/{assistant_id}", summary="Update an assistant: a new version")
async def patch_assistant(
    request: Request, assistant_id: str, body: AssistantPatch
) -> dict[str, Any]:
    return await assistants.patch(
        state_of(request),
        assistant_id,
        graph_id=body.graph_id,
        config=body.config,
        context=body.context,
        metadata=body.metadata,
        name=body.name,
        description=body.description,
    )


@router.delete(
    "/assistants/{assistant_id}", status_code=204, summary="Delete an assistant and its versions"
)
async def delete_assistant(request: Request, assistant_id: str) -> Response:
    await assistants.delete(state_of(request), assistant_id)
    return Response(status_code=204)


@router.post("/assistants/{assistant_id}/versions", summary="An assistant's versions, newest first")
async def assistant_versions(
    request: Request, assistant_id: str, body: VersionSearch
) -> list[dict[str, Any]]:
    return await assistants.list_versions(
        state_of(request), assistant_id, body.metadata, body.limit, body.offset
    )


@router.post("/assistants/{assistant_id}/latest", summary="Set an assistant's latest version")
async def set_latest_version(
    request: Request, assistant_id: str, body: LatestVersion
) -> dict[str, Any]:
    return await assistants.set_latest(state_of(request), assistant_id, body.version)


@router.get("/assistants/{assistant_id}/schemas", summary="An assistant's input/output schemas")
async def assistant_schemas(request: Request, assistant_id: str) -> dict[str, Any]:
    agent = (await assistants.resolve(state_of(request), assistant_id)).target
    messages = {
        "type": "object",
        "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
    }
    return {
        "graph_id": agent.name,
        "input_schema": messages,
        "output_schema": messages,
        "state_schema": messages,
        "config_schema": {"type": "object", "properties": {}},
        "context_schema": {"type": "object", "properties": {}},
    }


# -- threads ----------------------------------------------------------------------------------
@router.post("/threads", summary="Create a thread (a Loom session)")
async def create_thread(request: Request, body: ThreadCreate) -> dict[str, Any]:
    state = state_of(request)
    store = state.runtime.store
    thread_id = body.thread_id or str(uuid.uuid4())
    if body.thread_id and not body.thread_id.strip():
        raise InputError("thread_id must be a non-empty string")
    existing = await store.get_session(thread_id)
    if existing is not None:
        if body.if_exists == "raise":
            raise SessionBusy(f"thread {thread_id!r} exists; pass if_exists=do_nothing")
        return await _thread(state, existing)
    info = await store.create_session(thread_id, metadata=dict(body.metadata or {}))
    # a new thread: nothing to read back (no messages, approvals, runs or added metadata;
    # deleting a thread drops its added metadata)
    return {
        "thread_id": info.id,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
        "metadata": dict(info.metadata),
        "status": "idle",
        "values": _values(info.id, []),
        "interrupts": {},
    }


@router.post("/threads/search", summary="Search threads")
async def search_threads(request: Request, body: ThreadSearch) -> list[dict[str, Any]]:
    state = state_of(request)
    store = state.runtime.store
    if body.ids:
        infos = [i for i in [await store.get_session(t) for t in body.ids] if i is not None]
    else:
        infos = await store.list_sessions(limit=0)
    out = []
    for info in infos:
        if body.metadata:
            meta = await _metadata(state, info)
            if any(meta.get(k) != v for k, v in body.metadata.items()):
                continue
        out.append(info)
    if body.status is None:
        return [await _thread(state, i) for i in out[body.offset : body.offset + body.limit]]
    threads = [await _thread(state, i) for i in out]
    threads = [t for t in threads if t["status"] == body.status]
    return threads[body.offset : body.offset + body.limit]


class ThreadCount(_Body):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


@router.post("/threads/count", summary="Count threads (langgraph-sdk's threads.count)")
async def count_threads(request: Request, body: ThreadCount) -> int:
    query = ThreadSearch(metadata=body.metadata, status=body.status, limit=1 << 30)
    threads = await search_threads(request, query)
    if body.values:  # the keys given, each equal to the thread's value
        wanted = body.values.items()
        threads = [t for t in threads if all(t["values"].get(k) == v for k, v in wanted)]
    return len(threads)


@router.get("/threads/{thread_id}", summary="Get a thread")
async def get_thread(request: Request, thread_id: str) -> dict[str, Any]:
    state = state_of(request)
    return await _thread(state, await _session(state, thread_id))


@router.get(
    "/threads/{thread_id}/media/{ref}",
    summary="The bytes of an image, file or audio the thread's messages name",
    response_model=None,
)
async def thread_media(request: Request, thread_id: str, ref: str) -> Response:
    """The bytes a thread's message names by ``ref`` (``sha256:<hex>``, what its content
    blocks' ``url`` points at), with their media type. 404 for a thread this key does not see
    (the same check as every thread route) and for a ref the thread does not name."""
    state = state_of(request)
    await _session(state, thread_id)
    blobs = state.runtime.capabilities.blobs
    named = {} if blobs is None else {r: t for r, t, _ in await blobs.session_blobs(thread_id)}
    data = None
    if ref in named and blobs is not None:
        data = (await blobs.load_blobs([ref])).get(ref)
    if data is None:
        raise _not_found(
            f"thread {thread_id!r} names no media {ref!r}; its messages' content blocks give "
            "the URLs of the media it has"
        )
    media_type = named[ref] or "application/octet-stream"
    headers = {
        # the bytes under a content hash never change; a user's upload must not run as a page
        "Cache-Control": "private, max-age=31536000, immutable",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
    }
    if not media_type.startswith(("image/", "audio/")):
        headers["Content-Disposition"] = "attachment"
    return Response(data, media_type=media_type, headers=headers)


@router.patch("/threads/{thread_id}", summary="Merge metadata into a thread's")
async def patch_thread(request: Request, thread_id: str, body: ThreadPatch) -> dict[str, Any]:
    state = state_of(request)
    info = await _session(state, thread_id)
    await _save_patch(
        state, thread_id, {**await _metadata_patch(state, thread_id), **body.metadata}
    )
    return await _thread(state, info)


@router.delete("/threads/{thread_id}", status_code=204, summary="Delete a thread")
async def delete_thread(request: Request, thread_id: str) -> Response:
    state = state_of(request)
    await _session(state, thread_id)
    manager = _manager(state)
    if manager.active_on(thread_id):
        raise SessionBusy(f"thread {thread_id!r} is running a run; cancel it first")
    delete = getattr(state.runtime.store, "delete_session", None)
    if delete is None:
        raise HTTPException(501, "this server's store cannot delete sessions")
    await delete(thread_id)
    await state.runtime.forget_session_sandbox(thread_id)
    await _save_patch(state, thread_id, None)
    manager.forget_thread(thread_id)
    _buses(state).forget(thread_id)
    return Response(status_code=204)


async def _state_of(state: ServerState, thread_id: str, asked: object | None) -> dict[str, Any]:
    """The thread's state at the checkpoint ``asked`` names (None: its latest), replayed from
    the journal (``loom.server.checkpoints``)."""
    info = await _session(state, thread_id)
    meta = await _metadata(state, info)
    events = await state.runtime.store.load_events(thread_id)
    listed = checkpoints.walk(events)
    if asked is None:
        head = listed[-1] if listed else None
        messages = await state.runtime.store.load_messages(thread_id)
        return _thread_state(
            thread_id,
            messages,
            checkpoints.snapshot_metadata(meta, head, len(listed) - 1),
            head.id if head is not None else None,
            await _pending(state, thread_id),
            None if head is None else datetime.fromtimestamp(head.timestamp, UTC).isoformat(),
            head.parent if head is not None else None,
        )
    found = checkpoints.point_of_id(asked, events)
    if found is None:
        raise checkpoints.unknown_checkpoint(thread_id, asked)
    cid, point = found
    position = next(
        i for i, e in enumerate(events) if e.run_id == point.run_id and e.sequence == point.sequence
    )
    messages = checkpoints.states_at(events, {position})[position]
    steps = [i for i, c in enumerate(listed) if c.position == position]
    cp = listed[steps[0]] if steps else None
    parent = cp.parent if cp is not None else checkpoints.parent_of(events, position)
    latest = bool(listed) and listed[-1].position == position
    pending = await _pending(state, thread_id) if latest else []
    base = checkpoints.snapshot_metadata(meta, cp, steps[0] if steps else -1)
    if cp is None:
        base = {**base, "source": "loop", "run_id": point.run_id}
    at = datetime.fromtimestamp(events[position].timestamp, UTC).isoformat()
    return _thread_state(thread_id, messages, base, cid, pending, at, parent)


@router.get("/threads/{thread_id}/state", summary="A thread's current state (its messages)")
async def thread_state(request: Request, thread_id: str) -> dict[str, Any]:
    return await _state_of(state_of(request), thread_id, None)


@router.get(
    "/threads/{thread_id}/state/{checkpoint_id}",
    summary="A thread's state at a checkpoint ('<run_id>.<sequence>': a stored event)",
)
async def thread_state_at(request: Request, thread_id: str, checkpoint_id: str) -> dict[str, Any]:
    return await _state_of(state_of(request), thread_id, checkpoint_id)


class CheckpointRequest(_Body):
    checkpoint: dict[str, Any] = Field(description="{checkpoint_id: '<run_id>.<sequence>'}")


@router.post(
    "/threads/{thread_id}/state/checkpoint",
    summary="A thread's state at a checkpoint given as an object (langgraph-sdk's get_state)",
)
async def thread_state_post(
    request: Request, thread_id: str, body: CheckpointRequest
) -> dict[str, Any]:
    return await _state_of(state_of(request), thread_id, body.checkpoint)


class StateUpdate(_Body):
    """``POST /threads/{id}/state``: from ``checkpoint`` (or ``checkpoint_id``; none: the
    latest state), add ``values``' messages."""

    values: dict[str, Any] | list[Any] | None = None
    as_node: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None


@router.post(
    "/threads/{thread_id}/state",
    summary="Update a thread's state: rewind to a checkpoint, then add messages (a new branch)",
)
async def update_thread_state(
    request: Request, thread_id: str, body: StateUpdate
) -> dict[str, Any]:
    """Rewind the thread to the checkpoint given (the later messages leave the transcript and
    stay in the journal, as an abandoned branch), then add ``values.messages`` as a step of
    their own (user messages and assistant text answers; ``as_node`` is accepted and not
    needed: a user message waits for a run, ``input: null`` answers it). Answers the new
    checkpoint."""
    state = state_of(request)
    info = await _session(state, thread_id)
    added = checkpoints.update_messages(body.values)  # a bad body changes nothing
    if _manager(state).active_on(thread_id):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run; update its state after it ends (GET "
            ".../runs/{id}/join), or cancel it"
        )
    asked = body.checkpoint_id or (body.checkpoint or {}).get("checkpoint_id")
    if asked:
        agent = runs.agent_named(state, await session_agent(state, info))
        await checkpoints.move_to(state.runtime, agent, thread_id, asked)
    await checkpoints.append_update(state.runtime, thread_id, added)
    runs.forget_transcript(state, thread_id)
    head = (await _state_of(state, thread_id, None))["checkpoint"]
    return {"checkpoint": {**head, "checkpoint_map": {}}}


@router.post("/threads/{thread_id}/copy", summary="Copy a thread: a new thread with its history")
async def copy_thread(request: Request, thread_id: str) -> dict[str, Any]:
    """A new thread that continues this one from its latest state (``Runtime.fork``: the
    history is shared, not copied), with its metadata."""
    state = state_of(request)
    info = await _session(state, thread_id)
    agent = runs.agent_named(state, await session_agent(state, info))
    new_id = await state.runtime.fork(agent, thread_id, None, new_session_id=str(uuid.uuid4()))
    await _save_patch(state, new_id, await _metadata(state, info))
    return await _thread(state, await _session(state, new_id))


@router.post("/threads/{thread_id}/history", summary="A thread's checkpoints, newest first")
async def thread_history(
    request: Request, thread_id: str, body: HistoryRequest
) -> list[dict[str, Any]]:
    """One checkpoint per run (its last stored event), the abandoned branches' included, each
    with its parent (``loom.server.checkpoints``); ``before`` pages on, ``metadata`` filters."""
    state = state_of(request)
    info = await _session(state, thread_id)
    meta = await _metadata(state, info)
    events = await state.runtime.store.load_events(thread_id)
    listed = list(enumerate(checkpoints.walk(events)))
    if body.before is not None:
        _, point, _ = await checkpoints.resolve(state.runtime, thread_id, body.before)
        cut = next(
            (
                k
                for k, (_, c) in enumerate(listed)
                if (c.run_id, c.sequence) == (point.run_id, point.sequence)
            ),
            None,
        )
        if cut is None:
            raise checkpoints.unknown_checkpoint(thread_id, body.before)
        listed = listed[:cut]
    wanted = []
    for step, cp in reversed(listed):
        data = checkpoints.snapshot_metadata(meta, cp, step)
        if body.metadata and any(data.get(k) != v for k, v in body.metadata.items()):
            continue
        wanted.append((step, cp, data))
        if len(wanted) >= body.limit:
            break
    states = checkpoints.states_at(events, {cp.position for _, cp, _ in wanted})
    head = listed[-1][1].position if listed and not body.before else -1
    pending = await _pending(state, thread_id)
    out = []
    for _, cp, data in wanted:
        # approvals decided since a parked run are no longer pending: only the head's are
        calls: list[dict[str, Any]] = pending if cp.position == head else []
        at = datetime.fromtimestamp(cp.timestamp, UTC).isoformat()
        out.append(_thread_state(thread_id, states[cp.position], data, cp.id, calls, at, cp.parent))
    return out


# -- runs -------------------------------------------------------------------------------------
@router.post("/threads/{thread_id}/runs", summary="Start a background run")
async def create_run(request: Request, thread_id: str, body: RunCreate) -> JSONResponse:
    run = await _start_run(state_of(request), thread_id, body, background=True)
    return JSONResponse(run.to_dict(), headers=_locations(run))


@router.post("/threads/{thread_id}/runs/stream", summary="Start a run and stream it (SSE)")
async def stream_run(request: Request, thread_id: str, body: RunCreate) -> Response:
    run = await _start_run(state_of(request), thread_id, body)
    return _sse(run, 0, run.stream_modes, body.on_disconnect == "cancel")


@router.post("/threads/{thread_id}/runs/wait", summary="Start a run and wait for its end")
async def wait_run(request: Request, thread_id: str, body: RunCreate) -> JSONResponse:
    state = state_of(request)
    run = await _start_run(state, thread_id, body)
    await run.done.wait()
    return runs.ValuesResponse(await _final_values(state, run), headers=_locations(run))


@router.get("/threads/{thread_id}/runs", summary="List a thread's runs, newest first")
async def list_runs(
    request: Request,
    thread_id: str,
    limit: int = Query(10, ge=0),
    offset: int = Query(0, ge=0),
    status: str | None = None,
) -> list[dict[str, Any]]:
    state = state_of(request)
    info = await _session(state, thread_id)
    manager = _manager(state)
    runs = {r.run_id: r.to_dict() for r in manager.of_thread(thread_id)}
    records = getattr(state.runtime.store, "list_runs", None)
    if records is not None:  # runs this process does not hold (earlier processes, evicted)
        assistant = (await _metadata(state, info)).get("assistant_id") or info.agent_name
        for rec in await records(thread_id):
            if rec.run_id in runs and rec.run_id in manager.runs:
                continue
            old = runs.get(rec.run_id)
            created = old["created_at"] if old else rec.timestamp.isoformat()
            runs[rec.run_id] = {
                "run_id": rec.run_id,
                "thread_id": thread_id,
                "assistant_id": assistant,
                "created_at": created,
                "updated_at": rec.timestamp.isoformat(),
                "status": run_status(rec.status),
                "metadata": {},
                "multitask_strategy": "enqueue",
                "stop_reason": None if rec.status == "running" else rec.status,
            }
    out = sorted(runs.values(), key=lambda r: r["created_at"], reverse=True)
    if status is not None:
        out = [r for r in out if r["status"] == status]
    return out[offset : offset + limit]


@router.get("/threads/{thread_id}/runs/{run_id}", summary="Get a run")
async def get_run(request: Request, thread_id: str, run_id: str) -> dict[str, Any]:
    return (await _find_run(state_of(request), thread_id, run_id)).to_dict()


@router.get("/threads/{thread_id}/runs/{run_id}/join", summary="Wait for a run; its final values")
async def join_run(request: Request, thread_id: str, run_id: str) -> dict[str, Any]:
    state = state_of(request)
    run = await _find_run(state, thread_id, run_id)
    await run.done.wait()
    return await _final_values(state, run)


@router.get(
    "/threads/{thread_id}/runs/{run_id}/stream",
    summary="Join a run's stream; with Last-Event-ID, from the event after it",
)
async def join_stream(
    request: Request,
    thread_id: str,
    run_id: str,
    stream_mode: list[str] | None = Query(None),
    cancel_on_disconnect: bool = False,
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
) -> Response:
    run = await _find_run(state_of(request), thread_id, run_id)
    modes = stream_modes(stream_mode, run.stream_modes)
    return _sse(run, resume_position(run, last_event_id), modes, cancel_on_disconnect)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", summary="Cancel a run")
async def cancel_run(
    request: Request,
    thread_id: str,
    run_id: str,
    wait: bool = False,
    action: Literal["interrupt", "rollback"] = "interrupt",
) -> Response:
    state = state_of(request)
    run = await _find_run(state, thread_id, run_id)
    if action == "rollback":  # LangGraph: the run's work is undone (here: rewound, journaled)
        was_active = run.active
        await cancel(state, run, True)
        if was_active:
            info = await _session(state, thread_id)
            agent = runs.agent_named(state, await session_agent(state, info))
            if await checkpoints.roll_back(state.runtime, agent, thread_id, run.attempt_ids()):
                runs.forget_transcript(state, thread_id)
        return Response(status_code=204)
    await cancel(state, run, wait)
    return Response(status_code=204)


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204, summary="Forget a run")
async def delete_run(request: Request, thread_id: str, run_id: str) -> Response:
    state = state_of(request)
    run = await _find_run(state, thread_id, run_id)
    if run.active:
        raise SessionBusy(f"run {run_id!r} is still running; cancel it first")
    await runs.forget_run(state, run)
    return Response(status_code=204)


# -- approvals and errors ---------------------------------------------------------------------
@router.get("/threads/{thread_id}/approvals", summary="Tool calls waiting for a human decision")
async def list_approvals(request: Request, thread_id: str) -> list[dict[str, Any]]:
    state = state_of(request)
    await _session(state, thread_id)
    decided = state.extra.setdefault("langgraph_decisions", {}).get(thread_id, {})
    return [
        {**p, "decided": decided.get(p["tool_call_id"])} for p in await _pending(state, thread_id)
    ]


@router.post(
    "/threads/{thread_id}/approvals/{call_id}",
    summary="Approve or reject a pending call; resumes the run once every call is decided",
)
async def decide_approval(
    request: Request, thread_id: str, call_id: str, body: ApprovalDecision
) -> JSONResponse:
    state = state_of(request)
    info, decided, waiting = await record_decision(
        state, thread_id, call_id, body.model_dump(exclude_none=True)
    )
    if waiting:
        return JSONResponse({"status": "waiting", "undecided": waiting}, status_code=202)
    assistant = await session_agent(state, info)
    resume = RunCreate(
        assistant_id=assistant,
        command={"resume": decided},
        stream_mode=["values", "updates", "messages-tuple", "events"],
    )
    run = await _start_run(state, thread_id, resume)
    return JSONResponse(
        {"status": "resumed", "run": run.to_dict()}, status_code=202, headers=_locations(run)
    )


async def record_decision(
    state: ServerState, thread_id: str, call_id: str, decision: dict[str, Any]
) -> tuple[SessionInfo, dict[str, dict[str, Any]], list[str]]:
    """Record a decision on one parked call (shared by every protocol that answers approvals):
    the session, every decision so far, and the calls still undecided (none: resume now with
    the decisions, which are then forgotten)."""
    info = await _session(state, thread_id)
    pending = await _pending(state, thread_id)
    ids = [p["tool_call_id"] for p in pending]
    if call_id not in ids:
        raise _not_found(
            f"thread {thread_id!r} has no call {call_id!r} waiting for approval"
            + (f"; pending: {', '.join(ids)}" if ids else "")
        )
    if _manager(state).active_on(thread_id):
        raise SessionBusy(f"thread {thread_id!r} is running a run; decide after it ends")
    all_decided: dict[str, dict[str, dict[str, Any]]] = state.extra.setdefault(
        "langgraph_decisions", {}
    )
    decided = {k: v for k, v in all_decided.get(thread_id, {}).items() if k in ids}
    who = current_principal.get()  # who decided is the server's to say, never the body's
    decided[call_id] = {**decision, "by": who.name if who is not None else ""}
    waiting = [i for i in ids if i not in decided]
    if waiting:
        all_decided[thread_id] = decided
    else:
        all_decided.pop(thread_id, None)
    return info, decided, waiting


async def session_agent(state: ServerState, info: SessionInfo) -> str:
    """The name of the agent a session runs (the last one a run used)."""
    return str((await _metadata(state, info)).get("assistant_id") or info.agent_name)


class QueryAnswerBody(_Body):
    answer: str = Field(description="The client's answer to the model's query")
    query_id: str | None = Field(default=None, description="The query answered (checked)")
    stream_mode: list[str] | str | None = None


@router.get(
    "/threads/{thread_id}/queries",
    summary="The server query (seed 003) the thread waits on: [] or [query]",
)
async def list_queries(request: Request, thread_id: str) -> list[dict[str, Any]]:
    state = state_of(request)
    await _session(state, thread_id)
    query = await state.runtime.pending_query(thread_id)
    return [] if query is None else [query.to_dict()]


@router.post(
    "/threads/{thread_id}/answer",
    status_code=202,
    summary="Answer the thread's server query; the turn goes on as a new run",
)
async def answer_query(request: Request, thread_id: str, body: QueryAnswerBody) -> JSONResponse:
    state = state_of(request)
    run = await _answer(state, thread_id, body.answer, body.query_id, body.stream_mode)
    return JSONResponse(
        {"status": "answered", "run": run.to_dict()}, status_code=202, headers=_locations(run)
    )


async def _answer(
    state: ServerState,
    thread_id: str,
    answer: str,
    query_id: str | None,
    stream_mode: list[str] | str | None = None,
) -> LgRun:
    info = await _session(state, thread_id)
    if _manager(state).active_on(thread_id):
        raise SessionBusy(f"thread {thread_id!r} is running a run; answer after it ends")
    if await state.runtime.pending_query(thread_id) is None:
        raise InputError(f"thread {thread_id!r} has no server query waiting for an answer")
    assistant = await session_agent(state, info)
    command: dict[str, Any] = {"answer": answer}
    if query_id is not None:
        command["query_id"] = query_id
    modes = stream_mode or ["values", "updates", "messages-tuple", "events"]
    create = RunCreate(assistant_id=assistant, command=command, stream_mode=modes)
    return await _start_run(state, thread_id, create)


# -- thread streaming (LangGraph's v3 protocol; the Agent Protocol's commands) ----------------
class StreamCommand(_Body):
    """A streaming-protocol command: ``{id, method, params}``."""

    id: int | None = Field(default=None, ge=0, description="Client-assigned, echoed back")
    method: str | None = Field(default=None, description="run.start, input.respond, state.get")
    params: dict[str, Any] = Field(default_factory=dict)


class EventStreamRequest(_Body):
    channels: list[str] = Field(min_length=1, description="values, messages, lifecycle, ...")
    namespaces: list[list[str]] | None = None
    depth: int | None = Field(default=None, ge=0)
    since: int | None = Field(default=None, ge=0, description="Replay after this seq")


def _buses(state: ServerState) -> BusRegistry:
    buses = state.extra.get("thread_buses")
    if buses is None:
        buses = state.extra["thread_buses"] = BusRegistry()
    assert isinstance(buses, BusRegistry)
    return buses


def _protocol_error(command_id: int | None, code: str, message: str) -> JSONResponse:
    body = {"type": "error", "id": command_id, "error": code, "message": message}
    return JSONResponse(body)


def _decision_of(response: Any) -> dict[str, Any]:
    """An ``input.respond`` response to an approval as a Loom decision."""
    if isinstance(response, dict) and response.get("decision") in ("approve", "reject"):
        return {k: v for k, v in response.items() if k in ("decision", "reason")}
    if response is True or response in ("approve", "approved", "yes"):
        return {"decision": "approve"}
    if response is False or response in ("reject", "rejected", "no"):
        return {"decision": "reject"}
    raise InputError(
        'an approval\'s response is true / false, "approve" / "reject", or '
        f'{{"decision": "approve" | "reject", "reason"?: ...}}; got {response!r}'
    )


async def _respond(state: ServerState, thread_id: str, params: dict[str, Any]) -> LgRun | None:
    """``input.respond``: answer the thread's server query or decide its parked calls (a run
    resumes once every call is decided: None until then)."""
    answers = params.get("responses") or [params]
    if not all(isinstance(a, dict) and isinstance(a.get("interrupt_id"), str) for a in answers):
        raise InputError("input.respond needs interrupt_id (from an input.requested event)")
    query = await state.runtime.pending_query(thread_id)
    if query is not None and len(answers) == 1 and answers[0]["interrupt_id"] == query.query_id:
        response = answers[0].get("response")
        text = response if isinstance(response, str) else json.dumps(response)
        return await _answer(state, thread_id, text, query.query_id)
    run: LgRun | None = None
    for answer in answers:
        info, decided, waiting = await record_decision(
            state, thread_id, answer["interrupt_id"], _decision_of(answer.get("response"))
        )
        if not waiting:
            resume = RunCreate(
                assistant_id=await session_agent(state, info),
                command={"resume": decided},
                stream_mode=["values", "updates", "messages-tuple", "events"],
            )
            run = await _start_run(state, thread_id, resume)
    return run


def _follow(state: ServerState, thread_id: str, run: LgRun) -> int:
    """Publish ``run`` on its thread's stream: the sequence number before its events."""
    bus = _buses(state).get(thread_id)
    before = bus.run_starting()
    task = asyncio.ensure_future(follow_run(bus, run))
    state.extra.setdefault("thread_followers", set()).add(task)
    task.add_done_callback(state.extra["thread_followers"].discard)
    return before


@router.post(
    "/threads/{thread_id}/commands",
    summary="Send a thread streaming command (run.start, input.respond, state.get)",
)
async def thread_command(request: Request, thread_id: str, body: StreamCommand) -> JSONResponse:
    state = state_of(request)
    if body.method is None or body.id is None:
        moved = (
            " (server-query answers moved to POST /threads/{id}/answer)"
            if body.model_extra and "answer" in body.model_extra
            else ""
        )
        raise InputError(
            'a streaming command is {"id": <int>, "method": "run.start" | "input.respond" | '
            f'"state.get", "params": {{...}}}}{moved}'
        )
    params = body.params
    run: LgRun | None
    if body.method == "run.start":
        assistant = params.get("assistant_id")
        if not isinstance(assistant, str) or not assistant:
            return _protocol_error(body.id, "invalid_argument", "run.start needs assistant_id")
        create = RunCreate(
            assistant_id=assistant,
            input=params.get("input"),
            metadata=params.get("metadata"),
            if_not_exists="create",
            stream_mode=["values", "updates", "messages-tuple", "events"],
        )
        run = await _start_run(state, thread_id, create)
    elif body.method == "input.respond":
        await _session(state, thread_id)
        run = await _respond(state, thread_id, params)
        if run is None:  # other parked calls wait for their decisions
            return JSONResponse({"type": "success", "id": body.id, "result": {}})
    elif body.method == "state.get":
        info = await _session(state, thread_id)
        values = _values(thread_id, await state.runtime.store.load_messages(info.id))
        return JSONResponse({"type": "success", "id": body.id, "result": {"values": values}})
    else:
        return _protocol_error(
            body.id,
            "unknown_command" if "." not in body.method else "not_supported",
            f"this server does not serve {body.method!r}; it serves run.start, input.respond "
            "and state.get",
        )
    assert run is not None
    before = _follow(state, thread_id, run)
    result = {"type": "success", "id": body.id, "result": {"run_id": run.run_id}}
    return JSONResponse({**result, "meta": {"applied_through_seq": before}})


async def _event_stream(request: Request, thread_id: str, body: EventStreamRequest) -> Response:
    state = state_of(request)
    unknown = [c for c in body.channels if c not in CHANNELS and not c.startswith("custom:")]
    if unknown:
        raise InputError(
            f"unknown channel(s) {', '.join(unknown)}; channels: {', '.join(CHANNELS)}"
        )
    await _session(state, thread_id)
    bus = _buses(state).get(thread_id)
    events = bus.follow(body.channels, body.namespaces, body.since, lambda: state.draining)

    async def sse() -> AsyncIterator[bytes]:
        async for event in events:
            yield encode(event)

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)


@router.post(
    "/threads/{thread_id}/stream/events",
    summary="The thread's events over SSE, filtered by channel (langgraph-sdk threads.stream)",
)
async def thread_events(request: Request, thread_id: str, body: EventStreamRequest) -> Response:
    return await _event_stream(request, thread_id, body)


@router.websocket("/threads/{thread_id}/stream/events")
async def thread_events_ws(websocket: WebSocket, thread_id: str) -> None:
    """The thread's events over a WebSocket (``threads.stream(..., transport="websocket")``):
    the first frame is a ``subscription.subscribe`` command, then every matching event is a
    text frame. Commands still go to ``POST /threads/{id}/commands``. A refusal after the
    handshake closes with 4000 + the HTTP status it stands for (4404: no such thread)."""
    state = view_for(websocket.app.state.loom, websocket.scope.get("loom.principal"))
    await websocket.accept()
    if await state.runtime.store.get_session(thread_id) is None:
        await websocket.close(4404, f"no thread {thread_id!r}")
        return
    try:
        first = await websocket.receive_json()
        command = StreamCommand.model_validate(first)
        if command.method != "subscription.subscribe":
            raise ValueError("the first frame must be a subscription.subscribe command")
        request = EventStreamRequest.model_validate(command.params)
    except WebSocketDisconnect:
        return
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        error = {"type": "error", "id": None, "error": "invalid_argument", "message": str(exc)}
        await websocket.send_json(error)
        await websocket.close(4422, "invalid subscription")
        return
    subscription = str(uuid.uuid4())
    ok = {"type": "success", "id": command.id, "result": {"subscription_id": subscription}}
    await websocket.send_json(ok)
    bus = _buses(state).get(thread_id)
    events = bus.follow(request.channels, request.namespaces, request.since, lambda: state.draining)

    async def inbound() -> None:  # further commands: one subscription per connection here
        while True:
            again = await websocket.receive_json()
            reply = {
                "type": "error",
                "id": again.get("id") if isinstance(again, dict) else None,
                "error": "not_supported",
                "message": "this server serves one subscription per WebSocket; open another",
            }
            await websocket.send_json(reply)

    async def outbound() -> None:
        async for event in events:
            if event is not None:
                await websocket.send_text(json.dumps(event, default=str))

    tasks = [asyncio.ensure_future(inbound()), asyncio.ensure_future(outbound())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(1000)


@router.post(
    "/threads/{thread_id}/stream",
    summary="The thread's events over SSE, filtered by channel (Agent Protocol)",
)
async def thread_stream(request: Request, thread_id: str, body: EventStreamRequest) -> Response:
    return await _event_stream(request, thread_id, body)


@router.get("/errors/{error_id}", summary="A tool error kept in full (seed 001 get_error_detail)")
async def get_error(request: Request, error_id: str) -> dict[str, Any]:
    errors = state_of(request).runtime.capabilities.errors
    if errors is None:
        raise _not_found("this server's store keeps no errors")
    found = await errors.get_error(error_id)
    if found is None:
        raise _not_found(f"no error {error_id!r}")
    out = asdict(found)
    out["timestamp"] = found.timestamp.isoformat()
    return out
