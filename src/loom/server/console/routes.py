"""The console's pages: sessions, a session's transcript and timeline (live over SSE),
approvals, runs and stored errors (the scheduler's pages are in ``schedules.py``).
Server-rendered with Jinja2 (autoescaped: model and tool output is text, never markup); forms
carry a CSRF token."""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from loom.errors import LoomError, SessionBusy, SessionNotFound
from loom.events import (
    AgentEvent,
    AgentFinish,
    AgentStart,
    ApprovalDecisionEvent,
    ApprovalRequired,
    SessionBranch,
)
from loom.server.app import ServerState, state_of
from loom.server.console import auth
from loom.server.console.timeline import MEDIA_REF, Change, Timeline, cost_of, part_views
from loom.server.ownership import unscoped_session_id
from loom.server.session_events import Lagged, event_id, session_events, sse_id
from loom.text import whole_number

if TYPE_CHECKING:
    from jinja2 import Environment

    from loom.engine.branching import Branching
    from loom.messages import Message
    from loom.server.security import Principal
    from loom.store.base import RunRecord, SessionInfo

__all__ = [
    "RUNS_PER_PAGE",
    "ConsoleRoute",
    "csrf_refused",
    "form_fields",
    "not_found",
    "render_session",
    "router",
    "safe_next",
]

HERE = Path(__file__).parent
RUNS_PER_PAGE = 50
"""Runs of a session shown per page (the newest first page); older pages by ``?page=``."""
SEARCH_SCAN = 500
"""Sessions (newest first) whose messages a text search reads."""


class ConsoleRoute(APIRoute):
    """A console route whose refusals are pages: a bad query parameter or form field (FastAPI's
    validation error) and an ``HTTPException`` answer an HTML error page, never the API's
    JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as exc:
                return problem(request, 422, "Bad request", _invalid(exc))
            except HTTPException as exc:
                title = "Not found" if exc.status_code == 404 else "Refused"
                return problem(request, exc.status_code, title, str(exc.detail))

        return handler


def _invalid(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error.get("loc", ()) if x not in ("query", "path", "body"))
        parts.append(f"{where or 'the request'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) + ". Fix the address (or go back) and try again."


router = APIRouter(prefix="/console", include_in_schema=False, route_class=ConsoleRoute)


@functools.cache
def templates() -> Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: output is text, never markup
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["ms"] = _ms
    env.filters["cost"] = _cost
    env.filters["pretty"] = _pretty
    env.filters["sid"] = unscoped_session_id  # a key's own session by the id it gave it
    env.filters["part_views"] = part_views  # a message's media and reasoning as shown
    return env


def _when(ts: float | datetime | None) -> str:
    if ts is None:
        return ""
    dt = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms(value: float | None) -> str:
    if value is None:
        return "…"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _cost(value: float | None) -> str:
    return "" if value is None else f"${value:.4f}"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# -- responses --------------------------------------------------------------------------------
def _principal(request: Request) -> Principal | None:
    p: Principal | None = request.scope.get("loom.principal")
    return p


def _keys_on(state: ServerState) -> bool:
    security = state.extra.get("security")
    return bool(security is not None and security.keys)


def page(request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
    """Render a page with what every page needs (the key, the CSRF token, the open banner)."""
    state: ServerState = request.app.state.loom
    seed = request.cookies.get(auth.CSRF_COOKIE)
    fresh = seed is None
    if seed is None:
        seed = secrets.token_urlsafe(32)
    principal = _principal(request)
    html = (
        templates()
        .get_template(name)
        .render(
            request=request,
            principal=principal,
            keys_on=_keys_on(state),
            csrf=auth.csrf_token(seed, principal, auth.secret_of(state)),
            **context,
        )
    )
    response = HTMLResponse(html, status_code=code)
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    if fresh:
        response.set_cookie(
            auth.CSRF_COOKIE,
            seed,
            httponly=True,
            samesite="strict",
            path="/console",
            secure=request.url.scheme == "https",
        )
    return response


def problem(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    """A 403 / 404 / 409 page."""
    return page(request, "problem.html", status, title=title, message=message)


async def form_fields(request: Request) -> dict[str, str]:
    """A posted form's text fields."""
    form = await request.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


