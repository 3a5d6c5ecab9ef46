"""The journal: the transcript derives from it; nothing is announced before it is committed."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ToolError, tool
from loom.errors import StoreError
from loom.events import AgentEvent, EventType
from loom.journal import transcript
from loom.messages import Message, ModelResponse, ToolCall
from loom.runtime import Runtime
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


# -- persist before you announce (DESIGN principle 5) -------------------------------------------

# Event types that are steps: committed by ``Journal.commit`` before they go out. The others are
# announcements, emitted at once and journaled with the next commit.
STEP_TYPES = {
    EventType.AGENT_START,
    EventType.USER_MESSAGE,
    EventType.LLM_COMPLETE,
    EventType.TOOL_EXECUTION_START,
    EventType.TOOL_RESULT,
    EventType.TOOL_ERROR,
    EventType.APPROVAL_REQUIRED,
    EventType.APPROVAL_DECISION,
    EventType.JUDGE_RESULT,
    EventType.JUDGE_RETRY,
    EventType.MEMORY_RECORD,
    EventType.RUN_RECOVERED,
    EventType.AGENT_FINISH,
}


class FailingStore(MemoryStore):
    """Commits like MemoryStore, except that its ``fail_at``-th append raises ``StoreError``.
    ``committed`` holds (run_id, sequence) of every event of every successful append."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.appends = fail_at, 0
        self.committed: set[tuple[str, int]] = set()

    async def append(self, session_id: str, **kw: Any) -> None:
        self.appends += 1
        if self.appends == self.fail_at:
            raise StoreError(f"disk full at append {self.fail_at}")
        await super().append(session_id, **kw)
        self.committed.update((e.run_id, e.sequence) for e in kw.get("events", ()))


def _two_step_agent() -> Agent:
    @tool(effect="pure")
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="add", arguments={"a": 1, "b": 2}),
                    ToolCall(name="add", arguments={"a": 3, "b": 4}),
                ]
            ),
            "3 and 7",
        ]
    )
    return Agent(model=model, tools=[add])


@pytest.mark.parametrize("fail_at", range(1, 9))  # the run commits 8 times
async def test_no_step_event_leaves_before_its_commit(fail_at: int) -> None:
    store = FailingStore(fail_at)
    seen: list[AgentEvent] = []
    early: list[AgentEvent] = []

    def observe(event: AgentEvent) -> None:  # called at the instant the event goes out
        seen.append(event)
        if event.type in STEP_TYPES and (event.run_id, event.sequence) not in store.committed:
            early.append(event)

    runtime = Runtime(store, observers=[observe])
    with contextlib.suppress(StoreError):
        await runtime.run(_two_step_agent(), "go", session_id="s")
    assert store.appends >= fail_at  # the failure was reached
    assert early == [], f"announced before committed: {[e.type for e in early]}"
    assert any(e.type in STEP_TYPES for e in seen) or fail_at == 1


async def test_every_event_a_stream_consumer_saw_is_in_the_journal() -> None:
    store = MemoryStore()
    agent = _two_step_agent()
    seen = [e async for e in Runtime(store).stream(agent, "go", session_id="s")]
    stored = {(e.run_id, e.sequence) for e in await store.load_events("s")}
    missing = [e.type for e in seen if e.type is not EventType.LLM_DELTA
               and (e.run_id, e.sequence) not in stored]  # fmt: skip
    assert missing == []
