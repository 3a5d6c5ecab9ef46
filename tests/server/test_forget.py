"""Forgetting an owner (issue #29 item 6): everything of an API key's principal deleted, the
rest kept, and the deleted bytes gone from the database's files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.conftest import Server, start_server, stop_server

from loom import Agent
from loom.content import Image
from loom.messages import Message
from loom.schedule.model import Monitor, Schedule
from loom.schedule.monitors import MonitorStore
from loom.schedule.storage import ScheduleStore
from loom.server.forget import forget_owner, owned_sessions
from loom.server.ownership import Owners
from loom.store import SQLiteStore
from loom.testing import ScriptedModel

MARKER = "zqxforgetmarker7461"  # one word, lower case: the FTS index keeps it as it is


def _png(marker: str, size: int = 9000) -> bytes:
    """A PNG-looking image of ``size`` bytes holding ``marker`` (spread over its pages)."""
    body = (marker.encode() + os.urandom(500)) * (size // 500)
    return b"\x89PNG\r\n\x1a\n" + body


async def _fill(store: SQLiteStore, owner: str, marker: str) -> None:
    """A session of ``owner`` with ``marker`` in a message and an image, and a memory item."""
    owners = Owners(store)
    sid = f"{owner}~chat"
    await owners.claim_for(sid, owner)
    agent = Agent(model=ScriptedModel([f"noted, {owner}"]), store=store)
    await agent.run([f"my secret is {marker}", Image.from_bytes(_png(marker))], session_id=sid)
    await store.put_item(("memories", owner), "secret", {"text": f"{marker} told"}, owner=owner)


def _raw(path: Path) -> bytes:
    """The bytes of the database file and its WAL, as they are on disk."""
    wal = Path(f"{path}-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_forgetting_an_owner_leaves_no_byte_of_it_in_the_sqlite_files(
    tmp_path: Path,
) -> None:
    path = tmp_path / "loom.db"
    store = SQLiteStore(path)
    try:
        await _fill(store, "alice", MARKER)
        await _fill(store, "bob", "bobskeptword")  # another owner, written after: shared pages
        assert MARKER.encode() in _raw(path)  # the bytes are there to be found
        done = await forget_owner(store, "alice")
        assert (done.sessions, done.items, done.media, done.ownership_records) == (1, 1, 1, 1)
        assert done.complete and done.scrubbed
        raw = _raw(path)
        assert MARKER.encode() not in raw
        assert MARKER.encode("utf-16-le") not in raw
        # bob's data is untouched and readable
        assert b"bobskeptword" in raw
        first = (await store.load_messages("bob~chat"))[0]
        assert first.content.startswith("my secret is bobskeptword")
        hits = await store.search_items((), query="bobskeptword", owner="bob")
        assert [i.key for i in hits] == ["secret"]
        assert await store.search_items((), query=MARKER) == []
    finally:
        await store.close()


async def test_forget_deletes_sessions_forks_schedules_monitors_and_ownership(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    try:
        owners = Owners(store)
        await owners.claim_for("s-plain", "alice")  # an id the server generated for alice
        await store.append("s-plain", messages=[Message.user("one"), Message.user("two")])
        await store.append("s-plain:crew/member", messages=[Message.user("derived")])
        await store.fork("s-plain", "alice~fork", 1, 0, messages=[], events=[])
        await store.append("bob~s", messages=[Message.user("bob's")])
        await owners.claim_for("bob~s", "bob")
        await owners.claim_for("gone-before", "alice")  # its session was deleted earlier
        schedules, monitors = ScheduleStore(store), MonitorStore(store)
        for sched_id, who in (("al", "alice"), ("bo", "bob")):
            made = Schedule(
                agent="a", message="hi", interval=3600, id=sched_id, principal=who, created_at=0
            )
            await schedules.add(made)
        await monitors.add(Monitor(id="m-al", cron="0 * * * *", principal="alice"))
        found, recorded = await owned_sessions(store, "alice")
        assert sorted(found) == ["alice~fork", "s-plain", "s-plain:crew/member"]
        assert sorted(recorded) == ["gone-before", "s-plain"]

        owners.owner["s-plain"] = "alice"
        done = await forget_owner(store, "alice", owners=owners)
        assert (done.sessions, done.schedules, done.monitors) == (3, 1, 1)
        assert done.ownership_records == 2 and done.complete
        assert "s-plain" not in owners.owner  # the running server's cache too
        assert [i.id for i in await store.list_sessions(limit=0)] == ["bob~s"]
        assert [s.schedule.id for s in await schedules.list_schedules()] == ["bo"]
        assert await monitors.list_monitors() == []
        assert await owners.owner_of("bob~s") == "bob"

        again = await forget_owner(store, "alice")  # nothing left: every count is 0
        assert again.deleted == 0 and again.complete
    finally:
        await store.close()


async def test_a_session_another_owner_forked_and_a_running_one_are_kept_and_named(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    try:
        owners = Owners(store)
        for sid, who in (("alice~src", "alice"), ("alice~busy", "alice"), ("bob~f", "bob")):
            await owners.claim_for(sid, who)
            await store.append(sid, messages=[Message.user("x"), Message.user("y")])
        await store.delete_session("bob~f")
        await store.fork("alice~src", "bob~f", 1, 0, messages=[], events=[])
        held = await store.acquire_lease("alice~busy", "a-run", 60)
        assert held is not None
        done = await forget_owner(store, "alice")
        assert (done.shared, done.busy, done.sessions) == (["alice~src"], ["alice~busy"], 0)
        assert not done.complete
        assert await owners.owner_of("alice~src") == "alice"  # still hers: not forgotten yet
        # the kept session's lease was given back: a run can take it
        assert await store.acquire_lease("alice~src", "later", 60) is not None
    finally:
        await store.close()


@pytest.mark.parametrize("name", ["", "   ", "x" * 65])
async def test_a_name_that_cannot_be_a_key_is_refused(tmp_path: Path, name: str) -> None:
    from loom.errors import InputError

    store = SQLiteStore(tmp_path / "loom.db")
    try:
        with pytest.raises(InputError):
            await forget_owner(store, name)
    finally:
        await store.close()


async def _pg_relation_bytes(dsn: str) -> bytes:
    """The on-disk bytes of every table, index and TOAST relation of the test's schema, read
    by the server (``pg_read_binary_file``: the fixture's user is a superuser) after a
    ``CHECKPOINT`` has written every page out."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CHECKPOINT")
        rows = await (
            await conn.execute(
                "WITH mine AS (SELECT c.oid, c.reltoastrelid FROM pg_class c "
                " WHERE c.relnamespace = current_schema()::regnamespace), "
                "rels AS (SELECT oid FROM mine UNION SELECT reltoastrelid FROM mine "
                " WHERE reltoastrelid <> 0 UNION SELECT i.indexrelid FROM pg_index i "
                " JOIN mine m ON i.indrelid = m.reltoastrelid) "
                "SELECT pg_relation_filepath(oid) FROM rels"
            )
        ).fetchall()
        out = b""
        for (file,) in rows:
            if file is None:
                continue
            found = await (await conn.execute("SELECT pg_read_binary_file(%s)", (file,))).fetchone()
            out += bytes(found[0] or b"") if found is not None else b""
        return out


