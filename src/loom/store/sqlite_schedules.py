"""``SQLiteStore``'s ``ScheduleTables``: the scheduling tables' SQL, run on the store's own
connection and write transactions (``loom.store.base.ScheduleTables`` says what it promises).

A mixin of ``SQLiteStore``, like its other optional capabilities (``sqlite_extras``): the
store stays the one writer of its database file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from loom.store.base import Statement

__all__ = ["SQLiteScheduleTables"]

T = TypeVar("T")


class SQLiteScheduleTables:
    """``schedule_rows`` / ``schedule_execute`` / ``schedule_gated`` on ``_read`` / ``_write``."""

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def schedule_rows(
        self, doing: str, sql: str, params: Sequence[Any] = ()
    ) -> list[Sequence[Any]]:
        """The rows of one query on the scheduling tables."""
        return await self._read(doing, lambda c: c.execute(sql, tuple(params)).fetchall())

    async def schedule_execute(self, doing: str, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own transaction; returns how many rows it changed."""
        return await self._write(doing, lambda c: c.execute(sql, tuple(params)).rowcount)

    async def schedule_gated(self, doing: str, gate: Statement, then: Sequence[Statement]) -> bool:
        """``gate`` and, only if it changed exactly one row, ``then``: one transaction."""

        def run(c: sqlite3.Connection) -> bool:
            if c.execute(gate[0], tuple(gate[1])).rowcount != 1:
                return False
            for sql, params in then:
                c.execute(sql, tuple(params))
            return True

        return await self._write(doing, run)
