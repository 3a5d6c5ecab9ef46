"""Deleting so that the bytes are gone, not only the rows (forgetting an owner, issue #29).

A ``DELETE`` removes rows from what queries see, but a database keeps their bytes around:
SQLite leaves deleted cells in their pages and on the free list, keeps the pages it wrote in
the ``-wal`` file until a checkpoint, and an FTS5 index keeps a deleted item's words in its
older segments until they are merged; PostgreSQL leaves dead tuples in their pages (and their
words in a GIN index) until the table is rewritten.

``Eraser`` is what a store does about it, around a batch of deletes
(``loom.server.forget.forget_owner``)::

    await store.secure_delete(True)   # deletes from now on overwrite what they free
    ...                               # the deletes
    await store.scrub()               # then make what is left of them unreadable
    await store.secure_delete(False)

``SQLiteErase``: ``PRAGMA secure_delete`` on the store's connection (zeros over deleted
cells and freed pages), and ``scrub`` merges the items' FTS5 index (``optimize``: no segment
keeps a deleted word) and checkpoints the WAL into the database file and truncates it
(``wal_checkpoint(TRUNCATE)``), so neither file holds a deleted byte. A reader of another
process holding an old snapshot stops the truncation: ``scrub`` then answers False.

``PostgresErase``: ``secure_delete`` has nothing to switch (a no-op), and ``scrub`` runs
``VACUUM FULL`` on the tables a forgetting touches, which rewrites each table and its indexes
(and TOAST) into new files without the deleted rows and unlinks the old ones. It takes each
table's ``ACCESS EXCLUSIVE`` lock while it rewrites it (readers and writers of that table wait),
and it cannot reach the write-ahead log (``pg_wal``), which holds the deleted rows until its
segments are recycled, nor backups or replicas.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["ERASED_TABLES", "Eraser", "PostgresErase", "SQLiteErase"]

T = TypeVar("T")

# The tables a forgetting deletes from (sessions and what hangs on them, media, memory items
# and their vectors when that table exists, ownership records, schedules and monitors).
ERASED_TABLES = (
    "sessions",
    "messages",
    "events",
    "ledger",
    "open_calls",
    "open_runs",
    "runs",
    "errors",
    "results",
    "appends",
    "session_blobs",
    "blobs",
    "items",
    "item_vectors",
    "kv",
    "schedules",
    "schedule_runs",
    "monitors",
    "monitor_checkins",
)


@runtime_checkable
class Eraser(Protocol):
    """A store that can make the bytes of what it deleted unreadable (module docstring)."""

    async def secure_delete(self, on: bool) -> None:
        """Deletes from now on overwrite what they free (``on``), or stop doing so."""
        ...

    async def scrub(self) -> bool:
        """Make what earlier deletes left behind unreadable in the database's files; False when
        it could not finish (say why in the log) and should be run again."""
        ...


class SQLiteErase:
    """``Eraser`` on SQLite, on top of ``_read`` / ``_write``."""

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def secure_delete(self, on: bool) -> None:
        """``PRAGMA secure_delete`` on the store's connection (shared by every store of this
        process on the file: their deletes overwrite too while it is on)."""
        await self._read(
            "switching secure delete",
            lambda c: c.execute(f"PRAGMA secure_delete = {'ON' if on else 'OFF'}").fetchone(),
        )

    async def scrub(self) -> bool:
        """Merge the items' FTS5 index, then checkpoint the WAL into the file and truncate it.
        False when a reader kept the WAL from being truncated."""
        await self._write(
            "merging the items' search index",
            lambda c: c.execute("INSERT INTO items_fts (items_fts) VALUES ('optimize')"),
        )
        busy, _, _ = await self._read(
            "checkpointing the WAL",
            lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(),
        )
        return not busy


class PostgresErase:
    """``Eraser`` on PostgreSQL, on top of ``_run``."""

    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        raise NotImplementedError

    async def secure_delete(self, on: bool) -> None:
        """Nothing to switch on PostgreSQL: ``scrub`` rewrites the tables afterwards."""

    async def scrub(self) -> bool:
        """``VACUUM FULL`` each of :data:`ERASED_TABLES` that exists in the store's schema
        (outside a transaction: the pool's connections are in autocommit)."""

        async def vacuum(conn: AsyncConnection[Any]) -> bool:
            for table in ERASED_TABLES:  # names from the tuple above, never a caller's
                found = await (await conn.execute("SELECT to_regclass(%s)", (table,))).fetchone()
                if found is not None and found[0] is not None:
                    await conn.execute(f"VACUUM FULL {table}")
            return True

        return await self._run("vacuuming what was deleted", vacuum)
