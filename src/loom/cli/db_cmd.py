"""`loom db`: apply migrations and show the state of a Loom database (SQLite file or PostgreSQL).

    loom db migrate --store postgresql://loom@db/loom
    loom db status --store .loom/loom.db --json

An unreachable or unusable database exits with code 2 and a one-line reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from loom.cli._console import emit_json, fail, out

app = typer.Typer(help="Migrate and inspect the session database.", no_args_is_help=True)

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="A postgres:// or postgresql:// URL, or a SQLite file (default .loom/loom.db).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def is_postgres(spec: str | None) -> bool:
    """Whether ``--store`` names a PostgreSQL database (a URL) rather than a SQLite file."""
    return spec is not None and spec.startswith(("postgres://", "postgresql://"))


async def _sqlite_status(path: Path) -> dict[str, Any]:
    import time

    from loom.store import sqlite_db
    from loom.store.sqlite import SQLiteStore

    store = SQLiteStore(path)  # opening applies missing migrations
    try:
        await store.list_sessions(limit=1)
    finally:
        await store.close()
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        applied = conn.execute(
            "SELECT version, name, applied_at FROM loom_migrations ORDER BY version"
        ).fetchall()
        sessions, open_runs = conn.execute(
            "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM open_runs)"
        ).fetchone()
        held = conn.execute(
            "SELECT count(*) FROM locks WHERE NOT released AND expires_at > ?", (time.time(),)
        ).fetchone()[0]
    finally:
        conn.close()
    from datetime import UTC, datetime

    return {
        "backend": "sqlite",
        "database": str(path),
        "schema_version": max((int(v) for v, _, _ in applied), default=0),
        "known_version": sqlite_db.SCHEMA_VERSION,
        "migrations": [
            {"version": int(v), "name": n, "applied_at": datetime.fromtimestamp(t, UTC).isoformat()}
            for v, n, t in applied
        ],
        "sessions": int(sessions),
        "open_runs": int(open_runs),
        "held_leases": int(held),
    }


async def _status(spec: str | None, *, create: bool) -> dict[str, Any]:
    from loom.errors import StoreError

    if is_postgres(spec):
        from loom.store.postgres import PostgresStore

        store = PostgresStore(str(spec), min_size=0, max_size=1)
        try:
            return await store.status()  # connecting applies missing migrations
        finally:
            await store.close()
    path = Path(spec) if spec else Path(".loom") / "loom.db"
    if not path.exists():
        if not create:
            raise StoreError(
                f"no Loom database at {path}; `loom db migrate --store {path}` creates one"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
    return await _sqlite_status(path)


def _show(status: dict[str, Any]) -> None:
    out.print(f"database        {status['database']} ({status['backend']})")
    out.print(
        f"schema version  {status['schema_version']} (this Loom knows {status['known_version']})"
    )
    for m in status["migrations"]:
        out.print(f"  {m['version']:>3}  {m['name']}  applied {m['applied_at']}")
    out.print(f"sessions        {status['sessions']}")
    out.print(f"open runs       {status['open_runs']}")
    out.print(f"held leases     {status['held_leases']}")


@app.command("migrate")
def migrate(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Create the database's tables or apply the migrations it lacks (safe to run again,
    and from several processes at once)."""
    from loom.errors import LoomError

    try:
        status = asyncio.run(_status(store, create=True))
    except LoomError as exc:
        raise fail(exc, 2) from None
    if as_json:
        emit_json(status)
    else:
        out.print(f"migrated: schema version {status['schema_version']}")
        _show(status)


@app.command("status")
def status(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Schema version, migrations applied, sessions, open runs and held leases."""
    from loom.errors import LoomError

    try:
        result = asyncio.run(_status(store, create=False))
    except LoomError as exc:
        raise fail(exc, 2) from None
    if as_json:
        emit_json(result)
    else:
        _show(result)
