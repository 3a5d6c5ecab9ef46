"""``BranchStore`` on PostgreSQL: rewinds and forks that share history (migration
``0010_session_forks``), as ``sqlite_branches`` does on SQLite (read its docstring): a fork's
row names its parent and what it shares, its own rows sit at their absolute positions, reads
take the ancestors' rows first (``pg_sql.chain``), a source rewound below a fork's share
gives the fork its own copy of those rows first, and a session with forks is not deleted.

A rewind and a fork are each one transaction of plain statements; a rewind takes the
session's append lock (the advisory lock ``loom_append`` numbers rows under) and, with a
lease, fences with ``loom_check_lease`` as an append does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from loom.errors import InputError
from loom.events import AgentEvent
from loom.messages import Message
from loom.store import codec
from loom.store import pg_sql as q
from loom.store.base import Lease, LedgerEntry, lease_lost

__all__ = ["PostgresBranches", "forks_of", "ledger_rows", "open_call_rows"]

T = TypeVar("T")
Conn = AsyncConnection[Any]


async def _one(conn: Conn, sql: str, params: Any = ()) -> Any:
    return await (await conn.execute(sql, params)).fetchone()


async def _all(conn: Conn, sql: str, params: Any = ()) -> list[Any]:
    return await (await conn.execute(sql, params)).fetchall()


async def _answered(conn: Conn, session_id: str, start: int, stop: int) -> set[str]:
    rows = await _all(conn, q.LOAD_TOOL_MESSAGES, {"sid": session_id, "start": start, "stop": stop})
    return {m.tool_call_id for m in codec.decode_messages([r[0] for r in rows]) if m.tool_call_id}


async def ledger_rows(conn: Conn, session_id: str) -> list[Any]:
    """The session's ledger as stored rows (``q.LEDGER_COLS``), oldest first: a fork's starts
    with its parent's entries for the calls answered in the part it shares."""
    own = await _all(
        conn,
        f"SELECT {q.LEDGER_COLS} FROM ledger WHERE session_id = %s ORDER BY seq",
        (session_id,),
    )
    row = await _one(
        conn, "SELECT parent_id, shared_messages FROM sessions WHERE id = %s", (session_id,)
    )
    if row is None or row[0] is None or not row[1]:
        return list(own)
    answered = await _answered(conn, session_id, 0, int(row[1]))
    inherited = [r for r in await ledger_rows(conn, row[0]) if r[1] in answered]
    return inherited + list(own)


async def open_call_rows(conn: Conn, session_id: str) -> list[Any]:
    """The session's open calls as ledger rows; one statement for a session that is no fork
    (its row comes with them, to tell)."""
    cols = ", ".join(f"l.{c.strip()}" for c in q.LEDGER_COLS.split(","))
    rows = await _all(
        conn,
        f"SELECT s.parent_id, s.shared_messages, {cols} FROM sessions s "
        "LEFT JOIN (open_calls o JOIN ledger l ON l.session_id = o.session_id "
        "AND l.seq = o.ledger_seq) ON o.session_id = s.id WHERE s.id = %s ORDER BY l.seq",
        (session_id,),
    )
    own = [r[2:] for r in rows if r[2] is not None]
    if not rows or rows[0][0] is None or not rows[0][1]:
        return own
    inherited = await open_call_rows(conn, rows[0][0])
    if inherited:
        answered = await _answered(conn, session_id, 0, int(rows[0][1]))
        inherited = [r for r in inherited if r[1] in answered]
    return inherited + own


async def forks_of(conn: Conn, session_id: str) -> list[str]:
    rows = await _all(
        conn, "SELECT id FROM sessions WHERE parent_id = %s ORDER BY id", (session_id,)
    )
    return [r[0] for r in rows]


async def _count(conn: Conn, sql: str, session_id: str) -> int:
    return int((await _one(conn, sql, {"sid": session_id}))[0])


async def _unshare(conn: Conn, fork_id: str, parent_id: str, old: int, new: int) -> None:
    """As ``sqlite_branches._unshare``: the fork gets its own rows of the ledger entries of
    the calls answered in the positions it stops sharing, numbered before its own."""
    answered = await _answered(conn, fork_id, new, old)
    if answered:
        kept = [r for r in await ledger_rows(conn, parent_id) if r[1] in answered]
        low = await _one(conn, "SELECT min(seq) FROM ledger WHERE session_id = %s", (fork_id,))
        first = (0 if low[0] is None else int(low[0])) - len(kept)
        async with conn.cursor() as cur:
            await cur.executemany(
                f"INSERT INTO ledger (session_id, seq, {q.LEDGER_COLS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(fork_id, first + i, *r) for i, r in enumerate(kept)],
            )
    await conn.execute("UPDATE sessions SET shared_messages = %s WHERE id = %s", (new, fork_id))


async def _insert(
    conn: Conn,
    session_id: str,
    m0: int,
    msg_rows: Sequence[tuple[str, str]],
    e0: int,
    ev_rows: Sequence[codec.EventRow],
    now: float,
) -> None:
    async with conn.cursor() as cur:
        if msg_rows:
            await cur.executemany(
                "INSERT INTO messages (session_id, seq, role, data, appended_at) "
                "VALUES (%s, %s, %s, %s, %s)",
                [(session_id, m0 + i, role, data, now) for i, (role, data) in enumerate(msg_rows)],
            )
        if ev_rows:
            await cur.executemany(
                "INSERT INTO events (session_id, seq, run_id, sequence, type, iteration, "
                "timestamp, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(session_id, e0 + i, *ev) for i, ev in enumerate(ev_rows)],
            )
    if ev_rows:  # tailing servers (loom.server.queued) LISTEN for a session's new events
        await conn.execute("SELECT pg_notify('loom_events', %s)", (session_id,))


