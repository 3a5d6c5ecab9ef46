"""Error Submission Channel and large results, end to end with a model that asks for details."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from loom import Agent, RunContext, ToolError, tool
from loom.errors import StoreError
from loom.messages import Message, ModelResponse, ToolCall
from loom.store import MemoryStore, SQLiteStore
from loom.store.base import new_error_id
from loom.testing import FunctionModel, ScriptedModel
from loom.tools.channel import result_tool, summarize_error, truncate_error

ERR_ID = re.compile(r"err_\d{8}_\d{6}_[0-9a-f]{6}")


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = SQLiteStore(tmp_path / "loom.db")
    yield s
    await s.close()


def test_summaries_follow_seed_001() -> None:
    assert summarize_error("Syntax error near 'FROM'\nQuery: SELECT * FROM", "SQL_ERROR") == (
        "Code SQL_ERROR: Syntax error near 'FROM'"
    )
    assert (
        summarize_error(
            "connection timeout after 30 seconds\nTCP handshake failed\n...", "tool_exception"
        )
        == "connection timeout after 30 seconds"
    )
    assert summarize_error("Short error") == "Short error"
    long = (
        "Very long error message that exceeds one hundred characters and needs truncation "
        "for context window efficiency"
    )
    s = summarize_error(long)
    assert len(s) == 100 and s.endswith("...") and long.startswith(s[:-3])
    assert len(summarize_error("x" * 500, "A_VERY_LONG_CODE_NAME" * 5)) <= 100
    assert len(truncate_error("y" * 3000)) == 500 and truncate_error("short") == "short"


def test_error_ids() -> None:
    ids = [new_error_id() for _ in range(200)]
    assert all(ERR_ID.fullmatch(i) for i in ids)
    # 24 random bits a second (seed 001): a clash among 200 is rare (~0.1 %), ten are impossible
    # unless the random part is broken; the store handles clashes (next test).
    assert len(set(ids)) >= 190


async def test_an_error_id_clash_draws_a_new_id(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.store.base import StoredError

    draws = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr("loom.store.base.secrets.token_hex", lambda n: next(draws))
    first = StoredError("", "s", "t", {"m": 1}, "boom")
    second = StoredError("", "s", "t", {"m": 2}, "boom")
    second.timestamp = first.timestamp  # the same second: the same id prefix
    a = await store.save_error(first)
    b = await store.save_error(second)
    assert a.endswith("_aaaaaa") and b.endswith("_bbbbbb")
    stored = await store.get_error(b)
    assert stored is not None and stored.raw_error == {"m": 2}


async def _offered(agent: Agent) -> list[tuple[str, str]]:
    """(name, description) of the tools the model is offered on a turn of ``agent``."""
    seen: list[list[tuple[str, str]]] = []

    def fn(messages: list[Message], tools: list[Any]) -> str:
        seen.append([(t.name, t.description) for t in tools])
        return "ok"

    await agent.replace(model=FunctionModel(fn)).run("hi")
    return seen[0]


@tool
def noop() -> str:
    """Do nothing."""
    return ""


async def test_builtin_tools_offered_only_with_a_capable_store_and_own_tools(
    store: SQLiteStore,
) -> None:
    names = [n for n, _ in await _offered(Agent(store=store, tools=[noop]))]
    assert names == ["noop", "get_error_detail", "get_tool_result"]
    no_pages = Agent(store=store, tools=[noop], max_result_chars=None)
    assert [n for n, _ in await _offered(no_pages)] == ["noop", "get_error_detail"]
    # issue 12 #7: with no tools of its own there is nothing for them to serve, and offering
    # them pushed the small local model into tool-call JSON
    assert await _offered(Agent(store=store)) == []
    assert [n for n, _ in await _offered(Agent(tools=[noop]))] == ["noop"]
    assert [n for n, _ in await _offered(Agent(store=MemoryStore(), tools=[noop]))] == ["noop"]

    @tool(name="get_error_detail")
    def mine(error_id: str) -> str:
        """The user's own."""
        return "mine"

    offered = await _offered(Agent(store=store, tools=[mine]))
    assert [d for n, d in offered if n == "get_error_detail"] == ["The user's own."]


@tool(effect="pure")
def query(sql: str) -> str:
    """Run a query."""
    frames = "\n".join(f'  File "db.py", line {i}, in execute_{i}' for i in range(120))
    raise ConnectionError(f"TCP handshake failed at 192.168.1.5:1025\n{frames}")


