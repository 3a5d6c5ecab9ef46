"""Tools: ``@tool``, the ``Tool`` protocol, ``RunContext`` and the executor."""

from loom.tools.base import (
    Effect,
    FunctionTool,
    RunContext,
    Tool,
    ToolArgumentsError,
    ToolSpec,
    tool,
)

__all__ = ["Effect", "FunctionTool", "RunContext", "Tool", "ToolArgumentsError", "ToolSpec", "tool"]
