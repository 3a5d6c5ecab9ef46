"""Users' tools for session branches: ``loom sessions fork|rewind|branches`` and ``/undo``,
``/retry`` and ``/edit`` in ``loom chat`` (``loom.engine.branching``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.conftest import SRC
from typer.testing import CliRunner

from loom import Agent, tool
from loom.cli import app
from loom.engine.journal import transcript
from loom.engine.runtime import Runtime
from loom.messages import Message, ModelResponse, ToolCall, ToolSpec
from loom.store.base import BranchStore
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel

runner = CliRunner()

AGENT = """
from loom import Agent
from loom.testing import FunctionModel


def answer(messages, tools):
    said = [m.content for m in messages if m.role == "user"]
    return f"echo: {said[-1]} (turns {len(said)})"


def echo(**settings):
    return Agent(name="echo", model=FunctionModel(answer), **settings)
"""


def test_chat_undo_retry_edit(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENT)
    out = subprocess.run(
        [sys.executable, "-m", "loom", "chat", "--agent", "agents.py:echo", "--store", ":memory:"],
        input="/undo\none\ntwo\n/undo\n/retry\n/edit uno\n/edit\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=SRC),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [line.rpartition("you> ")[2] for line in out.stdout.splitlines()]  # after prompts
    answers = [line for line in lines if line.startswith("echo:")]
    assert answers == [
        "echo: one (turns 1)",
        "echo: two (turns 2)",
        "echo: one (turns 1)",  # /undo took "two" back, /retry answered "one" again
        "echo: uno (turns 1)",  # /edit replaced "one"
    ]
    assert "rewound" in out.stderr
    assert "BranchError" in out.stderr and "no message yet" in out.stderr  # /undo at first
    assert "usage: /edit TEXT" in out.stderr


@tool(effect="at_most_once")
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


def mailer(messages: list[Message], tools: list[ToolSpec]) -> str | ModelResponse:
    last = messages[-1]
    if last.role == "tool":
        return f"done: {last.content}"
    words = last.content.split()
    if words[:1] == ["mail"]:
        return ModelResponse(tool_calls=[ToolCall(name="send", arguments={"to": words[1]})])
    return f"echo: {last.content}"


class KeptOpen(MemoryStore):
    """A store the CLI's commands share (each closes it when done)."""

    async def close(self) -> None:
        return None


@pytest.fixture
def mailed(monkeypatch: pytest.MonkeyPatch) -> KeptOpen:
    """Session ``s``: "hello", then "mail bob" (an at_most_once call), as agent ``mailer``."""
    store = KeptOpen()
    agent = Agent(name="mailer", model=FunctionModel(mailer), tools=[send])

    async def seed() -> None:
        rt = Runtime(store=store)
        await rt.run(agent, "hello", session_id="s")
        await rt.run(agent, "mail bob", session_id="s")

    asyncio.run(seed())
    monkeypatch.setattr("loom.cli.sessions_cmd.open_existing", lambda path: store)
    return store


def messages_of(store: MemoryStore, sid: str) -> list[Message]:
    async def load() -> list[Message]:
        stored = await store.load_messages(sid)
        assert stored == transcript(await store.load_events(sid))
        return stored

    return asyncio.run(load())


def test_rewind_then_branches_show_what_was_abandoned(mailed: KeptOpen) -> None:
    r = runner.invoke(app, ["sessions", "rewind", "s", "--to", "1"])
    assert r.exit_code == 0, r.output
    assert "rewound s: 4 messages left the transcript" in r.stdout
    assert "send" in r.stderr and "effect stays in the world" in r.stderr
    assert [m.content for m in messages_of(mailed, "s")][:2] == ["hello", "echo: hello"]
    r = runner.invoke(app, ["sessions", "branches", "s"])
    assert r.exit_code == 0, r.output
    assert "branch 1 rewind" in r.stdout and "abandoned 4" in r.stdout
    assert "abandoned user: mail bob" in r.stdout
    assert 'effect send({"to": "bob"}) -> sent to bob [at_most_once]; noted' in r.stdout
    r = runner.invoke(app, ["sessions", "branches", "s", "--json"])
    [row] = json.loads(r.stdout)
    assert row["reason"] == "rewind" and row["kept"] == 2 and len(row["abandoned"]) == 4
    assert row["effects"][0]["tool"] == "send" and row["noted"] is True


