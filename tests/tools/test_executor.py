"""The executor: Loom's own tool threads, timeouts that hold whatever the tool does, and the one
JSON-native serialisation of results (issue #12 items 2, 3 and 4)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, RunContext, ToolCall, tool
from loom.errors import ConfigurationError
from loom.messages import ToolResult
from loom.store import SQLiteStore
from loom.testing import ScriptedModel
from loom.tools import threads
from loom.tools.base import Tool
from loom.tools.executor import configure_tool_threads, execute_call


def ctx() -> RunContext:
    return RunContext(session_id="s", run_id="r", tool_call_id="c")


async def call(t: Tool, default_timeout: float = 10.0, **arguments: Any) -> ToolResult:
    return await execute_call(
        ToolCall(name=t.name, arguments=arguments), {t.name: t}, ctx(), default_timeout
    )


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    configure_tool_threads(threads.DEFAULT_TOOL_THREADS)
    yield
    configure_tool_threads(threads.DEFAULT_TOOL_THREADS)


async def until(condition: Any, seconds: float = 5.0) -> None:
    """Wait for a condition another thread makes true (no fixed sleep)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


# -- item 3: sync tools that hang do not take the process down --------------------------------
async def test_hung_sync_tools_leave_other_sync_tools_running() -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    @tool(timeout=0.2)
    def hang() -> str:
        """Hang."""
        entered.release()
        release.wait(60)
        return "late"

    @tool(timeout=5)
    def instant() -> str:
        """Answer at once."""
        return "ok"

    # As many as asyncio's default pool has workers (six on two cores): before, these filled
    # it and every later sync tool in the process timed out.
    n = min(32, (os.cpu_count() or 1) + 4)
    try:
        hung = await asyncio.gather(*(call(hang) for _ in range(n)))
        for _ in range(n):
            assert entered.acquire(timeout=5)
        assert {r.error_code for r in hung} == {"timeout"}
        message = hung[0].error_message or ""
        assert "was stopped" not in message
        assert "cannot stop a thread" in message and "abandoned" in message
        assert "may still be running in the background" in message
        started = time.monotonic()
        ok = await call(instant)
        assert ok.success and ok.data == "ok", ok
        assert time.monotonic() - started < 2
        await until(lambda: threads.tool_threads().abandoned == n)
    finally:
        release.set()
    await until(lambda: threads.tool_threads().busy == 0)
    assert threads.tool_threads().abandoned == 0


async def test_no_free_thread_is_refused_at_once_with_capacity_exhausted() -> None:
    configure_tool_threads(2)
    release = threading.Event()

    @tool(timeout=0.2)
    def hang() -> str:
        """Hang."""
        release.wait(60)
        return "late"

    @tool(timeout=30)
    def instant() -> str:
        """Answer at once."""
        return "ok"

    try:
        assert [r.error_code for r in await asyncio.gather(call(hang), call(hang))] == [
            "timeout",
            "timeout",
        ]
        await until(lambda: threads.tool_threads().abandoned == 2)
        started = time.monotonic()
        refused = await call(instant)
        assert time.monotonic() - started < 1  # refused, not queued behind the hung threads
        assert refused.error_code == "capacity_exhausted"
        assert "all 2 are busy" in (refused.error_message or "")
        assert "2 of them held by sync tools that timed out" in (refused.error_message or "")
        assert "LOOM_TOOL_THREADS" in (refused.error_message or "")
    finally:
        release.set()
    await until(lambda: threads.tool_threads().busy == 0)
    assert (await call(instant)).data == "ok"  # the threads came back


def test_pool_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_pool", None)
    monkeypatch.setenv("LOOM_TOOL_THREADS", "3")
    assert threads.tool_threads().size == 3
    monkeypatch.setattr(threads, "_pool", None)
    monkeypatch.setenv("LOOM_TOOL_THREADS", "many")
    with pytest.raises(ConfigurationError, match="LOOM_TOOL_THREADS='many'"):
        threads.tool_threads()
    with pytest.raises(ConfigurationError, match="at least 1"):
        configure_tool_threads(0)


async def test_a_sync_tool_that_raises_becomes_tool_exception() -> None:
    @tool
    def boom() -> str:
        """Fail."""
        raise ValueError("no")

    failed = await call(boom)
    assert failed.error_code == "tool_exception" and failed.error_message == "ValueError: no"


