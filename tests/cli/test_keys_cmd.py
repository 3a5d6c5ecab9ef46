"""`loom keys forget NAME`: everything an API key has, deleted from the session database."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from loom.cli import app
from loom.messages import Message
from loom.server.ownership import Owners
from loom.store.sqlite import SQLiteStore

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _fill(path: Path) -> None:
    async def go() -> None:
        store = SQLiteStore(path)
        try:
            owners = Owners(store)
            for sid, who in (("alice~a", "alice"), ("alice~b", "alice"), ("bob~c", "bob")):
                await owners.claim_for(sid, who)
                await store.append(sid, messages=[Message.user(f"hello from {who}")])
            await store.put_item(("mem",), "k1", {"text": "alice's"}, owner="alice")
            await store.put_item(("mem",), "k2", {"text": "bob's"}, owner="bob")
        finally:
            await store.close()

    asyncio.run(go())


def _sessions(path: Path) -> list[str]:
    async def go() -> list[str]:
        store = SQLiteStore(path)
        try:
            return sorted(i.id for i in await store.list_sessions(limit=0))
        finally:
            await store.close()

    return asyncio.run(go())


def test_forget_asks_then_deletes_and_shows_the_counts(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    _fill(db)
    r = runner.invoke(app, ["keys", "forget", "alice", "--db", str(db)], input="n\n", env=WIDE)
    assert r.exit_code == 1 and "nothing deleted" in r.output
    assert "delete its 2 sessions" in r.output
    assert _sessions(db) == ["alice~a", "alice~b", "bob~c"]
    r = runner.invoke(app, ["keys", "forget", "alice", "--db", str(db)], input="y\n", env=WIDE)
    assert r.exit_code == 0, r.output
    assert "forgot key alice" in r.output
    lines = {line.split()[1]: line.split()[-2] for line in r.output.splitlines() if "│" in line}
    assert lines["sessions"] == "2" and lines["items"] == "1"
    assert _sessions(db) == ["bob~c"]


def test_forget_an_unknown_name_says_nothing_was_deleted(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    _fill(db)
    r = runner.invoke(app, ["keys", "forget", "carol", "--db", str(db), "--yes"], env=WIDE)
    assert r.exit_code == 0, r.output
    assert "nothing of key carol is stored: nothing deleted" in r.output
    r = runner.invoke(app, ["keys", "forget", "carol", "--db", str(db), "--yes", "--json"])
    assert json.loads(r.output)["deleted"]["sessions"] == 0
    assert _sessions(db) == ["alice~a", "alice~b", "bob~c"]


def test_forget_refuses_an_admin_key_and_a_bad_name(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    _fill(db)
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "- {name: root, key: root-secret, admin: true}\n- {name: alice, key: alice-secret}\n"
    )
    r = runner.invoke(
        app, ["keys", "forget", "root", "--db", str(db), "--keys", str(keys), "--yes"]
    )
    assert r.exit_code == 2 and "is an admin key" in r.output
    r = runner.invoke(app, ["keys", "forget", " ", "--db", str(db), "--yes"])
    assert r.exit_code == 2 and "name is 1 to 64 characters" in r.output
    r = runner.invoke(
        app, ["keys", "forget", "alice", "--db", str(db), "--keys", str(keys), "--yes", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["deleted"]["sessions"] == 2
