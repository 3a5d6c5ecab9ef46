"""The console's memories page: the items of memory across sessions (``loom.store.items``)
that the logged-in key sees, by namespace, searched by keywords, deleted one by one.

Everything goes through the store's ``ItemStore`` capability, as the Store API
(``/store/*``) and ``loom memory`` do, with the owner the Store API uses
(:func:`loom.server.ownership.owner_filter`: a key sees its own items, an admin key and a
server without keys see every item). An item another key holds does not exist for this one:
deleting it is the 404 page and deletes nothing.

Namespaces are written dotted in addresses (``?ns=users.alice``), as ``loom memory`` and
LangGraph's ``GET /store/items`` take them (a part cannot hold a ``.``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from loom.errors import InputError
from loom.server.app import state_of
from loom.server.console.routes import csrf_refused, form_fields, page, problem, router, safe_next
from loom.server.ownership import current_principal, owner_filter
from loom.store.base import capabilities_of
from loom.store.items import check_key, check_limit, check_namespace
from loom.text import whole_number

if TYPE_CHECKING:
    from loom.store.base import ItemStore
    from loom.store.items import Item

__all__ = [
    "COMPACT_JSON",
    "ITEMS_PER_PAGE",
    "MAX_ITEMS_PER_PAGE",
    "NAMESPACES_SHOWN",
    "VALUE_CHARS",
    "MemoryView",
    "dotted",
    "parse_dotted",
]

ITEMS_PER_PAGE = 50
MAX_ITEMS_PER_PAGE = 200
"""The largest ``?limit=`` the page takes (the store answers up to 1,000 a call; a page of more
than 200 rows is for a script, which has ``POST /store/items/search``)."""
NAMESPACES_SHOWN = 500
"""Namespaces listed beside the items (past them the page says so; a namespace's address
still opens it)."""
VALUE_CHARS = 1000
"""Characters of an item's value shown; a longer one is cut and its size said."""
COMPACT_JSON = 80
"""A value's JSON up to this long is shown on one line; a longer one indented."""


@dataclass(frozen=True, slots=True)
class MemoryView:
    """One item as the page shows it: its ``text`` field (when the value has one) and the
    rest of the value as JSON, each cut to :data:`VALUE_CHARS`, with the value's size."""

    item: Item
    text: str | None
    rest: str | None
    size: int
    cut: bool

    @property
    def namespace(self) -> str:
        """The item's namespace, dotted."""
        return dotted(self.item.namespace)

    @classmethod
    def of(cls, item: Item) -> MemoryView:
        value = item.value
        # its size as stored: compact JSON, UTF-8
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        text = value.get("text") if isinstance(value.get("text"), str) else None
        others = {k: v for k, v in value.items() if k != "text"} if text is not None else value
        rest = None
        if others:
            rest = json.dumps(others, ensure_ascii=False, default=str)
            if len(rest) > COMPACT_JSON:
                rest = json.dumps(others, indent=2, ensure_ascii=False, default=str)
        cut = False
        if text is not None and len(text) > VALUE_CHARS:
            text, cut = text[:VALUE_CHARS], True
        if rest is not None and len(rest) > VALUE_CHARS:
            rest, cut = rest[:VALUE_CHARS], True
        return cls(item, text, rest, len(encoded.encode()), cut)


def dotted(namespace: tuple[str, ...]) -> str:
    """A namespace as the page's addresses write it: ``users.alice``."""
    return ".".join(namespace)


def parse_dotted(text: str) -> tuple[str, ...]:
    """``users.alice`` as ``("users", "alice")`` (empty: every namespace), or ``InputError``
    saying which part is wrong."""
    return check_namespace(text.split(".") if text else [], prefix=True)


def _whole(name: str, text: str, default: int) -> int:
    if not text:
        return default
    number = whole_number(text.strip(), max_digits=12)
    if number is None:
        raise InputError(f"{name} must be a whole number >= 0, got {text[:40]!r}")
    return number


def _items(request: Request) -> ItemStore | None:
    return capabilities_of(state_of(request).runtime.store).items


