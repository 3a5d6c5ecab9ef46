"""Schedules and cron monitors over HTTP, and the server's scheduler (``loom serve``).

LangGraph's cron endpoints (``client.crons`` of ``langgraph-sdk``): ``POST /runs/crons`` (a new
thread per run), ``POST /threads/{id}/runs/crons`` (runs on that thread), ``POST
/runs/crons/search``, ``POST /runs/crons/count``, ``PATCH`` and ``DELETE /runs/crons/{id}``;
``GET /runs/crons/{id}/runs`` (Loom's: the ticks and what became of them). LangGraph's
``multitask_strategy`` is the overlap policy: ``reject`` → skip, ``enqueue`` → queue,
``interrupt`` / ``rollback`` → cancel.

With API keys a schedule and a monitor belong to the key that made it (``principal``): another
key can neither list, read, change, pause, delete nor check in on it (404, as for an id that
does not exist); an admin key sees them all (``loom.server.ownership``).

Cron monitors: ``POST /monitors``, ``GET /monitors``, ``GET /monitors/{id}``, ``POST
/monitors/{id}/checkins`` (``{"status": "ok" | "error" | "in_progress"}``), ``GET
/monitors/events`` (SSE: every check-in, synthetic ones included, from any process).

The server polls the schedules every ``LOOM_SCHEDULE_POLL`` seconds (default 1;
``LOOM_SCHEDULER=off`` turns the poller off, e.g. when workers fire them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from loom.errors import ConfigurationError, MonitorNotFound, ScheduleNotFound
from loom.schedule import Monitor, MonitorStore, Schedule, ScheduleState, ScheduleStore
from loom.schedule.launch import Launcher, Outcome
from loom.schedule.model import ScheduleRun
from loom.schedule.monitors import MonitorState
from loom.server.app import ServerState, state_of
from loom.server.ownership import (
    Owners,
    current_principal,
    owner_filter,
    owner_name,
    require,
)
from loom.text import whole_number

__all__ = ["OwnedLauncher", "monitors_of", "router"]

log = logging.getLogger("loom.server")
T = TypeVar("T")

_OVERLAP = {"reject": "skip", "enqueue": "queue", "interrupt": "cancel", "rollback": "cancel"}
_STRATEGY = {"skip": "reject", "queue": "enqueue", "cancel": "interrupt"}


class OwnedLauncher:
    """A ``Launcher`` that runs each tick for its schedule's key: the session a tick writes
    is recorded as that key's before the run starts, so the key reads its schedule's runs
    (``Schedule.principal``; a schedule made without keys leaves them to admin keys)."""

    def __init__(self, inner: Launcher, owners: Owners) -> None:
        self.inner, self.owners = inner, owners

    def __getattr__(self, name: str) -> Any:  # the inner launcher's add, reattaches, detach
        return getattr(self.inner, name)

    async def run(self, schedule: Schedule, run: ScheduleRun, run_id: str) -> Outcome:
        session = run.session_id or schedule.session_for(run.tick)
        if schedule.principal is not None and await self.owners.owner_of(session) is None:
            await self.owners.claim_for(session, schedule.principal)
        return await self.inner.run(schedule, run, run_id)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.loom
    scheduler = None
    if os.environ.get("LOOM_SCHEDULER", "on").lower() not in ("off", "0", "false", "no"):
        from loom.evals import online
        from loom.memory.extraction import settings_from_env
        from loom.schedule import RuntimeLauncher, build_scheduler

        # A bad LOOM_MEMORY_EXTRACT* or LOOM_EVAL_ONLINE stops the server here, naming the
        # variable; inside build_scheduler it would be taken for "a store without schedules"
        # and silently turn every schedule off.
        settings_from_env()
        online.settings_from_env()
        owners: Owners | None = state.extra.get("owners")
        launcher = RuntimeLauncher(state.runtime, state.registry)
        try:
            scheduler = await build_scheduler(
                state.runtime,
                state.registry,
                launcher=launcher if owners is None else OwnedLauncher(launcher, owners),
            )
        except ConfigurationError as exc:  # a store that keeps no schedules (MemoryStore)
            log.warning("no scheduler: %s", exc)
        else:
            state.extra["monitors"] = scheduler.monitors
            scheduler.start(float(os.environ.get("LOOM_SCHEDULE_POLL", "1")))
    try:
        yield
    finally:
        if scheduler is not None:
            await scheduler.aclose()


router = APIRouter(tags=["schedules"], lifespan=_lifespan)


_MAX_ROW = 2**62  # row ids and offsets SQLite and PostgreSQL take as 64-bit integers
_MAX_SECONDS = 10 * 366 * 86400.0  # ten years: any longer period is a mistake, not a schedule


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class CronCreate(_Body):
    assistant_id: str
    schedule: str
    input: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    end_time: datetime | None = None
    enabled: bool = True
    timezone: str | None = None
    multitask_strategy: str | None = None


class CronPatch(_Body):
    schedule: str | None = None
    input: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    end_time: datetime | None = None
    enabled: bool | None = None
    timezone: str | None = None


class CronSearch(_Body):
    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None
    # bounded: a number past SQLite's 64-bit integers failed the query (OverflowError, a 500)
    limit: int = Field(10, ge=0, le=10_000)
    offset: int = Field(0, ge=0, le=_MAX_ROW)


class MonitorCreate(_Body):
    id: str | None = None
    name: str = ""
    schedule_id: str | None = None
    cron: str | None = None
    interval: float | None = Field(None, gt=0, le=_MAX_SECONDS)
    timezone: str = "UTC"
    margin: float = Field(60.0, ge=0, le=_MAX_SECONDS)
    max_runtime: float | None = Field(None, gt=0, le=_MAX_SECONDS)


class CheckInBody(_Body):
    status: Literal["ok", "error", "in_progress"] | str


def _schedules(state: ServerState) -> ScheduleStore:
    return ScheduleStore(state.runtime.store, agents=state.registry)


def monitors_of(state: ServerState) -> MonitorStore:
    """The server's one ``MonitorStore`` (the scheduler's when it runs): what subscribes here
    (``monitors_of(state).subscribe(fn)``, e.g. server/webhooks.py at startup) gets every
    health change this server records, from HTTP check-ins, its scheduler's runs and its
    detector. Changes other processes record reach it through ``MonitorStore.follow``."""
    found = state.extra.get("monitors")
    if not isinstance(found, MonitorStore):
        found = state.extra["monitors"] = MonitorStore(state.runtime.store)
    return found


_monitors = monitors_of


async def _own_schedule(store: ScheduleStore, cron_id: str) -> ScheduleState:
    """The schedule, if the request's key may see it; else 404 as for one that is not there."""
    found = await _found(store.get(cron_id))
    await _found(_required("schedule", cron_id, found.schedule.principal))
    return found


