"""The extraction job (``loom.memory.extraction``): finished turns become memories once, within
a budget, owned by the session's owner; bad answers, a model that is down and a session
deleted meanwhile never crash it nor write half a turn."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, Message, ModelResponse
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError, JobFailed, ModelUnavailable
from loom.memory.extraction import (
    DONE_NS,
    PENDING_NS,
    THREAD_OWNER_NS,
    ExtractionSettings,
    Extractor,
    extract_memories,
    finished_turns,
    job_run,
    memory_key,
    settings_from_env,
)
from loom.messages import Usage
from loom.pricing import default_prices
from loom.store import SQLiteStore
from loom.store.postgres import PostgresStore
from loom.testing import FunctionModel

TURNS = {"s1": ["my dog is called Rex", "I live in Oslo"], "s2": ["I prefer green tea"]}


def user_text(messages: list[Message]) -> str:
    """The user's part of the extraction prompt."""
    found = re.search(r"User:\n(.*?)\n\nAssistant:", messages[-1].content, re.S)
    assert found is not None, messages[-1].content
    return found.group(1)


def facts(messages: list[Message], tools: Any) -> str:
    """An extraction model: one memory per turn, the user's words."""
    return json.dumps({"memories": [{"text": "fact: " + user_text(messages)}]})


class Rig:
    def __init__(self, store: SQLiteStore | PostgresStore) -> None:
        self.store = store
        self.runtime = Runtime(store=store)
        self.agent = Agent(name="echo", model=FunctionModel(lambda m, t: "echo: " + m[-1].content))

    async def seed(self, turns: dict[str, list[str]] = TURNS) -> None:
        for session, texts in turns.items():
            for text in texts:
                result = await self.runtime.run(self.agent, text, session_id=session)
                assert result.stop_reason == "completed"

    async def items(self, prefix: tuple[str, ...] = ("memories",)) -> list[Any]:
        return await self.store.search_items(prefix, limit=1000)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = SQLiteStore(tmp_path / "loom.db")
    rig = Rig(store)
    await rig.seed()
    yield rig
    await rig.runtime.aclose()
    await store.close()


async def test_each_finished_turn_becomes_memories_once(rig: Rig) -> None:
    before = {s: await rig.store.get_session(s) for s in TURNS}
    events_before = {s: len(await rig.store.load_events(s)) for s in TURNS}
    model = FunctionModel(facts)
    report = await extract_memories(rig.store, ExtractionSettings(model=model))
    assert report.to_dict() | {"errors": [], "tokens": 0} == {
        "turns": 3,
        "memories": 3,
        "skipped": 0,
        "stopped": None,
        "errors": [],
        "tokens": 0,
        "cost": None,
    }
    items = await rig.items()
    assert sorted(i.value["text"] for i in items) == [
        "fact: I live in Oslo",
        "fact: I prefer green tea",
        "fact: my dog is called Rex",
    ]
    assert {i.namespace for i in items} == {("memories", "shared")}
    assert all(i.owner is None for i in items)
    rex = next(i for i in items if "Rex" in i.value["text"])
    turn = rex.value["source"]["turn"]
    assert rex.value["source"] == {"session": "s1", "turn": turn}
    assert rex.key == memory_key("s1", turn, 0)
    # the prompt is the turn's user and assistant text
    assert "Assistant:\necho: my dog is called Rex" in model.calls[0].messages[-1].content

    again = await extract_memories(rig.store, ExtractionSettings(model=model))
    assert (again.turns, again.memories) == (0, 0)
    assert len(model.calls) == 3  # a finished turn is never sent twice
    # a new turn in an old session: only it is extracted
    await rig.runtime.run(rig.agent, "my cat is Tom", session_id="s1")
    third = await extract_memories(rig.store, ExtractionSettings(model=model))
    assert (third.turns, third.memories) == (1, 1)
    assert user_text(model.calls[-1].messages) == "my cat is Tom"
    # nothing was charged to, or written into, the sessions read
    for s in ("s2",):
        after = await rig.store.get_session(s)
        assert after is not None and before[s] is not None
        assert after.usage == before[s].usage
        assert len(await rig.store.load_events(s)) == events_before[s]


