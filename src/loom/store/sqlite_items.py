"""``ItemStore`` on SQLite (``loom.store.items``, migration ``0011_items``).

``items`` holds one row per (namespace, key): the namespace as one text column
(``items_sql``), the value as JSON text, owner, and created/updated/expiry times (epoch
seconds). ``items_fts`` is an FTS5 index over the value's JSON text with ``items`` as its
external content (the text is stored once); every write updates both in the same
transaction, so a search never sees an item without its words or words without their item.
A keyword search ranks with BM25 (``score = -bm25()``: higher is better). Owner visibility and
expiry are conditions of the one query, never filtered afterwards (limit and offset count only
what the caller may see).

``item_vectors`` (migration ``0013_item_vectors``) holds one row per indexed item (keyed by
the item's rowid, written and deleted in the item's transaction): the fields embedded, the
embedder's name and dimensions, and the unit vector as float32 bytes (NULL: pending). A
semantic search embeds the query, then scores the vectors of every item the owner, namespace
and filter conditions leave: with ``sqlite-vec`` loaded (``vec_distance_cosine`` in the query,
ordered and limited by SQLite) or, where this Python's ``sqlite3`` cannot load extensions, by
reading those candidates' vectors and scoring them in one numpy product
(``items_vectors.best_by_cosine``). Either way every candidate row is read: there is no
approximate index (a ``vec0`` KNN table would limit before the owner and filter conditions).
Before both, a search goes through the process's copy of the vectors
(``sqlite_vector_cache``: a numpy matrix kept in step with the file), when it is on and fits its
cap: every candidate is still scored, but none is read from the file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from loom.embedding.base import Embedder, EmbedderUnavailable
from loom.store.items import (
    Item,
    ItemOwned,
    check_filter,
    check_key,
    check_limit,
    check_namespace,
    check_value,
)
from loom.store.items_sql import (
    NAMESPACE_SEPARATOR,
    check_max_depth,
    check_ttl,
    expiry_of,
    item_of_row,
    namespace_text,
    shape_namespaces,
)
from loom.store.items_vectors import (
    EMBED_BATCH,
    PendingOnTheWay,
    best_by_cosine,
    check_index,
    check_mode,
    embed_texts,
    fuse,
    hybrid_depth,
    keyword_terms,
    model_mismatch,
    pack_vector,
    stored_error,
    text_to_embed,
    vector_for_put,
)
from loom.store.sqlite_vector_cache import (
    VectorRow,
    bump_generation,
    cache_cap_bytes,
    cache_for,
)

__all__ = [
    "ITEMS_MIGRATION",
    "VECTORS_MIGRATION",
    "SQLiteItems",
    "fts_query",
    "load_vector_functions",
]

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

# The vector last: reading the other columns (pending rows, the models in use) skips its bytes.
VECTORS_MIGRATION = (
    "CREATE TABLE item_vectors ("
    " item_rowid INTEGER PRIMARY KEY, fields TEXT, embedder TEXT, dims INTEGER, vector BLOB);"
    "CREATE INDEX item_vectors_pending ON item_vectors (item_rowid) WHERE vector IS NULL;"
    "CREATE INDEX item_vectors_model ON item_vectors (embedder, dims) WHERE vector IS NOT NULL"
)


def load_vector_functions(conn: sqlite3.Connection) -> bool:
    """Load ``sqlite-vec`` into ``conn`` when it is installed and this Python's ``sqlite3`` can
    load extensions (some builds cannot: then vectors are scored in Python); True when
    loaded."""
    if not hasattr(conn, "enable_load_extension"):
        return False
    try:
        import sqlite_vec  # type: ignore[import-untyped]
    except ImportError:
        return False
    try:
        conn.enable_load_extension(True)
        try:
            sqlite_vec.load(conn)
        finally:
            conn.enable_load_extension(False)
    except sqlite3.Error:
        return False
    return True


_COLS = "i.namespace, i.key, i.value, i.owner, i.created_at, i.updated_at, i.expires_at"
_LIVE = "(i.expires_at IS NULL OR i.expires_at > ?)"


def fts_query(query: str) -> str:
    """An FTS5 match expression for ``query``: any of its key words
    (``items_vectors.keyword_terms``: stop words dropped), each quoted, so no word is read as
    an FTS5 operator; empty when it has none."""
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in keyword_terms(query))


def _visible(owner: str | None, now: float) -> tuple[str, list[Any]]:
    """The condition (on alias ``i``) for the rows ``owner`` sees at ``now``."""
    if owner is None:
        return _LIVE, [now]
    return f"{_LIVE} AND i.owner = ?", [now, owner]


def _under(prefix: tuple[str, ...]) -> tuple[str, list[Any]]:
    """The condition for items at or below ``prefix``: a range of the primary key's index
    (``ns`` up to ``ns/``: '/' follows the separator '.'), then the namespace itself or one
    continuing with a '.' (not ``ns-x``, inside the range too). A range, unlike ``LIKE``, is
    read through the index and compares case-sensitively."""
    if not prefix:
        return "1", []
    text = namespace_text(prefix)
    return (
        "(i.namespace >= ? AND i.namespace < ? "
        "AND (i.namespace = ? OR substr(i.namespace, ?, 1) = '.'))",
        [text, text + _AFTER_SEPARATOR, text, len(text) + 1],
    )


# A vector made by another model than (?1, ?2), if any: four ranges of the (embedder, dims)
# index, each empty when every vector is this model's (no scan of the vectors).
_OTHER_MODEL = (
    " UNION ALL ".join(
        f"SELECT embedder, dims FROM item_vectors WHERE vector IS NOT NULL AND {cond}"
        for cond in (
            "embedder < ?1",
            "embedder > ?1",
            "embedder = ?1 AND dims < ?2",
            "embedder = ?1 AND dims > ?2",
        )
    )
    + " LIMIT 1"
)

# A semantic search reads the candidates' items first when they are under 1/8 of the vectors.
_ITEMS_FIRST_SHARE = 8

_AFTER_SEPARATOR = chr(ord(NAMESPACE_SEPARATOR) + 1)


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


class _Connection(Protocol):
    """What the item store reads of its ``sqlite_db.Database`` (not imported: that module
    imports this one for its migrations)."""

    @property
    def vec(self) -> bool: ...


class SQLiteItems(PendingOnTheWay):
    """``ItemStore`` (``loom.store.base``) on top of ``_read`` / ``_write``; with an
    ``embedder``, vectors too (``loom.store.items_vectors.VectorItems``)."""

    @property
    def embedder(self) -> Embedder | None:
        """The embedder items are embedded with, or None (keyword search only)."""
        return self._embedder

    @property
    def db(self) -> _Connection:
        raise NotImplementedError

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
        index: bool | Sequence[str] | None = None,
    ) -> Item:
        """Write (insert or replace) an item, its words and its vector (``index``), in one
        transaction; ``ItemOwned`` when another owner holds the key (nothing written). The
        embedder runs first, outside the transaction; when it fails the item is stored
        pending its vector (an ``EmbeddingError`` other than the embedder being down is raised
        once it is stored)."""
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        ttl, fields = check_ttl(ttl), check_index(index)
        text = json.dumps(value, ensure_ascii=False)
        stored_ns = namespace_text(ns)
        await self._embed_some_pending()
        vec = await vector_for_put(self._embedder, value, fields)
        model = self._embedder if vec.vector is not None else None
        vector_row = (
            json.dumps(vec.fields) if vec.fields is not None else None,
            model.name if model is not None else None,
            model.dimensions if model is not None else None,
            pack_vector(vec.vector) if vec.vector is not None else None,
        )

        def put(c: sqlite3.Connection) -> tuple[Item, int | None, VectorRow]:
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
            if vec.indexed:
                c.execute(
                    "INSERT OR REPLACE INTO item_vectors (item_rowid, fields, embedder, dims, "
                    "vector) VALUES (?, ?, ?, ?, ?)",
                    (rowid, *vector_row),
                )
            elif held is not None:
                c.execute("DELETE FROM item_vectors WHERE item_rowid = ?", (rowid,))
            # A copy of the vectors can change: a vector written, or an earlier one replaced
            # or removed (a new item pending its vector is in no copy).
            touched = vec.vector is not None or held is not None
            written = VectorRow(rowid, stored_ns, new_owner, expires, vector_row[3] or b"")
            return (
                item_of_row((stored_ns, key, text, new_owner, created, now, expires)),
                bump_generation(c) if touched else None,
                written,
            )

        item, generation, written = await self._write("storing an item", put)
        if generation is not None:
            embedded = written.vector != b""
            await self._apply_to_cache(
                generation,
                upsert=written if embedded else None,
                remove=() if embedded else (written.rowid,),
            )
        if vec.indexed and vec.vector is None:
            self._maybe_pending = True
        if vec.vector is not None:
            self._pending_retry_at = 0.0  # the embedder answers: pending items may go on the way
        if vec.error is not None:
            raise stored_error(vec.error, ns, key)
        return item

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

        def delete(c: sqlite3.Connection) -> tuple[int, int] | None:
            seen, args = _visible(owner, time.time())
            row = c.execute(
                f"SELECT i.rowid, i.value FROM items i WHERE i.namespace = ? AND i.key = ? "
                f"AND {seen}",
                (stored_ns, key, *args),
            ).fetchone()
            if row is None:
                return None
            _forget_rows(c, [(row[0], row[1])])
            return bump_generation(c), row[0]

        deleted = await self._write("deleting an item", delete)
        if deleted is None:
            return False
        await self._apply_to_cache(deleted[0], remove=(deleted[1],))
        return True

    async def _apply_to_cache(
        self,
        generation: int,
        *,
        upsert: VectorRow | None = None,
        remove: Sequence[int] = (),
        drop: bool = False,
    ) -> None:
        """Bring this process's vector copy (``sqlite_vector_cache``) in step with a write that
        committed ``generation``, under the database's lock (a search may be reading it)."""
        cache = cache_for(self.db)
        if cache is None or cache.generation is None:
            return
        cap = cache_cap_bytes()

        def apply(_: sqlite3.Connection) -> None:
            if drop:
                cache.drop()
            else:
                cache.apply(generation, upsert=upsert, remove=remove, cap_bytes=cap)

        await self._read("updating the item vector copy", apply)

    async def search_items(
        self,
        prefix: Sequence[str],
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        owner: str | None = None,
        mode: str | None = None,
    ) -> list[Item]:
        """Items under ``prefix`` matching ``filter`` and, with a ``query``, by ``mode``
        (``loom.store.items_vectors``): keyword (any of its words, BM25, best first), semantic
        (cosine similarity) or hybrid (both, fused by rank); without one, newest first. The
        owner, namespace and filter conditions are part of each ranking's query."""
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        how = check_mode(mode, self._embedder)
        now = time.time()
        seen, seen_args = _visible(owner, now)
        under, under_args = _under(ns)
        match, match_args = _matching(wanted)
        where = f"{seen} AND {under} AND {match}"
        args = [*seen_args, *under_args, *match_args]
        if query and how != "keyword":
            await self._embed_some_pending()
            depth = hybrid_depth(limit, offset) if how == "hybrid" else limit
            skip = 0 if how == "hybrid" else offset
            try:
                narrow = (f"{seen} AND {under}", [*seen_args, *under_args])
                scope = _Scope(owner, ns, now, filtered=bool(wanted))
                semantic = await self._semantic(query, where, args, depth, skip, narrow, scope)
            except EmbedderUnavailable:
                if how == "semantic":
                    raise
                semantic = []  # the embedder is down: a hybrid search is a keyword one
            if how == "semantic":
                return semantic
            keyword = await self._keyword(query, where, args, depth, 0)
            return fuse(keyword, semantic, limit=limit, offset=offset, query=query)
        if query:
            return await self._keyword(query, where, args, limit, offset)
        sql = (
            f"SELECT {_COLS} FROM items i WHERE {where} "
            "ORDER BY i.updated_at DESC, i.namespace DESC, i.key DESC LIMIT ? OFFSET ?"
        )
        rows = await self._read(
            "searching items", lambda c: c.execute(sql, [*args, limit, offset]).fetchall()
        )
        return [item_of_row(r) for r in rows]

    async def _keyword(
        self, query: str, where: str, args: list[Any], limit: int, offset: int
    ) -> list[Item]:
        """The items matching ``where`` holding any of ``query``'s words, by BM25."""
        expression = fts_query(query)
        if not expression:
            return []
        sql = (
            f"SELECT {_COLS}, -bm25(items_fts) AS score FROM items_fts "
            f"JOIN items i ON i.rowid = items_fts.rowid "
            f"WHERE items_fts MATCH ? AND {where} "
            "ORDER BY score DESC, i.namespace, i.key LIMIT ? OFFSET ?"
        )
        params = [expression, *args, limit, offset]
        rows = await self._read("searching items", lambda c: c.execute(sql, params).fetchall())
        return [item_of_row(r) for r in rows]

    async def _semantic(
        self,
        query: str,
        where: str,
        args: list[Any],
        limit: int,
        offset: int,
        narrow: tuple[str, list[Any]],
        scope: _Scope,
    ) -> list[Item]:
        """The embedded items matching ``where`` by cosine similarity to ``query``: from this
        process's copy of the vectors (``sqlite_vector_cache``) when it is on and fits, else
        read from the file."""
        embedder = self._embedder
        assert embedder is not None
        models = await self._read(
            "reading the item vectors' models",
            lambda c: c.execute(_OTHER_MODEL, (embedder.name, embedder.dimensions)).fetchall(),
        )
        error = model_mismatch(embedder, models)
        if error is not None:
            raise error
        [target] = await embed_texts(embedder, [query])
        cap = cache_cap_bytes()
        cache = cache_for(self.db) if cap > 0 else None
        if cache is not None:
            model = (embedder.name, embedder.dimensions)

            def from_copy(c: sqlite3.Connection) -> list[Any] | None:
                if not cache.ready(c, model, cap):
                    return None
                rowids = None
                if scope.filtered:  # the filter's candidates come from SQL
                    sql = f"SELECT i.rowid FROM items i WHERE {where}"
                    rowids = [r[0] for r in c.execute(sql, args)]
                slots = cache.candidates(
                    owner=scope.owner, prefix=scope.prefix, now=scope.now, rowids=rowids
                )
                return _rows_of_best(c, cache.best(slots, target, offset + limit), limit, offset)

            found = await self._read("searching items", from_copy)
            if found is not None:
                return [item_of_row(r) for r in found]
        # Which table drives the join (CROSS JOIN keeps the order written): the items when the
        # namespace and owner conditions leave a small share of them (picked through their
        # indexes, each one's vector then read by its rowid), else the vectors in rowid order
        # (read sequentially; each item then checked by its rowid).
        narrow_sql, narrow_args = narrow

        def joined_by(c: sqlite3.Connection) -> str:
            vectors = c.execute("SELECT max(item_rowid) FROM item_vectors").fetchone()[0] or 0
            cap = vectors // _ITEMS_FIRST_SHARE + 1
            few = c.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM items i WHERE {narrow_sql} LIMIT ?)",
                [*narrow_args, cap],
            ).fetchone()[0]
            order = (
                "items i CROSS JOIN item_vectors v ON v.item_rowid = i.rowid"
                if few < cap
                else "item_vectors v CROSS JOIN items i ON i.rowid = v.item_rowid"
            )
            return f"FROM {order} WHERE v.vector IS NOT NULL AND {where}"

        if self.db.vec:
            params = [pack_vector(target), *args, limit, offset]

            def ranked(c: sqlite3.Connection) -> list[Any]:
                return c.execute(
                    f"SELECT {_COLS}, 1 - vec_distance_cosine(v.vector, ?) AS score "
                    f"{joined_by(c)} ORDER BY score DESC, i.namespace, i.key LIMIT ? OFFSET ?",
                    params,
                ).fetchall()

            return [item_of_row(r) for r in await self._read("searching items", ranked)]

        def score(c: sqlite3.Connection) -> list[Any]:
            found = c.execute(
                f"SELECT v.item_rowid, v.vector, i.namespace, i.key {joined_by(c)}", args
            ).fetchall()
            best = best_by_cosine(
                [r[0] for r in found],
                [r[1] for r in found],
                target,
                offset + limit,
                [(r[2], r[3]) for r in found],
            )[offset:]
            if not best:
                return []
            marks = ",".join("?" * len(best))
            got = {
                r[0]: r[1:]
                for r in c.execute(
                    f"SELECT i.rowid, {_COLS} FROM items i WHERE i.rowid IN ({marks})",
                    [b[0] for b in best],
                )
            }
            return [(*got[rowid], similarity) for rowid, similarity in best if rowid in got]

        rows = await self._read("searching items", score)
        return [item_of_row(r) for r in rows]

    async def embed_pending(self, limit: int | None = None) -> int:
        """Embed the live items whose vector is pending (up to ``limit``; None: all), a batch
        per embedder call, each batch written in one transaction (a row changed meanwhile is
        left for the next call); how many were embedded. Raises ``EmbedderUnavailable`` when
        the embedder is down (what was embedded before stays)."""
        embedder = self._embedder
        if embedder is None:
            return 0
        done = 0
        while limit is None or done < limit:
            batch = EMBED_BATCH if limit is None else min(EMBED_BATCH, limit - done)
            rows = await self._read("reading pending item vectors", _pending_reader(batch))
            if not rows:
                self._maybe_pending = False
                break
            texts = [
                text_to_embed(json.loads(r[2]), None if r[1] is None else tuple(json.loads(r[1])))
                for r in rows
            ]
            vectors = await embed_texts(embedder, texts)
            self._pending_retry_at = 0.0  # it answers again
            updates = [
                (embedder.name, embedder.dimensions, pack_vector(v), r[0], r[0], r[3])
                for r, v in zip(rows, vectors, strict=True)
            ]

            def write(c: sqlite3.Connection, updates: list[Any] = updates) -> tuple[int, int]:
                before = c.total_changes
                c.executemany(
                    "UPDATE item_vectors SET embedder = ?, dims = ?, vector = ? "
                    "WHERE item_rowid = ? AND vector IS NULL "
                    "AND (SELECT updated_at FROM items WHERE rowid = ?) = ?",
                    updates,
                )
                return c.total_changes - before, bump_generation(c)

            stored, generation = await self._write("storing item vectors", write)
            await self._apply_to_cache(generation, drop=True)  # rebuilt by the next search
            done += stored
            if len(rows) < batch:
                self._maybe_pending = False
                break
        return done

    async def reindex_items(self) -> int:
        """Mark every indexed item pending and embed them all with this store's embedder (after
        changing the model: ``loom memory reindex``); how many were embedded."""
        if self._embedder is None:
            return 0

        def reset(c: sqlite3.Connection) -> int:
            c.execute("UPDATE item_vectors SET embedder = NULL, dims = NULL, vector = NULL")
            return bump_generation(c)

        generation = await self._write("marking item vectors for re-embedding", reset)
        await self._apply_to_cache(generation, drop=True)
        self._maybe_pending = True
        return await self.embed_pending()

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

        def purge(c: sqlite3.Connection) -> tuple[list[int], int | None]:
            rows = c.execute(
                "SELECT rowid, value FROM items WHERE expires_at <= ?", (now.timestamp(),)
            ).fetchall()
            _forget_rows(c, [(r[0], r[1]) for r in rows])
            return [r[0] for r in rows], bump_generation(c) if rows else None

        purged, generation = await self._write("purging expired items", purge)
        if generation is not None:
            await self._apply_to_cache(generation, remove=purged)
        return len(purged)

    async def delete_owner_items(self, owner: str) -> int:
        """Delete every item of ``owner`` and its words; the FTS index is then merged
        (``optimize``), so no segment keeps a deleted word and a ``VACUUM`` leaves none of
        their bytes in the file."""

        def delete(c: sqlite3.Connection) -> tuple[list[int], int | None]:
            rows = c.execute("SELECT rowid, value FROM items WHERE owner = ?", (owner,)).fetchall()
            _forget_rows(c, [(r[0], r[1]) for r in rows])
            if rows:
                c.execute("INSERT INTO items_fts (items_fts) VALUES ('optimize')")
            return [r[0] for r in rows], bump_generation(c) if rows else None

        deleted, generation = await self._write("forgetting an owner's items", delete)
        if generation is not None:
            await self._apply_to_cache(generation, remove=deleted)
        return len(deleted)