async def _own_monitor(monitors: MonitorStore, monitor_id: str) -> MonitorState:
    """The monitor, if the request's key may see it; else 404 as for one that is not there."""
    found = await _found(monitors.get(monitor_id))
    await _found(_required("monitor", monitor_id, found.monitor.principal))
    return found


async def _required(kind: Literal["schedule", "monitor"], rid: str, owner: str | None) -> None:
    require(current_principal.get(), kind, rid, owner)


async def _found(call: Awaitable[T]) -> T:
    try:
        return await call
    except (ScheduleNotFound, MonitorNotFound) as exc:
        raise HTTPException(404, str(exc)) from exc


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def _cron(st: ScheduleState) -> dict[str, Any]:
    s = st.schedule
    payload = s.metadata.get("langgraph_input") or {
        "messages": [{"role": "user", "content": s.message}]
    }
    return {
        "cron_id": s.id,
        "assistant_id": s.agent,
        "thread_id": s.session_id if s.session == "per_schedule" else None,
        "on_run_completed": None,
        "end_time": _iso(s.end_at),
        "schedule": s.cron,
        "timezone": s.timezone,
        "created_at": _iso(s.created_at),
        "updated_at": _iso(st.updated_at),
        "payload": {"input": payload, "multitask_strategy": _STRATEGY[s.overlap]},
        "user_id": s.principal,
        "next_run_date": _iso(st.next_fire_at),
        "metadata": {k: v for k, v in s.metadata.items() if k != "langgraph_input"},
        "enabled": s.enabled,
    }


