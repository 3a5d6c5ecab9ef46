"""``ItemStore`` on PostgreSQL (``loom.store.items``, migration ``0011_items``).

``items`` as on SQLite (``sqlite_items``), the value as JSONB; its words are a generated
``tsvector`` column (``to_tsvector('simple', value::text)``) with a GIN index, so they are
always in step with the row. A keyword search matches any of the query's words
(``websearch_to_tsquery('simple', 'a or b')``) and ranks with ``ts_rank`` (higher is better).
Owner visibility and expiry are conditions of the one query. A put is one upsert whose
``WHERE`` refuses another owner's key, so two writers racing on a key cannot both win.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from loom.store import pg_sql as q
from loom.store.items import (
    Item,
    ItemOwned,
    check_filter,
    check_key,
    check_limit,
    check_namespace,
    check_value,
    terms_of,
)
from loom.store.items_sql import (
    check_max_depth,
    check_ttl,
    expiry_of,
    item_of_row,
    like_prefix,
    namespace_text,
    shape_namespaces,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PostgresItems", "tsquery_text"]

T = TypeVar("T")

_LIVE = "(i.expires_at IS NULL OR i.expires_at > %s)"


def tsquery_text(query: str) -> str:
    """``websearch_to_tsquery`` input matching any of ``query``'s words (each quoted: a word
    such as ``or`` is not read as an operator); empty when it has none."""
    return " or ".join(f'"{w}"' for w in dict.fromkeys(terms_of(query)))


def _visible(owner: str | None, now: float) -> tuple[str, list[Any]]:
    if owner is None:
        return _LIVE, [now]
    return f"{_LIVE} AND i.owner = %s", [now, owner]


def _under(prefix: tuple[str, ...]) -> tuple[str, list[Any]]:
    if not prefix:
        return "true", []
    return "(i.namespace = %s OR i.namespace LIKE %s ESCAPE '\\')", [
        namespace_text(prefix),
        like_prefix(prefix),
    ]


def _matching(wanted: dict[str, Any]) -> tuple[str, list[Any]]:
    """Top-level field equality: the field's JSONB equals the wanted value's."""
    conds = ["(i.value -> %s) = %s::jsonb" for _ in wanted]
    args: list[Any] = []
    for field, want in wanted.items():
        args += [field, json.dumps(want, ensure_ascii=False)]
    return (" AND ".join(conds) or "true"), args


class PostgresItems:
    """``ItemStore`` on ``_run``."""

    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        raise NotImplementedError

    async def _rows(self, doing: str, sql: str, args: Sequence[Any]) -> list[Any]:
        async def read(conn: AsyncConnection[Any]) -> list[Any]:
            return await (await conn.execute(sql, args)).fetchall()

        return await self._run(doing, read)

    async def put_item(
        self,
        namespace: Sequence[str],
        key: str,
        value: dict[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
    ) -> Item:
        """Write (insert or replace) an item in one statement; ``ItemOwned`` when another
        owner holds the key (nothing written)."""
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        ttl = check_ttl(ttl)
        args = {
            "ns": namespace_text(ns),
            "key": key,
            "value": json.dumps(value, ensure_ascii=False),
            "owner": owner,
            "now": time.time(),
            "expires": expiry_of(ttl),
        }

        async def put(conn: AsyncConnection[Any]) -> Any:
            return await (await conn.execute(q.PUT_ITEM, args)).fetchone()

        # Idempotent (the same value and times again), so it is re-sent after a lost connection.
        row = await self._run("storing an item", put)
        if row is None:
            raise ItemOwned(
                f"key {key!r} in namespace {list(ns)} is another owner's; pick another key"
            )
        return item_of_row(row)

    async def get_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> Item | None:
        """The item, or None (absent, expired, or another owner's)."""
        stored_ns, key = namespace_text(check_namespace(namespace)), check_key(key)
        seen, args = _visible(owner, time.time())
        rows = await self._rows(
            "reading an item",
            f"SELECT {q.ITEM_COLS} FROM items i WHERE i.namespace = %s AND i.key = %s AND {seen}",
            [stored_ns, key, *args],
        )
        return item_of_row(rows[0]) if rows else None

    async def delete_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> bool:
        """Delete the item; False when there was none the caller could see."""
        stored_ns, key = namespace_text(check_namespace(namespace)), check_key(key)
        seen, args = _visible(owner, time.time())
        rows = await self._rows(
            "deleting an item",
            f"DELETE FROM items i WHERE i.namespace = %s AND i.key = %s AND {seen} RETURNING i.key",
            [stored_ns, key, *args],
        )
        return bool(rows)

    async def search_items(
        self,
        prefix: Sequence[str],
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        owner: str | None = None,
    ) -> list[Item]:
        """Items under ``prefix`` matching ``filter`` and, with a ``query``, any of its words
        (``ts_rank``, best first); without one, newest first. One query."""
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        seen, seen_args = _visible(owner, time.time())
        under, under_args = _under(ns)
        match, match_args = _matching(wanted)
        where = f"{seen} AND {under} AND {match}"
        args: list[Any] = [*seen_args, *under_args, *match_args]
        if query:
            text = tsquery_text(query)
            if not text:
                return []
            sql = (
                f"SELECT {q.ITEM_COLS}, ts_rank(i.words, t.q) AS score "
                "FROM items i, websearch_to_tsquery('simple', %s) AS t(q) "
                f"WHERE i.words @@ t.q AND {where} "
                "ORDER BY score DESC, i.namespace, i.key LIMIT %s OFFSET %s"
            )
            args = [text, *args, limit, offset]
        else:
            sql = (
                f"SELECT {q.ITEM_COLS} FROM items i WHERE {where} "
                "ORDER BY i.updated_at DESC, i.namespace DESC, i.key DESC LIMIT %s OFFSET %s"
            )
            args = [*args, limit, offset]
        return [item_of_row(r) for r in await self._rows("searching items", sql, args)]

    async def list_namespaces(
        self,
        *,
        prefix: Sequence[str] = (),
        suffix: Sequence[str] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        owner: str | None = None,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items the caller can see, sorted, cut to ``max_depth``."""
        pre = check_namespace(prefix, prefix=True)
        suf = check_namespace(suffix, prefix=True)
        limit, offset = check_limit(limit, offset)
        depth = check_max_depth(max_depth)
        seen, seen_args = _visible(owner, time.time())
        under, under_args = _under(pre)
        rows = await self._rows(
            "listing item namespaces",
            f"SELECT DISTINCT i.namespace FROM items i WHERE {seen} AND {under}",
            [*seen_args, *under_args],
        )
        return shape_namespaces(
            [r[0] for r in rows], suffix=suf, max_depth=depth, limit=limit, offset=offset
        )

    async def purge_expired_items(self, now: datetime) -> int:
        """Delete every item expired at ``now`` (one statement); how many there were."""

        async def purge(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(q.PURGE_EXPIRED_ITEMS, (now.timestamp(),))).rowcount

        return await self._run("purging expired items", purge)

    async def delete_owner_items(self, owner: str) -> int:
        """Delete every item of ``owner`` (forgetting a user); how many there were."""

        async def delete(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(q.DELETE_OWNER_ITEMS, (owner,))).rowcount

        return await self._run("forgetting an owner's items", delete)