async def test_memories_belong_to_the_sessions_owner(rig: Rig) -> None:
    await rig.store.put_value(THREAD_OWNER_NS, "s2", "alice")
    settings = ExtractionSettings(
        model=FunctionModel(facts), namespace=("mem", "{owner}", "{agent}")
    )
    report = await extract_memories(rig.store, settings)
    assert report.memories == 3
    [tea] = await rig.store.search_items(("mem", "alice"), owner="alice")
    assert (tea.namespace, tea.owner, tea.value["text"]) == (
        ("mem", "alice", "echo"),
        "alice",
        "fact: I prefer green tea",
    )
    assert await rig.store.search_items(("mem",), owner="bob") == []
    assert len(await rig.store.search_items(("mem", "shared"))) == 2


async def test_an_owner_no_namespace_can_hold_is_skipped_without_a_model_call(rig: Rig) -> None:
    await rig.store.put_value(THREAD_OWNER_NS, "s2", "team.alpha")  # '.' is no namespace part
    model = FunctionModel(facts)
    report = await extract_memories(rig.store, ExtractionSettings(model=model))
    assert (report.turns, report.memories, report.skipped) == (2, 2, 1)
    assert "team.alpha" in report.errors[0]
    assert all("tea" not in user_text(c.messages) for c in model.calls)
    marks = await rig.store.list_keys(DONE_NS, prefix="s2")
    assert len(marks) == 1  # skipped for good: not tried on every run


async def test_a_malformed_answer_is_retried_then_skipped(rig: Rig) -> None:
    def half_broken(messages: list[Message], tools: Any) -> str:
        if "tea" in user_text(messages):
            return '{"memories": [{"txt": "no text field"}]}'
        return facts(messages, tools)

    model = FunctionModel(half_broken)
    settings = ExtractionSettings(model=model, attempts=2)
    first = await extract_memories(rig.store, settings)
    assert (first.turns, first.memories, first.skipped, first.stopped) == (3, 2, 0, None)
    assert "malformed answer" in first.errors[0] and "s2" in first.errors[0]
    [pending] = await rig.store.list_keys(PENDING_NS)
    assert (await rig.store.get_value(PENDING_NS, pending))["attempts"] == 1
    second = await extract_memories(rig.store, settings)  # the cursor waited for it
    assert (second.turns, second.memories, second.skipped) == (1, 0, 1)
    assert await rig.store.list_keys(PENDING_NS) == []
    third = await extract_memories(rig.store, settings)
    assert third.turns == 0 and len(model.calls) == 4
    assert len(await rig.items()) == 2


async def test_code_fences_around_the_json_are_accepted(rig: Rig) -> None:
    def fenced(messages: list[Message], tools: Any) -> str:
        return "```json\n" + facts(messages, tools) + "\n```"

    report = await extract_memories(rig.store, ExtractionSettings(model=FunctionModel(fenced)))
    assert (report.memories, report.errors) == (3, [])


async def test_a_model_that_is_down_stops_the_run_and_writes_nothing(rig: Rig) -> None:
    up = {"yes": False}

    def flaky(messages: list[Message], tools: Any) -> str:
        if not up["yes"]:
            raise ModelUnavailable("connection refused")
        return facts(messages, tools)

    extractor = Extractor(rig.store, ExtractionSettings(model=FunctionModel(flaky)))
    report = await extractor.run()
    assert (report.turns, report.memories, report.stopped) == (0, 0, "model_error")
    assert "connection refused" in report.errors[0]
    assert await rig.items() == []
    assert await rig.store.list_keys(DONE_NS) == []
    assert await rig.store.list_keys(PENDING_NS) == []
    with pytest.raises(JobFailed) as failed:  # the scheduler's job: retried with backoff
        await job_run(extractor)()
    assert failed.value.retryable
    up["yes"] = True
    summary = await job_run(extractor)()
    assert (summary["turns"], summary["memories"], summary["stopped"]) == (3, 3, None)


