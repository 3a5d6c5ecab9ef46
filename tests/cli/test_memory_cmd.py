"""`loom memory list / search / rm` on a store's memory items (issue #29)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.cli import app, memory_cmd
from loom.store.base import capabilities_of
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


async def fill(store: MemoryStore | SQLiteStore) -> None:
    items = capabilities_of(store).items
    assert items is not None
    await items.put_item(["users", "alice", "prefs"], "food", {"text": "likes spicy ramen"})
    await items.put_item(["users", "alice", "prefs"], "drink", {"text": "green tea"}, owner="alice")
    await items.put_item(["users", "bob"], "city", {"text": "lives in Lyon"}, owner="bob")


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    """One in-memory store every command of the test opens (the CLI closes it; it keeps its
    items)."""
    store = MemoryStore()
    asyncio.run(fill(store))
    monkeypatch.setattr(memory_cmd, "open_store", lambda path: store)
    return store


def test_list_every_item_and_under_a_prefix(memory: MemoryStore) -> None:
    r = runner.invoke(app, ["memory", "list"], env=WIDE)
    assert r.exit_code == 0, r.output
    assert "3 items" in r.output
    for text in ("users.alice.prefs", "food", "spicy ramen", "users.bob", "city", "bob"):
        assert text in r.output
    r = runner.invoke(app, ["memory", "list", "--prefix", "users.alice", "--json"])
    assert r.exit_code == 0, r.output
    listed = json.loads(r.output)
    assert sorted(i["key"] for i in listed) == ["drink", "food"]
    assert {i["owner"] for i in listed} == {None, "alice"}
    assert listed[0]["namespace"] == ["users", "alice", "prefs"]


def test_search_finds_by_words(memory: MemoryStore) -> None:
    r = runner.invoke(app, ["memory", "search", "ramen"], env=WIDE)
    assert r.exit_code == 0, r.output
    assert "1 items matching 'ramen'" in r.output and "food" in r.output
    assert "city" not in r.output
    r = runner.invoke(app, ["memory", "search", "lives", "--prefix", "users.alice", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []
    r = runner.invoke(app, ["memory", "search", "lyon", "--limit", "1", "--json"])
    found = json.loads(r.output)
    assert [i["key"] for i in found] == ["city"] and found[0]["score"] > 0


def test_rm_deletes_one_item(memory: MemoryStore) -> None:
    r = runner.invoke(app, ["memory", "rm", "users.bob", "city"])
    assert r.exit_code == 0, r.output
    assert "deleted users.bob / city" in r.output
    assert asyncio.run(memory.get_item(["users", "bob"], "city")) is None
    r = runner.invoke(app, ["memory", "rm", "users.bob", "city"])
    assert r.exit_code == 2
    assert "InputError" in r.output and "loom memory list" in r.output


def test_bad_input_exits_2(memory: MemoryStore) -> None:
    r = runner.invoke(app, ["memory", "list", "--limit", "0"])
    assert r.exit_code == 2 and "limit must be an integer" in r.output
    r = runner.invoke(app, ["memory", "list", "--prefix", "users..alice"])
    assert r.exit_code == 2 and "namespace part 1" in r.output
    r = runner.invoke(app, ["memory", "rm", "", "k"])
    assert r.exit_code == 2 and "at least one part" in r.output


def test_a_missing_database_exits_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["memory", "list", "--db", str(tmp_path / "nope.db")])
    assert r.exit_code == 2 and "no Loom database" in r.output
    assert not (tmp_path / "nope.db").exists()


def test_a_store_without_items_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoItems:
        async def close(self) -> None:
            return None

    monkeypatch.setattr(memory_cmd, "open_store", lambda path: NoItems())
    r = runner.invoke(app, ["memory", "list"])
    assert r.exit_code == 2 and "lacks the ItemStore capability" in r.output


@pytest.mark.skipif(
    not hasattr(SQLiteStore, "put_item"),
    reason="SQLite's ItemStore lands with issue #29's SQL stores (a parallel branch)",
)
def test_on_a_sqlite_database(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"

    async def make() -> None:
        store = SQLiteStore(db)
        try:
            await fill(store)
        finally:
            await store.close()

    asyncio.run(make())
    r = runner.invoke(app, ["memory", "list", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)) == 3
    r = runner.invoke(app, ["memory", "rm", "users.alice.prefs", "food", "--db", str(db)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["memory", "search", "ramen", "--db", str(db), "--json"])
    assert json.loads(r.output) == []


def test_semantic_search_and_reindex_with_an_embedder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.embedding import HashEmbedder

    monkeypatch.delenv("LOOM_EMBEDDER", raising=False)
    db = tmp_path / "loom.db"

    async def make() -> None:
        store = SQLiteStore(db, embedder=HashEmbedder(64))
        try:
            await fill(store)
        finally:
            await store.close()

    asyncio.run(make())
    semantic = ["memory", "search", "green tea", "--db", str(db), "--mode", "semantic", "--json"]
    r = runner.invoke(app, [*semantic, "--embedder", "hash:64"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)[0]["key"] == "drink"
    r = runner.invoke(app, semantic)  # no embedder: a semantic search is refused
    assert r.exit_code == 2 and "needs an embedder" in r.output
    r = runner.invoke(app, [*semantic, "--embedder", "hash:32"])  # another model's vectors
    assert r.exit_code == 2 and "loom memory reindex" in r.output
    r = runner.invoke(app, ["memory", "reindex", "--db", str(db)])
    assert r.exit_code == 2 and "needs an embedder" in r.output
    r = runner.invoke(app, ["memory", "reindex", "--db", str(db), "--embedder", "hash:32"])
    assert r.exit_code == 0 and "re-embedded 3 items" in r.output
    r = runner.invoke(app, [*semantic, "--embedder", "hash:32"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)[0]["key"] == "drink"
