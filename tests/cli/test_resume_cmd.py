"""`loom resume`: decide a paused session's pending calls from the command line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from loom import Agent, ModelResponse, ToolCall
from loom.store import SQLiteStore
from loom.testing import ScriptedModel


def pause(tmp_path: Path) -> None:
    """A library run that stops at a write_file call waiting for approval."""

    async def go() -> None:
        store = SQLiteStore(tmp_path / ".loom" / "loom.db")
        call = ToolCall(id="call_w", name="write_file",
                        arguments={"path": "note.txt", "content": "hi"})  # fmt: skip
        agent = Agent(model=ScriptedModel([ModelResponse(tool_calls=[call])]),
                      tools=["write_file"], workspace=tmp_path, store=store)  # fmt: skip
        result = await agent.run("write a note", session_id="s1")
        assert result.stop_reason == "awaiting_approval"
        await store.close()

    (tmp_path / ".loom").mkdir()
    asyncio.run(go())


def loom(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", "resume", "s1", "--model", "demo", "--tools",
         "write_file", "--workspace", str(tmp_path), *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def test_approve_runs_the_call_and_finishes_the_turn(tmp_path: Path) -> None:
    pause(tmp_path)
    out = loom(tmp_path, "--approve")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "note.txt").read_text() == "hi"
    assert "The tool write_file returned" in out.stdout and "completed" in out.stderr
    again = loom(tmp_path, "--approve")  # nothing waits any more
    assert again.returncode == 2 and "no tool call waiting for approval" in again.stderr


def test_reject_sends_the_reason_and_runs_nothing(tmp_path: Path) -> None:
    pause(tmp_path)
    out = loom(tmp_path, "--reject", "not today")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "note.txt").exists()
    assert "not today" in out.stdout  # the demo model repeats the tool result it was given


def test_both_flags_are_refused(tmp_path: Path) -> None:
    out = loom(tmp_path, "--approve", "--reject", "x")
    assert out.returncode == 2 and "not both" in out.stderr
