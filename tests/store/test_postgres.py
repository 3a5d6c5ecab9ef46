"""PostgresStore: the conformance suite on a private PostgreSQL 15 cluster, plus leases across
processes, a full agent run, crash recovery, bounded reads and bad input.

The cluster is the session-scoped ``postgres_dsn`` fixture (tests/conftest.py); every test gets
a schema of its own (``pg_schema_dsn``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="the postgres extra is not installed")

import psycopg

from loom import Agent, RunContext, tool
from loom.embedding import Embedder
from loom.engine.runtime import Runtime
from loom.errors import (
    ConfigurationError,
    LeaseLost,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
)
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import codec
from loom.store import pg_sql as q
from loom.store.base import LedgerEntry, RunRecord
from loom.store.conformance import StoreContract
from loom.store.postgres import PostgresStore
from loom.testing import ScriptedModel

pytestmark = pytest.mark.asyncio(loop_scope="session")
SRC = str(Path(__file__).resolve().parents[2] / "src")


async def _sql(dsn: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Run one statement on a connection of its own (autocommit); its rows, if any."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


@pytest.fixture
async def store(pg_schema_dsn: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
    yield s
    await s.close()


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, pg_schema_dsn: str) -> AsyncIterator[PostgresStore]:
        s = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
        yield s
        await s.close()

    @pytest.fixture
    async def open_vector_store(
        self, pg_schema_dsn: str
    ) -> AsyncIterator[Callable[[Embedder], Awaitable[PostgresStore]]]:
        opened: list[PostgresStore] = []

        async def open_one(embedder: Embedder) -> PostgresStore:
            opened.append(PostgresStore(pg_schema_dsn, min_size=1, max_size=2, embedder=embedder))
            return opened[-1]

        yield open_one
        for s in opened:
            await s.close()


# -- connecting, migrations, bad input ----------------------------------------------------------
async def test_unreachable_server_names_the_dsn_without_its_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    store = PostgresStore(f"postgresql://loom:s3cret@127.0.0.1:{port}/loom", timeout=2, min_size=0)
    assert "s3cret" not in repr(store)
    with pytest.raises(StoreError, match="cannot connect to PostgreSQL") as info:
        await store.get_session("s")
    assert f"port={port}" in str(info.value) and "s3cret" not in str(info.value)
    assert "refused" in str(info.value).lower()
    await store.close()


async def test_missing_database_says_to_create_it(postgres_dsn: str) -> None:
    store = PostgresStore(postgres_dsn.replace("dbname=loom_test", "dbname=nope"))
    with pytest.raises(StoreError, match=r"does not exist.*createdb"):
        await store.open()
    await store.close()


async def test_bad_options() -> None:
    with pytest.raises(ConfigurationError):
        PostgresStore("dbname=x", min_size=5, max_size=2)
    with pytest.raises(ConfigurationError):
        PostgresStore("dbname=x", timeout=0)


@pytest.mark.parametrize("wait", [True, False])
async def test_synchronous_commit_is_the_servers_unless_opted_out(
    pg_schema_dsn: str, wait: bool
) -> None:
    """Default: every append waits for its flush (``on``); ``synchronous_commit=False`` sets
    ``off`` on every pooled connection, the appends included, and they still commit."""
    store = PostgresStore(pg_schema_dsn, min_size=2, max_size=2, synchronous_commit=wait)

    async def show(conn: Any) -> str:
        return str((await (await conn.execute("SHOW synchronous_commit")).fetchone())[0])

    async def both(conn: Any) -> tuple[str, str]:
        async with store._pool.connection() as other:  # type: ignore[union-attr]
            return await show(conn), await show(other)

    await store.append("s", messages=[Message.user("hi")])
    assert await store._run("showing", both) == (("on", "on") if wait else ("off", "off"))
    assert [m.content for m in await store.load_messages("s")] == ["hi"]
    await store.close()


async def test_closed_store_refuses(pg_schema_dsn: str) -> None:
    store = PostgresStore(pg_schema_dsn)
    await store.open()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get_session("s")


async def test_concurrent_starters_migrate_once(pg_schema_dsn: str) -> None:
    stores = [PostgresStore(pg_schema_dsn, min_size=0, max_size=2) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))  # six processes starting at once
    rows = await _sql(pg_schema_dsn, "SELECT version, name FROM loom_migrations")
    assert [tuple(r) for r in rows] == [(i + 1, n) for i, (n, _) in enumerate(q.MIGRATIONS)]
    await asyncio.gather(*(s.close() for s in stores))


async def test_newer_schema_is_refused(pg_schema_dsn: str) -> None:
    store = PostgresStore(pg_schema_dsn)
    await store.open()
    await store.close()
    await _sql(pg_schema_dsn, "INSERT INTO loom_migrations VALUES (99, '0099_future', 0)")
    with pytest.raises(SchemaTooNew, match="0099_future"):
        await PostgresStore(pg_schema_dsn).open()


async def test_foreign_tables_of_the_same_name_are_not_taken(pg_schema_dsn: str) -> None:
    await _sql(pg_schema_dsn, "CREATE TABLE messages (id int)")
    with pytest.raises(StoreCorrupt, match="own database or schema"):
        await PostgresStore(pg_schema_dsn).open()
    # Nothing of the failed migration stayed behind (DDL is transactional).
    assert await _sql(pg_schema_dsn, "SELECT to_regclass('sessions')") == [(None,)]


async def test_nul_in_large_results_is_kept(store: PostgresStore) -> None:
    from loom.store.base import StoredResult

    await store.save_result(StoredResult("r1", "s", "cat", "a\x00b"))
    got = await store.get_result("r1")
    assert got is not None and got.content == "a\x00b"


async def test_lease_less_writers_racing_on_one_session_lose_nothing(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    other = PostgresStore(pg_schema_dsn, max_size=4)
    await asyncio.gather(
        *(
            s.append("s", messages=[Message.user(f"{s is store}-{i}")])
            for i in range(20)
            for s in (store, other)
        )
    )
    assert await store.message_count("s") == 40
    assert len({m.content for m in await store.load_messages("s")}) == 40
    await other.close()


async def test_racing_acquirers_get_one_lease(store: PostgresStore, pg_schema_dsn: str) -> None:
    others = [PostgresStore(pg_schema_dsn, max_size=2) for _ in range(4)]
    got = await asyncio.gather(
        *(s.acquire_lease("s", f"run{i}", 60) for i, s in enumerate([store, *others] * 3))
    )
    held = [lease for lease in got if lease is not None]
    assert len({lease.run_id for lease in held}) == 1  # only one run (perhaps re-acquiring)
    await asyncio.gather(*(s.close() for s in others))


# -- bounded INTAKE reads -----------------------------------------------------------------------
def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _plan_nodes(child)
    return out


async def test_tail_of_a_10000_message_session_is_an_index_range_read(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    for i in range(0, 10_000, 1000):  # 10 commits of 1,000 messages each
        await store.append("long", messages=[Message.user(f"m{j}") for j in range(i, i + 1000)])
    await store.append("short", messages=[Message.user(f"m{j}") for j in range(10)])
    assert await store.message_count("long") == 10_000
    tail = await store.load_messages("long", start=9990)
    assert [m.content for m in tail] == [f"m{j}" for j in range(9990, 10_000)]
    await _sql(pg_schema_dsn, "ANALYZE messages")
    await _sql(pg_schema_dsn, "ANALYZE sessions")
    for sql, params, rows in (
        (q.LOAD_MESSAGES, {"sid": "long", "start": 9990, "stop": q.NO_STOP}, 10),
        (q.MESSAGE_COUNT, {"sid": "long"}, 1),
    ):
        explained = await _sql(
            pg_schema_dsn, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
        )
        top = explained[0][0][0]
        nodes = _plan_nodes(top["Plan"])
        # the session's row (``sessions``, a handful of rows here) says whether it is a fork
        on_messages = [n for n in nodes if n.get("Relation Name") == "messages"]
        kinds = {n["Node Type"] for n in on_messages}
        assert "Seq Scan" not in kinds and kinds & {"Index Scan", "Index Only Scan"}, json.dumps(
            top["Plan"]
        )[:3000]
        scans = [n for n in on_messages if n["Node Type"] in ("Index Scan", "Index Only Scan")]
        assert all(n["Index Name"] == "messages_pkey" for n in scans)
        # Only the rows asked for are read, not the session's 10,000: a handful of pages.
        assert sum(n["Actual Rows"] for n in scans) <= rows, scans
        assert top["Plan"]["Shared Hit Blocks"] + top["Plan"].get("Shared Read Blocks", 0) < 20


async def test_approval_decisions_of_a_long_session_come_from_their_index(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    """INTAKE's read of remembered decisions: the partial index, not the 10,000 events."""
    from loom.events import EventType, make_event

    decided = EventType.APPROVAL_DECISION
    for i in range(10):  # 10 commits of 1,000 events, one decision among them each time
        evs = [make_event(EventType.ITERATION_START, f"r{i}", "long", 1, j, {}) for j in range(999)]
        await store.append("long", events=[*evs, make_event(decided, f"r{i}", "long", 1, 999, {})])
    found = await store.load_events_of_type("long", [decided])
    assert [(e.run_id, e.sequence) for e in found] == [(f"r{i}", 999) for i in range(10)]
    await _sql(pg_schema_dsn, "ANALYZE events")
    sql = (
        f"SELECT {q.EVENT_COLS} FROM events WHERE session_id = %s AND "
        f"{codec.event_types_clause([decided])} ORDER BY seq"
    )
    explained = await _sql(
        pg_schema_dsn, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, ("long",)
    )
    top = explained[0][0][0]
    nodes = _plan_nodes(top["Plan"])
    scans = [n for n in nodes if "Scan" in n["Node Type"]]
    assert [n.get("Index Name") for n in scans] == ["events_approvals"], scans
    assert sum(n["Actual Rows"] for n in scans) == 10
    assert top["Plan"]["Shared Hit Blocks"] + top["Plan"].get("Shared Read Blocks", 0) < 30
    # the store's own query (across a fork's chain) reads the same index for the journal
    mine = q.load_events(f"AND {codec.event_types_clause([decided])}")
    explained = await _sql(
        pg_schema_dsn,
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + mine,
        {"sid": "long", "start": 0, "stop": q.NO_STOP},
    )
    nodes = _plan_nodes(explained[0][0][0]["Plan"])
    on_events = [n for n in nodes if n.get("Relation Name") == "events"]
    assert [n.get("Index Name") for n in on_events] == ["events_approvals"], on_events
    assert sum(n["Actual Rows"] for n in on_events) == 10


