"""Branches made by another process (another ``Runtime`` on the same store: ``loom sessions
rewind`` next to a ``loom serve``) must reach the next turn of a runtime that had the session
cached."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from loom import Agent
from loom.engine.run_inputs import Regenerate, Rewind
from loom.engine.runtime import Runtime
from loom.messages import Message, ToolSpec
from loom.store.base import Store
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel


def said_by_users(seen: list[list[str]]) -> FunctionModel:
    def answer(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        seen.append([m.content for m in messages if m.role == "user"])
        return "ok"

    return FunctionModel(answer)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each store: the count of rewinds (``SessionInfo.branches``) is what tells a runtime."""
    return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "b.db")


async def test_a_branch_by_another_runtime_reaches_the_next_turn(store: Store) -> None:
    seen: list[list[str]] = []
    agent = Agent(name="x", model=said_by_users(seen))
    here, there = Runtime(store=store), Runtime(store=store)
    await here.run(agent, "one", session_id="s")
    await here.run(agent, "two", session_id="s")
    await there.run(agent, Rewind(0), session_id="s")
    for text in ("A", "B", "C"):
        await there.run(agent, text, session_id="s")
    await here.run(agent, "next", session_id="s")
    assert seen[-1] == ["A", "B", "C", "next"]


async def test_a_shorter_transcript_after_another_runtime_s_rewind_is_read_again(
    store: Store,
) -> None:
    seen: list[list[str]] = []
    agent = Agent(name="x", model=said_by_users(seen))
    here, there = Runtime(store=store), Runtime(store=store)
    await here.run(agent, "one", session_id="s")
    await here.run(agent, "two", session_id="s")
    await there.run(agent, Rewind(1), session_id="s")
    await here.run(agent, "next", session_id="s")
    assert seen[-1] == ["one", "next"]
    await there.run(agent, Regenerate(), session_id="s")
    assert seen[-1] == ["one", "next"]
