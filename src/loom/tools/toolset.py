"""Toolsets: objects that provide several tools at run time (MCP servers).

A toolset has ``name``, ``async load_tools() -> list[Tool]`` (called at the start of every
turn; cache inside and reconnect when needed) and ``async aclose()``; optionally ``fresh()``,
a new unconnected copy, so each runtime holds its own connection. Put it in
``Agent(tools=[...])`` next to ordinary tools.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from loom.tools.base import Tool

__all__ = ["Toolset", "load_toolsets"]

log = logging.getLogger("loom.tools")


@runtime_checkable
class Toolset(Protocol):
    """A source of tools known only at run time."""

    name: str

    async def load_tools(self) -> list[Tool]: ...

    async def aclose(self) -> None: ...


async def load_toolsets(
    toolsets: Sequence[Any], base: dict[str, Tool]
) -> tuple[dict[str, Tool], list[str]]:
    """This turn's tool table: ``base`` plus every toolset's tools, and the problems found.

    A toolset that fails to load is reported (and logged) and the turn goes on without its
    tools. A tool whose name is already taken (by a built-in, your own tool or another toolset)
    is skipped and reported; give the toolset a ``prefix`` to keep both. Nothing is written
    back anywhere: the table belongs to one turn.
    """
    tools = dict(base)
    problems: list[str] = []
    owners: dict[str, str] = {}
    for ts in toolsets:
        try:
            loaded = await ts.load_tools()
        except Exception as exc:
            problems.append(
                f"tool server {ts.name!r} is unavailable, so its tools are not offered this "
                f"turn: {exc}"
            )
            continue
        problems.extend(getattr(ts, "problems", None) or ())
        for t in loaded:
            if t.name in tools:
                owner = owners.get(t.name)
                taken_by = f"tool server {owner!r}" if owner else "a tool the agent already has"
                problems.append(
                    f"tool server {ts.name!r} offers a tool named {t.name!r}, which {taken_by} "
                    "already uses; it is skipped. Give the server a prefix "
                    "(mcp_server(..., prefix='name_')) to use both."
                )
                continue
            tools[t.name] = t
            owners[t.name] = ts.name
    for p in problems:
        log.warning("%s", p)
    return tools, problems
