"""``ItemStore`` on PostgreSQL (``loom.store.items``, migration ``0011_items``).

``items`` as on SQLite (``sqlite_items``), the value as JSONB; its words are a generated
``tsvector`` column (``to_tsvector('simple', value::text)``) with a GIN index, so they are
always in step with the row. A keyword search matches any of the query's words
(``websearch_to_tsquery('simple', 'a or b')``) and ranks with ``ts_rank`` (higher is better).
Owner visibility and expiry are conditions of the one query. A put is one upsert whose
``WHERE`` refuses another owner's key, so two writers racing on a key cannot both win.

``item_vectors`` (migration ``0013_item_vectors``) holds each indexed item's unit vector as
``real[]`` (NULL: pending) beside the embedder's name and dimensions, written in the put's
transaction and deleted with the item by its foreign key (``ON DELETE CASCADE``: a delete, an
owner's delete). A semantic search scores every candidate row the owner, namespace and filter
conditions leave, in the query (ordered and limited by PostgreSQL): with ``pgvector`` installed
in the database (``CREATE EXTENSION vector``), its cosine distance ``<=>`` on the array cast to
``vector``; without it, the dot product of the unit vectors through ``unnest``. Either way it
reads every candidate, with no approximate index (an HNSW index needs a ``vector(N)`` column
of one fixed length: not built).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from loom.embedding.base import Embedder, EmbedderUnavailable
from loom.store import pg_sql as q
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
    check_max_depth,
    check_ttl,
    expiry_of,
    item_of_row,
    like_prefix,
    namespace_text,
    shape_namespaces,
)
from loom.store.items_vectors import (
    EMBED_BATCH,
    PendingOnTheWay,
    check_index,
    check_mode,
    embed_texts,
    fuse,
    hybrid_depth,
    keyword_terms,
    model_mismatch,
    stored_error,
    text_to_embed,
    vector_for_put,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PostgresItems", "tsquery_text"]

T = TypeVar("T")

_LIVE = "(i.expires_at IS NULL OR i.expires_at > %s)"


def tsquery_text(query: str) -> str:
    """``websearch_to_tsquery`` input matching any of ``query``'s key words
    (``items_vectors.keyword_terms``: stop words dropped), each quoted (a word such as ``or``
    is not read as an operator); empty when it has none."""
    return " or ".join(f'"{w}"' for w in keyword_terms(query))


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


class PostgresItems(PendingOnTheWay):
    """``ItemStore`` on ``_run``; with an ``embedder``, vectors too
    (``loom.store.items_vectors.VectorItems``)."""

    _pgvector: bool | None = None  # the ``vector`` extension is installed (asked once)

    @property
    def embedder(self) -> Embedder | None:
        """The embedder items are embedded with, or None (keyword search only)."""
        return self._embedder

    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        raise NotImplementedError

    async def _rows(
        self, doing: str, sql: str, args: Sequence[Any] | Mapping[str, Any]
    ) -> list[Any]:
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
        index: bool | Sequence[str] | None = None,
    ) -> Item:
        """Write (insert or replace) an item and its vector (``index``) in one transaction;
        ``ItemOwned`` when another owner holds the key (nothing written). The embedder runs
        first; when it fails the item is stored pending its vector (an ``EmbeddingError``
        other than the embedder being down is raised once it is stored)."""
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        ttl, fields = check_ttl(ttl), check_index(index)
        await self._embed_some_pending()
        vec = await vector_for_put(self._embedder, value, fields)
        model = self._embedder if vec.vector is not None else None
        vector_args = (
            namespace_text(ns),
            key,
            json.dumps(vec.fields) if vec.fields is not None else None,
            model.name if model is not None else None,
            model.dimensions if model is not None else None,
            vec.vector,
        )
        args = {
            "ns": namespace_text(ns),
            "key": key,
            "value": json.dumps(value, ensure_ascii=False),
            "owner": owner,
            "now": time.time(),
            "expires": expiry_of(ttl),
        }

        async def put(conn: AsyncConnection[Any]) -> Any:
            async with conn.transaction():
                row = await (await conn.execute(q.PUT_ITEM, args)).fetchone()
                if row is not None and vec.indexed:
                    await conn.execute(q.PUT_ITEM_VECTOR, vector_args)
                elif row is not None:
                    await conn.execute(q.DELETE_ITEM_VECTOR, vector_args[:2])
                return row

        # Idempotent (the same value and times again), so it is re-sent after a lost connection.
        row = await self._run("storing an item", put)
        if row is None:
            raise ItemOwned(
                f"key {key!r} in namespace {list(ns)} is another owner's; pick another key"
            )
        if vec.indexed and vec.vector is None:
            self._maybe_pending = True
        if vec.vector is not None:
            self._pending_retry_at = 0.0  # the embedder answers: pending items may go on the way
        if vec.error is not None:
            raise stored_error(vec.error, ns, key)
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
        mode: str | None = None,
    ) -> list[Item]:
        """Items under ``prefix`` matching ``filter`` and, with a ``query``, by ``mode``
        (``loom.store.items_vectors``): keyword (any of its words, ``ts_rank``), semantic
        (cosine similarity) or hybrid (both, fused by rank); without one, newest first. The
        owner, namespace and filter conditions are part of each ranking's query."""
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        how = check_mode(mode, self._embedder)
        seen, seen_args = _visible(owner, time.time())
        under, under_args = _under(ns)
        match, match_args = _matching(wanted)
        where = f"{seen} AND {under} AND {match}"
        args: list[Any] = [*seen_args, *under_args, *match_args]
        if query and how != "keyword":
            await self._embed_some_pending()
            depth = hybrid_depth(limit, offset) if how == "hybrid" else limit
            skip = 0 if how == "hybrid" else offset
            try:
                semantic = await self._semantic(query, where, args, depth, skip)
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
            f"SELECT {q.ITEM_COLS} FROM items i WHERE {where} "
            "ORDER BY i.updated_at DESC, i.namespace DESC, i.key DESC LIMIT %s OFFSET %s"
        )
        rows = await self._rows("searching items", sql, [*args, limit, offset])
        return [item_of_row(r) for r in rows]

    async def _keyword(
        self, query: str, where: str, args: list[Any], limit: int, offset: int
    ) -> list[Item]:
        """The items matching ``where`` holding any of ``query``'s words, by ``ts_rank``."""
        text = tsquery_text(query)
        if not text:
            return []
        sql = (
            f"SELECT {q.ITEM_COLS}, ts_rank(i.words, t.q) AS score "
            "FROM items i, websearch_to_tsquery('simple', %s) AS t(q) "
            f"WHERE i.words @@ t.q AND {where} "
            "ORDER BY score DESC, i.namespace, i.key LIMIT %s OFFSET %s"
        )
        rows = await self._rows("searching items", sql, [text, *args, limit, offset])
        return [item_of_row(r) for r in rows]

    async def _semantic(
        self, query: str, where: str, args: list[Any], limit: int, offset: int
    ) -> list[Item]:
        """The embedded items matching ``where`` by cosine similarity to ``query`` (the dot
        product of unit vectors, over every candidate row)."""
        embedder = self._embedder
        assert embedder is not None
        models = await self._rows(
            "reading the item vectors' models",
            q.OTHER_ITEM_VECTOR_MODEL,
            {"name": embedder.name, "dims": embedder.dimensions},
        )
        error = model_mismatch(embedder, [(r[0], r[1]) for r in models])
        if error is not None:
            raise error
        [target] = await embed_texts(embedder, [query])
        if self._pgvector is None:  # asked once: is pgvector installed in this database?
            found = await self._rows(
                "looking for pgvector", "SELECT 1 FROM pg_extension WHERE extname = 'vector'", []
            )
            self._pgvector = bool(found)
        similarity = (
            "1 - (v.vector::vector <=> %s::real[]::vector)"  # pgvector's cosine distance, in C
            if self._pgvector
            else "(SELECT sum(a * b) FROM unnest(v.vector, %s::real[]) AS t(a, b))"
        )
        sql = (
            f"SELECT {q.ITEM_COLS}, {similarity} AS score FROM item_vectors v "
            "JOIN items i ON i.namespace = v.namespace AND i.key = v.key "
            f"WHERE v.vector IS NOT NULL AND {where} "
            "ORDER BY score DESC, i.namespace, i.key LIMIT %s OFFSET %s"
        )
        rows = await self._rows("searching items", sql, [target, *args, limit, offset])
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
            rows = await self._rows(
                "reading pending item vectors", q.PENDING_ITEM_VECTORS, [time.time(), batch]
            )
            if not rows:
                self._maybe_pending = False
                break
            texts = [text_to_embed(r[3], None if r[2] is None else tuple(r[2])) for r in rows]
            vectors = await embed_texts(embedder, texts)
            self._pending_retry_at = 0.0  # it answers again
            updates = [
                (embedder.name, embedder.dimensions, v, r[0], r[1], r[4])
                for r, v in zip(rows, vectors, strict=True)
            ]

            async def write(conn: AsyncConnection[Any], updates: list[Any] = updates) -> int:
                changed = 0
                async with conn.transaction(), conn.cursor() as cur:
                    for row in updates:
                        await cur.execute(q.FILL_ITEM_VECTOR, row)
                        changed += cur.rowcount
                return changed

            done += await self._run("storing item vectors", write)
            if len(rows) < batch:
                self._maybe_pending = False
                break
        return done

    async def reindex_items(self) -> int:
        """Mark every indexed item pending and embed them all with this store's embedder (after
        changing the model: ``loom memory reindex``); how many were embedded."""
        if self._embedder is None:
            return 0

        async def reset(conn: AsyncConnection[Any]) -> None:
            await conn.execute(q.RESET_ITEM_VECTORS)

        await self._run("marking item vectors for re-embedding", reset)
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
        """Delete every item of ``owner`` (forgetting a user) and, by the foreign key, their
        vectors; how many there were."""

        async def delete(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(q.DELETE_OWNER_ITEMS, (owner,))).rowcount

        return await self._run("forgetting an owner's items", delete)
