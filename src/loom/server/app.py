"""The FastAPI application: shared state, health, errors as JSON, and the protocol routers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from loom.engine.runtime import Runtime
from loom.errors import (
    ConfigurationError,
    InputError,
    LoomError,
    QueueFull,
    QueueTimeout,
    SessionBusy,
    SessionNotFound,
    StoreError,
)
from loom.server.registry import AgentRegistry
from loom.server.state import ServerState

if TYPE_CHECKING:
    from loom.server.security import Principal, SecurityConfig
    from loom.store.base import Store

__all__ = [
    "ServerState",
    "create_app",
    "database_unreachable",
    "error_body",
    "server_runtime",
    "state_of",
    "view_for",
]

log = logging.getLogger("loom.server")


def state_of(request: Request) -> ServerState:
    """The server's state as the request's API key sees it: a key limited to some agents gets a
    registry of those agents only (so other agents are 404 and lists show its own)."""
    return view_for(request.app.state.loom, request.scope.get("loom.principal"))


def view_for(state: ServerState, principal: Principal | None) -> ServerState:
    """``state`` as ``principal`` sees it (its agents only), for HTTP and gRPC alike."""
    if principal is None or principal.agents is None:
        return state
    views: dict[str, AgentRegistry] = state.extra.setdefault("registry_views", {})
    view = views.get(principal.name)
    if view is None:
        reg = state.registry
        view = views[principal.name] = AgentRegistry(
            [
                *(a for name, a in reg.items() if name in principal.agents),
                *(c for name, c in reg.crews.items() if name in principal.agents),
            ]
        )
    return replace(state, registry=view)


def server_runtime(store: Store, security: SecurityConfig | None = None) -> Runtime:
    """The runtime a server runs on ``store``: it tracks its turns (graceful shutdown) and, with
    API keys, limits each key's concurrent runs and sees the store through thread ownership."""
    from loom.server.lifecycle import ServerRuntime
    from loom.server.security import OwnedStore, Owners

    if security is None or not security.keys:
        return ServerRuntime(store)
    owned = OwnedStore(store, Owners(store))
    runtime = ServerRuntime(cast("Store", owned), max_concurrent_runs=security.max_concurrent_runs)
    return runtime


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The JSON error body every endpoint uses: ``{"error": {"type", "message"}}``."""
    return {"error": {"type": kind, "message": message}}


_STATUS: list[tuple[type[BaseException], int]] = [
    (SessionNotFound, 404),
    (SessionBusy, 409),
    (QueueFull, 429),
    (QueueTimeout, 503),
    (InputError, 422),
    (LoomError, 400),
]


_KINDS = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    429: "TooManyRequests",
    503: "Unavailable",
}


# What FastAPI raises (as a 400) for a body it cannot decode; a malformed body is a 422 like
# every other invalid request (the Agent Protocol documents 422).
_UNDECODABLE = "There was an error parsing the body"


def _no_keys() -> Any:
    from loom.server.security import KeyRing

    return KeyRing()


def create_app(
    registry: AgentRegistry, runtime: Runtime, security: SecurityConfig | None = None
) -> FastAPI:
    """The Loom server's application for ``registry``'s agents on ``runtime``; ``security``
    adds API keys, the body limit, CORS and access logs (see ``loom.server.security``)."""
    from loom.server.security import (
        AccessLogMiddleware,
        GuardMiddleware,
        OwnedStore,
        SecurityConfig,
    )

    state = ServerState(registry, runtime)
    # every event of every run reaches the session's subscribers (SubscribeToSession)
    runtime.observers = (*runtime.observers, state.hub.publish)
    security = security or SecurityConfig(keys=_no_keys())
    if security.keys:
        unknown = sorted(
            {
                a
                for p in security.keys.principals
                for a in (p.agents or ())
                if registry.served(a) is None
            }
        )
        if unknown:
            raise ConfigurationError(
                f"API keys name agents this server does not serve: {', '.join(unknown)}; "
                f"its agents: {', '.join(registry.names())}"
            )
        if not isinstance(runtime.store, OwnedStore):
            raise ConfigurationError(
                "with API keys, build the runtime with loom.server.app.server_runtime(store, "
                "security) so threads are scoped to their key"
            )
    state.extra["security"] = security  # gRPC checks keys with it
    if isinstance(runtime.store, OwnedStore):
        state.extra["owners"] = runtime.store.owners

    modules = _protocols()
    starts = [m.on_start for m in modules if getattr(m, "on_start", None) is not None]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        queue = state.extra.get("run_queue")  # loom serve --queue: background runs are jobs
        if queue is not None:
            await queue.open()
        for start in starts:  # e.g. carry on acknowledged runs a stopped server left unfinished
            await start(state)
        state.ready = True
        try:
            yield
        finally:
            state.ready, state.draining = False, True
            for observer in runtime.observers:  # webhook deliveries under way (bounded)
                drain = getattr(observer, "drain", None)
                if drain is not None:
                    await drain(5.0)
            try:
                await runtime.aclose()
            finally:
                if queue is not None:
                    await queue.close()

    app = FastAPI(
        title="Loom",
        version=_version(),
        description="Loom agents over HTTP: a run API, an OpenAI-compatible front, Weave.",
        lifespan=lifespan,
    )
    app.state.loom = state

    app.add_middleware(GuardMiddleware, state=state, config=security)
    if security.cors_origins:
        app.add_middleware(
            _JSONCORSMiddleware,
            allow_origins=list(security.cors_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=[
                "authorization",
                "x-api-key",
                "content-type",
                "last-event-id",
                "x-loom-session",
                "x-request-id",
            ],
            expose_headers=["location", "content-location", "x-loom-session", "x-request-id"],
        )
    from loom.server.hosts import HostGuardMiddleware

    # outside CORS and the key check: a rebinding page's request is refused before anything
    app.add_middleware(
        HostGuardMiddleware, policy=security.hosts.with_origins(security.cors_origins)
    )
    app.add_middleware(AccessLogMiddleware)

    @app.exception_handler(LoomError)
    async def loom_error(request: Request, exc: LoomError) -> JSONResponse:
        if isinstance(exc, StoreError) and database_unreachable(exc):
            return _unavailable(exc)
        status = next(code for kind, code in _STATUS if isinstance(exc, kind))
        return JSONResponse(error_body(type(exc).__name__, str(exc)), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(error_body("InvalidRequest", problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _UNDECODABLE:  # FastAPI's, for bad bytes
            message = "the body is not JSON text in UTF-8; send a JSON object encoded as UTF-8"
            return JSONResponse(error_body("InvalidRequest", message), status_code=422)
        kind = _KINDS.get(exc.status_code, "HTTPError")
        return JSONResponse(
            error_body(kind, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        if database_unreachable(exc):  # a restart of PostgreSQL: come back shortly
            return _unavailable(exc)
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        message = f"the server failed on this request ({type(exc).__name__}); see its log"
        return JSONResponse(error_body("InternalError", message), status_code=500)

    @app.get("/healthz", tags=["health"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="The server takes runs")
    async def readyz() -> JSONResponse:
        ok = state.ready and not state.draining
        body: dict[str, Any] = {"status": "ready" if ok else "not ready"}
        if not security.keys:  # with keys, which agents exist is for key holders
            body["agents"] = registry.names()
        return JSONResponse(body, status_code=200 if ok else 503)

    for module in modules:
        app.include_router(module.router)
    return app


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a lost or refused database connection: the
    database is restarting or down, so the request may succeed if retried shortly."""
    import sys

    kinds: list[type[BaseException]] = []
    psycopg, pool = sys.modules.get("psycopg"), sys.modules.get("psycopg_pool")
    if psycopg is not None:
        kinds.append(psycopg.OperationalError)
    if pool is not None:
        kinds.append(pool.PoolTimeout)
    seen: BaseException | None = exc
    for _ in range(8):  # the chain: StoreError from OperationalError, procrastinate's wrappers
        if seen is None:
            break
        if kinds and isinstance(seen, tuple(kinds)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unavailable(exc: BaseException) -> JSONResponse:
    log.warning("the database is unreachable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    return JSONResponse(
        error_body(
            "Unavailable",
            "the server's database is unreachable (restarting or down); retry this request "
            "after Retry-After seconds",
        ),
        status_code=503,
        headers={"Retry-After": "5"},
    )


class _JSONCORSMiddleware(CORSMiddleware):
    """Starlette's CORS, its refused preflight (plain text) in the JSON error shape."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        refused = bytes(response.body).decode(errors="replace")  # "Disallowed CORS method"
        return JSONResponse(
            error_body(
                "CORSRefused",
                f"{refused}: this server allows the methods "
                f"{', '.join(sorted(self.allow_methods))} and the headers "
                f"{', '.join(sorted(self.allow_headers))} from the origins given with "
                "--cors-origin",
            ),
            status_code=response.status_code,
            headers={
                k: v
                for k, v in response.headers.items()
                if k not in ("content-length", "content-type")
            },
        )


def _protocols() -> list[Any]:
    """Every protocol module that exists in this build: each exposes ``router``, and may
    expose ``on_start``, a coroutine function of the ``ServerState`` the server awaits before
    it is ready."""
    import importlib

    out = []
    for name in (
        "langgraph_api",
        "agent_protocol",  # stateless runs and the Agent Protocol's paths (after the above)
        "openai_api",
        "weave_api",
        "grpc_service",  # no routes: the gRPC server's lifespan (with --grpc-port)
        "schedule_api",
        "store_api",
        "admin_api",
        "mcp_http",
        "agui",
        "a2a",
        "console",
    ):
        try:
            module = importlib.import_module(f"loom.server.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"loom.server.{name}":
                raise
            continue
        out.append(module)
    return out


def _version() -> str:
    from loom import __version__

    return __version__
