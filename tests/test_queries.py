"""Server queries (seed 003): the model asks the client, the run waits, the answer resumes it."""

from __future__ import annotations

import pytest

from loom import Agent
from loom.engine.journal import transcript
from loom.engine.runtime import Runtime
from loom.errors import AgentDefinitionError, InputError
from loom.events import EventType
from loom.messages import Message
from loom.queries import PatternQueryDetector
from loom.store import MemoryStore
from loom.testing import FunctionModel


def reader(messages: list[Message], tools: object) -> str:
    last = messages[-1]
    if last.metadata.get("server_query"):
        return f"The file begins with: {last.content.splitlines()[1]}"
    return "I need to read src/main.rs before I can answer."


def agent() -> Agent:
    return Agent(
        model=FunctionModel(reader), query_detector={"file_read": r"I need to read (?P<path>\S+)"}
    )


async def test_a_query_stops_the_run_and_the_answer_continues_the_turn() -> None:
    runtime = Runtime(MemoryStore())
    a = agent()
    first = await runtime.run(a, "what does main do?", session_id="s")
    assert first.stop_reason == "awaiting_input"
    query = first.pending_query
    assert query is not None and query["kind"] == "file_read"
    assert query["data"] == {"path": "src/main.rs"} and query["query_id"].startswith("query_")
    assert (await runtime.pending_query("s")).query_id == query["query_id"]  # type: ignore[union-attr]

    done = await runtime.answer_query(a, "s", 'fn main() { println!("hi") }')
    assert done.stop_reason == "completed"
    assert done.output == 'The file begins with: fn main() { println!("hi") }'
    assert await runtime.pending_query("s") is None
    events = await runtime.store.load_events("s")
    kinds = [e.type for e in events]
    assert EventType.SERVER_QUERY in kinds and EventType.QUERY_ANSWER in kinds
    stored = await runtime.store.load_messages("s")
    assert [(m.role, m.content) for m in transcript(events)] == [
        (m.role, m.content) for m in stored
    ]
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[2].metadata["server_query"] == query["query_id"]


async def test_bad_answers_are_typed_errors() -> None:
    runtime = Runtime(MemoryStore())
    a = agent()
    with pytest.raises(InputError, match="no server query"):
        await runtime.answer_query(a, "nothing", "x")
    await runtime.run(a, "what does main do?", session_id="s")
    with pytest.raises(InputError, match="not 'query_nope'"):
        await runtime.answer_query(a, "s", "x", query_id="query_nope")
    with pytest.raises(InputError, match="must be text"):
        await runtime.answer_query(a, "s", 42)  # type: ignore[arg-type]


async def test_a_new_message_instead_of_an_answer_drops_the_query() -> None:
    runtime = Runtime(MemoryStore())
    a = agent()
    await runtime.run(a, "what does main do?", session_id="s")
    await runtime.run(a.replace(query_detector=None), "never mind", session_id="s")
    assert await runtime.pending_query("s") is None


def test_a_bad_pattern_fails_when_the_agent_is_built() -> None:
    with pytest.raises(AgentDefinitionError, match="not a regular expression"):
        Agent(query_detector={"broken": "("})
    with pytest.raises(AgentDefinitionError, match="QueryDetector or a mapping"):
        Agent(query_detector=42)
    assert PatternQueryDetector({"env": r"environment\?"}).detect("no match here") is None
