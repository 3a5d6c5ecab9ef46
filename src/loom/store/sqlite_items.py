"""``ItemStore`` on SQLite (``loom.store.items``, migration ``0011_items``).

``items`` holds one row per (namespace, key): the namespace as one text column
(``items_sql``), the value as JSON text, owner, and created/updated/expiry times (epoch
seconds). ``items_fts`` is an FTS5 index over the value's JSON text with ``items`` as its
external content (the text is stored once); every write updates both in the same
transaction, so a search never sees an item without its words or words without their item.
A keyword search ranks with BM25 (``score = -bm25()``: higher is better). Owner visibility and
expiry are conditions of the one query, never filtered afterwards (limit and offset count only
what the caller may see).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

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

__all__ = ["ITEMS_MIGRATION", "SQLiteItems", "fts_query"]

T = TypeVar("T")

# Statements split on ';' by the migrator: no triggers (the FTS index is kept in step by the
# writes themselves, in their transaction).
ITEMS_MIGRATION = (
    "CREATE TABLE items ("
    " namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, owner TEXT,"
    " created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL,"
    " PRIMARY KEY (namespace, key));"
    "CREATE INDEX items_owner ON items (owner) WHERE owner IS NOT NULL;"
    "CREATE INDEX items_updated ON items (updated_at);"
    "CREATE VIRTUAL TABLE items_fts USING fts5("
    " value, content='items', content_rowid='rowid', tokenize='unicode61')"
)

_COLS = "i.namespace, i.key, i.value, i.owner, i.created_at, i.updated_at, i.expires_at"
_LIVE = "(i.expires_at IS NULL OR i.expires_at > ?)"


def fts_query(query: str) -> str:
    """An FTS5 match expression for ``query``: any of its words (each quoted, so no word is
    read as an FTS5 operator); empty when it has none."""
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in dict.fromkeys(terms_of(query)))


def _visible(owner: str | None, now: float) -> tuple[str, list[Any]]:
    """The condition (on alias ``i``) for the rows ``owner`` sees at ``now``."""
    if owner is None:
        return _LIVE, [now]
    return f"{_LIVE} AND i.owner = ?", [now, owner]


def _under(prefix: tuple[str, ...]) -> tuple[str, list[Any]]:
    if not prefix:
        return "1", []
    return "(i.namespace = ? OR i.namespace LIKE ? ESCAPE '\\')", [
        namespace_text(prefix),
        like_prefix(prefix),
    ]


def _matching(wanted: dict[str, Any]) -> tuple[str, list[Any]]:
    """Top-level field equality, one ``json_each`` row per field (any field name: no JSON path
    to quote). Booleans and null compare by JSON type, objects and arrays by their JSON."""
    conds: list[str] = []
    args: list[Any] = []
    for field, want in wanted.items():
        base = "EXISTS (SELECT 1 FROM json_each(i.value) f WHERE f.key = ? AND "
        if want is None:
            conds.append(base + "f.type = 'null')")
            args.append(field)
        elif isinstance(want, bool):
            conds.append(base + "f.type = ?)")
            args += [field, "true" if want else "false"]
        elif isinstance(want, int | float):
            conds.append(base + "f.type IN ('integer', 'real') AND f.value = ?)")
            args += [field, want]
        elif isinstance(want, str):
            conds.append(base + "f.type = 'text' AND f.value = ?)")
            args += [field, want]
        else:
            conds.append(base + "f.type IN ('object', 'array') AND f.value = json(?))")
            args += [field, json.dumps(want, ensure_ascii=False)]
    return (" AND ".join(conds) or "1"), args


class SQLiteItems:
    """``ItemStore`` (``loom.store.base``) on top of ``_read`` / ``_write``."""

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def put_item(
        self,
        namespace: Sequence[str],
        key: str,
        value: dict[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
    ) -> Item:
        """Write (insert or replace) an item and its words, in one transaction; ``ItemOwned``
        when another owner holds the key (nothing written)."""
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        ttl = check_ttl(ttl)
        text = json.dumps(value, ensure_ascii=False)
        stored_ns = namespace_text(ns)

        def put(c: sqlite3.Connection) -> Item:
            now = time.time()
            held = c.execute(
                "SELECT rowid, value, owner, created_at, expires_at FROM items "
                "WHERE namespace = ? AND key = ?",
                (stored_ns, key),
            ).fetchone()
            live = held is not None and (held[4] is None or held[4] > now)
            if live and held[2] != owner and owner is not None:
                raise ItemOwned(
                    f"key {key!r} in namespace {list(ns)} is another owner's; pick another key"
                )
            created = held[3] if live else now
            new_owner = owner if held is None or owner is not None else held[2]
            expires = expiry_of(ttl)
            if held is not None:
                rowid = held[0]
                c.execute(
                    "INSERT INTO items_fts (items_fts, rowid, value) VALUES ('delete', ?, ?)",
                    (rowid, held[1]),
                )
                c.execute(
                    "UPDATE items SET value = ?, owner = ?, created_at = ?, updated_at = ?, "
                    "expires_at = ? WHERE rowid = ?",
                    (text, new_owner, created, now, expires, rowid),
                )
            else:
                rowid = c.execute(
                    "INSERT INTO items (namespace, key, value, owner, created_at, updated_at, "
                    "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (stored_ns, key, text, new_owner, created, now, expires),
                ).lastrowid
            c.execute("INSERT INTO items_fts (rowid, value) VALUES (?, ?)", (rowid, text))
            return item_of_row((stored_ns, key, text, new_owner, created, now, expires))

        return await self._write("storing an item", put)

    async def get_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> Item | None:
        """The item, or None (absent, expired, or another owner's)."""
        stored_ns, key = namespace_text(check_namespace(namespace)), check_key(key)
        seen, args = _visible(owner, time.time())
        row = await self._read(
            "reading an item",
            lambda c: c.execute(
                f"SELECT {_COLS} FROM items i WHERE i.namespace = ? AND i.key = ? AND {seen}",
                (stored_ns, key, *args),
            ).fetchone(),
        )
        return item_of_row(row) if row is not None else None

    async def delete_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> bool:
        """Delete the item and its words; False when there was none the caller could see."""
        stored_ns, key = namespace_text(check_namespace(namespace)), check_key(key)

        def delete(c: sqlite3.Connection) -> bool:
            seen, args = _visible(owner, time.time())
            row = c.execute(
                f"SELECT i.rowid, i.value FROM items i WHERE i.namespace = ? AND i.key = ? "
                f"AND {seen}",
                (stored_ns, key, *args),
            ).fetchone()
            if row is None:
                return False
            _forget_rows(c, [(row[0], row[1])])
            return True

        return await self._write("deleting an item", delete)

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
        (BM25, best first); without one, newest first. One query."""
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        seen, seen_args = _visible(owner, time.time())
        under, under_args = _under(ns)
        match, match_args = _matching(wanted)
        where = f"{seen} AND {under} AND {match}"
        args = [*seen_args, *under_args, *match_args]
        if query:
            expression = fts_query(query)
            if not expression:
                return []
            sql = (
                f"SELECT {_COLS}, -bm25(items_fts) AS score FROM items_fts "
                f"JOIN items i ON i.rowid = items_fts.rowid "
                f"WHERE items_fts MATCH ? AND {where} "
                "ORDER BY score DESC, i.namespace, i.key LIMIT ? OFFSET ?"
            )
            args = [expression, *args, limit, offset]
        else:
            sql = (
                f"SELECT {_COLS} FROM items i WHERE {where} "
                "ORDER BY i.updated_at DESC, i.namespace DESC, i.key DESC LIMIT ? OFFSET ?"
            )
            args = [*args, limit, offset]
        rows = await self._read("searching items", lambda c: c.execute(sql, args).fetchall())
        return [item_of_row(r) for r in rows]

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
        stored = await self._read(
            "listing item namespaces",
            lambda c: [
                r[0]
                for r in c.execute(
                    f"SELECT DISTINCT i.namespace FROM items i WHERE {seen} AND {under}",
                    (*seen_args, *under_args),
                )
            ],
        )
        return shape_namespaces(stored, suffix=suf, max_depth=depth, limit=limit, offset=offset)

    async def purge_expired_items(self, now: datetime) -> int:
        """Delete every item expired at ``now`` and its words (expired items are hidden from
        reads already; this frees their rows). How many there were."""

        def purge(c: sqlite3.Connection) -> int:
            rows = c.execute(
                "SELECT rowid, value FROM items WHERE expires_at <= ?", (now.timestamp(),)
            ).fetchall()
            _forget_rows(c, [(r[0], r[1]) for r in rows])
            return len(rows)

        return await self._write("purging expired items", purge)

    async def delete_owner_items(self, owner: str) -> int:
        """Delete every item of ``owner`` and its words; the FTS index is then merged
        (``optimize``), so no segment keeps a deleted word and a ``VACUUM`` leaves none of
        their bytes in the file."""

        def delete(c: sqlite3.Connection) -> int:
            rows = c.execute("SELECT rowid, value FROM items WHERE owner = ?", (owner,)).fetchall()
            _forget_rows(c, [(r[0], r[1]) for r in rows])
            if rows:
                c.execute("INSERT INTO items_fts (items_fts) VALUES ('optimize')")
            return len(rows)

        return await self._write("forgetting an owner's items", delete)


def _forget_rows(c: sqlite3.Connection, rows: list[tuple[int, str]]) -> None:
    """Delete the items at ``rows`` (rowid, stored value) and their words."""
    c.executemany("INSERT INTO items_fts (items_fts, rowid, value) VALUES ('delete', ?, ?)", rows)
    c.executemany("DELETE FROM items WHERE rowid = ?", [(r[0],) for r in rows])
