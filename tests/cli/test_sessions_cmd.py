"""`loom sessions list/show/events/export` on a database written by `loom run`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.store.transcript import read_jsonl

runner = CliRunner()


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["run", "--model", "demo", "what is 2 + 3"])
    assert r.exit_code == 0, r.output
    with sqlite3.connect(tmp_path / ".loom" / "loom.db") as raw:
        return str(raw.execute("SELECT id FROM sessions").fetchone()[0])


def test_list_and_show(session: str) -> None:
    r = runner.invoke(app, ["sessions", "list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and session in r.output and "1 sessions" in r.output
    r = runner.invoke(app, ["sessions", "show", session], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for text in (
        "user",
        "what is 2 + 3",
        "assistant",
        'add({"a": 2, "b": 3})',
        "tool",
        "The tool add returned: 5",
        "(completed)",
        "[add] 5",  # tool name in brackets printed as text, not read as Rich markup
    ):
        assert text in r.output
    tiers = {line.split("│")[1].strip() for line in r.output.splitlines() if line.count("│") > 5}
    assert {"ROM", "Kernel", "L1", "L2"} <= tiers
    l1 = next(line for line in r.output.splitlines() if line.startswith("│ L1"))
    assert int(l1.split("│")[2].strip().replace(",", "")) > 0  # the turn's tokens are in L1


def test_events_in_order(session: str) -> None:
    r = runner.invoke(app, ["sessions", "events", session, "--json"])
    assert r.exit_code == 0
    events = [json.loads(line) for line in r.output.splitlines()]
    assert events[0]["type"] == "agent_start" and events[-1]["type"] == "agent_finish"
    assert [e["sequence"] for e in events] == sorted(e["sequence"] for e in events)
    assert "tool_result" in [e["type"] for e in events]


def test_export_round_trips(session: str, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    r = runner.invoke(app, ["sessions", "export", session, "-o", str(out)])
    assert r.exit_code == 0 and "wrote 4 messages" in r.output
    assert [m.role for m in read_jsonl(out).messages] == ["user", "assistant", "tool", "assistant"]
    r = runner.invoke(app, ["sessions", "export", session])
    assert len(r.output.splitlines()) == 4


def test_unknown_session_and_missing_database(session: str, tmp_path: Path) -> None:
    r = runner.invoke(app, ["sessions", "show", "session_nope"], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "SessionNotFound" in r.output and "sessions list" in r.output
    r = runner.invoke(
        app, ["sessions", "list", "--store", str(tmp_path / "none.db")], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 1 and "no Loom database" in r.output
    assert not (tmp_path / "none.db").exists()
