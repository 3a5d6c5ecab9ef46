"""Crash recovery at INTAKE: loose ends of a dead run are resolved by each tool's effect class.

The crashed states are written exactly as the loop writes them (user message + ``running``
run record, then the assistant message, then ``started`` ledger rows), and then left, as a
killed process leaves them. tests/store/test_crash.py does the same with real SIGKILLs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, RunContext, tool
from loom.events import EventType, make_event
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore
from loom.store.base import LedgerEntry, RunRecord
from loom.testing import FunctionModel, ScriptedModel


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    s: Any = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "l.db")
    yield s
    await s.close()


class Tools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (tool, idempotency key)

        @tool(effect="at_most_once")
        def send_email(ctx: RunContext, to: str) -> str:
            """Send an email."""
            self.calls.append(("send_email", ctx.idempotency_key))
            return f"sent to {to}"

        @tool(effect="pure")
        def square(ctx: RunContext, x: int) -> int:
            """Square a number."""
            self.calls.append(("square", ctx.idempotency_key))
            return x * x

        @tool(effect="idempotent")
        def upsert(ctx: RunContext, key: str) -> str:
            """Write a record keyed by the idempotency key."""
            self.calls.append(("upsert", ctx.idempotency_key))
            return f"upserted {key}"

        self.all = [send_email, square, upsert]


async def crash_state(
    store: Any,
    calls: list[ToolCall],
    *,
    started: bool = True,
    session: str = "s",
    run: str = "run_dead",
) -> None:
    """What a process killed while running ``calls`` leaves behind."""
    await store.append(
        session,
        messages=[Message.user("do things")],
        events=[make_event(EventType.AGENT_START, run, session, 0, 0, {"message": "do things"})],
        run=RunRecord(run, session, "running"),
    )
    await store.append(
        session,
        messages=[Message.assistant("", calls)],
        events=[
            make_event(
                EventType.LLM_TOOL_CALLS,
                run,
                session,
                1,
                1,
                {"tool_calls": [c.model_dump() for c in calls]},
            ),
            make_event(EventType.LLM_COMPLETE, run, session, 1, 2, {"text": ""}),
        ],
    )
    if started:
        effects = {"send_email": "at_most_once", "square": "pure", "upsert": "idempotent"}
        await store.append(
            session,
            ledger=[
                LedgerEntry(run, session, c.id, c.name, "started", c.arguments, effects[c.name])
                for c in calls
            ],
        )  # type: ignore[arg-type]


def recorder() -> tuple[FunctionModel, list[list[Message]]]:
    seen: list[list[Message]] = []

    def fn(messages: list[Message], tools: object) -> str:
        seen.append(messages)
        return "recovered and answered"

    return FunctionModel(fn), seen


def assert_every_call_answered(messages: list[Message]) -> None:
    answered = [m.tool_call_id for m in messages if m.role == "tool"]
    asked = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    assert sorted(asked) == sorted(answered) and len(set(answered)) == len(answered)


async def test_open_calls_resolved_by_effect(store: Any) -> None:
    tools = Tools()
    calls = [
        ToolCall(name="send_email", arguments={"to": "bob"}),
        ToolCall(name="square", arguments={"x": 7}),
        ToolCall(name="upsert", arguments={"key": "k1"}),
    ]
    await crash_state(store, calls)
    model, seen = recorder()
    agent = Agent(model=model, tools=tools.all, store=store)
    r = await agent.run("next", session_id="s")
    assert r.output == "recovered and answered"
    # at_most_once never repeated; pure and idempotent re-ran with the original key.
    assert tools.calls == [
        ("square", f"run_dead:{calls[1].id}"),
        ("upsert", f"run_dead:{calls[2].id}"),
    ]
    messages = await store.load_messages("s")
    assert_every_call_answered(messages)
    by_id = {m.tool_call_id: m for m in messages if m.role == "tool"}
    assert by_id[calls[0].id].metadata["error_code"] == "interrupted"
    assert "took effect is unknown" in by_id[calls[0].id].content
    assert by_id[calls[1].id].content == "49" and by_id[calls[2].id].content == "upserted k1"
    assert await store.open_tool_calls("s") == []
    # The model saw results for every call before the new user message.
    sent = [m.role for m in seen[0]]
    assert sent[-5:] == ["assistant", "tool", "tool", "tool", "user"]
    assert await store.open_runs("s") == []
    # One journal: the recovering run records the dead run's end and the recovered results.
    journal = await store.load_events("s", r.run_id)
    closed = [e for e in journal if e.type is EventType.RUN_RECOVERED]
    assert [(e.data["recovered_run_id"], e.data["stop_reason"]) for e in closed] == [
        ("run_dead", "crashed")
    ]
    recovered = {
        e.data["tool_call_id"]: e.data["metadata"]["recovered"]
        for e in journal
        if e.type in (EventType.TOOL_RESULT, EventType.TOOL_ERROR)
    }
    assert recovered == {calls[0].id: "interrupted", calls[1].id: "rerun", calls[2].id: "rerun"}
    assert not any(
        e.type is EventType.AGENT_FINISH for e in await store.load_events("s", "run_dead")
    )


async def test_calls_that_never_started_are_marked_not_run(store: Any) -> None:
    tools = Tools()
    calls = [
        ToolCall(name="send_email", arguments={"to": "a"}),
        ToolCall(name="square", arguments={"x": 2}),
    ]
    await crash_state(store, calls, started=False)  # died before the ledger rows
    model, _ = recorder()
    await Agent(model=model, tools=tools.all, store=store).run("next", session_id="s")
    assert tools.calls == []
    messages = await store.load_messages("s")
    assert_every_call_answered(messages)
    for m in messages:
        if m.role == "tool":
            assert m.metadata["error_code"] == "interrupted" and "did not run" in m.content


async def test_run_that_died_without_tool_calls_is_closed(store: Any) -> None:
    await store.append(
        "s", messages=[Message.user("hello")], run=RunRecord("run_dead", "s", "running")
    )
    model, _ = recorder()
    await Agent(model=model, store=store).run("again", session_id="s")
    assert await store.open_runs("s") == []
    assert [m.role for m in await store.load_messages("s")] == ["user", "user", "assistant"]


async def test_clean_session_writes_nothing_extra(store: Any) -> None:
    agent = Agent(model=ScriptedModel(["a", "b"]), store=store)
    await agent.run("one", session_id="s")
    events_before = len(await store.load_events("s"))
    await agent.run("two", session_id="s")
    assert [m.content for m in await store.load_messages("s")] == ["one", "a", "two", "b"]
    assert all(not e.data.get("recovered") for e in (await store.load_events("s"))[events_before:])


async def test_rerun_that_fails_goes_through_the_error_channel(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")

    @tool(effect="idempotent")
    def flaky(ctx: RunContext, n: int) -> str:
        """Fails after a restart."""
        raise RuntimeError("backend gone\n" + "stack line\n" * 200)

    call = ToolCall(name="flaky", arguments={"n": 1})
    await store.append("s", messages=[Message.user("x")], run=RunRecord("run_dead", "s", "running"))
    await store.append("s", messages=[Message.assistant("", [call])])
    await store.append(
        "s",
        ledger=[LedgerEntry("run_dead", "s", call.id, "flaky", "started", {"n": 1}, "idempotent")],
    )
    model, _ = recorder()
    await Agent(model=model, tools=[flaky], store=store).run("next", session_id="s")
    tool_msg = next(m for m in await store.load_messages("s") if m.role == "tool")
    assert "[Error ID: err_" in tool_msg.content and len(tool_msg.content) < 400
    errors = await store.list_errors(session_id="s")
    assert len(errors) == 1 and "stack line" in errors[0].raw_error["message"]
    await store.close()


class _NoRunStore:
    """A store without the optional ``open_runs``: recovery falls back to the transcript."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name == "open_runs":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_store_without_open_runs_still_recovers() -> None:
    store = _NoRunStore()
    tools = Tools()
    calls = [ToolCall(name="square", arguments={"x": 3})]
    await crash_state(store, calls, started=False)
    model, _ = recorder()
    await Agent(model=model, tools=tools.all, store=store).run(
        "next",  # type: ignore[arg-type]
        session_id="s",
    )
    assert_every_call_answered(await store.load_messages("s"))


