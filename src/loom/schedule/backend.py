"""Running the schedule tables' SQL on a ``SQLiteStore``'s or ``PostgresStore``'s connection.

Queries are written once with ``?`` placeholders (PostgreSQL gets ``%s``). The one
transactional shape the scheduler needs is a *gated* write: a conditional UPDATE that must
change exactly one row, then the statements that depend on it, all in one transaction (or
nothing, when another process changed the row first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loom.errors import ConfigurationError

if TYPE_CHECKING:
    import sqlite3

__all__ = ["Backend", "Statement", "backend_of"]

Statement = tuple[str, Sequence[Any]]


class Backend(Protocol):
    """What ``ScheduleStore`` and ``MonitorStore`` run their SQL on."""

    async def rows(self, doing: str, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    async def execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int: ...

    async def gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool: ...


class _SQLite:
    def __init__(self, store: Any) -> None:
        self.store = store

    async def rows(self, doing: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        result: list[Any] = await self.store._read(
            doing, lambda c: c.execute(sql, tuple(params)).fetchall()
        )
        return result

    async def execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int:
        result: int = await self.store._write(
            doing, lambda c: c.execute(sql, tuple(params)).rowcount
        )
        return result

    async def gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            if c.execute(gate[0], tuple(gate[1])).rowcount != 1:
                return False
            for sql, params in then:
                c.execute(sql, tuple(params))
            return True

        result: bool = await self.store._write(doing, run)
        return result


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _Postgres:
    def __init__(self, store: Any) -> None:
        self.store = store

    async def rows(self, doing: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        result: list[Any] = await self.store._fetchall(doing, _pg(sql), tuple(params))
        return result

    async def execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int:
        # not re-sent after a dropped connection: a conditional UPDATE is not idempotent
        result: int = await self.store._rowcount(doing, _pg(sql), tuple(params), retry_lost=False)
        return result

    async def gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool:
        async def run(conn: Any) -> bool:
            async with conn.transaction():
                cur = await conn.execute(_pg(gate[0]), tuple(gate[1]))
                if cur.rowcount != 1:
                    return False
                for sql, params in then:
                    await conn.execute(_pg(sql), tuple(params))
                return True

        result: bool = await self.store._run(doing, run, retry_lost=False)
        return result


def backend_of(store: Any) -> Backend:
    """The backend for ``store`` (a server's ``OwnedStore`` is looked through)."""
    while hasattr(store, "_inner"):
        store = store._inner
    from loom.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return _SQLite(store)
    if type(store).__name__ == "PostgresStore" and hasattr(store, "_run"):
        return _Postgres(store)
    raise ConfigurationError(
        f"schedules and monitors are kept in a SQLiteStore or PostgresStore, not in "
        f"{type(store).__name__}; give the runtime one of those"
    )
