"""Prompt caching in the segmented builder: the cache points it hands the provider, the
prefix kept across compaction in a tight window, and CACHE_BUST when a prefix breaks for no
reason Loom knows."""

from __future__ import annotations

import re
from typing import Any

from loom import Agent, EventType, Message, ModelResponse, ToolCall, tool
from loom.events import AgentEvent
from loom.memory import MemoryConfig
from loom.memory.builder import SegmentedContextBuilder
from loom.memory.compression import SEGMENTS
from loom.memory.tools import set_kernel
from loom.messages import ToolSpec
from loom.models.base import ModelSettings
from loom.models.cache import PrefixTracker, Segments
from loom.testing import FunctionModel

E = EventType
SIZES = (3, 40, 250, 900, 15, 120)


@tool(effect="pure", blocking=False)
def fetch(n: int, topic: str) -> str:
    """Fetch n lines about a topic.

    Args:
        n: Lines wanted.
        topic: What about.
    """
    return "\n".join(f"{topic} fact {i}: value {i * 7}" for i in range(n))


def model_fn(messages: list[Message], tools: Any) -> ModelResponse | str:
    first, last = messages[0], messages[-1]
    if first.content.startswith("You compress"):
        return "\n".join(f"## {s}\n{s}: earlier turns" for s in SEGMENTS[:-1])
    if last.role == "tool":
        return f"Noted {len(last.content)} characters."
    n = int(re.match(r"turn (\d+)", last.content).group(1))  # type: ignore[union-attr]
    args = {"n": SIZES[n % len(SIZES)], "topic": f"t{n}"}
    return ModelResponse(tool_calls=[ToolCall(name="fetch", arguments=args)])


def agent_of(model: FunctionModel, **kw: Any) -> Agent:
    return Agent(
        "cache",
        "You are a research assistant. Use fetch to look things up.",
        model=model,
        tools=[fetch],
        context_window=4096,
        reserved_output_tokens=512,
        **{"memory": MemoryConfig(retry_delays=(0.0,)), **kw},
    )


async def turns(agent: Agent, n: int, session: str = "s", start: int = 0) -> list[AgentEvent]:
    events: list[AgentEvent] = []
    for i in range(start, start + n):
        events += [e async for e in agent.stream(f"turn {i}: look up t{i}", session_id=session)]
    return events


async def test_compaction_in_a_tight_window_keeps_the_cached_prefix() -> None:
    model = FunctionModel(model_fn)
    agent = agent_of(model)
    await set_kernel(agent.store, "s", "project", "caching")
    events = await turns(agent, 40)
    busts = [e.data for e in events if e.type is E.CACHE_BUST]
    compactions = [e for e in events if e.type is E.COMPRESSION_COMPLETE]
    assert compactions, "the window is tight: the run must compact"
    # every break is one Loom made and says why; none is a bust
    assert busts and all(b["expected"] for b in busts), busts
    assert {b["reason"] for b in busts} <= {"compaction", "masking", "truncation"}
    # compaction summarises after the cached span: the ROM and the Kernel always stay
    assert all(b["segment"] in ("summaries", "history") for b in busts), busts
    assert any(b["reason"] == "compaction" for b in busts)
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder) and builder.prefixes.busts == 0
    calls = [c for c in model.calls if not c.messages[0].content.startswith("You compress")]
    heads = {(c.messages[0].content, c.messages[1].content) for c in calls}
    assert len(heads) == 1 and next(iter(heads))[1].startswith("Session context (Kernel)")
    for c in calls:  # ROM, Kernel, ..., the last message: sent to the provider as data
        assert c.settings is not None and c.settings.cache_key
        points = c.settings.cache_points
        assert points[:2] == (0, 1) and points[-1] == len(c.messages) - 1
        assert len(points) <= 4
    # between compactions the previous request is the next one's stable prefix
    kept = sum(1 for c in calls if len(c.settings.cache_points) == 4)  # type: ignore[union-attr]
    assert kept > len(calls) // 2


async def test_a_kernel_changed_by_code_between_turns_is_a_bust() -> None:
    model = FunctionModel(model_fn)
    agent = agent_of(model)
    await turns(agent, 1)
    await set_kernel(agent.store, "s", "mood", "curious")
    events = await turns(agent, 1, start=1)
    busts = [e.data for e in events if e.type is E.CACHE_BUST]
    assert [(b["segment"], b["reason"], b["expected"]) for b in busts] == [("kernel", None, False)]
    assert busts[0]["position"] == 1  # the ROM (message 0) is still the cached prefix
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder) and builder.prefixes.busts == 1


