"""INTAKE of a 10,000-turn session reads a bounded number of rows (issue #26).

The session is written straight into a SQLite file (4 messages and a ``USER_MESSAGE`` event a
turn, and a summary every 500 turns covering all but the newest turns, as the context builder
leaves a long session). A new store and a new ``Runtime`` then run one turn; the model counts
the rows the store returned before it was first called (``CountingStore``): INTAKE's reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loom import Agent, Runtime
from loom.events import EventType, make_event
from loom.messages import Message, ToolCall, ToolResult
from loom.store import SQLiteStore
from loom.store.conformance import CountingStore
from loom.testing import FunctionModel

TURNS = 10_000
SUMMARY_EVERY = 500
UNCOVERED_TURNS = 20  # the newest turns no summary covers yet
ROW_BOUND = 400


def turn_messages(i: int) -> list[Message]:
    call = ToolCall(id=f"c{i}", name="lookup", arguments={"q": f"topic {i}"})
    return [
        Message.user(f"question number {i}"),
        Message.assistant(tool_calls=[call]),
        Message.tool(ToolResult(tool_call_id=call.id, name="lookup", data=f"result {i}")),
        Message.assistant(f"answer {i}"),
    ]


async def write_session(path: Path, turns: int) -> None:
    await write_into(SQLiteStore(path), turns)


async def write_into(store: Any, turns: int) -> None:
    await store.create_session("s", agent_name="a")
    batch: list[Message] = []
    events = []
    for i in range(turns):
        batch += turn_messages(i)
        events.append(make_event(EventType.USER_MESSAGE, f"r{i}", "s", 0, 0, {"content": "q"}))
        if (i + 1) % SUMMARY_EVERY == 0:
            # covers all but the newest turns, as the builder leaves them
            covers = (i + 1 - UNCOVERED_TURNS) * 4 - 1
            meta = {"loom": "summary", "covers_from": 0, "covers_through": covers}
            batch.append(Message(role="system", content=f"summary {i}", metadata=meta))
        if len(batch) >= 4000 or i == turns - 1:
            await store.append("s", messages=batch, events=events)
            batch, events = [], []
    await store.close()


async def intake_rows(path: Path | Any) -> tuple[int, dict[str, int], list[Message]]:
    """Rows the store returned before the first model call of a new turn, and what the model
    was sent (``path``: a SQLite file, or a store)."""
    counting = CountingStore(SQLiteStore(path) if isinstance(path, Path) else path)
    seen: dict[str, Any] = {}

    def model(messages: list[Message], tools: object) -> str:
        seen.setdefault("rows", counting.total)
        seen.setdefault("by_method", dict(counting.rows))
        seen.setdefault("sent", messages)
        return "done"

    agent = Agent("a", model=FunctionModel(model, record=False))
    runtime = Runtime(counting)
    result = await runtime.run(agent, "one more question", session_id="s")
    assert result.output == "done"
    await counting.inner.close()
    return seen["rows"], seen["by_method"], seen["sent"]


@pytest.fixture(scope="module")
def written_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    path = tmp_path_factory.mktemp("resume") / "long.db"
    asyncio.run(write_session(path, TURNS))
    return path


@pytest.fixture
def long_session(written_session: Path, tmp_path: Path) -> Path:
    """A copy of the written session for one test (its turn appends to it)."""
    import shutil

    return Path(shutil.copy(written_session, tmp_path / "long.db"))


async def test_intake_of_a_10000_turn_session_reads_a_bounded_number_of_rows(
    long_session: Path,
) -> None:
    rows, by_method, sent = await intake_rows(long_session)
    assert rows <= ROW_BOUND, f"INTAKE read {rows} rows: {by_method}"
    # what the model saw: the newest summary, then the turns no summary covers, then the question
    assert any(f"summary {TURNS - 1}" in m.content for m in sent if m.role == "system")
    questions = [m.content for m in sent if m.role == "user"]
    assert questions[-1] == "one more question"
    assert questions[0] == f"question number {TURNS - UNCOVERED_TURNS}"
    assert len(questions) == UNCOVERED_TURNS + 1


async def test_pending_reads_of_a_10000_turn_session_are_bounded(long_session: Path) -> None:
    counting = CountingStore(SQLiteStore(long_session))
    runtime = Runtime(counting)
    assert await runtime.pending_approvals("s") == []
    assert await runtime.pending_query("s") is None
    assert counting.total <= 100, counting.rows
    await counting.inner.close()


async def test_a_builder_of_the_agents_own_gets_the_whole_history(long_session: Path) -> None:
    """A custom context builder was always given the whole transcript; it still is, even from
    a runtime that read only a window at first."""
    from loom.context import FullHistoryBuilder

    sent: list[int] = []

    def model(messages: list[Message], tools: object) -> str:
        sent.append(len(messages))
        return "done"

    store = SQLiteStore(long_session)
    total = await store.message_count("s")
    agent = Agent(
        "a", model=FunctionModel(model, record=False), context_builder=FullHistoryBuilder()
    )
    await Runtime(store).run(agent, "and now?", session_id="s")
    await store.close()
    assert sent == [total + 1]  # the whole transcript and the new question (no instructions)


async def test_an_agent_with_the_remember_tool_reads_the_whole_transcript(
    long_session: Path,
) -> None:
    """``remember`` results set Kernel keys from anywhere in the transcript and have no index:
    such an agent's runtime reads all of it (the documented exception)."""
    from loom.memory.tools import remember

    counting = CountingStore(SQLiteStore(long_session))
    total = await counting.message_count("s")
    agent = Agent("a", model=FunctionModel(lambda m, t: "done", record=False), tools=[remember])
    await Runtime(counting).run(agent, "and now?", session_id="s")
    await counting.inner.close()
    assert counting.rows["load_message_range"] >= total


