"""PostgresStore: the conformance suite on a private PostgreSQL 15 cluster, plus leases across
processes, a full agent run, crash recovery, bounded reads and bad input.

The cluster is the session-scoped ``postgres_dsn`` fixture (tests/conftest.py); every test gets
a schema of its own (``pg_schema_dsn``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from loom.store.conformance import StoreContract  # noqa: E402
from loom.store.postgres import PostgresStore  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="session")


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, pg_schema_dsn: str) -> AsyncIterator[PostgresStore]:
        s = PostgresStore(pg_schema_dsn, min_size=1, max_size=4)
        yield s
        await s.close()
