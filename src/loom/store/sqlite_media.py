"""``BlobStore`` on SQLite: media bytes once per content hash (migration ``0009_media``).

``blobs`` holds the bytes, one row per reference (``"sha256:<hex>"``); ``session_blobs`` the
sessions that name them. Every statement runs inside the caller's transaction: ``put`` in
``put_blobs``' own, ``forget_session`` in ``delete_session``'s, so a session and the bytes
only it named go together. A list of references is bound as one JSON array (``json_each``):
one statement however many there are, and no bound-variable limit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from loom.store import codec
from loom.store.base import Blob

__all__ = ["SQLiteBlobs", "forget_session"]

T = TypeVar("T")

_IN_REFS = "ref IN (SELECT value FROM json_each(?))"


def forget_session(c: sqlite3.Connection, session_id: str) -> None:
    """Delete ``session_id``'s links to media, and the bytes no other session names (in the
    transaction of ``c``)."""
    refs = [
        r[0] for r in c.execute("SELECT ref FROM session_blobs WHERE session_id = ?", (session_id,))
    ]
    if not refs:
        return
    c.execute("DELETE FROM session_blobs WHERE session_id = ?", (session_id,))
    c.execute(
        f"DELETE FROM blobs WHERE {_IN_REFS} "
        "AND NOT EXISTS (SELECT 1 FROM session_blobs l WHERE l.ref = blobs.ref)",
        (json.dumps(refs),),
    )


class SQLiteBlobs:
    """``BlobStore`` (``loom.store.base``) on top of ``_read`` / ``_write``."""

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def put_blobs(self, session_id: str, blobs: Sequence[Blob]) -> None:
        """Store ``blobs`` for ``session_id``: bytes already held are not written again (their
        reference is looked up first), the session's links are added. ``MediaTooLarge`` (or
        ``ContentError`` for a reference that is not the bytes' hash) before any write."""
        wanted = codec.check_blobs(blobs)
        if not wanted:
            return
        now = time.time()
        refs = json.dumps([b.ref for b in wanted])

        def put(c: sqlite3.Connection) -> None:
            held = {r[0] for r in c.execute(f"SELECT ref FROM blobs WHERE {_IN_REFS}", (refs,))}
            c.executemany(
                "INSERT INTO blobs (ref, media_type, size, created_at, data) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (b.ref, b.media_type, len(b.data), now, b.data)
                    for b in wanted
                    if b.ref not in held
                ],
            )
            c.executemany(
                "INSERT OR IGNORE INTO session_blobs (session_id, ref) VALUES (?, ?)",
                [(session_id, b.ref) for b in wanted],
            )

        await self._write("storing media", put)

    async def load_blobs(self, refs: Sequence[str]) -> dict[str, bytes]:
        """The bytes of each of ``refs`` the store holds (one query; a missing one is absent)."""
        if not refs:
            return {}
        wanted = json.dumps(list(dict.fromkeys(refs)))
        rows = await self._read(
            "loading media",
            lambda c: c.execute(
                f"SELECT ref, data FROM blobs WHERE {_IN_REFS}", (wanted,)
            ).fetchall(),
        )
        return {r[0]: bytes(r[1]) for r in rows}

    async def session_blobs(self, session_id: str) -> list[tuple[str, str, int]]:
        """The media ``session_id`` names, as (ref, media type, size), oldest first."""
        rows = await self._read(
            "listing a session's media",
            lambda c: c.execute(
                "SELECT l.ref, b.media_type, b.size FROM session_blobs l "
                "JOIN blobs b ON b.ref = l.ref WHERE l.session_id = ? ORDER BY l.rowid",
                (session_id,),
            ).fetchall(),
        )
        return [(r[0], r[1], int(r[2])) for r in rows]

    async def blob_usage(self) -> tuple[int, int]:
        """How many media the store holds and their bytes in all (each stored once)."""
        row = await self._read(
            "counting media",
            lambda c: c.execute("SELECT count(*), coalesce(sum(size), 0) FROM blobs").fetchone(),
        )
        return int(row[0]), int(row[1])