async def test_prompt_cache_off_sends_no_points_and_tracks_nothing() -> None:
    model = FunctionModel(model_fn)
    agent = agent_of(model, model_settings=ModelSettings(prompt_cache=False))
    await turns(agent, 1)
    await set_kernel(agent.store, "s", "mood", "curious")
    events = await turns(agent, 1, start=1)
    assert not [e for e in events if e.type is E.CACHE_BUST]
    assert all(c.settings is not None and not c.settings.cache_points for c in model.calls)
    assert all(c.settings is not None and c.settings.cache_key is None for c in model.calls)


def test_the_tracker_names_the_reason_and_places_the_stable_point() -> None:
    tracker = PrefixTracker(max_sessions=2)
    rom, kernel = Message.system("rules"), Message.system("kernel")
    first = [rom, kernel, Message.user("q1")]
    seg = Segments(rom=0, kernel=1, summaries=None, history=2)
    tools = (ToolSpec("t", "", {}),)
    check = tracker.observe("s", model="m", tools=tools, messages=first, segments=seg)
    assert check.points == (0, 1, 2) and not check.broke
    second = [*first, Message.assistant("a1"), Message.user("q2")]
    check = tracker.observe("s", model="m", tools=tools, messages=second, segments=seg)
    assert check.points == (0, 1, 2, 4) and check.shared == 3 and not check.broke
    # another model: the whole prefix is new, for a reason Loom knows
    check = tracker.observe("s", model="m2", tools=tools, messages=second, segments=seg)
    assert (check.segment, check.reason, check.bust) == ("system", "model_changed", False)
    check = tracker.observe(
        "s", model="m2", tools=(ToolSpec("u", "", {}),), messages=second, segments=seg
    )
    assert check.reason == "tools_changed"
    # the history rewritten with no reason given: a bust at the first message that differs
    third = [rom, kernel, Message.user("q1, edited"), Message.assistant("a1")]
    check = tracker.observe(
        "s", model="m2", tools=(ToolSpec("u", "", {}),), messages=third, segments=seg
    )
    assert (check.broke_at, check.segment, check.bust) == (2, "history", True)
    assert tracker.busts == 1 and tracker.breaks == 2
    # bounded: the least recent session is forgotten
    for key in ("a", "b"):
        tracker.observe(key, model="m", tools=tools, messages=first, segments=seg)
    check = tracker.observe("s", model="x", tools=tools, messages=first, segments=seg)
    assert not check.broke and check.previous == 0


async def test_recalled_memories_that_follow_each_turn_break_the_kernel_as_expected() -> None:
    """Recall places this turn's memories at the end of the Kernel: when the next turn's
    message recalls others, the Kernel segment changes for a reason Loom knows ("recall"),
    never an unexplained bust."""
    model = FunctionModel(model_fn)
    agent = agent_of(model, memory=MemoryConfig(retry_delays=(0.0,), recall=True))
    await agent.store.put_item(("memories", "shared"), "a", {"text": "t0 is about apples"})
    await agent.store.put_item(("memories", "shared"), "b", {"text": "t1 is about boats"})
    events = await turns(agent, 2)
    kernel = [e.data for e in events if e.type is E.CACHE_BUST and e.data["segment"] == "kernel"]
    assert kernel and all(b["reason"] == "recall" and b["expected"] for b in kernel), kernel
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder) and builder.prefixes.busts == 0


def test_points_or_break_agrees_with_observe() -> None:
    """The builder's fast path (no CacheCheck for a request that repeats the previous one)
    gives the points ``observe`` gives, and the same check when the prefix breaks."""
    msgs = [Message.system("rom"), Message.user("a"), Message.assistant("b"), Message.user("c")]
    segs = Segments(0, None, None, 1)
    fast, full = PrefixTracker(), PrefixTracker()
    for n in (2, 3, 4):
        got = fast.points_or_break("k", "m", (), msgs[:n], segs)
        check = full.observe("k", model="m", tools=(), messages=msgs[:n], segments=segs)
        assert got == check.points and fast.shared == check.shared
    edited = [msgs[0], Message.user("other"), *msgs[2:]]
    broke = fast.points_or_break("k", "m", (), edited, segs)
    check = full.observe("k", model="m", tools=(), messages=edited, segments=segs)
    assert broke == check and check.bust and fast.busts == full.busts == 1
