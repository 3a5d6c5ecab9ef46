"""Persistence: the ``Store`` protocol and its backends.

``MemoryStore`` is built in; ``SQLiteStore`` (``loom.store.sqlite``) and ``PostgresStore``
(``loom.store.postgres``, the ``postgres`` extra) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loom.store.base import (
    Lease,
    LedgerEntry,
    LedgerStatus,
    RunRecord,
    SessionInfo,
    Store,
    StoreCapabilities,
    capabilities_of,
)
from loom.store.memory import MemoryStore

if TYPE_CHECKING:
    from loom.store.postgres import PostgresStore
    from loom.store.sqlite import SQLiteStore

__all__ = [
    "Lease",
    "LedgerEntry",
    "LedgerStatus",
    "MemoryStore",
    "PostgresStore",
    "RunRecord",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "StoreCapabilities",
    "capabilities_of",
]


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from loom.store.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from loom.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'loom.store' has no attribute {name!r}")