# -- item 4: a tool that swallows its cancellation does not outlive its timeout ---------------
async def test_async_tool_swallowing_cancellation_gets_the_timeout_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    finished = asyncio.Event()

    @tool(timeout=0.2)
    async def stubborn() -> str:
        """Ignore cancellation."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await gate.wait()  # keeps going after it was cancelled
            finished.set()
            return "late value"
        return "never"

    started = time.monotonic()
    result = await asyncio.wait_for(call(stubborn), 5)
    assert time.monotonic() - started < 2
    assert not result.success and result.error_code == "timeout"
    assert "within 0.2 s" in (result.error_message or "")
    assert "discarded" in (result.error_message or "")
    with caplog.at_level(logging.WARNING, logger="loom.tools"):
        gate.set()
        await finished.wait()
        await asyncio.sleep(0)  # let the detached task's done-callback run
    assert any("ignored its cancellation" in r.getMessage() for r in caplog.records)


async def test_cancelling_the_caller_cancels_the_tool() -> None:
    entered = asyncio.Event()
    cleaned = asyncio.Event()

    @tool(timeout=30)
    async def slow() -> str:
        """Wait."""
        entered.set()
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()
        return "x"

    task = asyncio.ensure_future(call(slow))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()  # its cleanup ran before the caller's cancellation went on


# -- the eager first step (an async tool's first step runs as its own task, at once) -----------
async def test_a_tool_that_returns_without_suspending_runs_as_its_own_task() -> None:
    caller = asyncio.current_task()
    var: Any = __import__("contextvars").ContextVar("v", default="caller")
    seen: list[Any] = []

    @tool
    async def quick() -> str:
        """Return at once."""
        seen.append(asyncio.current_task())
        var.set("tool")
        return "x"

    result = await call(quick)
    assert result.success and result.data == "x"
    assert seen[0] is not None and seen[0] is not caller  # its own task, as before
    assert asyncio.current_task() is caller and var.get() == "caller"  # nothing leaked


async def test_a_timeout_entered_in_the_first_step_cancels_the_tool_not_the_run() -> None:
    # asyncio.timeout captures the current task when entered: in the first step that must be
    # the tool's task, or the timer would later cancel the caller.
    @tool(timeout=30)
    async def bounded() -> str:
        """Wait with its own short timeout."""
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(30)
        except TimeoutError:
            return "timed out inside"
        return "slept"

    result = await call(bounded)
    assert result.success and result.data == "timed out inside"
    await asyncio.sleep(0)  # the caller goes on, uncancelled
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


# -- item 2: one serialisation, before anything is stored --------------------------------------
class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


class Broken:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@dataclasses.dataclass
class Point:
    x: int
    when: dt.date


def _recursive() -> Any:
    a: list[Any] = [1]
    a.append({"self": a})
    return a


def _deep() -> Any:
    v: Any = "bottom"
    for _ in range(5000):
        v = [v]
    return v


async def test_results_become_json_native() -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)

    @tool(blocking=False)
    def mixed() -> Any:
        """Return one of everything."""
        return {
            "when": when,
            "obj": Opaque(),
            "point": Point(1, dt.date(2024, 1, 2)),
            "tags": {"b", "a"},
            "raw": b"\xff\x00",
            "text": b"hi",
            "path": Path("/x/y"),
            "nan": float("nan"),
            3: "int key",
            "tuple": (1, 2),
        }

    r = await call(mixed)
    assert r.success, r
    assert r.data == {
        "when": "2024-05-06T07:08:09+00:00",
        "obj": "<opaque thing>",
        "point": {"x": 1, "when": "2024-01-02"},
        "tags": ["a", "b"],
        "raw": {"base64": "/wA="},
        "text": "hi",
        "path": "/x/y",
        "nan": "NaN",
        "3": "int key",
        "tuple": [1, 2],
    }


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_recursive, "contains itself"),
        (_deep, "nested deeper than 100 levels"),
        (Broken, "__str__ raised RuntimeError: no text for you"),
    ],
)
async def test_unrepresentable_results_become_tool_exceptions(make: Any, why: str) -> None:
    @tool(blocking=False)
    def bad() -> Any:
        """Return something no store can hold."""
        return make()

    r = await call(bad)
    assert not r.success and r.error_code == "tool_exception"
    assert "ran, but its return value cannot be stored" in (r.error_message or "")
    assert why in (r.error_message or "")


async def test_a_datetime_result_survives_the_sqlite_store(tmp_path: Path) -> None:
    @tool(blocking=False)
    def now() -> Any:
        """The time."""
        return {"at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "who": Opaque()}

    store = SQLiteStore(tmp_path / "s.db")
    model = ScriptedModel([ModelResponse(tool_calls=[ToolCall(name="now", arguments={})]), "ok"])
    result = await Agent(model=model, tools=[now], store=store).run("time?", session_id="s")
    assert result.stop_reason == "completed", result.error
    stored = [m for m in await store.load_messages("s") if m.role == "tool"]
    assert json.loads(stored[0].content) == {
        "at": "2024-01-01T00:00:00+00:00",
        "who": "<opaque thing>",
    }
    await store.close()


async def test_lone_surrogates_in_results_are_escaped() -> None:
    @tool(blocking=False)
    def odd() -> Any:
        """Return text that is not valid Unicode."""
        return {"name": "caf\udce9.txt"}

    r = await call(odd)
    assert r.data == {"name": "caf\\xe9.txt"}
    assert r.metadata["escaped_strings"] == 1
