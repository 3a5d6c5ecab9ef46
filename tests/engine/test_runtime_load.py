"""Session gates under load on a real SQLite file: 100 concurrent requests on one session
with queue, drop and interrupt; nothing lost, nothing run twice (checked in the transcript,
the ledger and a side-effect counter)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, RunContext, tool
from loom.errors import QueueFull, QueueTimeout, SessionBusy
from loom.events import EventType
from loom.messages import Message, ModelResponse, RunResult, ToolCall
from loom.store import SQLiteStore
from loom.testing import FunctionModel

N = 100


class Harness:
    def __init__(self, path: Path, tool_seconds: float = 0.002, **agent_kw: Any) -> None:
        self.effects: Counter[str] = Counter()  # idempotency key -> times the side effect ran
        self.started: dict[str, asyncio.Event] = {}
        self.fast: set[str] = set()  # tags whose tool returns at once

        @tool(effect="at_most_once")
        async def work(ctx: RunContext, tag: str) -> str:
            """Do the side effect for ``tag``."""
            self.effects[ctx.idempotency_key] += 1
            self.started.setdefault(tag, asyncio.Event()).set()
            await asyncio.sleep(0.001 if tag in self.fast else tool_seconds)
            return f"worked {tag}"

        def model(messages: list[Message], tools: object) -> ModelResponse | str:
            last = messages[-1]
            if last.role == "user":
                return ModelResponse(
                    tool_calls=[ToolCall(name="work", arguments={"tag": last.content})]
                )
            return f"done {last.content}"

        self.store = SQLiteStore(path)
        self.agent = Agent(
            model=FunctionModel(model, record=False), tools=[work], store=self.store, **agent_kw
        )

    async def submit(self, tag: str, on_busy: str) -> RunResult | Exception:
        try:
            return await self.agent.run(tag, session_id="s", on_busy=on_busy)  # type: ignore[arg-type]
        except (SessionBusy, QueueFull, QueueTimeout) as exc:
            return exc

    async def check_transcript(self) -> list[list[Message]]:
        """Turns are whole and not interleaved; every call has exactly one result."""
        messages = await self.store.load_messages("s")
        turns: list[list[Message]] = []
        for m in messages:
            if m.role == "user":
                turns.append([])
            turns[-1].append(m)
        for turn in turns:
            calls = [c.id for m in turn if m.role == "assistant" for c in m.tool_calls]
            results = [m.tool_call_id for m in turn if m.role == "tool"]
            assert calls == results, turn
        assert await self.store.open_tool_calls("s") == []
        assert await self.store.open_runs("s") == []
        held = "SELECT count(*) FROM locks WHERE released = 0"  # released rows keep the token
        assert self.store.db.conn.execute(held).fetchone()[0] == 0
        assert max(self.effects.values(), default=0) <= 1, "a side effect ran twice"
        return turns


async def test_queue_runs_all_100_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db", max_queue_depth=N)
    tags = [f"m{i}" for i in range(N)]
    results = await asyncio.gather(*(h.submit(t, "queue") for t in tags))
    assert all(isinstance(r, RunResult) and r.stop_reason == "completed" for r in results)
    turns = await h.check_transcript()
    assert [t[0].content for t in turns] == tags  # FIFO, each exactly once
    assert all(t[-1].content == f"done worked {t[0].content}" for t in turns)
    assert sum(h.effects.values()) == N
    await h.store.close()


async def test_queue_depth_limit_refuses_with_typed_error(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db")  # default max_queue_depth=10
    results = await asyncio.gather(*(h.submit(f"m{i}", "queue") for i in range(N)))
    done = [r for r in results if isinstance(r, RunResult)]
    full = [r for r in results if isinstance(r, QueueFull)]
    assert (len(done), len(full)) == (11, 89)  # one running + ten waiting
    assert "retry later" in str(full[0])
    turns = await h.check_transcript()
    assert sorted(t[0].content for t in turns) == sorted(r.messages[0].content for r in done)
    assert sum(h.effects.values()) == 11
    await h.store.close()


async def test_queue_timeout(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db", tool_seconds=0.05, queue_timeout=0.12)
    results = await asyncio.gather(*(h.submit(f"m{i}", "queue") for i in range(8)))
    done = [r for r in results if isinstance(r, RunResult)]
    timed_out = [r for r in results if isinstance(r, QueueTimeout)]
    assert len(done) + len(timed_out) == 8 and done and timed_out
    turns = await h.check_transcript()
    assert len(turns) == len(done)  # a timed-out request wrote nothing
    await h.store.close()


async def test_drop_runs_one_and_refuses_99(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db")
    results = await asyncio.gather(*(h.submit(f"m{i}", "drop") for i in range(N)))
    done = [r for r in results if isinstance(r, RunResult)]
    busy = [r for r in results if isinstance(r, SessionBusy)]
    assert (len(done), len(busy)) == (1, 99)
    turns = await h.check_transcript()
    assert [t[0].content for t in turns] == ["m0"]
    await h.store.close()


async def test_interrupt_burst_runs_the_newest(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db", tool_seconds=0.05)
    results = await asyncio.gather(*(h.submit(f"m{i}", "interrupt") for i in range(N)))
    first, last = results[0], results[-1]
    assert isinstance(first, RunResult) and first.stop_reason == "cancelled"
    assert isinstance(last, RunResult) and last.stop_reason == "completed"
    superseded = results[1:-1]
    assert all(isinstance(r, SessionBusy) and "did not run" in str(r) for r in superseded)
    turns = await h.check_transcript()
    assert [t[0].content for t in turns] == ["m0", f"m{N - 1}"]
    assert turns[0][-1].metadata.get("error_code") == "interrupted"
    assert turns[1][-1].content == f"done worked m{N - 1}"
    await h.store.close()


async def test_interrupt_each_running_turn_in_sequence(tmp_path: Path) -> None:
    h = Harness(tmp_path / "l.db", tool_seconds=5.0)
    h.fast.add(f"m{N - 1}")
    tasks = []
    for i in range(N):
        tasks.append(asyncio.create_task(h.submit(f"m{i}", "interrupt")))
        if i < N - 1:  # wait until m{i}'s tool is running; the next request interrupts it
            await asyncio.wait_for(h.started.setdefault(f"m{i}", asyncio.Event()).wait(), 5)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert all(isinstance(r, RunResult) for r in results)
    assert [r.stop_reason for r in results] == ["cancelled"] * (N - 1) + ["completed"]  # type: ignore[union-attr]
    turns = await h.check_transcript()
    assert [t[0].content for t in turns] == [f"m{i}" for i in range(N)]  # nothing lost
    assert all(t[-1].metadata.get("error_code") == "interrupted" for t in turns[:-1])
    assert turns[-1][-1].content == f"done worked m{N - 1}"
    assert sum(h.effects.values()) == N  # each started exactly once, none repeated
    await h.store.close()


async def test_lock_released_after_a_failing_turn(tmp_path: Path) -> None:
    def broken(messages: list[Message], tools: object) -> str:
        raise RuntimeError("model exploded")

    store = SQLiteStore(tmp_path / "l.db")
    agent = Agent(model=FunctionModel(broken), store=store)
    with pytest.raises(RuntimeError):
        await agent.run("x", session_id="s")
    held = "SELECT count(*) FROM locks WHERE released = 0"  # released rows keep the token
    assert store.db.conn.execute(held).fetchone()[0] == 0
    ok = Agent(model=FunctionModel(lambda m, t: "fine"), store=store)
    r = await ok.run("y", session_id="s", on_busy="drop")
    assert r.output == "fine"
    events = await store.load_events("s")
    assert [e.type for e in events].count(EventType.AGENT_FINISH) == 2
    await store.close()


async def test_interrupt_arriving_while_a_turn_closes_does_not_break_it(tmp_path: Path) -> None:
    """A turn already in PERSIST cannot be interrupted: it finishes, then the newcomer runs."""
    store = SQLiteStore(tmp_path / "l.db")
    newcomer: list[asyncio.Task[RunResult]] = []

    class StartAnotherWhileClosing:
        async def after_iteration_end(self, ctx: Any, result: RunResult) -> None:
            if not newcomer:
                newcomer.append(
                    asyncio.create_task(agent.run("newer", session_id="s", on_busy="interrupt"))
                )
                await asyncio.sleep(0.01)  # the newcomer asks to interrupt us right now

    agent = Agent(
        model=FunctionModel(lambda m, t: f"answer to {m[-1].content}"),
        store=store,
        hooks=[StartAnotherWhileClosing()],
    )
    first = await agent.run("first", session_id="s")
    assert first.stop_reason == "completed" and first.output == "answer to first"
    second = await newcomer[0]
    assert second.stop_reason == "completed" and second.output == "answer to newer"
    await store.close()