async def test_a_call_parked_for_approval_is_found_and_resumed_from_a_window(
    long_session: Path,
) -> None:
    """The newest exchange of a long session holds a call waiting for approval: a new runtime
    finds it (reading only that exchange) and ``resume`` runs it."""
    from loom import tool

    ran: list[str] = []

    @tool(effect="pure")
    def lookup(q: str) -> str:
        """Look something up."""
        ran.append(q)
        return f"found {q}"

    store = SQLiteStore(long_session)
    call = ToolCall(id="parked", name="lookup", arguments={"q": "the last topic"})
    asked = make_event(EventType.USER_MESSAGE, "rp", "s", 0, 0, {"content": "look it up"})
    required = make_event(
        EventType.APPROVAL_REQUIRED,
        "rp",
        "s",
        1,
        1,
        {"tool_call_id": "parked", "tool_name": "lookup", "arguments": {"q": "the last topic"}},
    )
    await store.append(
        "s",
        messages=[Message.user("look it up"), Message.assistant(tool_calls=[call])],
        events=[asked, required],
    )
    await store.close()
    counting = CountingStore(SQLiteStore(long_session))
    runtime = Runtime(counting)
    pending = await runtime.pending_approvals("s")
    assert [(p.tool_call_id, p.tool_name) for p in pending] == [("parked", "lookup")]
    assert counting.total <= 100, counting.rows
    sent: list[list[Message]] = []

    def model(messages: list[Message], tools: object) -> str:
        sent.append(messages)
        return "done"

    agent = Agent("a", model=FunctionModel(model, record=False), tools=[lookup])
    result = await runtime.resume(agent, "s", True)
    await counting.inner.close()
    assert result.output == "done" and ran == ["the last topic"]
    assert sent[0][-1].role == "tool" and sent[0][-1].content == "found the last topic"
    assert sent[0][-3].content == "look it up"


async def test_a_call_a_crash_left_unanswered_is_closed_from_a_window(long_session: Path) -> None:
    """A process died after committing the model's call and before running it: the next turn,
    in a new runtime reading only the window, answers it ``interrupted`` before going on."""
    store = SQLiteStore(long_session)
    call = ToolCall(id="lost", name="lookup", arguments={"q": "x"})
    await store.append("s", messages=[Message.user("look"), Message.assistant(tool_calls=[call])])
    await store.close()
    sent: list[list[Message]] = []

    def model(messages: list[Message], tools: object) -> str:
        sent.append(messages)
        return "done"

    store = SQLiteStore(long_session)
    agent = Agent("a", model=FunctionModel(model, record=False))
    await Runtime(store).run(agent, "next question", session_id="s")
    tail = await store.load_messages("s", start=await store.message_count("s") - 6)
    await store.close()
    closing = [m for m in sent[0] if m.role == "tool" and m.tool_call_id == "lost"]
    assert len(closing) == 1 and "did not run" in closing[0].content
    assert [m.tool_call_id for m in tail if m.role == "tool"] == ["lost"]  # and it is stored


async def test_intake_of_a_10000_turn_session_on_postgresql_reads_a_bounded_number_of_rows(
    pg_schema_dsn: str,
) -> None:
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    from loom.store.postgres import PostgresStore

    await write_into(PostgresStore(pg_schema_dsn), TURNS)
    rows, by_method, sent = await intake_rows(PostgresStore(pg_schema_dsn))
    assert rows <= ROW_BOUND, f"INTAKE read {rows} rows: {by_method}"
    questions = [m.content for m in sent if m.role == "user"]
    assert questions[0] == f"question number {TURNS - UNCOVERED_TURNS}"
