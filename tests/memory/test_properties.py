"""Property tests: the budget is never exceeded; no tool call is separated from its result.

Each example simulates the loop: a random conversation is appended step by step, the builder is
called where the loop calls it (after a user message, after each round of tool results), its
``persist`` messages are appended like the loop commits them, and every assembled context is
re-counted from scratch with a fresh counter.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from loom import Agent, Message, ToolCall
from loom.context import ContextRequest
from loom.memory import MemoryConfig, SegmentedContextBuilder
from loom.memory.tokens import EstimateCounter, MessageCounter
from loom.messages import ToolResult
from loom.testing import FunctionModel
from loom.tools.base import tool

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "result",
    "value",
    "file",
    "path",
    "error",
    "token",
    "window",
    "budget",
]


def turn_deps(agent: Any) -> dict[str, Any]:
    """What the runtime puts into a ContextRequest for ``agent``: its tool specs and model."""
    return {"tool_specs": agent.tool_specs, "model": agent.model}


@tool
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return query


def text(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] + str(i % 13) for i in range(n))


sizes = st.integers(min_value=1, max_value=1500)
tool_round = st.lists(sizes, min_size=1, max_size=3)  # one assistant message, 1-3 calls
turn = st.tuples(sizes, st.lists(tool_round, max_size=3), sizes)  # user, tool rounds, answer
summariser_mode = st.sampled_from(["ok", "long", "empty", "raise"])


def check_adjacency(messages: list[Message]) -> None:
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m.role != "tool", f"tool result at {i} without its call right before it"
        if m.role == "assistant" and m.tool_calls:
            ids = {c.id for c in m.tool_calls}
            results = []
            j = i + 1
            while j < len(messages) and messages[j].role == "tool":
                results.append(messages[j].tool_call_id)
                j += 1
            assert set(results) == ids and len(results) == len(ids), (ids, results)
            i = j
        else:
            i += 1


async def simulate(
    turns: list[Any], window: int, reserved: int, mode: str, scale: float, l2: int | None, keep: int
) -> int:
    def summarise(messages: list[Message], tools: Any) -> str:
        if mode == "raise":
            raise RuntimeError("summariser down")
        if mode == "empty":
            return "  "
        n = 40 if mode == "ok" else 3000
        return "## Task Overview\n" + text(n, len(messages))

    counter = EstimateCounter(scale=scale)
    config = MemoryConfig(
        counter=counter,
        retry_delays=(0.0,),
        l2_tokens=l2,
        keep_tool_outputs=keep,
        memory_file=None,
        summarizer=FunctionModel(summarise, record=False),
    )
    agent = Agent(
        "p",
        "You are a careful agent. " * 5,
        model=FunctionModel(lambda m, t: "x"),
        tools=[lookup],
        context_window=window,
        reserved_output_tokens=reserved,
        memory=config,
    )
    builder = agent.runtime.builder_for(agent)
    assert isinstance(builder, SegmentedContextBuilder)
    fresh = MessageCounter(counter)
    budget = window - reserved
    history: list[Message] = []
    calls = 0
    seen: dict[str, int] = {}

    async def call() -> None:
        nonlocal calls
        ctx = await builder.build(
            ContextRequest(agent, history, "s", "r", 1, "u", **turn_deps(agent))
        )
        history.extend(ctx.persist)
        for kind, _ in ctx.notes:
            seen[kind.name] = seen.get(kind.name, 0) + 1
        sent = fresh.scaled(fresh.messages(ctx.messages) + fresh.tools(ctx.tools))
        assert sent <= budget, f"sent {sent} tokens, budget {budget}"
        assert ctx.token_estimate == sent
        check_adjacency(ctx.messages)
        assert ctx.messages[-1].role in ("user", "tool")  # the newest step is always sent
        calls += 1

    for t, (user, rounds, answer) in enumerate(turns):
        history.append(Message.user(text(user, t)))
        await call()
        for r, round_sizes in enumerate(rounds):
            tcs = [
                ToolCall(id=f"c{t}_{r}_{k}", name="lookup", arguments={"query": text(3, k)})
                for k in range(len(round_sizes))
            ]
            history.append(Message.assistant(tool_calls=tcs))
            for c, size in zip(tcs, round_sizes, strict=True):
                history.append(
                    Message.tool(
                        ToolResult(tool_call_id=c.id, name="lookup", data=text(size, t + r))
                    )
                )
            await call()
        history.append(Message.assistant(text(answer, t)))
    for name in seen:
        event(name)  # hypothesis statistics show how often each path ran
    return calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# found by hypothesis: 1380 raw tokens * 1.35 is 1863.0000000000002 in floating point, and the
# scaled estimate came out one token over the 1863-token budget
@example(
    turns=[(120, [[459]], 1)],
    window=3486,
    reserve_share=0.46575099121900065,
    mode="ok",
    scale=1.35,
    l2=None,
    keep=0,
)
@given(
    turns=st.lists(turn, min_size=1, max_size=12),
    window=st.integers(min_value=700, max_value=8000),
    reserve_share=st.floats(min_value=0.0, max_value=0.5),
    mode=summariser_mode,
    scale=st.sampled_from([1.0, 0.8, 1.35]),
    l2=st.one_of(st.none(), st.integers(min_value=0, max_value=600)),
    keep=st.integers(min_value=0, max_value=4),
)
def test_budget_and_adjacency_hold_at_every_call(
    turns, window, reserve_share, mode, scale, l2, keep
):
    reserved = int(window * reserve_share)
    calls = asyncio.run(simulate(turns, window, reserved, mode, scale, l2, keep))
    assert calls >= len(turns)
