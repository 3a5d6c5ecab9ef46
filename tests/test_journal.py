"""A session rebuilt from its event journal equals its stored transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ToolError, tool
from loom.journal import transcript
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore
from loom.testing import ScriptedModel


def _key(m: Message) -> tuple[Any, ...]:
    return (
        m.role,
        m.content,
        [(c.id, c.name, c.arguments) for c in m.tool_calls],
        m.tool_call_id,
        m.name,
        m.metadata,
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_replay_rebuilds_the_transcript(kind: str, tmp_path: Path) -> None:
    store: Any = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "l.db")

    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool
    def fail() -> str:
        """Fail."""
        raise ToolError("nope\nmore detail", code="BAD")

    model = ScriptedModel(
        [
            ModelResponse(
                text="let me add",
                tool_calls=[
                    ToolCall(name="add", arguments={"a": 1, "b": 2}),
                    ToolCall(name="fail"),
                ],
            ),
            "three",
            ModelResponse(tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 2})]),
            "four",
        ]
    )
    agent = Agent(model=model, tools=[add, fail], store=store, max_iterations=5)
    await agent.run("1+2?", session_id="s")
    await agent.run("2+2?", session_id="s")
    stored = await store.load_messages("s")
    rebuilt = transcript(await store.load_events("s"))
    assert len(stored) == 9
    assert [_key(m) for m in rebuilt] == [_key(m) for m in stored]
    await store.close()