def _detail_model(seen: list[str]) -> FunctionModel:
    """Calls query; on failure asks get_error_detail for the id it was given; then answers."""

    def fn(messages: list[Message], tools: object) -> ModelResponse | str:
        last = messages[-1]
        seen.append(last.content)
        if last.role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="query", arguments={"sql": "x"})])
        if last.name == "query":
            found = ERR_ID.search(last.content)
            assert found, last.content
            return ModelResponse(
                tool_calls=[
                    ToolCall(name="get_error_detail", arguments={"error_id": found.group()})
                ]
            )
        detail = json.loads(last.content)
        return f"the failing frame is {detail['raw_error']['traceback'].splitlines()[-3].strip()}"

    return FunctionModel(fn)


async def test_error_channel_end_to_end(store: SQLiteStore) -> None:
    seen: list[str] = []
    agent = Agent(model=_detail_model(seen), tools=[query], store=store)
    r = await agent.run("look it up", session_id="s")
    summary_msg = seen[1]
    assert len(summary_msg) < 300, summary_msg  # not the 6,000-character traceback
    assert "Tool 'query' failed: ConnectionError: TCP handshake failed at 192.168.1.5:1025" in (
        summary_msg
    )
    assert "get_error_detail" in summary_msg
    error_id = ERR_ID.search(summary_msg).group()  # type: ignore[union-attr]
    detail = json.loads(seen[2])
    assert detail["error_id"] == error_id and detail["tool_name"] == "query"
    assert "execute_119" in detail["raw_error"]["message"]
    assert "raise ConnectionError" in detail["raw_error"]["traceback"]
    assert detail["raw_error"]["arguments"] == {"sql": "x"}
    assert r.output.startswith("the failing frame is File")
    stored = await store.list_errors(session_id="s", tool_name="query")
    assert [e.id for e in stored] == [error_id] and len(stored[0].short_summary) <= 100
    ledger = await store.ledger("s")  # the ledger keeps what the model saw, not the traceback
    failed = next(e for e in ledger if e.status == "failed")
    assert failed.result is not None and "traceback" not in failed.result.metadata
    assert failed.result.metadata["error_id"] == error_id


async def test_coded_errors_and_bookkeeping_codes(store: SQLiteStore) -> None:
    @tool
    def pay(amount: int) -> str:
        """Pay."""
        raise ToolError("card declined\nissuer said: insufficient funds", code="CARD_DECLINED")

    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="pay", arguments={"amount": 5}),
                    ToolCall(name="nope", arguments={}),
                ]
            ),
            "ok",
        ]
    )
    agent = Agent(model=model, tools=[pay], store=store)
    await agent.run("pay", session_id="s")
    # by name: the order results are stored in is issue #12 item 19 (the loop's), not this test's
    tool_msgs = {m.name: m for m in await store.load_messages("s") if m.role == "tool"}
    assert "failed: Code CARD_DECLINED: card declined\n[Error ID: err_" in tool_msgs["pay"].content
    assert "Code unknown_tool: there is no tool named 'nope'" in tool_msgs["nope"].content
    errors = await store.list_errors(session_id="s")
    assert {e.tool_name for e in errors} == {"pay", "nope"}


async def test_unknown_or_foreign_error_ids(store: SQLiteStore) -> None:
    agent = Agent(
        model=ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(name="query", arguments={"sql": "x"})]), "a"]
        ),
        tools=[query],
        store=store,
    )
    await agent.run("x", session_id="other")
    foreign = (await store.list_errors(session_id="other"))[0].id
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(
                        name="get_error_detail",
                        arguments={"error_id": "err_20990101_000000_abcdef"},
                    ),
                    ToolCall(name="get_error_detail", arguments={"error_id": foreign}),
                ]
            ),
            "b",
        ]
    )
    await Agent(model=model, tools=[query], store=store).run("y", session_id="s")
    msgs = [m for m in await store.load_messages("s") if m.role == "tool"]
    assert all(m.metadata["error_code"] == "ERROR_NOT_FOUND" for m in msgs)
    assert foreign not in msgs[1].content.split("'")[0]  # nothing of the other session leaks
    assert "TCP" not in msgs[1].content


async def test_store_failure_falls_back_to_truncation(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(error: Any) -> str:
        raise StoreError("disk full")

    monkeypatch.setattr(store, "save_error", broken)
    agent = Agent(
        model=ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(name="query", arguments={"sql": "x"})]), "went on"]
        ),
        tools=[query],
        store=store,
    )
    r = await agent.run("x", session_id="s")
    assert r.output == "went on"
    tool_msg = next(m for m in await store.load_messages("s") if m.role == "tool")
    body = tool_msg.content.removeprefix("Error (tool_exception): ")
    assert len(body) == 500 and body.endswith("... (truncated)")
    assert body.startswith("ConnectionError: TCP handshake failed")


