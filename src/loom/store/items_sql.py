"""What the SQL item stores (``sqlite_items``, ``postgres_items``) share: the namespace as one
text column, the rows read back as :class:`~loom.store.items.Item`. The checks are
``loom.store.items``'; ``check_ttl`` and ``check_max_depth`` are named here too.

A namespace is stored as its parts joined by ``.`` (:data:`NAMESPACE_SEPARATOR`), which no part
holds (``check_namespace`` refuses it): ``("users", "alice")`` is ``"users.alice"``, and the
items under a prefix are those whose column equals it or starts with it and a ``.`` (one
index range, an escaped ``LIKE``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from loom.store.items import Item, check_max_depth, check_ttl, select_namespaces

__all__ = [
    "NAMESPACE_SEPARATOR",
    "check_max_depth",
    "check_ttl",
    "expiry_of",
    "item_of_row",
    "like_prefix",
    "namespace_of",
    "namespace_text",
    "shape_namespaces",
]

NAMESPACE_SEPARATOR = "."


def namespace_text(namespace: Sequence[str]) -> str:
    """The stored form of a checked namespace."""
    return NAMESPACE_SEPARATOR.join(namespace)


def namespace_of(text: str) -> tuple[str, ...]:
    """The namespace a stored column holds."""
    return tuple(text.split(NAMESPACE_SEPARATOR))


def like_prefix(namespace: Sequence[str]) -> str:
    """A ``LIKE ... ESCAPE '\\'`` pattern for the namespaces strictly below ``namespace``
    (its ``%`` and ``_`` escaped: a part may hold them)."""
    text = namespace_text(namespace)
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + NAMESPACE_SEPARATOR + "%"


def expiry_of(ttl: float | None) -> float | None:
    """When an item written now with ``ttl`` expires (epoch seconds), None for never."""
    return None if ttl is None else time.time() + ttl


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def item_of_row(row: Sequence[Any]) -> Item:
    """An item from ``(namespace, key, value, owner, created_at, updated_at, expires_at
    [, score])`` (``value`` as JSON text or already decoded; times as epoch seconds)."""
    value = row[2]
    if isinstance(value, str | bytes):
        value = json.loads(value)
    created, updated = _moment(row[4]), _moment(row[5])
    assert created is not None and updated is not None
    return Item(
        namespace=namespace_of(row[0]),
        key=row[1],
        value=value,
        owner=row[3],
        created_at=created,
        updated_at=updated,
        expires_at=_moment(row[6]),
        score=float(row[7]) if len(row) > 7 and row[7] is not None else None,
    )


def shape_namespaces(
    stored: Sequence[str],
    *,
    suffix: Sequence[str],
    max_depth: int | None,
    limit: int,
    offset: int,
) -> list[tuple[str, ...]]:
    """The stored namespaces (as text), shaped as ``loom.store.items.select_namespaces``
    does."""
    return select_namespaces(
        (namespace_of(t) for t in stored),
        suffix=suffix,
        max_depth=max_depth,
        limit=limit,
        offset=offset,
    )
