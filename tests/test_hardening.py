"""Issue 12 regressions on the core: nothing lost, nothing bricked.

Each test names the item it guards. They fail on the code before the core redesign (the
results were lost, the session raised on every later turn, or the check happened too late).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, ModelResponse, ToolCall, tool
from loom.engine.runtime import Runtime
from loom.errors import ApprovalHandlerError, ConfigurationError
from loom.events import EventType
from loom.messages import Message
from loom.store import MemoryStore, SQLiteStore
from loom.testing import FunctionModel, ScriptedModel

STORES = ["memory", "sqlite"]


def make_store(kind: str, tmp_path: Path) -> Any:
    return MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "h.db")


def one_call(name: str, **arguments: Any) -> ScriptedModel:
    return ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name=name, arguments=arguments)]), "done"] * 3
    )


# -- item 1: text that is not valid UTF-8 ---------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
async def test_a_lone_surrogate_from_a_tool_is_stored_escaped_and_the_session_lives(
    kind: str, tmp_path: Path
) -> None:
    @tool(effect="pure")
    def listing() -> str:
        """Names as os.listdir gives them for bytes that are not UTF-8."""
        return "caf\udce9.txt"

    store = make_store(kind, tmp_path)
    agent = Agent(model=one_call("listing"), tools=[listing], store=store)
    first = await agent.run("list", session_id="s")
    assert first.stop_reason == "completed", first.error
    tool_msg = next(m for m in await store.load_messages("s") if m.role == "tool")
    assert tool_msg.content == "caf\\xe9.txt"  # the byte shown, the text valid UTF-8
    assert any("not valid Unicode" in w for w in first.warnings)
    later = await agent.run("again", session_id="s")  # the session is not bricked
    assert later.stop_reason == "completed", later.error


@pytest.mark.parametrize("kind", STORES)
async def test_a_user_message_with_a_lone_surrogate_is_accepted_escaped(
    kind: str, tmp_path: Path
) -> None:
    seen: list[str] = []

    def model(messages: list[Message], tools: object) -> str:
        seen.append(messages[-1].content)
        return "ok"

    store = make_store(kind, tmp_path)
    agent = Agent(model=FunctionModel(model), store=store)
    result = await agent.run("open r\udcc3sum\udce9.pdf", session_id="s")
    assert result.stop_reason == "completed" and result.warnings
    assert seen == ["open r\\xc3sum\\xe9.pdf"]  # the model got valid text
    assert (await store.load_messages("s"))[0].content == "open r\\xc3sum\\xe9.pdf"


# -- item 2: results that are not JSON-native -----------------------------------------------------


@dataclasses.dataclass
class Invoice:
    number: str
    due: dt.date


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


@pytest.mark.parametrize("kind", STORES)
async def test_non_json_results_are_stored_identically_on_every_store(
    kind: str, tmp_path: Path
) -> None:
    @tool(effect="pure")
    def odd(what: str) -> Any:
        """Return something a JSON encoder does not know."""
        if what == "datetime":
            return {"at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}
        if what == "dataclass":
            return Invoice("INV-1", dt.date(2026, 2, 1))
        if what == "object":
            return Opaque()
        loop: list[Any] = []
        loop.append(loop)  # refers to itself
        return loop

    store = make_store(kind, tmp_path)
    agent = Agent(model=FunctionModel(lambda m, t: "x"), tools=[odd], store=store)
    contents = {}
    for i, what in enumerate(["datetime", "dataclass", "object", "recursive"]):
        agent2 = agent.replace(model=one_call("odd", what=what))
        result = await agent2.run("go", session_id=f"s{i}")
        assert result.stop_reason == "completed", result.error
        msg = next(m for m in await store.load_messages(f"s{i}") if m.role == "tool")
        contents[what] = (msg.metadata.get("error_code"), msg.content)
    assert contents["datetime"] == (None, '{"at": "2026-01-02T03:04:05+00:00"}')
    assert contents["dataclass"] == (None, '{"number": "INV-1", "due": "2026-02-01"}')
    assert contents["object"] == (None, "<Opaque thing>")
    code, text = contents["recursive"]
    assert code == "tool_exception" and "contains itself" in text


# -- item 6: a failed tool server is reported -----------------------------------------------------


async def test_a_tool_server_that_cannot_start_is_a_warning_logged_and_streamed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from loom.tools.mcp import mcp_server

    bad = mcp_server(
        "ghost",
        command=sys.executable,
        args=["-m", "no_such_mcp_server_module"],
        connect_timeout=10,
    )
    agent = Agent(model=FunctionModel(lambda m, t: "carried on"), tools=["add", bad])
    try:
        with caplog.at_level(logging.WARNING, logger="loom.tools"):
            events = [e async for e in agent.stream("go")]
    finally:
        await agent.aclose()
    finish = events[-1]
    assert finish.data["stop_reason"] == "completed"
    warnings = [e for e in events if e.type is EventType.WARNING]
    assert len(warnings) == 1 and "'ghost'" in warnings[0].data["message"]
    assert finish.data["warnings"] == [warnings[0].data["message"]]
    assert any("ghost" in r.getMessage() for r in caplog.records)


# -- item 8: the window a session ran with --------------------------------------------------------


async def test_a_session_records_the_model_and_window_it_ran_with(tmp_path: Path) -> None:
    from loom.memory.describe import describe_session

    class Small(FunctionModel):
        context_window = 4096

    store = SQLiteStore(tmp_path / "w.db")
    await Agent(model=Small(lambda m, t: "ok"), store=store).run("hi", session_id="s")
    info = await store.get_session("s")
    assert info is not None and info.metadata["context_window"] == 4096
    start = (await store.load_events("s"))[0]
    assert start.data["context_window"] == 4096 and start.data["model"]
    # a viewer that does not know the model (as `loom sessions show`) reports that window
    report = await describe_session(store, "s", Agent(model="demo"))
    assert report.context_window == 4096


# -- item 17: configuration checked when the agent is built ---------------------------------------


def test_bad_configuration_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown model provider 'nosuch'"):
        Agent(model="nosuch:model")
    with pytest.raises(ConfigurationError, match="does not exist"):
        Agent(workspace=tmp_path / "missing")
    with pytest.raises(ConfigurationError, match="store must be"):
        Agent(store=42)  # type: ignore[arg-type]
    # a path means a SQLite file (documented on Agent)
    agent = Agent(model=FunctionModel(lambda m, t: "ok"), store=str(tmp_path / "a.db"))
    assert isinstance(agent.store, SQLiteStore)
    assert agent.run_sync("hi").stop_reason == "completed"


# -- item 18: an approval handler that raises -----------------------------------------------------


async def test_an_approval_handler_that_raises_is_a_typed_error_and_nothing_ran() -> None:
    ran: list[str] = []

    @tool
    def deploy(target: str) -> str:
        """Deploy."""
        ran.append(target)
        return "deployed"

    def handler(pending: Any) -> bool:
        raise RuntimeError("the approval service is down")

    agent = Agent(
        model=one_call("deploy", target="prod"),
        tools=[deploy],
        permissions={"ask": ["deploy"]},
        approval_handler=handler,
    )
    with pytest.raises(ApprovalHandlerError, match="the approval service is down"):
        await agent.run("ship it", session_id="s")
    assert ran == []
    messages = await agent.store.load_messages("s")
    tool_msg = next(m for m in messages if m.role == "tool")  # the call was closed, not left open
    assert tool_msg.metadata["error_code"] == "interrupted"


# -- item 19: results in call order ---------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
async def test_results_are_stored_in_call_order(kind: str, tmp_path: Path) -> None:
    fast_done = asyncio.Event()

    @tool(effect="pure")
    async def slow() -> str:
        """Finishes after fast."""
        await fast_done.wait()
        return "slow"

    @tool(effect="pure")
    async def fast() -> str:
        """Finishes first."""
        fast_done.set()
        return "fast"

    model = ScriptedModel(
        [ModelResponse(tool_calls=[ToolCall(name="slow"), ToolCall(name="fast")]), "done"]
    )
    store = make_store(kind, tmp_path)
    events = [e async for e in Agent(model=model, tools=[slow, fast], store=store).stream("go")]
    results = [e.data["content"] for e in events if e.type is EventType.TOOL_RESULT]
    assert results == ["slow", "fast"]
    stored = [
        m.content for m in await store.load_messages(events[0].session_id) if m.role == "tool"
    ]
    assert stored == ["slow", "fast"]


async def test_runtime_rejects_something_that_is_not_a_store() -> None:
    with pytest.raises(ConfigurationError, match="store must implement"):
        Runtime(store="x.db")  # type: ignore[arg-type]
