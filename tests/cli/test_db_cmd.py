"""`loom db migrate` / `loom db status` on SQLite and on a private PostgreSQL cluster, and the
CLI's other commands reading a PostgreSQL store through a postgres:// URL."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from loom.cli import app

runner = CliRunner()


@pytest.fixture
def pg_url(postgres_dsn: str) -> str:
    """A postgresql:// URL whose tables go to a fresh schema of the test cluster."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    schema = f"c_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    p = conninfo_to_dict(postgres_dsn)
    opts = quote(f"-csearch_path={schema}")
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}?options={opts}"


def test_sqlite_migrate_then_status(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["db", "status", "--store", str(db)])
    assert r.exit_code == 2 and "no Loom database" in r.output and not db.exists()
    r = runner.invoke(app, ["db", "migrate", "--store", str(db)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["db", "status", "--store", str(db), "--json"])
    status = json.loads(r.output)
    assert status["backend"] == "sqlite"
    assert status["schema_version"] == status["known_version"] == len(status["migrations"])
    assert (status["sessions"], status["open_runs"], status["held_leases"]) == (0, 0, 0)


def test_postgres_migrate_status_and_sessions(pg_url: str) -> None:
    r = runner.invoke(app, ["db", "migrate", "--store", pg_url, "--json"])
    assert r.exit_code == 0, r.output
    status = json.loads(r.output)
    assert status["backend"] == "postgresql"
    assert [m["name"] for m in status["migrations"]] == [
        "0001_initial",
        "0002_append_ids",
        "0003_schedules",
        "0004_append_function",
        "0005_approval_events_index",
        "0006_schedule_principals",
        "0007_system_messages_index",
        "0008_append_many",
        "0009_media",
        "0010_session_forks",
        "0011_items",
        "0012_budgets",
        "0013_item_vectors",
    ]
    assert status["schema_version"] == status["known_version"] == 13

    # A session, an open run and a held lease, written by a store, show up in the counts.
    import asyncio

    from loom.store.base import RunRecord
    from loom.store.postgres import PostgresStore

    async def seed() -> None:
        store = PostgresStore(pg_url)
        try:
            lease = await store.acquire_lease("s1", "run_1", 60)
            assert lease is not None
            await store.append("s1", run=RunRecord("run_1", "s1", "running"), lease=lease)
        finally:
            await store.close()

    asyncio.run(seed())
    r = runner.invoke(app, ["db", "status", "--store", pg_url, "--json"])
    status = json.loads(r.output)
    assert (status["sessions"], status["open_runs"], status["held_leases"]) == (1, 1, 1)
    r = runner.invoke(app, ["db", "status", "--store", pg_url], env={"COLUMNS": "200"})
    assert (
        r.exit_code == 0
        and "held leases     1" in r.output
        and "0005_approval_events_index" in r.output
    )
    # `loom sessions list` reads the same database through the URL.
    r = runner.invoke(app, ["sessions", "list", "--store", pg_url, "--json"])
    assert r.exit_code == 0, r.output
    assert "s1" in r.output


def test_postgres_status_only_reads(pg_url: str, postgres_dsn: str) -> None:
    """`db status` on a database Loom never migrated creates nothing and exits 1, naming
    `loom db migrate`; after the migration it exits 0."""
    from urllib.parse import unquote

    import psycopg

    schema = unquote(pg_url.split("search_path%3D", 1)[1]) if "%3D" in pg_url else None
    schema = schema or unquote(pg_url).split("search_path=", 1)[1]

    def tables() -> int:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchone()
            assert row is not None
            return int(row[0])

    r = runner.invoke(app, ["db", "status", "--store", pg_url], env={"COLUMNS": "300"})
    assert r.exit_code == 1, r.output
    assert "not migrated" in r.output and "loom db migrate" in r.output
    assert tables() == 0
    r = runner.invoke(app, ["db", "status", "--store", pg_url, "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["migrated"] is False
    assert runner.invoke(app, ["db", "migrate", "--store", pg_url]).exit_code == 0
    assert tables() > 0
    r = runner.invoke(app, ["db", "status", "--store", pg_url, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["migrated"] is True


def test_sqlite_status_only_reads(tmp_path: Path) -> None:
    """An existing SQLite file Loom never migrated: status exits 1 and leaves it untouched."""
    import sqlite3

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE mine (x)")
    before = db.read_bytes()
    r = runner.invoke(app, ["db", "status", "--store", str(db)], env={"COLUMNS": "300"})
    assert r.exit_code == 1 and "loom db migrate" in r.output, r.output
    assert db.read_bytes() == before


def test_a_store_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    """`--store` naming a file in a folder that does not exist: exit 2, no folder made."""
    db = tmp_path / "nope" / "deeper" / "x.db"
    r = runner.invoke(app, ["db", "migrate", "--store", str(db)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "does not exist" in r.output, r.output
    assert not db.parent.parent.exists()


def test_unreachable_postgres_exits_2_with_the_reason() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"postgresql://loom:secret@127.0.0.1:{port}/loom"
    for command in ("status", "migrate"):
        r = runner.invoke(app, ["db", command, "--store", url], env={"COLUMNS": "300"})
        assert r.exit_code == 2
        assert "StoreError" in r.output and "cannot connect to PostgreSQL" in r.output
        assert "secret" not in r.output
