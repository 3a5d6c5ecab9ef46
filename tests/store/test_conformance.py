"""Both built-in stores pass the Store conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loom.store import MemoryStore, SQLiteStore
from loom.store.conformance import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        s = MemoryStore()
        yield s
        await s.close()


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(tmp_path / "loom.db")
        yield s
        await s.close()


class TestSQLiteStoreThreadedFull(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
        s = SQLiteStore(tmp_path / "loom.db", durability="full", threaded=True)
        yield s
        await s.close()
