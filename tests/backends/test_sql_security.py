"""Escape attempts against the SQL backend, on a real SQLite file and a real PostgreSQL
schema: every one is refused (``BackendRefused``, nothing ran) or bounded (stopped by the
deadline or the row limit), and afterwards the database is byte-for-byte (SQLite) or
row-for-row (PostgreSQL) what it was, and the secret never appeared in any result."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.backends.sql import SQLBackend
from loom.errors import BackendRefused, ToolError

from .conftest import ALLOWED, SECRET, Database

EVIL = "/tmp/loom-backend-evil.db"

# (id, sql) refused on both databases by the statement checks
REFUSED_BOTH = [
    ("direct", "SELECT * FROM secret"),
    ("casing", "SELECT * FROM SeCrEt"),
    ("quoted", 'SELECT * FROM "secret"'),
    ("schema-qualified-other", "SELECT * FROM other.hidden"),
    ("view-over-secret", "SELECT * FROM v_leak"),
    ("cte-body", "WITH users AS (SELECT k AS name FROM secret) SELECT * FROM users"),
    ("cte-nonrecursive-self", "WITH secret AS (SELECT * FROM secret) SELECT * FROM secret"),
    ("subquery-select", "SELECT (SELECT k FROM secret LIMIT 1) FROM users"),
    ("subquery-where", "SELECT * FROM users WHERE EXISTS (SELECT 1 FROM secret)"),
    ("subquery-from", "SELECT * FROM (SELECT * FROM secret) AS s"),
    ("union", "SELECT name FROM users UNION SELECT k FROM secret"),
    ("join", "SELECT * FROM users JOIN secret ON 1 = 1"),
    ("comment-hidden", "SELECT * FROM users /* harmless */ UNION SELECT k FROM secret"),
    ("line-comment", "SELECT name FROM users -- only users\nUNION SELECT k FROM secret"),
    ("two-statements", "SELECT 1; SELECT * FROM secret"),
    ("two-statements-write", "SELECT * FROM users; DELETE FROM users"),
    ("insert", "INSERT INTO users VALUES (9, 'eve', 1)"),
    ("update", "UPDATE users SET name = 'eve'"),
    ("delete", "DELETE FROM users"),
    ("drop", "DROP TABLE users"),
    ("create", "CREATE TABLE t(x INTEGER)"),
    ("create-view", "CREATE VIEW v2 AS SELECT * FROM secret"),
    ("alter", "ALTER TABLE users ADD COLUMN x INTEGER"),
    ("data-modifying-cte", "WITH d AS (DELETE FROM users RETURNING *) SELECT * FROM d"),
    ("select-into", "SELECT * INTO stolen FROM users"),
    ("explain-write", "EXPLAIN DELETE FROM users"),
    ("explain-secret", "EXPLAIN SELECT * FROM secret"),
    ("pragma-writable-schema", "PRAGMA writable_schema = 1"),
    ("attach", f"ATTACH DATABASE '{EVIL}' AS evil"),
    ("load-extension", "SELECT load_extension('/tmp/evil.so')"),
    ("readfile", "SELECT readfile('/etc/passwd')"),
    ("catalog-sqlite", "SELECT sql FROM sqlite_master"),
    ("pragma-function", "SELECT * FROM pragma_table_info('secret')"),
    ("information-schema", "SELECT * FROM information_schema.tables"),
    ("pg-catalog", "SELECT * FROM pg_catalog.pg_tables"),
    ("pg-read-file", "SELECT pg_read_file('/etc/passwd')"),
    ("pg-sleep", "SELECT pg_sleep(30)"),
    ("query-to-xml", "SELECT query_to_xml('SELECT * FROM secret', true, true, '')"),
    ("set-config", "SELECT set_config('search_path', 'other', false)"),
    ("nextval", "SELECT nextval('seq')"),
    ("transaction", "COMMIT"),
    ("vacuum-into", f"VACUUM INTO '{EVIL}'"),
    ("copy", "COPY users TO '/tmp/loom-backend-evil.csv'"),
    ("empty", "   "),
    ("garbage", "SELEC * FORM users"),
    # one long call inside the database (no deadline stops it): sizes are bounded at the check
    ("printf-star-width", "SELECT length(printf('%.*c', 1000000000, 'x'))"),
    ("format-huge-width", "SELECT length(format('%1000000000s', 'x'))"),
    ("printf-computed-format", "SELECT printf(name) FROM users"),
]
REFUSED_PG = [
    ("quoted-case", 'SELECT * FROM "Users"'),
    ("user-function", "SELECT leak()"),
    ("do-block", "DO $$ BEGIN DELETE FROM users; END $$"),
    ("set-role", "SET ROLE postgres"),
    ("for-update", "SELECT * FROM users FOR UPDATE"),
    ("table-shorthand", "TABLE secret"),
    ("only", "SELECT * FROM ONLY secret"),
    # catalog probes: they say whether a table outside the list exists
    ("regclass-cast", "SELECT 'secret'::regclass"),
    ("regclass-cast-qualified", "SELECT CAST('other.hidden' AS pg_catalog.regclass)"),
    ("regclass-oid", "SELECT 'secret'::regclass::oid"),
    ("to-regclass", "SELECT to_regclass('secret') IS NOT NULL"),
    ("to-regnamespace", "SELECT to_regnamespace('other')"),
    ("table-privilege", "SELECT has_table_privilege('secret', 'select')"),
    ("repeat-huge", "SELECT length(repeat('x', 1000000000))"),
    ("lpad-computed", "SELECT lpad(name, id * 1000000000) FROM users"),
]
REFUSED_SQLITE = [
    ("bracket-quoted", "SELECT * FROM [secret]"),
    ("backtick-quoted", "SELECT * FROM `secret`"),
    ("main-qualified", "SELECT * FROM main.secret"),
    ("temp-schema", "SELECT * FROM temp.users"),
    ("replace-into", "REPLACE INTO users VALUES (1, 'eve', 1)"),
    ("detach", "DETACH DATABASE main"),
]
BOUNDED = [
    (
        "recursive-cte-count",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    ),
    (
        "recursive-cte-rows",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
    ),
    (
        "cross-join-bomb",
        "SELECT count(*) FROM users a, users b, users c, users d, users e, "
        "users f, users g, users h, users i, users j, users k, users l, users m, users n, users o, "
        "users p, users q, users r, users s, users t",
    ),
    ("huge-limit", "SELECT * FROM users LIMIT 1000000"),
]


def _backend(db: Database, **kw: object) -> SQLBackend:
    return SQLBackend(db.url, tables=ALLOWED, schema=db.schema, timeout=1.0, max_rows=50, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def guarded(database: Database) -> SQLBackend:
    b = _backend(database)
    yield b
    b.close()


def _attempts(dialect: str) -> list[tuple[str, str]]:
    return REFUSED_BOTH + (REFUSED_PG if dialect == "postgres" else REFUSED_SQLITE)


def test_the_suite_has_at_least_forty_attempts_per_database() -> None:
    assert len(REFUSED_BOTH) + len(REFUSED_SQLITE) + len(BOUNDED) >= 40
    assert len(REFUSED_BOTH) + len(REFUSED_PG) + len(BOUNDED) >= 40


def test_every_escape_attempt_is_refused_and_nothing_changed(
    database: Database, guarded: SQLBackend
) -> None:
    before = database.digest()
    query = {t.name: t for t in guarded.tools()}["query"]
    leaked, ran = [], []
    for name, sql in _attempts(database.dialect):
        try:
            out = query.fn(sql)  # type: ignore[attr-defined]
        except BackendRefused:
            continue
        ran.append(name)
        if SECRET in out:
            leaked.append(name)
    assert not leaked, f"secret leaked by {leaked}"
    assert not ran, f"not refused: {ran}"
    assert database.digest() == before
    assert not Path(EVIL).exists()


def test_time_bombs_are_bounded_by_the_deadline_or_the_row_limit(
    database: Database, guarded: SQLBackend
) -> None:
    query = {t.name: t for t in guarded.tools()}["query"]
    for name, sql in BOUNDED:
        try:
            out = query.fn(sql)  # type: ignore[attr-defined]
        except ToolError as exc:
            assert exc.code == "timeout", (name, exc)
            continue
        rows = out.splitlines()[1:-1]
        assert len(rows) <= 50, name
    # the recursive count never finishes: only the deadline can stop it
    with pytest.raises(ToolError) as info:
        query.fn(BOUNDED[0][1])  # type: ignore[attr-defined]
    assert info.value.code == "timeout"


def test_one_long_call_ends_by_the_deadline_with_a_typed_error(sqlite_db: Database) -> None:
    """SQLite's progress handler does not run inside one C call: a statement that builds a
    huge value in one call is refused at the check, or stopped by the size limit, well before
    the deadline (it used to run 30 s past it and allocate 1 GB)."""
    import time

    b = SQLBackend(sqlite_db.url, tables=ALLOWED, timeout=3.0)
    query = {t.name: t for t in b.tools()}["query"]
    started = time.monotonic()
    with pytest.raises(BackendRefused, match="printf"):
        query.fn("SELECT length(printf('%.*c', 1000000000, 'x'))")  # type: ignore[attr-defined]
    thousand = "printf('%.1000c', 'x')"
    grows = f"replace(replace({thousand}, 'x', {thousand}), 'x', {thousand})"  # 10^9 bytes
    with pytest.raises(ToolError) as info:
        query.fn(f"SELECT length({grows})")  # type: ignore[attr-defined]
    assert info.value.code == "too_large" and "bytes" in str(info.value)
    assert time.monotonic() - started < 3.0
    ok = query.fn("SELECT printf('%5d:%.2f', 7, 1.5) AS v")  # type: ignore[attr-defined]
    assert "    7:1.50" in ok
    b.close()


def test_allowed_reads_work_through_views_ctes_and_subqueries(guarded: SQLBackend) -> None:
    query = {t.name: t for t in guarded.tools()}["query"]
    out = query.fn("SELECT name, org FROM v_users ORDER BY name")  # type: ignore[attr-defined]
    assert out.splitlines() == [
        "name | org",
        "ann | acme",
        "bob | acme",
        "cid | globex",
        "(3 rows)",
    ]
    out = query.fn(  # type: ignore[attr-defined]
        "WITH a AS (SELECT * FROM users WHERE org_id IN (SELECT id FROM orgs WHERE name = 'acme')) "
        "SELECT count(*) AS n FROM a"
    )
    assert out.splitlines()[1] == "2"
    out = query.fn("SELECT * FROM USERS")  # type: ignore[attr-defined]  # casing of an allowed name
    assert "(3 rows)" in out


def test_a_row_limit_is_added_and_the_result_says_rows_were_cut(database: Database) -> None:
    b = _backend(database)
    b.max_rows = 2
    b._scope = None  # reopen with the smaller limit
    b.open()
    query = {t.name: t for t in b.tools()}["query"]
    assert "LIMIT 3" in b.check("SELECT * FROM users").sql
    out = query.fn("SELECT * FROM users ORDER BY id")  # type: ignore[attr-defined]
    assert out.splitlines()[1:3] == ["1 | ann | 1", "2 | bob | 1"]
    assert "stopped at the row limit of 2" in out
    b.close()


def test_views_not_on_the_list_and_leaky_views_are_refused_at_configuration(
    database: Database,
) -> None:
    from loom.errors import BackendConfigError

    with pytest.raises(BackendConfigError, match="v_leak"):
        SQLBackend(database.url, tables=["users", "v_leak"], schema=database.schema)
    with pytest.raises(BackendConfigError, match="does not exist"):
        SQLBackend(database.url, tables=["nope"], schema=database.schema)


def test_execute_writes_only_allowed_tables_when_enabled(database: Database) -> None:
    b = SQLBackend(
        database.url, tables=["orgs"], schema=database.schema, read_only=False, allow_execute=True
    )
    tools = {t.name: t for t in b.tools()}
    assert tools["execute"].effect == "at_most_once" and tools["query"].effect == "pure"
    with pytest.raises(BackendRefused):
        tools["execute"].fn("DELETE FROM secret")  # type: ignore[attr-defined]
    with pytest.raises(BackendRefused):
        tools["execute"].fn("DROP TABLE orgs")  # type: ignore[attr-defined]
    with pytest.raises(BackendRefused):  # query stays read-only even on a writable backend
        tools["query"].fn("UPDATE orgs SET name = 'x'")  # type: ignore[attr-defined]
    assert tools["execute"].fn("UPDATE orgs SET name = 'acme' WHERE id = 1") == "1 row changed"  # type: ignore[attr-defined]
    b.close()


def test_read_only_backends_offer_no_execute(guarded: SQLBackend) -> None:
    names = [t.name for t in guarded.tools()]
    assert names == ["list_tables", "describe_table", "sample_rows", "query"]
    assert all(t.effect == "pure" for t in guarded.tools())
