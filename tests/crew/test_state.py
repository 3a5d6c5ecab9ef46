"""SharedState: versioned values with compare-and-set, so parallel members cannot overwrite
each other unseen; large results handed over by reference."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.crew import Crew, Parallel, Sequential, SharedState
from loom.engine.runtime import Runtime
from loom.messages import Message, ToolSpec
from loom.store.memory import MemoryStore
from loom.store.sqlite import SQLiteStore
from loom.testing import FunctionModel, ScriptedModel


async def test_compare_and_set_refuses_a_stale_version() -> None:
    state = SharedState("ns")
    assert await state.get("k") == (None, 0)
    assert await state.compare_and_set("k", "a", 0) == (True, 1)
    assert await state.compare_and_set("k", "b", 0) == (False, 1)
    assert await state.compare_and_set("k", "b", 1) == (True, 2)
    assert await state.get("k") == ("b", 2)


def racer(name: str, barrier: asyncio.Barrier) -> Agent:
    """Reads the counter, waits until the other racer has read it too, then writes."""

    @tool
    async def sync() -> str:
        """Wait for the other member."""
        await asyncio.wait_for(barrier.wait(), 5)
        return "go"

    def step(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        results = [m for m in messages if m.role == "tool"]
        if not results:
            return ModelResponse(tool_calls=[ToolCall(name="state_get", arguments={"key": "n"})])
        if len(results) == 1:
            return ModelResponse(tool_calls=[ToolCall(name="sync")])
        if len(results) == 2:
            version = json.loads(results[0].content)["version"]
            args = {"key": "n", "value": name, "expected_version": version}
            return ModelResponse(tool_calls=[ToolCall(name="state_set", arguments=args)])
        return results[-1].content

    return Agent(name=name, model=FunctionModel(step), tools=[sync])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_parallel_members_cannot_race_on_shared_state(kind: str, tmp_path: Path) -> None:
    store: Any = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    barrier = asyncio.Barrier(2)
    crew = Crew(
        "race",
        members={"a": racer("a", barrier), "b": racer("b", barrier)},
        plan=Parallel("a", "b"),
        shared_state=True,
    )
    try:
        res = await asyncio.wait_for(crew.run("go", runtime=Runtime(store)), 20)
        outcomes = [json.loads(m.output) for m in res.members]
        assert sorted(o["ok"] for o in outcomes) == [False, True]  # one wins, one is told
        loser = next(o for o in outcomes if not o["ok"])
        assert loser["conflict"] is True and loser["current_version"] == 1
        winner = next(m.member for m, o in zip(res.members, outcomes, strict=True) if o["ok"])
        scope = SharedState(
            f"crew:{res.session_id}:{res.run_id}", store if kind == "sqlite" else None
        )
        if kind == "sqlite":  # on a store with a key-value half the values outlive the run
            assert await scope.get("n") == (winner, 1)
    finally:
        await store.close()


async def test_large_context_is_handed_over_by_reference() -> None:
    big = "tide pool fact. " * 100
    reader_calls: list[list[Message]] = []

    def read(messages: list[Message], tools: list[ToolSpec]) -> ModelResponse | str:
        reader_calls.append(messages)
        if messages[-1].role == "tool":
            return "read it"
        ref = messages[-1].content.split("key '", 1)[1].split("'", 1)[0]
        return ModelResponse(tool_calls=[ToolCall(name="state_get", arguments={"key": ref})])

    crew = Crew(
        "refs",
        members={
            "researcher": Agent(name="r", model=ScriptedModel([big])),
            "writer": Agent(name="w", model=FunctionModel(read)),
        },
        plan=Sequential("researcher", "writer"),
        shared_state=True,
        ref_threshold=200,
    )
    res = await crew.run("go")

    handed = reader_calls[0][-1].content
    assert handed.startswith(f"[{len(big):,} characters handed over by reference")
    assert len(handed) < 300
    fetched = json.loads(reader_calls[1][-1].content)
    assert fetched["value"] == big
    assert res.output == "read it"