def _address(ns: str = "", q: str = "", limit: int = ITEMS_PER_PAGE, offset: int = 0) -> str:
    """The page's address for these choices (defaults left out)."""
    params: dict[str, str | int] = {"ns": ns, "q": q}
    if limit != ITEMS_PER_PAGE:
        params["limit"] = limit
    if offset:
        params["offset"] = offset
    kept = {k: v for k, v in params.items() if v != ""}
    return "/console/memories" + (f"?{urlencode(kept)}" if kept else "")


@router.get("/memories")
async def memories_page(
    request: Request, ns: str = "", q: str = "", limit: str = "", offset: str = ""
) -> Response:
    """The namespaces the key sees; the items under ``ns`` (all without), newest first, or
    those matching ``q`` best first with their scores; ``limit`` / ``offset`` page them."""
    store = _items(request)
    context: dict[str, Any] = {
        "nav": "memories",
        "ns": ns,
        "q": q,
        "namespaces": [],
        "more_namespaces": False,
        "views": [],
        "error": "",
        "reason": "",
        "limit": ITEMS_PER_PAGE,
        "offset": 0,
        "show_owner": False,
        "here": _address(ns, q),
        "prev_href": "",
        "next_href": "",
        "search_ns": "",
        "address": _address,
    }
    if store is None:
        context["reason"] = (
            f"this server's store ({type(state_of(request).runtime.store).__name__}) keeps no "
            "memory items (it lacks the ItemStore capability); serve with one that has it, "
            "e.g. SQLite (the default), PostgreSQL or --store :memory:"
        )
        return page(request, "memories.html", **context)
    owner = owner_filter(current_principal.get())
    found = await store.list_namespaces(limit=NAMESPACES_SHOWN + 1, owner=owner)
    context["namespaces"] = [dotted(n) for n in found[:NAMESPACES_SHOWN]]
    context["more_namespaces"] = len(found) > NAMESPACES_SHOWN
    try:
        prefix = parse_dotted(ns)
        context["search_ns"] = ns  # a search from this page stays in a namespace that is one
        size = _whole("limit", limit, ITEMS_PER_PAGE)
        start = _whole("offset", offset, 0)
        check_limit(size, start)
        if size > MAX_ITEMS_PER_PAGE:
            raise InputError(f"limit is at most {MAX_ITEMS_PER_PAGE} items a page, got {size}")
    except InputError as exc:
        context["error"] = f"{exc}. Fix the address, or pick a namespace from the list."
        return page(request, "memories.html", 422, **context)
    # one more than the page shows says whether there is a next page
    items = await store.search_items(
        prefix, query=q.strip() or None, limit=size + 1, offset=start, owner=owner
    )
    text = q.strip()
    context.update(
        limit=size,
        offset=start,
        views=[MemoryView.of(i) for i in items[:size]],
        show_owner=owner is None,
        here=_address(ns, text, size, start),
        prev_href=_address(ns, text, size, max(0, start - size)) if start else "",
        next_href=_address(ns, text, size, start + size) if len(items) > size else "",
    )
    return page(request, "memories.html", **context)


@router.post("/memories/delete")
async def delete_memory(request: Request) -> Response:
    """Delete one item (``ns`` dotted, ``key``) the key sees, then back to ``next``; an item
    it does not see (another key's, or gone) is the 404 page and nothing is deleted."""
    form = await form_fields(request)
    refused = csrf_refused(request, form)
    if refused is not None:
        return refused
    store = _items(request)
    if store is None:
        return problem(request, 404, "Not found", "this server's store keeps no memory items")
    try:
        namespace = check_namespace(form.get("ns", "").split("."))
        key = check_key(form.get("key", ""))
    except InputError as exc:
        return problem(request, 422, "Bad request", f"{exc}; delete from the memories page")
    owner = owner_filter(current_principal.get())
    if not await store.delete_item(namespace, key, owner=owner):
        return problem(
            request,
            404,
            "Not found",
            f"no memory {key!r} in {dotted(namespace)!r} for this key (deleted already, or "
            "another key's)",
        )
    return RedirectResponse(safe_next(form.get("next") or "/console/memories"), 303)
