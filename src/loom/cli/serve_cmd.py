"""``loom serve``: serve agents over HTTP with uvicorn (the ``server`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loom.cli._console import say_error

__all__ = ["serve"]


def serve(
    agents: Annotated[
        Path | None,
        typer.Option("--agents", help="A directory of AGENT.md / YAML agent definitions."),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="module:attr naming an AgentRegistry, an Agent or a list."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    store: Annotated[
        str | None,
        typer.Option(help="SQLite database path (default .loom/loom.db), or :memory:."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    grpc_port: Annotated[
        int | None,
        typer.Option("--grpc-port", help="Also serve Weave over gRPC on this port (same host)."),
    ] = None,
) -> None:
    """Serve agents over HTTP: a run API LangGraph's clients speak, OpenAI-compatible, Weave."""
    from loom.errors import ConfigurationError, LoomError, MissingDependencyError

    try:
        try:
            import uvicorn
        except ImportError:
            raise MissingDependencyError("uvicorn", "server", "loom serve") from None
        from loom.cli.run_cmd import open_store
        from loom.runtime import Runtime
        from loom.server import AgentRegistry, create_app
        from loom.server.registry import load_registry

        if (agents is None) == (app_spec is None):
            raise ConfigurationError(
                "give the agents to serve: --agents DIR (AGENT.md files) or --app module:attr"
            )
        registry = (
            AgentRegistry.from_dir(agents) if agents is not None else load_registry(str(app_spec))
        )
        app = create_app(registry, Runtime(open_store(store)))
        if grpc_port is not None:  # started by the Weave router's lifespan
            app.state.loom.extra.update(grpc_port=grpc_port, grpc_host=host)
    except LoomError as exc:
        say_error(exc)
        raise typer.Exit(2) from None
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10)
