"""The run API on the paths of LangGraph's Agent Server, so ``langgraph-sdk`` works unchanged.

Terms: an assistant is a Loom agent (``assistant_id`` = the agent's name, or its UUID form
``uuid5(NAMESPACE_URL, "loom:agent:<name>")``); a thread is a Loom session (``thread_id`` =
``session_id``); a run is one Loom turn (``run_id`` = the turn's run id). A thread's ``values``
are ``{"messages": [...]}``, the session's transcript in LangChain's message form.

``multitask_strategy`` maps onto Loom's ``on_busy``: ``enqueue`` = queue, ``reject`` = drop
(409 while this server runs a turn on the thread), ``interrupt`` and ``rollback`` = interrupt
(Loom keeps what the interrupted turn committed; rollback discards nothing yet).

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
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from loom.agent import Agent
from loom.crew import Crew
from loom.errors import ConfigurationError, InputError, SessionBusy
from loom.events import AgentFinish
from loom.messages import Message
from loom.server.app import ServerState, state_of
from loom.server.lg_runs import (
    ALL_MODES,
    LgRun,
    RunManager,
    interrupts_of,
    lc_message,
    query_interrupts,
    run_status,
)
from loom.server.ownership import ClientId
from loom.server.queued import RUNS_NAMESPACE, JournalTail, RunQueue
from loom.store.base import KVStore, SessionInfo

__all__ = ["router"]

router: APIRouter = APIRouter(tags=["langgraph"])

_KV_META = "loom.server.thread_metadata"
_BUSY = {"enqueue": "queue", "reject": "drop", "interrupt": "interrupt", "rollback": "interrupt"}

MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]


# -- request bodies ---------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class AssistantSearch(_Body):
    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=0)
    offset: int = Field(0, ge=0)


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


class _RunFields(_Body):
    input: dict[str, Any] | str | None = None
    command: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream_mode: str | list[str] = "values"
    multitask_strategy: MultitaskStrategy = "enqueue"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    if_not_exists: Literal["create", "reject"] = "reject"


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
def _manager(state: ServerState) -> RunManager:
    manager = state.extra.get("langgraph_runs")
    if manager is None:
        manager = state.extra["langgraph_runs"] = RunManager(state.runtime.store)
    assert isinstance(manager, RunManager)
    return manager


def _not_found(what: str) -> HTTPException:
    return HTTPException(404, what)


def assistant_uuid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"loom:agent:{name}"))


def _agent(state: ServerState, assistant_id: str) -> Agent:
    found = _served(state, assistant_id)
    if not isinstance(found, Agent):
        raise InputError(f"{assistant_id!r} is a crew; this operation takes an agent")
    return found


def _served(state: ServerState, assistant_id: str) -> Agent | Crew:
    """The agent or crew served as ``assistant_id`` (its name or its UUID form)."""
    registry = state.registry
    found = registry.served(assistant_id)
    if found is not None:
        return found
    for name in registry.names():
        if assistant_uuid(name) == assistant_id:
            served = registry.served(name)
            assert served is not None
            return served
    raise _not_found(
        f"no assistant {assistant_id!r}; this server's assistants: {', '.join(registry.names())}"
    )


def _assistant(agent: Agent | Crew) -> dict[str, Any]:
    now = datetime.fromtimestamp(0, UTC).isoformat()
    if isinstance(agent, Crew):  # a crew: its members where an agent lists its tools
        meta = {
            "loom_uuid": assistant_uuid(agent.name),
            "crew": True,
            "members": list(agent.members),
        }
    else:
        meta = {"loom_uuid": assistant_uuid(agent.name), "tools": list(agent.tools)}
    return {
        "assistant_id": agent.name,
        "graph_id": agent.name,
        "name": agent.name,
        "description": getattr(agent, "description", None) or None,
        "config": {},
        "context": {},
        "metadata": meta,
        "version": 1,
        "created_at": now,
        "updated_at": now,
    }


async def _metadata_patch(state: ServerState, thread_id: str) -> dict[str, Any]:
    kv = state.runtime.capabilities.kv
    if kv is not None:
        value = await kv.get_value(_KV_META, thread_id)
        return dict(value) if isinstance(value, dict) else {}
    patches: dict[str, dict[str, Any]] = state.extra.setdefault("langgraph_meta", {})
    return dict(patches.get(thread_id, {}))


async def _save_patch(state: ServerState, thread_id: str, patch: dict[str, Any] | None) -> None:
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


async def _session(state: ServerState, thread_id: str) -> SessionInfo:
    info = await state.runtime.store.get_session(thread_id)
    if info is None:
        raise _not_found(f"no thread {thread_id!r}; create it with POST /threads")
    return info


async def _metadata(state: ServerState, info: SessionInfo) -> dict[str, Any]:
    return {**info.metadata, **await _metadata_patch(state, info.id)}


def _values(thread_id: str, messages: list[Message]) -> dict[str, Any]:
    return {"messages": [lc_message(m, f"{thread_id}:{i}") for i, m in enumerate(messages)]}


async def _pending(state: ServerState, thread_id: str) -> list[dict[str, Any]]:
    pending = [p.to_dict() for p in await state.runtime.pending_approvals(thread_id)]
    if not pending and state.registry.crews:  # a crew thread waits on its members' calls
        from loom.crew.turn import crew_pending

        pending = await crew_pending(state.runtime.store, thread_id)
    return pending


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
    return {
        "values": _values(thread_id, messages),
        "next": ["tools"] if interrupts else [],
        "tasks": tasks,
        "checkpoint": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id},
        "metadata": metadata,
        "created_at": created_at,
        "parent_checkpoint": None,
        "interrupts": interrupts,
    }


def _last_human(payload: dict[str, Any] | str | None) -> str | None:
    """The newest human message of a LangGraph input (``{"messages": [...]}``)."""
    if payload is None:
        return None
    if isinstance(payload, str):
        return payload
    messages = payload.get("messages")
    if isinstance(messages, dict | str):
        messages = [messages]
    if not isinstance(messages, list):
        raise InputError('input must be {"messages": [{"role": "user", "content": "..."}]}')
    for m in reversed(messages):
        if isinstance(m, str):
            return m
        if isinstance(m, dict) and (m.get("role") or m.get("type")) in ("human", "user"):
            content = m.get("content", "")
            if isinstance(content, list):  # content blocks
                content = "".join(
                    b.get("text", "") if isinstance(b, dict) else str(b) for b in content
                )
            return str(content)
    raise InputError("input.messages holds no human message to run the agent on")


def _modes(stream_mode: str | list[str] | None, default: list[str]) -> list[str]:
    if stream_mode is None or stream_mode == []:
        return default
    modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise InputError(f"unknown stream_mode {unknown[0]!r}; use any of {', '.join(ALL_MODES)}")
    return modes


_background: set[asyncio.Future[Any]] = set()  # aborts sent after a client went (kept alive)


def _queue(state: ServerState) -> RunQueue | None:
    """The run queue of a ``loom serve --queue`` server (None: background runs run here)."""
    queue = state.extra.get("run_queue")
    return queue if isinstance(queue, RunQueue) else None


async def _start_run(
    state: ServerState,
    thread_id: str,
    body: _RunFields,
    assistant_id: str | None = None,
    *,
    background: bool = False,
) -> LgRun:
    """Start a run on ``thread_id``: here, or (a background run on a ``--queue`` server) as a
    job of the queue."""
    agent = _served(state, assistant_id or getattr(body, "assistant_id", None) or "")
    modes = _modes(body.stream_mode, ["values"])
    store = state.runtime.store
    info = await store.get_session(thread_id)
    if info is None:
        if body.if_not_exists != "create":
            raise _not_found(
                f"no thread {thread_id!r}; create it with POST /threads or pass "
                '"if_not_exists": "create"'
            )
        await store.create_session(thread_id, agent_name=agent.name)
    manager = _manager(state)
    queue = _queue(state)
    if isinstance(agent, Crew):  # a crew runs in this process, also on a --queue server
        return await _start_crew_run(state, thread_id, agent, body, modes)
    if queue is not None and background and not body.command:
        return await _enqueue(state, queue, thread_id, agent, body, modes)
    if body.multitask_strategy == "reject" and manager.active_on(thread_id):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run; wait for it (GET .../runs/{{id}}/join), "
            'or use multitask_strategy "enqueue" or "interrupt"'
        )
    runtime = state.runtime
    if body.command and "answer" in body.command:  # the client answers a server query
        turn = await runtime.prepare_answer(
            agent, thread_id, body.command["answer"], query_id=body.command.get("query_id")
        )
    elif body.command and "resume" in body.command:
        if isinstance(body.command["resume"], str) and await runtime.pending_query(thread_id):
            turn = await runtime.prepare_answer(agent, thread_id, body.command["resume"])
        else:
            turn = await runtime.prepare_resume(agent, thread_id, body.command["resume"], None)
    else:
        message = _last_human(body.input)
        if message is None:
            raise InputError('a run needs input {"messages": [...]} or command {"resume": ...}')
        on_busy = _BUSY[body.multitask_strategy]
        turn = runtime.prepare(agent, message, thread_id, on_busy, None)
    patch = await _metadata_patch(state, thread_id)
    if patch.get("assistant_id") != agent.name:
        await _save_patch(
            state, thread_id, {**patch, "assistant_id": agent.name, "graph_id": agent.name}
        )
    run = LgRun(
        turn.run_id,
        thread_id,
        agent.name,
        body.multitask_strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
    )
    manager.start(run, turn)
    return run


async def _start_crew_run(
    state: ServerState, thread_id: str, crew: Crew, body: _RunFields, modes: list[str]
) -> LgRun:
    """A run of ``crew`` on ``thread_id`` (the crew's session): a ``CrewTurn`` driven by the run
    manager like a turn, framed by ``CrewFrameMaker`` (member frames tagged with their path)."""
    from loom.server.lg_crews import CrewFrameMaker
    from loom.server.lifecycle import ServerRuntime

    manager = _manager(state)
    runtime = state.runtime
    if body.multitask_strategy == "reject" and manager.active_on(thread_id):
        raise SessionBusy(
            f"thread {thread_id!r} is running a run; wait for it (GET .../runs/{{id}}/join), "
            'or use multitask_strategy "enqueue" or "interrupt"'
        )
    if body.command and "answer" in body.command:
        raise InputError(f"{crew.name!r} is a crew; a crew asks no server queries to answer")
    if body.command and "resume" in body.command:
        turn = await crew.prepare_resume(runtime, thread_id, body.command["resume"])
    else:
        message = _last_human(body.input)
        if message is None:
            raise InputError('a run needs input {"messages": [...]} or command {"resume": ...}')
        turn = crew.prepare(runtime, message, session_id=thread_id)
    if body.multitask_strategy in ("interrupt", "rollback"):  # the new run waits for their end
        for other in manager.active_on(thread_id):
            other.cancel.set()
    if isinstance(runtime, ServerRuntime):  # limits and graceful shutdown, as for a turn
        runtime.track(turn)
    patch = await _metadata_patch(state, thread_id)
    if patch.get("assistant_id") != crew.name:
        await _save_patch(
            state, thread_id, {**patch, "assistant_id": crew.name, "graph_id": crew.name}
        )
    run = LgRun(
        turn.run_id,
        thread_id,
        crew.name,
        body.multitask_strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
    )
    run.maker = CrewFrameMaker(thread_id, turn.run_id, crew.name, crew.name)
    manager.start(run, turn)
    return run


async def _enqueue(
    state: ServerState,
    queue: RunQueue,
    thread_id: str,
    agent: Agent,
    body: _RunFields,
    modes: list[str],
) -> LgRun:
    """A background run as a job of the queue; this server tails it like any other."""
    message = _last_human(body.input)
    if message is None:
        raise InputError('a run needs input {"messages": [...]} or command {"resume": ...}')
    manager = _manager(state)
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
    patch = await _metadata_patch(state, thread_id)
    if patch.get("assistant_id") != agent.name:
        await _save_patch(
            state, thread_id, {**patch, "assistant_id": agent.name, "graph_id": agent.name}
        )
    run = LgRun(
        f"run_{uuid.uuid4().hex}",
        thread_id,
        agent.name,
        strategy,
        modes,
        metadata=dict(body.metadata or {}),
        on_disconnect=body.on_disconnect,
    )
    run.job_id = await queue.enqueue(agent.name, thread_id, message, run.run_id)
    # before the client hears of the run id: any server it asks finds the job by it
    await _kv(state).put_value(
        RUNS_NAMESPACE,
        run.run_id,
        {
            "thread_id": thread_id,
            "assistant_id": agent.name,
            "job": run.job_id,
            "created_at": run.created_at.isoformat(),
            "multitask_strategy": strategy,
            "metadata": run.metadata,
            "stream_mode": modes,
            "on_disconnect": body.on_disconnect,
        },
    )
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
    _manager(state).attach(run, tail)
    return tail


async def _queued_run(state: ServerState, run_id: str, thread_id: str | None) -> LgRun | None:
    """A queued run this process does not hold, followed from the journal from now on."""
    queue = _queue(state)
    if queue is None:
        return None
    mapping = await _kv(state).get_value(RUNS_NAMESPACE, run_id)
    if not isinstance(mapping, dict) or mapping.get("job") is None:
        return None
    if thread_id is not None and mapping["thread_id"] != thread_id:
        return None
    run = LgRun(
        run_id,
        mapping["thread_id"],
        mapping["assistant_id"],
        mapping["multitask_strategy"],
        list(mapping["stream_mode"]),
        metadata=dict(mapping["metadata"]),
        on_disconnect=mapping["on_disconnect"],
        job_id=int(mapping["job"]),
    )
    run.created_at = datetime.fromisoformat(mapping["created_at"])
    tail = _tail(state, queue, run)
    await tail.caught_up.wait()  # its status is current before anyone reads it
    return run


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


def _locations(run: LgRun) -> dict[str, str]:
    base = f"/threads/{quote(run.thread_id, safe='')}/runs/{run.run_id}"
    return {"Location": f"{base}/stream", "Content-Location": base}


def _sse(run: LgRun, start: int, modes: list[str], cancel_on_disconnect: bool) -> Response:
    wanted = set(modes)

    async def frames() -> Any:
        finished = False
        try:
            async for f in run.follow(start):
                if f.mode is None or f.mode in wanted:
                    yield f.encode()
            finished = True
        finally:
            if not finished and cancel_on_disconnect and run.active:
                stopping = run.stop()
                if stopping is not None:  # a queued run: its job is aborted in the background
                    _background.add(asyncio.ensure_future(stopping))
                    _background.difference_update([t for t in _background if t.done()])

    headers = {**_locations(run), "Cache-Control": "no-store"}
    return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)


async def _final_values(state: ServerState, run: LgRun) -> dict[str, Any]:
    if run.final is not None:  # a stateless run whose thread is deleted
        return run.final
    values: dict[str, Any] = _values(
        run.thread_id, await state.runtime.store.load_messages(run.thread_id)
    )
    if run.stop_reason == "awaiting_approval":
        values["__interrupt__"] = interrupts_of(await _pending(state, run.thread_id))
    elif run.stop_reason == "awaiting_input":
        query = await state.runtime.pending_query(run.thread_id)
        if query is not None:
            values["__interrupt__"] = query_interrupts(run.thread_id, query.to_dict())
    if run.status == "error":
        values["__error__"] = {"error": "RunError", "message": run.error or "the run failed"}
    return values


async def _find_run(state: ServerState, thread_id: str, run_id: str) -> LgRun:
    manager = _manager(state)
    run = manager.get(run_id)
    if run is not None and run.thread_id == thread_id:
        return run
    queued = await _queued_run(state, run_id, thread_id)
    if queued is not None:
        return queued
    info = await _session(state, thread_id)
    assistant = (await _metadata(state, info)).get("assistant_id") or info.agent_name
    replayed = await manager.replay(thread_id, run_id, str(assistant))
    if replayed is None:
        raise _not_found(f"thread {thread_id!r} has no run {run_id!r}")
    return replayed


# -- assistants -------------------------------------------------------------------------------
@router.post("/assistants/search", summary="Search assistants (the served agents)")
async def search_assistants(request: Request, body: AssistantSearch) -> list[dict[str, Any]]:
    state = state_of(request)
    served: list[Agent | Crew] = [*state.registry.values(), *state.registry.crews.values()]
    found = [
        _assistant(a)
        for a in served
        if (body.graph_id is None or a.name == body.graph_id)
        and (body.name is None or body.name.lower() in a.name.lower())
    ]
    if body.metadata:
        found = [
            a for a in found if all(a["metadata"].get(k) == v for k, v in body.metadata.items())
        ]
    return found[body.offset : body.offset + body.limit]


@router.post("/assistants/count", summary="Count assistants")
async def count_assistants(request: Request, body: AssistantSearch) -> int:
    return len(await search_assistants(request, body.model_copy(update={"limit": 1 << 30})))


@router.get("/assistants/{assistant_id}", summary="Get an assistant (an agent, by name)")
async def get_assistant(request: Request, assistant_id: str) -> dict[str, Any]:
    return _assistant(_served(state_of(request), assistant_id))


@router.get("/assistants/{assistant_id}/schemas", summary="An assistant's input/output schemas")
async def assistant_schemas(request: Request, assistant_id: str) -> dict[str, Any]:
    agent = _served(state_of(request), assistant_id)
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
    return await _thread(state, info)


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


@router.get("/threads/{thread_id}", summary="Get a thread")
async def get_thread(request: Request, thread_id: str) -> dict[str, Any]:
    state = state_of(request)
    return await _thread(state, await _session(state, thread_id))


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
    await _save_patch(state, thread_id, None)
    manager.forget_thread(thread_id)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/state", summary="A thread's current state (its messages)")
async def thread_state(request: Request, thread_id: str) -> dict[str, Any]:
    state = state_of(request)
    info = await _session(state, thread_id)
    runs = [
        e.run_id
        for e in await state.runtime.store.load_events(thread_id)
        if isinstance(e, AgentFinish)
    ]
    return _thread_state(
        thread_id,
        await state.runtime.store.load_messages(thread_id),
        await _metadata(state, info),
        runs[-1] if runs else None,
        await _pending(state, thread_id),
        info.updated_at.isoformat(),
    )


@router.post("/threads/{thread_id}/history", summary="A thread's states, one per run, newest first")
async def thread_history(
    request: Request, thread_id: str, body: HistoryRequest
) -> list[dict[str, Any]]:
    state = state_of(request)
    info = await _session(state, thread_id)
    meta = await _metadata(state, info)
    messages: list[Message] = []
    states = []
    for ev in await state.runtime.store.load_events(thread_id):
        m = ev.message()
        if m is not None:
            messages.append(m)
        if isinstance(ev, AgentFinish):
            pending = [{**p, "session_id": thread_id} for p in ev.pending_approvals]
            at = datetime.fromtimestamp(ev.timestamp, UTC).isoformat()
            states.append(_thread_state(thread_id, list(messages), meta, ev.run_id, pending, at))
    if states:  # approvals decided since are no longer pending
        states[-1]["interrupts"] = interrupts_of(await _pending(state, thread_id))
        states[-1]["next"] = ["tools"] if states[-1]["interrupts"] else []
        if not states[-1]["interrupts"]:
            states[-1]["tasks"] = []
    return list(reversed(states))[: body.limit]


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
    return JSONResponse(await _final_values(state, run), headers=_locations(run))


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
    modes = _modes(stream_mode, run.stream_modes)
    try:
        start = run.start_at(last_event_id)
    except ValueError as exc:
        raise InputError(f"{exc}; reconnect without Last-Event-ID to read the whole run") from None
    return _sse(run, start, modes, cancel_on_disconnect)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", summary="Cancel a run")
async def cancel_run(
    request: Request,
    thread_id: str,
    run_id: str,
    wait: bool = False,
    action: Literal["interrupt", "rollback"] = "interrupt",
) -> Response:
    state = state_of(request)
    await cancel(state, await _find_run(state, thread_id, run_id), wait)
    return Response(status_code=204)


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204, summary="Forget a run")
async def delete_run(request: Request, thread_id: str, run_id: str) -> Response:
    state = state_of(request)
    run = await _find_run(state, thread_id, run_id)
    if run.active:
        raise SessionBusy(f"run {run_id!r} is still running; cancel it first")
    manager = _manager(state)
    manager.runs.pop(run_id, None)
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
    decided[call_id] = decision
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
    "/threads/{thread_id}/commands",
    status_code=202,
    summary="Answer the thread's server query; the turn goes on as a new run",
)
async def answer_query(request: Request, thread_id: str, body: QueryAnswerBody) -> JSONResponse:
    state = state_of(request)
    info = await _session(state, thread_id)
    if _manager(state).active_on(thread_id):
        raise SessionBusy(f"thread {thread_id!r} is running a run; answer after it ends")
    if await state.runtime.pending_query(thread_id) is None:
        raise InputError(f"thread {thread_id!r} has no server query waiting for an answer")
    assistant = (await _metadata(state, info)).get("assistant_id") or info.agent_name
    command: dict[str, Any] = {"answer": body.answer}
    if body.query_id is not None:
        command["query_id"] = body.query_id
    modes = body.stream_mode or ["values", "updates", "messages-tuple", "events"]
    create = RunCreate(assistant_id=str(assistant), command=command, stream_mode=modes)
    run = await _start_run(state, thread_id, create)
    return JSONResponse(
        {"status": "answered", "run": run.to_dict()}, status_code=202, headers=_locations(run)
    )


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


# Stateless runs and the Agent Protocol's aliases share these helpers; served by this router.
from loom.server.agent_protocol import router as _agent_protocol  # noqa: E402

router.include_router(_agent_protocol)
