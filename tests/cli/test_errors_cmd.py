"""`loom errors list/show/cleanup`."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.messages import utcnow
from loom.store import SQLiteStore
from loom.store.base import StoredError, new_error_id

runner = CliRunner()


@pytest.fixture
def ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".loom").mkdir()

    async def fill() -> list[str]:
        s = SQLiteStore(tmp_path / ".loom" / "loom.db")
        old = utcnow() - timedelta(days=45)
        out = [
            await s.save_error(
                StoredError(
                    new_error_id(old), "s1", "fetch", {"message": "old one"}, "old one", old
                )
            ),
            await s.save_error(
                StoredError(
                    new_error_id(),
                    "s1",
                    "fetch",
                    {"message": "timeout\nlong", "traceback": "Trace!"},
                    "Code timeout: timeout",
                )
            ),
            await s.save_error(
                StoredError(new_error_id(), "s2", "write", {"message": "disk"}, "disk")
            ),
        ]
        await s.close()
        return out

    return asyncio.run(fill())


def test_list_with_filters(ids: list[str]) -> None:
    env = {"COLUMNS": "200"}
    r = runner.invoke(app, ["errors", "list"], env=env)
    assert r.exit_code == 0 and all(i in r.output for i in ids) and "3 errors" in r.output
    r = runner.invoke(app, ["errors", "list", "--tool", "write"], env=env)
    assert ids[2] in r.output and ids[1] not in r.output
    r = runner.invoke(app, ["errors", "list", "--session", "s1", "--since", "7d"], env=env)
    assert ids[1] in r.output and ids[0] not in r.output and ids[2] not in r.output
    r = runner.invoke(app, ["errors", "list", "--since", "yesterday-ish"])
    assert r.exit_code == 2 and "neither an age" in r.output


def test_show_and_cleanup(ids: list[str]) -> None:
    r = runner.invoke(app, ["errors", "show", ids[1]])
    assert r.exit_code == 0 and "Code timeout: timeout" in r.output and "Trace!" in r.output
    r = runner.invoke(app, ["errors", "show", "err_20000101_000000_aaaaaa"])
    assert r.exit_code == 2 and "ErrorNotFound" in r.output
    r = runner.invoke(app, ["errors", "cleanup", "--older-than", "30d", "--yes"])
    assert r.exit_code == 0 and "deleted 1 errors" in r.output
    r = runner.invoke(app, ["errors", "list"], env={"COLUMNS": "200"})
    assert ids[0] not in r.output and "2 errors" in r.output


def test_ids_are_never_cut_and_json_is_offered(ids: list[str]) -> None:
    r = runner.invoke(app, ["errors", "list"], env={"COLUMNS": "80"})  # piped and narrow
    assert r.exit_code == 0 and all(i in r.output for i in ids), r.output
    listed = json.loads(runner.invoke(app, ["errors", "list", "--json"]).output)
    assert sorted(e["id"] for e in listed) == sorted(ids)
    one = json.loads(runner.invoke(app, ["errors", "show", ids[1], "--json"]).output)
    assert one["id"] == ids[1] and one["raw_error"]["traceback"] == "Trace!"


def test_cleanup_asks_before_deleting(ids: list[str]) -> None:
    r = runner.invoke(app, ["errors", "cleanup", "--older-than", "0d"], input="n\n")
    assert r.exit_code == 1 and "Delete 3 errors" in r.output and "nothing deleted" in r.output
    r = runner.invoke(app, ["errors", "cleanup", "--older-than", "0d"])  # no one to answer
    assert r.exit_code == 1 and "nothing deleted" in r.output
    assert len(json.loads(runner.invoke(app, ["errors", "list", "--json"]).output)) == 3
    r = runner.invoke(app, ["errors", "cleanup", "--older-than", "0d"], input="y\n")
    assert r.exit_code == 0 and "deleted 3 errors" in r.output


def test_bracketed_ids_and_names_are_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".loom").mkdir()

    async def fill() -> str:
        s = SQLiteStore(tmp_path / ".loom" / "loom.db")
        error = StoredError(new_error_id(), "[s1]", "[b]tool", {"message": "[red]x"}, "[red]x")
        found = await s.save_error(error)
        await s.close()
        return found

    eid = asyncio.run(fill())
    r = runner.invoke(app, ["errors", "list"], env={"COLUMNS": "200"})
    assert "[s1]" in r.output and "[b]tool" in r.output and "[red]x" in r.output
    r = runner.invoke(app, ["errors", "show", eid])
    assert "session=[s1]" in r.output and "tool=[b]tool" in r.output
