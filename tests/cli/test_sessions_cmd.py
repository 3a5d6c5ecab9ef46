"""`loom sessions list/show/events/export` on a database written by `loom run`."""

from __future__ import annotations

import asyncio
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
    assert r.exit_code == 2 and "SessionNotFound" in r.output and "sessions list" in r.output
    r = runner.invoke(
        app, ["sessions", "list", "--store", str(tmp_path / "none.db")], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 2 and "no Loom database" in r.output
    assert not (tmp_path / "none.db").exists()


LONG = "session_" + "0123456789abcdef" * 4  # longer than a narrow terminal's id column


@pytest.fixture
def long_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["run", "--model", "demo", "hi", "--session", LONG, "--new"])
    assert r.exit_code == 0, r.output
    return LONG


def test_ids_are_never_cut_and_json_is_offered(long_session: str) -> None:
    # CliRunner is not a terminal: what `loom sessions list | ...` gets, 80 columns wide.
    r = runner.invoke(app, ["sessions", "list"], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and long_session in r.output, r.output
    listed = json.loads(runner.invoke(app, ["sessions", "list", "--json"]).output)
    assert [s["id"] for s in listed] == [long_session] and listed[0]["message_count"] == 2
    shown = json.loads(runner.invoke(app, ["sessions", "show", long_session, "--json"]).output)
    assert shown["session"]["id"] == long_session
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant"]
    assert {"completed", "running"} <= {r["status"] for r in shown["runs"]}
    assert shown["memory"]["context_window"] > 0
    journal = runner.invoke(app, ["sessions", "events", long_session, "--json"]).output
    run_ids = {json.loads(line)["run_id"] for line in journal.splitlines()}
    r = runner.invoke(app, ["sessions", "events", long_session], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and run_ids and all(i in r.output for i in run_ids), r.output


def test_delete_asks_then_removes_everything(long_session: str, tmp_path: Path) -> None:
    r = runner.invoke(app, ["sessions", "delete", long_session], input="n\n")
    assert r.exit_code == 1 and "nothing deleted" in r.output
    r = runner.invoke(app, ["sessions", "delete", long_session], input="y\n")
    assert r.exit_code == 0 and f"deleted session {long_session}" in r.output
    with sqlite3.connect(tmp_path / ".loom" / "loom.db") as raw:
        for table in ("sessions", "messages", "events", "runs", "ledger"):
            assert raw.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0, table
    r = runner.invoke(app, ["sessions", "delete", long_session, "--yes"])
    assert r.exit_code == 2 and "SessionNotFound" in r.output


def test_memory_store_delete_session() -> None:
    from loom.store.memory import MemoryStore

    async def go() -> tuple[bool, bool, object]:
        s = MemoryStore()
        await s.create_session("a")
        return await s.delete_session("a"), await s.delete_session("a"), await s.get_session("a")

    assert asyncio.run(go()) == (True, False, None)


def test_markup_in_an_error_message_is_printed_as_text(tmp_path: Path) -> None:
    r = runner.invoke(app, ["sessions", "list", "--store", str(tmp_path / "[x]" / "none.db")])
    assert r.exit_code == 2 and f"{tmp_path}/[x]/none.db" in "".join(r.output.split("\n"))


# -- media: exported beside the transcript, deleted with the session (issue #27) ----------------
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 100
PDF = b"%PDF-1.7\n" + b"x" * 5000


@pytest.fixture
def media_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A session of the default database whose first message carries an image and a PDF."""
    from loom import Agent
    from loom.content import File, Image
    from loom.store import SQLiteStore
    from loom.testing import ScriptedModel

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".loom").mkdir()

    async def seed() -> None:
        store = SQLiteStore(tmp_path / ".loom" / "loom.db")
        agent = Agent(model=ScriptedModel(["a chart and a report"]), store=store)
        parts = ["what are these?", Image.from_bytes(PNG), File.from_bytes(PDF, name="r.pdf")]
        await agent.run(parts, session_id="media")
        await store.close()

    asyncio.run(seed())
    return "media"


def test_export_writes_media_files_beside_the_transcript(
    media_session: str, tmp_path: Path
) -> None:
    from loom.content import File, Image, media_ref

    out = tmp_path / "export" / "t.jsonl"
    out.parent.mkdir()
    r = runner.invoke(app, ["sessions", "export", media_session, "-o", str(out)])
    assert r.exit_code == 0 and "wrote 2 media files" in r.output, r.output
    png_ref, pdf_ref = media_ref(PNG), media_ref(PDF)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["t.jsonl", png_ref.replace(":", "-") + ".png", pdf_ref.replace(":", "-") + ".pdf"]
    )
    assert (out.parent / (png_ref.replace(":", "-") + ".png")).read_bytes() == PNG
    assert (out.parent / (pdf_ref.replace(":", "-") + ".pdf")).read_bytes() == PDF
    first = read_jsonl(out).messages[0]  # the line names them by reference, without bytes
    assert [type(p) for p in first.parts] == [Image, File]
    assert [p.ref for p in first.parts] == [png_ref, pdf_ref]  # type: ignore[union-attr]
    assert len(out.read_text().splitlines()[0]) < 1000
    # To stdout: the transcript only, and a note on what was left out (or --media-dir).
    r = runner.invoke(app, ["sessions", "export", media_session])
    assert r.exit_code == 0 and "2 media files, not written" in r.output
    elsewhere = tmp_path / "media"
    r = runner.invoke(app, ["sessions", "export", media_session, "--media-dir", str(elsewhere)])
    assert r.exit_code == 0 and len(list(elsewhere.iterdir())) == 2
    r = runner.invoke(
        app, ["sessions", "export", media_session, "-o", str(tmp_path / "n.jsonl"), "--no-media"]
    )
    assert r.exit_code == 0 and "media files" not in r.output


def test_delete_removes_the_sessions_media(media_session: str, tmp_path: Path) -> None:
    r = runner.invoke(app, ["sessions", "delete", media_session, "--yes"])
    assert r.exit_code == 0, r.output
    with sqlite3.connect(tmp_path / ".loom" / "loom.db") as raw:
        assert raw.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
        assert raw.execute("SELECT count(*) FROM session_blobs").fetchone()[0] == 0
