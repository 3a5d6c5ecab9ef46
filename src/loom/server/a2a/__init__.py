"""A2A 1.0 on ``loom serve`` (the ``a2a-sdk`` server classes over Loom's runtime and store).

Per served agent:

- ``GET /agents/{name}/.well-known/agent-card.json``: its agent card (the first served agent's
  is also at ``/.well-known/agent-card.json``), with ``Cache-Control`` and an ``ETag`` (a hash
  of the card as served), and 304 for a matching ``If-None-Match``;
- ``POST /agents/{name}/a2a`` (or ``.../a2a/``): the JSON-RPC binding (``SendMessage``,
  ``SendStreamingMessage``, ``GetTask``, ``ListTasks``, ``CancelTask``, ``SubscribeToTask``;
  v0.3 method names too);
- ``/agents/{name}/a2a/rest/...``: the HTTP+JSON (REST) binding (``message:send``, ...).

A 1.0 request names its version (``A2A-Version: 1.0``, header or query parameter); one that
names none is answered ``VersionNotSupportedError`` saying so (``handler.requested_version``).

Tasks run on the server's one ``Runtime`` (``executor.LoomExecutor``) and are kept in the
store's key-value space per API key (``store.LoomTaskStore``). With API keys every path, the
cards included, needs a key, like the rest of the server. The SDK is imported on the first A2A
request, so a server without the ``a2a`` extra starts and answers these paths with 501.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from loom.server import runs
from loom.server.app import ServerState, error_body, view_for

__all__ = ["router"]

_HANDLERS = "a2a_handlers"
CARD_MAX_AGE = 300
"""Seconds a client may keep an agent card (it changes when the server's agents do)."""


def _agent_router(state: ServerState, name: str) -> Any:
    """The Starlette router of one agent's A2A endpoints (built on first use)."""
    from a2a.server.routes.rest_routes import create_rest_routes
    from starlette.routing import Mount, Router

    from loom.server.a2a.card import JSONRPC_PATH, REST_PATH, agent_card
    from loom.server.a2a.executor import LoomExecutor
    from loom.server.a2a.handler import ContextBuilder, Dispatcher, LoomRequestHandler
    from loom.server.a2a.store import LoomTaskStore

    agent = state.registry[name]
    card = agent_card(agent, "http://localhost", _version(), keys=_keyed(state))
    handler = LoomRequestHandler(
        LoomExecutor(state, name),
        LoomTaskStore(state.runtime.capabilities.kv, name),
        card,
        loom_state=state,
        agent_name=name,
    )
    builder = ContextBuilder()
    dispatcher = Dispatcher(handler, context_builder=builder, enable_v0_3_compat=True)
    rest = create_rest_routes(handler, builder, path_prefix=REST_PATH.format(name=name))
    jsonrpc = JSONRPC_PATH.format(name=name)
    routes = [
        Route(jsonrpc, dispatcher.handle_requests, methods=["POST"]),
        # with a trailing slash too: a redirect would make clients re-send (or drop) the body
        Route(jsonrpc + "/", dispatcher.handle_requests, methods=["POST"]),
        # the SDK also mounts its REST routes under /{tenant}: at the root of our app that
        # would swallow every path, and Loom has no tenants
        *(r for r in rest if not isinstance(r, Mount)),
    ]
    return handler, Router(routes=routes)


def _keyed(state: ServerState) -> bool:
    security = state.extra.get("security")
    return bool(security is not None and security.keys)


def _version() -> str:
    from loom import __version__

    return __version__


class A2AApp:
    """Finds the agent a path names (as the request's key sees the registry) and hands the
    request to that agent's A2A router; serves the cards itself (their URLs are the
    request's)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root: ServerState = scope["app"].state.loom
        state = view_for(root, scope.get("loom.principal"))
        path: str = scope["path"]
        if path == "/.well-known/agent-card.json":
            name = next(iter(state.registry), None)
        else:
            name = path.split("/")[2]
        if name is None or name not in state.registry:
            served = ", ".join(state.registry) or "none"
            body = error_body("NotFound", f"no agent named {name!r} (served: {served})")
            await JSONResponse(body, status_code=404)(scope, receive, send)
            return
        try:
            import a2a.server  # noqa: F401
        except ImportError:
            body = error_body("NotImplemented", "A2A needs the a2a extra: pip install 'loom[a2a]'")
            await JSONResponse(body, status_code=501)(scope, receive, send)
            return
        if path.endswith("/.well-known/agent-card.json"):
            await self._card(root, name, scope, receive, send)
            return
        if "/a2a/rest/" in path and not await self._versioned_rest(scope, receive, send):
            return
        handlers: dict[str, Any] = root.extra.setdefault(_HANDLERS, {})
        if name not in handlers:
            handlers[name] = _agent_router(root, name)
        await handlers[name][1](scope, receive, send)

    async def _versioned_rest(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Whether a REST request names its A2A version; if not, it is answered here (the REST
        binding is 1.0 only) with the error that says which header to send."""
        from a2a.utils.error_handlers import build_rest_error_payload
        from a2a.utils.errors import VersionNotSupportedError
        from starlette.requests import Request

        from loom.server.a2a.handler import missing_version_message, requested_version

        if requested_version(Request(scope)) is not None:
            return True
        error = VersionNotSupportedError(message=missing_version_message("the REST binding"))
        response = JSONResponse(build_rest_error_payload(error), status_code=400)
        await response(scope, receive, send)
        return False

    async def _card(
        self, state: ServerState, name: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict
        from starlette.requests import Request

        from loom.server.a2a.card import agent_card

        request = Request(scope)
        base = str(request.base_url).rstrip("/")
        card = agent_card(state.registry[name], base, _version(), keys=_keyed(state))
        body = json.dumps(agent_card_to_dict(card), separators=(",", ":")).encode()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        # a card behind API keys is for that key's eyes: no shared cache keeps it
        scope_word = "private" if _keyed(state) else "public"
        headers = {"ETag": etag, "Cache-Control": f"{scope_word}, max-age={CARD_MAX_AGE}"}
        if _etag_matches(request.headers.get("if-none-match"), etag):
            await Response(status_code=304, headers=headers)(scope, receive, send)
            return
        response = Response(body, media_type="application/json", headers=headers)
        await response(scope, receive, send)


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 13.1.2: ``*`` or any listed tag, weak or strong, equal to ``etag``."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """On shutdown, stop the A2A tasks still running (their turns record their end)."""
    yield
    state: ServerState = app.state.loom
    for handler, _ in state.extra.pop(_HANDLERS, {}).values():
        await handler.aclose()


router = APIRouter(lifespan=_lifespan)
_app = A2AApp()
# plain Starlette routes to an ASGI app: the SDK's routers answer (and stream) themselves
router.routes.extend(
    Route(path, _app, methods=methods, include_in_schema=False)
    for path, methods in (
        ("/.well-known/agent-card.json", ["GET"]),
        ("/agents/{name}/.well-known/agent-card.json", ["GET"]),
        ("/agents/{name}/a2a", ["POST"]),
        ("/agents/{name}/a2a/", ["POST"]),
        ("/agents/{name}/a2a/rest/{rest:path}", ["GET", "POST", "DELETE"]),
    )
)


async def carry_on_task(state: ServerState, run_id: str, record: dict[str, Any]) -> bool:
    """Carry on an acknowledged non-blocking task whose server stopped (``loom.server.runs``
    calls it at start-up; the a2a SDK is imported only then)."""
    from loom.server.a2a.recovery import carry_on_task as carry_on

    return await carry_on(state, run_id, record)


runs.register_carrier(runs.A2A_SURFACE, carry_on_task)
