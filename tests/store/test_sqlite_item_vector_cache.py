"""The in-process copy of SQLite's item vectors (``loom.store.sqlite_vector_cache``): a search
through it answers what ``MemoryStore`` answers while this process writes, sees another
process's writes at once, and stays off or out of the way when its cap says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.embedding import HashEmbedder
from loom.store import MemoryStore, SQLiteStore
from loom.store.sqlite_vector_cache import CACHE_ENV, cache_for

SRC = str(Path(loom.__file__).resolve().parent.parent)
WORDS = ["tea", "green", "coffee", "black", "cake", "rain", "sun", "bread", "milk", "rye"]


def _text(n: int) -> str:
    return " ".join(WORDS[(n * k) % len(WORDS)] for k in (1, 3, 7))


async def _same_answers(sqlite: SQLiteStore, memory: MemoryStore) -> None:
    cases: list[tuple[tuple[str, ...], str | None, dict[str, Any] | None]] = [
        (("mem",), None, None),
        (("mem", "u3"), None, None),
        (("mem",), "o1", None),
        ((), "o2", None),
        (("mem",), None, {"kind": "a"}),
        (("mem",), "o0", {"kind": "b"}),
        (("me",), None, None),  # a prefix of a namespace part is no namespace prefix
    ]
    for prefix, owner, wanted in cases:
        for query in ("green tea", "black coffee cake", "sun"):
            for limit, offset in ((5, 0), (4, 2)):
                got = await sqlite.search_items(
                    prefix,
                    query=query,
                    mode="semantic",
                    owner=owner,
                    filter=wanted,
                    limit=limit,
                    offset=offset,
                )
                want = await memory.search_items(
                    prefix,
                    query=query,
                    mode="semantic",
                    owner=owner,
                    filter=wanted,
                    limit=limit,
                    offset=offset,
                )
                assert [(i.namespace, i.key, round(i.score or 0, 4)) for i in got] == [
                    (i.namespace, i.key, round(i.score or 0, 4)) for i in want
                ], (prefix, owner, wanted, query, limit, offset)


@pytest.mark.parametrize("threaded", [False, True])
async def test_the_copy_answers_as_the_memory_store_while_this_process_writes(
    tmp_path: Path, threaded: bool
) -> None:
    sqlite = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32), threaded=threaded)
    memory = MemoryStore(embedder=HashEmbedder(32))
    both = (sqlite, memory)
    try:
        for n in range(60):
            for store in both:
                await store.put_item(
                    ("mem", f"u{n % 10}"),
                    f"k{n}",
                    {"text": _text(n), "kind": "ab"[n % 2]},
                    owner=f"o{n % 3}",
                )
        await _same_answers(sqlite, memory)
        cache = cache_for(sqlite.db)
        assert cache is not None and cache.generation is not None and cache.rebuilds == 1

        # Writes after the copy was built: new items, a changed vector, an item no longer
        # embedded, deletes, an owner forgotten, an item that expires.
        for store in both:
            await store.put_item(("mem", "u1"), "new", {"text": "green green tea", "kind": "a"})
            await store.put_item(("mem", "u2"), "k4", {"text": "sun rain", "kind": "a"}, owner="o1")
            await store.put_item(("mem", "u5"), "k5", {"text": "green tea"}, index=False)
            await store.delete_item(("mem", "u6"), "k6")
            await store.put_item(("mem", "u7"), "gone", {"text": "sun sun"}, ttl=0.001)
        await _same_answers(sqlite, memory)
        for store in both:
            await store.delete_owner_items("o2")
        await _same_answers(sqlite, memory)
        assert cache.rebuilds == 1  # every write above kept the copy in step, no rebuild
    finally:
        await sqlite.close()


def _write_elsewhere(db: Path) -> None:
    """Another process writes the file: a new item, a changed vector, a deleted item."""
    script = textwrap.dedent(
        f"""
        import asyncio
        from loom.embedding import HashEmbedder
        from loom.store import SQLiteStore

        async def main():
            store = SQLiteStore({str(db)!r}, embedder=HashEmbedder(32))
            await store.put_item(("mem",), "theirs", {{"text": "black coffee cake"}})
            await store.put_item(("mem",), "tea", {{"text": "black coffee cake cake"}})
            await store.delete_item(("mem",), "cake")
            await store.close()

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)


async def test_a_write_by_another_process_is_seen_by_the_next_search(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    store = SQLiteStore(db, embedder=HashEmbedder(32))
    try:
        await store.put_item(("mem",), "tea", {"text": "green tea"})
        await store.put_item(("mem",), "cake", {"text": "black coffee cake"})
        await store.put_item(("mem",), "sun", {"text": "sun rain"})
        before = await store.search_items(("mem",), query="black coffee cake", mode="semantic")
        assert before[0].key == "cake"
        cache = cache_for(store.db)
        assert cache is not None and cache.generation is not None  # the copy is built

        _write_elsewhere(db)

        after = await store.search_items(("mem",), query="black coffee cake", mode="semantic")
        keys = [i.key for i in after]
        assert "cake" not in keys  # deleted there
        assert keys[0] == "theirs"  # written there, identical to the query
        assert keys.index("tea") < keys.index("sun")  # its vector changed there
    finally:
        await store.close()


@pytest.mark.parametrize("cap_mb", ["0", "0.001"])
async def test_off_or_over_its_cap_the_file_is_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap_mb: str
) -> None:
    monkeypatch.setenv(CACHE_ENV, cap_mb)  # 0: off; 1 KB: 8 vectors of 32 floats, fewer than 20
    sqlite = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32))
    memory = MemoryStore(embedder=HashEmbedder(32))
    try:
        for n in range(20):
            for store in (sqlite, memory):
                await store.put_item(
                    ("mem", f"u{n % 10}"),
                    f"k{n}",
                    {"text": _text(n), "kind": "ab"[n % 2]},
                    owner=f"o{n % 3}",
                )
        await _same_answers(sqlite, memory)
        cache = cache_for(sqlite.db)
        assert cache is not None and cache.generation is None and cache.size == 0
    finally:
        await sqlite.close()


async def test_without_numpy_the_file_is_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loom.store.sqlite_vector_cache as vector_cache

    monkeypatch.setattr(vector_cache, "HAVE_NUMPY", False)
    sqlite = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32))
    memory = MemoryStore(embedder=HashEmbedder(32))
    try:
        for n in range(20):
            for store in (sqlite, memory):
                await store.put_item(
                    ("mem", f"u{n % 10}"),
                    f"k{n}",
                    {"text": _text(n), "kind": "ab"[n % 2]},
                    owner=f"o{n % 3}",
                )
        for store in (sqlite, memory):
            await store.delete_item(("mem", "u1"), "k1")
        await _same_answers(sqlite, memory)
        assert cache_for(sqlite.db) is None
    finally:
        await sqlite.close()


async def test_a_bad_cap_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.errors import ConfigurationError

    monkeypatch.setenv(CACHE_ENV, "lots")
    store = SQLiteStore(tmp_path / "loom.db", embedder=HashEmbedder(32))
    try:
        await store.put_item(("mem",), "a", {"text": "tea"})
        with pytest.raises(ConfigurationError, match=CACHE_ENV):
            await store.search_items(("mem",), query="tea", mode="semantic")
    finally:
        await store.close()
