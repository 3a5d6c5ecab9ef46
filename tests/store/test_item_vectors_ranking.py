"""Keyword queries without stop words and hybrid fusion that a weak keyword list cannot sway
(``loom.store.items_vectors``), the same on every store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loom.embedding import HashEmbedder
from loom.store import MemoryStore, SQLiteStore
from loom.store.items import Item
from loom.store.items_vectors import KEYWORD_MIN_SHARE, fuse, keyword_terms
from loom.store.postgres import PostgresStore


def test_keyword_terms_drop_stop_words_unless_nothing_else_is_left() -> None:
    assert keyword_terms("What does my sibling's cat eat?") == ["sibling", "cat", "eat"]
    assert keyword_terms("The Who") == ["the", "who"]  # only stop words: all kept
    assert keyword_terms("tea, TEA and tea") == ["tea"]
    assert keyword_terms("") == []


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MemoryStore | SQLiteStore | PostgresStore]:
    made: MemoryStore | SQLiteStore | PostgresStore
    if request.param == "memory":
        made = MemoryStore(embedder=HashEmbedder(32))
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32))
    else:
        dsn: str = request.getfixturevalue("pg_schema_dsn")
        made = PostgresStore(dsn, min_size=1, max_size=2, embedder=HashEmbedder(32))
    try:
        yield made
    finally:
        await made.close()


async def test_a_keyword_search_ignores_the_query_s_stop_words(
    store: MemoryStore | SQLiteStore | PostgresStore,
) -> None:
    await store.put_item(("m",), "chatter", {"text": "What does my day look like?"})
    await store.put_item(("m",), "cat", {"text": "The cat eats tuna."})
    await store.put_item(("m",), "band", {"text": "The Who played here."})
    hits = await store.search_items(("m",), query="What does my cat eat?", mode="keyword")
    assert [i.key for i in hits] == ["cat"]  # "what", "does", "my" match nothing on their own
    only_stop_words = await store.search_items(("m",), query="the who", mode="keyword")
    assert only_stop_words[0].key == "band"


def _item(key: str, text: str) -> Item:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Item(namespace=("m",), key=key, value={"text": text}, created_at=at, updated_at=at)


def test_hybrid_fusion_leaves_out_keyword_hits_holding_few_of_the_key_words() -> None:
    weak = _item("weak", "the name of the street")  # 1 of 3 key words: "name"
    strong = _item("strong", "kitten name: Miso")  # 2 of 3: "kitten", "name"
    meant = _item("meant", "my brother's cat is Miso")  # the embedder's first answer
    other = _item("other", "a dog called Rex")
    query = "What is the name of my sibling's kitten?"
    assert KEYWORD_MIN_SHARE == 0.5
    fused = fuse([weak, strong], [meant, other, strong], limit=3, offset=0, query=query)
    assert [i.key for i in fused] == ["strong", "meant", "other"]
    # Without the floor the weak keyword hit would outrank the embedder's second answer.
    plain = fuse([weak, strong], [meant, other, strong], limit=3, offset=0)
    assert [i.key for i in plain] == ["strong", "meant", "weak"]