async def test_cancelled_run_closes_its_open_calls(store: Any) -> None:
    release = asyncio.Event()
    ran: list[str] = []

    @tool(effect="at_most_once")
    async def slow(ctx: RunContext) -> str:
        """Wait."""
        ran.append(ctx.idempotency_key)
        await release.wait()
        return "finished"

    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name="slow"), ToolCall(name="slow")]), "after"]
    )
    agent = Agent(model=model, tools=[slow], store=store)
    stream = agent.stream("go", session_id="s")
    async for ev in stream:
        if ev.type is EventType.TOOL_EXECUTION_START and len(ran) == 2:
            break
        if ev.type is EventType.TOOL_EXECUTION_START:
            await asyncio.sleep(0.01)
            if len(ran) == 2:
                break
    await stream.aclose()  # the caller walks away mid-tool
    messages = await store.load_messages("s")
    assert_every_call_answered(messages)
    assert all(m.metadata.get("error_code") == "interrupted" for m in messages if m.role == "tool")
    assert await store.open_tool_calls("s") == []
    runs = await store.list_runs("s") if hasattr(store, "list_runs") else None
    if runs is not None:
        assert [x.status for x in runs] == ["running", "cancelled"]
    r = await agent.run("next", session_id="s")
    assert r.output == "after" and len(ran) == 2  # nothing re-ran on the next turn
