"""Memory tools over the store's items and ``search_history``, through ``Runtime.run``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError
from loom.memory import MemoryConfig
from loom.memory.compression import SEGMENTS
from loom.memory.tokens import TiktokenCounter
from loom.server.lifecycle import ServerRuntime
from loom.server.ownership import Principal, current_principal
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

COUNTER = TiktokenCounter("cl100k_base")
COMMANDS = {
    "SAVE": lambda arg: ToolCall(name="save_memory", arguments={"text": arg}),
    "RECALL": lambda arg: ToolCall(name="recall_memories", arguments={"query": arg}),
    "FORGET": lambda arg: ToolCall(name="forget_memory", arguments={"key": arg}),
    "HIST": lambda arg: ToolCall(name="search_history", arguments={"query": arg}),
    "FETCH": lambda arg: ToolCall(name="fetch", arguments={"n": int(arg)}),
}


@tool(effect="pure", blocking=False)
def fetch(n: int) -> str:
    """Return n words of filler.

    Args:
        n: How many words.
    """
    return " ".join(f"filler{i}" for i in range(n))


def scripted() -> FunctionModel:
    """``VERB: argument`` user messages become that tool call; a tool result is echoed back."""

    def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
        if messages and messages[0].content.startswith("You compress"):
            return "\n".join(f"## {s}\n{s.lower()} of the span" for s in SEGMENTS[:-1])
        last = messages[-1]
        if last.role == "user":
            verb, _, arg = last.content.partition(": ")
            if verb in COMMANDS:
                return ModelResponse(tool_calls=[COMMANDS[verb](arg)])
            return "noted"
        return last.content

    return FunctionModel(fn)


def memory_agent(window: int | None = None, **cfg: Any) -> Agent:
    config = MemoryConfig(
        counter=COUNTER,
        retry_delays=(0.0,),
        memory_file=None,
        store_tools=True,
        history_tool=True,
        **cfg,
    )
    extra: dict[str, Any] = {"context_window": window, "reserved_output_tokens": 400}
    return Agent(
        "mem",
        "You are a test agent.",
        model=scripted(),
        tools=[fetch],
        memory=config,
        **(extra if window else {}),
    )


@pytest.fixture
def as_owner() -> Callable[[str | None], None]:
    """Sets the API key principal the server sets for a request (``current_principal``); the
    test's task has its own context, so nothing leaks into other tests."""

    def use(name: str | None) -> None:
        current_principal.set(None if name is None else Principal(name, b""))

    return use


async def ask(runtime: Runtime, agent: Agent, text: str, session: str) -> Any:
    result = await runtime.run(agent, text, session_id=session)
    return json.loads(result.text) if result.text[:1] in "[{" else result.text


async def test_a_memory_saved_in_one_session_is_recalled_in_another_of_the_same_owner(
    as_owner: Any,
) -> None:
    runtime = ServerRuntime(store=MemoryStore())  # the server decides the owner
    agent = memory_agent()
    as_owner("alice")
    saved = await ask(runtime, agent, "SAVE: my favourite colour is teal", "a1")
    found = await ask(runtime, agent, "RECALL: favourite colour", "a2")
    assert found == [{"key": saved["saved"], "text": "my favourite colour is teal"}]
    items = await runtime.store.search_items(("memories",))
    assert [(i.namespace, i.owner) for i in items] == [(("memories", "alice"), "alice")]


async def test_another_owner_does_not_see_the_memory(as_owner: Any) -> None:
    runtime = ServerRuntime(store=MemoryStore())
    agent = memory_agent()
    as_owner("alice")
    await ask(runtime, agent, "SAVE: the launch code is 7741", "a1")
    as_owner("bob")
    assert await ask(runtime, agent, "RECALL: launch code", "b1") == []
    as_owner("alice")
    assert len(await ask(runtime, agent, "RECALL: launch code", "a2")) == 1


async def test_forget_removes_the_memory(as_owner: Any) -> None:
    runtime = ServerRuntime(store=MemoryStore())
    agent = memory_agent()
    as_owner("alice")
    key = (await ask(runtime, agent, "SAVE: I live in Lisbon", "a1"))["saved"]
    assert await ask(runtime, agent, f"FORGET: {key}", "a2") == {"forgotten": key}
    assert await ask(runtime, agent, "RECALL: Lisbon", "a3") == []
    # forgetting again (a retried call) is not an error
    assert await ask(runtime, agent, f"FORGET: {key}", "a4") == {"forgotten": None}


