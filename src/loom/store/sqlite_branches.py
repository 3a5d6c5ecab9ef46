"""``BranchStore`` on SQLite: rewinds and forks that share history (migration
``0010_session_forks``).

A fork's ``sessions`` row names its parent and how many transcript positions
(``shared_messages``) and journal events (``shared_events``) it shares with it. Its own rows
are stored at their absolute positions, from the share on, so every read of a forked session
takes its ancestors' rows below the share and then its own (``codec.segments``): a fork adds
rows for its branch only.

The journal is append-only, so a shared event never changes. The derived transcript is not:
a rewind deletes its rows from the point on. When a session is rewound below what one of its
forks shares, the fork first receives its own copy of the rows it shared in that range (and
the ledger entries of the calls they answer) and its share is lowered, in the same
transaction: a fork never changes because its source did. A session that has forks cannot be
deleted (``InputError`` naming them): their history is its rows.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from loom.errors import InputError, LeaseLost, StoreError
from loom.events import AgentEvent
from loom.messages import Message
from loom.store import codec
from loom.store.base import Lease, LedgerEntry, lease_lost

__all__ = [
    "LEDGER_COLS",
    "SQLiteBranches",
    "chain_of",
    "event_count",
    "forks_of",
    "ledger_rows",
    "message_count",
    "message_rows",
    "next_position",
    "open_call_rows",
    "segments_of",
]

T = TypeVar("T")
# The columns of codec.LedgerRow, in its order.
LEDGER_COLS = "run_id, tool_call_id, name, status, effect, arguments, result, timestamp"

Chain = list[tuple[str, int, int]]


def chain_of(c: sqlite3.Connection, session_id: str) -> Chain:
    """The session, its parent, ..., the root: each with its shared messages and events."""
    out: Chain = []
    current: str | None = session_id
    while current is not None:
        row = c.execute(
            "SELECT parent_id, shared_messages, shared_events FROM sessions WHERE id = ?",
            (current,),
        ).fetchone()
        if row is None:
            out.append((current, 0, 0))
            break
        out.append((current, int(row[1]), int(row[2])))
        current = row[0]
        if len(out) > codec.MAX_FORK_DEPTH:
            raise StoreError(f"session {session_id!r}: its chain of forks loops; repair the file")
    return out


def segments_of(chain: Chain, events: bool = False) -> list[codec.Segment]:
    """The message (or event) segments of the chain's first session, oldest first."""
    return codec.segments([(sid, e if events else m) for sid, m, e in chain])


def message_rows(
    c: sqlite3.Connection,
    session_id: str,
    start: int,
    stop: int | None,
    *,
    cols: str = "data",
    where: str = "",
    indexed: str = "",
) -> list[Any]:
    """The rows (``cols``) of the session's transcript at ``start`` <= position < ``stop``,
    across its ancestors' shared rows; ``where`` narrows them (``"AND role = 'tool'"``)."""
    rows: list[Any] = []
    for seg in segments_of(chain_of(c, session_id)):
        span = codec.clip(seg, start, stop)
        if span is None:
            continue
        sql = f"SELECT {cols} FROM messages{indexed} WHERE session_id = ? AND seq >= ?"
        params: list[Any] = [seg.session_id, span[0]]
        if span[1] is not None:
            sql += " AND seq < ?"
            params.append(span[1])
        rows.extend(c.execute(f"{sql} {where} ORDER BY seq", params).fetchall())
    return rows


