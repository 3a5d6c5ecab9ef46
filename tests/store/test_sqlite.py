"""SQLiteStore beyond the conformance suite: files, bad input, failures, leases across processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loom import Agent
from loom.errors import ConfigurationError, LeaseLost, SchemaTooNew, StoreCorrupt, StoreError
from loom.events import EventType, make_event
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import SQLiteStore
from loom.store.base import LedgerEntry, RunRecord
from loom.store.sqlite_db import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from loom.testing import FunctionModel, ScriptedModel

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _turn(i: int) -> list[Message]:
    call = ToolCall(name="lookup", arguments={"q": f"question {i}"})
    return [
        Message.user(f"user message number {i} " * 3),
        Message.assistant("", [call]),
        Message(role="tool", content=f"result {i} " * 10, tool_call_id=call.id, name="lookup"),
        Message.assistant(f"the answer to {i} is {i * 7}"),
    ]


async def test_data_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    s = SQLiteStore(path)
    turn = _turn(1)
    await s.append(
        "s",
        messages=turn,
        events=[make_event(EventType.AGENT_START, "r", "s", 0, 0, {"message": "x"})],
        ledger=[LedgerEntry("r", "s", "c", "lookup", "started")],
        run=RunRecord("r", "s", "running"),
    )
    await s.close()
    s2 = SQLiteStore(path)
    assert await s2.load_messages("s") == turn
    assert [e.type for e in await s2.load_events("s")] == [EventType.AGENT_START]
    assert [e.tool_call_id for e in await s2.open_tool_calls("s")] == ["c"]
    assert [r.run_id for r in await s2.open_runs("s")] == ["r"]
    with sqlite3.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM loom_migrations")]
        assert names == [name for name, _ in MIGRATIONS]
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await s2.close()


async def test_stores_of_one_file_share_one_connection(tmp_path: Path) -> None:
    a, b = SQLiteStore(tmp_path / "x.db"), SQLiteStore(str(tmp_path / "." / "x.db"))
    assert a.db is b.db  # one writer connection per database per process
    await a.append("s", messages=[Message.user("from a")])
    await a.close()
    assert [m.content for m in await b.load_messages("s")] == ["from a"]
    await b.close()
    with pytest.raises(StoreError, match="closed"):
        await b.load_messages("s")


async def test_memory_database(tmp_path: Path) -> None:
    s = SQLiteStore(":memory:")
    await s.append("s", messages=[Message.user("hi")])
    assert len(await s.load_messages("s")) == 1
    assert await s.integrity_check() == "ok"
    await s.close()


def test_garbage_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    path.write_bytes(b"this is not a database at all " * 200)
    with pytest.raises(StoreCorrupt, match="damaged or is not a SQLite database"):
        SQLiteStore(path)


def test_other_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(StoreCorrupt, match="not a Loom database"):
        SQLiteStore(path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as raw:
        raw.execute("PRAGMA application_id=12345")
    with pytest.raises(StoreCorrupt, match="another application"):
        SQLiteStore(other)
    with sqlite3.connect(path) as raw:  # untouched
        assert raw.execute("SELECT name FROM sqlite_master").fetchall() == [("customers",)]


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    s = SQLiteStore(path)
    await s.append("s", messages=[Message.user("kept")])
    await s.close()
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO loom_migrations VALUES (99, '0099_from_the_future', 0)")
    with pytest.raises(SchemaTooNew, match=r"newer Loom.*0099_from_the_future"):
        SQLiteStore(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 1


async def test_database_of_schema_0001_is_migrated_with_its_data(tmp_path: Path) -> None:
    # A file as Loom wrote it before 0002: the session row held message_count and updated_at.
    path = tmp_path / "old.db"
    old = [Message.user("first"), Message.assistant("reply")]
    with sqlite3.connect(path) as raw:
        for statement in MIGRATIONS[0][1].split(";"):
            raw.execute(statement)
        raw.execute(
            "CREATE TABLE loom_migrations (version INTEGER PRIMARY KEY, "
            "name TEXT NOT NULL UNIQUE, applied_at REAL NOT NULL)"
        )
        raw.execute("INSERT INTO loom_migrations VALUES (1, '0001_initial', 0)")
        raw.execute(f"PRAGMA application_id={APPLICATION_ID}")
        raw.execute(
            "INSERT INTO sessions (id, created_at, updated_at, message_count, requests) "
            "VALUES ('old', 1000, 2000, 2, 1), ('older', 500, 1500, 0, 0)"
        )
        raw.executemany(
            "INSERT INTO messages VALUES ('old', ?, ?, ?)",
            [(i, m.role, m.model_dump_json()) for i, m in enumerate(old)],
        )
    s = SQLiteStore(path)
    info = await s.get_session("old")
    assert info is not None and info.message_count == 2 and info.usage.requests == 1
    assert info.updated_at.timestamp() == 2000
    assert [i.id for i in await s.list_sessions()] == ["old", "older"]
    await s.append("older", messages=[Message.user("new")])
    info = await s.get_session("older")
    assert info is not None and info.message_count == 1 and info.updated_at.timestamp() > 2000
    assert [i.id for i in await s.list_sessions()] == ["older", "old"]
    third = Message.user("third")
    await s.append("old", messages=[third])
    assert await s.load_messages("old") == [*old, third]
    info = await s.get_session("old")
    assert info is not None and info.message_count == 3
    await s.close()
    with sqlite3.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM loom_migrations ORDER BY version")]
        assert names == [name for name, _ in MIGRATIONS]


def test_bad_options_and_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="durability"):
        SQLiteStore(tmp_path / "a.db", durability="paranoid")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="directory does not exist"):
        SQLiteStore(tmp_path / "missing" / "a.db")


async def test_full_disk_loses_nothing_committed(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "loom.db")
    await s.append("s", messages=[Message.user("committed before")])
    # A real SQLITE_FULL: cap the file at its current size.
    pages = s.db.conn.execute("PRAGMA page_count").fetchone()[0]
    s.db.conn.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(StoreError, match=r"full.*Nothing from this step was saved"):
        await s.append(
            "s",
            messages=[Message.user("x" * 200_000)],
            events=[make_event(EventType.ERROR, "r", "s", 0, 0, {})],
        )
    assert [m.content for m in await s.load_messages("s")] == ["committed before"]
    info = await s.get_session("s")
    assert info is not None and info.message_count == 1
    assert await s.load_events("s") == []
    s.db.conn.execute("PRAGMA max_page_count=1073741823")
    await s.append("s", messages=[Message.user("after space was freed")])
    assert len(await s.load_messages("s")) == 2
    assert await s.integrity_check() == "ok"
    await s.close()


async def test_failed_statement_rolls_back_the_whole_step(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "loom.db")
    s.db.conn.execute(
        "CREATE TEMP TRIGGER boom BEFORE INSERT ON events WHEN NEW.type = 'error' "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    with pytest.raises(StoreError, match="injected failure"):
        await s.append(
            "s",
            messages=[Message.user("lost together")],
            ledger=[LedgerEntry("r", "s", "c", "t", "started")],
            events=[make_event(EventType.ERROR, "r", "s", 0, 0, {})],
        )
    assert await s.load_messages("s") == []
    assert await s.open_tool_calls("s") == []
    assert await s.get_session("s") is None
    await s.append("s", messages=[Message.user("next step works")])
    assert len(await s.load_messages("s")) == 1
    await s.close()


async def test_locked_database_waits_without_blocking_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    s = SQLiteStore(path, busy_timeout=0.3)
    await s.append("s", messages=[Message.user("before")])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process-like writer holds the write lock
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    started = time.monotonic()
    with pytest.raises(StoreError, match="locked by another process"):
        await s.append("s", messages=[Message.user("blocked")])
    waited = time.monotonic() - started
    t.cancel()
    assert 0.25 < waited < 2.0
    assert ticks >= 10, "the event loop was blocked while waiting for the lock"
    other.execute("ROLLBACK")
    # Reads never wait for writers in WAL mode; writes go through once the lock is gone.
    assert [m.content for m in await s.load_messages("s")] == ["before"]
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.1, other.execute, "COMMIT")
    await s.append("s", messages=[Message.user("after")])
    assert len(await s.load_messages("s")) == 2
    other.close()
    await s.close()


async def test_storage_grows_linearly(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "loom.db")

    def size() -> int:
        c = s.db.conn
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(c.execute("PRAGMA page_count").fetchone()[0]) * 4096

    base = size()
    for i in range(100):
        await s.append("s", messages=_turn(i))
    first = size() - base
    for i in range(100, 200):
        await s.append("s", messages=_turn(i))
    second = size() - base - first
    assert s.db.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 800
    assert 0.7 < second / first < 1.3, (first, second)
    await s.close()


async def test_agent_resumes_session_in_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    agent = Agent(model=ScriptedModel(["first answer"]), store=SQLiteStore(path))
    await agent.run("remember 42", session_id="s1")
    await agent.store.close()
    seen: list[list[str]] = []

    def model(messages: list[Message], tools: object) -> str:
        seen.append([m.content for m in messages])
        return "second answer"

    agent2 = Agent(model=FunctionModel(model), store=SQLiteStore(path))
    r = await agent2.run("what did I say?", session_id="s1")
    assert r.output == "second answer"
    assert seen[0] == ["remember 42", "first answer", "what did I say?"]
    info = await agent2.store.get_session("s1")
    assert info is not None and info.message_count == 4
    await agent2.store.close()


_HOLDER = """
import asyncio, sys, time
from loom.store import SQLiteStore
async def main():
    s = SQLiteStore(sys.argv[1])
    assert await s.acquire_lease("shared", "run_child", 900) is not None
    print("locked", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_session_lease_across_processes_and_dead_owner(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    SQLiteStore(path)  # create the schema first
    child = subprocess.Popen(  # noqa: ASYNC220 - a plain child process, waited for below
        [sys.executable, "-c", _HOLDER, str(path)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        s = SQLiteStore(path)
        # A live process holds it.
        assert await s.acquire_lease("shared", "run_parent", 900) is None
        assert await s.acquire_lease("other-session", "run_parent", 900) is not None
        child.send_signal(signal.SIGKILL)
        child.wait()
        # Its 15-minute lease has not expired, but its owner is dead: take over at once.
        lease = await s.acquire_lease("shared", "run_parent", 900)
        assert lease is not None and lease.token == 2
        await s.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# A lease holder in its own process, driven line by line over stdin/stdout, so that the test
# orders both processes with messages rather than sleeps.
_FENCED = """
import asyncio, json, sys
from loom.errors import LeaseLost
from loom.messages import Message
from loom.events import EventType, make_event
from loom.store import SQLiteStore
from loom.store.base import LedgerEntry, RunRecord

async def main():
    s = SQLiteStore(sys.argv[1])
    ttl = float(sys.argv[2])
    lease = await s.acquire_lease("shared", "run_a", ttl)
    print(json.dumps({"token": lease.token, "expires_at": lease.expires_at}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "renew":
            lease = await s.renew_lease(lease, ttl)
            print(json.dumps({"expires_at": lease.expires_at}), flush=True)
        elif command == "append":
            try:
                await s.append(
                    "shared",
                    messages=[Message.user("from A")],
                    events=[make_event(EventType.AGENT_START, "run_a", "shared", 0, 0, {})],
                    ledger=[LedgerEntry("run_a", "shared", "call_a", "t", "started")],
                    run=RunRecord("run_a", "shared", "running"),
                    lease=lease,
                )
            except LeaseLost as exc:
                print(json.dumps({"lost": str(exc)}), flush=True)
            else:
                print(json.dumps({"wrote": True}), flush=True)
        elif command == "exit":
            break
    await s.close()

asyncio.run(main())
"""


def _holder(path: Path, ttl: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _FENCED, str(path), str(ttl)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
        text=True,
    )


def _ask(child: subprocess.Popen[str], command: str | None = None) -> dict[str, object]:
    assert child.stdin is not None and child.stdout is not None
    if command is not None:
        child.stdin.write(command + "\n")
        child.stdin.flush()
    line = child.stdout.readline()
    assert line, f"the holder process died (exit code {child.poll()})"
    return dict(json.loads(line))


async def test_paused_holder_taken_over_cannot_write(tmp_path: Path) -> None:
    # Issue #11, "Tests that can fail": a process whose lease was taken over cannot append.
    path = tmp_path / "loom.db"
    SQLiteStore(path)
    a = _holder(path, ttl=1.0)
    b = SQLiteStore(path)
    try:
        first = _ask(a)
        expires = float(str(first["expires_at"]))
        a.send_signal(signal.SIGSTOP)  # A freezes (a GC pause, a stopped VM) holding the lease
        # A stopped process is alive: its lease holds until it expires.
        assert await b.acquire_lease("shared", "run_b", 60) is None
        await asyncio.sleep(max(expires - time.time(), 0) + 0.01)  # waiting out the ttl
        assert time.time() > expires
        lease_b = await b.acquire_lease("shared", "run_b", 60)
        assert lease_b is not None and lease_b.token == int(str(first["token"])) + 1
        await b.append("shared", messages=[Message.user("from B")], lease=lease_b)
        a.send_signal(signal.SIGCONT)  # A wakes up and carries on with its step
        answer = _ask(a, "append")
        assert "lost" in answer, answer
        assert "run_a" in str(answer["lost"]) and "run_b" in str(answer["lost"])
        _ask_exit(a)
        # Nothing of A's step is in the database.
        assert [m.content for m in await b.load_messages("shared")] == ["from B"]
        assert await b.load_events("shared") == []
        assert await b.open_tool_calls("shared") == []
        assert await b.open_runs("shared") == []
        with sqlite3.connect(path) as raw:
            assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
            assert raw.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0
            assert raw.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
            a.wait()
        await b.close()


def _ask_exit(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("exit\n")
    child.stdin.flush()
    assert child.wait(timeout=30) == 0


async def test_long_holder_that_renews_keeps_its_lease(tmp_path: Path) -> None:
    # Issue #11: a long turn keeps its lease (renewed while it runs) and still writes.
    path = tmp_path / "loom.db"
    SQLiteStore(path)
    a = _holder(path, ttl=0.3)
    b = SQLiteStore(path)
    try:
        first = _ask(a)
        original_expiry = float(str(first["expires_at"]))
        # A renews until well past its first expiry; B never gets the session meanwhile.
        renewals = 0
        while time.time() <= original_expiry + 0.3:
            renewed = _ask(a, "renew")
            assert float(str(renewed["expires_at"])) > time.time()
            assert await b.acquire_lease("shared", "run_b", 60) is None
            renewals += 1
        assert renewals >= 2
        assert _ask(a, "append") == {"wrote": True}
        _ask_exit(a)
        assert [m.content for m in await b.load_messages("shared")] == ["from A"]
        assert [e.tool_call_id for e in await b.open_tool_calls("shared")] == ["call_a"]
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        await b.close()


async def test_lease_tokens_survive_release_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    s = SQLiteStore(path)
    lease = await s.acquire_lease("s", "r1", 60)
    assert lease is not None and lease.token == 1
    await s.release_lease(lease)
    await s.close()
    s = SQLiteStore(path)
    again = await s.acquire_lease("s", "r2", 60)
    assert again is not None and again.token == 2
    with pytest.raises(LeaseLost):
        await s.append("s", messages=[Message.user("stale")], lease=lease)
    assert await s.load_messages("s") == []
    await s.close()


async def test_database_of_schema_0002_gets_lease_tokens(tmp_path: Path) -> None:
    # A file written before 0003, with a lock row of the old kind (no token): it is migrated,
    # the old row counts as token 0, and its holder's lock still excludes others until it ends.
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as raw:
        for statement in MIGRATIONS[0][1].split(";"):
            raw.execute(statement)
        raw.execute(MIGRATIONS[1][1])
        raw.execute(
            "CREATE TABLE loom_migrations (version INTEGER PRIMARY KEY, "
            "name TEXT NOT NULL UNIQUE, applied_at REAL NOT NULL)"
        )
        raw.executemany(
            "INSERT INTO loom_migrations VALUES (?, ?, 0)",
            [(1, MIGRATIONS[0][0]), (2, MIGRATIONS[1][0])],
        )
        raw.execute(f"PRAGMA application_id={APPLICATION_ID}")
        raw.execute(
            "INSERT INTO locks VALUES ('held', 'old_run', ?, ?, 0, ?, ?)",
            (socket.gethostname(), os.getpid(), time.time(), time.time() + 900),
        )
    s = SQLiteStore(path)
    assert await s.acquire_lease("held", "new_run", 60) is None
    with sqlite3.connect(path) as raw:
        names = [r[0] for r in raw.execute("SELECT name FROM loom_migrations ORDER BY version")]
        assert names == [name for name, _ in MIGRATIONS]
        raw.execute("UPDATE locks SET expires_at = 0")
    lease = await s.acquire_lease("held", "new_run", 60)
    assert lease is not None and lease.token == 1
    await s.close()


async def test_model_result_with_scripted_tool_roundtrip(tmp_path: Path) -> None:
    from loom import tool

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    store = SQLiteStore(tmp_path / "loom.db")
    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"q": "x"})]), "ok"]
    )
    agent = Agent(model=model, tools=[lookup], store=store)
    r = await agent.run("go", session_id="s")
    assert r.output == "ok"
    ledger = await store.ledger("s")
    assert [e.status for e in ledger] == ["started", "completed"]
    assert ledger[1].result is not None and ledger[1].result.data == "found x"
    runs = await store.list_runs("s")
    assert [x.status for x in runs] == ["running", "completed"]
    await store.close()


