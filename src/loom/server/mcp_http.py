"""MCP over streamable HTTP at ``/mcp``: every served agent is an MCP tool
(``loom.mcp_server``), run on the server's one runtime.

The SDK's session manager runs in this router's lifespan, so it starts and stops with the
app. Each request is answered for the API key that sent it (``GuardMiddleware`` has checked
it): the tools are that key's agents and the sessions that key's threads, whichever MCP
session the request belongs to. An MCP session id belongs to the key whose ``initialize`` made
it: another key presenting it is answered as for a session that does not exist (404). An MCP
session ends when the client deletes it or after
``LOOM_MCP_IDLE_TIMEOUT`` seconds (or state.extra ``mcp_idle_timeout``; default 30 minutes)
without a request, which also frees a session whose client never sent ``initialized``.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from starlette.types import Message, Receive, Scope, Send

from loom.server.app import ServerState, view_for
from loom.server.ownership import McpSessions, current_owners, current_principal

if TYPE_CHECKING:
    from mcp.server import ServerRequestContext

    from loom.agent import Agent
    from loom.engine.runtime import Runtime

__all__ = ["router"]

IDLE_TIMEOUT = 30 * 60.0


def _resolve(ctx: ServerRequestContext[Any, Any]) -> tuple[Mapping[str, Agent], Runtime]:
    request = ctx.request
    if request is None:  # pragma: no cover - the HTTP transport always attaches it
        raise RuntimeError("an MCP request over HTTP without its HTTP request")
    principal = request.scope.get("loom.principal")
    # the handler may run in the session's task, not the POST's: scope the store to the key
    current_principal.set(principal)
    state = view_for(request.app.state.loom, principal)
    current_owners.set(state.extra.get("owners"))
    return state.registry, state.runtime


class _McpRunner:
    """This app's MCP session manager, made and started on the first MCP request, not at
    start-up: importing the MCP SDK takes about half a second, which a server that may never
    be asked over MCP should not wait for before it is ready. Stopped with the app."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.manager: Any = None  # mcp's StreamableHTTPSessionManager, once started
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        self.stop = asyncio.Event()

    async def get(self) -> Any:
        if self.manager is not None:
            return self.manager
        async with self.lock:
            if self.manager is None:
                self.manager = await self._start()
        return self.manager

    async def _start(self) -> Any:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        from loom.mcp_server import build_server

        manager = StreamableHTTPSessionManager(
            app=build_server(_resolve),
            session_idle_timeout=float(
                self.state.extra.get("mcp_idle_timeout")
                or os.environ.get("LOOM_MCP_IDLE_TIMEOUT")
                or IDLE_TIMEOUT
            ),
        )
        started = asyncio.Event()

        async def run() -> None:  # run() is entered and left in this one task
            async with manager.run():
                started.set()
                await self.stop.wait()

        # a fresh context: its sessions' tasks must not inherit this first request's key
        self.task = asyncio.get_running_loop().create_task(run(), context=contextvars.Context())
        waiting = asyncio.ensure_future(started.wait())
        await asyncio.wait([self.task, waiting], return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            waiting.cancel()
            self.task.result()  # raises why it did not start
            raise RuntimeError("the MCP session manager stopped before it started")
        return manager

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            await self.task


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.loom
    runner = state.extra["mcp_runner"] = _McpRunner(state)
    try:
        yield
    finally:
        await runner.close()


_SESSION_HEADER = b"mcp-session-id"


async def _mcp(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI endpoint: hand the request to this app's session manager, with the MCP session
    bound to the key that created it (``loom.server.ownership.McpSessions``)."""
    state: ServerState = scope["app"].state.loom
    sessions: McpSessions = state.extra.setdefault("mcp_sessions", McpSessions())
    principal = scope.get("loom.principal")
    given = next((v.decode("latin-1") for k, v in scope["headers"] if k == _SESSION_HEADER), None)
    if given is not None and not sessions.may_use(given, principal):
        # another key's session: the SDK answers it exactly as a session it never made
        headers = [(k, v) for k, v in scope["headers"] if k != _SESSION_HEADER]
        unknown = f"unknown-{uuid.uuid4().hex}".encode()
        scope = {**scope, "headers": [*headers, (_SESSION_HEADER, unknown)]}
        given = None

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and given is None:
            for k, v in message.get("headers", []):
                if k.lower() == _SESSION_HEADER and message["status"] < 300:
                    sessions.bind(v.decode("latin-1"), principal)
        await send(message)

    runner: _McpRunner = state.extra["mcp_runner"]
    await (await runner.get()).handle_request(scope, receive, sending)


class _Endpoint:
    """An ASGI app (not a function), so Starlette hands it the raw request."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _mcp(scope, receive, send)


router = APIRouter(tags=["mcp"], lifespan=_lifespan)
router.add_route(
    "/mcp",
    _Endpoint(),  # type: ignore[arg-type]  # an ASGI app: Starlette routes it as one
    methods=["GET", "POST", "DELETE"],
    include_in_schema=False,
)