class PostgresBranches:
    """``BranchStore`` (``loom.store.base``) on top of ``_run``."""

    async def _run(
        self, doing: str, fn: Callable[[Conn], Awaitable[T]], *, retry_lost: bool = True
    ) -> T:
        raise NotImplementedError

    async def rewind(
        self,
        session_id: str,
        at: int,
        *,
        messages: Sequence[Message],
        events: Sequence[AgentEvent],
        lease: Lease | None = None,
    ) -> None:
        """As ``BranchStore.rewind``: one transaction (see the module docstring)."""
        now = time.time()
        msg_rows = [(m.role, codec.encode_message(m)) for m in messages]
        ev_rows = codec.encode_events(events)
        if lease is not None and lease.session_id != session_id:
            raise lease_lost(lease, None)

        async def write(conn: Conn) -> None:
            try:
                async with conn.transaction():
                    await _rewind(conn)
            except psycopg.Error as exc:
                if lease is not None and exc.sqlstate == q.LEASE_LOST_SQLSTATE:
                    raise lease_lost(lease, await _one(conn, q.LEASE_ROW, (session_id,))) from None
                raise

        async def _rewind(conn: Conn) -> None:
            if lease is not None:
                await conn.execute("SELECT loom_check_lease(%s, %s)", (session_id, lease.token))
            await conn.execute("SELECT pg_advisory_xact_lock(19535, hashtext(%s))", (session_id,))
            row = await _one(
                conn,
                "SELECT parent_id, shared_messages FROM sessions WHERE id = %s FOR UPDATE",
                (session_id,),
            )
            count = await _count(conn, q.MESSAGE_COUNT, session_id) if row is not None else 0
            if row is None or not 0 <= at <= count:
                raise InputError(
                    f"rewind: session {session_id!r} has {count} messages; cannot keep {at}"
                )
            forks = await _all(
                conn,
                "SELECT id, shared_messages FROM sessions WHERE parent_id = %s "
                "AND shared_messages > %s ORDER BY id FOR UPDATE",
                (session_id, at),
            )
            for fork_id, shared in forks:
                # the fork's own copy of the positions that are about to change under it
                await conn.execute(
                    q.COPY_MESSAGES,
                    {"sid": session_id, "to": fork_id, "start": at, "stop": int(shared)},
                )
                await _unshare(conn, fork_id, session_id, int(shared), at)
            if row[0] is not None and at < int(row[1]):
                await _unshare(conn, session_id, row[0], int(row[1]), at)
            await conn.execute(
                "DELETE FROM messages WHERE session_id = %s AND seq >= %s", (session_id, at)
            )
            e0 = await _count(conn, q.EVENT_COUNT, session_id)
            await _insert(conn, session_id, at, msg_rows, e0, ev_rows, now)
            await conn.execute(
                "UPDATE sessions SET updated_at = %s, branches = branches + 1 WHERE id = %s",
                (now, session_id),
            )

        await self._run("rewinding a session", write, retry_lost=False)

    async def fork(
        self,
        source_id: str,
        new_id: str,
        at: int,
        upto: int,
        *,
        messages: Sequence[Message],
        events: Sequence[AgentEvent],
        agent_name: str = "",
    ) -> None:
        """As ``BranchStore.fork``: the new session's row names ``source_id`` and what it
        shares; only ``messages`` and ``events`` are written as its rows."""
        now = time.time()
        msg_rows = [(m.role, codec.encode_message(m)) for m in messages]
        ev_rows = codec.encode_events(events)

        async def write(conn: Conn) -> None:
            async with conn.transaction():
                src = await _one(
                    conn, "SELECT agent_name FROM sessions WHERE id = %s FOR SHARE", (source_id,)
                )
                if src is None:
                    raise InputError(f"fork: no session {source_id!r}")
                if await _one(conn, "SELECT 1 FROM sessions WHERE id = %s", (new_id,)):
                    raise InputError(f"fork: session {new_id!r} exists; give a new id")
                count = await _count(conn, q.MESSAGE_COUNT, source_id)
                journal = await _count(conn, q.EVENT_COUNT, source_id)
                if not 0 <= at <= count or not 0 <= upto <= journal:
                    raise InputError(
                        f"fork: session {source_id!r} has {count} messages and {journal} "
                        f"events; cannot share {at} and {upto}"
                    )
                await conn.execute(
                    "INSERT INTO sessions (id, agent_name, created_at, updated_at, parent_id, "
                    "shared_messages, shared_events) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (new_id, codec.scrub_text(agent_name) or src[0], now, now, source_id, at, upto),
                )
                # the media its shared messages may name: one link row each, not the bytes
                await conn.execute(
                    "INSERT INTO session_blobs (session_id, ref) SELECT %s, ref "
                    "FROM session_blobs WHERE session_id = %s ORDER BY seq "
                    "ON CONFLICT DO NOTHING",
                    (new_id, source_id),
                )
                await _insert(conn, new_id, at, msg_rows, upto, ev_rows, now)

        await self._run("forking a session", write, retry_lost=False)

    async def ledger(self, session_id: str) -> list[LedgerEntry]:
        """Every ledger entry of the session, oldest first (a fork's starts with its parent's
        entries for the calls answered in the part it shares)."""
        rows = await self._run("reading the ledger", lambda c: ledger_rows(c, session_id))
        return [codec.decode_ledger(session_id, r) for r in rows]

    async def forks(self, session_id: str) -> list[str]:
        """The sessions forked from ``session_id`` (directly), by id."""
        return await self._run("listing forks", lambda c: forks_of(c, session_id))
