"""Memory across sessions: items in namespaces, owned, searchable (issue #29's store seam).

An item is a JSON object (``value``) under a ``key`` in a ``namespace`` (a tuple of strings,
as LangGraph's Store API names them: ``("users", "alice", "prefs")``), with timestamps, an
optional expiry and an owner: the API key's principal that wrote it (``None``: shared, written
by an admin or by code). Every read and write names the caller's owner; an item another owner
holds is invisible to it (absent from reads and searches; a write to its key is
``ItemOwned``), checked in the store's one query, not by callers.

``ItemStore`` is the capability (``loom.store.base.capabilities_of(store).items``); this module
holds what every implementation shares: the item type and the checks of what a caller gives
(:func:`check_namespace`, :func:`check_value`, :func:`check_limit`), so that a bad namespace or
a limit of ten million is the same typed error on every store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loom.errors import InputError

__all__ = [
    "MAX_LIMIT",
    "MAX_NAMESPACE_DEPTH",
    "MAX_PART_CHARS",
    "Item",
    "ItemOwned",
    "check_filter",
    "check_key",
    "check_limit",
    "check_max_depth",
    "check_namespace",
    "check_ttl",
    "check_value",
    "select_namespaces",
    "terms_of",
]

MAX_NAMESPACE_DEPTH = 10
MAX_PART_CHARS = 128
MAX_LIMIT = 1000  # items or namespaces one call returns at most
MAX_VALUE_BYTES = 1024 * 1024  # an item's JSON, at most (media go in the blob store)


class ItemOwned(InputError):
    """The key is held by another owner in that namespace: nothing was written."""


@dataclass(frozen=True, slots=True)
class Item:
    """One stored item. ``score`` is a search's relevance (higher is better; None outside a
    search)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    owner: str | None = None
    expires_at: datetime | None = None
    score: float | None = None


def check_namespace(namespace: Sequence[str], *, prefix: bool = False) -> tuple[str, ...]:
    """``namespace`` as a tuple, or ``InputError`` saying what is wrong: a part that is empty,
    not a string, longer than :data:`MAX_PART_CHARS` or holding a ``.``; more than
    :data:`MAX_NAMESPACE_DEPTH` parts; no part (unless ``prefix``: an empty prefix means all)."""
    if isinstance(namespace, str):
        raise InputError(
            f"a namespace is a list of strings, got the string {namespace[:40]!r}: "
            'write ["users", "alice"], not "users.alice"'
        )
    parts = tuple(namespace)
    if not parts and not prefix:
        raise InputError("a namespace needs at least one part, e.g. ['memories', 'alice']")
    if len(parts) > MAX_NAMESPACE_DEPTH:
        raise InputError(
            f"a namespace has at most {MAX_NAMESPACE_DEPTH} parts, this one {len(parts)}"
        )
    for i, part in enumerate(parts):
        if not isinstance(part, str) or not part:
            raise InputError(f"namespace part {i} must be a non-empty string, got {part!r}")
        if len(part) > MAX_PART_CHARS:
            raise InputError(f"namespace part {i} is {len(part)} characters, over {MAX_PART_CHARS}")
        if "." in part:
            raise InputError(
                f"namespace part {i} ({part[:40]!r}) holds a '.', which separates parts in "
                "some clients; use another character"
            )
    return parts


def check_key(key: Any) -> str:
    """``key`` if it is a non-empty string of at most 256 characters, else ``InputError``."""
    if not isinstance(key, str) or not key or len(key) > 256:
        raise InputError(
            f"an item's key is a non-empty string of at most 256 characters, got {key!r}"
        )
    return key


def check_value(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object of at most :data:`MAX_VALUE_BYTES`, else
    ``InputError`` naming what is wrong."""
    if not isinstance(value, Mapping):
        raise InputError(
            f"an item's value is a JSON object (a dict), got {type(value).__name__}; wrap it: "
            '{"text": ...}'
        )
    from pydantic_core import PydanticSerializationError, to_json

    try:
        size = len(to_json(value))
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"an item's value must be JSON: {exc}") from None
    if size > MAX_VALUE_BYTES:
        raise InputError(
            f"an item's value is {size:,} bytes of JSON, over {MAX_VALUE_BYTES:,}: keep "
            "memories short, and media in a message"
        )
    return dict(value)


def check_limit(limit: Any, offset: Any = 0) -> tuple[int, int]:
    """``(limit, offset)`` if ``1 <= limit <= MAX_LIMIT`` and ``offset >= 0``, else
    ``InputError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InputError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InputError(f"offset must be an integer >= 0, got {offset!r}")
    return limit, offset


def check_filter(filter: Any) -> dict[str, Any]:
    """A search filter: ``{field: value}`` pairs an item's value must equal (top-level
    fields), else ``InputError``."""
    if filter is None:
        return {}
    if not isinstance(filter, Mapping) or not all(isinstance(k, str) for k in filter):
        raise InputError(f"a filter is an object of field: value pairs, got {filter!r}")
    return dict(filter)


def check_ttl(ttl: Any) -> float | None:
    """``ttl`` if it is None or a positive number of seconds, else ``InputError``."""
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
        raise InputError(f"ttl is a positive number of seconds, got {ttl!r}")
    return None if ttl is None else float(ttl)


def check_max_depth(max_depth: Any) -> int | None:
    """``max_depth`` if it is None or an integer >= 1, else ``InputError``."""
    if max_depth is not None and (
        isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1
    ):
        raise InputError(f"max_depth is an integer >= 1, got {max_depth!r}")
    return max_depth


def select_namespaces(
    names: Iterable[tuple[str, ...]],
    *,
    suffix: Sequence[str],
    max_depth: int | None,
    limit: int,
    offset: int,
) -> list[tuple[str, ...]]:
    """``list_namespaces``' answer from the namespaces a store found under the prefix: those
    that end with ``suffix``, cut to ``max_depth`` parts, deduplicated, sorted, then
    ``offset``/``limit`` (every store shapes its answer with this)."""
    suf = tuple(suffix)
    kept: set[tuple[str, ...]] = set()
    for ns in names:
        if suf and ns[len(ns) - len(suf) :] != suf:
            continue
        kept.add(ns[:max_depth] if max_depth is not None else ns)
    return sorted(kept)[offset : offset + limit]


_WORD = re.compile(r"\w+", re.UNICODE)


def terms_of(text: str) -> list[str]:
    """The lower-cased words of ``text`` (how the in-memory store matches a query)."""
    return [w.lower() for w in _WORD.findall(text)]