@tool(effect="pure")
def dump(rows: int) -> str:
    """Return a big table."""
    return "".join(f"row {i:05d}: {'x' * 40}\n" for i in range(rows))


def _pager_model(seen: list[str]) -> FunctionModel:
    """Reads a large result to its end with get_tool_result, then answers with its length."""
    pieces: list[str] = []

    def fn(messages: list[Message], tools: object) -> ModelResponse | str:
        last = messages[-1]
        seen.append(last.content)
        if last.role == "user":
            return ModelResponse(tool_calls=[ToolCall(name="dump", arguments={"rows": 2000})])
        if last.name == "dump":
            ref = re.search(r"res_[0-9a-f]+", last.content).group()  # type: ignore[union-attr]
            pieces.append(last.content.split("\n", 1)[1])
            nxt = int(re.search(r"offset=(\d+)", last.content).group(1))  # type: ignore[union-attr]
            return ModelResponse(
                tool_calls=[ToolCall(name="get_tool_result", arguments={"ref": ref, "offset": nxt})]
            )
        header, body = last.content.split("\n", 1)
        pieces.append(body)
        more = re.search(r"get_tool_result\(ref=\"(res_[0-9a-f]+)\", offset=(\d+)\)", header)
        if more:
            return ModelResponse(
                tool_calls=[
                    ToolCall(
                        name="get_tool_result",
                        arguments={"ref": more.group(1), "offset": int(more.group(2))},
                    )
                ]
            )
        return f"read {len(''.join(pieces))} characters"

    return FunctionModel(fn)


async def test_large_result_paged_end_to_end(store: SQLiteStore) -> None:
    seen: list[str] = []
    agent = Agent(
        model=_pager_model(seen),
        tools=[dump],
        store=store,
        max_result_chars=3000,
        max_iterations=200,
    )
    r = await agent.run("dump it", session_id="s")
    full = dump.fn(2000)
    assert r.output == f"read {len(full)} characters"
    preview = seen[1]
    assert len(preview) <= 3000 and "104,000 characters" in preview
    assert all(len(c) <= 3000 for c in seen)  # no page exceeds the limit
    pages = seen[2:]
    assert len(pages) == -(-(len(full) - 1000) // 2700)


async def test_large_results_off_and_bad_refs(store: SQLiteStore) -> None:
    agent = Agent(
        model=ScriptedModel(
            [ModelResponse(tool_calls=[ToolCall(name="dump", arguments={"rows": 500})]), "a"]
        ),
        tools=[dump],
        store=store,
        max_result_chars=None,
    )
    await agent.run("x", session_id="s")
    tool_msg = next(m for m in await store.load_messages("s") if m.role == "tool")
    assert tool_msg.content == dump.fn(500)
    model = ScriptedModel(
        [
            ModelResponse(
                tool_calls=[
                    ToolCall(name="get_tool_result", arguments={"ref": "res_nope"}),
                    ToolCall(name="get_tool_result", arguments={"ref": "res_nope", "offset": -1}),
                ]
            ),
            "b",
        ]
    )
    await Agent(model=model, tools=[dump], store=store).run("y", session_id="t")
    codes = [m.metadata["error_code"] for m in await store.load_messages("t") if m.role == "tool"]
    assert codes == ["RESULT_NOT_FOUND", "RESULT_NOT_FOUND"]


def test_agent_rejects_bad_max_result_chars() -> None:
    from loom.errors import AgentDefinitionError

    with pytest.raises(AgentDefinitionError, match="max_result_chars"):
        Agent(max_result_chars=0)


async def test_get_tool_result_offsets(store: SQLiteStore) -> None:
    from loom.store.base import StoredResult

    await store.save_result(StoredResult("res_abc", "s", "dump", "0123456789"))
    ctx = RunContext("s", "r", "c", store=store)
    t = result_tool(8000)
    out = await t.run(ctx, t.validate({"ref": "res_abc", "offset": 4, "length": 3}))
    assert out == (
        '[res_abc: characters 4-7 of 10; continue with get_tool_result(ref="res_abc", '
        "offset=7)]\n456"
    )
    with pytest.raises(ToolError, match="offset must be between 0 and 9"):
        await t.run(ctx, t.validate({"ref": "res_abc", "offset": 10}))