async def test_leased_commits_number_rows_right_after_a_lease_less_write(tmp_path: Path) -> None:
    # Under a lease the store numbers the next commit's rows from its own last write (no
    # max(seq) reads); a write without a lease in between (another store object, another
    # process) must not be overwritten or make the commit fail.
    path = tmp_path / "l.db"
    s, other = SQLiteStore(path), SQLiteStore(path)
    lease = await s.acquire_lease("s", "r", 60)
    assert lease is not None

    def step(i: int, run: str = "r") -> dict[str, Any]:
        return {
            "messages": [Message.user(f"m{i}")],
            "events": [make_event(EventType.ERROR, run, "s", 0, i, {"error": f"e{i}"})],
            "ledger": [LedgerEntry(run, "s", f"c{i}", "t", "started")],
        }

    await s.append("s", **step(0), lease=lease)
    await s.append("s", **step(1), lease=lease)
    await other.append("s", **step(2, "r2"))  # no lease: not fenced
    await s.append("s", **step(3), lease=lease)
    await s.append("s", **step(4), lease=lease)
    assert [m.content for m in await s.load_messages("s")] == ["m0", "m1", "m2", "m3", "m4"]
    assert [e.error for e in await s.load_events("s")] == ["e0", "e1", "e2", "e3", "e4"]  # type: ignore[attr-defined]
    assert [e.tool_call_id for e in await s.ledger("s")] == ["c0", "c1", "c2", "c3", "c4"]
    await s.close()
    await other.close()


