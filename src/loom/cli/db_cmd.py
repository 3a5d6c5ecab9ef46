"""`loom db`: apply migrations and show the state of a Loom database (SQLite file or PostgreSQL).

``migrate`` creates the database or applies the migrations it lacks; ``status`` only reads (it
never creates a table or a file) and exits 1 when migrations are missing.

    loom db migrate --store postgresql://loom@db/loom
    loom db status --store .loom/loom.db --json

An unreachable or unusable database exits with code 2 and a one-line reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from loom.cli._console import emit_json, err, fail, out

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


def _sqlite_status(path: Path, *, migrate: bool) -> dict[str, Any]:
    import sqlite3
    import time
    from datetime import UTC, datetime

    from loom.store import sqlite_db

    if migrate:
        from loom.store.sqlite import SQLiteStore

        async def open_once() -> None:
            store = SQLiteStore(path)  # opening applies missing migrations
            try:
                await store.list_sessions(limit=1)
            finally:
                await store.close()

        asyncio.run(open_once())
    # read-only: `loom db status` must never create or change the database it reports on
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        has = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='loom_migrations'"
        ).fetchone()[0]
        applied = (
            conn.execute(
                "SELECT version, name, applied_at FROM loom_migrations ORDER BY version"
            ).fetchall()
            if has
            else []
        )
        version = max((int(v) for v, _, _ in applied), default=0)
        counts: tuple[int | None, ...] = (None, None, None)
        if version >= sqlite_db.SCHEMA_VERSION:
            sessions, open_runs = conn.execute(
                "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM open_runs)"
            ).fetchone()
            held = conn.execute(
                "SELECT count(*) FROM locks WHERE NOT released AND expires_at > ?", (time.time(),)
            ).fetchone()[0]
            counts = (int(sessions), int(open_runs), int(held))
    except sqlite3.DatabaseError as exc:
        from loom.errors import StoreError

        raise StoreError(f"{path} is not a Loom database this version can read ({exc})") from exc
    finally:
        conn.close()
    return {
        "backend": "sqlite",
        "database": str(path),
        "schema_version": version,
        "known_version": sqlite_db.SCHEMA_VERSION,
        "migrations": [
            {"version": int(v), "name": n, "applied_at": datetime.fromtimestamp(t, UTC).isoformat()}
            for v, n, t in applied
        ],
        "sessions": counts[0],
        "open_runs": counts[1],
        "held_leases": counts[2],
    }


def _status(spec: str | None, *, migrate: bool) -> dict[str, Any]:
    """The database's state; ``migrate`` creates it or applies missing migrations first
    (``loom db migrate``), otherwise nothing is created or changed (``loom db status``)."""
    from loom.errors import StoreError

    if is_postgres(spec):
        from loom.store.postgres import PostgresStore

        async def read() -> dict[str, Any]:
            store = PostgresStore(str(spec), min_size=0, max_size=1)
            try:
                return await (store.status() if migrate else store.inspect())
            finally:
                await store.close()

        return asyncio.run(read())
    path = Path(spec) if spec else Path(".loom") / "loom.db"
    if not path.exists():
        if not migrate:
            raise StoreError(
                f"no Loom database at {path}; `loom db migrate --store {path}` creates one"
            )
        if spec is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise StoreError(
                f"the folder {path.parent} does not exist; create it first (Loom does not make "
                "folders for a --store path you name)"
            )
    return _sqlite_status(path, migrate=migrate)


def _show(status: dict[str, Any]) -> None:
    out.print(f"database        {status['database']} ({status['backend']})")
    out.print(
        f"schema version  {status['schema_version']} (this Loom knows {status['known_version']})"
    )
    for m in status["migrations"]:
        out.print(f"  {m['version']:>3}  {m['name']}  applied {m['applied_at']}")
    if status["sessions"] is None:
        return
    out.print(f"sessions        {status['sessions']}")
    out.print(f"open runs       {status['open_runs']}")
    out.print(f"held leases     {status['held_leases']}")


@app.command("migrate")
def migrate(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Create the database's tables or apply the migrations it lacks (safe to run again,
    and from several processes at once)."""
    from loom.errors import LoomError

    try:
        status = _status(store, migrate=True)
    except LoomError as exc:
        raise fail(exc, 2) from None
    if as_json:
        emit_json(status)
    else:
        out.print(f"migrated: schema version {status['schema_version']}")
        _show(status)


@app.command("status")
def status(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Schema version, migrations applied, sessions, open runs and held leases. Only reads:
    exits 1 when the database lacks migrations this Loom knows (run `loom db migrate`)."""
    from loom.errors import LoomError

    try:
        result = _status(store, migrate=False)
    except LoomError as exc:
        raise fail(exc, 2) from None
    behind = result["schema_version"] < result["known_version"]
    if as_json:
        emit_json({**result, "migrated": not behind})
    else:
        _show(result)
    if behind:
        where = f" --store {store}" if store else ""
        err.print(
            f"not migrated: schema version {result['schema_version']} of "
            f"{result['known_version']}; run `loom db migrate{where}`"
        )
        raise typer.Exit(code=1)
