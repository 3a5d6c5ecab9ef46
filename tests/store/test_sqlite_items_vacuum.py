"""A ``VACUUM`` of the SQLite file (what an operator runs to reclaim space) keeps item search
right: ``items_fts`` and ``item_vectors`` point at items by rowid, and SQLite renumbers the
rowids of a table without an ``INTEGER PRIMARY KEY`` when it vacuums."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from loom.embedding import HashEmbedder
from loom.store import SQLiteStore


async def test_a_vacuum_keeps_keyword_and_semantic_search_pointing_at_the_right_items(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v.db"
    store = SQLiteStore(path, embedder=HashEmbedder(32))
    try:
        for key, text in [("a", "apples ripen"), ("b", "boats float"), ("c", "cherries fall")]:
            await store.put_item(("m",), key, {"text": text})
        await store.delete_item(("m",), "a")  # a gap at the front: VACUUM would close it
    finally:
        await store.close()
    with sqlite3.connect(path) as raw:
        raw.execute("VACUUM")
    store = SQLiteStore(path, embedder=HashEmbedder(32))
    try:
        for mode in ("keyword", "semantic"):
            found = await store.search_items(("m",), query="cherries", mode=mode, limit=1)
            assert [(i.key, i.value["text"]) for i in found] == [("c", "cherries fall")], mode
        await store.delete_item(("m",), "c")  # its words and vector go with it, not another's
        assert [i.key for i in await store.search_items(("m",), query="boats")] == ["b"]
        assert await store.search_items(("m",), query="cherries", mode="keyword") == []
    finally:
        await store.close()
