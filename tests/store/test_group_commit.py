"""Group commit (issue #26): appends of many sessions that queue while a commit is in flight
share one transaction, and every promise of ``Store.append`` holds for each of them: it returns
only once its own rows are committed (read back here from a connection of another client), and
a member whose lease is stale fails alone with ``LeaseLost``, its rows not written, while the
others commit.

SQLite: ``SQLiteStore(threaded=True)`` (the writer thread groups; inline writes commit at once,
see ``sqlite_db.Database.commit_grouped``); transactions are counted from the COMMIT statements
the connection runs (``set_trace_callback``). PostgreSQL: the private cluster of
``tests/conftest.py``; transactions are counted as the statements the store sends while the
appends run (each is its own transaction: the store's connections are in autocommit).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from loom.errors import LeaseLost, StoreError
from loom.messages import Message
from loom.store import SQLiteStore
from loom.store.base import Lease, Store

pytestmark = pytest.mark.asyncio(loop_scope="session")

N = 16
STALE = 5  # the index of the session whose lease another run took over


async def _leases(store: Store, stale: int | None) -> list[Lease]:
    """One lease per session s0..s{N-1}; the ``stale`` one is then taken over by run "r2"."""
    leases = []
    for i in range(N):
        lease = await store.acquire_lease(f"s{i}", "r1", 60)
        assert lease is not None
        leases.append(lease)
    if stale is not None:
        old = leases[stale]
        await store.release_lease(old)
        assert await store.acquire_lease(old.session_id, "r2", 60) is not None
    return leases


async def _append_all(
    store: Store, leases: list[Lease], read_back: Callable[[str], Awaitable[list[str]]]
) -> dict[int, BaseException | list[str]]:
    """Every session appends one message at once; each caller reads its session back from
    another connection the moment its append returns."""
    outcome: dict[int, BaseException | list[str]] = {}

    async def one(i: int) -> None:
        try:
            await store.append(f"s{i}", messages=[Message.user(f"hello {i}")], lease=leases[i])
        except (LeaseLost, StoreError) as exc:
            outcome[i] = exc
            return
        outcome[i] = await read_back(f"s{i}")

    await asyncio.gather(*(one(i) for i in range(N)))
    return outcome


def _check(outcome: dict[int, BaseException | list[str]], stale: int | None) -> None:
    for i in range(N):
        if i == stale:
            assert isinstance(outcome[i], LeaseLost), outcome[i]
            assert "r2" in str(outcome[i])
        else:
            assert outcome[i] == [f'"hello {i}"'] or outcome[i] == [f"hello {i}"], outcome[i]


# -- SQLite ---------------------------------------------------------------------------------------
def _sqlite_reader(path: Path) -> Callable[[str], Awaitable[list[str]]]:
    async def read_back(session_id: str) -> list[str]:
        with sqlite3.connect(path) as other:  # another connection: sees committed rows only
            rows = other.execute(
                "SELECT json_extract(data, '$.content') FROM messages WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        return [r[0] for r in rows]

    return read_back


@pytest.mark.parametrize("stale", [None, STALE])
async def test_sqlite_concurrent_appends_share_commits(tmp_path: Path, stale: int | None) -> None:
    path = tmp_path / "g.db"
    store = SQLiteStore(path, threaded=True)
    leases = await _leases(store, stale)
    commits: list[str] = []
    store.db.conn.set_trace_callback(
        lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None
    )
    try:
        outcome = await _append_all(store, leases, _sqlite_reader(path))
    finally:
        store.db.conn.set_trace_callback(None)
    _check(outcome, stale)
    assert 1 <= len(commits) < N, f"{N} appends took {len(commits)} transactions"
    if stale is not None:  # the fenced member's row is not written, the others' are
        with sqlite3.connect(path) as other:
            counts = dict(
                other.execute("SELECT session_id, count(*) FROM messages GROUP BY session_id")
            )
        assert f"s{stale}" not in counts
        assert sum(counts.values()) == N - 1
    await store.close()


async def test_sqlite_group_member_that_raises_fails_alone(tmp_path: Path) -> None:
    """A member whose statements fail (a primary key taken under its feet) is rolled back to
    its savepoint; the members around it in the same transaction commit."""
    path = tmp_path / "g.db"
    store = SQLiteStore(path, threaded=True)
    db = store.db

    def insert(key: str) -> Callable[[sqlite3.Connection], None]:
        return lambda c: c.execute("INSERT INTO kv VALUES ('n', ?, '1', 0)", (key,)) and None

    def bad(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO kv VALUES ('n', 'bad', '1', 0)")
        c.execute("INSERT INTO kv VALUES ('n', 'a0', '1', 0)")  # taken by the first member

    before = db.commits
    calls = [insert("a0"), insert("a1"), bad, insert("a2")]
    results = await asyncio.gather(
        *(db.commit_grouped(fn, doing="test", busy_timeout=1, threaded=True) for fn in calls),
        return_exceptions=True,
    )
    assert [isinstance(r, StoreError) for r in results] == [False, False, True, False]
    assert isinstance(results[2], StoreError) and isinstance(
        results[2].__cause__, sqlite3.IntegrityError
    )
    assert db.commits - before < len(calls)
    with sqlite3.connect(path) as other:
        keys = [r[0] for r in other.execute("SELECT key FROM kv ORDER BY key")]
    assert keys == ["a0", "a1", "a2"]  # nothing of the bad member, not even its first row
    await store.close()


# -- PostgreSQL -----------------------------------------------------------------------------------
def _count_statements(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    psycopg = pytest.importorskip("psycopg")
    sent: list[Any] = []
    real = psycopg.AsyncConnection.execute

    async def counting(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(query)
        return await real(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
    return sent


@pytest.mark.parametrize("stale", [None, STALE])
async def test_postgres_concurrent_appends_share_commits(
    pg_schema_dsn: str, monkeypatch: pytest.MonkeyPatch, stale: int | None
) -> None:
    psycopg = pytest.importorskip("psycopg")
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
    leases = await _leases(store, stale)
    reader = await psycopg.AsyncConnection.connect(pg_schema_dsn, autocommit=True)

    async def read_back(session_id: str) -> list[str]:
        cur = await reader.execute(
            "SELECT data::json->>'content' FROM messages WHERE session_id = %s", (session_id,)
        )
        return [r[0] for r in await cur.fetchall()]

    sent = _count_statements(monkeypatch)
    outcome = await _append_all(store, leases, read_back)
    monkeypatch.undo()
    mine = [s for s in sent if "messages WHERE session_id" not in str(s)]  # not the reader's
    _check(outcome, stale)
    assert 1 <= len(mine) < N, f"{N} appends took {len(mine)} statements"
    if stale is not None:
        cur = await reader.execute("SELECT session_id, count(*) FROM messages GROUP BY 1")
        counts = dict(await cur.fetchall())
        assert f"s{stale}" not in counts
        assert sum(counts.values()) == N - 1
    await reader.close()
    await store.close()


async def test_postgres_batch_the_server_refuses_is_retried_member_by_member(
    pg_schema_dsn: str,
) -> None:
    """A member the server refuses (a session id with NUL, which text cannot hold) fails the
    group's transaction; each member is then committed alone, so only it fails."""
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
    ids = [f"s{i}" for i in range(N)]
    ids[STALE] = "bad\x00id"
    results = await asyncio.gather(
        *(store.append(i, messages=[Message.user(i.replace("\x00", ""))]) for i in ids),
        return_exceptions=True,
    )
    assert [isinstance(r, StoreError) for r in results] == [i == STALE for i in range(N)]
    for i in ids:
        if "\x00" not in i:
            assert [m.content for m in await store.load_messages(i)] == [i]
    await store.close()


