"""`loom resume`: decide a paused session's pending calls from the command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.store import SQLiteStore
from loom.testing import ScriptedModel

pexpect = pytest.importorskip("pexpect")
SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom
ENV = dict(os.environ, PYTHONPATH=SRC)


def pause(tmp_path: Path) -> None:
    """A library run that stops at a write_file call waiting for approval."""

    async def go() -> None:
        store = SQLiteStore(tmp_path / ".loom" / "loom.db")
        call = ToolCall(
            id="call_w", name="write_file", arguments={"path": "note.txt", "content": "hi"}
        )
        agent = Agent(
            model=ScriptedModel([ModelResponse(tool_calls=[call])]),
            tools=["write_file"],
            workspace=tmp_path,
            store=store,
        )
        result = await agent.run("write a note", session_id="s1")
        assert result.stop_reason == "awaiting_approval"
        await store.close()

    (tmp_path / ".loom").mkdir()
    asyncio.run(go())


def loom(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "resume",
            "s1",
            "--model",
            "demo",
            "--tools",
            "write_file",
            "--workspace",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=ENV,
    )


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


def still_waiting(tmp_path: Path) -> list[str]:
    """The ids of the calls session s1 still waits on."""

    async def go() -> list[str]:
        store = SQLiteStore(tmp_path / ".loom" / "loom.db")
        try:
            agent = Agent(model=ScriptedModel([]), store=store)
            return [p.tool_call_id for p in await agent.pending_approvals("s1")]
        finally:
            await store.close()

    return asyncio.run(go())


def test_ctrl_c_at_the_prompt_decides_nothing_and_exits_130(
    tmp_path: Path, terminal: Callable[..., Any]
) -> None:
    pause(tmp_path)
    child = terminal(
        "resume",
        "s1",
        "--model",
        "demo",
        "--tools",
        "write_file",
        "--workspace",
        str(tmp_path),
        cwd=tmp_path,
    )
    child.expect("Allow write_file")
    # The choices are printed as text: Rich used to read [y] [n] [a] [e] as markup tags.
    child.expect_exact("[y]es, [n]o, [a]lways in this session, [e]dit arguments")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, child.before
    assert "nothing was decided" in child.before
    assert still_waiting(tmp_path) == ["call_w"]  # the call waits, resumable
    assert not (tmp_path / "note.txt").exists()
    out = loom(tmp_path, "--approve")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "note.txt").read_text() == "hi"


def pause_on_custom_tool(tmp_path: Path) -> None:
    """A program pauses on its own tool `deploy`, which `loom run`'s default agent lacks."""

    @tool
    def deploy(target: str) -> str:
        """Deploy to a target."""
        return f"deployed {target}"

    async def go() -> None:
        store = SQLiteStore(tmp_path / ".loom" / "loom.db")
        call = ToolCall(id="call_d", name="deploy", arguments={"target": "prod"})
        agent = Agent(
            model=ScriptedModel([ModelResponse(tool_calls=[call])]),
            tools=[deploy],
            permissions={"ask": ["deploy"]},
            store=store,
        )
        result = await agent.run("deploy prod", session_id="s1")
        assert result.stop_reason == "awaiting_approval"
        await store.close()

    (tmp_path / ".loom").mkdir()
    asyncio.run(go())


def test_a_custom_tool_is_refused_up_front_and_stays_pending(tmp_path: Path, agents: Path) -> None:
    pause_on_custom_tool(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "loom", "resume", "s1", "--approve", "--model", "demo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=ENV,
    )
    assert out.returncode == 2, out.stderr
    said = " ".join(out.stderr.split())
    assert "'deploy'" in said and "nothing was decided" in said and "--agent" in said
    assert still_waiting(tmp_path) == ["call_d"]
    # With the agent that has the tool (a Python factory), the same session resumes.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loom",
            "resume",
            "s1",
            "--approve",
            "--agent",
            "agents.py:deployer",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr
    assert "✓ deploy: deployed prod" in out.stderr and "done: deployed prod" in out.stdout
    assert still_waiting(tmp_path) == []
