"""Recall at CONTEXT (issue #29): memories from earlier sessions of the run's owner, searched
once per turn with the latest user message, placed whole in the Kernel within their budget;
a failing search is a warning, never a failed turn."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.engine.run_inputs import RunOptions
from loom.engine.runtime import Runtime
from loom.errors import ConfigurationError
from loom.memory import MemoryConfig, RecallConfig
from loom.memory.assembly import RECALL_HEADER
from loom.memory.tokens import TiktokenCounter
from loom.messages import RunResult
from loom.store.items import Item
from loom.store.memory import MemoryStore
from loom.testing import FunctionModel

COUNTER = TiktokenCounter("cl100k_base")


class Seen:
    """A model that records the messages of every call; ``SAVE: x`` saves ``x``, ``TOOLS: n``
    makes n tool calls one after another, anything else is answered ``ok``."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    def model(self) -> FunctionModel:
        def fn(messages: list[Message], tools: Any) -> ModelResponse | str:
            self.calls.append(list(messages))
            user = next(m for m in reversed(messages) if m.role == "user").content
            verb, _, arg = user.partition(": ")
            done = sum(1 for m in messages if m.role == "tool")
            if verb == "SAVE" and not done:
                call = ToolCall(name="save_memory", arguments={"text": arg})
                return ModelResponse(tool_calls=[call])
            if verb == "TOOLS" and done < int(arg):
                return ModelResponse(tool_calls=[ToolCall(name="ping", arguments={})])
            return "ok"

        return FunctionModel(fn)

    def kernel(self, call: int = -1) -> str:
        """The text of the system messages of ``call`` (where the Kernel goes)."""
        return "\n".join(m.content for m in self.calls[call] if m.role == "system")


@tool(effect="pure")
def ping() -> str:
    """Answer pong."""
    return "pong"


def agent(seen: Seen, recall: RecallConfig | None = None, **memory: Any) -> Agent:
    config = MemoryConfig(
        counter=COUNTER,
        memory_file=None,
        store_tools=True,
        recall=recall or RecallConfig(),
        **memory,
    )
    return Agent("mem", "You are a test agent.", model=seen.model(), tools=[ping], memory=config)


async def run(runtime: Runtime, a: Agent, text: str, session: str, owner: str | None) -> RunResult:
    return await runtime.run(a, text, session_id=session, options=RunOptions(owner=owner))


async def streamed(runtime: Runtime, a: Agent, text: str, session: str, owner: str) -> list[Any]:
    events = []
    opts = RunOptions(owner=owner)
    async for event in runtime.stream(a, text, session_id=session, options=opts):
        events.append(event)
    return events


def component(events: list[Any], name: str) -> list[tuple[EventType, dict[str, Any]]]:
    kinds = (
        EventType.CONTEXT_COMPONENT_INCLUDED,
        EventType.CONTEXT_COMPONENT_TRUNCATED,
        EventType.CONTEXT_COMPONENT_EXCLUDED,
    )
    return [(e.type, e.data) for e in events if e.type in kinds and e.data.get("component") == name]


async def test_a_fact_saved_by_alice_is_recalled_in_her_next_session_not_in_bobs() -> None:
    seen = Seen()
    runtime = Runtime(store=MemoryStore())
    a = agent(seen)
    saved = await run(runtime, a, "SAVE: my favourite colour is teal", "a1", "alice")
    assert saved.stop_reason == "completed"
    seen.calls.clear()
    await run(runtime, a, "what is my favourite colour?", "a2", "alice")
    assert "my favourite colour is teal" in seen.kernel()
    assert RECALL_HEADER in seen.kernel()
    seen.calls.clear()
    await run(runtime, a, "what is my favourite colour?", "b1", "bob")
    assert "teal" not in "\n".join(m.content for m in seen.calls[-1])
    seen.calls.clear()
    await run(runtime, a, "what is my favourite colour?", "s1", None)  # shared: not alice's
    assert "teal" not in "\n".join(m.content for m in seen.calls[-1])


async def test_recalled_memories_are_cut_whole_within_their_budget() -> None:
    seen = Seen()
    store = MemoryStore()
    facts = [
        "the project codename is heron",  # short and the best match: it goes in
        "the project " + " ".join(f"detail{i}" for i in range(400)),  # too long for the budget
        "the project deadline is friday",
    ]
    for i, text in enumerate(facts):
        await store.put_item(("memories", "alice"), f"k{i}", {"text": text}, owner="alice")
    runtime = Runtime(store=store)
    a = agent(seen, RecallConfig(max_tokens=60))
    events = await streamed(runtime, a, "tell me about the project codename", "a1", "alice")
    kernel = seen.kernel()
    assert "the project codename is heron" in kernel
    assert "the project deadline is friday" in kernel
    assert "detail0" not in kernel  # never half of one: all of it or none
    [(kind, data)] = component(events, "recall")
    assert kind is EventType.CONTEXT_COMPONENT_TRUNCATED
    assert data["memories"] == 3 and data["memories_kept"] == 2
    assert sorted(data["keys"]) == ["k0", "k2"]
    assert data["tokens"] <= 60
    # nothing fits: excluded whole, the turn goes on
    b = agent(seen, RecallConfig(max_tokens=5))
    events = await streamed(runtime, b, "tell me about the project codename", "a2", "alice")
    [(kind, data)] = component(events, "recall")
    assert kind is EventType.CONTEXT_COMPONENT_EXCLUDED
    assert "heron" not in seen.kernel()


