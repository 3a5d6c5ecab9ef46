"""``ItemStore`` in memory (``loom.store.items``): what the SQL stores do with an index, done
with a dictionary and a word count, for tests and a single process."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

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

__all__ = ["MemoryItems"]


def _now() -> datetime:
    return datetime.now(UTC)


def _visible(item: Item, owner: str | None, now: datetime) -> bool:
    if item.expires_at is not None and item.expires_at <= now:
        return False
    return owner is None or item.owner == owner


class MemoryItems:
    """The item half of ``MemoryStore``: items keyed by (namespace, key)."""

    _items: dict[tuple[tuple[str, ...], str], Item]

    async def put_item(
        self,
        namespace: Sequence[str],
        key: str,
        value: dict[str, Any],
        *,
        owner: str | None = None,
        ttl: float | None = None,
    ) -> Item:
        ns, key, value = check_namespace(namespace), check_key(key), check_value(value)
        value = json.loads(json.dumps(value))  # stored as JSON, as the SQL stores do
        ttl = check_ttl(ttl)
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
    ) -> list[Item]:
        ns = check_namespace(prefix, prefix=True)
        limit, offset = check_limit(limit, offset)
        wanted = check_filter(filter)
        now = _now()
        found = [
            i
            for i in self._items.values()
            if i.namespace[: len(ns)] == ns
            and _visible(i, owner, now)
            and all(i.value.get(k) == v for k, v in wanted.items())
        ]
        if query:
            words = set(terms_of(query))
            scored = []
            for i in found:
                text = terms_of(json.dumps(i.value, ensure_ascii=False))
                hits = sum(1 for w in text if w in words)
                if hits:
                    scored.append(replace(i, score=hits / (len(text) ** 0.5)))
            scored.sort(key=lambda i: (-(i.score or 0.0), i.namespace, i.key))
            return scored[offset : offset + limit]
        found.sort(key=lambda i: (i.updated_at, i.namespace, i.key), reverse=True)
        return found[offset : offset + limit]

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
        return len(gone)

    async def delete_owner_items(self, owner: str) -> int:
        gone = [k for k, i in self._items.items() if i.owner == owner]
        for k in gone:
            del self._items[k]
        return len(gone)
