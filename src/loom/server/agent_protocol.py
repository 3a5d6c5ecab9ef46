"""Stateless runs, and the open Agent Protocol's (0.1.6) paths as aliases of the run API.

``POST /runs``, ``/runs/stream`` and ``/runs/wait`` serve both protocols:

- LangGraph's stateless runs (``assistant_id``, no thread): the run gets a fresh thread, which
  is deleted when the run ends (``on_completion: "delete"``, the default) unless the run parked
  on an approval (the thread is kept so that the approval can be answered) or the body says
  ``on_completion: "keep"``. ``langgraph-sdk``'s ``client.runs.stream(None, assistant_id, ...)``
  and ``client.runs.wait(None, ...)`` use them.
- the Agent Protocol's runs (``agent_id``, and ``thread_id`` to run on a thread; ``messages``
  as the input): ``/runs/wait`` then answers ``{"run", "values", "messages"}`` (the protocol's
  ``RunWaitResponse``) instead of LangGraph's bare values.

The aliases (``/agents/...``, ``/runs/{run_id}...``, ``/runs/search``) read the same runs as the
thread paths. A run found by its id alone must be one this process holds (running, or among the
last finished ones) or, on a ``--queue`` server, a queued run (any server finds those); older
runs are read through ``/threads/{thread_id}/runs/{run_id}``.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from loom.errors import InputError, SessionBusy
from loom.server import runs
from loom.server.app import ServerState, state_of
from loom.server.langgraph_api import (
    AssistantSearch,
    HistoryRequest,
    StatelessRunCreate,
    assistant_schemas,
    get_assistant,
    search_assistants,
    thread_history,
)
from loom.server.lg_runs import LgRun
from loom.server.ownership import sees_session
from loom.server.runs import cancel, resume_position, stream_modes

__all__ = ["router"]

# The run helpers live in loom.server.runs; this module's handlers call them by these names.
_Body = runs.ApiBody
_final_values = runs.final_values
_locations = runs.run_locations
_manager = runs.run_manager
_not_found = runs.not_found
_save_patch = runs.save_metadata_patch
_sse = runs.sse_response
_start_run = runs.start_run

router: APIRouter = APIRouter(tags=["agent-protocol"])

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]


class AgentSearch(_Body):
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


class RunSearch(_Body):
    thread_id: str | None = None
    agent_id: str | None = None
    status: RunStatus | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


def _agent_of(assistant: dict[str, Any]) -> dict[str, Any]:
    """An assistant as the Agent Protocol's ``Agent``."""
    return {
        "agent_id": assistant["assistant_id"],
        "name": assistant["name"],
        "description": assistant.get("description") or "",
        "metadata": assistant["metadata"],
        "capabilities": {"ap.io.messages": True, "ap.io.streaming": True},
    }


def _ap_message(m: dict[str, Any]) -> dict[str, Any]:
    role = {"human": "user", "ai": "assistant"}.get(m["type"], m["type"])
    meta = {k: m[k] for k in ("tool_calls", "tool_call_id", "status", "name") if m.get(k)}
    return {"role": role, "content": m["content"], "id": m["id"], "metadata": meta}


def _default_agent(state: ServerState, body: StatelessRunCreate) -> str:
    name = body.assistant_id or body.agent_id
    if name:
        return name
    names = state.registry.names()
    if len(names) == 1:
        return names[0]
    raise InputError(
        "name the agent to run: assistant_id (or agent_id); this server's agents: "
        + ", ".join(names)
    )


async def _start(state: ServerState, body: StatelessRunCreate, background: bool = False) -> LgRun:
    name = _default_agent(state, body)
    if body.input is None and body.messages is not None:
        body = body.model_copy(update={"input": {"messages": body.messages}})
    if body.thread_id is not None:  # the Agent Protocol's run on a thread
        return await _start_run(state, body.thread_id, body, name, background=background)
    thread_id = str(uuid.uuid4())
    body = body.model_copy(update={"if_not_exists": "create"})
    run = await _start_run(state, thread_id, body, name, background=background)
    if body.on_completion == "delete" and run.job_id is None:  # a queued run keeps its thread

        async def delete(run: LgRun) -> None:
            if run.stop_reason == "awaiting_approval":
                return  # keep it: the approval is answered on the thread
            run.final = await _final_values(state, run)
            delete_session = getattr(state.runtime.store, "delete_session", None)
            if delete_session is not None:
                await delete_session(run.thread_id)
                await state.runtime.forget_session_sandbox(run.thread_id)
            await _save_patch(state, run.thread_id, None)

        run.on_end = delete
    return run


async def _held(state: ServerState, run_id: str) -> LgRun:
    run = await runs.held_run(state, run_id)
    if run is None or not await sees_session(state.extra.get("owners"), run.thread_id):
        raise _not_found(
            f"no run {run_id!r} held by this server; read older runs with "
            "GET /threads/{thread_id}/runs/{run_id}"
        )
    return run


async def _wait_response(state: ServerState, run: LgRun) -> dict[str, Any]:
    values = await _final_values(state, run)
    messages = values.get("messages", [])
    return {"run": run.to_dict(), "values": values, "messages": [_ap_message(m) for m in messages]}


# -- stateless runs (and the Agent Protocol's runs) -------------------------------------------
@router.post("/runs", summary="Start a run without a thread (or on body.thread_id), background")
async def create_stateless_run(request: Request, body: StatelessRunCreate) -> JSONResponse:
    run = await _start(state_of(request), body, background=True)
    return JSONResponse(run.to_dict(), headers=_locations(run))


