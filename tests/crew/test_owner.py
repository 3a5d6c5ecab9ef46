"""A crew's member runs act for the crew run's owner (issue #29): the owner decided at the front
door (``RunOptions.owner``) reaches every member run, nested crews' too, so their memory tools
write that owner's items and each member's child session records it like any run's session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loom import Agent, Message, ModelResponse, ToolCall
from loom.crew import Budget, Crew, Sequential
from loom.engine.run_inputs import RunOptions
from loom.engine.runtime import Runtime
from loom.memory import MemoryConfig
from loom.store import SQLiteStore
from loom.store.base import capabilities_of
from loom.testing import FunctionModel


def saver(name: str) -> Agent:
    """An agent whose model saves the message it was handed as a memory, then answers."""

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        last = messages[-1]
        if last.role == "user":
            return ModelResponse(
                tool_calls=[ToolCall(name="save_memory", arguments={"text": last.content})]
            )
        return f"{name} saved it"

    return Agent(
        name,
        "You keep notes.",
        model=FunctionModel(fn),
        memory=MemoryConfig(memory_file=None, store_tools=True),
    )


async def memories(store: Any) -> list[tuple[tuple[str, ...], str | None, str]]:
    items = capabilities_of(store).items
    assert items is not None
    found = await items.search_items(("memories",))
    return sorted((i.namespace, i.owner, str(i.value.get("text"))) for i in found)


async def test_a_crew_members_memory_tools_write_the_crew_run_owners_items(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    runtime = Runtime(store=store)
    inner = Crew("inner", members={"deep": saver("deep")}, plan="deep")
    crew = Crew(
        "notes",
        members={"keeper": saver("keeper"), "inner": inner},
        plan=Sequential("keeper", "inner"),
        budget=Budget(max_depth=2),
    )
    try:
        run = await runtime.start(
            crew, "the standup moved to 9:30", session_id="c1", options=RunOptions(owner="alice")
        )
        await run.run(lambda ev: None)
        assert run.result is not None and run.result.stop_reason == "completed", run.result
        # alice's, not the shared namespace: the member run and the nested crew's member alike
        found = await memories(store)
        assert [(ns, owner) for ns, owner, _ in found] == [
            (("memories", "alice"), "alice"),
            (("memories", "alice"), "alice"),
        ]
        # each member's child session records the owner, as any run-created session does
        assert await runtime.session_owner("c1:notes/keeper") == "alice"
        assert await runtime.session_owner("c1:notes/inner:notes/inner/deep") == "alice"
    finally:
        await store.close()