async def test_budgets_stop_the_run_cleanly_and_the_next_run_carries_on(rig: Rig) -> None:
    model = FunctionModel(facts)
    first = await extract_memories(rig.store, ExtractionSettings(model=model, max_turns=2))
    assert first.to_dict()["stopped"] == "budget"
    assert (first.turns, first.memories) == (2, 2)
    rest = await extract_memories(rig.store, ExtractionSettings(model=model, max_turns=2))
    assert (rest.turns, rest.memories, rest.stopped) == (1, 1, None)
    assert len(model.calls) == 3


async def test_token_and_cost_budgets_use_the_reported_usage_and_the_runtimes_prices(
    rig: Rig,
) -> None:
    def billed(messages: list[Message], tools: Any) -> ModelResponse:
        usage = Usage(input_tokens=1000, output_tokens=100, requests=1)
        return ModelResponse(text=facts(messages, tools), usage=usage)

    model = FunctionModel(billed, name="openai:gpt-4o-mini")
    by_tokens = await extract_memories(rig.store, ExtractionSettings(model=model, max_tokens=2000))
    # checked before each call: 1100 used + this prompt fits 2000, 2200 + the next does not
    assert (by_tokens.turns, by_tokens.stopped) == (2, "budget")
    assert by_tokens.usage.total_tokens == 2200

    await rig.seed({"s3": ["one", "two", "three"]})
    prices = default_prices().with_overrides({"openai:gpt-4o-mini": {"input": 1, "output": 10}})
    # each call: 1000 * $1/M + 100 * $10/M = $0.002
    by_cost = await extract_memories(
        rig.store, ExtractionSettings(model=model, max_cost=0.003), prices=prices
    )
    assert (by_cost.turns, by_cost.stopped) == (2, "budget")  # $0.002 < $0.003 <= $0.004
    assert by_cost.usage.cost == pytest.approx(0.004)

    unpriced = ExtractionSettings(model=FunctionModel(facts, name="mystery"), max_cost=1.0)
    with pytest.raises(ConfigurationError, match="price"):
        await extract_memories(rig.store, unpriced)


async def test_a_turn_larger_than_the_token_budget_is_skipped_not_retried_forever(
    rig: Rig,
) -> None:
    await rig.runtime.run(rig.agent, "word " * 3000, session_id="s3")
    model = FunctionModel(facts)
    report = await extract_memories(rig.store, ExtractionSettings(model=model, max_tokens=1000))
    assert (report.turns, report.skipped, report.stopped) == (3, 1, None)
    assert "max_tokens" in report.errors[0]


async def test_a_session_deleted_while_its_turn_is_extracted_gets_no_memories(rig: Rig) -> None:
    async def deleting(messages: list[Message], tools: Any) -> str:
        if "tea" in user_text(messages):
            await rig.store.delete_session("s2")
        return facts(messages, tools)

    report = await extract_memories(rig.store, ExtractionSettings(model=FunctionModel(deleting)))
    assert (report.turns, report.memories, report.skipped, report.stopped) == (3, 2, 1, None)
    assert all("tea" not in i.value["text"] for i in await rig.items())
    assert await rig.store.list_keys(PENDING_NS) == []


async def test_a_retry_with_a_shorter_answer_leaves_no_stale_memory(tmp_path: Path) -> None:
    """Items written, then the marker failed: the retry's answer has fewer memories, and the
    keys it no longer writes are deleted (nothing of the first answer lingers)."""

    class MarkerFails(SQLiteStore):
        fail = True

        async def put_value(self, namespace: str, key: str, value: Any) -> None:
            if namespace == DONE_NS and self.fail:
                self.fail = False
                raise OSError("disk full")
            await super().put_value(namespace, key, value)

    store = MarkerFails(tmp_path / "loom.db")
    rig = Rig(store)
    await rig.seed({"s1": ["a b c"]})
    answers = [
        {"memories": [{"text": "one"}, {"text": "two"}, {"text": "three"}]},
        {"memories": [{"text": "only"}]},
    ]
    model = FunctionModel(lambda m, t: json.dumps(answers.pop(0)))
    with pytest.raises(OSError, match="disk full"):
        await extract_memories(store, ExtractionSettings(model=model))
    assert len(await rig.items()) == 3
    report = await extract_memories(store, ExtractionSettings(model=model))
    assert report.memories == 1
    assert [i.value["text"] for i in await rig.items()] == ["only"]
    await rig.runtime.aclose()
    await store.close()


