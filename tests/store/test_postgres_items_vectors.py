"""Item vectors on PostgreSQL with pgvector: a semantic search scores with ``<=>`` when the
``vector`` extension is installed (skipped where it cannot be: this machine's PostgreSQL 15
has no pgvector package; the conformance suite covers the ``real[]`` path everywhere)."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg", reason="the postgres extra is not installed")

import psycopg

from loom.embedding import HashEmbedder
from loom.store.postgres import PostgresStore


async def test_pgvector_scores_like_the_array_path(pg_schema_dsn: str) -> None:
    try:
        async with await psycopg.AsyncConnection.connect(pg_schema_dsn, autocommit=True) as c:
            await c.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        pytest.skip(f"CREATE EXTENSION vector failed here (pgvector not installed): {exc}")
    store = PostgresStore(pg_schema_dsn, min_size=1, max_size=2, embedder=HashEmbedder(16))
    try:
        await store.put_item(("m",), "a", {"text": "green tea, green tea"})
        await store.put_item(("m",), "b", {"text": "green coffee"})
        await store.put_item(("m",), "c", {"text": "black coffee"}, owner="bob")
        hits = await store.search_items(("m",), query="green tea", mode="semantic")
        assert [i.key for i in hits] == ["a", "b", "c"]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert hits[1].score == pytest.approx(0.5, abs=1e-5)
        mine = await store.search_items(("m",), query="coffee", mode="semantic", owner="bob")
        assert [i.key for i in mine] == ["c"]
    finally:
        await store.close()