@router.post("/runs/stream", summary="Start a run without a thread (or on body.thread_id), SSE")
async def stream_stateless_run(request: Request, body: StatelessRunCreate) -> Response:
    run = await _start(state_of(request), body)
    return _sse(run, 0, run.stream_modes, body.on_disconnect == "cancel")


@router.post(
    "/runs/wait",
    summary="Start a run without a thread (or on body.thread_id) and wait for its end",
)
async def wait_stateless_run(request: Request, body: StatelessRunCreate) -> JSONResponse:
    state = state_of(request)
    run = await _start(state, body)
    await run.done.wait()
    if body.agent_id is not None and body.assistant_id is None:  # the Agent Protocol's shape
        return JSONResponse(await _wait_response(state, run), headers=_locations(run))
    return JSONResponse(await _final_values(state, run), headers=_locations(run))


# -- runs by id (Agent Protocol) --------------------------------------------------------------
@router.post("/runs/search", summary="Search the runs this server holds")
async def search_runs(request: Request, body: RunSearch) -> list[dict[str, Any]]:
    state = state_of(request)
    owners = state.extra.get("owners")
    runs = [
        r.to_dict()
        for r in list(_manager(state).runs.values())
        if await sees_session(owners, r.thread_id)
        and (body.thread_id is None or r.thread_id == body.thread_id)
        and (body.agent_id is None or r.assistant_id == body.agent_id)
        and (body.status is None or r.status == body.status)
        and all(r.metadata.get(k) == v for k, v in (body.metadata or {}).items())
    ]
    runs.sort(key=lambda r: r["created_at"], reverse=True)
    return runs[body.offset : body.offset + body.limit]


@router.get("/runs/{run_id}", summary="Get a run this server holds")
async def get_run_by_id(request: Request, run_id: str) -> dict[str, Any]:
    return (await _held(state_of(request), run_id)).to_dict()


@router.get("/runs/{run_id}/wait", summary="Wait for a run's end: the run, its values, messages")
async def wait_run_by_id(request: Request, run_id: str) -> dict[str, Any]:
    state = state_of(request)
    run = await _held(state, run_id)
    await run.done.wait()
    return await _wait_response(state, run)


@router.get("/runs/{run_id}/stream", summary="Join a run's stream (Last-Event-ID resumes)")
async def stream_run_by_id(
    request: Request,
    run_id: str,
    stream_mode: list[str] | None = Query(None),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
) -> Response:
    run = await _held(state_of(request), run_id)
    modes = stream_modes(stream_mode, run.stream_modes)
    return _sse(run, resume_position(run, last_event_id), modes, False)


@router.post("/runs/{run_id}/cancel", status_code=204, summary="Cancel a run")
async def cancel_run_by_id(request: Request, run_id: str, wait: bool = False) -> Response:
    state = state_of(request)
    await cancel(state, await _held(state, run_id), wait)
    return Response(status_code=204)


@router.delete("/runs/{run_id}", status_code=204, summary="Forget a finished run")
async def delete_run_by_id(request: Request, run_id: str) -> Response:
    state = state_of(request)
    run = await _held(state, run_id)
    if run.active:
        raise SessionBusy(f"run {run_id!r} is still running; cancel it first")
    await runs.forget_run(state, run)
    return Response(status_code=204)


# -- threads (Agent Protocol) -----------------------------------------------------------------
def checkpoint_uuid(run_id: str) -> str:
    """A thread state's checkpoint id: the run that ended in it, as a UUID (the protocol types
    checkpoint ids so; a run id that is not one, from before run ids were, maps by uuid5)."""
    try:
        return str(uuid.UUID(run_id))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"loom:run:{run_id}"))


@router.get(
    "/threads/{thread_id}/history",
    summary="A thread's past states, newest first (Agent Protocol); before= pages on",
)
async def get_thread_history(
    request: Request,
    thread_id: str,
    limit: int = Query(10, ge=0),
    before: str | None = Query(None, description="A checkpoint_id: only states older than it"),
) -> list[dict[str, Any]]:
    states = await thread_history(request, thread_id, HistoryRequest(limit=1 << 30))
    out = []
    for lg in states:  # newest first
        run_id = lg["metadata"].get("run_id") or lg["checkpoint"]["checkpoint_id"]
        checkpoint = checkpoint_uuid(lg["checkpoint"]["checkpoint_id"])
        if before is not None:
            if checkpoint == before:
                before = None
            continue
        out.append(
            {
                "checkpoint": {"checkpoint_id": checkpoint, "run_id": run_id},
                "values": lg["values"],
                "messages": [_ap_message(m) for m in lg["values"]["messages"]],
                "metadata": {**lg["metadata"], "created_at": lg["created_at"]},
            }
        )
    if before is not None:
        raise _not_found(f"thread {thread_id!r} has no checkpoint {before!r}")
    return out[:limit]


# -- agents (= assistants) --------------------------------------------------------------------
@router.post("/agents/search", summary="Search agents (Agent Protocol)")
async def search_agents(request: Request, body: AgentSearch) -> list[dict[str, Any]]:
    query = AssistantSearch(
        name=body.name, metadata=body.metadata, limit=body.limit, offset=body.offset
    )
    return [_agent_of(a) for a in await search_assistants(request, query)]


@router.get("/agents/{agent_id}", summary="Get an agent (Agent Protocol)")
async def get_agent(request: Request, agent_id: str) -> dict[str, Any]:
    return _agent_of(await get_assistant(request, agent_id))


@router.get("/agents/{agent_id}/schemas", summary="An agent's schemas (Agent Protocol)")
async def agent_schemas(request: Request, agent_id: str) -> dict[str, Any]:
    schemas = await assistant_schemas(request, agent_id)
    schemas["agent_id"] = schemas.pop("graph_id")
    schemas.pop("context_schema", None)
    return schemas
