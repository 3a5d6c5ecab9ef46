"""Tools: ``@tool``, the ``Tool`` protocol, ``RunContext`` and the executor.

``mcp_server`` (MCP servers as tools) loads the ``mcp`` SDK only when used.
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
    "mcp_server",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "mcp_server":
        from loom.tools.mcp import mcp_server

        return mcp_server
    raise AttributeError(f"module 'loom.tools' has no attribute {name!r}")
