"""Built-in memory tools and the Kernel API.

- ``remember(key, value)``: sets a Kernel fact for the session. The tool's result *is* the
  record: the context builder reads Kernel entries back from the persisted results, so nothing
  else is written and the context stays a function of the transcript.
- ``memory_write(note)``: appends a lasting note to MEMORY.md in the agent's workspace.
- ``set_kernel(store, session_id, key, value)``: the same as ``remember`` from code, journaled
  as a ``MEMORY_RECORD`` whose message is a bookkeeping entry in the transcript (any ``Store``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.errors import ToolError
from loom.memory.compression import append_memory_notes
from loom.messages import new_id
from loom.tools.base import FunctionTool, RunContext, tool

if TYPE_CHECKING:
    from loom.store.base import Store

__all__ = ["memory_file_tool", "memory_tools", "memory_write", "remember", "set_kernel"]


@tool(effect="idempotent", blocking=False)
def remember(key: str, value: str) -> dict[str, Any]:
    """Remember a fact about this session (the user's name, a goal, a preference).

    The fact stays in your context for the rest of the session, even after older turns are
    summarised. Setting a key again replaces its value; an empty value forgets the key.

    Args:
        key: Short name of the fact, for example "user_name" or "goal".
        value: The fact itself.
    """
    key = key.strip()
    if not key:
        raise ToolError("key must not be empty", code="invalid_arguments")
    return {"kernel": {"key": key, "value": value if value.strip() else None}}


def memory_file_tool(path: str | Path | None = None, name: str = "memory_write") -> FunctionTool:
    """A ``memory_write`` tool that appends to ``path`` (relative paths: inside the workspace)."""
    target = Path(path) if path is not None else Path("MEMORY.md")

    def memory_write(ctx: RunContext, note: str) -> str:
        """Save a lasting note to MEMORY.md; it is shown to you in every later conversation.

        Args:
            note: One self-contained fact or lesson worth keeping.
        """
        where = target
        if not where.is_absolute():
            if ctx.workspace is None:
                raise ToolError(
                    "this agent has no workspace, so there is no MEMORY.md to write",
                    code="unavailable",
                )
            where = Path(ctx.workspace) / where
        if not note.strip():
            raise ToolError("note must not be empty", code="invalid_arguments")
        append_memory_notes(where, [note])
        return f"saved to {where.name}"

    return FunctionTool(memory_write, name=name, effect="at_most_once")


memory_write = memory_file_tool()


async def set_kernel(store: Store, session_id: str, key: str, value: str | None) -> None:
    """Set (or with ``None`` remove) a Kernel entry for a session, from code.

    Call it between turns: an entry written while a turn runs is seen from the next turn on.
    The entry is journaled (a ``MEMORY_RECORD`` event of its own run, ``kernel_…``) with the
    message it adds, so the stored transcript stays ``journal.transcript(events)``.
    """
    if not key or not key.strip():
        from loom.errors import InputError

        raise InputError("kernel key must be a non-empty string")
    from loom.engine.journal import Journal
    from loom.events import MemoryRecord  # the journal and events load with the first write

    journal = Journal(store, session_id, new_id("kernel"), [])
    content = f"[kernel] {key} = {value}" if value is not None else f"[kernel] {key} removed"
    record = journal.event(
        MemoryRecord,
        content=content,
        metadata={"loom": "kernel", "key": key.strip(), "value": value},
    )
    await journal.commit([record])


def memory_tools(config: Any, taken: Any = ()) -> list[FunctionTool]:
    """The tools ``MemoryConfig`` adds (``tools``: the Kernel's ``remember`` and
    ``memory_write``; ``store_tools`` and ``history_tool``: ``loom.memory.item_tools``),
    minus names the agent already uses."""
    names = set(taken)
    out: list[FunctionTool] = []
    if config.tools:
        if "remember" not in names:
            out.append(remember)
        if config.memory_file is not None and "memory_write" not in names:
            out.append(memory_file_tool(config.memory_file))
    if getattr(config, "store_tools", False):
        from loom.memory.item_tools import item_tools

        out.extend(item_tools(config, names))
    if getattr(config, "history_tool", False):
        from loom.memory.item_tools import history_tools

        out.extend(history_tools(names))
    return out
