"""``SQLiteStore``: the embedded, durable default (stdlib ``sqlite3``, WAL mode).

```python
from loom import Agent
from loom.store import SQLiteStore

agent = Agent(..., store=SQLiteStore(".loom/loom.db"))
```

Durability: every ``append`` is one ``BEGIN IMMEDIATE`` … ``COMMIT`` transaction (with
``threaded=True``, a savepoint in a group commit shared with the writes queued meanwhile; it
still returns only after the COMMIT that holds its rows). With the
default ``durability="normal"`` (``PRAGMA synchronous=NORMAL`` in WAL mode) a commit survives the
process being killed at any instant (SIGKILL, OOM, a crash), and the database stays consistent
after a power cut, but the last commits before an OS crash or power loss may be lost.
``durability="full"`` (``synchronous=FULL``) fsyncs the WAL at every commit, so a step announced
is on disk even after a power cut; it costs about 0.2 ms per commit on an SSD.

Besides ``Store`` it implements the optional capabilities of ``loom.store.base``:
``ErrorStore``, ``ResultStore``, ``RunStore``, ``KVStore``, ``ScheduleTables``, ``BlobStore``
(media bytes once per content hash, ``sqlite_media.py``) and ``BranchStore`` (rewinds, and
forks that share their parent's rows, ``sqlite_branches.py``). Every query is parameterised.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from loom.embedding.base import Embedder
from loom.errors import ConfigurationError, InputError, StoreError
from loom.events import AgentEvent, EventType
from loom.messages import Message, Usage
from loom.store import codec
from loom.store.base import Lease, LedgerEntry, RunRecord, SessionInfo
from loom.store.erase import SQLiteErase
from loom.store.sqlite_branches import (
    SQLiteBranches,
    chain_of,
    check_lease,
    forks_of,
    message_count,
    message_rows,
    next_position,
    open_call_rows,
    segments_of,
)
from loom.store.sqlite_db import (
    Database,
    Durability,
    Owner,
    open_database,
    release_database,
    run_call,
)
from loom.store.sqlite_extras import SQLiteCapabilities
from loom.store.sqlite_items import SQLiteItems
from loom.store.sqlite_media import SQLiteBlobs, forget_session
from loom.store.sqlite_schedules import SQLiteScheduleTables

__all__ = ["SQLiteStore", "check_lease"]

T = TypeVar("T")
# A session's message count and last change come from its last message row (migration 0002:
# appends no longer rewrite the session row); rows written before 0002 have no appended_at. A
# fork with no message of its own yet holds the messages it shares (migration 0010).
_SESSION_SELECT = (
    "SELECT s.id, s.agent_name, s.created_at, "
    "max(s.updated_at, coalesce(m.appended_at, 0)) AS changed, "
    "coalesce(m.seq + 1, s.shared_messages), "
    "s.input_tokens, s.output_tokens, s.requests, s.metadata, s.branches FROM sessions s "
    "LEFT JOIN messages m ON m.session_id = s.id "
    "AND m.seq = (SELECT max(seq) FROM messages WHERE session_id = s.id)"
)
_RUN_COLS = "run_id, status, input_tokens, output_tokens, requests, timestamp, data"


# Every table with rows that belong to one session (delete_session clears them all).
_SESSION_TABLES = (
    "messages",
    "events",
    "ledger",
    "open_calls",
    "open_runs",
    "runs",
    "errors",
    "results",
)  # not locks: a session's lease row keeps its fencing token increasing (it is released)


_EVENT_COLS = "run_id, sequence, type, iteration, timestamp, data"  # codec.EventRow's order


def _event_rows(
    c: sqlite3.Connection,
    session_id: str,
    where: str = "",
    params: tuple[Any, ...] = (),
    indexed: str = "",
) -> list[Any]:
    """The session's journal rows (``_EVENT_COLS``) in order, a fork's shared ones first."""
    rows: list[Any] = []
    for seg in segments_of(chain_of(c, session_id), events=True):
        if seg.hi is not None and seg.lo >= seg.hi:
            continue
        sql = f"SELECT {_EVENT_COLS} FROM events{indexed} WHERE session_id = ? AND seq >= ?"
        bounds: tuple[int, ...] = (seg.lo,)
        if seg.hi is not None:
            sql, bounds = sql + " AND seq < ?", (seg.lo, seg.hi)
        rows.extend(
            c.execute(f"{sql} {where} ORDER BY seq", (seg.session_id, *bounds, *params)).fetchall()
        )
    return rows


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class SQLiteStore(
    SQLiteCapabilities, SQLiteScheduleTables, SQLiteBlobs, SQLiteBranches, SQLiteItems, SQLiteErase
):
    """Sessions, transcripts, events, the tool-call ledger, errors and large results in SQLite.

    Args:
        path: The database file (created with its schema if missing) or ``":memory:"``.
        durability: ``"normal"`` (default: survives process crashes) or ``"full"`` (also
            survives power loss; fsync per commit). See the module docstring.
        threaded: Run SQLite calls on one writer thread instead of inline on the event loop.
            Inline is faster per step (no thread hop); a writer thread keeps the loop free
            while ``durability="full"`` waits for fsync, and commits the writes queued
            meanwhile together (group commit: one fsync for many sessions' steps).
        busy_timeout: Seconds to wait for another process's write lock before ``StoreError``.
        embedder: Embeds items for semantic and hybrid search (``loom.store.items_vectors``);
            None: keyword search only (items are still marked for embedding later).

    Raises:
        StoreCorrupt: the file is damaged or not a Loom database.
        SchemaTooNew: the file was written by a newer Loom.
        StoreError: the file cannot be opened (missing directory, permissions, locked).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        durability: Durability = "normal",
        threaded: bool = False,
        busy_timeout: float = 5.0,
        embedder: Embedder | None = None,
    ) -> None:
        if durability not in ("normal", "full"):
            raise ConfigurationError(f"durability must be 'normal' or 'full', got {durability!r}")
        if busy_timeout < 0:
            raise ConfigurationError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        self.path = str(path)
        self.durability: Durability = durability
        self.threaded = threaded
        self.busy_timeout = busy_timeout
        self._embedder = embedder
        self._owner = Owner.me()
        self._legacy_leases: dict[tuple[str, str], Lease] = {}
        # session -> (lease token, next message, event and ledger seq) after our last write
        self._next_seqs: dict[str, tuple[int, int, int, int]] = {}
        self._db: Database | None = open_database(self.path, durability)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, durability={self.durability!r})"

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def db(self) -> Database:
        if self._db is None:
            raise StoreError(f"SQLiteStore({self.path!r}) is closed; create a new one")
        return self._db

    async def _read(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self.db
        return await run_call(
            db,
            lambda: db.read(fn),
            doing=doing,
            busy_timeout=self.busy_timeout,
            threaded=self.threaded,
        )

    async def _write(self, doing: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        # Inline: one transaction, at once. With the writer thread, a group commit: one
        # transaction for the writes queued meanwhile, a savepoint each (``GroupCommit``).
        return await self.db.commit_grouped(
            fn, doing=doing, busy_timeout=self.busy_timeout, threaded=self.threaded
        )

    # -- sessions -------------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionInfo | None:
        row = await self._read(
            "reading a session",
            lambda c: c.execute(_SESSION_SELECT + " WHERE s.id = ?", (session_id,)).fetchone(),
        )
        return codec.decode_session(row) if row else None

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        now = time.time()
        encoded = codec.encode_value(metadata or {}, "session metadata")

        def create(c: sqlite3.Connection) -> Any:
            c.execute(
                "INSERT INTO sessions (id, agent_name, created_at, updated_at, metadata)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                " agent_name = excluded.agent_name"
                " WHERE sessions.agent_name = '' AND excluded.agent_name != ''",
                (session_id, agent_name, now, now, encoded),
            )
            return c.execute(_SESSION_SELECT + " WHERE s.id = ?", (session_id,)).fetchone()

        return codec.decode_session(await self._write("creating a session", create))

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        rows = await self._read(
            "listing sessions",
            lambda c: c.execute(
                _SESSION_SELECT + " ORDER BY changed DESC, s.id LIMIT ?",
                (limit if limit > 0 else -1,),
            ).fetchall(),
        )
        return [codec.decode_session(r) for r in rows]

    async def load_messages(self, session_id: str, start: int = 0) -> list[Message]:
        if start < 0:
            raise InputError(f"load_messages: start must be >= 0, got {start}")
        # seq is the message's 0-based position: a range seek on the (session_id, seq) key
        # (a fork's: on each session it shares rows with, ``sqlite_branches``).
        rows = await self._read(
            "loading messages", lambda c: message_rows(c, session_id, start, None)
        )
        return codec.decode_messages([r[0] for r in rows])

    async def message_count(self, session_id: str) -> int:
        return await self._read("counting messages", lambda c: message_count(c, session_id))

    async def load_message_range(self, session_id: str, start: int, stop: int) -> list[Message]:
        if start < 0:
            raise InputError(f"load_message_range: start must be >= 0, got {start}")
        rows = await self._read(
            "loading messages", lambda c: message_rows(c, session_id, start, stop)
        )
        return codec.decode_messages([r[0] for r in rows])

    async def load_system_messages(self, session_id: str) -> list[tuple[int, Message]]:
        """The transcript's system messages through the ``messages_system`` partial index."""
        rows = await self._read(
            "loading system messages",
            lambda c: message_rows(
                c,
                session_id,
                0,
                None,
                cols="seq, data",
                where="AND role = 'system'",
                indexed=" INDEXED BY messages_system",
            ),
        )
        decoded = codec.decode_messages([r[1] for r in rows])
        return [(int(r[0]), m) for r, m in zip(rows, decoded, strict=True)]

    # -- the one write path of a turn -----------------------------------------------------------
    async def append(
        self,
        session_id: str,
        *,
        messages: Sequence[Message] = (),
        events: Sequence[AgentEvent] = (),
        ledger: Sequence[LedgerEntry] = (),
        run: RunRecord | None = None,
        lease: Lease | None = None,
    ) -> None:
        # Serialise before taking the lock (the transaction only runs INSERTs); a value that
        # cannot be stored raises SerializationError here, before anything is written.
        now = time.time()
        msg_rows = [(m.role, codec.encode_message(m)) for m in messages]
        ev_rows = codec.encode_events(events)
        led_rows = [codec.encode_ledger(e) for e in ledger]
        run_row = codec.encode_run(run) if run is not None else None
        usage = run.usage if run is not None and run.status != "running" else Usage()

        def next_seq(c: sqlite3.Connection, table: str) -> int:
            # A read (index seek), so a commit dirties no page for numbering its rows.
            return next_position(c, session_id, table)

        # The next row numbers after this store's last write under the same lease token:
        # fencing means no other leased writer can have written since, so the three
        # ``max(seq)`` reads and the session-row check are skipped. A lease-less writer in
        # between makes an INSERT collide (primary key): then the step is retried, reading.
        cached = self._next_seqs.pop(session_id, None) if lease is not None else None
        if cached is not None and lease is not None and cached[0] != lease.token:
            cached = None

        def write(c: sqlite3.Connection) -> tuple[int, int, int, int] | None:
            if lease is not None:  # fencing: in the same transaction as the write
                check_lease(c, session_id, lease)
            # Only a run record changes the session row (usage, updated_at); other commits
            # leave it untouched so that they write one WAL frame less (migration 0002).
            if run is not None:
                cur = c.execute(
                    "UPDATE sessions SET updated_at = ?, input_tokens = input_tokens + ?, "
                    "output_tokens = output_tokens + ?, requests = requests + ? WHERE id = ?",
                    (now, usage.input_tokens, usage.output_tokens, usage.requests, session_id),
                )
                if cur.rowcount == 0:
                    c.execute(
                        "INSERT INTO sessions (id, created_at, updated_at, input_tokens, "
                        "output_tokens, requests) VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            session_id,
                            now,
                            now,
                            usage.input_tokens,
                            usage.output_tokens,
                            usage.requests,
                        ),
                    )
            elif cached is None:  # a read when the row exists: dirties no page
                c.execute(
                    "INSERT OR IGNORE INTO sessions (id, created_at, updated_at) VALUES (?, ?, ?)",
                    (session_id, now, now),
                )
            if cached is not None:
                _, m0, e0, l0 = cached
            elif lease is not None:  # all three, to number the next commits without reading
                m0, e0, l0 = next_seq(c, "messages"), next_seq(c, "events"), next_seq(c, "ledger")
            else:
                m0 = next_seq(c, "messages") if msg_rows else 0
                e0 = next_seq(c, "events") if ev_rows else 0
                l0 = next_seq(c, "ledger") if led_rows else 0
            if msg_rows:
                c.executemany(
                    "INSERT INTO messages (session_id, seq, role, data, appended_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [
                        (session_id, m0 + i, role, data, now)
                        for i, (role, data) in enumerate(msg_rows)
                    ],
                )
            if ev_rows:
                c.executemany(
                    "INSERT INTO events (session_id, seq, run_id, sequence, type, iteration, "
                    "timestamp, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(session_id, e0 + i, *ev) for i, ev in enumerate(ev_rows)],
                )
            for i, led in enumerate(led_rows):
                c.execute(
                    "INSERT INTO ledger (session_id, seq, run_id, tool_call_id, name, status, "
                    "effect, arguments, result, timestamp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, l0 + i, *led),
                )
                if led[3] == "started":
                    c.execute(
                        "INSERT OR REPLACE INTO open_calls VALUES (?, ?, ?, ?)",
                        (session_id, led[0], led[1], l0 + i),
                    )
                else:
                    c.execute(
                        "DELETE FROM open_calls WHERE session_id = ? AND run_id = ? AND "
                        "tool_call_id = ?",
                        (session_id, led[0], led[1]),
                    )
            if run_row is not None:
                cur = c.execute(
                    f"INSERT INTO runs (session_id, {_RUN_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, *run_row),
                )
                if run_row.status == "running":
                    c.execute(
                        "INSERT OR REPLACE INTO open_runs VALUES (?, ?, ?)",
                        (session_id, run_row.run_id, cur.lastrowid),
                    )
                else:
                    c.execute(
                        "DELETE FROM open_runs WHERE session_id = ? AND run_id = ?",
                        (session_id, run_row.run_id),
                    )
            if lease is None:
                return None
            return lease.token, m0 + len(msg_rows), e0 + len(ev_rows), l0 + len(led_rows)

        try:
            after = await self._write("saving a step", write)
        except StoreError as exc:
            if cached is None or not isinstance(exc.__cause__, sqlite3.IntegrityError):
                raise
            cached = None  # someone wrote without a lease: number from the table
            after = await self._write("saving a step", write)
        if after is not None:
            self._next_seqs[session_id] = after
            if len(self._next_seqs) > 1024:  # sessions this store no longer writes to
                self._next_seqs.pop(next(iter(self._next_seqs)))

    # -- ledger, runs, events -------------------------------------------------------------------
    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        rows = await self._read("reading open tool calls", lambda c: open_call_rows(c, session_id))
        return [codec.decode_ledger(session_id, r) for r in rows]

    async def open_runs(self, session_id: str) -> list[RunRecord]:
        rows = await self._read(
            "reading open runs",
            lambda c: c.execute(
                "SELECT "
                + ", ".join(f"r.{col.strip()}" for col in _RUN_COLS.split(","))
                + " FROM open_runs o JOIN runs r ON r.id = o.run_row"
                " WHERE o.session_id = ? ORDER BY r.id",
                (session_id,),
            ).fetchall(),
        )
        return [codec.decode_run(session_id, r) for r in rows]

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        """Every run record (starts and ends) of the session, oldest first."""
        rows = await self._read(
            "listing runs",
            lambda c: c.execute(
                f"SELECT {_RUN_COLS} FROM runs WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall(),
        )
        return [codec.decode_run(session_id, r) for r in rows]

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        if run_id is None:
            rows = await self._read("loading events", lambda c: _event_rows(c, session_id))
        else:
            # without statistics the planner would walk the session's whole journal by its key
            rows = await self._read(
                "loading events",
                lambda c: _event_rows(
                    c, session_id, "AND run_id = ?", (run_id,), " INDEXED BY events_run"
                ),
            )
        return [codec.decode_event(session_id, r) for r in rows]

    async def load_events_of_type(
        self, session_id: str, types: Sequence[EventType]
    ) -> list[AgentEvent]:
        """The session's events whose type is in ``types``, in journal order (approval events
        through the ``events_approvals`` partial index)."""
        where = codec.event_types_clause(types)
        # Without ANALYZE statistics SQLite would walk the session's primary-key range instead.
        use = " INDEXED BY events_approvals" if where.startswith(codec.INDEXED_CLAUSE) else ""
        rows = await self._read(
            "loading events", lambda c: _event_rows(c, session_id, f"AND {where}", (), use)
        )
        return [codec.decode_event(session_id, r) for r in rows]

    async def load_latest_events(
        self, session_id: str, types: Sequence[EventType], limit: int
    ) -> list[AgentEvent]:
        """The newest ``limit`` events of ``types``: the primary key walked back from the end."""
        if limit < 1:
            raise InputError(f"load_latest_events: limit must be >= 1, got {limit}")
        where = codec.event_types_clause(types)

        def latest(c: sqlite3.Connection) -> list[Any]:
            found: list[Any] = []
            for seg in reversed(segments_of(chain_of(c, session_id), events=True)):
                sql = (
                    f"SELECT {_EVENT_COLS} FROM events WHERE session_id = ? AND seq >= ? "
                    + ("AND seq < ? " if seg.hi is not None else "")
                    + f"AND {where} ORDER BY seq DESC LIMIT ?"
                )
                bounds = (seg.lo,) if seg.hi is None else (seg.lo, seg.hi)
                found.extend(
                    c.execute(sql, (seg.session_id, *bounds, limit - len(found))).fetchall()
                )
                if len(found) >= limit or seg.lo <= 0:
                    break
            return found

        rows = await self._read("loading events", latest)
        return [codec.decode_event(session_id, r) for r in reversed(rows)]

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything kept for it (messages, events, runs, tool-call
        ledger, stored errors and results, its lock, the media no other session names) in one
        transaction.

        Returns False when there was no such session; ``InputError`` (nothing deleted) when
        other sessions were forked from it: they share its rows. The caller makes sure no run
        is using the session (take its lock first, as ``loom sessions delete`` does).
        """

        def delete(c: sqlite3.Connection) -> bool:
            forks = forks_of(c, session_id)
            if forks:
                raise InputError(
                    f"session {session_id!r} has forks that share its history ({', '.join(forks)}"
                    "); delete them first"
                )
            found = c.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0
            for table in _SESSION_TABLES:
                c.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
            forget_session(c, session_id)
            c.execute("UPDATE locks SET released = 1 WHERE session_id = ?", (session_id,))
            return found

        return await self._write("deleting a session", delete)

    # -- session leases (across processes) ------------------------------------------------------
    async def acquire_lease(self, session_id: str, run_id: str, ttl: float) -> Lease | None:
        me = self._owner

        def take(c: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = c.execute(
                "SELECT run_id, host, pid, start_ticks, expires_at, token, released FROM locks "
                "WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if (
                row is not None
                and not row[6]
                and row[0] != run_id
                and row[4] > now
                and Owner(row[1], row[2], row[3]).alive()  # a dead holder's lease is void
            ):
                return None
            # The row is never deleted (release marks it), so the token survives releases.
            token = int(row[5]) + 1 if row is not None else 1
            c.execute(
                "INSERT OR REPLACE INTO locks (session_id, run_id, host, pid, start_ticks, "
                "acquired_at, expires_at, token, released) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (session_id, run_id, me.host, me.pid, me.start_ticks, now, now + ttl, token),
            )
            return Lease(session_id, run_id, token, now + ttl)

        return await self._write("taking a session lease", take)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        def renew(c: sqlite3.Connection) -> Lease:
            check_lease(c, lease.session_id, lease)
            expires = time.time() + ttl
            c.execute(
                "UPDATE locks SET expires_at = ? WHERE session_id = ?", (expires, lease.session_id)
            )
            return Lease(lease.session_id, lease.run_id, lease.token, expires)

        return await self._write("renewing a session lease", renew)

    async def release_lease(self, lease: Lease) -> None:
        await self._write(
            "releasing a session lease",
            lambda c: c.execute(
                "UPDATE locks SET released = 1 WHERE session_id = ? AND token = ?",
                (lease.session_id, lease.token),
            ),
        )

    # -- maintenance ----------------------------------------------------------------------------
    async def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` or SQLite's list of problems."""
        rows = await self._read(
            "checking integrity", lambda c: c.execute("PRAGMA integrity_check").fetchall()
        )
        return "\n".join(str(r[0]) for r in rows)

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            release_database(db)