async def test_approval_decisions_are_read_through_their_partial_index(tmp_path: Path) -> None:
    """INTAKE's read of remembered decisions walks the ``events_approvals`` index (only the
    approval events), not the session's journal."""
    from loom.store import codec

    s = SQLiteStore(tmp_path / "a.db")
    decided = EventType.APPROVAL_DECISION
    evs = [make_event(EventType.ITERATION_START, "r", "s", 1, j, {}) for j in range(500)]
    await s.append("s", events=[*evs, make_event(decided, "r", "s", 1, 500, {})])
    assert [e.sequence for e in await s.load_events_of_type("s", [decided])] == [500]
    seen: list[str] = []
    s.db.conn.set_trace_callback(seen.append)
    await s.load_events_of_type("s", [decided])
    s.db.conn.set_trace_callback(None)
    (sql,) = [q for q in seen if "FROM events" in q]
    plan = " ".join(r[3] for r in s.db.conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert "USING INDEX events_approvals" in plan, plan
    assert codec.INDEXED_CLAUSE in sql
    await s.close()


# -- media stored once (issue #27) --------------------------------------------------------------
async def test_an_image_seen_every_turn_in_two_sessions_is_one_row(tmp_path: Path) -> None:
    from loom.content import Image, media_ref

    png = b"\x89PNG\r\n\x1a\n" + os.urandom(300_000)
    seen: list[int] = []

    def model(messages: list[Message], tools: object) -> str:
        seen.append(sum(len(p.data or b"") for m in messages for p in m.parts))  # type: ignore[union-attr]
        return "ok"

    s = SQLiteStore(tmp_path / "loom.db")
    agent = Agent(model=FunctionModel(model), store=s)
    for sid in ("a", "b"):
        await agent.run(["what is this?", Image.from_bytes(png)], session_id=sid)
        for turn in range(4):
            await agent.run(f"and now {turn}?", session_id=sid)
    assert seen == [len(png)] * 10  # every call saw the image's bytes
    c = s.db.conn
    assert c.execute("SELECT count(*), sum(length(data)) FROM blobs").fetchone() == (1, len(png))
    assert c.execute("SELECT count(*) FROM session_blobs").fetchone()[0] == 2
    journal = c.execute(
        "SELECT (SELECT sum(length(data)) FROM messages) + (SELECT sum(length(data)) FROM events)"
    ).fetchone()[0]
    assert journal < 20_000  # 20 messages and their events: references, never the bytes
    texts = [r[0] for r in c.execute("SELECT data FROM messages UNION ALL SELECT data FROM events")]
    assert sum('"parts"' in t for t in texts) == 4  # two user messages and their events only
    assert await s.delete_session("a")
    assert await s.load_blobs([media_ref(png)]) == {media_ref(png): png}
    assert await s.delete_session("b")
    assert c.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
    assert c.execute("SELECT count(*) FROM session_blobs").fetchone()[0] == 0
    await s.close()


async def test_session_delete_with_media_is_one_transaction(tmp_path: Path) -> None:
    # A deletion that fails part-way (here: after the blob rows went) keeps everything.
    s = SQLiteStore(tmp_path / "loom.db")
    from loom.content import Blob, media_ref

    png = b"\x89PNG\r\n\x1a\n" + os.urandom(1000)
    await s.append("a", messages=[Message.user("x")])
    await s.put_blobs("a", [Blob(media_ref(png), "image/png", png)])
    s.db.conn.execute(
        "CREATE TRIGGER stop_it AFTER DELETE ON blobs BEGIN SELECT RAISE(ABORT, 'stop'); END"
    )
    with pytest.raises(StoreError, match="stop"):
        await s.delete_session("a")
    s.db.conn.execute("DROP TRIGGER stop_it")
    assert len(await s.load_messages("a")) == 1
    assert await s.session_blobs("a") == [(media_ref(png), "image/png", len(png))]
    await s.close()


async def test_bytes_already_held_are_not_written_again(tmp_path: Path) -> None:
    from loom.content import Blob, media_ref

    png = b"\x89PNG\r\n\x1a\n" + os.urandom(50_000)
    s = SQLiteStore(tmp_path / "loom.db")
    await s.put_blobs("a", [Blob(media_ref(png), "image/png", png)])
    first = s.db.conn.execute("SELECT rowid, created_at FROM blobs").fetchall()
    changes = s.db.conn.total_changes
    await s.put_blobs("a", [Blob(media_ref(png), "image/png", png)])  # the same session again
    assert s.db.conn.total_changes == changes  # no row written, not even the link
    await s.put_blobs("b", [Blob(media_ref(png), "image/png", png)])
    assert s.db.conn.total_changes == changes + 1  # b's link only
    assert s.db.conn.execute("SELECT rowid, created_at FROM blobs").fetchall() == first
    await s.close()


# -- items: forgetting a user leaves none of their bytes (issue #29) ---------------------------
def _file_bytes(path: Path) -> bytes:
    """The database file after a VACUUM (and nothing left in a WAL: every connection closed)."""
    conn = sqlite3.connect(path)
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.read_bytes()


async def test_forgotten_items_leave_no_bytes_after_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    marker = "zqxjvwkorbital"  # a word no other row, table or index name holds
    store = SQLiteStore(path)
    for i in range(200):
        await store.put_item(("mem", "bob"), f"k{i}", {"text": f"bob note {i}"}, owner="bob")
    await store.put_item(("mem", "al"), "a", {"text": f"alice said {marker}"}, owner="alice")
    await store.put_item(("mem", "al"), "b", {"text": f"{marker} again"}, owner="alice")
    await store.close()
    assert marker.encode() in _file_bytes(path)  # the proof below can see the bytes

    store = SQLiteStore(path)
    assert len(await store.search_items((), query=marker)) == 2
    assert await store.delete_owner_items("alice") == 2
    assert await store.search_items((), query=marker) == []
    assert len(await store.search_items((), query="bob", limit=1000)) == 200
    await store.close()
    assert marker.encode() not in _file_bytes(path)