def _agent_name(state: ServerState, assistant_id: str) -> str:
    from loom.server.runs import agent_named

    return agent_named(state, assistant_id).name


def _message(payload: dict[str, Any] | str | None) -> str:
    from loom.server.runs import last_human

    return last_human(payload) or ""


async def _create(state: ServerState, body: CronCreate, thread_id: str | None) -> dict[str, Any]:
    meta = dict(body.metadata or {})
    if isinstance(body.input, dict):
        meta["langgraph_input"] = body.input
    overlap = _OVERLAP.get(body.multitask_strategy or "reject", "skip")
    schedule = Schedule(
        agent=_agent_name(state, body.assistant_id),
        message=_message(body.input),
        cron=body.schedule,
        timezone=body.timezone or "UTC",
        session="per_schedule" if thread_id else "per_run",
        session_id=thread_id,
        enabled=body.enabled,
        end_at=body.end_time.timestamp() if body.end_time else None,
        overlap=overlap,  # type: ignore[arg-type]
        metadata=meta,
        principal=owner_name(current_principal.get()),
    )
    return _cron(await _schedules(state).add(schedule))


@router.post("/runs/crons", summary="Schedule runs of an assistant, a new thread each")
async def create_cron(request: Request, body: CronCreate) -> dict[str, Any]:
    return await _create(state_of(request), body, None)


@router.post("/threads/{thread_id}/runs/crons", summary="Schedule runs on a thread")
async def create_thread_cron(request: Request, thread_id: str, body: CronCreate) -> dict[str, Any]:
    state = state_of(request)
    owners = state.extra.get("owners")
    if owners is not None:  # the thread its runs go to is this key's from now on
        await owners.check(thread_id, claim_new=True)
    return await _create(state, body, thread_id)


@router.post("/runs/crons/search", summary="Find schedules")
async def search_crons(request: Request, body: CronSearch) -> list[dict[str, Any]]:
    state = state_of(request)
    agent = _agent_name(state, body.assistant_id) if body.assistant_id else None
    found = await _schedules(state).list_schedules(
        agent=agent,
        thread_id=body.thread_id,
        enabled=body.enabled,
        principal=owner_filter(current_principal.get()),
        limit=body.limit,
        offset=body.offset,
    )
    return [_cron(s) for s in found if s.schedule.agent in state.registry]


@router.post("/runs/crons/count", summary="Count schedules")
async def count_crons(request: Request, body: CronSearch) -> int:
    body.limit, body.offset = 0, 0
    return len(await search_crons(request, body))


@router.patch("/runs/crons/{cron_id}", summary="Change a schedule")
async def patch_cron(request: Request, cron_id: str, body: CronPatch) -> dict[str, Any]:
    state = state_of(request)
    store = _schedules(state)
    current = (await _own_schedule(store, cron_id)).schedule
    changes: dict[str, Any] = {}
    if body.schedule is not None:
        changes["cron"] = body.schedule
    if body.timezone is not None:
        changes["timezone"] = body.timezone
    if body.enabled is not None:
        changes["enabled"] = body.enabled
    if "end_time" in body.model_fields_set:
        changes["end_at"] = body.end_time.timestamp() if body.end_time else None
    meta = dict(current.metadata)
    if body.metadata is not None:
        meta.update(body.metadata)
    if body.input is not None:
        changes["message"] = _message(body.input)
        if isinstance(body.input, dict):
            meta["langgraph_input"] = body.input
    changes["metadata"] = meta
    return _cron(await store.update(cron_id, **changes))