def test_fork_at_a_turn_and_at_an_event(mailed: KeptOpen) -> None:
    before = messages_of(mailed, "s")
    r = runner.invoke(app, ["sessions", "fork", "s", "--at", "1", "--id", "f1"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "f1"
    forked = messages_of(mailed, "f1")
    assert forked[:2] == before[:2] and forked[2].metadata == {"branch_note": True}
    assert messages_of(mailed, "s") == before  # the source is unchanged
    first_end = next(e for e in asyncio.run(mailed.load_events("s")) if e.type == "agent_finish")
    point = f"{first_end.run_id}.{first_end.sequence}"
    r = runner.invoke(app, ["sessions", "fork", "s", "--event", point, "--id", "f2"])
    assert r.exit_code == 0, r.output
    assert messages_of(mailed, "f2")[:2] == before[:2]
    r = runner.invoke(app, ["sessions", "branches", "f1"])
    assert "branch 1 fork" in r.stdout


def test_bad_points_and_refusals_exit_2_saying_what_to_do(mailed: KeptOpen) -> None:
    before = messages_of(mailed, "s")
    cases = [
        (["sessions", "rewind", "s"], "give the point: --at TURN or --event RUN.SEQ"),
        (["sessions", "rewind", "s", "--to", "9"], "turn 9 does not exist"),
        (["sessions", "rewind", "s", "--event", "nodot"], "give RUN.SEQ"),
        (["sessions", "rewind", "s", "--to", "1", "--event", "r.1"], "not both"),
        (["sessions", "rewind", "s", "--event", "run_x.3"], "no stored event 3"),
        (["sessions", "rewind", "s", "--to", "1", "--effects", "refuse"], "BranchRefused"),
        (["sessions", "fork", "s", "--at", "1", "--effects", "refuse"], "set it to 'note'"),
        (["sessions", "fork", "nope"], "no session 'nope'"),
        (["sessions", "branches", "nope"], "no session 'nope'"),
    ]
    for args, says in cases:
        r = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert r.exit_code == 2, (args, r.output)
        assert says.lower() in " ".join(r.output.split()).lower(), (args, r.output)
    assert messages_of(mailed, "s") == before


def test_a_session_a_run_holds_is_refused(mailed: KeptOpen) -> None:
    before = messages_of(mailed, "s")
    assert asyncio.run(mailed.acquire_lease("s", "run_elsewhere", 60.0)) is not None
    r = runner.invoke(app, ["sessions", "rewind", "s", "--to", "1"])
    assert r.exit_code == 2, r.output
    assert "SessionBusy" in r.output
    assert messages_of(mailed, "s") == before


@pytest.mark.skipif(
    not issubclass(SQLiteStore, BranchStore),
    reason="SQLiteStore's BranchStore capability comes with the SQL stores' part of issue 28",
)
def test_rewind_and_fork_on_the_sqlite_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for said, new in (("what is 2 + 3", ["--new"]), ("what is 4 + 5", [])):
        r = runner.invoke(app, ["run", "--model", "demo", "--session", "m", *new, said])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["sessions", "fork", "m", "--at", "1", "--id", "copy"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["sessions", "rewind", "m", "--to", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["sessions", "branches", "m"])
    assert "branch 1 rewind" in r.stdout and "what is 4 + 5" in r.stdout
    r = runner.invoke(app, ["sessions", "branches", "copy"])
    assert "branch 1 fork" in r.stdout
