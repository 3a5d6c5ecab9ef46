"""``PostgresStore``'s ``BlobStore``: media bytes once per content hash (migration
``0009_media``; the statements and how a put and a deletion racing on the same bytes stay
consistent are in ``pg_sql``).

A mixin of ``PostgresStore``, as ``postgres_schedules``: the store stays the one owner of its
connections, their retries and error translation. A put is idempotent (bytes already held are
not sent again, links already there are kept), so it is re-sent after a dropped connection.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from loom.store import codec
from loom.store import pg_sql as q
from loom.store.base import Blob

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PostgresBlobs", "forget_session"]

T = TypeVar("T")


async def forget_session(conn: AsyncConnection[Any], session_id: str) -> None:
    """Delete ``session_id``'s links to media, and the bytes no other session names (inside
    the caller's transaction on ``conn``)."""
    cur = await conn.execute(q.UNLINK_SESSION_BLOBS, (session_id,))
    refs = sorted({r[0] for r in await cur.fetchall()})
    if refs:
        await conn.execute(q.LOCK_BLOBS, (refs,))
        await conn.execute(q.DELETE_UNNAMED_BLOBS, (refs,))


class PostgresBlobs:
    """``put_blobs`` / ``load_blobs`` / ``session_blobs`` on ``_run``."""

    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        raise NotImplementedError

    async def put_blobs(self, session_id: str, blobs: Sequence[Blob]) -> None:
        """Store ``blobs`` for ``session_id`` in one transaction: the references held already
        are looked up first and their bytes are not sent; the session's links are added.
        ``MediaTooLarge`` (or ``ContentError`` for a reference that is not the bytes' hash)
        before anything is sent."""
        wanted = codec.check_blobs(blobs)
        if not wanted:
            return
        refs = [b.ref for b in wanted]
        now = time.time()

        async def put(conn: AsyncConnection[Any]) -> None:
            async with conn.transaction():
                cur = await conn.execute(q.BLOBS_HELD, (sorted(refs),))
                held = {r[0] for r in await cur.fetchall()}
                for b in wanted:
                    if b.ref not in held:
                        await conn.execute(
                            q.PUT_BLOB, (b.ref, b.media_type, len(b.data), now, b.data)
                        )
                await conn.execute(q.LINK_BLOBS, (session_id, refs))

        await self._run("storing media", put)

    async def load_blobs(self, refs: Sequence[str]) -> dict[str, bytes]:
        """The bytes of each of ``refs`` the store holds (one query, binary results: no hex
        text twice the size; a missing one is absent)."""
        if not refs:
            return {}
        wanted = list(dict.fromkeys(refs))

        async def read(conn: AsyncConnection[Any]) -> list[Any]:
            cur = conn.cursor(binary=True)
            await cur.execute(q.LOAD_BLOBS, (wanted,))
            return await cur.fetchall()

        rows = await self._run("loading media", read)
        return {r[0]: bytes(r[1]) for r in rows}

    async def session_blobs(self, session_id: str) -> list[tuple[str, str, int]]:
        """The media ``session_id`` names, as (ref, media type, size), oldest first."""

        async def read(conn: AsyncConnection[Any]) -> list[Any]:
            return await (await conn.execute(q.SESSION_BLOBS, (session_id,))).fetchall()

        rows = await self._run("listing a session's media", read)
        return [(r[0], r[1], int(r[2])) for r in rows]

    async def blob_usage(self) -> tuple[int, int]:
        """How many media the store holds and their bytes in all (each stored once)."""

        async def read(conn: AsyncConnection[Any]) -> Any:
            return await (await conn.execute(q.BLOB_USAGE)).fetchone()

        row = await self._run("counting media", read)
        return int(row[0]), int(row[1])