async def test_a_forks_shared_turns_are_not_extracted_again(rig: Rig) -> None:
    model = FunctionModel(facts)
    await extract_memories(rig.store, ExtractionSettings(model=model))
    fork = await rig.runtime.fork(rig.agent, "s1")
    await rig.runtime.run(rig.agent, "my bike is red", session_id=fork)
    shared = await finished_turns(rig.store, fork)
    assert [t.session_id for t in shared] == ["s1", "s1", fork]
    report = await extract_memories(rig.store, ExtractionSettings(model=model))
    assert (report.turns, report.memories) == (1, 1)
    assert user_text(model.calls[-1].messages) == "my bike is red"


def test_settings_check_what_they_are_given() -> None:
    with pytest.raises(ConfigurationError, match="namespace"):
        ExtractionSettings(namespace=("memories", "{user}"))
    with pytest.raises(ConfigurationError, match="max_turns"):
        ExtractionSettings(max_turns=0)
    with pytest.raises(ConfigurationError, match="max_cost"):
        ExtractionSettings(max_cost=-1)
    assert settings_from_env({}) is None
    env = {
        "LOOM_MEMORY_EXTRACT": "openai:gpt-4o-mini",
        "LOOM_MEMORY_EXTRACT_EVERY": "60",
        "LOOM_MEMORY_EXTRACT_MAX_TURNS": "5",
        "LOOM_MEMORY_EXTRACT_MAX_COST": "0.5",
        "LOOM_MEMORY_EXTRACT_MAX_TOKENS": "none",
        "LOOM_MEMORY_EXTRACT_NAMESPACE": "mem.{owner}",
    }
    s = settings_from_env(env)
    assert s is not None
    assert (s.model, s.every, s.max_turns, s.max_cost, s.max_tokens, s.namespace) == (
        "openai:gpt-4o-mini",
        60.0,
        5,
        0.5,
        None,
        ("mem", "{owner}"),
    )
    with pytest.raises(ConfigurationError, match="LOOM_MEMORY_EXTRACT_MAX_TURNS"):
        settings_from_env({"LOOM_MEMORY_EXTRACT": "local", "LOOM_MEMORY_EXTRACT_MAX_TURNS": "x"})


def test_the_owner_namespace_is_the_servers() -> None:
    from loom.server.ownership import OWNER_NS

    assert THREAD_OWNER_NS == OWNER_NS


async def test_a_store_without_items_is_a_configuration_error() -> None:
    from loom.store.memory import MemoryStore

    with pytest.raises(ConfigurationError, match="key-values"):
        Extractor(MemoryStore())


async def test_on_postgresql_too(pg_schema_dsn: str) -> None:
    store = PostgresStore(pg_schema_dsn)
    rig = Rig(store)
    try:
        await rig.seed()
        await store.put_value(THREAD_OWNER_NS, "s2", "alice")
        model = FunctionModel(facts)
        first = await extract_memories(store, ExtractionSettings(model=model, max_turns=2))
        rest = await extract_memories(store, ExtractionSettings(model=model))
        assert (first.turns, first.stopped, rest.turns, rest.stopped) == (2, "budget", 1, None)
        assert (await extract_memories(store, ExtractionSettings(model=model))).turns == 0
        assert len(model.calls) == 3
        [tea] = await store.search_items(("memories", "alice"), owner="alice")
        assert (tea.owner, tea.value["text"]) == ("alice", "fact: I prefer green tea")
        assert len(await store.search_items(("memories",), limit=100)) == 3
    finally:
        await rig.runtime.aclose()
        await store.close()
