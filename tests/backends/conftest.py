"""Fixtures for the backend tests: a real SQLite file and a real PostgreSQL schema holding the
same tables, one of them (``secret``) outside every allow-list."""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("sqlglot")

SECRET = "s3cr3t-value"
ALLOWED = ["users", "orgs", "v_users"]

_SQLITE_SETUP = f"""
CREATE TABLE orgs(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                   org_id INTEGER REFERENCES orgs(id));
CREATE TABLE secret(k TEXT);
INSERT INTO orgs VALUES (1, 'acme'), (2, 'globex');
INSERT INTO users VALUES (1, 'ann', 1), (2, 'bob', 1), (3, 'cid', 2);
INSERT INTO secret VALUES ('{SECRET}');
CREATE VIEW v_users AS SELECT u.name AS name, o.name AS org
    FROM users u JOIN orgs o ON o.id = u.org_id;
CREATE VIEW v_leak AS SELECT k FROM secret;
"""


@dataclass
class Database:
    url: str
    dialect: str
    path: Path | None = None  # the SQLite file
    pg_dsn: str | None = None
    schema: str | None = None

    def digest(self) -> str:
        """A fingerprint of everything in the database (file bytes; PG: all rows + catalog)."""
        if self.path is not None:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        import psycopg

        with psycopg.connect(self.pg_dsn or "", autocommit=True) as conn:
            rows = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall()
            data = [str(rows)]
            for sch, tab in rows:
                data.append(
                    str(conn.execute(f'SELECT * FROM "{sch}"."{tab}" ORDER BY 1').fetchall())
                )
            return hashlib.sha256("".join(data).encode()).hexdigest()


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> Database:
    path = tmp_path_factory.mktemp("sqldb") / "shop.db"
    conn = sqlite3.connect(path)
    conn.executescript(_SQLITE_SETUP)
    conn.commit()
    conn.close()
    return Database(f"sqlite:///{path}", "sqlite", path=path)


def _pg_url(dsn: str) -> str:
    parts = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql+psycopg://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@pytest.fixture(scope="module")
def pg_db(postgres_dsn: str) -> Iterator[Database]:
    import psycopg

    schema = f"bk_{secrets.token_hex(5)}"
    other = f"{schema}_other"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}; CREATE SCHEMA {other}")
        conn.execute(f"SET search_path = {schema}")
        conn.execute(
            "CREATE TABLE orgs(id INTEGER PRIMARY KEY, name TEXT NOT NULL);"
            "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "org_id INTEGER REFERENCES orgs(id));"
            "CREATE TABLE secret(k TEXT);"
            'CREATE TABLE "Users"(k TEXT);'
            "CREATE SEQUENCE seq;"
            "INSERT INTO orgs VALUES (1, 'acme'), (2, 'globex');"
            "INSERT INTO users VALUES (1, 'ann', 1), (2, 'bob', 1), (3, 'cid', 2);"
            f"INSERT INTO secret VALUES ('{SECRET}');"
            f"INSERT INTO \"Users\" VALUES ('{SECRET}');"
            "CREATE VIEW v_users AS SELECT u.name AS name, o.name AS org FROM users u "
            "JOIN orgs o ON o.id = u.org_id;"
            "CREATE VIEW v_leak AS SELECT k FROM secret;"
            "COMMENT ON TABLE users IS 'people who log in';"
            "CREATE FUNCTION leak() RETURNS text LANGUAGE sql AS $$ SELECT k FROM secret $$;"
            f"CREATE TABLE {other}.hidden(k TEXT); INSERT INTO {other}.hidden VALUES ('{SECRET}');"
        )
    yield Database(_pg_url(postgres_dsn), "postgres", pg_dsn=postgres_dsn, schema=schema)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE; DROP SCHEMA {other} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"], scope="module")
def database(request: pytest.FixtureRequest) -> Database:
    db: Database = request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")
    return db
