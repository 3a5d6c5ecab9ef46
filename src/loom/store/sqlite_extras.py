"""The optional capabilities of ``SQLiteStore``: errors, large results, key-values.

Kept apart from ``sqlite.py`` to keep each module short; every query is parameterised (the
only SQL built at run time joins constant fragments).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from loom.errors import StoreError
from loom.store import codec
from loom.store.base import StoredError, StoredResult, new_error_id
from loom.store.codec import decode_value, encode_value, scrub_text

T = TypeVar("T")


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class SQLiteCapabilities:
    """``ErrorStore``, ``ResultStore`` and ``KVStore`` on top of ``_read`` / ``_write``."""

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    # -- ErrorStore -----------------------------------------------------------------------------
    async def save_error(self, error: StoredError) -> str:
        error.id = error.id or new_error_id(error.timestamp)
        raw = encode_value(error.raw_error, "raw_error of error {}", error.id)
        summary = scrub_text(error.short_summary)

        def insert(c: sqlite3.Connection) -> str:
            for _ in range(5):
                try:
                    c.execute(
                        f"INSERT INTO errors ({codec.ERROR_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            error.id,
                            error.timestamp.timestamp(),
                            error.session_id,
                            error.run_id,
                            error.tool_call_id,
                            scrub_text(error.tool_name),
                            raw,
                            summary,
                        ),
                    )
                    return error.id
                except sqlite3.IntegrityError:  # same second, same 24 random bits: draw again
                    error.id = new_error_id(error.timestamp)
            raise StoreError("could not find a free error id after 5 draws")

        return await self._write("saving an error", insert)

    async def get_error(self, error_id: str) -> StoredError | None:
        row = await self._read(
            "reading an error",
            lambda c: c.execute(
                f"SELECT {codec.ERROR_COLS} FROM errors WHERE id = ?", (error_id,)
            ).fetchone(),
        )
        return codec.decode_error(row) if row else None

    async def list_errors(
        self,
        *,
        session_id: str | None = None,
        tool_name: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
    ) -> list[StoredError]:
        where, params = ["1 = 1"], []  # only constant fragments are joined; values are bound
        for clause, value in (
            ("session_id = ?", session_id),
            ("tool_name = ?", tool_name),
            ("timestamp >= ?", since.timestamp() if since else None),
            ("timestamp <= ?", until.timestamp() if until else None),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        params.append(limit if limit > 0 else -1)
        sql = (
            f"SELECT {codec.ERROR_COLS} FROM errors WHERE {' AND '.join(where)} "
            "ORDER BY timestamp DESC, id DESC LIMIT ?"
        )
        rows = await self._read("listing errors", lambda c: c.execute(sql, params).fetchall())
        return [codec.decode_error(r) for r in rows]

    async def delete_errors(self, older_than: datetime) -> int:
        return await self._write(
            "deleting errors",
            lambda c: (
                c.execute(
                    "DELETE FROM errors WHERE timestamp < ?", (older_than.timestamp(),)
                ).rowcount
            ),
        )

    # -- ResultStore ----------------------------------------------------------------------------
    async def save_result(self, result: StoredResult) -> str:
        await self._write(
            "saving a large result",
            lambda c: c.execute(
                "INSERT INTO results (ref, session_id, run_id, tool_call_id, tool_name, "
                "created_at, content) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    result.ref,
                    result.session_id,
                    result.run_id,
                    result.tool_call_id,
                    scrub_text(result.tool_name),
                    result.created_at.timestamp(),
                    scrub_text(result.content),
                ),
            ),
        )
        return result.ref

    async def get_result(self, ref: str) -> StoredResult | None:
        row = await self._read(
            "reading a large result",
            lambda c: c.execute(
                "SELECT ref, session_id, tool_name, content, run_id, tool_call_id, created_at "
                "FROM results WHERE ref = ?",
                (ref,),
            ).fetchone(),
        )
        if row is None:
            return None
        return StoredResult(row[0], row[1], row[2], row[3], row[4], row[5], _dt(row[6]))

    async def delete_results(self, older_than: datetime) -> int:
        """Delete large results stored before ``older_than``; return how many."""
        return await self._write(
            "deleting results",
            lambda c: (
                c.execute(
                    "DELETE FROM results WHERE created_at < ?", (older_than.timestamp(),)
                ).rowcount
            ),
        )

    # -- KVStore --------------------------------------------------------------------------------
    async def put_value(self, namespace: str, key: str, value: Any) -> None:
        encoded = encode_value(value, "value {}/{}", namespace, key)
        await self._write(
            "saving a value",
            lambda c: c.execute(
                "INSERT INTO kv (namespace, key, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (namespace, key, encoded, time.time()),
            ),
        )

    async def get_value(self, namespace: str, key: str) -> Any | None:
        row = await self._read(
            "reading a value",
            lambda c: c.execute(
                "SELECT value FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone(),
        )
        return decode_value(row[0]) if row else None

    async def list_keys(self, namespace: str, prefix: str = "") -> list[str]:
        rows = await self._read(
            "listing keys",
            lambda c: c.execute(
                "SELECT key FROM kv WHERE namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
                (namespace, len(prefix), prefix),
            ).fetchall(),
        )
        return [r[0] for r in rows]

    async def delete_value(self, namespace: str, key: str) -> bool:
        return bool(
            await self._write(
                "deleting a value",
                lambda c: (
                    c.execute(
                        "DELETE FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
                    ).rowcount
                ),
            )
        )
