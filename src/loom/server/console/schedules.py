"""The console's scheduler pages: schedules with their recent runs and monitors, pause and
resume; cron monitors with their health and check-ins, live over SSE.

Everything is read through ``loom.schedule``'s public stores (``ScheduleStore``,
``MonitorStore``), as the schedule API and ``loom schedule`` do; pausing and resuming are
``ScheduleStore.pause`` / ``resume``, what ``loom schedule pause`` / ``resume`` call.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from loom.errors import ConfigurationError, LoomError, MonitorNotFound, ScheduleNotFound
from loom.server.app import ServerState, state_of
from loom.server.console.routes import (
    csrf_refused,
    form_fields,
    page,
    problem,
    router,
    safe_next,
    templates,
)
from loom.server.ownership import current_principal, owner_filter, require, sees
from loom.text import whole_number

_form, _csrf_refused, _next = form_fields, csrf_refused, safe_next  # the handlers' names

if TYPE_CHECKING:
    from loom.schedule import (
        CheckIn,
        MonitorState,
        MonitorStore,
        ScheduleRun,
        ScheduleState,
        ScheduleStore,
    )

__all__ = ["LIVE_POLL", "MonitorView", "ScheduleView"]

RUNS_ON_LIST = 5
"""Recent runs per schedule on the schedules page (the schedule's own page shows more)."""
RUNS_ON_PAGE = 50
CHECKINS_ON_LIST = 5
CHECKINS_ON_PAGE = 20
LIVE_POLL = 0.5
"""Seconds between reads of the check-ins table by the monitors page's stream (every process
writes that table, so tailing it sees check-ins from all of them)."""
_BATCH = 500


@dataclass
class MonitorView:
    """A monitor with its newest check-ins (newest first)."""

    state: MonitorState
    checkins: list[CheckIn]

    @property
    def newest_id(self) -> int:
        return self.checkins[0].id if self.checkins else 0


@dataclass
class ScheduleView:
    """A schedule with its newest runs and the monitors that watch it."""

    state: ScheduleState
    runs: list[ScheduleRun]
    monitors: list[MonitorView] = field(default_factory=list)


def _stores(state: ServerState, *, agents: bool = False) -> tuple[ScheduleStore, MonitorStore]:
    """The store's schedules and monitors (``ConfigurationError`` on a store that keeps none,
    e.g. ``MemoryStore``). ``agents``: refuse to enable a schedule of an agent this server
    does not serve (resume), as the schedule API does; pausing any schedule is allowed."""
    from loom.schedule import MonitorStore, ScheduleStore

    store = state.runtime.store
    schedules = ScheduleStore(store, agents=state.registry if agents else None)
    found = state.extra.get("monitors")  # the poller's own, whose subscribers see changes
    monitors = found if isinstance(found, MonitorStore) else MonitorStore(store)
    return schedules, monitors


async def recent_checkins(monitors: MonitorStore, monitor_id: str, n: int) -> list[CheckIn]:
    """The newest ``n`` check-ins of a monitor, newest first. ``MonitorStore.checkins`` reads
    oldest first from a cursor, so this pages to the end keeping the tail (the ``history``
    job trims old check-ins, which bounds the walk)."""
    tail: deque[CheckIn] = deque(maxlen=n)
    cursor = 0
    while True:
        batch = await monitors.checkins(monitor_id, after=cursor, limit=_BATCH)
        tail.extend(batch)
        if len(batch) < _BATCH:
            return list(reversed(tail))
        cursor = batch[-1].id


async def _monitor_view(monitors: MonitorStore, ms: MonitorState, n: int) -> MonitorView:
    return MonitorView(ms, await recent_checkins(monitors, ms.monitor.id, n))


def _mine() -> str | None:
    """The owner a listing keeps for the request's key (None: all; loom.server.ownership)."""
    return owner_filter(current_principal.get())


def _no_scheduler(request: Request, exc: ConfigurationError) -> Response:
    return page(request, "schedules.html", nav="schedules", views=None, reason=str(exc), jobs=False)


# -- schedules ----------------------------------------------------------------------------------
@router.get("/schedules")
async def schedules_page(request: Request, jobs: bool = False) -> Response:
    state = state_of(request)
    try:
        schedules, monitors = _stores(state)
        found = await schedules.list_schedules(jobs=jobs, limit=500, principal=_mine())
        by_schedule: dict[str, list[MonitorState]] = {}
        for ms in await monitors.list_monitors(principal=_mine()):
            if ms.monitor.schedule_id is not None:
                by_schedule.setdefault(ms.monitor.schedule_id, []).append(ms)
    except ConfigurationError as exc:
        return _no_scheduler(request, exc)
    views = []
    for st in found:
        runs = await schedules.schedule_runs(st.schedule.id, limit=RUNS_ON_LIST)
        watched = [
            await _monitor_view(monitors, ms, CHECKINS_ON_LIST)
            for ms in by_schedule.get(st.schedule.id, [])
        ]
        views.append(ScheduleView(st, runs, watched))
    return page(request, "schedules.html", nav="schedules", views=views, reason="", jobs=jobs)


@router.get("/schedules/{schedule_id}")
async def schedule_page(request: Request, schedule_id: str) -> Response:
    state = state_of(request)
    try:
        schedules, monitors = _stores(state)
        st = await schedules.get(schedule_id)
        require(current_principal.get(), "schedule", schedule_id, st.schedule.principal)
        watched = [
            ms
            for ms in await monitors.list_monitors(principal=_mine())
            if ms.monitor.schedule_id == schedule_id
        ]
    except ConfigurationError as exc:
        return problem(request, 404, "Not found", f"no schedule {schedule_id!r}: {exc}")
    except ScheduleNotFound:
        return problem(request, 404, "Not found", f"no schedule {schedule_id!r}")
    view = ScheduleView(
        st,
        await schedules.schedule_runs(schedule_id, limit=RUNS_ON_PAGE),
        [await _monitor_view(monitors, ms, CHECKINS_ON_PAGE) for ms in watched],
    )
    return page(request, "schedule.html", nav="schedules", v=view)


async def _set_enabled(request: Request, schedule_id: str, enabled: bool) -> Response:
    form = await _form(request)
    refused = _csrf_refused(request, form)
    if refused is not None:
        return refused
    state = state_of(request)
    try:
        schedules, _ = _stores(state, agents=enabled)
        owner = (await schedules.get(schedule_id)).schedule.principal
        require(current_principal.get(), "schedule", schedule_id, owner)
        if enabled:
            await schedules.resume(schedule_id)
        else:
            await schedules.pause(schedule_id)
    except ScheduleNotFound:
        return problem(request, 404, "Not found", f"no schedule {schedule_id!r}")
    except ConfigurationError as exc:
        return problem(request, 404, "Not found", f"no schedule {schedule_id!r}: {exc}")
    except LoomError as exc:  # e.g. resuming a schedule of an agent this server does not serve
        return problem(request, 400, "Refused", str(exc))
    back = _next(form.get("next") or f"/console/schedules/{quote(schedule_id, safe='')}")
    return RedirectResponse(back, 303)


@router.post("/schedules/{schedule_id}/pause")
async def pause(request: Request, schedule_id: str) -> Response:
    """Stop firing a schedule (``ScheduleStore.pause``, as ``loom schedule pause``)."""
    return await _set_enabled(request, schedule_id, False)


@router.post("/schedules/{schedule_id}/resume")
async def resume(request: Request, schedule_id: str) -> Response:
    """Fire a paused schedule again from its next tick (``ScheduleStore.resume``)."""
    return await _set_enabled(request, schedule_id, True)


# -- monitors -----------------------------------------------------------------------------------
@router.get("/monitors")
async def monitors_page(request: Request) -> Response:
    state = state_of(request)
    try:
        _, monitors = _stores(state)
        found = await monitors.list_monitors(principal=_mine())
    except ConfigurationError as exc:
        return page(request, "monitors.html", nav="monitors", views=None, reason=str(exc), after=0)
    views = [await _monitor_view(monitors, ms, CHECKINS_ON_LIST) for ms in found]
    # the stream starts after the newest check-in shown; one landing while this page was read
    # (between two monitors' reads) is caught up by that monitor's next check-in or a reload
    after = max((v.newest_id for v in views), default=0)
    return page(request, "monitors.html", nav="monitors", views=views, reason="", after=after)


@router.get("/monitors/live")
async def monitors_live(request: Request, after: int = 0) -> Response:
    """The monitors page's live updates: for each new check-in (any process's, synthetic ones
    included), its monitor's row rendered again, as SSE in the session page's format (so the
    same script places it)."""
    state = state_of(request)
    try:
        _, monitors = _stores(state)
    except ConfigurationError as exc:
        return problem(request, 404, "Not found", f"no monitors here: {exc}")
    last = request.headers.get("last-event-id")
    row = whole_number(last or "")
    start = row if row is not None else max(0, after)
    row = templates().get_template("_schedules.html").module.monitor_row  # type: ignore[attr-defined]
    principal = current_principal.get()

    async def sse() -> AsyncIterator[bytes]:
        cursor = start
        yield b": monitor check-ins\n\n"
        while True:
            fresh = await monitors.checkins(after=cursor, limit=_BATCH)
            for monitor_id in dict.fromkeys(c.monitor_id for c in fresh):
                try:
                    found = await monitors.get(monitor_id)
                except LoomError:  # removed since: nothing to show
                    continue
                if not sees(principal, found.monitor.principal):
                    continue  # another key's monitor
                view = await _monitor_view(monitors, found, CHECKINS_ON_LIST)
                # "new" replaces the row when the page has it and appends it when not
                part = {
                    "mode": "new",
                    "node": f"monitor-{monitor_id}",
                    "parent": "monitors",
                    "html": str(row(view)),
                }
                data = json.dumps(
                    {"id": str(view.newest_id), "type": "checkin", "parts": [part]},
                    separators=(",", ":"),
                )
                yield f"id: {view.newest_id}\ndata: {data}\n\n".encode()
            if fresh:
                cursor = fresh[-1].id
            if len(fresh) < _BATCH:
                await asyncio.sleep(LIVE_POLL)

    from loom.server.openai_api import EventStream

    return EventStream(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/monitors/{monitor_id}")
async def monitor_page(request: Request, monitor_id: str) -> Response:
    state = state_of(request)
    try:
        _, monitors = _stores(state)
        found = await monitors.get(monitor_id)
        require(current_principal.get(), "monitor", monitor_id, found.monitor.principal)
        view = await _monitor_view(monitors, found, CHECKINS_ON_PAGE)
    except (ConfigurationError, MonitorNotFound):
        return problem(request, 404, "Not found", f"no monitor {monitor_id!r}")
    return page(request, "monitor.html", nav="monitors", m=view)
