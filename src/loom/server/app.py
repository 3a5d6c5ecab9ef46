"""The FastAPI application: shared state, health, errors as JSON, and the protocol routers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from loom.errors import (
    InputError,
    LoomError,
    QueueFull,
    QueueTimeout,
    SessionBusy,
    SessionNotFound,
)
from loom.runtime import Runtime
from loom.server.registry import AgentRegistry

__all__ = ["ServerState", "create_app", "error_body", "state_of"]

log = logging.getLogger("loom.server")


@dataclass
class ServerState:
    """What every request handler shares: the agents, the runtime, and whether it is ready."""

    registry: AgentRegistry
    runtime: Runtime
    ready: bool = False
    draining: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.loom
    return state


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


def create_app(registry: AgentRegistry, runtime: Runtime) -> FastAPI:
    """The Loom server's application for ``registry``'s agents on ``runtime``."""
    state = ServerState(registry, runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.ready = True
        try:
            yield
        finally:
            state.ready, state.draining = False, True
            await runtime.aclose()

    app = FastAPI(
        title="Loom",
        version=_version(),
        description="Loom agents over HTTP: a run API, an OpenAI-compatible front, Weave.",
        lifespan=lifespan,
    )
    app.state.loom = state

    @app.exception_handler(LoomError)
    async def loom_error(request: Request, exc: LoomError) -> JSONResponse:
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
        kind = "NotFound" if exc.status_code == 404 else "HTTPError"
        return JSONResponse(error_body(kind, str(exc.detail)), status_code=exc.status_code)

    @app.get("/healthz", tags=["health"], summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="The server takes runs")
    async def readyz() -> JSONResponse:
        ok = state.ready and not state.draining
        body = {"status": "ready" if ok else "not ready", "agents": list(registry)}
        return JSONResponse(body, status_code=200 if ok else 503)

    for router in _routers():
        app.include_router(router)
    return app


def _routers() -> list[Any]:
    """Every protocol router that exists in this build (each module exposes ``router``)."""
    import importlib

    out = []
    for name in ("langgraph_api", "openai_api", "weave_api"):
        try:
            module = importlib.import_module(f"loom.server.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"loom.server.{name}":
                raise
            continue
        out.append(module.router)
    return out


def _version() -> str:
    from loom import __version__

    return __version__