@dataclass(frozen=True, slots=True)
class _Scope:
    """What a semantic search asks for, as the vector copy reads it: the caller, the
    namespace prefix, the time, and whether a filter narrows it further (SQL's part)."""

    owner: str | None
    prefix: tuple[str, ...]
    now: float
    filtered: bool


def _rows_of_best(
    c: sqlite3.Connection, best: list[tuple[int, float]], limit: int, offset: int
) -> list[Any]:
    """The item rows (with their score) of ``best`` (rowid, similarity), best first, ties by
    namespace and key, ``limit`` from ``offset``."""
    if not best:
        return []
    marks = ",".join("?" * len(best))
    got = {
        r[0]: r[1:]
        for r in c.execute(
            f"SELECT i.rowid, {_COLS} FROM items i WHERE i.rowid IN ({marks})",
            [rowid for rowid, _ in best],
        )
    }
    ranked = sorted(
        ((got[rowid], similarity) for rowid, similarity in best if rowid in got),
        key=lambda pair: (-pair[1], pair[0][0], pair[0][1]),
    )
    return [(*row, similarity) for row, similarity in ranked[offset : offset + limit]]


def _pending_reader(batch: int) -> Callable[[sqlite3.Connection], list[Any]]:
    """A read of up to ``batch`` live items pending their vector: (rowid, fields, value,
    updated_at)."""

    def read(c: sqlite3.Connection) -> list[Any]:
        return c.execute(
            "SELECT v.item_rowid, v.fields, i.value, i.updated_at FROM item_vectors v "
            "JOIN items i ON i.rowid = v.item_rowid WHERE v.vector IS NULL "
            "AND (i.expires_at IS NULL OR i.expires_at > ?) LIMIT ?",
            (time.time(), batch),
        ).fetchall()

    return read


def _forget_rows(c: sqlite3.Connection, rows: list[tuple[int, str]]) -> None:
    """Delete the items at ``rows`` (rowid, stored value), their words and their vectors."""
    c.executemany("INSERT INTO items_fts (items_fts, rowid, value) VALUES ('delete', ?, ?)", rows)
    c.executemany("DELETE FROM items WHERE rowid = ?", [(r[0],) for r in rows])
    c.executemany("DELETE FROM item_vectors WHERE item_rowid = ?", [(r[0],) for r in rows])