async def test_the_item_key_comes_from_the_idempotency_key_so_a_retry_writes_once() -> None:
    runtime = Runtime(store=MemoryStore())
    agent = memory_agent()
    saved = await ask(runtime, agent, "SAVE: shared fact", "s1")
    run = await runtime.run(agent, "SAVE: shared fact", session_id="s1")
    assert json.loads(run.text)["saved"] != saved["saved"]  # another call, another item
    tool_ = agent.tools["save_memory"]
    assert tool_.effect == "idempotent"
    from loom.tools.base import RunContext

    ctx = RunContext("s1", "run_x", "call_1", "mem", store=runtime.store)
    first = await tool_.run(ctx, {"text": "once"})
    again = await tool_.run(
        RunContext("s1", "run_x", "call_1", "mem", store=runtime.store), {"text": "once"}
    )
    assert first == again
    assert len(await runtime.store.search_items(("memories", "shared"), query="once")) == 1


async def test_bad_input_and_a_store_without_items_are_error_results() -> None:
    runtime = Runtime(store=MemoryStore())
    agent = memory_agent()
    result = await runtime.run(agent, "RECALL: ???", session_id="s")
    assert "Error (invalid_arguments)" in result.text and "keywords" in result.text
    from loom.tools.base import RunContext

    save = agent.tools["save_memory"]
    with pytest.raises(Exception, match="keeps no memories across sessions"):
        await save.run(RunContext("s", "r", "c", "mem", store=object()), {"text": "x"})
    with pytest.raises(ConfigurationError, match="store_namespace"):
        MemoryConfig(store_namespace=("memories", "{user}"))


async def test_the_names_do_not_clash_with_the_kernel_tools() -> None:
    agent = memory_agent(tools=True)
    names = list(agent.tools)
    assert names.count("remember") == 1
    assert {"save_memory", "recall_memories", "forget_memory", "search_history"} <= set(names)


async def test_search_history_finds_a_fact_the_builder_summarised_away() -> None:
    runtime = Runtime(store=MemoryStore())
    agent = memory_agent(window=2000)
    model = agent.model
    await runtime.run(agent, "my invoice number is ZEBRA4471", session_id="long")
    for _ in range(20):
        await runtime.run(agent, "FETCH: 120", session_id="long")
    events = await runtime.store.load_events("long")
    assert any(e.type is EventType.COMPRESSION_COMPLETE for e in events)
    last = [c for c in model.calls if not c.messages[0].content.startswith("You compress")][-1]
    assert not any("ZEBRA4471" in m.content for m in last.messages)  # summarised away

    found = await ask(runtime, agent, "HIST: invoice number", "long")
    assert found[0]["role"] == "user" and found[0]["position"] == 0
    assert "ZEBRA4471" in found[0]["excerpt"]
    # the question itself (this turn) is not an answer, nor is an earlier search's result
    assert [f["position"] for f in found] == [0]
    again = await ask(runtime, agent, "HIST: invoice number", "long")
    assert again[0]["position"] == 0 and all(f["role"] != "tool" for f in again)


async def test_served_runs_save_and_recall_as_the_api_keys_principal() -> None:
    """Through the server's own key middleware (in process): the key's name is the owner."""
    import hashlib

    import httpx

    from loom.server import AgentRegistry, create_app
    from loom.server.app import server_runtime
    from loom.server.security import KeyRing, SecurityConfig

    keys = KeyRing(
        Principal(name, hashlib.sha256(name.encode()).digest()) for name in ("alice", "bob")
    )
    config = SecurityConfig(keys=keys)
    store = MemoryStore()
    app = create_app(AgentRegistry([memory_agent()]), server_runtime(store, config), config)

    async def weave(key: str, message: str, session: str) -> Any:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://loom.test"
        ) as http:
            body = {"agent": "mem", "message": message, "session_id": session}
            r = await http.post("/v1/weave", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return r.json()

    await weave("alice", "SAVE: alice likes green tea", "s1")
    recalled = await weave("alice", "RECALL: green tea", "s2")
    assert "alice likes green tea" in json.dumps(recalled)
    assert "alice likes" not in json.dumps(await weave("bob", "RECALL: green tea", "s3"))
    items = await store.search_items(("memories",))
    assert [(i.namespace, i.owner) for i in items] == [(("memories", "alice"), "alice")]


def test_an_agent_definition_does_not_name_the_memory_tools_as_built_ins() -> None:
    """They come from ``MemoryConfig``, like ``remember``: a definition naming them could not be
    loaded back (they are not built-in tools)."""
    from loom.definition import definition_of

    assert definition_of(memory_agent()).tools == ["fetch"]
