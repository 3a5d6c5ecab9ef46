"""The SQLite plumbing under ``SQLiteStore``: one shared connection per database file per process,
migrations, transactions, and turning ``sqlite3`` exceptions into Loom's typed errors.

Why one connection: the SQLite that ships with Python 3.11 (3.40) has a WAL-reset bug that can
corrupt a database when several connections write or checkpoint at once, so every
``SQLiteStore`` of a process that opens the same file shares one connection, serialised by a
lock. Why ``busy_timeout=0`` plus our own retry: a connection that waits inside SQLite for
another process's write lock would freeze the event loop; we wait with ``asyncio.sleep`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from loom.errors import SchemaTooNew, StoreCorrupt, StoreError
from loom.store import budget_sql, schedule_sql
from loom.store.owner import Owner
from loom.store.sqlite_items import ITEMS_MIGRATION, VECTORS_MIGRATION, load_vector_functions

T = TypeVar("T")
Durability = Literal["normal", "full"]

APPLICATION_ID = 0x4C4F4F4D  # "LOOM": marks a file as a Loom database (PRAGMA application_id)

# Named migrations, applied in order and recorded in ``loom_migrations``. Never edit one that
# has shipped: add a new one. History tables (messages, events, ledger, runs, errors, results)
# are append-only; ``open_calls`` / ``open_runs`` index what is still open so that recovery at
# every turn's INTAKE costs two primary-key lookups instead of a scan of the session's history.
# Why the layout: a commit costs about one 4 KB WAL frame per page it dirties, so the per-step
# tables are clustered by (session_id, seq) (WITHOUT ROWID, no secondary index: one page each);
# new rows are numbered by reading max(seq), and the session row is only rewritten by commits
# that add a run record (see 0002).
MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_initial",
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            agent_name TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            message_count INTEGER NOT NULL DEFAULT 0,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            requests INTEGER NOT NULL DEFAULT 0,
            metadata TEXT NOT NULL DEFAULT '{}'
        );
        CREATE TABLE messages (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE events (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            sequence INTEGER NOT NULL,
            type TEXT NOT NULL,
            iteration INTEGER NOT NULL,
            timestamp REAL NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE ledger (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            effect TEXT NOT NULL,
            arguments TEXT NOT NULL,
            result TEXT,
            timestamp REAL NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE open_calls (
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            ledger_seq INTEGER NOT NULL,
            PRIMARY KEY (session_id, run_id, tool_call_id)
        ) WITHOUT ROWID;
        CREATE TABLE open_runs (
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            run_row INTEGER NOT NULL,
            PRIMARY KEY (session_id, run_id)
        ) WITHOUT ROWID;
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            status TEXT NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            requests INTEGER NOT NULL,
            timestamp REAL NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX runs_session ON runs (session_id);
        CREATE TABLE errors (
            id TEXT PRIMARY KEY,
            timestamp REAL NOT NULL,
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            raw_error TEXT NOT NULL,
            short_summary TEXT NOT NULL
        );
        CREATE INDEX errors_session ON errors (session_id);
        CREATE INDEX errors_timestamp ON errors (timestamp);
        CREATE INDEX errors_tool ON errors (tool_name);
        CREATE TABLE results (
            ref TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            created_at REAL NOT NULL,
            content TEXT NOT NULL
        );
        CREATE INDEX results_created ON results (created_at);
        CREATE TABLE locks (
            session_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            start_ticks INTEGER NOT NULL,
            acquired_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE TABLE kv (
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (namespace, key)
        ) WITHOUT ROWID;
        """,
    ),
    # Why: the session row used to be rewritten by every commit that added messages (one more
    # WAL frame and statement per commit). A session's message count and last-change time are
    # now read from its last message row; sessions.message_count / updated_at keep the values
    # of older rows and updated_at still moves with run records.
    ("0002_messages_appended_at", "ALTER TABLE messages ADD COLUMN appended_at REAL"),
    # Why: leases with fencing (issue #11). Every acquire gives the session's lock row a new
    # token (the last + 1) that appends check in their transaction; a release marks the row
    # instead of deleting it, so the token never goes back and a stale holder stays fenced.
    (
        "0003_lease_tokens",
        "ALTER TABLE locks ADD COLUMN token INTEGER NOT NULL DEFAULT 0;"
        "ALTER TABLE locks ADD COLUMN released INTEGER NOT NULL DEFAULT 0",
    ),
    # Why: load_events(session, run_id) scanned the session's whole journal; the console reads
    # the runs it shows one by one (issue #17: a 1,000-turn session's page). PostgreSQL has had
    # the same index (events_run) from its first migration.
    ("0004_events_run_index", "CREATE INDEX events_run ON events (session_id, run_id, seq)"),
    # Why: schedules, their runs, cron monitors and check-ins (issue #18, loom.schedule).
    ("0005_schedules", schedule_sql.SQLITE),
    # Why: a turn's INTAKE used to read a session's whole journal to find its remembered
    # permission decisions; this partial index holds only the approval events, so that read
    # no longer grows with the session (and costs nothing on the other events' inserts).
    (
        "0006_approval_events_index",
        "CREATE INDEX events_approvals ON events (session_id, seq) "
        "WHERE type IN ('approval_required', 'approval_decision')",
    ),
    # Why: the API key that owns each schedule and monitor (issue #24; schedule_sql).
    ("0007_schedule_principals", ";".join(schedule_sql.PRINCIPALS)),
    # Why: resuming a long session read its whole transcript; the context needs only its
    # memory entries (system messages: summaries, Kernel keys, flush markers), found through
    # this partial index, and the recent tail (issue #26, loom.memory.window).
    (
        "0008_system_messages_index",
        "CREATE INDEX messages_system ON messages (session_id, seq) WHERE role = 'system'",
    ),
    # Why: media stored once (issue #27). A message names an image by its content hash; the
    # bytes are one ``blobs`` row however many messages and sessions name them (a 5 MB image
    # sent in turn 1 of 50 is 5 MB, not 250). ``session_blobs`` records which sessions name
    # which bytes (in the order they were stored): deleting a session deletes its links and
    # the bytes no other session names. ``data`` comes last: listing a session's media reads
    # no overflow page.
    (
        "0009_media",
        """
        CREATE TABLE blobs (
            ref TEXT PRIMARY KEY,
            media_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            created_at REAL NOT NULL,
            data BLOB NOT NULL
        );
        CREATE TABLE session_blobs (
            session_id TEXT NOT NULL,
            ref TEXT NOT NULL,
            UNIQUE (session_id, ref)
        );
        CREATE INDEX session_blobs_ref ON session_blobs (ref)
        """,
    ),
    # Why: forks share their history (issue #28). A fork's row names its parent and how many
    # transcript positions and journal events it shares; its own rows sit at their absolute
    # positions from there on, so reads take the parent's rows first and nothing is copied
    # (``sqlite_branches``). Numbered 0010 on PostgreSQL too. ``branches`` counts the
    # session's rewinds: a runtime that kept its transcript sees another process's branch.
    (
        "0010_session_forks",
        "ALTER TABLE sessions ADD COLUMN parent_id TEXT;"
        "ALTER TABLE sessions ADD COLUMN shared_messages INTEGER NOT NULL DEFAULT 0;"
        "ALTER TABLE sessions ADD COLUMN shared_events INTEGER NOT NULL DEFAULT 0;"
        "ALTER TABLE sessions ADD COLUMN branches INTEGER NOT NULL DEFAULT 0;"
        "CREATE INDEX sessions_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL",
    ),
    # Why: memory across sessions (issue #29): owned items in namespaces and an FTS5 index of
    # their words, kept in step by the writes (``sqlite_items``). Numbered 0011 on PostgreSQL.
    ("0011_items", ITEMS_MIGRATION),
    # Why: budgets across runs, sessions, owners and windows shared by every process on the
    # file (issue #31, ``loom.budgets``): spend and in-flight reservations per bucket.
    ("0012_budgets", budget_sql.SQLITE),
    # Why: semantic search of items (issue #29): each item's unit vector (float32) beside the
    # embedder that made it, or pending (``sqlite_items``). Numbered 0013 on PostgreSQL.
    ("0013_item_vectors", VECTORS_MIGRATION),
]
SCHEMA_VERSION = len(MIGRATIONS)


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


