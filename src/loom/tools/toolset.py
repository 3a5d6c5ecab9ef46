"""Toolsets: objects that provide several tools at run time (MCP servers).

A toolset has ``name``, ``async load_tools() -> list[Tool]`` (called at the start of every
turn; cache inside and reconnect when needed) and ``async aclose()``. Put it in
``Agent(tools=[...])`` next to ordinary tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from loom.events import EventType
from loom.tools.base import Tool, spec_of

if TYPE_CHECKING:
    from loom.agent import Agent
    from loom.loop import Turn

__all__ = ["Toolset", "load_toolsets"]


@runtime_checkable
class Toolset(Protocol):
    """A source of tools known only at run time."""

    name: str

    async def load_tools(self) -> list[Tool]: ...

    async def aclose(self) -> None: ...


async def load_toolsets(agent: Agent, turn: Turn) -> None:
    """Register every toolset's tools on the agent; report failures and name clashes.

    A toolset that fails to load is reported with a non-fatal ``ERROR`` event and the turn goes
    on without its tools. A tool whose name is already taken (by a built-in, your own tool or
    another toolset) is skipped and reported; give the toolset a ``prefix`` to keep both.
    """
    owners = agent._tool_owners
    changed = False
    for ts in agent._toolsets:
        try:
            tools = await ts.load_tools()
        except Exception as exc:
            turn._announce(
                EventType.ERROR,
                error=f"tool server {ts.name!r} is unavailable: {exc}",
                fatal=False,
                toolset=ts.name,
            )
            for name in [n for n, owner in owners.items() if owner == ts.name]:
                agent.tools.pop(name, None)  # its tools cannot be called now
                del owners[name]
                changed = True
            continue
        for problem in getattr(ts, "problems", None) or ():
            turn._announce(EventType.ERROR, error=problem, fatal=False, toolset=ts.name)
        for t in tools:
            owner = owners.get(t.name)
            if owner == ts.name:
                if agent.tools.get(t.name) is not t:
                    agent.tools[t.name] = t
                    changed = True
                continue
            if t.name in agent.tools or owner is not None:
                taken_by = f"tool server {owner!r}" if owner else "a tool the agent already has"
                turn._announce(
                    EventType.ERROR,
                    error=f"tool server {ts.name!r} offers a tool named {t.name!r}, which "
                    f"{taken_by} already uses; it is skipped. Give the server a prefix "
                    "(mcp_server(..., prefix='name_')) to use both.",
                    fatal=False,
                    toolset=ts.name,
                )
                continue
            agent.tools[t.name] = t
            owners[t.name] = ts.name
            changed = True
    if changed:
        agent.tool_specs = [spec_of(t) for t in agent.tools.values()]
