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


def test_update_runs_monitors_and_readable_times(tmp_path: Path) -> None:
    """`schedule update`, `schedule runs` of an unknown id, `monitors add|checkin|rm`, and show
    output with UTC times and '-' instead of epoch floats and None; long ids are not cut."""
    import asyncio

    from loom.store import SQLiteStore

    db = str(tmp_path / "loom.db")
    asyncio.run(SQLiteStore(db).close())
    runner = CliRunner()
    long_id = "nightly-" + "x" * 90
    r = runner.invoke(
        app, ["schedule", "add", "echo", "hi", "--every", "3600", "--id", long_id, "--store", db]
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["schedule", "list", "--store", db], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and long_id in r.output, r.output
    r = runner.invoke(
        app,
        [
            "schedule",
            "update",
            long_id,
            "--message",
            "bye",
            "--cron",
            "0 6 * * *",
            "--store",
            db,
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    changed = json.loads(r.output)
    assert (changed["message"], changed["cron"], changed["interval"]) == ("bye", "0 6 * * *", None)
    r = runner.invoke(app, ["schedule", "update", long_id, "--store", db])
    assert r.exit_code == 2 and "nothing to change" in r.output
    r = runner.invoke(app, ["schedule", "update", "ghost", "--message", "x", "--store", db])
    assert r.exit_code == 2 and "ghost" in r.output
    r = runner.invoke(app, ["schedule", "runs", "NOSUCH", "--store", db])
    assert r.exit_code == 2 and "NOSUCH" in r.output
    r = runner.invoke(app, ["schedule", "show", long_id, "--store", db], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "None" not in r.output and "next_fire_at: 20" in r.output and " UTC" in r.output
    r = runner.invoke(
        app,
        [
            "monitors",
            "add",
            "--cron",
            "0 * * * *",
            "--id",
            "hourly",
            "--max-runtime",
            "60",
            "--store",
            db,
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["monitors", "add", "--store", db])
    assert r.exit_code == 2 and "exactly one" in r.output
    r = runner.invoke(app, ["monitors", "checkin", "hourly", "ok", "--store", db, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["health"] == "ok", r.output
    r = runner.invoke(app, ["monitors", "checkin", "hourly", "fine", "--store", db])
    assert r.exit_code == 2 and "status" in r.output
    r = runner.invoke(app, ["monitors", "show", "hourly", "--store", db], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "None" not in r.output and "last_checkin_at: 20" in r.output
    assert runner.invoke(app, ["monitors", "rm", "hourly", "--store", db]).exit_code == 0
    r = runner.invoke(app, ["monitors", "rm", "hourly", "--store", db])
    assert r.exit_code == 2 and "hourly" in r.output


def test_schedule_add_without_a_database_points_at_db_migrate(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app,
        ["schedule", "add", "echo", "hi", "--every", "60", "--store", str(tmp_path / "no.db")],
        env={"COLUMNS": "300"},
    )
    assert r.exit_code == 2 and "loom db migrate" in r.output, r.output
