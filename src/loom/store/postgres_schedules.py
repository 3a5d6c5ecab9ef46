"""``PostgresStore``'s ``ScheduleTables``: the scheduling tables' SQL, run on the store's pool
(``loom.store.base.ScheduleTables`` says what it promises).

A mixin of ``PostgresStore``: the store stays the one owner of its connections, their retries
and error translation. Statements come with ``?`` placeholders (SQLite's); they are sent with
``%s``. Writes are not re-sent after a dropped connection: a conditional UPDATE is not
idempotent (a re-sent claim would find the row moved and report a lost race it won).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from loom.store.base import Statement

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PostgresScheduleTables"]

T = TypeVar("T")


def _pg(sql: str) -> str:
    # a literal % (LIKE 'job:%') is psycopg's placeholder sign: it must be doubled, or every
    # list_schedules() on PostgreSQL failed ("only '%s', '%b', '%t' are allowed")
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresScheduleTables:
    """``schedule_rows`` / ``schedule_execute`` / ``schedule_gated`` on ``_run``."""

    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        raise NotImplementedError

    async def schedule_rows(
        self, doing: str, sql: str, params: Sequence[Any] = ()
    ) -> list[Sequence[Any]]:
        """The rows of one query on the scheduling tables."""

        async def read(conn: AsyncConnection[Any]) -> list[Sequence[Any]]:
            return list(await (await conn.execute(_pg(sql), tuple(params))).fetchall())

        return await self._run(doing, read)

    async def schedule_execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own transaction; returns how many rows it changed."""

        async def write(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(_pg(sql), tuple(params))).rowcount

        return await self._run(doing, write, retry_lost=False)

    async def schedule_gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool:
        """``gate`` and, only if it changed exactly one row, ``then``: one transaction."""

        async def run(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                cur = await conn.execute(_pg(gate[0]), tuple(gate[1]))
                if cur.rowcount != 1:
                    return False
                for sql, params in then:
                    await conn.execute(_pg(sql), tuple(params))
                return True

        return await self._run(doing, run, retry_lost=False)