def translate(exc: sqlite3.Error, path: str, doing: str, waited: float = 0.0) -> StoreError:
    """A typed Loom error for a ``sqlite3`` failure, saying what to do about it."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return StoreError(
            f"{doing} failed: the disk holding {path} is full (or the database hit its size "
            "limit). Nothing from this step was saved; everything committed before is intact. "
            "Free disk space and retry."
        )
    if _is_busy(exc):
        return StoreError(
            f"{doing} failed: {path} stayed locked by another process for {waited:.1f} s. "
            "Another program holds a long write transaction on it; stop it or raise "
            "SQLiteStore(busy_timeout=...). Nothing from this step was saved."
        )
    if (
        name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
        or "malformed" in text
        or ("not a database" in text)
    ):
        return StoreCorrupt(
            f"{path} is damaged or is not a SQLite database ({text}). Restore it from a backup "
            "or point Loom at a new file (--store PATH / SQLiteStore(path))."
        )
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM")):
        return StoreError(
            f"{doing} failed: cannot write {path} ({text}). Check the file's and its "
            "directory's permissions."
        )
    return StoreError(f"{doing} failed on {path}: {type(exc).__name__}: {text}")


@dataclass(eq=False)
class Database:
    """One connection to one database file, shared by every ``SQLiteStore`` of the process."""

    path: str
    conn: sqlite3.Connection
    durability: Durability
    lock: threading.RLock = field(default_factory=threading.RLock)
    users: int = 0
    executor: ThreadPoolExecutor | None = None
    commits: int = 0  # transactions committed through this connection (benchmarks, tests)
    vec: bool = False  # sqlite-vec's functions are loaded (``sqlite_items``)
    # One group commit per event loop that writes through this connection (``commit_grouped``).
    groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def set_durability(self, durability: Durability) -> None:
        # Two stores asking for different durability share a connection: the stronger wins.
        if durability == "full" and self.durability != "full":
            with self.lock:
                self.conn.execute("PRAGMA synchronous=FULL")
            self.durability = "full"

    def thread(self) -> ThreadPoolExecutor:
        if self.executor is None:
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="loom-sqlite")
        return self.executor

    # -- running statements ----------------------------------------------------------------------
    @contextlib.contextmanager
    def immediate(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (under the lock); rolled back
        when the block raises."""
        with self.lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
                self.commits += 1
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` inside ``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on any failure."""
        with self.immediate() as conn:
            return fn(conn)

    def transaction_of_many(
        self, fns: Sequence[Callable[[sqlite3.Connection], Any]]
    ) -> list[Outcome]:
        """Every ``fn`` of ``fns`` in one ``BEGIN IMMEDIATE`` … ``COMMIT``, each inside a
        savepoint of its own: one that raises is rolled back alone (its outcome is the
        exception) and the others commit. A failure of the transaction itself (BEGIN or
        COMMIT) raises and commits none of them."""
        if len(fns) == 1:  # no savepoint needed
            try:
                return [(True, self.transaction(fns[0]))]
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise  # the whole batch waits and retries
                return [(False, exc)]
            except Exception as exc:
                return [(False, exc)]
        outcomes: list[Outcome] = []
        with self.immediate() as conn:
            for fn in fns:
                conn.execute("SAVEPOINT loom_member")
                try:
                    outcomes.append((True, fn(conn)))
                except Exception as exc:
                    conn.execute("ROLLBACK TO loom_member")
                    outcomes.append((False, exc))
                conn.execute("RELEASE loom_member")
        return outcomes

    async def commit_grouped(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        doing: str,
        busy_timeout: float,
        threaded: bool,
    ) -> T:
        """``fn`` in a transaction; returns once it has committed, or raises ``fn``'s own
        error (translated) with nothing of ``fn`` written.

        With the writer thread (``threaded``), a group commit: ``fn`` shares one transaction
        with every other write this event loop queued while the previous one was on the
        thread (see :class:`GroupCommit`). Inline, ``fn`` commits at once, alone, without
        leaving the event loop's current step: a caller that emits events before their
        commit (the journal's non-step events ride with the next step's commit) relies on no
        other task running before that commit, so inline writes are never deferred to group
        them.
        """
        if not threaded:
            return await run_call(
                self,
                lambda: self.transaction(fn),
                doing=doing,
                busy_timeout=busy_timeout,
                threaded=False,
            )
        loop = asyncio.get_running_loop()
        group = self.groups.get(loop)
        if group is None:
            group = self.groups[loop] = GroupCommit(self, loop)
        return await group.submit(fn, doing, busy_timeout)

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self.lock:
            return fn(self.conn)

    def migrate(self) -> None:
        """Check the file is a Loom database no newer than this code; apply missing migrations."""

        def check(conn: sqlite3.Connection) -> int:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            if app_id not in (0, APPLICATION_ID):
                raise StoreCorrupt(
                    f"{self.path} is a SQLite database of another application "
                    f"(application_id={app_id:#x}), not a Loom database; use another path"
                )
            has_table = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='loom_migrations'"
            ).fetchone()[0]
            if app_id == 0:
                others = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if others and not has_table:
                    raise StoreCorrupt(
                        f"{self.path} holds tables but is not a Loom database; use another path"
                    )
            if not has_table:
                conn.execute(
                    "CREATE TABLE loom_migrations (version INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL UNIQUE, applied_at REAL NOT NULL)"
                )
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            rows = conn.execute("SELECT version, name FROM loom_migrations").fetchall()
            known = {i + 1: name for i, (name, _) in enumerate(MIGRATIONS)}
            unknown = [name for version, name in rows if known.get(version) != name]
            if unknown:
                raise SchemaTooNew(
                    f"{self.path} was written by a newer Loom (schema migrations {unknown} are "
                    f"unknown to this version, which knows {SCHEMA_VERSION}); upgrade "
                    "loom-agents to open it"
                )
            applied = {version for version, _ in rows}
            for version, (name, sql) in enumerate(MIGRATIONS, start=1):
                if version in applied:
                    continue
                for statement in sql.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT INTO loom_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return len(MIGRATIONS) - len(applied)

        with self.lock:  # the common case, an up-to-date Loom database, needs no write
            conn = self.conn
            if conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
                rows = conn.execute("SELECT version, name FROM loom_migrations").fetchall()
                if sorted(rows) == [(i + 1, name) for i, (name, _) in enumerate(MIGRATIONS)]:
                    return
        self.transaction(check)


Outcome = tuple[bool, Any]
"""A member's outcome in a group commit: (True, what it returned) or (False, what it raised)."""


@dataclass(eq=False, slots=True)
class _Queued:
    fn: Callable[[sqlite3.Connection], Any]
    doing: str
    done: asyncio.Future[Any]


class GroupCommit:
    """Commits the writes one event loop queues on one database's writer thread together:
    every write queued while the previous group's transaction ran on the thread goes into the
    next transaction (one WAL append, and one fsync with ``durability="full"``, for all), each
    in a savepoint of its own, so that one that fails (a stale lease, a constraint) is rolled
    back alone while the others commit. A caller's ``await`` returns only after the COMMIT
    that holds its rows (or raises its own error, its rows not written).
    """

    def __init__(self, db: Database, loop: asyncio.AbstractEventLoop) -> None:
        self.db = db
        self.loop = loop
        self.queue: list[_Queued] = []
        self.running = False  # a group is on the writer thread
        self.busy_timeout = 0.0

    async def submit(
        self, fn: Callable[[sqlite3.Connection], T], doing: str, busy_timeout: float
    ) -> T:
        done: asyncio.Future[T] = self.loop.create_future()
        self.queue.append(_Queued(fn, doing, done))
        self.busy_timeout = max(self.busy_timeout, busy_timeout)
        if not self.running:
            self._start()
        return await done

    def _start(self) -> None:
        group = [q for q in self.queue if not q.done.done()]  # a cancelled caller's is dropped
        self.queue = []
        if not group:
            self.running = False
            return
        self.running = True
        fns = [q.fn for q in group]
        started = time.monotonic()
        task = self.loop.run_in_executor(
            self.db.thread(),
            _retry_sync,
            lambda: self.db.transaction_of_many(fns),
            self.busy_timeout,
        )
        task.add_done_callback(lambda t: self._settle(group, t, started))

    def _settle(
        self, group: list[_Queued], task: asyncio.Future[list[Outcome]], started: float
    ) -> None:
        if task.cancelled():
            stopped = StoreError(
                f"writing to {self.db.path} failed: the store's writer thread was stopped (the "
                "store or its event loop is closing); whether this write was committed is "
                "unknown: read it back before retrying"
            )
            self._fail(group, stopped, 0.0)
        elif (exc := task.exception()) is not None:
            self._fail(group, exc, time.monotonic() - started)
        else:
            for q, (ok, value) in zip(group, task.result(), strict=True):
                if q.done.done():
                    continue
                if ok:
                    q.done.set_result(value)
                else:
                    q.done.set_exception(self._typed(value, q.doing, 0.0))
        self._start()  # what queued meanwhile

    def _fail(self, group: list[_Queued], exc: BaseException, waited: float) -> None:
        for q in group:
            if not q.done.done():
                q.done.set_exception(self._typed(exc, q.doing, waited))

    def _typed(self, exc: BaseException, doing: str, waited: float) -> BaseException:
        if isinstance(exc, sqlite3.Error):
            typed = translate(exc, self.db.path, doing, waited)
            typed.__cause__ = exc
            return typed
        if not isinstance(exc, Exception):
            return StoreError(f"{doing} failed: {type(exc).__name__}; nothing was saved")
        return exc


_databases: dict[str, Database] = {}
_registry_lock = threading.Lock()


def open_database(path: str | Path, durability: Durability) -> Database:
    """The process's shared connection to ``path`` (":memory:" gets a private one)."""
    key = str(path) if str(path) == ":memory:" else os.path.realpath(path)
    with _registry_lock:
        db = _databases.get(key) if key != ":memory:" else None
        if db is None:
            db = _connect(key, durability)
            if key != ":memory:":
                _databases[key] = db
        else:
            db.set_durability(durability)
        db.users += 1
        return db


def release_database(db: Database) -> None:
    with _registry_lock:
        db.users -= 1
        if db.users > 0:
            return
        if _databases.get(db.path) is db:
            del _databases[db.path]
    with db.lock:
        try:
            db.conn.close()
        finally:
            if db.executor is not None:
                db.executor.shutdown(wait=True)


def _connect(path: str, durability: Durability) -> Database:
    if path != ":memory:" and not os.path.isdir(os.path.dirname(path) or "."):
        raise StoreError(f"cannot open {path}: its directory does not exist; create it first")
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    except sqlite3.Error as exc:
        raise translate(exc, path, "opening the database") from exc
    db = Database(path, conn, durability)
    try:
        conn.execute("PRAGMA busy_timeout=0")
        _retry_sync(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone(), 5.0)
        conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys=OFF")
        db.vec = load_vector_functions(conn)
        _retry_sync(db.migrate, 5.0)
    except sqlite3.Error as exc:
        conn.close()
        raise translate(exc, path, "opening the database") from exc
    except BaseException:
        conn.close()
        raise
    return db


def _retry_sync(fn: Callable[[], T], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


async def run_call(
    db: Database, fn: Callable[[], T], *, doing: str, busy_timeout: float, threaded: bool
) -> T:
    """Run one store operation: inline on the event loop (default) or on the writer thread.

    While another process holds the write lock we wait with ``asyncio.sleep`` (inline) or in
    the writer thread, up to ``busy_timeout`` seconds, then raise ``StoreError``.
    """
    started = time.monotonic()
    try:
        if threaded:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(db.thread(), _retry_sync, fn, busy_timeout)
        delay = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() - started + delay > busy_timeout:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
    except sqlite3.Error as exc:
        raise translate(exc, db.path, doing, time.monotonic() - started) from exc


__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Database",
    "Durability",
    "GroupCommit",
    "Outcome",
    "Owner",
    "open_database",
    "release_database",
    "run_call",
    "translate",
]
