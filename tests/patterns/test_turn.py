"""Patterns in the loop: matched once per turn, placed in ROM, announced with their scores."""

from __future__ import annotations

from pathlib import Path

from loom import Agent, EventType, ModelResponse, ToolCall, tool
from loom.patterns import PatternLibrary
from loom.store.memory import MemoryStore
from loom.testing import ScriptedModel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "patterns"
E = EventType


@tool
def run_sql(query: str) -> str:
    """Run a SQL query."""
    return "Seq Scan on orders (actual time=0.1..2900.0 rows=9000000)"


async def test_matched_patterns_go_into_rom_for_every_call_of_the_turn() -> None:
    library = PatternLibrary.from_dir(EXAMPLES)
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[ToolCall(name="run_sql", arguments={"query": "EXPLAIN ..."})]
            ),
            "Add an index on orders(customer_id).",
        ]
    )
    store = MemoryStore()
    agent = Agent(
        "dba",
        "You are a database assistant.",
        model=model,
        tools=[run_sql],
        patterns=library,
        store=store,
    )
    message = "My report query on the orders table is really slow and times out"
    events = [e async for e in agent.stream(message, session_id="s")]

    matched = [e for e in events if e.type is E.PATTERNS_MATCHED]
    assert len(matched) == 1  # once per turn, not per iteration
    data = matched[0].data
    assert data["patterns"][0]["name"] == "sql-slow-query"
    assert all(0 < p["score"] <= 1 for p in data["patterns"])
    assert [p["score"] for p in data["patterns"]] == sorted(
        (p["score"] for p in data["patterns"]), reverse=True
    )
    assert data["library_version"] == 0 and data["library_size"] == len(library)
    assert matched[0].iteration == 0  # matched at INTAKE, before the first iteration
    assert events.index(matched[0]) < next(i for i, e in enumerate(events) if e.type is E.LLM_START)

    # Both model calls got the same system message: instructions + the matched pattern.
    systems = [call.messages[0] for call in model.calls]
    assert [m.role for m in systems] == ["system", "system"]
    assert systems[0].content == systems[1].content
    assert systems[0].content.startswith("You are a database assistant.")
    assert "## Pattern: Diagnose a slow SQL query (sql-slow-query)" in systems[0].content
    assert "EXPLAIN (ANALYZE) output" in systems[0].content
    # ROM is not part of the transcript: nothing about patterns was stored as a message.
    assert all("## Pattern:" not in m.content for m in await store.load_messages("s"))
    # ... but the match is journaled with the turn.
    assert any(e.type is E.PATTERNS_MATCHED for e in await store.load_events("s"))


async def test_each_turn_matches_its_own_message() -> None:
    library = PatternLibrary.from_dir(EXAMPLES)
    model = ScriptedModel(["a", "b"])
    agent = Agent("ops", "Ops helper.", model=model, patterns=library)
    await agent.run("The pod is in CrashLoopBackOff", session_id="s")
    await agent.run("please review my pull request diff", session_id="s")
    assert "(kubernetes-crashloop)" in model.calls[0].messages[0].content
    second = model.calls[1].messages[0].content
    assert "(code-review)" in second and "(kubernetes-crashloop)" not in second


async def test_no_match_adds_nothing_and_says_so() -> None:
    model = ScriptedModel(["hi"])
    agent = Agent("ops", "Ops helper.", model=model, patterns=PatternLibrary.from_dir(EXAMPLES))
    events = [e async for e in agent.stream("hello there, how are you?")]
    (matched,) = [e for e in events if e.type is E.PATTERNS_MATCHED]
    assert matched.data["patterns"] == []
    assert model.calls[0].messages[0].content == "Ops helper."


async def test_the_library_k_and_min_score_apply() -> None:
    library = PatternLibrary.from_dir(EXAMPLES, k=1, min_score=0.0)
    model = ScriptedModel(["x"])
    agent = Agent("ops", "Ops.", model=model, patterns=library)
    events = [e async for e in agent.stream("slow query and a docker image that is huge")]
    (matched,) = [e for e in events if e.type is E.PATTERNS_MATCHED]
    assert len(matched.data["patterns"]) == 1
    assert model.calls[0].messages[0].content.count("## Pattern:") == 1


def test_agent_accepts_a_directory_and_rejects_other_things() -> None:
    agent = Agent("ops", "Ops.", model=ScriptedModel([]), patterns=str(EXAMPLES))
    assert agent.patterns is not None and len(agent.patterns) == 15
    import pytest

    from loom.errors import AgentDefinitionError

    with pytest.raises(AgentDefinitionError, match="field 'patterns'"):
        Agent("ops", "Ops.", model=ScriptedModel([]), patterns=42)  # type: ignore[arg-type]