def next_position(c: sqlite3.Connection, session_id: str, table: str) -> int:
    """The position the session's next row of ``table`` takes: after its last own row, or at
    its share (a fork that has none yet), or 0."""
    row = c.execute(f"SELECT max(seq) FROM {table} WHERE session_id = ?", (session_id,)).fetchone()
    if row[0] is not None:
        return int(row[0]) + 1
    if table == "ledger":
        return 0
    shared = c.execute(
        "SELECT shared_messages, shared_events FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    if shared is None:
        return 0
    return int(shared[0] if table == "messages" else shared[1])


def message_count(c: sqlite3.Connection, session_id: str) -> int:
    return next_position(c, session_id, "messages")


def event_count(c: sqlite3.Connection, session_id: str) -> int:
    return next_position(c, session_id, "events")


def _answered(c: sqlite3.Connection, session_id: str, start: int, stop: int) -> set[str]:
    """The tool calls answered in the session's transcript at ``start`` <= position < ``stop``."""
    rows = message_rows(c, session_id, start, stop, where="AND role = 'tool'")
    return {m.tool_call_id for m in codec.decode_messages([r[0] for r in rows]) if m.tool_call_id}


def ledger_rows(c: sqlite3.Connection, session_id: str) -> list[Any]:
    """The session's ledger as stored rows (``LEDGER_COLS``), oldest first: a fork's starts
    with its parent's entries for the calls answered in the part it shares."""
    own = c.execute(
        f"SELECT {LEDGER_COLS} FROM ledger WHERE session_id = ? ORDER BY seq", (session_id,)
    ).fetchall()
    row = c.execute(
        "SELECT parent_id, shared_messages FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    if row is None or row[0] is None or not row[1]:
        return list(own)
    answered = _answered(c, session_id, 0, int(row[1]))
    inherited = [r for r in ledger_rows(c, row[0]) if r[1] in answered] if answered else []
    return inherited + list(own)


def open_call_rows(c: sqlite3.Connection, session_id: str) -> list[Any]:
    """The session's open calls as stored ledger rows: a fork's parent's open calls answered
    in the shared part (a fork point never lies inside a step: normally none), then its own."""
    own = c.execute(
        "SELECT "
        + ", ".join(f"l.{col.strip()}" for col in LEDGER_COLS.split(","))
        # CROSS JOIN keeps open_calls the outer table: with a plain JOIN the planner
        # walked the session's whole ledger in seq order to skip the sort
        + " FROM open_calls o CROSS JOIN ledger l"
        " ON l.session_id = o.session_id AND l.seq = o.ledger_seq"
        " WHERE o.session_id = ? ORDER BY l.seq",
        (session_id,),
    ).fetchall()
    row = c.execute(
        "SELECT parent_id, shared_messages FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    if row is None or row[0] is None or not row[1]:
        return list(own)
    inherited = open_call_rows(c, row[0])
    if inherited:
        answered = _answered(c, session_id, 0, int(row[1]))
        inherited = [r for r in inherited if r[1] in answered]
    return inherited + list(own)


def forks_of(c: sqlite3.Connection, session_id: str) -> list[str]:
    return [
        r[0]
        for r in c.execute(
            "SELECT id FROM sessions WHERE parent_id = ? ORDER BY id", (session_id,)
        ).fetchall()
    ]


def _unshare(c: sqlite3.Connection, fork_id: str, parent_id: str, old: int, new: int) -> None:
    """Lower fork ``fork_id``'s share of ``parent_id`` from ``old`` to ``new`` positions: the
    fork gets its own rows of the ledger entries of the calls answered in the positions it
    stops sharing (its ledger reads the same); the caller decides what the fork's transcript
    holds there."""
    answered = _answered(c, fork_id, new, old)
    if answered:
        kept = [r for r in ledger_rows(c, parent_id) if r[1] in answered]
        # numbered before the fork's own rows (and before earlier such copies, which answer
        # later positions): its ledger reads in the order it had while it shared them
        low = c.execute("SELECT min(seq) FROM ledger WHERE session_id = ?", (fork_id,)).fetchone()
        first = (0 if low[0] is None else int(low[0])) - len(kept)
        c.executemany(
            f"INSERT INTO ledger (session_id, seq, {LEDGER_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(fork_id, first + i, *r) for i, r in enumerate(kept)],
        )
    c.execute("UPDATE sessions SET shared_messages = ? WHERE id = ?", (new, fork_id))


def check_lease(c: sqlite3.Connection, session_id: str, lease: Lease) -> None:
    """Raise ``LeaseLost`` unless ``lease`` is the session's current, unreleased lease."""
    if lease.session_id != session_id:
        raise LeaseLost(
            f"the lease of session {lease.session_id!r} cannot write to session {session_id!r}"
        )
    row = c.execute(
        "SELECT token, released, run_id FROM locks WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None or row[0] != lease.token or row[1]:
        raise lease_lost(lease, row)


class SQLiteBranches:
    """``BranchStore`` (``loom.store.base``) on top of ``_read`` / ``_write``."""

    _next_seqs: dict[str, tuple[int, int, int, int]]

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
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
        """As ``BranchStore.rewind``: one transaction. The forks that share positions from
        ``at`` on get their own copy of them first (see the module docstring)."""
        now = time.time()
        msg_rows = [(m.role, codec.encode_message(m)) for m in messages]
        ev_rows = codec.encode_events(events)
        touched: list[str] = [session_id]

        def write(c: sqlite3.Connection) -> None:
            if lease is not None:
                check_lease(c, session_id, lease)
            row = c.execute(
                "SELECT parent_id, shared_messages FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            count = message_count(c, session_id) if row is not None else 0
            if row is None or not 0 <= at <= count:
                raise InputError(
                    f"rewind: session {session_id!r} has {count} messages; cannot keep {at}"
                )
            forks = c.execute(
                "SELECT id, shared_messages FROM sessions WHERE parent_id = ? "
                "AND shared_messages > ? ORDER BY id",
                (session_id, at),
            ).fetchall()
            for fork_id, shared in forks:
                # the fork's own copy of the positions that are about to change under it
                for seg in segments_of(chain_of(c, session_id)):
                    span = codec.clip(seg, at, int(shared))
                    if span is None:
                        continue
                    c.execute(
                        "INSERT INTO messages (session_id, seq, role, data, appended_at) "
                        "SELECT ?, seq, role, data, appended_at FROM messages "
                        "WHERE session_id = ? AND seq >= ? AND seq < ?",
                        (fork_id, seg.session_id, span[0], span[1]),
                    )
                _unshare(c, fork_id, session_id, int(shared), at)
                touched.append(fork_id)
            if row[0] is not None and at < int(row[1]):
                _unshare(c, session_id, row[0], int(row[1]), at)
            c.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (session_id, at))
            c.executemany(
                "INSERT INTO messages (session_id, seq, role, data, appended_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(session_id, at + i, role, data, now) for i, (role, data) in enumerate(msg_rows)],
            )
            e0 = event_count(c, session_id)
            c.executemany(
                "INSERT INTO events (session_id, seq, run_id, sequence, type, iteration, "
                "timestamp, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(session_id, e0 + i, *ev) for i, ev in enumerate(ev_rows)],
            )
            c.execute(
                "UPDATE sessions SET updated_at = ?, branches = branches + 1 WHERE id = ?",
                (now, session_id),
            )

        try:
            await self._write("rewinding a session", write)
        finally:
            for sid in touched:  # numbered from the tables again at their next append
                self._next_seqs.pop(sid, None)

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

        def write(c: sqlite3.Connection) -> None:
            src = c.execute("SELECT agent_name FROM sessions WHERE id = ?", (source_id,)).fetchone()
            if src is None:
                raise InputError(f"fork: no session {source_id!r}")
            if c.execute("SELECT 1 FROM sessions WHERE id = ?", (new_id,)).fetchone():
                raise InputError(f"fork: session {new_id!r} exists; give a new id")
            count, journal = message_count(c, source_id), event_count(c, source_id)
            if not 0 <= at <= count or not 0 <= upto <= journal:
                raise InputError(
                    f"fork: session {source_id!r} has {count} messages and {journal} events; "
                    f"cannot share {at} and {upto}"
                )
            c.execute(
                "INSERT INTO sessions (id, agent_name, created_at, updated_at, parent_id, "
                "shared_messages, shared_events) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (new_id, agent_name or src[0], now, now, source_id, at, upto),
            )
            # the media its shared messages may name: one link row each, not the bytes
            c.execute(
                "INSERT OR IGNORE INTO session_blobs (session_id, ref) "
                "SELECT ?, ref FROM session_blobs WHERE session_id = ? ORDER BY rowid",
                (new_id, source_id),
            )
            c.executemany(
                "INSERT INTO messages (session_id, seq, role, data, appended_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(new_id, at + i, role, data, now) for i, (role, data) in enumerate(msg_rows)],
            )
            c.executemany(
                "INSERT INTO events (session_id, seq, run_id, sequence, type, iteration, "
                "timestamp, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(new_id, upto + i, *ev) for i, ev in enumerate(ev_rows)],
            )

        await self._write("forking a session", write)
        self._next_seqs.pop(new_id, None)

    async def ledger(self, session_id: str) -> list[LedgerEntry]:
        """Every ledger entry of the session, oldest first (a fork's starts with its parent's
        entries for the calls answered in the part it shares)."""
        rows = await self._read("reading the ledger", lambda c: ledger_rows(c, session_id))
        return [codec.decode_ledger(session_id, r) for r in rows]

    async def forks(self, session_id: str) -> list[str]:
        """The sessions forked from ``session_id`` (directly), by id."""
        return await self._read("listing forks", lambda c: forks_of(c, session_id))
