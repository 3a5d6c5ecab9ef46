"""Persistence: the ``Store`` protocol and its backends.

``MemoryStore`` is built in; ``SQLiteStore`` (``loom.store.sqlite``) is imported on first use.
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
    from loom.store.sqlite import SQLiteStore

__all__ = [
    "Lease",
    "LedgerEntry",
    "LedgerStatus",
    "MemoryStore",
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
    raise AttributeError(f"module 'loom.store' has no attribute {name!r}")
