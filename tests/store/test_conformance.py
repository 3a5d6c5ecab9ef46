"""Both built-in stores pass the Store conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from loom.embedding import Embedder
from loom.store import MemoryStore, SQLiteStore
from loom.store.conformance import StoreContract


class TestMemoryStore(StoreContract):
    vectors_persist = False  # a new MemoryStore is a new, empty store

    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        s = MemoryStore()
        yield s
        await s.close()

    @pytest.fixture
    def open_vector_store(self) -> Callable[[Embedder], Awaitable[MemoryStore]]:
        async def open_one(embedder: Embedder) -> MemoryStore:
            return MemoryStore(embedder=embedder)

        return open_one


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(tmp_path / "loom.db")
        yield s
        await s.close()

    @pytest.fixture
    async def open_vector_store(
        self, tmp_path: Path
    ) -> AsyncIterator[Callable[[Embedder], Awaitable[SQLiteStore]]]:
        opened: list[SQLiteStore] = []

        async def open_one(embedder: Embedder) -> SQLiteStore:
            opened.append(SQLiteStore(tmp_path / "vectors.db", embedder=embedder))
            return opened[-1]

        yield open_one
        for s in opened:
            await s.close()


class TestSQLiteStoreThreadedFull(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(tmp_path / "loom.db", durability="full", threaded=True)
        yield s
        await s.close()

    @pytest.fixture
    async def open_vector_store(
        self, tmp_path: Path
    ) -> AsyncIterator[Callable[[Embedder], Awaitable[SQLiteStore]]]:
        opened: list[SQLiteStore] = []

        async def open_one(embedder: Embedder) -> SQLiteStore:
            path = tmp_path / "vectors.db"
            opened.append(SQLiteStore(path, durability="full", threaded=True, embedder=embedder))
            return opened[-1]

        yield open_one
        for s in opened:
            await s.close()