@router.delete("/runs/crons/{cron_id}", status_code=204, summary="Delete a schedule")
async def delete_cron(request: Request, cron_id: str) -> Response:
    store = _schedules(state_of(request))
    await _own_schedule(store, cron_id)
    await _found(store.remove(cron_id))
    return Response(status_code=204)


@router.get("/runs/crons/{cron_id}/runs", summary="A schedule's ticks and their runs (Loom)")
async def cron_runs(
    request: Request, cron_id: str, limit: int = Query(100, ge=1, le=10_000)
) -> list[dict[str, Any]]:
    store = _schedules(state_of(request))
    await _own_schedule(store, cron_id)
    return [r.to_dict() for r in await store.schedule_runs(cron_id, limit=limit)]


# -- cron monitors ------------------------------------------------------------------------------
@router.post("/monitors", tags=["monitors"], summary="Create a cron monitor")
async def create_monitor(request: Request, body: MonitorCreate) -> dict[str, Any]:
    state = state_of(request)
    fields = body.model_dump(exclude_none=True)
    fields["principal"] = owner_name(current_principal.get())  # never the body's
    monitor = Monitor(**{k: v for k, v in fields.items() if k in Monitor.__dataclass_fields__})
    if monitor.schedule_id is not None:  # only a schedule this key may see
        await _own_schedule(_schedules(state), monitor.schedule_id)
    return (await _monitors(state).add(monitor)).to_dict()


@router.get("/monitors", tags=["monitors"], summary="Every cron monitor with its health")
async def list_monitors(request: Request) -> list[dict[str, Any]]:
    mine = owner_filter(current_principal.get())
    return [m.to_dict() for m in await _monitors(state_of(request)).list_monitors(principal=mine)]


@router.get(
    "/monitors/events",
    tags=["monitors"],
    summary="Check-ins as server-sent events",
    response_class=StreamingResponse,  # documented as text/event-stream, not JSON
    responses={200: {"content": {"text/event-stream": {}}, "description": "check-in events"}},
)
async def monitor_events(
    request: Request,
    after: int = Query(0, ge=0, le=_MAX_ROW),
    poll: float = Query(0.5, ge=0.05, le=60),
) -> Response:
    monitors = _monitors(state_of(request))
    last = request.headers.get("last-event-id")
    row = whole_number(last or "")
    start = min(row, _MAX_ROW) if row is not None else after

    mine = owner_filter(current_principal.get())

    async def events() -> AsyncIterator[str]:
        cursor = start
        yield ": monitor check-ins\n\n"
        while not await request.is_disconnected():
            found, visible = await monitors.checkins(after=cursor), set[str]()
            if found and mine is not None:  # another key's monitors' check-ins are not sent
                visible = {m.monitor.id for m in await monitors.list_monitors(principal=mine)}
            for c in found:
                cursor = c.id
                if mine is not None and c.monitor_id not in visible:
                    continue
                yield f"id: {c.id}\nevent: checkin\ndata: {json.dumps(c.to_dict())}\n\n"
            await asyncio.sleep(max(0.05, poll))

    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/monitors/{monitor_id}", tags=["monitors"], summary="A monitor and its check-ins")
async def get_monitor(request: Request, monitor_id: str) -> dict[str, Any]:
    monitors = _monitors(state_of(request))
    state = await _own_monitor(monitors, monitor_id)
    recent = await monitors.checkins(monitor_id)
    return {**state.to_dict(), "checkins": [c.to_dict() for c in recent]}


@router.post("/monitors/{monitor_id}/checkins", tags=["monitors"], summary="Check in")
async def checkin(request: Request, monitor_id: str, body: CheckInBody) -> dict[str, Any]:
    monitors = _monitors(state_of(request))
    await _own_monitor(monitors, monitor_id)
    made = await _found(monitors.checkin(monitor_id, body.status))
    return made.to_dict()
