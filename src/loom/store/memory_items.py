"""``ItemStore`` in memory (``loom.store.items``): what the SQL stores do with an index, done
with a dictionary and a word count, for tests and a single process. With an embedder, each
item's unit vector sits beside it (``loom.store.items_vectors``) and a semantic search scores
every candidate."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from loom.embedding.base import Embedder, EmbedderUnavailable
from loom.store.items import (
    Item,
    ItemOwned,
    check_filter,
    check_key,
    check_limit,
    check_max_depth,
    check_namespace,
    check_ttl,
    check_value,
    select_namespaces,
    terms_of,
)
from loom.store.items_vectors import (
    EMBED_BATCH,
    IndexFields,
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

__all__ = ["MemoryItems"]


def _now() -> datetime:
    return datetime.now(UTC)


def _visible(item: Item, owner: str | None, now: datetime) -> bool:
    if item.expires_at is not None and item.expires_at <= now:
        return False
    return owner is None or item.owner == owner


@dataclass(slots=True)
class _Vector:
    fields: IndexFields
    vector: list[float] | None = None  # None: pending
    model: tuple[str, int] | None = None  # the embedder's (name, dimensions)


_Where = tuple[tuple[str, ...], str]


class MemoryItems(PendingOnTheWay):
    """The item half of ``MemoryStore``: items keyed by (namespace, key), and their vectors."""

    _items: dict[_Where, Item]
    _vectors: dict[_Where, _Vector]
    _embedder: Embedder | None
    _maybe_pending: bool

    @property
    def embedder(self) -> Embedder | None:
        """The embedder items are embedded with, or None (keyword search only)."""
        return self._embedder

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
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        value = json.loads(json.dumps(value))  # stored as JSON, as the SQL stores do
        ttl, fields = check_ttl(ttl), check_index(index)
        await self._embed_some_pending()
        put = await vector_for_put(self._embedder, value, fields)
        now = _now()
        held = self._items.get((ns, key))
        taken = held is not None and _visible(held, None, now) and held.owner != owner
        if taken and owner is not None:
            raise ItemOwned(
                f"key {key!r} in namespace {list(ns)} is another owner's; pick another key"
            )
        expires = datetime.fromtimestamp(time.time() + ttl, UTC) if ttl is not None else None
        item = Item(
            namespace=ns,
            key=key,
            value=value,
            created_at=held.created_at if held is not None and _visible(held, None, now) else now,
            updated_at=now,
            owner=owner if held is None or owner is not None else held.owner,
            expires_at=expires,
        )
        self._items[(ns, key)] = item
        self._vectors.pop((ns, key), None)
        if put.indexed:
            model = self._model() if put.vector is not None else None
            self._vectors[(ns, key)] = _Vector(put.fields, put.vector, model)
            self._maybe_pending |= put.vector is None
        if put.vector is not None:
            self._pending_retry_at = 0.0  # the embedder answers: pending items may go on the way
        if put.error is not None:
            raise stored_error(put.error, ns, key)
        return item

    async def get_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> Item | None:
        item = self._items.get((check_namespace(namespace), check_key(key)))
        return item if item is not None and _visible(item, owner, _now()) else None

    async def delete_item(
        self, namespace: Sequence[str], key: str, *, owner: str | None = None
    ) -> bool:
        where = (check_namespace(namespace), check_key(key))
        item = self._items.get(where)
        if item is None or not _visible(item, owner, _now()):
            return False
        del self._items[where]
        self._vectors.pop(where, None)
        return True

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
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        how = check_mode(mode, self._embedder)
        now = _now()
        found = [
            i
            for i in self._items.values()
            if i.namespace[: len(ns)] == ns
            and _visible(i, owner, now)
            and all(i.value.get(k) == v for k, v in wanted.items())
        ]
        if query and how != "keyword":
            await self._embed_some_pending()
            depth = hybrid_depth(limit, offset) if how == "hybrid" else offset + limit
            try:
                semantic = await self._semantic(found, query, depth)
            except EmbedderUnavailable:
                if how == "semantic":
                    raise
                semantic = []  # the embedder is down: a hybrid search is a keyword one
            if how == "semantic":
                return semantic[offset : offset + limit]
            keyword = self._keyword(found, query)[:depth]
            return fuse(keyword, semantic, limit=limit, offset=offset, query=query)
        if query:
            return self._keyword(found, query)[offset : offset + limit]
        found.sort(key=lambda i: (i.updated_at, i.namespace, i.key), reverse=True)
        return found[offset : offset + limit]

    @staticmethod
    def _keyword(found: list[Item], query: str) -> list[Item]:
        """``found``'s items holding any of ``query``'s words, best first."""
        words = set(keyword_terms(query))
        scored = []
        for i in found:
            text = terms_of(json.dumps(i.value, ensure_ascii=False))
            hits = sum(1 for w in text if w in words)
            if hits:
                scored.append(replace(i, score=hits / (len(text) ** 0.5)))
        scored.sort(key=lambda i: (-(i.score or 0.0), i.namespace, i.key))
        return scored

    async def _semantic(self, found: list[Item], query: str, depth: int) -> list[Item]:
        """``found``'s embedded items by cosine similarity to ``query``, best first."""
        assert self._embedder is not None
        embedded = [
            (i, v) for i in found if (v := self._vectors.get((i.namespace, i.key))) is not None
        ]
        error = model_mismatch(self._embedder, (v.model for _, v in embedded if v.model))
        if error is not None:
            raise error
        [target] = await embed_texts(self._embedder, [query])
        scored = [
            replace(i, score=sum(a * b for a, b in zip(v.vector, target, strict=True)))
            for i, v in embedded
            if v.vector is not None
        ]
        scored.sort(key=lambda i: (-(i.score or 0.0), i.namespace, i.key))
        return scored[:depth]

    def _model(self) -> tuple[str, int] | None:
        e = self._embedder
        return None if e is None else (e.name, e.dimensions)

    async def embed_pending(self, limit: int | None = None) -> int:
        """Embed the items whose vector is pending (up to ``limit``; None: all); how many."""
        if self._embedder is None:
            return 0
        now = _now()
        todo = [
            (w, v)
            for w, v in self._vectors.items()
            if v.vector is None and w in self._items and _visible(self._items[w], None, now)
        ]
        if limit is not None:
            todo = todo[:limit]
        done = 0
        for start in range(0, len(todo), EMBED_BATCH):
            batch = todo[start : start + EMBED_BATCH]
            texts = [text_to_embed(self._items[w].value, v.fields) for w, v in batch]
            vectors = await embed_texts(self._embedder, texts)
            self._pending_retry_at = 0.0  # it answers again
            for (_, v), vector in zip(batch, vectors, strict=True):
                v.vector, v.model = vector, self._model()
                done += 1
        self._maybe_pending = limit is not None and len(todo) == limit
        return done

    async def reindex_items(self) -> int:
        """Re-embed every indexed item with this store's embedder; how many."""
        for v in self._vectors.values():
            v.vector, v.model = None, None
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
        pre = check_namespace(prefix, prefix=True)
        suf = check_namespace(suffix, prefix=True)
        limit, offset = check_limit(limit, offset)
        depth = check_max_depth(max_depth)
        now = _now()
        found = (
            i.namespace
            for i in self._items.values()
            if _visible(i, owner, now) and i.namespace[: len(pre)] == pre
        )
        return select_namespaces(found, suffix=suf, max_depth=depth, limit=limit, offset=offset)

    async def purge_expired_items(self, now: datetime) -> int:
        """Delete every item expired at ``now``; how many there were."""
        gone = [
            k for k, i in self._items.items() if i.expires_at is not None and i.expires_at <= now
        ]
        for k in gone:
            del self._items[k]
            self._vectors.pop(k, None)
        return len(gone)

    async def delete_owner_items(self, owner: str) -> int:
        gone = [k for k, i in self._items.items() if i.owner == owner]
        for k in gone:
            del self._items[k]
            self._vectors.pop(k, None)
        return len(gone)
