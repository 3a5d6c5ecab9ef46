"""Item vectors on SQLite (``0012_item_vectors``): rows leave with their items in the same
transaction, items stored before a store had an embedder are embedded by a later one, and
sqlite-vec's path where this Python can load it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from loom.embedding import HashEmbedder
from loom.store import SQLiteStore


def _vector_rows(db: Path) -> list[tuple[int, str | None, int | None, bool]]:
    with sqlite3.connect(db) as c:
        return [
            (r[0], r[1], r[2], r[3] is not None)
            for r in c.execute(
                "SELECT v.item_rowid, v.embedder, v.dims, v.vector FROM item_vectors v"
            )
        ]


def _orphans(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return int(
            c.execute(
                "SELECT count(*) FROM item_vectors "
                "WHERE item_rowid NOT IN (SELECT rowid FROM items)"
            ).fetchone()[0]
        )


async def test_vectors_leave_with_their_items(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    store = SQLiteStore(db, embedder=HashEmbedder(16))
    try:
        await store.put_item(("u",), "a", {"text": "one"}, owner="alice")
        await store.put_item(("u",), "b", {"text": "two"}, owner="alice")
        await store.put_item(("u",), "c", {"text": "three"}, owner="bob")
        brief = await store.put_item(("u",), "brief", {"text": "soon gone"}, ttl=0.2)
        assert [r[1:] for r in _vector_rows(db)] == [("hash", 16, True)] * 4
        assert await store.delete_item(("u",), "a")
        assert len(_vector_rows(db)) == 3 and _orphans(db) == 0
        assert await store.delete_owner_items("alice") == 1
        assert len(_vector_rows(db)) == 2 and _orphans(db) == 0
        assert brief.expires_at is not None  # the ttl running out is what is tested:
        await asyncio.sleep(max(brief.expires_at.timestamp() - time.time(), 0) + 0.01)
        # An expired item's key written again without a vector: its old vector goes with it.
        await store.put_item(("u",), "brief", {"text": "back"}, index=False)
        assert len(_vector_rows(db)) == 1 and _orphans(db) == 0
    finally:
        await store.close()


async def test_items_stored_without_an_embedder_are_embedded_later(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    plain = SQLiteStore(db)
    try:
        await plain.put_item(("m",), "a", {"text": "green tea"})
        await plain.put_item(("m",), "b", {"text": "black coffee"}, index=False)
        assert [r[1:] for r in _vector_rows(db)] == [(None, None, False)]  # pending
    finally:
        await plain.close()
    embedder = HashEmbedder(16)
    store = SQLiteStore(db, embedder=embedder)
    try:
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["a"]  # embedded on the way, "b" never
        assert embedder.calls == 2  # the pending item, then the query
        assert [r[1:] for r in _vector_rows(db)] == [("hash", 16, True)]
    finally:
        await store.close()


@pytest.mark.skipif(
    not hasattr(sqlite3.Connection, "enable_load_extension"),
    reason="this Python's sqlite3 cannot load extensions: vectors are scored in numpy instead",
)
async def test_sqlite_vec_scores_in_the_query(tmp_path: Path) -> None:
    pytest.importorskip("sqlite_vec", reason="sqlite-vec is not installed (the memory extra)")
    store = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(16))
    try:
        assert store.db.vec
        await store.put_item(("m",), "a", {"text": "green tea, green tea"})
        await store.put_item(("m",), "b", {"text": "green coffee"})
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["a", "b"]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    finally:
        await store.close()


async def test_semantic_answers_as_the_memory_store_whichever_table_drives(
    tmp_path: Path,
) -> None:
    """A search over few candidates reads items first, over many the vectors first
    (``sqlite_items``): both answer what ``MemoryStore`` answers."""
    from loom.store import MemoryStore

    sqlite = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32))
    memory = MemoryStore(embedder=HashEmbedder(32))
    words = ["tea", "green", "coffee", "black", "cake", "rain", "sun", "bread"]
    try:
        for n in range(60):
            ns = ("mem", f"u{n % 10}")
            text = " ".join(words[(n * k) % len(words)] for k in (1, 3, 5))
            for store in (sqlite, memory):
                await store.put_item(ns, f"k{n}", {"text": text}, owner=f"o{n % 3}")
        for prefix, owner in [
            (("mem", "u3"), None),
            (("mem",), None),
            (("mem",), "o1"),
            ((), "o2"),
        ]:
            for query in ("green tea", "black coffee cake", "sun"):
                got = await sqlite.search_items(
                    prefix, query=query, mode="semantic", owner=owner, limit=5, offset=1
                )
                want = await memory.search_items(
                    prefix, query=query, mode="semantic", owner=owner, limit=5, offset=1
                )
                assert [(i.key, round(i.score or 0, 4)) for i in got] == [
                    (i.key, round(i.score or 0, 4)) for i in want
                ]
    finally:
        await sqlite.close()
