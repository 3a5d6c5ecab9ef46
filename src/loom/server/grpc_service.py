"""The gRPC Weave service's place in the app: a router with no routes whose lifespan starts
``loom.server.grpc_weave`` beside HTTP when the server was given a gRPC port (``loom serve
--grpc-port``). It imports grpc only then, and keeps the HTTP Weave module (``weave_api``) and
the gRPC one (which uses it) out of each other's imports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from loom.server.app import ServerState

__all__ = ["router"]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.loom
    port = state.extra.get("grpc_port")
    if port is None:
        yield
        return
    from loom.server.grpc_weave import start_grpc_server

    server = await start_grpc_server(state, state.extra.get("grpc_host", "127.0.0.1"), port)
    try:
        yield
    finally:
        state.hub.close()  # end SubscribeToSession streams, so stopping does not wait on them
        await server.stop(grace=5)


router = APIRouter(lifespan=_lifespan)
