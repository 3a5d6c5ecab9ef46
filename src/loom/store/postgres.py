"""``PostgresStore``: sessions in PostgreSQL, shared by many processes on many hosts.

```python
from loom import Runtime
from loom.store.postgres import PostgresStore

runtime = Runtime(PostgresStore("postgresql://loom@db.internal/loom"))
```

Needs the ``postgres`` extra (``pip install 'loom-agents[postgres]'``: psycopg 3 and
psycopg-pool). The schema is SQLite's (``loom.store.pg_sql``), created and upgraded by named
migrations on first use, under an advisory lock so that processes starting together do not
race. Give Loom its own database, or its own schema (``options=-csearch_path=loom`` in the
connection string): its tables have plain names (``sessions``, ``messages``, ...).

Durability: an ``append`` is one call of the server-side function ``loom_append``: one
statement, one transaction, one round trip; or, when other sessions' appends queued while a
commit was in flight, a member of a group commit (``loom_append_many``: one transaction and one
WAL flush for all of them, a subtransaction each, so a fenced member fails alone). Either way it
returns once its own commit is done: with PostgreSQL's default ``synchronous_commit=on`` a step
announced is on disk.

Leases are safe across hosts: ``acquire_lease`` is one atomic upsert on the session's ``locks``
row that hands out the next fencing token, and ``append(..., lease=)`` locks that row
(``SELECT ... FOR UPDATE`` inside ``loom_check_lease``) in the same transaction as the write,
so a holder that was taken over cannot commit anything. Expiry is judged by the database's
clock, the one clock every host shares. Unlike ``SQLiteStore`` there is no "dead process"
shortcut: a lease whose holder died is free when it expires.

Besides ``Store`` it implements ``ErrorStore``, ``ResultStore``, ``RunStore``, ``KVStore``,
``ScheduleTables`` (``postgres_schedules.py``), ``BlobStore`` (media bytes once per content
hash, ``postgres_media.py``) and ``BranchStore`` (rewinds, and forks that share their parent's
rows, ``postgres_branches.py``).
Every value goes through ``loom.store.codec`` exactly as on SQLite; every query is
parameterised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from loom.embedding.base import Embedder
from loom.errors import (
    ConfigurationError,
    InputError,
    LeaseLost,
    MissingDependencyError,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
)
from loom.events import AgentEvent, EventType
from loom.messages import Message, Usage
from loom.store import codec
from loom.store import pg_sql as q
from loom.store import pg_wire as w
from loom.store.base import (
    Lease,
    LedgerEntry,
    RunRecord,
    SessionInfo,
    StoredError,
    StoredResult,
    lease_lost,
    new_error_id,
)
from loom.store.erase import PostgresErase
from loom.store.postgres_branches import (
    PostgresBranches,
    forks_of,
    open_call_rows,
)
from loom.store.postgres_items import PostgresItems
from loom.store.postgres_media import PostgresBlobs, forget_session
from loom.store.postgres_schedules import PostgresScheduleTables

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError("psycopg", "postgres", "PostgresStore") from exc

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["EVENTS_CHANNEL", "PostgresStore"]

EVENTS_CHANNEL = "loom_events"
"""The LISTEN/NOTIFY channel an append with events notifies, payload = the session id (sent at
its commit, by PostgreSQL): servers tail runs other processes execute with it."""

T = TypeVar("T")
_RETRIES = 5  # transient conflicts (two lease-less writers numbering rows, serialisation)
# Pauses before each retry after a dropped connection: 3 retries, 1.3 s in all, then the
# caller gets a StoreError (a server that stays down also makes the pool wait ``timeout``).
_LOST_BACKOFF = (0.05, 0.25, 1.0)
# SQLSTATEs of a connection the server ended: admin / crash shutdown, cannot connect now.
_LOST_STATES = frozenset({"57P01", "57P02", "57P03"})


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def redact(conninfo: str) -> str:
    """``conninfo`` without its password, for error messages."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "<an unparsable connection string>"
    params.pop("password", None)
    shown = make_conninfo("", **{k: v for k, v in params.items() if v is not None})
    return shown or "<the libpq defaults: PGHOST, PGPORT, PGDATABASE, PGUSER>"


