"""A2A 1.0 on ``loom serve`` (the ``a2a-sdk`` server classes over Loom's runtime and store).

Per served agent:

- ``GET /agents/{name}/.well-known/agent-card.json``: its agent card (the first served agent's
  is also at ``/.well-known/agent-card.json``);
- ``POST /agents/{name}/a2a``: the JSON-RPC binding (``SendMessage``, ``SendStreamingMessage``,
  ``GetTask``, ``ListTasks``, ``CancelTask``, ``SubscribeToTask``; v0.3 method names too);
- ``/agents/{name}/a2a/rest/...``: the HTTP+JSON (REST) binding (``message:send``, ...).

Tasks run on the server's one ``Runtime`` (``executor.LoomExecutor``) and are kept in the
store's key-value space per API key (``store.LoomTaskStore``). With API keys every path, the
cards included, needs a key, like the rest of the server. The SDK is imported on the first A2A
request, so a server without the ``a2a`` extra starts and answers these paths with 501.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from loom.server.app import ServerState, error_body, view_for

__all__ = ["router"]

_HANDLERS = "a2a_handlers"


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
    routes = [
        Route(JSONRPC_PATH.format(name=name), dispatcher.handle_requests, methods=["POST"]),
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
        handlers: dict[str, Any] = root.extra.setdefault(_HANDLERS, {})
        if name not in handlers:
            handlers[name] = _agent_router(root, name)
        await handlers[name][1](scope, receive, send)

    async def _card(
        self, state: ServerState, name: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict
        from starlette.requests import Request

        from loom.server.a2a.card import agent_card

        base = str(Request(scope).base_url).rstrip("/")
        card = agent_card(state.registry[name], base, _version(), keys=_keyed(state))
        await JSONResponse(agent_card_to_dict(card))(scope, receive, send)


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
        ("/agents/{name}/a2a/rest/{rest:path}", ["GET", "POST", "DELETE"]),
    )
)
