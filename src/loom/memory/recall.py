"""Recall: memories from earlier sessions, searched once per turn for the Kernel.

With ``MemoryConfig(recall=RecallConfig(...))`` the turn calls :func:`recall` once, at its first
CONTEXT, with the latest user message and the run's owner (``RunOptions.owner``); the answer
(:class:`Recalled`) rides on every ``ContextRequest`` of that turn, so a tool loop of many
iterations searches once. The segmented context builder places the memories inside the Kernel
segment, whole, within their own budget (``loom.memory.assembly``).

A plugin in the house style: it takes data and returns data. It never raises for the store's
sake: a store without items, a search that fails or outlasts ``RecallConfig.timeout`` answer
no memories and a ``warning`` the turn journals as a ``WARNING`` event; the turn goes on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.memory.item_tools import namespace_for
from loom.store.items import terms_of

if TYPE_CHECKING:
    from loom.memory.config import RecallConfig
    from loom.store.base import ItemStore

__all__ = ["Recalled", "RecalledMemory", "recall"]


@dataclass(frozen=True, slots=True)
class RecalledMemory:
    """One memory found for the turn: its item's namespace and key, its text, its score."""

    namespace: tuple[str, ...]
    key: str
    text: str
    score: float | None = None


@dataclass(frozen=True, slots=True)
class Recalled:
    """What one turn recalled: its memories, best first, and why there are none when the
    search failed (``warning``)."""

    memories: tuple[RecalledMemory, ...] = ()
    warning: str | None = None


NOTHING = Recalled()


async def recall(
    config: RecallConfig,
    items: ItemStore | None,
    query: str,
    *,
    owner: str | None,
    agent: str,
) -> Recalled:
    """The memories ``config`` asks for, for ``query`` (the latest user message), searched as
    ``owner`` (None: shared) in each configured namespace (one store query each, under one
    timeout); the best ``config.limit`` of them, best first."""
    if not terms_of(query):
        return NOTHING  # a message without words matches nothing: no query at all
    if items is None:
        return Recalled(
            warning="recall is on but this store keeps no memory items (no ItemStore "
            "capability); use a store that has them, or turn MemoryConfig.recall off"
        )
    spaces = [namespace_for(t, owner=owner, agent=agent) for t in config.namespaces]
    try:
        async with asyncio.timeout(config.timeout):
            found = [
                item
                for space in spaces
                for item in await items.search_items(
                    space, query=query, limit=config.limit, owner=owner
                )
            ]
    except TimeoutError:
        return Recalled(
            warning=f"recall: the memory search took longer than {config.timeout:g} s; "
            "this turn goes on without recalled memories"
        )
    except Exception as exc:  # the store's failure is not the turn's: no recall, a warning
        return Recalled(
            warning=f"recall: the memory search failed ({type(exc).__name__}: {exc}); "
            "this turn goes on without recalled memories"
        )
    if len(spaces) > 1:  # each namespace ranked its own: merge by score, best first
        found.sort(key=lambda i: -(i.score or 0.0))
    seen: set[tuple[tuple[str, ...], str]] = set()
    out: list[RecalledMemory] = []
    for item in found:
        where = (item.namespace, item.key)
        if where in seen:
            continue
        seen.add(where)
        text = item.value.get("text")
        out.append(
            RecalledMemory(
                item.namespace,
                item.key,
                text if isinstance(text, str) else _as_text(item.value),
                item.score,
            )
        )
        if len(out) >= config.limit:
            break
    return Recalled(tuple(out))


def _as_text(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, default=str)
