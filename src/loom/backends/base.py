"""The ``Backend`` protocol: a domain (a database, an HTTP API, a document folder) offered to an
agent as tools, with its schema in the agent's ROM.

A backend is configuration plus whatever connection it opens lazily; the runtime asks it for
its tools and its schema text at the start of every turn (both cached inside the backend).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from loom.tools.base import Tool

__all__ = ["Backend", "approx_tokens", "trim_to_tokens"]


@runtime_checkable
class Backend(Protocol):
    """A source of domain operations for an agent (seed 000's ``ExecutionBackend``).

    ``tools()`` returns the operations as Loom tools: reads are ``effect="pure"``, writes
    ``"at_most_once"``. ``schema_text(budget)`` describes the domain for the ROM in at most
    ``budget`` tokens, most relevant first. ``close()`` releases connections and watchers.
    """

    name: str

    def tools(self) -> list[Tool]:
        """The operations, as tools (the same objects on every call)."""
        ...

    def schema_text(self, budget: int) -> str:
        """What the model should know about the domain, within ``budget`` tokens."""
        ...

    def close(self) -> None:
        """Release what the backend holds (connections, watcher threads)."""
        ...


def approx_tokens(text: str) -> int:
    """A cheap, slightly pessimistic token estimate (the context builder counts exactly)."""
    return (len(text) + 2) // 3


def trim_to_tokens(lines: list[str], budget: int) -> str:
    """Join ``lines`` (most relevant first), stopping before the budget runs out; says what
    was left out so the model knows to ask (describe_table, ...) for the rest."""
    kept: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        cost = approx_tokens(line) + 1
        if used + cost > budget:
            left = len(lines) - i
            kept.append(f"... ({left} more lines left out to fit the context budget)")
            break
        kept.append(line)
        used += cost
    return "\n".join(kept)
