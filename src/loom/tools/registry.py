"""Turning what ``Agent(tools=[...])`` receives into ``Tool`` objects; built-in tools by name."""

from __future__ import annotations

import importlib
from typing import Any

from loom.errors import AgentDefinitionError
from loom.tools.base import FunctionTool, Tool

__all__ = ["BUILTIN_TOOLS", "builtin_tool", "resolve_tool"]

# name -> "module:attribute"; imported only when an agent asks for the name.
BUILTIN_TOOLS: dict[str, str] = {
    "add": "loom.tools.basic:add",
    "multiply": "loom.tools.basic:multiply",
    "current_time": "loom.tools.basic:current_time",
    "read_file": "loom.tools.builtin.files:read_file",
    "write_file": "loom.tools.builtin.files:write_file",
    "edit_file": "loom.tools.builtin.files:edit_file",
    "list_dir": "loom.tools.builtin.files:list_dir",
    "glob": "loom.tools.builtin.search:glob",
    "grep": "loom.tools.builtin.search:grep",
    "bash": "loom.tools.builtin.shell:bash",
    "python": "loom.tools.builtin.python:python",
    "web_fetch": "loom.tools.builtin.web:web_fetch",
    "remember": "loom.memory.tools:remember",
    "memory_write": "loom.memory.tools:memory_write",
}


def builtin_tool(name: str) -> Tool:
    """The built-in tool called ``name``; the error lists the names there are."""
    target = BUILTIN_TOOLS.get(name)
    if target is None:
        known = ", ".join(sorted(BUILTIN_TOOLS))
        raise AgentDefinitionError(
            f"there is no built-in tool named {name!r}; built-in tools are: {known}. "
            "Pass your own tools as @tool functions.",
            field="tools",
        )
    module_name, _, attr = target.partition(":")
    found: Tool = getattr(importlib.import_module(module_name), attr)
    return found


def resolve_tool(item: Any) -> Tool:
    """A ``Tool`` for a tool object, a plain function, or a built-in tool's name."""
    if isinstance(item, FunctionTool):
        return item
    if isinstance(item, str):
        return builtin_tool(item)
    if all(hasattr(item, a) for a in ("name", "parameters", "run", "validate")):
        return item  # type: ignore[no-any-return]
    if callable(item):
        return FunctionTool(item)
    raise AgentDefinitionError(
        f"cannot use {item!r} as a tool: pass an @tool function, a Tool object or a built-in "
        "tool's name",
        field="tools",
    )
