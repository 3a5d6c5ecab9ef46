"""Session gates: one turn per session; queue, drop and interrupt."""

from __future__ import annotations

import asyncio

import pytest

from loom import Agent, ModelResponse
from loom.errors import QueueFull, SessionBusy
from loom.messages import Message
from loom.testing import FunctionModel


def slow_model(delay: float) -> FunctionModel:
    async def answer(messages: list[Message], tools: object) -> ModelResponse:
        await asyncio.sleep(delay)
        return ModelResponse(text=f"answer to {messages[-1].content}")

    return FunctionModel(answer)


async def test_queue_runs_turns_one_after_another_in_order() -> None:
    agent = Agent(model=slow_model(0.05))
    results = await asyncio.gather(*(agent.run(f"m{i}", session_id="q") for i in range(5)))
    assert [r.stop_reason for r in results] == ["completed"] * 5
    history = await agent.store.load_messages("q")
    assert [m.content for m in history if m.role == "user"] == [f"m{i}" for i in range(5)]
    for user, answer in zip(history[::2], history[1::2], strict=True):
        assert answer.content == f"answer to {user.content}"


async def test_drop_refuses_while_busy() -> None:
    agent = Agent(model=slow_model(0.2))
    first = asyncio.create_task(agent.run("first", session_id="d"))
    await asyncio.sleep(0.05)
    with pytest.raises(SessionBusy, match="running another turn"):
        await agent.run("second", session_id="d", on_busy="drop")
    assert (await first).stop_reason == "completed"


async def test_interrupt_cancels_the_running_turn() -> None:
    agent = Agent(model=slow_model(0.3))
    first = asyncio.create_task(agent.run("first", session_id="i"))
    await asyncio.sleep(0.05)
    second = await agent.run("second", session_id="i", on_busy="interrupt")
    result = await first
    assert result.stop_reason == "cancelled" and "interrupted" in (result.error or "")
    assert second.stop_reason == "completed"


async def test_queue_depth_is_bounded() -> None:
    agent = Agent(model=slow_model(0.2), max_queue_depth=2)
    tasks = [asyncio.create_task(agent.run(f"m{i}", session_id="full")) for i in range(3)]
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull, match="max 2"):
        await agent.run("one too many", session_id="full")
    await asyncio.gather(*tasks)


async def test_different_sessions_run_in_parallel() -> None:
    agent = Agent(model=slow_model(0.2))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(agent.run("x", session_id=f"p{i}") for i in range(5)))
    assert loop.time() - started < 0.6