def csrf_refused(request: Request, form: dict[str, str]) -> HTMLResponse | None:
    """The 403 page for a form without this browser's CSRF token; None when the token is good."""
    state: ServerState = request.app.state.loom
    seed = request.cookies.get(auth.CSRF_COOKIE)
    if auth.csrf_ok(form.get("csrf_token"), seed, _principal(request), auth.secret_of(state)):
        return None
    return problem(
        request,
        403,
        "Forbidden",
        "this form's CSRF token is missing or wrong (an old page, another browser, or a request "
        "from another site); reload the page and submit the form again",
    )


# this module's handlers call them by these names
_form, _csrf_refused = form_fields, csrf_refused


# -- login ------------------------------------------------------------------------------------
def safe_next(target: str | None) -> str:
    """Where to go after a form: ``target`` when it is a console page, else the sessions list
    (only pages of this console: never an open redirect)."""
    if target and target.startswith("/console") and not target.startswith("//"):
        return target
    return "/console/sessions"


_next = safe_next


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    return page(request, "login.html", next=_next(next), failed=False)


@router.post("/login")
async def login(request: Request) -> Response:
    state: ServerState = request.app.state.loom
    form = await _form(request)
    refused = _csrf_refused(request, form)
    if refused is not None:
        return refused
    target = _next(form.get("next"))
    security = state.extra.get("security")
    if security is None or not security.keys:
        return RedirectResponse(target, 303)
    principal = security.keys.match(form.get("api_key", "").strip())
    if principal is None:
        return page(request, "login.html", 401, next=target, failed=True)
    response = RedirectResponse(target, 303)
    response.set_cookie(
        auth.COOKIE,
        auth.login_cookie(principal, auth.secret_of(state)),
        max_age=auth.MAX_AGE,
        httponly=True,
        samesite="strict",
        path="/console",
        secure=request.url.scheme == "https",
    )
    # a new CSRF seed with the new login, so a token from before the login is void
    response.set_cookie(
        auth.CSRF_COOKIE,
        secrets.token_urlsafe(32),
        httponly=True,
        samesite="strict",
        path="/console",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    refused = _csrf_refused(request, await _form(request))
    if refused is not None:
        return refused
    response = RedirectResponse("/console/login", 303)
    response.delete_cookie(auth.COOKIE, path="/console")
    return response


# -- sessions ---------------------------------------------------------------------------------
@router.get("")
@router.get("/")
async def home() -> Response:
    return RedirectResponse("/console/sessions", 303)


async def _runs_of(state: ServerState, session_id: str) -> list[RunRecord]:
    records = getattr(state.runtime.store, "list_runs", None)
    return list(await records(session_id)) if records is not None else []


def _latest(records: list[RunRecord]) -> dict[str, RunRecord]:
    """Each run's last record (its end when it ended), oldest run first."""
    out: dict[str, RunRecord] = {}
    for rec in records:
        out[rec.run_id] = rec
    return out


async def _status(
    state: ServerState, session_id: str, records: list[RunRecord] | None = None
) -> str:
    """The session's last run's status (``running`` or its stop reason), ``new`` before any."""
    if records is None:
        records = await _runs_of(state, session_id)
    return records[-1].status if records else "new"


async def _matches(state: ServerState, info: SessionInfo, q: str) -> bool:
    if q in info.id.lower() or q in info.agent_name.lower():
        return True
    messages = await state.runtime.store.load_messages(info.id)
    return any(q in m.content.lower() for m in messages)


@router.get("/sessions")
async def sessions(request: Request, q: str = "", status: str = "") -> Response:
    state = state_of(request)
    infos = sorted(
        await state.runtime.store.list_sessions(limit=SEARCH_SCAN),
        key=lambda i: i.updated_at,
        reverse=True,
    )
    needle = q.strip().lower()
    rows = []
    for info in infos:
        if needle and not await _matches(state, info, needle):
            continue
        st = await _status(state, info.id)
        if status and st != status:
            continue
        rows.append({"info": info, "status": st})
        if len(rows) >= 200:
            break
    return page(
        request,
        "sessions.html",
        rows=rows,
        q=q,
        status=status,
        nav="sessions",
        statuses=[
            "running",
            "completed",
            "awaiting_approval",
            "awaiting_input",
            "error",
            "model_error",
            "timeout",
            "cancelled",
            "crashed",
        ],
    )


def _pages(run_ids: list[str], page_no: int) -> tuple[list[str], int, int]:
    """The runs on page ``page_no`` (0 = the newest ``RUNS_PER_PAGE``), the page shown (clamped)
    and how many pages there are."""
    pages = max(1, -(-len(run_ids) // RUNS_PER_PAGE))
    page_no = min(max(page_no, 0), pages - 1)
    hi = len(run_ids) - page_no * RUNS_PER_PAGE
    return run_ids[max(0, hi - RUNS_PER_PAGE) : hi], page_no, pages


async def _shown_events(
    state: ServerState, session_id: str, page_no: int, records: list[RunRecord]
) -> tuple[list[AgentEvent], int, int, str]:
    """The events of the runs on one page, the page, the page count and the session's last
    event id. With run records (every store Loom ships) only the shown runs' events are read:
    a 1,000-turn session does not decode 30,000 events to show 50 runs."""
    store = state.runtime.store
    if records:
        run_ids = list(_latest(records))
        shown_ids, page_no, pages = _pages(run_ids, page_no)
        shown: list[AgentEvent] = []
        for run_id in shown_ids:
            shown.extend(await store.load_events(session_id, run_id))
        last = await store.load_events(session_id, run_ids[-1]) if page_no else shown
        return shown, page_no, pages, event_id(last[-1]) if last else ""
    events = await store.load_events(session_id)
    shown_ids, page_no, pages = _pages(list(dict.fromkeys(e.run_id for e in events)), page_no)
    keep = set(shown_ids)
    return (
        [e for e in events if e.run_id in keep],
        page_no,
        pages,
        event_id(events[-1]) if events else "",
    )


async def render_session(request: Request, session_id: str, page_no: int = 0) -> Response:
    """The session page (also what ``benchmarks/console.py`` times)."""
    state = state_of(request)
    store = state.runtime.store
    try:
        info = await store.get_session(session_id)
    except SessionNotFound:
        info = None
    if info is None:
        return problem(request, 404, "Not found", f"no session {session_id!r}")
    records = await _runs_of(state, session_id)
    shown, page_no, pages, after = await _shown_events(state, session_id, page_no, records)
    timeline = Timeline(session_id).extend(shown)
    messages: list[Message] = [m for e in shown if (m := e.message()) is not None]
    branchings = await _branchings(state, session_id)
    if branchings:  # the transcript is what the branches left (the rest is shown folded)
        messages = await store.load_messages(session_id)
    status = await _status(state, session_id, records)
    # calls wait for a decision only after a run stopped for them (a new message expires them)
    pending = await _pending(state, session_id) if status == "awaiting_approval" else []
    total_cost = _sum_costs(timeline)
    agent = next((r.agent for r in reversed(timeline.runs) if r.agent), info.agent_name)
    crew_session = str(info.metadata.get("crew_session") or "")  # a crew member's session
    from loom.evals.online import online_scores

    evals = await online_scores(store, [r.run_id for r in timeline.runs])
    return page(
        request,
        "session.html",
        nav="sessions",
        info=info,
        timeline=timeline,
        messages=messages,
        pending=pending,
        page_no=page_no,
        pages=pages,
        status=status,
        total_cost=total_cost,
        agent=agent,
        after=after,
        crew_session=crew_session,
        crew_path=str(info.metadata.get("path") or ""),
        running=_running(records),
        branchings=branchings,
        last_user=_last_user(messages),
        evals=evals,
    )


async def _branchings(state: ServerState, session_id: str) -> list[Branching]:
    """The session's branches (``loom.engine.branching``), each with what it abandoned. A
    session without any costs one indexed read of its ``SESSION_BRANCH`` events; one with
    some has its journal read whole (the abandoned turns are derived from it)."""
    from loom.engine.branching import branches_of
    from loom.events import EventType

    store = state.runtime.store
    typed = state.runtime.capabilities.typed_events
    if typed is not None and not await typed.load_events_of_type(
        session_id, [EventType.SESSION_BRANCH]
    ):
        return []
    return branches_of(await store.load_events(session_id))


def _last_user(messages: list[Message]) -> dict[str, Any] | None:
    """The last user message and its turn (what regenerate and edit-and-resend act on)."""
    turns = [m for m in messages if m.role == "user"]
    if not turns:
        return None
    return {"turn": len(turns) - 1, "text": turns[-1].content}


def _running(records: list[RunRecord]) -> list[str]:
    """The runs of the session whose last record says ``running`` (the cancel buttons)."""
    return [run_id for run_id, rec in _latest(records).items() if rec.status == "running"]


async def _pending(state: ServerState, session_id: str) -> list[dict[str, Any]]:
    """The calls the session waits on: its own parked calls, or a crew session's members'
    (each with its ``member_path`` and ``child_session_id``; deciding one here routes it to the
    member, as ``Crew.resume`` does)."""
    own = [p.to_dict() for p in await state.runtime.pending_approvals(session_id)]
    if own:
        return own
    from loom.crew.turn import crew_pending

    return await crew_pending(state.runtime.store, session_id)


def _sum_costs(timeline: Timeline) -> float | None:
    costs = [r.cost for r in timeline.runs if r.cost is not None]
    return sum(costs) if costs else None


def _fragment(change: Change, timeline: Timeline) -> dict[str, Any]:
    node = change.node
    macro = type(node).__name__.removesuffix("Node").lower()
    html = getattr(templates().get_template("_nodes.html").module, macro)(node)
    parent = change.parent.dom_id if change.parent is not None else "timeline"
    return {"mode": change.kind, "node": node.dom_id, "parent": parent, "html": str(html)}


def _csrf_of(state: ServerState, request: Request) -> str:
    seed = request.cookies.get(auth.CSRF_COOKIE) or ""
    return auth.csrf_token(seed, _principal(request), auth.secret_of(state))


async def _approvals_html(state: ServerState, request: Request, session_id: str) -> str:
    pending = await _pending(state, session_id)
    module = templates().get_template("_nodes.html").module
    csrf = _csrf_of(state, request)
    return str(module.approvals(pending, session_id, csrf))  # type: ignore[attr-defined]


async def _actions_html(state: ServerState, request: Request, session_id: str) -> str:
    running = _running(await _runs_of(state, session_id))
    module = templates().get_template("_nodes.html").module
    csrf = _csrf_of(state, request)
    return str(module.actions(session_id, running, csrf))  # type: ignore[attr-defined]


@router.get("/sessions/{session_id:path}/live")
async def session_live(
    request: Request,
    session_id: str,
    after: str = "",
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
) -> Response:
    """The page's live updates: each event after ``after`` as the HTML of the nodes it changed
    (rendered by the same templates as the page), as SSE."""
    state = state_of(request)
    store = state.runtime.store
    try:
        info = await store.get_session(session_id)
    except SessionNotFound:
        info = None
    if info is None:
        return problem(request, 404, "Not found", f"no session {session_id!r}")
    after = last_event_id or after  # a browser reconnecting says where it stopped
    events = session_events(state.hub, store, session_id)
    module = templates().get_template("_nodes.html").module

    async def sse() -> AsyncIterator[bytes]:
        timeline = Timeline(session_id)
        sending = not after
        count = 0  # the session's messages so far: the header's count follows them
        try:
            async for ev, replayed in events:
                changes = timeline.add(ev)
                m = ev.message()
                count += m is not None
                if not sending and not replayed:
                    sending = True  # the page's last event is past: everything live is new
                if sending and isinstance(ev, SessionBranch):
                    # the transcript lost messages: the page is drawn again, with the branch
                    yield b"event: reload\ndata: {}\n\n"
                    return
                if sending:
                    parts = [_fragment(c, timeline) for c in changes]
                    if m is not None:
                        html = str(module.message(m, session_id))  # type: ignore[attr-defined]
                        parts.append(
                            {"mode": "new", "node": "", "parent": "transcript", "html": html}
                        )
                        parts.append(
                            {
                                "mode": "text",
                                "node": "message-count",
                                "parent": "",
                                "html": str(count),
                            }
                        )
                    if isinstance(
                        ev, AgentStart | AgentFinish | ApprovalRequired | ApprovalDecisionEvent
                    ):
                        html = await _approvals_html(state, request, session_id)
                        parts.append(
                            {"mode": "update", "node": "approvals", "parent": "", "html": html}
                        )
                    if isinstance(ev, AgentStart | AgentFinish):
                        status = ev.stop_reason if isinstance(ev, AgentFinish) else "running"
                        parts.append(
                            {"mode": "text", "node": "session-status", "parent": "", "html": status}
                        )
                        html = await _actions_html(state, request, session_id)
                        parts.append(
                            {"mode": "update", "node": "actions", "parent": "", "html": html}
                        )
                    if parts:
                        data = json.dumps(
                            {"id": event_id(ev), "type": str(ev.type), "parts": parts},
                            separators=(",", ":"),
                        )
                        yield f"{sse_id(ev)}data: {data}\n\n".encode()
                elif event_id(ev) == after:
                    sending = True
        except Lagged:
            yield b"event: reload\ndata: {}\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await events.aclose()

    from loom.server.openai_api import EventStream

    return EventStream(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


INLINE_MEDIA = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "audio/wav", "audio/x-wav"}
    | {"audio/mpeg", "audio/mp3", "audio/ogg", "audio/flac"}
)
"""Media types the console shows in the page (raster images, sound); anything else (a PDF, an
SVG, HTML: bytes a browser could run as the console's own page) is only downloaded."""


def _disposition(kind: str, name: str) -> str:
    """A ``Content-Disposition`` naming ``name`` (RFC 6266: an ASCII fallback and the UTF-8
    name)."""
    cleaned = "".join(c for c in name if c.isprintable() and c not in '\\/"') or "media"
    ascii_name = cleaned.encode("ascii", "replace").decode().replace("?", "_")
    return f"{kind}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(cleaned, safe='')}"


@router.get("/sessions/{session_id:path}/media/{ref}")
async def session_media(request: Request, session_id: str, ref: str, name: str = "") -> Response:
    """The bytes of medium ``ref`` of the session (an image in its timeline, a file to
    download): only a medium the session names, to a key that sees the session. Raster
    images and sound are shown inline, anything else is an attachment (``?name=`` names the
    file)."""
    state = state_of(request)
    store = state.runtime.store
    try:
        info = await store.get_session(session_id)
    except SessionNotFound:
        info = None
    if info is None:
        return problem(request, 404, "Not found", f"no session {session_id!r}")
    blobs = state.runtime.capabilities.blobs
    missing = f"session {unscoped_session_id(session_id)!r} has no medium {ref!r}"
    if blobs is None or not MEDIA_REF.fullmatch(ref):
        return problem(request, 404, "Not found", missing)
    named = {r: media_type for r, media_type, _ in await blobs.session_blobs(session_id)}
    if ref not in named:  # bytes another session holds are not this one's to show
        return problem(request, 404, "Not found", missing)
    data = (await blobs.load_blobs([ref])).get(ref)
    if data is None:
        return problem(request, 404, "Not found", missing + " (its bytes are gone)")
    media_type = named[ref] or "application/octet-stream"
    inline = media_type in INLINE_MEDIA and not name
    filename = name or ref.replace(":", "-")
    headers = {
        "Content-Disposition": _disposition("inline" if inline else "attachment", filename),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        # the bytes of a reference never change; the key that may see them might
        "Cache-Control": "private, max-age=86400, immutable",
    }
    return Response(data, media_type=media_type, headers=headers)


@router.post("/sessions/{session_id:path}/approvals/{call_id}")
async def decide(request: Request, session_id: str, call_id: str) -> Response:
    """Approve or reject a parked call; once every parked call is decided the run resumes (as
    a run of the run API, so it streams to this page and to API clients alike)."""
    from loom.server.langgraph_api import RunCreate, record_decision, session_agent
    from loom.server.runs import start_run

    form = await _form(request)
    refused = _csrf_refused(request, form)
    if refused is not None:
        return refused
    decision_word = form.get("decision")
    if decision_word not in ("approve", "reject"):
        return problem(request, 422, "Bad decision", "decide with approve or reject")
    decision: dict[str, Any] = {"decision": decision_word}
    if form.get("reason"):
        decision["reason"] = form["reason"]
    who = _principal(request)
    if who is not None:  # who decided goes into the journal with the decision
        decision["by"] = who.name
    state = state_of(request)
    back = f"/console/sessions/{quote(unscoped_session_id(session_id), safe='')}"
    try:
        info, decided, waiting = await record_decision(state, session_id, call_id, decision)
        if not waiting:
            agent = await session_agent(state, info)
            resume = RunCreate(
                assistant_id=agent, command={"resume": decided}, stream_mode=["events"]
            )
            await start_run(state, session_id, resume)
    except HTTPException as exc:
        return problem(request, exc.status_code, "Not found", str(exc.detail))
    except SessionNotFound as exc:
        return problem(request, 404, "Not found", str(exc))
    except SessionBusy as exc:
        return problem(request, 409, "Busy", str(exc))
    except LoomError as exc:
        return problem(request, 400, "Refused", str(exc))
    return RedirectResponse(back, 303)


@router.post("/sessions/{session_id:path}/branch")
async def branch(request: Request, session_id: str) -> Response:
    """Regenerate the last answer (``action=regenerate``) or edit a user message and answer
    it again (``action=edit``, ``turn``, ``text``): a run of the session's agent started with
    ``Regenerate()`` or ``Edit(turn, text)`` (``loom.engine.branching``), listed with the
    server's runs; the turns it replaces stay in the journal and show as a branch."""
    from loom.crew.crew import Crew
    from loom.engine.run_inputs import Edit, Regenerate
    from loom.errors import BranchError, InputError
    from loom.server.langgraph_api import session_agent
    from loom.server.lg_runs import LgRun
    from loom.server.runs import run_manager, served

    form = await _form(request)
    refused = _csrf_refused(request, form)
    if refused is not None:
        return refused
    state = state_of(request)
    back = f"/console/sessions/{quote(unscoped_session_id(session_id), safe='')}"
    action = form.get("action")
    inp: Regenerate | Edit
    if action == "regenerate":
        inp = Regenerate()
    elif action == "edit":
        turn, text = form.get("turn", ""), form.get("text", "").strip()
        if whole_number(turn) is None or not text:
            why = "edit-and-resend needs the message's turn and the new text; write some text"
            return problem(request, 422, "Bad request", why)
        inp = Edit(int(turn), text)
    else:
        return problem(request, 422, "Bad request", "the action is regenerate or edit")
    try:
        info = await state.runtime.store.get_session(session_id)
        if info is None:
            raise SessionNotFound(f"no session {unscoped_session_id(session_id)!r}")
        agent = served(state, await session_agent(state, info))
        if isinstance(agent, Crew):
            raise InputError("a crew's session cannot be regenerated or edited (yet)")
        manager = run_manager(state)
        if manager.active_on(session_id):
            raise SessionBusy("the session is running a run; wait for it or cancel it first")
        turn_ = await state.runtime.start(agent, inp, session_id=session_id)
        manager.start(LgRun(turn_.run_id, session_id, agent.name, "reject", ["events"]), turn_)
    except HTTPException as exc:
        return problem(request, exc.status_code, "Not found", str(exc.detail))
    except SessionNotFound as exc:
        return problem(request, 404, "Not found", str(exc))
    except SessionBusy as exc:
        return problem(request, 409, "Busy", str(exc))
    except BranchError as exc:
        return problem(request, 409, "Refused", str(exc))
    except LoomError as exc:
        return problem(request, 400, "Refused", str(exc))
    return RedirectResponse(back, 303)


@router.post("/sessions/{session_id:path}/runs/{run_id}/cancel")
async def cancel_run(request: Request, session_id: str, run_id: str) -> Response:
    """Cancel a running run of the session (as ``POST /threads/{id}/runs/{run}/cancel``)."""
    from loom.server import langgraph_api

    form = await _form(request)
    refused = _csrf_refused(request, form)
    if refused is not None:
        return refused
    try:
        await langgraph_api.cancel_run(request, session_id, run_id, wait=True)
    except HTTPException as exc:
        return problem(request, exc.status_code, "Not found", str(exc.detail))
    except LoomError as exc:
        return problem(request, 409, "Refused", str(exc))
    back = f"/console/sessions/{quote(unscoped_session_id(session_id), safe='')}"
    return RedirectResponse(_next(form["next"]) if form.get("next") else back, 303)


@router.post("/sessions/{session_id:path}/delete")
async def delete_session(request: Request, session_id: str) -> Response:
    """Delete the session (as ``DELETE /threads/{id}``; refused while a run is going)."""
    from loom.server import langgraph_api

    refused = _csrf_refused(request, await _form(request))
    if refused is not None:
        return refused
    try:
        await langgraph_api.delete_thread(request, session_id)
    except HTTPException as exc:
        title = "Not found" if exc.status_code == 404 else "Refused"
        return problem(request, exc.status_code, title, str(exc.detail))
    except SessionNotFound as exc:
        return problem(request, 404, "Not found", str(exc))
    except SessionBusy as exc:
        return problem(request, 409, "Busy", f"{exc}; cancel the run first")
    except LoomError as exc:
        return problem(request, 400, "Refused", str(exc))
    return RedirectResponse("/console/sessions", 303)


@router.get("/sessions/{session_id:path}")
async def session_page(
    request: Request, session_id: str, page_no: str = Query("0", alias="page")
) -> Response:
    """A session's page; ``?page=`` (0 = the newest runs) pages back through older runs."""
    if whole_number(page_no) is None:
        why = f"page must be a whole number >= 0, got {page_no!r}"
        return problem(request, 422, "Bad request", why)
    return await render_session(request, session_id, int(page_no))


# -- runs (the scheduler's pages: schedules.py) ------------------------------------------------
@router.get("/runs")
async def runs(request: Request, status: str = "") -> Response:
    state = state_of(request)
    infos = sorted(
        await state.runtime.store.list_sessions(limit=100), key=lambda i: i.updated_at, reverse=True
    )
    rows: list[dict[str, Any]] = []
    for info in infos:
        records = await _runs_of(state, info.id)
        starts = {r.run_id: r.timestamp for r in records if r.status == "running"}
        for run_id, rec in _latest(records).items():
            if status and rec.status != status:
                continue
            rows.append(
                {
                    "run_id": run_id,
                    "session_id": info.id,
                    "agent": info.agent_name,
                    "status": rec.status,
                    "started": starts.get(run_id, rec.timestamp),
                    "ended": None if rec.status == "running" else rec.timestamp,
                    "usage": rec.usage,
                    "cost": cost_of(rec.usage),
                }
            )
    rows.sort(key=lambda r: r["started"], reverse=True)
    return page(request, "runs.html", nav="runs", rows=rows[:500], status=status)


# -- errors -----------------------------------------------------------------------------------
@router.get("/errors")
async def errors(request: Request, session: str = "") -> Response:
    state = state_of(request)
    store = state.runtime.capabilities.errors
    found = [] if store is None else await store.list_errors(session_id=session or None, limit=200)
    if store is not None and _principal(request) is not None:
        owned = [e for e in found if await state.runtime.store.get_session(e.session_id)]
        found = owned  # another key's errors do not exist for this one
    return page(
        request, "errors.html", nav="errors", errors=found, kept=store is not None, session=session
    )


@router.get("/errors/{error_id}")
async def error_page(request: Request, error_id: str) -> Response:
    state = state_of(request)
    store = state.runtime.capabilities.errors
    found = None if store is None else await store.get_error(error_id)
    if found is not None and await state.runtime.store.get_session(found.session_id) is None:
        found = None  # another key's session
    if found is None:
        return problem(request, 404, "Not found", f"no error {error_id!r}")
    raw = dict(found.raw_error)
    trace = raw.pop("traceback", None)
    return page(request, "error.html", nav="errors", error=found, raw=raw, trace=trace)


# -- static -----------------------------------------------------------------------------------
async def not_found(request: Request, rest: str = "") -> Response:
    """Any other address under /console: a 404 page (never the API's JSON)."""
    return problem(request, 404, "Not found", f"the console has no page {request.url.path!r}")


async def favicon() -> Response:
    """The console has no icon: an empty answer, never a 401 or a 404 in a browser's log."""
    return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})


_STATIC = {"console.js": "text/javascript", "console.css": "text/css"}


@router.get("/static/{name}")
async def static(name: str) -> Response:
    kind = _STATIC.get(name)
    if kind is None:
        raise HTTPException(404, f"no console asset {name!r}; it has {', '.join(_STATIC)}")
    body = (HERE / "static" / name).read_bytes()
    return Response(body, media_type=kind, headers={"Cache-Control": "no-cache"})
