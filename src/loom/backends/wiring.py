"""How an agent's backends reach a turn: their tools join the turn's tool table and their
schema text goes first into the ROM (``RunDeps.rom`` → ``ContextRequest.extra_system``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from loom.tools.base import Tool

if TYPE_CHECKING:
    from loom.spec import AgentSpec

__all__ = ["DEFAULT_ROM_TOKENS", "backend_tools", "rom_share"]

log = logging.getLogger("loom.backends")

DEFAULT_ROM_TOKENS = 1500  # per backend, when the context builder has no ROM budget


def rom_share(agent: AgentSpec, builder: Any, model: Any) -> int:
    """Tokens each backend's schema text may use: the ROM budget shared by the backends,
    keeping one share for matched patterns (they come after the schemas and are cut first)."""
    budgets_for = getattr(builder, "budgets_for", None)
    if not callable(budgets_for):
        return DEFAULT_ROM_TOKENS
    try:
        rom = int(budgets_for(agent, model).rom)
    except Exception:  # a model whose window is unknown yet: the builder cuts the ROM anyway
        return DEFAULT_ROM_TOKENS
    return max(100, rom // (len(agent.backends) + 1))


def backend_tools(
    agent: AgentSpec, base: dict[str, Tool], builder: Any, model: Any
) -> tuple[dict[str, Tool], list[str], list[str]]:
    """This turn's tool table with the backends' tools, their ROM texts, and problems found
    (a name clash skips the backend's tool, as with toolsets; a failing backend is left out)."""
    tools = dict(base)
    rom: list[str] = []
    problems: list[str] = []
    share = rom_share(agent, builder, model)
    for b in agent.backends:
        name = getattr(b, "name", type(b).__name__)
        try:
            offered = b.tools()
            text = b.schema_text(share)
        except Exception as exc:
            problems.append(f"backend {name!r} is unavailable this turn: {exc}")
            continue
        problems.extend(getattr(b, "problems", None) or ())
        for t in offered:
            if t.name in tools:
                problems.append(
                    f"backend {name!r} offers a tool named {t.name!r}, which is already taken; "
                    "it is skipped. Give the backend a prefix (prefix='name_') to use both."
                )
                continue
            tools[t.name] = t
        if text:
            rom.append(text)
    for p in problems:
        log.warning("%s", p)
    return tools, rom, problems
