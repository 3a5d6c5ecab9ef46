"""MCP over streamable HTTP at ``/mcp``: every served agent is an MCP tool
(``loom.mcp_server``), run on the server's one runtime.

The SDK's session manager runs in this router's lifespan, so it starts and stops with the
app. Each request is answered for the API key that sent it (``GuardMiddleware`` has checked
it): the tools are that key's agents and the sessions that key's threads, whichever MCP
session the request belongs to. An MCP session ends when the client deletes it or after
``LOOM_MCP_IDLE_TIMEOUT`` seconds (or state.extra ``mcp_idle_timeout``; default 30 minutes)
without a request, which also frees a session whose client never sent ``initialized``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from starlette.types import Receive, Scope, Send

from loom.server.app import ServerState, view_for
from loom.server.security import current_principal

if TYPE_CHECKING:
    from mcp.server import ServerRequestContext

    from loom.agent import Agent
    from loom.runtime import Runtime

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
    return state.registry, state.runtime


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from loom.mcp_server import build_server

    state: ServerState = app.state.loom
    manager = StreamableHTTPSessionManager(
        app=build_server(_resolve),
        session_idle_timeout=float(
            state.extra.get("mcp_idle_timeout")
            or os.environ.get("LOOM_MCP_IDLE_TIMEOUT")
            or IDLE_TIMEOUT
        ),
    )
    state.extra["mcp_manager"] = manager
    async with manager.run():
        yield


async def _mcp(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI endpoint: hand the request to this app's session manager."""
    state: ServerState = scope["app"].state.loom
    await state.extra["mcp_manager"].handle_request(scope, receive, send)


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