async def test_forgetting_an_owner_on_postgres_leaves_no_byte_in_the_relation_files(
    pg_schema_dsn: str,
) -> None:
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=2)
    try:
        for owner, marker in (("alice", MARKER), ("bob", "bobskeptword")):
            owners = Owners(store)
            sid = f"{owner}~chat"
            await owners.claim_for(sid, owner)
            agent = Agent(model=ScriptedModel([f"noted, {owner}"]), store=store)
            content = [f"my secret is {marker}", Image.from_bytes(_png(marker))]
            await agent.run(content, session_id=sid)
            value = {"text": f"{marker} told"}
            await store.put_item(("memories", owner), "secret", value, owner=owner)
        assert MARKER.encode() in await _pg_relation_bytes(pg_schema_dsn)
        done = await forget_owner(store, "alice")
        assert (done.sessions, done.items, done.media) == (1, 1, 1) and done.scrubbed
        raw = await _pg_relation_bytes(pg_schema_dsn)
        assert MARKER.encode() not in raw
        assert b"bobskeptword" in raw  # bob's rows were rewritten, not lost
        assert len(await store.load_messages("bob~chat")) == 2
    finally:
        await store.close()


# -- over HTTP: DELETE /admin/principals/{name} on a real server ----------------------------------
ALICE, BOB, ROOT = "alice-key-0001", "bob-key-0002", "root-key-0004"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("forget_api")
    (tmp / "keys.yaml").write_text(
        f"- {{name: alice, key: {ALICE}}}\n"
        f"- {{name: bob, key: {BOB}}}\n"
        f"- {{name: root, key: {ROOT}, admin: true}}\n"
    )
    srv = start_server(tmp, "--keys", str(tmp / "keys.yaml"))
    yield srv
    stop_server(srv)


@pytest.mark.timeout(120)
async def test_an_admin_key_forgets_a_key_over_http(keyed: Server) -> None:
    import httpx

    langgraph_sdk = pytest.importorskip("langgraph_sdk")
    alice = langgraph_sdk.get_client(url=keyed.url, api_key=ALICE)
    bob = langgraph_sdk.get_client(url=keyed.url, api_key=BOB)
    thread = await alice.threads.create()
    await alice.runs.wait(thread["thread_id"], "calc", input={"messages": ["add 2 and 3"]})
    await alice.store.put_item(["mem", "alice"], "pin", {"text": "alice's pin 1234"})
    bob_thread = await bob.threads.create()
    await bob.runs.wait(bob_thread["thread_id"], "calc", input={"messages": ["add 1 and 1"]})
    await bob.store.put_item(["mem", "bob"], "pin", {"text": "bob's pin 9876"})

    def as_key(key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=keyed.url, headers={"x-api-key": key})

    async with as_key(BOB) as http:  # not an admin key
        r = await http.delete("/admin/principals/alice")
        assert r.status_code == 403 and r.json()["error"]["type"] == "Forbidden"
    async with as_key(ROOT) as http:
        r = await http.delete("/admin/principals/root")  # the admin key itself
        assert r.status_code == 422 and "cannot forget itself" in r.json()["error"]["message"]
        r = await http.delete("/admin/principals/nobody")  # an unknown name: nothing, said
        assert r.status_code == 200 and r.json()["deleted"]["sessions"] == 0
        assert r.json()["complete"]
        r = await http.delete("/admin/principals/alice")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["deleted"]["sessions"] == 1 and body["deleted"]["items"] == 1
        assert body["complete"] and body["scrubbed"]
    assert await alice.store.get_item(["mem", "alice"], key="pin") is None
    async with as_key(ALICE) as http:
        r = await http.get(f"/threads/{thread['thread_id']}")
        assert r.status_code == 404
    still = await bob.store.get_item(["mem", "bob"], key="pin")  # bob's data is kept
    assert still is not None and still["value"] == {"text": "bob's pin 9876"}
    async with as_key(BOB) as http:
        assert (await http.get(f"/threads/{bob_thread['thread_id']}")).status_code == 200
