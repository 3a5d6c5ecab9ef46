"""LangGraph's Store API on ``loom serve``: memory across sessions over HTTP (issue #29).

The paths, bodies and answers of ``client.store`` in ``langgraph-sdk``:

- ``PUT /store/items``: ``namespace``, ``key``, ``value``, ``index``, ``ttl`` (minutes); 204.
- ``GET /store/items``: ``namespace`` dotted (or repeated, one part each, as the Agent
  Protocol has it) and ``key`` as query parameters; the item, or ``null`` when there is none
  the caller can see.
- ``DELETE /store/items``: ``namespace``, ``key`` in the body; 204.
- ``POST /store/items/search``: ``namespace_prefix``, ``filter``, ``limit``, ``offset``,
  ``query`` (and Loom's ``mode``); ``{"items": [...]}``, each with its ``score`` under a
  query. With an embedder (``LOOM_EMBEDDER``) a query is a hybrid search (keywords and
  meaning, fused by rank); without one, a keyword search.
- ``POST /store/namespaces``: ``prefix``, ``suffix``, ``max_depth``, ``limit``, ``offset``;
  ``{"namespaces": [[...]]}``.

The server's store must have the ``ItemStore`` capability (``capabilities_of(store).items``);
without it every path answers 422 saying so. With API keys an item belongs to the key that
wrote it: the store hides other keys' items (absent from reads, searches and namespaces) and
refuses a write to a key another owner holds (409 ``ItemOwned``); an admin key writes shared
items (no owner) and sees every item. Bad input is 422 in the server's error shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from loom.errors import InputError
from loom.server.app import error_body, state_of
from loom.server.ownership import Principal, current_principal
from loom.store.base import ItemStore, capabilities_of
from loom.store.items import Item, ItemOwned, check_key, check_namespace

__all__ = ["MAX_TTL_MINUTES", "item_json", "router"]

router: APIRouter = APIRouter(tags=["store"])


class PutItem(BaseModel):
    """``PUT /store/items``: ``ttl`` is in minutes, as LangGraph has it; ``index`` is what is
    embedded for semantic search (``false``: nothing; a list: those fields; absent: the whole
    value)."""

    model_config = ConfigDict(extra="ignore")
    namespace: list[Any]
    key: Any
    value: Any
    index: Any = None
    ttl: float | None = None


class DeleteItem(BaseModel):
    """``DELETE /store/items``."""

    model_config = ConfigDict(extra="ignore")
    namespace: list[Any] = []
    key: Any


class SearchItems(BaseModel):
    """``POST /store/items/search``."""

    model_config = ConfigDict(extra="ignore")
    namespace_prefix: list[Any] = []
    filter: Any = None
    limit: Any = 10
    offset: Any = 0
    query: str | None = None
    mode: str | None = None  # Loom's: keyword, semantic or hybrid (default as the store's)


class ListNamespaces(BaseModel):
    """``POST /store/namespaces``."""

    model_config = ConfigDict(extra="ignore")
    prefix: list[Any] | None = None
    suffix: list[Any] | None = None
    max_depth: int | None = None
    limit: Any = 100
    offset: Any = 0


def item_json(item: Item) -> dict[str, Any]:
    """``item`` as LangGraph's Store API answers it (``score`` only from a search)."""
    out: dict[str, Any] = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
    }
    if item.score is not None:
        out["score"] = item.score
    return out


def _items_of(request: Request) -> ItemStore:
    items = capabilities_of(state_of(request).runtime.store).items
    if items is None:
        raise InputError(
            "this server's store keeps no memory items (it lacks the ItemStore capability): "
            "serve with a store that has it, e.g. --store :memory:"
        )
    return items


def _owner() -> str | None:
    """The owner the request reads and writes as: its key's name; None (shared, sees all)
    without keys or for an admin key."""
    principal: Principal | None = current_principal.get()
    return None if principal is None or principal.admin else principal.name


MAX_TTL_MINUTES = 100 * 366 * 24 * 60  # a century: beyond it a date overflows somewhere


def _seconds(ttl_minutes: float) -> float:
    """LangGraph's ``ttl`` (minutes) in seconds, or ``InputError`` for one that is not a
    positive number of at most :data:`MAX_TTL_MINUTES`."""
    if not 0 < ttl_minutes <= MAX_TTL_MINUTES:  # NaN fails too
        raise InputError(
            f"ttl is a positive number of minutes up to {MAX_TTL_MINUTES:,} (a century), got "
            f"{ttl_minutes!r}; leave it out for an item that never expires"
        )
    return ttl_minutes * 60


def _owned(exc: ItemOwned) -> JSONResponse:
    return JSONResponse(error_body("ItemOwned", str(exc)), status_code=409)


@router.put("/store/items", status_code=204, summary="Write an item")
async def put_item(body: PutItem, request: Request) -> Response:
    store = _items_of(request)
    ttl = None if body.ttl is None else _seconds(body.ttl)
    try:
        await store.put_item(
            body.namespace, body.key, body.value, owner=_owner(), ttl=ttl, index=body.index
        )
    except ItemOwned as exc:
        return _owned(exc)
    return Response(status_code=204)


@router.get("/store/items", summary="Read an item")
async def get_item(
    request: Request,
    key: str = Query(""),
    namespace: list[str] = Query(
        [], description="Dotted (a.b, langgraph-sdk) or one part per parameter (Agent Protocol)"
    ),
) -> JSONResponse:
    store = _items_of(request)
    if len(namespace) == 1:  # langgraph-sdk sends the parts joined with dots
        namespace = namespace[0].split(".") if namespace[0] else []
    item = await store.get_item(check_namespace(namespace), check_key(key), owner=_owner())
    return JSONResponse(None if item is None else item_json(item))


@router.delete("/store/items", status_code=204, summary="Delete an item")
async def delete_item(body: DeleteItem, request: Request) -> Response:
    store = _items_of(request)
    await store.delete_item(body.namespace, body.key, owner=_owner())
    return Response(status_code=204)


@router.post("/store/items/search", summary="Search items under a namespace prefix")
async def search_items(body: SearchItems, request: Request) -> dict[str, Any]:
    store = _items_of(request)
    found = await store.search_items(
        body.namespace_prefix,
        query=body.query,
        filter=body.filter,
        limit=body.limit,
        offset=body.offset,
        owner=_owner(),
        mode=body.mode,
    )
    return {"items": [item_json(i) for i in found]}


@router.post("/store/namespaces", summary="List namespaces")
async def list_namespaces(body: ListNamespaces, request: Request) -> dict[str, Any]:
    store = _items_of(request)
    found = await store.list_namespaces(
        prefix=body.prefix or (),
        suffix=body.suffix or (),
        max_depth=body.max_depth,
        limit=body.limit,
        offset=body.offset,
        owner=_owner(),
    )
    return {"namespaces": [list(ns) for ns in found]}