class PostgresStore(
    PostgresScheduleTables, PostgresBlobs, PostgresBranches, PostgresItems, PostgresErase
):
    """Sessions, transcripts, events, the tool-call ledger, errors, results and key-values in
    PostgreSQL, for many processes on many hosts.

    Args:
        conninfo: A libpq connection string or URL (``postgresql://user@host:5432/db``,
            ``"host=... dbname=..."``); unset parts come from ``PG*`` environment variables.
        min_size: Connections the pool keeps open.
        max_size: The most connections this store opens; a call waits up to ``timeout`` for
            a free one.
        timeout: Seconds to wait for a connection (to connect, or for a free one in the pool)
            before ``StoreError``.
        synchronous_commit: ``True`` (PostgreSQL's default): an append returns once its
            commit is flushed to disk, so an announced step survives a crash of the database
            server or its host. ``False`` sets ``synchronous_commit=off`` on this store's
            connections: an append returns before the flush (the WAL writer flushes within
            about 3 x ``wal_writer_delay``, 600 ms by default), so a step is no longer waiting
            for an fsync, but a server crash or power loss can lose the last steps that were
            already announced (the database stays consistent; a client process dying loses
            nothing). Opt in only where that trade is acceptable.
        embedder: Embeds items for semantic and hybrid search (``loom.store.items_vectors``);
            None: keyword search only (items are still marked for embedding later).

    The store connects on first use (or ``await store.open()``) and applies missing migrations
    then. Raises (on first use): ``StoreError`` when the server cannot be reached (the message
    names the DSN tried, without its password), ``SchemaTooNew`` when the database was migrated
    by a newer Loom, ``StoreCorrupt`` when it holds tables of the same names that Loom did not
    create.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
        synchronous_commit: bool = True,
        embedder: Embedder | None = None,
    ) -> None:
        if min_size < 0 or max_size < 1 or min_size > max_size:
            raise ConfigurationError(
                f"need 0 <= min_size <= max_size and max_size >= 1, got min_size={min_size}, "
                f"max_size={max_size}"
            )
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout}")
        self.conninfo = conninfo
        self.min_size = min_size
        self.max_size = max_size
        self.timeout = timeout
        self.synchronous_commit = synchronous_commit
        self._embedder = embedder
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._guard: asyncio.Task[None] | None = None
        self._host = socket.gethostname()
        self._pid = os.getpid()
        # Group commit (``_commit``): appends queued while every commit slot is in flight, the
        # group commits under way, and how many commits may be in flight at once: two (one
        # group runs on the server while the other waits for its WAL flush; more slots make
        # smaller groups and more flushes), a pooled connection each; one with a pool of two.
        self._slots = 2 if max_size > 2 else 1
        self._in_flight = 0
        self._queued: list[_Member] = []
        self._batches: set[asyncio.Task[None]] = set()
        self._commit_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.conninfo)!r})"

    # -- connecting -----------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect, check the schema and apply missing migrations (done on first use anyway).

        Raises ``StoreError`` when PostgreSQL cannot be reached, ``SchemaTooNew`` /
        ``StoreCorrupt`` when the database is not one this Loom can use.
        """
        await self._get_pool()

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if (
            self._pool is not None
            and self._loop is not asyncio.get_running_loop()
            and self._loop is not None
            and self._loop.is_closed()
        ):
            # The loop it was opened in has ended (one asyncio.run after another, as the
            # CLI does): its pool died with it. Start a new one in this loop.
            _abandon(self._pool)
            self._pool, self._loop = None, None
        if self._pool is not None:
            if self._loop is not asyncio.get_running_loop():
                raise StoreError(
                    f"{self!r} was opened in another event loop; its connections belong to that "
                    "loop. Create one PostgresStore per event loop (per asyncio.run)."
                )
            return self._pool
        if self._closed:
            raise StoreError(f"{self!r} is closed; create a new one")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                self._pool = await self._connect()
                self._loop = asyncio.get_running_loop()
                self._guard = asyncio.create_task(_close_at_loop_end(self._pool))
        return self._pool

    async def _connect(self) -> AsyncConnectionPool[Any]:
        synchronous_commit = self.synchronous_commit
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.timeout,
            kwargs={"autocommit": True},
            configure=None if synchronous_commit else _no_commit_wait,
            open=False,
            name="loom",
        )
        # The pool's connections are made in the background while the schema is checked (a new
        # process's first read then waits for one connection set-up, not two in a row); no
        # query uses the pool before this returns, so none runs on an unmigrated schema.
        await pool.open(wait=False)
        try:
            await self._check_schema()
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _direct_connection(self) -> AsyncConnection[Any]:
        """A connection of its own, outside the pool: a refused or failed connection raises at
        once with libpq's reason (a pool would retry in the background until its timeout)."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, connect_timeout=max(1, round(self.timeout))
            )
        except psycopg.Error as exc:
            raise self._translate(exc, "connecting") from exc

    async def _check_schema(self) -> None:
        conn = await self._direct_connection()
        try:
            await self._migrate(conn)
        except psycopg.Error as exc:
            raise self._translate(exc, "migrating the schema") from exc
        finally:
            await conn.close()

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        known = [(i + 1, name) for i, (name, _) in enumerate(q.MIGRATIONS)]
        has = await (await conn.execute(q.HAS_MIGRATIONS)).fetchone()
        if has is not None and has[0]:
            rows = await (await conn.execute(q.APPLIED)).fetchall()
            if [tuple(r) for r in rows] == known:
                return  # the common case: up to date, no lock, no write
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (q.MIGRATION_LOCK,))
            await conn.execute(q.CREATE_MIGRATIONS)
            rows = await (await conn.execute(q.APPLIED)).fetchall()
            names = dict(known)
            unknown = [name for version, name in rows if names.get(version) != name]
            if unknown:
                raise SchemaTooNew(
                    f"the database at {redact(self.conninfo)} was migrated by a newer Loom "
                    f"(schema migrations {unknown} are unknown to this version, which knows "
                    f"{q.SCHEMA_VERSION}); upgrade loom-agents to use it"
                )
            applied = {version for version, _ in rows}
            for version, (name, statements) in enumerate(q.MIGRATIONS, start=1):
                if version in applied:
                    continue
                for statement in statements:
                    try:
                        await conn.execute(statement)
                    except (
                        pg_errors.DuplicateTable,
                        pg_errors.DuplicateObject,
                        pg_errors.DuplicateFunction,
                    ) as exc:
                        raise StoreCorrupt(
                            f"the database at {redact(self.conninfo)} already holds objects that "
                            f"Loom did not create ({exc.diag.message_primary}; migration "
                            f"{name!r}); give Loom its own "
                            "database or schema (options=-csearch_path=loom)"
                        ) from exc
                await conn.execute(
                    "INSERT INTO loom_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                    (version, name, time.time()),
                )

    def _translate(self, exc: BaseException, doing: str) -> StoreError:
        """A typed Loom error for a psycopg failure, saying what to do about it."""
        where = redact(self.conninfo)
        text = str(exc).strip()
        if isinstance(exc, PoolTimeout):
            return StoreError(
                f"{doing} failed: no connection to PostgreSQL ({where}) became free within "
                f"{self.timeout} s. Every one of the pool's {self.max_size} connections is busy "
                "or the server stopped answering; raise PostgresStore(max_size=..., "
                "timeout=...) or check the server. Nothing from this step was saved."
            )
        # Failures to connect come as OperationalError with libpq's text, without SQLSTATE.
        if isinstance(exc, pg_errors.InvalidCatalogName) or (
            "database" in text and "does not exist" in text
        ):
            return StoreError(
                f"{doing} failed: the database named in {where} does not exist ({text}). "
                "Create it (createdb) or fix the DSN."
            )
        if isinstance(
            exc, pg_errors.InvalidPassword | pg_errors.InvalidAuthorizationSpecification
        ) or ("authentication failed" in text or "no pg_hba.conf entry" in text):
            return StoreError(
                f"{doing} failed: PostgreSQL refused the login for {where} ({text}). Check the "
                "user and password in the DSN (or PGUSER / PGPASSWORD / ~/.pgpass)."
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return StoreError(
                f"{doing} failed: the database user of {where} lacks a privilege ({text}). "
                "Grant it CREATE and USAGE on Loom's schema and access to Loom's tables."
            )
        if isinstance(exc, pg_errors.DiskFull | pg_errors.OutOfMemory):
            return StoreError(
                f"{doing} failed: the PostgreSQL server at {where} is out of disk or memory "
                f"({text}). Nothing from this step was saved; free space and retry."
            )
        if isinstance(exc, psycopg.OperationalError):
            if doing == "connecting":
                return StoreError(
                    f"cannot connect to PostgreSQL at {where}: {text}. Check that the server is "
                    "running and reachable and that the DSN (host, port, dbname, user) is right."
                )
            return StoreError(
                f"{doing} failed: the connection to PostgreSQL at {where} failed ({text}). "
                "Nothing from a step whose commit was not acknowledged counts as saved; the "
                "next call reconnects."
            )
        if isinstance(exc, psycopg.DataError) or "NUL" in text:
            return StoreError(
                f"{doing} failed: PostgreSQL refused a value ({text}). Text columns (ids, "
                "names) cannot hold NUL characters. Nothing from this step was saved."
            )
        return StoreError(f"{doing} failed on PostgreSQL at {where}: {type(exc).__name__}: {text}")

    # -- plumbing -------------------------------------------------------------------------------
    async def _run(
        self,
        doing: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        retry_lost: bool = True,
    ) -> T:
        """``fn`` with a pooled connection, retried a bounded number of times on transient
        failures: conflicts (serialisation failures, deadlocks, two lease-less writers
        numbering rows of one session) and, when ``retry_lost``, a dropped connection (a
        terminated backend, a server restart, a network cut). Only pass ``retry_lost`` for
        ``fn`` that are safe to run twice: reads, idempotent writes, and ``append``, whose
        transactions carry an id that makes a re-sent commit a no-op."""
        pool = await self._get_pool()
        conflicts = lost = 0
        while True:
            try:
                async with pool.connection() as conn:
                    return await fn(conn)
            except (
                pg_errors.UniqueViolation,
                pg_errors.SerializationFailure,
                pg_errors.DeadlockDetected,
            ) as exc:
                conflicts += 1
                if conflicts >= _RETRIES or not _transient(exc):
                    raise self._translate(exc, doing) from exc
            except psycopg.OperationalError as exc:
                if not (retry_lost and _connection_lost(exc)) or lost >= len(_LOST_BACKOFF):
                    raise self._translate(exc, doing) from exc
                await asyncio.sleep(_LOST_BACKOFF[lost])  # a restarting server needs a moment
                lost += 1
            except (psycopg.Error, PoolTimeout) as exc:
                raise self._translate(exc, doing) from exc

    async def _fetchall(
        self, doing: str, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[Any]:
        async def read(conn: AsyncConnection[Any]) -> list[Any]:
            return await (await conn.execute(sql, params)).fetchall()

        return await self._run(doing, read)

    async def _fetchone(
        self, doing: str, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> Any:
        async def read(conn: AsyncConnection[Any]) -> Any:
            return await (await conn.execute(sql, params)).fetchone()

        return await self._run(doing, read)

    async def _rowcount(
        self, doing: str, sql: str, params: Sequence[Any] = (), *, retry_lost: bool = True
    ) -> int:
        async def write(conn: AsyncConnection[Any]) -> int:
            return (await conn.execute(sql, params)).rowcount

        return await self._run(doing, write, retry_lost=retry_lost)

    # -- sessions -------------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionInfo | None:
        row = await self._fetchone(
            "reading a session", q.SESSION_SELECT + " WHERE s.id = %s", (session_id,)
        )
        return codec.decode_session(row) if row else None

    async def create_session(
        self, session_id: str, *, agent_name: str = "", metadata: dict[str, Any] | None = None
    ) -> SessionInfo:
        now = time.time()
        encoded = codec.encode_value(metadata or {}, "session metadata")

        async def create(conn: AsyncConnection[Any]) -> Any:
            await conn.execute(
                "INSERT INTO sessions (id, agent_name, created_at, updated_at, metadata) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "agent_name = EXCLUDED.agent_name "
                "WHERE sessions.agent_name = '' AND EXCLUDED.agent_name <> ''",
                (session_id, codec.scrub_text(agent_name), now, now, encoded),
            )
            cur = await conn.execute(q.SESSION_SELECT + " WHERE s.id = %s", (session_id,))
            return await cur.fetchone()

        return codec.decode_session(await self._run("creating a session", create))

    async def list_sessions(self, limit: int = 100) -> list[SessionInfo]:
        rows = await self._fetchall(
            "listing sessions",
            q.SESSION_SELECT + " ORDER BY changed DESC, s.id LIMIT %s",
            (limit if limit > 0 else None,),
        )
        return [codec.decode_session(r) for r in rows]

    async def load_messages(self, session_id: str, start: int = 0) -> list[Message]:
        if start < 0:
            raise InputError(f"load_messages: start must be >= 0, got {start}")
        rows = await self._fetchall(
            "loading messages",
            q.LOAD_MESSAGES,
            {"sid": session_id, "start": start, "stop": q.NO_STOP},
        )
        return codec.decode_messages([r[0] for r in rows])

    async def message_count(self, session_id: str) -> int:
        row = await self._fetchone("counting messages", q.MESSAGE_COUNT, {"sid": session_id})
        return int(row[0])

    async def load_message_range(self, session_id: str, start: int, stop: int) -> list[Message]:
        if start < 0:
            raise InputError(f"load_message_range: start must be >= 0, got {start}")
        rows = await self._fetchall(
            "loading messages",
            q.LOAD_MESSAGES,
            {"sid": session_id, "start": start, "stop": max(start, stop)},
        )
        return codec.decode_messages([r[0] for r in rows])

    async def load_system_messages(self, session_id: str) -> list[tuple[int, Message]]:
        """The transcript's system messages through the ``messages_system`` partial index."""
        rows = await self._fetchall(
            "loading system messages",
            q.LOAD_SYSTEM_MESSAGES,
            {"sid": session_id, "start": 0, "stop": q.NO_STOP},
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
        """Commit one step (see ``Store.append``), alone, or in a group commit with the steps
        of other sessions that queued while every commit slot was in flight: one transaction,
        one WAL flush for all of them, each member in a subtransaction of its own, so that a member
        whose lease is stale fails alone (``LeaseLost``) while the others commit. This call
        returns once its own rows are committed, or raises and has written nothing."""
        if lease is not None and lease.session_id != session_id:
            raise LeaseLost(
                f"the lease of session {lease.session_id!r} cannot write to session {session_id!r}"
            )
        # Serialise first: a value that cannot be stored raises SerializationError here,
        # before anything is queued; the arrays are encoded once, in the wire's format.
        now = time.time()
        ev_rows = [codec.encode_event(e) for e in events]
        led_rows = [codec.encode_ledger(e) for e in ledger]
        try:
            columns: tuple[w.Column, ...] = (
                (
                    w.text_column([m.role for m in messages]),
                    w.text_column([codec.encode_message(m) for m in messages]),
                )
                if messages
                else _NO_MESSAGES
            )
            columns += _columns(ev_rows, _EVENT_COLUMNS) if ev_rows else _NO_EVENTS
            columns += _columns(led_rows, _LEDGER_COLUMNS) if led_rows else _NO_LEDGER
        except UnicodeEncodeError as exc:
            raise StoreError(
                f"saving a step failed: a text of session {session_id!r} is not valid Unicode "
                f"({exc}). Nothing from this step was saved."
            ) from exc
        usage = None
        if run is not None:
            u = run.usage if run.status != "running" else Usage()
            usage = (u.input_tokens, u.output_tokens, u.requests)
        member = _Member(
            session_id,
            # The append's id, first in its transaction: if a dropped connection leaves us not
            # knowing whether the commit landed, the retry finds the id taken and stops there.
            secrets.token_hex(12),
            now,
            lease,
            usage,
            columns,
            codec.encode_run(run) if run is not None else None,
        )
        await self._commit(member)

    async def _commit(self, member: _Member) -> None:
        """Commit ``member`` at once while fewer than ``_slots`` commits are in flight (in the
        caller's task: no hop), else queue it: when a commit ends, everything queued
        meanwhile goes out together in the freed slot. Several slots: an append stuck behind a
        row lock (a takeover of its session in flight) holds up one slot, not every session."""
        await self._get_pool()
        loop = asyncio.get_running_loop()
        if self._commit_loop is not loop:  # an earlier loop ended: its queue ended with it
            self._commit_loop, self._in_flight, self._queued = loop, 0, []
            self._batches = set()
        if self._in_flight < self._slots and not self._queued:
            self._in_flight += 1
            try:
                await self._write_one(member)
            finally:
                self._in_flight -= 1
                self._send_queued()
            return
        member.done = loop.create_future()
        self._queued.append(member)
        self._send_queued()
        await member.done

    def _send_queued(self) -> None:
        """Start a group commit of everything queued, in each free slot."""
        while self._queued and self._in_flight < self._slots:
            batch, self._queued = self._queued, []
            self._in_flight += 1
            task = asyncio.create_task(self._write_queued(batch), name="loom-pg-group-commit")
            self._batches.add(task)  # a reference until it ends
            task.add_done_callback(self._batches.discard)

    async def _write_queued(self, batch: list[_Member]) -> None:
        """One group commit of ``batch`` (members whose callers were cancelled are dropped)."""
        try:
            batch = [m for m in batch if m.done is not None and not m.done.done()]
            if len(batch) == 1:
                await self._settle(batch[0], self._write_one(batch[0]))
            elif batch:
                await self._write_many(batch)
        except BaseException as exc:  # cancelled with its loop: answer whoever still waits
            for m in batch:
                if m.done is not None and not m.done.done():
                    m.done.set_exception(
                        exc
                        if isinstance(exc, Exception)
                        else StoreError(
                            "saving a step failed: the store's group commit was stopped (its "
                            "event loop is ending); whether this step was committed is unknown"
                        )
                    )
            raise
        finally:
            self._in_flight -= 1
            self._send_queued()

    async def _settle(self, member: _Member, commit: Awaitable[None]) -> None:
        """Run ``commit`` and hand its outcome to ``member``'s waiting caller."""
        try:
            await commit
        except Exception as exc:
            if member.done is not None and not member.done.done():
                member.done.set_exception(exc)
            return
        if member.done is not None and not member.done.done():
            member.done.set_result(None)

    async def _write_one(self, member: _Member) -> None:
        """``member`` in a transaction of its own (``loom_append`` in autocommit)."""
        params = member.params()
        lease = member.lease

        async def write(conn: AsyncConnection[Any]) -> None:
            try:
                await conn.execute(q.APPEND, params, prepare=True)
            except pg_errors.UniqueViolation as exc:
                if exc.diag.table_name == "appends":
                    return  # an earlier attempt of this very append committed
                raise
            except psycopg.Error as exc:
                if lease is not None and exc.sqlstate == q.LEASE_LOST_SQLSTATE:
                    cur = await conn.execute(q.LEASE_ROW, (member.session_id,))
                    raise lease_lost(lease, await cur.fetchone()) from None
                raise

        await self._run("saving a step", write)

    async def _write_many(self, batch: list[_Member]) -> None:
        """A group commit: every member of ``batch`` in one transaction (``loom_append_many``),
        each in a subtransaction; a fenced member fails alone. If the batch as a whole fails
        (a value the server refuses, say), each member is retried alone, so that only the
        member at fault fails."""
        # One lock order for every batch of every process (advisory locks and lock rows are
        # taken member by member): two batches do not wait on each other in a circle (but for
        # two sessions whose advisory lock hashes collide: PostgreSQL then breaks the deadlock
        # and ``_run`` retries). The sort is stable: two appends of one session keep their order.
        batch.sort(key=lambda m: m.session_id)
        params = _Member.batch_params(batch)

        async def write(conn: AsyncConnection[Any]) -> tuple[list[str], dict[str, Any]]:
            cur = await conn.execute(q.APPEND_MANY, params, prepare=True)
            row = await cur.fetchone()
            assert row is not None
            statuses: list[str] = list(row[0])
            fenced = [m.session_id for m, s in zip(batch, statuses, strict=True) if s == "lease"]
            rows: dict[str, Any] = {}
            if fenced:
                cur = await conn.execute(q.LEASE_ROWS, (fenced,))
                rows = {r[0]: r[1:] for r in await cur.fetchall()}
            return statuses, rows

        try:
            statuses, rows = await self._run("saving steps", write)
        except StoreError:
            for m in batch:
                await self._settle(m, self._write_one(m))
            return
        for m, status in zip(batch, statuses, strict=True):
            if m.done is None or m.done.done():
                continue
            if status == "lease" and m.lease is not None:
                m.done.set_exception(lease_lost(m.lease, rows.get(m.session_id)))
            else:  # "ok", or "dup": an earlier attempt of this batch committed
                m.done.set_result(None)

    # -- ledger, runs, events -------------------------------------------------------------------
    async def open_tool_calls(self, session_id: str) -> list[LedgerEntry]:
        rows = await self._run(
            "reading open tool calls", lambda conn: open_call_rows(conn, session_id)
        )
        return [codec.decode_ledger(session_id, r) for r in rows]

    async def open_runs(self, session_id: str) -> list[RunRecord]:
        cols = ", ".join(f"r.{c.strip()}" for c in q.RUN_COLS.split(","))
        rows = await self._fetchall(
            "reading open runs",
            f"SELECT {cols} FROM open_runs o JOIN runs r ON r.id = o.run_row "
            "WHERE o.session_id = %s ORDER BY r.id",
            (session_id,),
        )
        return [codec.decode_run(session_id, r) for r in rows]

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        """Every run record (starts and ends) of the session, oldest first."""
        rows = await self._fetchall(
            "listing runs",
            f"SELECT {q.RUN_COLS} FROM runs WHERE session_id = %s ORDER BY id",
            (session_id,),
        )
        return [codec.decode_run(session_id, r) for r in rows]

    async def load_events(self, session_id: str, run_id: str | None = None) -> list[AgentEvent]:
        params: dict[str, Any] = {"sid": session_id, "start": 0, "stop": q.NO_STOP}
        sql = q.load_events()
        if run_id is not None:
            sql, params = q.load_events("AND run_id = %(run)s"), {**params, "run": run_id}
        rows = await self._fetchall("loading events", sql, params)
        return [codec.decode_event(session_id, r) for r in rows]

    async def load_events_of_type(
        self, session_id: str, types: Sequence[EventType]
    ) -> list[AgentEvent]:
        """The session's events whose type is in ``types``, in journal order (approval events
        through the ``events_approvals`` partial index)."""
        rows = await self._fetchall(
            "loading events",
            q.load_events(f"AND {codec.event_types_clause(types)}"),
            {"sid": session_id, "start": 0, "stop": q.NO_STOP},
        )
        return [codec.decode_event(session_id, r) for r in rows]

    async def load_latest_events(
        self, session_id: str, types: Sequence[EventType], limit: int
    ) -> list[AgentEvent]:
        """The newest ``limit`` events of ``types``, looked for in a range of the journal's
        newest positions that widens until it holds them. A bare ``ORDER BY seq DESC LIMIT``
        left the planner free to bitmap-scan the session's whole journal and sort it (7 ms at
        1,000 turns without statistics); a range bound on the key cannot grow with the
        session."""
        if limit < 1:
            raise InputError(f"load_latest_events: limit must be >= 1, got {limit}")
        top = await self._fetchone(
            "reading the journal's end", q.EVENTS_END, (session_id, session_id)
        )
        if top is not None and top[1] is not None:  # a fork: its own rows, then its parent's
            rows = await self._fetchall(
                "loading events",
                q.load_events(
                    f"AND {codec.event_types_clause(types)}", "ORDER BY x.seq DESC LIMIT %(n)s"
                ),
                {"sid": session_id, "start": 0, "stop": q.NO_STOP, "n": limit},
            )
            return [codec.decode_event(session_id, r) for r in reversed(rows)]
        if top is None or top[0] is None:
            return []
        end, span = int(top[0]), max(256, limit * 32)
        sql = (
            f"SELECT {q.EVENT_COLS} FROM events WHERE session_id = %s AND seq > %s "
            f"AND {codec.event_types_clause(types)} ORDER BY seq DESC LIMIT %s"
        )
        while True:
            rows = await self._fetchall("loading events", sql, (session_id, end - span, limit))
            if len(rows) >= limit or end - span < 0:
                return [codec.decode_event(session_id, r) for r in reversed(rows)]
            span *= 8

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything kept for it in one transaction, with the media no
        other session names (its lock row is released, not deleted, so its fencing token keeps
        growing). False when there was no
        such session; ``InputError`` (nothing deleted) when other sessions were forked from it:
        they share its rows. The caller makes sure no run is using the session (take its lease)."""

        async def delete(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                forks = await forks_of(conn, session_id)
                if forks:
                    raise InputError(
                        f"session {session_id!r} has forks that share its history "
                        f"({', '.join(forks)}); delete them first"
                    )
                cur = await conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
                found = cur.rowcount > 0
                for table in q.SESSION_TABLES:
                    await conn.execute(f"DELETE FROM {table} WHERE session_id = %s", (session_id,))
                await forget_session(conn, session_id)
                await conn.execute(
                    "UPDATE locks SET released = true WHERE session_id = %s", (session_id,)
                )
            return found

        return await self._run("deleting a session", delete)

    # -- session leases (across hosts) ----------------------------------------------------------
    async def acquire_lease(self, session_id: str, run_id: str, ttl: float) -> Lease | None:
        row = await self._fetchone(
            "taking a session lease",
            q.ACQUIRE_LEASE,
            (session_id, run_id, self._host, self._pid, ttl),
        )
        if row is None:  # held, unexpired, by another run
            return None
        return Lease(session_id, run_id, int(row[0]), float(row[1]))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        async def renew(conn: AsyncConnection[Any]) -> Lease:
            cur = await conn.execute(q.RENEW_LEASE, (ttl, lease.session_id, lease.token))
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(q.LEASE_ROW, (lease.session_id,))
                raise lease_lost(lease, await cur.fetchone())
            return Lease(lease.session_id, lease.run_id, lease.token, float(row[0]))

        return await self._run("renewing a session lease", renew)

    async def release_lease(self, lease: Lease) -> None:
        await self._rowcount(
            "releasing a session lease", q.RELEASE_LEASE, (lease.session_id, lease.token)
        )

    # -- ErrorStore -----------------------------------------------------------------------------
    async def save_error(self, error: StoredError) -> str:
        error.id = error.id or new_error_id(error.timestamp)
        raw = codec.encode_value(error.raw_error, "raw_error of error {}", error.id)
        summary = codec.scrub_text(error.short_summary)
        for _ in range(5):
            try:
                await self._insert_error(error, raw, summary)
                return error.id
            except StoreError as exc:
                if not isinstance(exc.__cause__, pg_errors.UniqueViolation):
                    raise
                error.id = new_error_id(error.timestamp)  # same second, same 24 random bits
        raise StoreError("could not find a free error id after 5 draws")

    async def _insert_error(self, error: StoredError, raw: str, summary: str) -> None:
        pool = await self._get_pool()
        params = (
            error.id,
            error.timestamp.timestamp(),
            error.session_id,
            error.run_id,
            error.tool_call_id,
            codec.scrub_text(error.tool_name),
            raw,
            summary,
        )
        try:  # not through _run: a taken id must come back here, not be retried as it is
            async with pool.connection() as conn:
                await conn.execute(
                    f"INSERT INTO errors ({codec.ERROR_COLS}) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    params,
                )
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._translate(exc, "saving an error") from exc

    async def get_error(self, error_id: str) -> StoredError | None:
        row = await self._fetchone(
            "reading an error", f"SELECT {codec.ERROR_COLS} FROM errors WHERE id = %s", (error_id,)
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
        where: list[str] = ["true"]
        params: list[
            str | float | int | None
        ] = []  # only constant fragments are joined; values are bound
        for clause, value in (
            ("session_id = %s", session_id),
            ("tool_name = %s", tool_name),
            ("timestamp >= %s", since.timestamp() if since else None),
            ("timestamp <= %s", until.timestamp() if until else None),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        params.append(limit if limit > 0 else None)
        rows = await self._fetchall(
            "listing errors",
            f"SELECT {codec.ERROR_COLS} FROM errors WHERE {' AND '.join(where)} "
            "ORDER BY timestamp DESC, id DESC LIMIT %s",
            params,
        )
        return [codec.decode_error(r) for r in rows]

    async def delete_errors(self, older_than: datetime) -> int:
        return await self._rowcount(
            "deleting errors", "DELETE FROM errors WHERE timestamp < %s", (older_than.timestamp(),)
        )

    # -- ResultStore ----------------------------------------------------------------------------
    async def save_result(self, result: StoredResult) -> str:
        content = codec.scrub_text(result.content).encode("utf-8")
        await self._rowcount(
            "saving a large result",
            "INSERT INTO results (ref, session_id, run_id, tool_call_id, tool_name, created_at, "
            "content) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                result.ref,
                result.session_id,
                result.run_id,
                result.tool_call_id,
                codec.scrub_text(result.tool_name),
                result.created_at.timestamp(),
                content,
            ),
            retry_lost=False,  # not idempotent: a re-sent insert that had landed would fail
        )
        return result.ref

    async def get_result(self, ref: str) -> StoredResult | None:
        row = await self._fetchone(
            "reading a large result",
            "SELECT ref, session_id, tool_name, content, run_id, tool_call_id, created_at "
            "FROM results WHERE ref = %s",
            (ref,),
        )
        if row is None:
            return None
        content = bytes(row[3]).decode("utf-8")
        return StoredResult(row[0], row[1], row[2], content, row[4], row[5], _dt(row[6]))

    async def delete_results(self, older_than: datetime) -> int:
        """Delete large results stored before ``older_than``; return how many."""
        return await self._rowcount(
            "deleting results",
            "DELETE FROM results WHERE created_at < %s",
            (older_than.timestamp(),),
        )

    # -- KVStore --------------------------------------------------------------------------------
    async def put_value(self, namespace: str, key: str, value: Any) -> None:
        encoded = codec.encode_value(value, "value {}/{}", namespace, key)
        await self._rowcount(
            "saving a value",
            "INSERT INTO kv (namespace, key, value, updated_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
            "updated_at = excluded.updated_at",
            (namespace, key, encoded, time.time()),
        )

    async def get_value(self, namespace: str, key: str) -> Any | None:
        row = await self._fetchone(
            "reading a value",
            "SELECT value FROM kv WHERE namespace = %s AND key = %s",
            (namespace, key),
        )
        return codec.decode_value(row[0]) if row else None

    async def list_keys(self, namespace: str, prefix: str = "") -> list[str]:
        rows = await self._fetchall(
            "listing keys",
            "SELECT key FROM kv WHERE namespace = %s AND left(key, %s) = %s ORDER BY key",
            (namespace, len(prefix), prefix),
        )
        return [r[0] for r in rows]

    async def delete_value(self, namespace: str, key: str) -> bool:
        return (
            await self._rowcount(
                "deleting a value",
                "DELETE FROM kv WHERE namespace = %s AND key = %s",
                (namespace, key),
            )
            > 0
        )

    # -- operations -----------------------------------------------------------------------------
    async def inspect(self) -> dict[str, Any]:
        """``status`` without creating or migrating anything (what ``loom db status`` shows):
        one direct connection reads the migrations table; on a database Loom has not migrated
        (or not fully) ``schema_version`` is below ``known_version`` and the counts are None."""
        conn = await self._direct_connection()
        try:
            has = await (await conn.execute(q.HAS_MIGRATIONS)).fetchone()
            applied = (
                await (await conn.execute(q.MIGRATIONS_APPLIED)).fetchall()
                if has is not None and has[0]
                else []
            )
            version = max((int(v) for v, _, _ in applied), default=0)
            counts = None
            if version >= q.SCHEMA_VERSION:
                counts = await (await conn.execute(q.STATUS_COUNTS)).fetchone()
        except psycopg.Error as exc:
            raise self._translate(exc, "reading the database status") from exc
        finally:
            await conn.close()
        return {
            "backend": "postgresql",
            "database": redact(self.conninfo),
            "schema_version": version,
            "known_version": q.SCHEMA_VERSION,
            "migrations": [
                {"version": int(v), "name": n, "applied_at": _dt(t).isoformat()}
                for v, n, t in applied
            ],
            "sessions": None if counts is None else int(counts[0]),
            "open_runs": None if counts is None else int(counts[1]),
            "held_leases": None if counts is None else int(counts[2]),
        }

    async def status(self) -> dict[str, Any]:
        """The schema version, the migrations applied, and the counts of sessions, open runs
        and held (unexpired, unreleased) leases, after applying missing migrations (what
        ``loom db migrate`` shows; ``inspect`` only reads)."""

        async def read(conn: AsyncConnection[Any]) -> dict[str, Any]:
            applied = await (await conn.execute(q.MIGRATIONS_APPLIED)).fetchall()
            counts = await (await conn.execute(q.STATUS_COUNTS)).fetchone()
            assert counts is not None
            return {
                "backend": "postgresql",
                "database": redact(self.conninfo),
                "schema_version": max((int(v) for v, _, _ in applied), default=0),
                "known_version": q.SCHEMA_VERSION,
                "migrations": [
                    {"version": int(v), "name": n, "applied_at": _dt(t).isoformat()}
                    for v, n, t in applied
                ],
                "sessions": int(counts[0]),
                "open_runs": int(counts[1]),
                "held_leases": int(counts[2]),
            }

        return await self._run("reading the database status", read)

    # -- lifecycle ------------------------------------------------------------------------------
    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        guard, self._guard = self._guard, None
        if guard is not None and not guard.done():
            guard.cancel()  # it closes the pool; awaited below
            if self._loop is asyncio.get_running_loop():
                await asyncio.gather(guard, return_exceptions=True)
                return
        if pool is None:
            return
        if self._loop is not None and self._loop.is_closed():
            _abandon(pool)  # its loop has ended: nothing of it can be awaited any more
        else:
            await pool.close()


_ROW_TYPES = (w.TEXT,) * 3 + (w.INT8, w.TEXT, w.INT8, w.FLOAT8) + (w.TEXT,) * 8 + (w.FLOAT8,)
# The columns of an append without messages, events or ledger rows (most have one of them).
_NO_MESSAGES = (w.EMPTY_TEXT,) * 2
_NO_EVENTS = (w.EMPTY_TEXT, w.EMPTY_INT8, w.EMPTY_TEXT, w.EMPTY_INT8, w.EMPTY_FLOAT8, w.EMPTY_TEXT)
_NO_LEDGER = (w.EMPTY_TEXT,) * 7 + (w.EMPTY_FLOAT8,)

# The array columns of an append's event and ledger rows: the row field each holds, and how its
# elements are written (in ``loom_append``'s argument order).
_ColumnOf = Callable[[Sequence[Any]], w.Column]
_EVENT_COLUMNS: tuple[tuple[str, _ColumnOf], ...] = (
    ("run_id", w.text_column),
    ("sequence", w.int_column),
    ("type", w.text_column),
    ("iteration", w.int_column),
    ("timestamp", w.float_column),
    ("data", w.text_column),
)
_LEDGER_COLUMNS: tuple[tuple[str, _ColumnOf], ...] = (
    ("run_id", w.text_column),
    ("tool_call_id", w.text_column),
    ("name", w.text_column),
    ("status", w.text_column),
    ("effect", w.text_column),
    ("arguments", w.text_column),
    ("result", w.text_column),
    ("timestamp", w.float_column),
)


def _columns(
    rows: Sequence[codec.EventRow] | Sequence[codec.LedgerRow],
    layout: tuple[tuple[str, _ColumnOf], ...],
) -> tuple[w.Column, ...]:
    return tuple(column([getattr(row, name) for row in rows]) for name, column in layout)


class _Member:
    """One append, encoded and waiting for its commit (alone, or in a group commit)."""

    __slots__ = ("columns", "done", "id", "lease", "now", "run", "session_id", "usage")

    def __init__(
        self,
        session_id: str,
        append_id: str,
        now: float,
        lease: Lease | None,
        usage: tuple[int, int, int] | None,
        columns: tuple[w.Column, ...],
        run: codec.RunRow | None,
    ) -> None:
        self.session_id = session_id
        self.id = append_id
        self.now = now
        self.lease = lease
        self.usage = usage
        self.columns = columns
        self.run = run
        self.done: asyncio.Future[None] | None = None  # set when it waits in the queue

    def params(self) -> list[Any]:
        """The parameters of ``loom_append`` (``pg_sql.APPEND``) for this append alone."""
        return [
            self.session_id,
            self.id,
            self.now,
            self.lease.token if self.lease is not None else None,  # the fence (None: no lease)
            w.int_column(self.usage).array() if self.usage is not None else None,
            *(c.array() for c in self.columns),
            *(self.run if self.run is not None else (None,) * 7),
        ]

    @staticmethod
    def batch_params(batch: Sequence[_Member]) -> list[Any]:
        """The parameters of ``loom_append_many`` (``pg_sql.APPEND_MANY``) for ``batch``."""
        ends: list[list[int]] = [[], [], []]
        totals = [0, 0, 0]
        for m in batch:
            for k, col in enumerate((m.columns[0], m.columns[2], m.columns[8])):
                totals[k] += col.count
                ends[k].append(totals[k])
        runs = [m.run for m in batch]
        return [
            w.text_column([m.session_id for m in batch]).array(),
            w.text_column([m.id for m in batch]).array(),
            w.float_column([m.now for m in batch]).array(),
            w.int_column([m.lease.token if m.lease else None for m in batch]).array(),
            w.int_column([u for m in batch for u in (m.usage or (None, None, None))]).array(),
            *(w.int_column(e).array() for e in ends),
            *(w.Column.join([m.columns[k] for m in batch]).array() for k in range(len(_ROW_TYPES))),
            w.text_column([r.run_id if r else None for r in runs]).array(),
            w.text_column([r.status if r else None for r in runs]).array(),
            w.int_column([r.input_tokens if r else None for r in runs]).array(),
            w.int_column([r.output_tokens if r else None for r in runs]).array(),
            w.int_column([r.requests if r else None for r in runs]).array(),
            w.float_column([r.timestamp if r else None for r in runs]).array(),
            w.text_column([r.data if r else None for r in runs]).array(),
        ]


async def _no_commit_wait(conn: AsyncConnection[Any]) -> None:
    """A new pooled connection of a store made with ``synchronous_commit=False``."""
    await conn.execute("SET synchronous_commit = off")


async def _close_at_loop_end(pool: AsyncConnectionPool[Any]) -> None:
    """Sleep until cancelled, then close ``pool``.

    ``asyncio.run`` cancels every task when its coroutine returns; psycopg-pool's scheduler
    swallows that cancellation, so a pool left open would hang the end of ``asyncio.run``
    (the CLI calls ``asyncio.run`` several times with one store). This task is cancelled with
    the others and closes the pool properly while its loop still runs."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await pool.close()
        raise


def _abandon(pool: AsyncConnectionPool[Any]) -> None:
    """Close the sockets of a pool whose event loop has ended (its tasks died with the loop;
    awaiting ``pool.close()`` is no longer possible). Best effort: idle connections only."""
    for conn in list(getattr(pool, "_pool", ())):
        with contextlib.suppress(Exception):  # a socket already gone is what we want anyway
            conn.pgconn.finish()


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    """The connection broke (rather than the statement failing): retrying on a new one may work.

    libpq's own failures (server closed the connection, consuming input failed) carry no
    SQLSTATE; the server ending a backend sends 57P01-57P03; class 08 is connection errors."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _LOST_STATES


def _transient(exc: BaseException) -> bool:
    """A conflict that retrying the whole transaction resolves."""
    if isinstance(exc, pg_errors.UniqueViolation):
        # Two lease-less writers numbered rows of one session at once: renumber and retry.
        return exc.diag.table_name in ("messages", "events", "ledger")
    return True