async def test_the_kernels_facts_come_first_and_the_kernel_budget_holds() -> None:
    from loom.memory.tools import set_kernel

    seen = Seen()
    store = MemoryStore()
    for i in range(5):
        text = f"note {i} about the garden " + "leaf " * 30
        await store.put_item(("memories", "alice"), f"n{i}", {"text": text}, owner="alice")
    runtime = Runtime(store=store)
    a = agent(seen, RecallConfig(max_tokens=1000), kernel_tokens=150)
    await run(runtime, a, "hello", "a1", "alice")
    await set_kernel(runtime.store, "a1", "plan", "water the garden on monday")
    events = await streamed(runtime, a, "what about the garden", "a1", "alice")
    kernel = next(m for m in seen.calls[-1] if RECALL_HEADER in m.content)
    assert kernel.content.index("water the garden") < kernel.content.index(RECALL_HEADER)
    [(_, whole)] = component(events, "kernel")
    assert whole["tokens"] <= 150  # facts and memories together, within the Kernel's budget
    [(kind, data)] = component(events, "recall")
    assert kind is EventType.CONTEXT_COMPONENT_TRUNCATED and 0 < data["memories_kept"] < 5


class CountingStore(MemoryStore):
    """A memory store that counts its searches and can fail or stall them."""

    def __init__(self, fail: BaseException | None = None, stall: bool = False) -> None:
        super().__init__()
        self.searches = 0
        self.fail, self.stall = fail, stall

    async def search_items(self, prefix: Sequence[str], **kw: Any) -> list[Item]:
        self.searches += 1
        if self.fail is not None:
            raise self.fail
        if self.stall:
            await asyncio.Event().wait()  # never answers: the recall timeout ends it
        return await super().search_items(prefix, **kw)


async def test_one_search_per_turn_across_three_tool_iterations() -> None:
    seen = Seen()
    store = CountingStore()
    await store.put_item(("memories", "alice"), "k", {"text": "tools ping pong"}, owner="alice")
    runtime = Runtime(store=store)
    result = await run(runtime, agent(seen), "TOOLS: 3", "a1", "alice")
    assert result.stop_reason == "completed"
    assert len(seen.calls) == 4  # three tool iterations and the answer
    assert store.searches == 1
    assert all("tools ping pong" in seen.kernel(i) for i in range(4))  # every call has it
    await run(runtime, agent(seen), "TOOLS: 1", "a1", "alice")
    assert store.searches == 2  # the next turn searches again


@pytest.mark.parametrize(
    ("store", "said"),
    [
        (CountingStore(fail=RuntimeError("disk on fire")), "disk on fire"),
        (CountingStore(stall=True), "longer than 0.05 s"),
    ],
)
async def test_a_failing_or_stalled_search_still_answers_the_turn(
    store: CountingStore, said: str
) -> None:
    seen = Seen()
    runtime = Runtime(store=store)
    a = agent(seen, RecallConfig(timeout=0.05))
    events = await streamed(runtime, a, "what do you remember", "a1", "alice")
    finish = events[-1]
    assert finish.type is EventType.AGENT_FINISH and finish.data["stop_reason"] == "completed"
    warnings = [e.warning for e in events if e.type is EventType.WARNING]
    assert len(warnings) == 1 and said in warnings[0]
    assert store.searches == 1


async def test_recall_is_off_by_default() -> None:
    seen = Seen()
    store = CountingStore()
    await store.put_item(("memories", "shared"), "k", {"text": "the answer is 42"})
    a = Agent("mem", "x", model=seen.model(), memory=MemoryConfig(memory_file=None))
    await Runtime(store=store).run(a, "what is the answer", session_id="s")
    assert store.searches == 0 and "42" not in seen.kernel()
    assert MemoryConfig(recall=True).recall == RecallConfig()  # True means the defaults


@pytest.mark.parametrize(
    "bad",
    [
        {"limit": 0},
        {"limit": 51},
        {"max_tokens": -1},
        {"timeout": 0},
        {"namespaces": ()},
        {"namespaces": (("memories", "{nobody}"),)},
        {"namespaces": "memories"},
    ],
)
def test_bad_recall_settings_are_configuration_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="RecallConfig"):
        RecallConfig(**bad)


def test_recall_must_be_a_recall_config() -> None:
    with pytest.raises(ConfigurationError, match=r"MemoryConfig\.recall"):
        MemoryConfig(recall=5)  # type: ignore[arg-type]


async def test_a_namespace_every_owner_shares_still_recalls_only_the_runs_owners_items() -> None:
    """The namespace template names no owner here (a team's notes): the store's owner check,
    not the namespace, keeps alice's item out of bob's Kernel."""
    store = MemoryStore()
    await store.put_item(("team",), "a", {"text": "the vault code is 4711"}, owner="alice")
    seen = Seen()
    a = agent(seen, RecallConfig(namespaces=(("team",),)))
    runtime = Runtime(store)
    await run(runtime, a, "what is the vault code?", "bob-1", owner="bob")
    assert "4711" not in seen.kernel()
    await run(runtime, a, "what is the vault code?", "alice-1", owner="alice")
    assert "4711" in seen.kernel()
