"""``loom mcp``: serve agents as MCP tools over stdio (Claude Desktop, Cursor, ...)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from loom.errors import ConfigurationError

__all__ = ["mcp"]


def mcp(
    agent: Annotated[
        Path | None,
        typer.Option("--agent", help="An AGENT.md / YAML file, or a directory of them."),
    ] = None,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="module:attr naming an AgentRegistry, an Agent or a list."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(help="SQLite database path (default .loom/loom.db), or :memory:."),
    ] = None,
) -> None:
    """Serve agents as MCP tools over stdin/stdout: each agent is a tool taking
    {message, session_id?}. Needs the mcp extra (mcp>=2,<3)."""
    from loom.agent import Agent
    from loom.cli.run_cmd import open_store
    from loom.engine.runtime import Runtime
    from loom.mcp_server import serve_stdio
    from loom.server.registry import AgentRegistry, load_registry

    if (agent is None) == (app_spec is None):
        raise ConfigurationError(
            "give the agents to serve: --agent AGENT.md (or a directory) or --app module:attr"
        )
    if agent is not None:
        registry = (
            AgentRegistry.from_dir(agent)
            if agent.is_dir()
            else AgentRegistry([Agent.from_file(agent)])
        )
    else:
        registry = load_registry(str(app_spec))
    runtime = Runtime(open_store(store))

    async def main() -> None:
        try:
            await serve_stdio(registry, runtime)
        finally:
            await runtime.aclose()
            await runtime.store.close()

    asyncio.run(main())
