"""Context passing: what one member hands the next, decided per edge and recorded.

Policies (``Step(context=...)``, ``Task(context=...)``, ``Handoff(context=...)``):

- ``brief`` (default): the task statement the sender wrote (its final answer, a manager's
  ``delegate(task=...)``, a ``transfer(brief=...)``), nothing else;
- ``last_n:N``: the last N messages of the sender's run, as text;
- ``summary``: a summary of the sender's run, written by a summarizer run on the sender's model
  (its own child session, charged to the budget);
- ``full``: the sender's whole run (every message it added), as text;
- ``none``: nothing from the sender; the member gets the crew's task.

The text that was passed is recorded in the crew's journal (``CREW_MEMBER_START.context``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loom.errors import CrewDefinitionError
from loom.messages import Message
from loom.text import whole_number

__all__ = ["ContextPolicy", "parse_policy", "render_messages"]

PolicyKind = Literal["brief", "last_n", "summary", "full", "none"]


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """One edge's policy: ``kind`` and, for ``last_n``, how many messages."""

    kind: PolicyKind = "brief"
    n: int = 0

    def __str__(self) -> str:
        return f"last_n:{self.n}" if self.kind == "last_n" else self.kind


def parse_policy(value: ContextPolicy | str) -> ContextPolicy:
    """``"brief"``, ``"last_n:4"``, ``"summary"``, ``"full"``, ``"none"`` or a ``ContextPolicy``."""
    if isinstance(value, ContextPolicy):
        if value.kind == "last_n" and value.n < 1:
            raise CrewDefinitionError("last_n needs n >= 1")
        return value
    if not isinstance(value, str):
        raise CrewDefinitionError(f"a context policy is a string, got {type(value).__name__}")
    text = value.strip()
    if text in ("brief", "summary", "full", "none"):
        return ContextPolicy(text)  # type: ignore[arg-type]
    if text.startswith("last_n"):
        _, _, count = text.partition(":")
        n = whole_number(count.strip())
        if n is not None and n >= 1:
            return ContextPolicy("last_n", n)
        raise CrewDefinitionError(f"{value!r}: write last_n:N with N >= 1 (e.g. last_n:4)")
    raise CrewDefinitionError(
        f"unknown context policy {value!r}; use brief, last_n:N, summary, full or none"
    )


def render_messages(messages: list[Message]) -> str:
    """Messages as plain text for another member to read (tool calls and results included)."""
    lines: list[str] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
            lines.append(f"assistant: {m.content + ' ' if m.content else ''}[calls {calls}]")
        elif m.role == "tool":
            lines.append(f"tool {m.name}: {m.content}")
        else:
            lines.append(f"{m.role}: {m.content}")
    return "\n".join(lines)
