"""Tools over the store's items (memory across sessions) and over the session's own history.

- ``save_memory(text, key?)``, ``recall_memories(query, limit)``, ``forget_memory(key)``: items
  ``{"text": ...}`` in the namespace ``MemoryConfig.store_namespace`` names, owned by the run's
  owner, ``RunContext.owner``: decided once when the run started (``RunOptions.owner``; the API
  key's principal when served, a schedule's ``principal`` for its runs, the session's recorded
  owner for a worker's, a resumed or a carried-on run; ``None`` in local code: shared). They
  outlive the session, unlike the Kernel's ``remember``, which holds a fact for one session
  only.
- ``search_history(query, limit)``: the session's own earlier messages that share words with the
  query, read from the stored transcript, so turns the context builder summarised away are
  found too.

Nothing the model can fix raises: a bad key, a query without words, or a store without the
``ItemStore`` capability is an error result (``ToolError``) saying what to do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from loom.errors import InputError, ToolError
from loom.store.items import terms_of
from loom.tools.base import FunctionTool, RunContext

if TYPE_CHECKING:
    from loom.memory.config import MemoryConfig
    from loom.store.base import ItemStore

__all__ = [
    "HISTORY_TOOL_NAMES",
    "ITEM_TOOL_NAMES",
    "SHARED_OWNER",
    "history_tools",
    "item_tools",
    "namespace_for",
    "search_history",
]

ITEM_TOOL_NAMES = ("save_memory", "recall_memories", "forget_memory")
HISTORY_TOOL_NAMES = ("search_history",)
SHARED_OWNER = "shared"
"""What ``{owner}`` becomes in a namespace when the run has no owner (local code)."""

_HISTORY = "search_history"
EXCERPT_CHARS = 240
MAX_RESULTS = 20


def namespace_for(template: Sequence[str], *, owner: str | None, agent: str) -> tuple[str, ...]:
    """``template`` with ``{owner}`` (``"shared"`` without one) and ``{agent}`` filled in."""
    values = {"owner": owner if owner is not None else SHARED_OWNER, "agent": agent or "agent"}
    return tuple(part.format(**values) for part in template)


def _items_of(ctx: RunContext) -> ItemStore:
    from loom.store.base import capabilities_of

    store = ctx.store
    items = capabilities_of(store).items if store is not None else None
    if items is None:
        raise ToolError(
            f"this agent's store ({type(store).__name__}) keeps no memories across sessions; "
            "run it on a store with items (MemoryStore, or one whose capabilities list items)",
            code="unavailable",
        )
    return items


def _excerpt(text: str, words: set[str]) -> str:
    """About :data:`EXCERPT_CHARS` characters of ``text`` around its first matching word."""
    flat = " ".join(text.split())
    if len(flat) <= EXCERPT_CHARS:
        return flat
    lower = flat.lower()
    first = min((i for w in words if (i := lower.find(w)) >= 0), default=0)
    start = max(0, first - EXCERPT_CHARS // 3)
    piece = flat[start : start + EXCERPT_CHARS]
    return ("…" if start else "") + piece + ("…" if start + EXCERPT_CHARS < len(flat) else "")


def _query_words(query: str) -> set[str]:
    words = set(terms_of(query))
    if not words:
        raise ToolError(
            f"the query {query[:60]!r} has no words to search for; give a few keywords",
            code="invalid_arguments",
        )
    return words


def item_tools(config: MemoryConfig, taken: Iterable[str] = ()) -> list[FunctionTool]:
    """The tools ``MemoryConfig(store_tools=True)`` adds, minus names the agent already uses."""
    template = tuple(config.store_namespace)

    def where(ctx: RunContext) -> tuple[tuple[str, ...], str | None]:
        owner = ctx.owner  # decided once when the run started (RunOptions.owner)
        return namespace_for(template, owner=owner, agent=ctx.agent_name), owner

    async def save_memory(ctx: RunContext, text: str, key: str | None = None) -> dict[str, Any]:
        """Save a memory that lasts beyond this conversation; find it later with recall_memories.

        Use it for facts worth knowing in later sessions (preferences, decisions, names).
        Saving under an existing key replaces that memory.

        Args:
            text: The memory, one self-contained sentence or short paragraph.
            key: Optional name to update or forget it by later; default: a new key.
        """
        if not text.strip():
            raise ToolError("text must not be empty", code="invalid_arguments")
        items = _items_of(ctx)
        namespace, owner = where(ctx)
        # Without a key, the call's idempotency key names the item: a re-run after a crash
        # replaces the same item instead of writing the memory twice.
        name = key.strip() if key else "m_" + _digest(ctx.idempotency_key)
        try:
            await items.put_item(namespace, name, {"text": text}, owner=owner)
        except InputError as exc:
            raise ToolError(str(exc), code="invalid_arguments") from None
        return {"saved": name}

    async def recall_memories(
        ctx: RunContext,
        query: str,
        limit: Annotated[int, Field(ge=1, le=MAX_RESULTS)] = 5,
    ) -> list[dict[str, Any]]:
        """Search the memories saved in earlier conversations by keywords, best match first.

        Args:
            query: A few keywords, for example "user favourite colour".
            limit: How many memories to return at most (1-20).
        """
        words = _query_words(query)
        items = _items_of(ctx)
        namespace, owner = where(ctx)
        try:
            found = await items.search_items(
                namespace, query=" ".join(sorted(words)), limit=limit, owner=owner
            )
        except InputError as exc:
            raise ToolError(str(exc), code="invalid_arguments") from None
        return [
            {"key": item.key, "text": _excerpt(str(item.value.get("text", item.value)), words)}
            for item in found
        ]

    async def forget_memory(ctx: RunContext, key: str) -> dict[str, Any]:
        """Forget a memory saved in an earlier conversation (its key comes from recall_memories).

        Args:
            key: The memory's key.
        """
        items = _items_of(ctx)
        namespace, owner = where(ctx)
        try:
            gone = await items.delete_item(namespace, key, owner=owner)
        except InputError as exc:
            raise ToolError(str(exc), code="invalid_arguments") from None
        return {"forgotten": key if gone else None}

    names = set(taken)
    made = [
        FunctionTool(save_memory, effect="idempotent"),
        FunctionTool(recall_memories, effect="pure"),
        FunctionTool(forget_memory, effect="idempotent"),
    ]
    return [t for t in made if t.name not in names]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


async def _search_history(
    ctx: RunContext, query: str, limit: Annotated[int, Field(ge=1, le=MAX_RESULTS)] = 5
) -> list[dict[str, Any]]:
    """Search this conversation's earlier messages by keywords, including the ones that were
    summarised out of your context; best match first.

    Args:
        query: A few keywords, for example "invoice number".
        limit: How many messages to return at most (1-20).
    """
    words = _query_words(query)
    if ctx.store is None:
        raise ToolError("this run has no store to read its history from", code="unavailable")
    messages = await ctx.store.load_messages(ctx.session_id)
    # Earlier turns only: the current turn (from its user message on) is in the context
    # already, and its question would match itself. Earlier searches' results are echoes.
    current = max((i for i, m in enumerate(messages) if m.role == "user"), default=len(messages))
    scored: list[tuple[int, int, int]] = []
    for position, message in enumerate(messages[:current]):
        if message.role == "system" or not message.content or message.name == _HISTORY:
            continue
        terms = terms_of(message.content)
        distinct = len(words.intersection(terms))
        if distinct:
            scored.append((-distinct, -sum(1 for t in terms if t in words), position))
    scored.sort()
    return [
        {
            "role": messages[position].role,
            "position": position,
            "excerpt": _excerpt(messages[position].content, words),
        }
        for _, _, position in scored[:limit]
    ]


search_history = FunctionTool(_search_history, name=_HISTORY, effect="pure")


def history_tools(taken: Iterable[str] = ()) -> list[FunctionTool]:
    """The tool ``MemoryConfig(history_tool=True)`` adds, unless the agent has that name."""
    return [] if search_history.name in set(taken) else [search_history]
