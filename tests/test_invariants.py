"""Property tests: every tool call gets exactly one result; the transcript only grows."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom import Agent, ModelResponse, ToolCall, tool
from loom.messages import Message
from loom.testing import ScriptedModel


@tool
async def work(ms: int) -> str:
    """Sleep ms milliseconds (negative: fail)."""
    if ms < 0:
        raise ValueError("negative")
    await asyncio.sleep(ms / 1000)
    return "ok"


call = st.one_of(
    st.builds(lambda ms: ToolCall(name="work", arguments={"ms": ms}), st.integers(-5, 30)),
    st.builds(lambda: ToolCall(name="missing")),
    st.builds(lambda: ToolCall(name="work", raw_arguments="{oops")),
    st.builds(lambda: ToolCall(name="work", arguments={"ms": "soon"})),
    st.builds(lambda: ToolCall(id="dup", name="work", arguments={"ms": 1})),  # ids may clash
)
response = st.one_of(
    st.builds(lambda cs: ModelResponse(tool_calls=cs), st.lists(call, min_size=1, max_size=4)),
    st.builds(lambda t: ModelResponse(text=t), st.text(min_size=1, max_size=20)),
)


def check_pairing(history: list[Message]) -> None:
    """Each assistant tool call is answered once, right after its message (ids are only
    unique within one answer: models reuse them across turns)."""
    answered = 0
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_calls:
            ids = [c.id for c in m.tool_calls]
            assert len(set(ids)) == len(ids), "two calls of one answer share an id"
            following = history[i + 1 : i + 1 + len(ids)]
            assert sorted(f.tool_call_id or "" for f in following) == sorted(ids)
            assert all(f.role == "tool" for f in following)
            answered += len(ids)
    assert answered == sum(m.role == "tool" for m in history), "a result without a call"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.lists(response, min_size=1, max_size=4), min_size=1, max_size=3),
    max_iterations=st.integers(1, 4),
    max_tool_calls=st.integers(1, 6),
    timeout=st.sampled_from([0.01, 0.05, 5.0]),
)
def test_every_call_has_one_result_and_the_transcript_only_grows(
    turns: list[list[ModelResponse]], max_iterations: int, max_tool_calls: int, timeout: float
) -> None:
    async def scenario() -> None:
        script = [r for turn in turns for r in turn]
        agent = Agent(
            model=ScriptedModel(script),
            tools=[work],
            max_iterations=max_iterations,
            max_tool_calls=max_tool_calls,
            timeout=timeout,
        )
        before: list[Message] = []
        for i in range(len(turns)):
            await agent.run(f"turn {i}", session_id="prop")
            history = await agent.store.load_messages("prop")
            assert history[: len(before)] == before, "the transcript was rewritten"
            check_pairing(history)
            assert await agent.store.open_tool_calls("prop") == []
            before = history

    asyncio.run(scenario())