async def test_postgres_group_resent_after_a_lost_answer_is_not_written_twice(
    pg_schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after a group's commit reached the server but before its answer:
    the store re-sends the same group (the same append ids), finds every member done, and
    nothing is doubled; every caller returns normally."""
    psycopg = pytest.importorskip("psycopg")
    import loom.store.postgres as pg
    from loom.store import pg_sql as q
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
    await store.append("warm", messages=[Message.user("warm")])
    real = psycopg.AsyncConnection.execute
    groups = {"n": 0}

    async def execute_then_drop(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        result = await real(self, query, *args, **kw)
        if query == q.APPEND_MANY:
            groups["n"] += 1
            if groups["n"] == 1:  # committed (autocommit): lose the answer
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute_then_drop)
    monkeypatch.setattr(pg, "_LOST_BACKOFF", (0.0, 0.0, 0.0))
    await asyncio.gather(
        *(store.append(f"s{i}", messages=[Message.user(f"m{i}")]) for i in range(N))
    )
    monkeypatch.undo()
    assert groups["n"] >= 2  # a group went out, and again after the drop
    for i in range(N):
        assert [m.content for m in await store.load_messages(f"s{i}")] == [f"m{i}"]
    await store.close()


async def test_postgres_an_append_stuck_on_a_row_lock_does_not_hold_up_other_sessions(
    pg_schema_dsn: str,
) -> None:
    """An append waiting for its session's lock row (a takeover's transaction is open) holds
    one commit slot; the other sessions' appends commit meanwhile, in another slot."""
    psycopg = pytest.importorskip("psycopg")
    from loom.store import pg_sql as q
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
    old = await store.acquire_lease("stuck", "r1", 0.05)
    assert old is not None
    await asyncio.sleep(0.1)  # expired: a takeover may take it
    async with await psycopg.AsyncConnection.connect(pg_schema_dsn) as conn:
        await conn.execute(q.ACQUIRE_LEASE, ("stuck", "r2", "h", 1, 60))  # open, holds the row
        stuck = asyncio.ensure_future(
            store.append("stuck", messages=[Message.user("stale")], lease=old)
        )
        others = [store.append(f"s{i}", messages=[Message.user(f"m{i}")]) for i in range(N)]
        await asyncio.wait_for(asyncio.gather(*others), 10)  # while "stuck" still waits
        assert not stuck.done()
        await conn.commit()
    with pytest.raises(LeaseLost, match="r2"):
        await stuck
    for i in range(N):
        assert [m.content for m in await store.load_messages(f"s{i}")] == [f"m{i}"]
    await store.close()
