"""Tools: ``@tool``, the ``Tool`` protocol, ``RunContext`` and the executor.

``mcp_server`` (MCP servers as tools) loads the ``mcp`` SDK only when used; ``a2a_agent``
(a remote A2A agent as a tool) loads ``a2a-sdk`` only when used.
"""

from typing import Any

from loom.tools.base import (
    Effect,
    FunctionTool,
    RunContext,
    Tool,
    ToolArgumentsError,
    ToolSpec,
    tool,
)

__all__ = [
    "Effect",
    "FunctionTool",
    "RunContext",
    "Tool",
    "ToolArgumentsError",
    "ToolSpec",
    "a2a_agent",
    "mcp_server",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "mcp_server":
        from loom.tools.mcp import mcp_server

        return mcp_server
    if name == "a2a_agent":
        from loom.tools.a2a import a2a_agent

        return a2a_agent
    raise AttributeError(f"module 'loom.tools' has no attribute {name!r}")
