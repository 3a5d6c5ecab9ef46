"""``loom schedule`` and ``loom monitors`` on a real database file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from loom.cli import app


def test_schedule_commands(tmp_path: Path) -> None:
    db = str(tmp_path / "loom.db")
    import asyncio

    from loom.store import SQLiteStore

    asyncio.run(SQLiteStore(db).close())  # the CLI never creates a database
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "schedule",
            "add",
            "echo",
            "hi",
            "--cron",
            "0 9 * * *",
            "--tz",
            "Europe/Berlin",
            "--id",
            "daily",
            "--store",
            db,
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["schedule", "add", "echo", "hi", "--cron", "0 25 * * *", "--store", db])
    assert r.exit_code == 2 and "cron" in r.output
    r = runner.invoke(app, ["schedule", "list", "--json", "--store", db])
    [row] = json.loads(r.output)
    assert (row["id"], row["timezone"], row["enabled"]) == ("daily", "Europe/Berlin", True)
    assert runner.invoke(app, ["schedule", "pause", "daily", "--store", db]).exit_code == 0
    r = runner.invoke(app, ["schedule", "show", "daily", "--json", "--store", db])
    assert json.loads(r.output)["enabled"] is False
    assert runner.invoke(app, ["schedule", "resume", "daily", "--store", db]).exit_code == 0
    assert runner.invoke(app, ["schedule", "rm", "daily", "--store", db]).exit_code == 0
    r = runner.invoke(app, ["schedule", "show", "daily", "--store", db])
    assert r.exit_code == 2 and "daily" in r.output
    r = runner.invoke(app, ["monitors", "list", "--json", "--store", db])
    assert r.exit_code == 0 and json.loads(r.output) == []
    r = runner.invoke(app, ["monitors", "show", "nope", "--store", db])
    assert r.exit_code == 2 and "nope" in r.output
