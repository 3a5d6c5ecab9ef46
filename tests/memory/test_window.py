"""Resuming reads a window: the context built from it is the one the whole transcript gives.

A random conversation is stored step by step as the loop stores it (the builder's summaries
and flush markers committed after each build). At every build a new process is simulated
twice, with a fresh builder each: one reads the whole transcript, the other only what
``loom.memory.window.load_window`` reads (memory entries and the recent tail). Both must send
the model the same messages and persist the same entries.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loom import Agent, Message, ToolCall
from loom.context import AssembledContext, ContextRequest
from loom.memory import MemoryConfig, SegmentedContextBuilder
from loom.memory.tokens import EstimateCounter
from loom.memory.window import load_window, transcript_position
from loom.messages import ToolResult
from loom.store import MemoryStore
from loom.store.transcript import TranscriptWindow
from loom.testing import FunctionModel
from loom.tools.base import tool

from .test_properties import text, turn_deps


@tool
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return query


def shape(ctx: AssembledContext) -> list[tuple[Any, ...]]:
    return [
        (m.role, m.content, m.tool_call_id, [c.id for c in m.tool_calls], m.metadata)
        for m in [*ctx.messages, *ctx.persist]
    ]


async def simulate(turns: list[Any], window: int, mode: str, keep: int) -> tuple[int, int]:
    """(builds compared, of which read a window that starts after position 0)."""

    def summarise(messages: list[Message], tools: Any) -> str:
        if mode == "raise":
            raise RuntimeError("summariser down")
        return "## Task Overview\n" + text(40, len(messages))

    config = MemoryConfig(
        counter=EstimateCounter(),
        retry_delays=(0.0,),
        keep_tool_outputs=keep,
        memory_file=None,
        summarizer=FunctionModel(summarise, record=False),
    )
    agent = Agent(
        "p",
        "You are a careful agent.",
        model=FunctionModel(lambda m, t: "x"),
        tools=[lookup],
        context_window=window,
        reserved_output_tokens=200,
        memory=config,
    )
    live = SegmentedContextBuilder(config, context_window=window, reserved_output_tokens=200)
    store = MemoryStore()
    history: list[Message] = []
    compared = windowed = 0

    async def commit(*messages: Message) -> None:
        history.extend(messages)
        await store.append("s", messages=messages)

    async def call() -> None:
        nonlocal compared, windowed
        count = await store.message_count("s")
        tail = await load_window(store, "s", count)
        assert tail.end == count == len(history)
        assert list(tail) == history[tail.offset :]
        fresh = []
        for read in (list(history), tail):
            builder = SegmentedContextBuilder(
                config, context_window=window, reserved_output_tokens=200
            )
            fresh.append(
                await builder.build(
                    ContextRequest(agent, read, "s", "r", 1, "u", **turn_deps(agent))
                )
            )
        assert shape(fresh[1]) == shape(fresh[0])
        compared += 1
        windowed += tail.offset > 0
        ctx = await live.build(ContextRequest(agent, history, "s", "r", 1, "u", **turn_deps(agent)))
        if ctx.persist:
            await commit(*ctx.persist)

    for t, (user, rounds, answer) in enumerate(turns):
        await commit(Message.user(text(user, t)))
        await call()
        for r, sizes in enumerate(rounds):
            calls = [
                ToolCall(id=f"c{t}_{r}_{k}", name="lookup", arguments={"query": text(3, k)})
                for k in range(len(sizes))
            ]
            results = [
                Message.tool(ToolResult(tool_call_id=c.id, name="lookup", data=text(n, t + r)))
                for c, n in zip(calls, sizes, strict=True)
            ]
            await commit(Message.assistant(tool_calls=calls), *results)
            await call()
        await commit(Message.assistant(text(answer, t)))
    return compared, windowed


sizes = st.integers(min_value=1, max_value=400)
turn = st.tuples(sizes, st.lists(st.lists(sizes, min_size=1, max_size=3), max_size=3), sizes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(turns=[(60, [[200], [150, 90]], 40)] * 14, window=1500, mode="ok", keep=1)
@example(turns=[(60, [[200]], 40)] * 14, window=1500, mode="raise", keep=0)
@given(
    turns=st.lists(turn, min_size=1, max_size=14),
    window=st.integers(min_value=900, max_value=4000),
    mode=st.sampled_from(["ok", "raise"]),
    keep=st.integers(min_value=0, max_value=3),
)
def test_the_window_gives_the_context_the_whole_transcript_gives(
    turns: list[Any], window: int, mode: str, keep: int
) -> None:
    compared, _ = asyncio.run(simulate(turns, window, mode, keep))
    assert compared >= len(turns)


def test_a_long_session_is_read_as_a_window() -> None:
    """The examples above do reach the case the window is for (a window after position 0,
    once the transcript is longer than the first page read back from its end)."""
    compared, windowed = asyncio.run(simulate([(60, [[200], [150, 90]], 40)] * 14, 1500, "ok", 1))
    assert compared == 42 and windowed >= 10


def test_transcript_position_skips_memory_entries() -> None:
    # transcript: c0 c1 E c2 E E c3 -> conversation index 2 sits at 3, index 3 at 6
    assert [transcript_position(c, [2, 4, 5]) for c in range(4)] == [0, 1, 3, 6]


def test_a_window_appends_like_a_list() -> None:
    w = TranscriptWindow([Message.user("a")], offset=5)
    w.append(Message.assistant("b"))
    assert w.end == 7 and [m.content for m in w] == ["a", "b"] and isinstance(w, list)


async def test_a_session_without_summaries_is_read_whole() -> None:
    store = MemoryStore()
    await store.append("s", messages=[Message.user("a"), Message.assistant("b")])
    w = await load_window(store, "s", 2)
    assert w.offset == 0 and [m.content for m in w] == ["a", "b"] and w.prelude == []