# -- leases across processes --------------------------------------------------------------------
_FENCED = """
import asyncio, json, sys
from loom.errors import LeaseLost
from loom.messages import Message
from loom.events import EventType, make_event
from loom.store.postgres import PostgresStore
from loom.store.base import LedgerEntry, RunRecord

async def main():
    s = PostgresStore(sys.argv[1])
    ttl = float(sys.argv[2])
    lease = await s.acquire_lease("shared", "run_a", ttl)
    print(json.dumps({"token": lease.token, "expires_at": lease.expires_at}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "append":
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


def _ask(child: subprocess.Popen[str], command: str | None = None) -> dict[str, object]:
    assert child.stdin is not None and child.stdout is not None
    if command is not None:
        child.stdin.write(command + "\n")
        child.stdin.flush()
    line = child.stdout.readline()
    assert line, f"the holder process died (exit code {child.poll()})"
    return dict(json.loads(line))


async def test_paused_holder_taken_over_cannot_write(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    # A process holds the lease, freezes past its ttl, another takes over; the first wakes up
    # and its append is refused by the fence, with nothing of it committed.
    await store.open()
    a = subprocess.Popen(  # noqa: ASYNC220 - a plain child process, driven line by line
        [sys.executable, "-c", _FENCED, pg_schema_dsn, "1.0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
        text=True,
    )
    try:
        first = _ask(a)
        expires = float(str(first["expires_at"]))
        a.send_signal(signal.SIGSTOP)
        assert await store.acquire_lease("shared", "run_b", 60) is None  # still held
        await asyncio.sleep(max(expires - time.time(), 0) + 0.05)  # waiting out the ttl
        lease_b = await store.acquire_lease("shared", "run_b", 60)
        assert lease_b is not None and lease_b.token == int(str(first["token"])) + 1
        await store.append("shared", messages=[Message.user("from B")], lease=lease_b)
        a.send_signal(signal.SIGCONT)
        answer = _ask(a, "append")
        assert "lost" in answer, answer
        assert "run_a" in str(answer["lost"]) and "run_b" in str(answer["lost"])
        assert a.stdin is not None
        a.stdin.write("exit\n")
        a.stdin.flush()
        assert a.wait(timeout=30) == 0
        assert [m.content for m in await store.load_messages("shared")] == ["from B"]
        assert await store.load_events("shared") == []
        assert await store.open_tool_calls("shared") == []
        assert await store.open_runs("shared") == []
        counts = await _sql(
            pg_schema_dsn,
            "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM ledger), "
            "(SELECT count(*) FROM runs)",
        )
        assert tuple(counts[0]) == (1, 0, 0)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
            a.wait()


async def test_append_waits_for_a_takeover_in_flight_then_is_fenced(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    # The fence is a row lock: an append racing a takeover either commits before it or fails.
    old = await store.acquire_lease("s", "r1", 0.05)
    assert old is not None
    await asyncio.sleep(0.1)
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_schema_dsn) as conn:
        # A takeover whose transaction is open (not yet committed) holds the lock row.
        await conn.execute(q.ACQUIRE_LEASE, ("s", "r2", "h", 1, 60))
        pending = asyncio.ensure_future(
            store.append("s", messages=[Message.user("stale")], lease=old)
        )
        await asyncio.sleep(0.2)
        assert not pending.done()  # blocked on the lock row, not judging a stale snapshot
        await conn.commit()
    with pytest.raises(LeaseLost, match="r2"):
        await pending
    assert await store.load_messages("s") == []


# -- the runtime on PostgreSQL ------------------------------------------------------------------
async def test_agent_with_tools_through_a_runtime(store: PostgresStore) -> None:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name="lookup", arguments={"q": "x"})]), "ok", "two"]
    )
    agent = Agent(model=model, tools=[lookup])
    runtime = Runtime(store)
    r = await runtime.run(agent, "go", session_id="s")
    assert r.output == "ok"
    ledger = await store.ledger("s")
    assert [e.status for e in ledger] == ["started", "completed"]
    assert ledger[1].result is not None and ledger[1].result.data == "found x"
    assert [x.status for x in await store.list_runs("s")] == ["running", "completed"]
    # A second runtime (another process, in effect) continues the same session.
    r2 = await Runtime(store).run(agent, "again", session_id="s")
    assert r2.output == "two"
    messages = await store.load_messages("s")
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    info = await store.get_session("s")
    assert info is not None and info.message_count == 6 and info.usage.requests >= 3
    events = await store.load_events("s")
    assert events and len({e.run_id for e in events}) == 2
    assert await store.open_runs("s") == [] and await store.open_tool_calls("s") == []


async def test_crash_recovery_of_a_dead_run(store: PostgresStore) -> None:
    calls: list[tuple[str, str]] = []

    @tool(effect="at_most_once")
    def send_email(ctx: RunContext, to: str) -> str:
        """Send an email."""
        calls.append(("send_email", ctx.idempotency_key))
        return f"sent to {to}"

    @tool(effect="idempotent")
    def upsert(ctx: RunContext, key: str) -> str:
        """Write a record keyed by the idempotency key."""
        calls.append(("upsert", ctx.idempotency_key))
        return f"upserted {key}"

    mail = ToolCall(name="send_email", arguments={"to": "a@b"})
    put = ToolCall(name="upsert", arguments={"key": "k"})
    # What a process killed while running both calls leaves behind.
    await store.append(
        "s", messages=[Message.user("do things")], run=RunRecord("run_dead", "s", "running")
    )
    await store.append("s", messages=[Message.assistant("", [mail, put])])
    await store.append(
        "s",
        ledger=[
            LedgerEntry(
                "run_dead", "s", mail.id, "send_email", "started", mail.arguments, "at_most_once"
            ),
            LedgerEntry("run_dead", "s", put.id, "upsert", "started", put.arguments, "idempotent"),
        ],
    )
    assert len(await store.open_tool_calls("s")) == 2
    agent = Agent(model=ScriptedModel(["recovered"]), tools=[send_email, upsert])
    r = await Runtime(store).run(agent, "next", session_id="s")
    assert r.output == "recovered"
    assert calls == [("upsert", f"run_dead:{put.id}")]  # rerun with its key; the email not
    assert await store.open_tool_calls("s") == [] and await store.open_runs("s") == []
    tool_msgs = {m.tool_call_id: m for m in await store.load_messages("s") if m.role == "tool"}
    assert tool_msgs[mail.id].metadata["recovered"] == "interrupted"
    assert tool_msgs[put.id].metadata["recovered"] == "rerun"
    assert {e.status for e in await store.ledger("s") if e.run_id == "run_dead"} >= {"started"}


async def test_a_store_opened_in_one_loop_says_so_in_another(pg_schema_dsn: str) -> None:
    store = PostgresStore(pg_schema_dsn, min_size=0)
    other = asyncio.new_event_loop()  # a loop that keeps running in another thread
    thread = __import__("threading").Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(store.message_count("s"), other).result(10)
        with pytest.raises(StoreError, match="another event loop"):
            await store.message_count("s")
    finally:
        asyncio.run_coroutine_threadsafe(store.close(), other).result(10)
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


async def test_a_store_outlives_the_loop_it_was_opened_in(pg_schema_dsn: str) -> None:
    """One asyncio.run after another (as the CLI does): a new loop gets a new pool."""

    def cli_like() -> int:
        store = PostgresStore(pg_schema_dsn, min_size=1)
        asyncio.run(store.create_session("s"))
        n = asyncio.run(store.message_count("s"))
        asyncio.run(store.close())
        return n

    assert await asyncio.to_thread(cli_like) == 0


# -- faults: dropped connections, a database lost mid-run ----------------------------------------
async def _terminate_store_backends(dsn: str) -> int:
    """pg_terminate_backend every other connection of the cluster (the store's pool)."""
    rows = await _sql(
        dsn,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND datname = current_database()",
    )
    return int(rows[0][0])


async def test_terminated_backend_the_next_calls_reconnect(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    await store.append("s", messages=[Message.user("one")])
    assert await _terminate_store_backends(pg_schema_dsn) >= 1
    # Every pooled connection is dead; the next read and the next append retry on new ones.
    assert await store.message_count("s") == 1
    assert await _terminate_store_backends(pg_schema_dsn) >= 1
    await store.append("s", messages=[Message.user("two")])
    assert [m.content for m in await store.load_messages("s")] == ["one", "two"]


async def test_a_resent_append_that_had_committed_is_not_written_twice(
    store: PostgresStore, pg_schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the commit reached the server but before its answer: the
    retry re-sends the same append (same id) and finds it done; nothing is doubled."""
    import loom.store.postgres as pg

    await store.append("s", messages=[Message.user("zero")])
    real = psycopg.AsyncConnection.execute
    calls = {"n": 0}

    async def execute_then_drop(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        if query == q.APPEND:
            calls["n"] += 1
        result = await real(self, query, *args, **kw)
        if query == q.APPEND and calls["n"] == 1:  # committed (autocommit): lose the answer
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", execute_then_drop)
    monkeypatch.setattr(pg, "_LOST_BACKOFF", (0.0, 0.0, 0.0))
    await store.append("s", messages=[Message.user("once")], events=[])
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", real)
    assert calls["n"] >= 2  # sent again after the drop
    assert [m.content for m in await store.load_messages("s")] == ["zero", "once"]


async def test_a_run_whose_backend_is_terminated_mid_run_finishes_whole(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    """A tool kills every connection of the store while the run is in it: the run's next
    appends reconnect and the transcript is whole: every call has exactly one result."""

    @tool(effect="pure")
    async def cut(i: int) -> str:
        """Cut the database connections."""
        await _terminate_store_backends(pg_schema_dsn)
        return f"cut {i}"

    calls = [ToolCall(name="cut", arguments={"i": i}) for i in range(3)]
    model = ScriptedModel([ModelResponse(tool_calls=[c]) for c in calls] + ["done"])
    agent = Agent(model=model, tools=[cut], store=store)
    result = await agent.run("go", session_id="cut")
    assert result.stop_reason == "completed"
    ledger = await store.ledger("cut")
    assert sorted(e.status for e in ledger).count("started") == 3
    assert len([e for e in ledger if e.status != "started"]) == 3
    assert await store.open_tool_calls("cut") == []
    assert await store.open_runs("cut") == []
    roles = [m.role for m in await store.load_messages("cut")]
    assert roles.count("tool") == 3


@pytest.fixture(scope="module")
def second_cluster() -> Any:
    """A private cluster of its own (not the shared fixture's), for stopping and starting."""
    import pwd
    import shutil
    import tempfile

    pg_bin = "/usr/lib/postgresql/15/bin"
    if not os.access(f"{pg_bin}/pg_ctl", os.X_OK):
        pytest.skip(f"PostgreSQL 15 binaries not found in {pg_bin}")
    root = tempfile.mkdtemp(prefix="loom-pg2-")
    as_pg: list[str] = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    data = f"{root}/data"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"

    def ctl(*args: str) -> None:
        subprocess.run(
            [*as_pg, f"{pg_bin}/pg_ctl", "-D", data, "-l", f"{root}/log", *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    subprocess.run(
        [*as_pg, f"{pg_bin}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    ctl("-w", "-o", opts, "start")

    class Cluster:
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

        def stop(self) -> None:
            ctl("-m", "immediate", "stop")

        def start(self) -> None:
            ctl("-w", "-o", opts, "start")

    try:
        yield Cluster()
    finally:
        if os.path.exists(f"{data}/postmaster.pid"):
            subprocess.run(
                [*as_pg, f"{pg_bin}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)


async def test_a_database_lost_mid_run_fails_the_run_typed_and_resumable(
    second_cluster: Any,
) -> None:
    """The cluster stops (immediate shutdown) while a tool runs: the run ends in StoreError
    within the bounded retries and pool timeout; once the server is back, the session holds
    every step that was acknowledged and nothing half-written, and the run is open (running)
    for crash recovery to settle."""
    store = PostgresStore(second_cluster.dsn, max_size=2, timeout=2.0)

    @tool(effect="pure")
    def outage() -> str:
        """Lose the database."""
        second_cluster.stop()
        return "lost"

    call = ToolCall(name="outage", arguments={})
    model = ScriptedModel([ModelResponse(tool_calls=[call]), "never"])
    agent = Agent(model=model, tools=[outage], store=store)
    t0 = time.monotonic()
    try:
        with pytest.raises(StoreError, match="PostgreSQL"):
            await agent.run("go", session_id="lost")
        assert time.monotonic() - t0 < 30
    finally:
        await store.close()
        second_cluster.start()
    check = PostgresStore(second_cluster.dsn)
    try:
        messages = await check.load_messages("lost")
        assert [m.role for m in messages] == ["user", "assistant"]  # the tool result never landed
        ledger = await check.ledger("lost")
        assert [e.status for e in ledger] == ["started"]  # the call is open, not half-closed
        assert [r.status for r in await check.open_runs("lost")] == ["running"]
    finally:
        await check.close()


# -- media stored once (issue #27) --------------------------------------------------------------
def _png_blob(size: int = 100_000) -> Any:
    from loom.content import Blob, media_ref

    png = b"\x89PNG\r\n\x1a\n" + os.urandom(size)
    return Blob(media_ref(png), "image/png", png)


async def test_media_rows_once_and_the_journal_holds_references(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    from loom.content import Image

    blob = _png_blob(300_000)
    agent = Agent(model=ScriptedModel(["ok"] * 6), store=store)
    for sid in ("a", "b"):
        await agent.run(["what is this?", Image.from_bytes(blob.data)], session_id=sid)
        await agent.run("and now?", session_id=sid)
    rows = await _sql(pg_schema_dsn, "SELECT count(*), sum(octet_length(data)) FROM blobs")
    assert rows == [(1, len(blob.data))]
    journal = await _sql(
        pg_schema_dsn,
        "SELECT (SELECT sum(octet_length(data)) FROM messages), "
        "(SELECT sum(octet_length(data)) FROM events), "
        "(SELECT count(*) FROM messages WHERE strpos(data, %s) > 0)",
        ('"parts"',),
    )
    assert journal[0][0] + journal[0][1] < 20_000 and journal[0][2] == 2
    assert await store.delete_session("a") and await store.delete_session("b")
    assert await _sql(pg_schema_dsn, "SELECT count(*) FROM blobs") == [(0,)]


async def _waiting_for_a_lock(dsn: str) -> None:
    """Until a backend of the cluster waits for a row lock (a condition, polled: PostgreSQL
    sends no notice when a statement starts waiting)."""
    for _ in range(500):
        rows = await _sql(
            dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        )
        if rows[0][0]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing waited for a lock")


async def test_a_deletion_racing_a_put_of_the_same_bytes_keeps_them(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    blob = _png_blob()
    await store.put_blobs("a", [blob])
    # Another process's put for session b: its rows found and share-locked, its link added,
    # not committed yet. Deleting session a must wait for it, then keep the bytes b names.
    async with await psycopg.AsyncConnection.connect(pg_schema_dsn) as other:
        await other.execute(q.BLOBS_HELD, ([blob.ref],))
        await other.execute(q.LINK_BLOBS, ("b", [blob.ref]))
        deleting = asyncio.create_task(store.delete_session("a"))
        await _waiting_for_a_lock(pg_schema_dsn)
        await other.commit()
    await deleting
    assert await store.load_blobs([blob.ref]) == {blob.ref: blob.data}
    assert [r[0] for r in await store.session_blobs("b")] == [blob.ref]


async def test_a_put_racing_the_deletion_of_the_same_bytes_writes_them_again(
    store: PostgresStore, pg_schema_dsn: str
) -> None:
    blob = _png_blob()
    await store.put_blobs("a", [blob])
    # Another process deletes session a (the last to name the bytes) and has not committed:
    # a put for session b waits, finds the row gone, and writes the bytes again.
    async with await psycopg.AsyncConnection.connect(pg_schema_dsn) as other:
        await other.execute(q.UNLINK_SESSION_BLOBS, ("a",))
        await other.execute(q.LOCK_BLOBS, ([blob.ref],))
        await other.execute(q.DELETE_UNNAMED_BLOBS, ([blob.ref],))
        putting = asyncio.create_task(store.put_blobs("b", [blob]))
        await _waiting_for_a_lock(pg_schema_dsn)
        await other.commit()
    await putting
    assert await store.load_blobs([blob.ref]) == {blob.ref: blob.data}
    assert await store.session_blobs("a") == []
    assert [r[0] for r in await store.session_blobs("b")] == [blob.ref]


# -- branches: random histories read as in a store that copies ----------------------------------
@pytest.mark.parametrize("seed", range(12))
async def test_random_branches_read_as_in_a_store_that_copies(
    store: PostgresStore, seed: int
) -> None:
    """As ``test_branches.py``'s property on SQLite: after random appends, rewinds and forks,
    every read of every session equals MemoryStore's (seeded: hypothesis and the session's
    event loop do not mix)."""
    import random

    from tests.store.test_branches import _OPS, _plan, _reads

    from loom.store import MemoryStore

    rng = random.Random(seed)
    memory = MemoryStore()
    names = ["s0"]
    memo = [Message.system("memo")]
    for s in (memory, store):
        await s.append("s0", messages=memo)
    for step in range(20):
        op = (rng.choice(_OPS), rng.randint(0, 5), rng.randint(0, 1_000), rng.randint(0, 3))
        apply = await _plan(memory, op, step, names)
        for s in (memory, store):
            await apply(s)
        for sid in names:
            assert await _reads(store, sid) == await _reads(memory, sid), (step, op, sid)
