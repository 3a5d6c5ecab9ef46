"""The LangGraph-compatible run API, driven by the official ``langgraph-sdk`` client against a
real ``loom serve`` process (no mocks): assistants, threads, runs, streams, approvals."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.server.conftest import Server

langgraph_sdk = pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client  # noqa: E402
from langgraph_sdk.errors import ConflictError, NotFoundError  # noqa: E402


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def last_text(values: dict[str, Any]) -> str:
    return str(values["messages"][-1]["content"])


async def test_assistants_are_the_served_agents(server: Server) -> None:
    client = get_client(url=server.url)
    found = await client.assistants.search()
    assert [a["assistant_id"] for a in found] == ["calc", "ops"]
    calc = await client.assistants.get("calc")
    assert calc["graph_id"] == "calc" and calc["metadata"]["tools"] == ["add"]
    by_uuid = await client.assistants.get(calc["metadata"]["loom_uuid"])
    assert by_uuid["assistant_id"] == "calc"
    with pytest.raises(NotFoundError):
        await client.assistants.get("nobody")


async def test_threads_create_get_update_search_delete(server: Server) -> None:
    client = get_client(url=server.url)
    thread = await client.threads.create(metadata={"team": "blue"})
    tid = thread["thread_id"]
    assert thread["status"] == "idle" and thread["values"] == {"messages": []}
    assert (await client.threads.get(tid))["metadata"] == {"team": "blue"}
    updated = await client.threads.update(tid, metadata={"stage": "qa"})
    assert updated["metadata"] == {"team": "blue", "stage": "qa"}
    found = await client.threads.search(metadata={"stage": "qa"})
    assert [t["thread_id"] for t in found] == [tid]
    with pytest.raises(ConflictError):  # if_exists defaults to raise
        await client.threads.create(thread_id=tid)
    same = await client.threads.create(thread_id=tid, if_exists="do_nothing")
    assert same["thread_id"] == tid
    await client.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await client.threads.get(tid)


async def test_stream_sends_token_deltas_values_and_updates(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            tid, "calc", input=human("add 2 3"), stream_mode=["messages-tuple", "values", "updates"]
        )
    ]
    assert parts[0].event == "metadata" and parts[-1].event == "end"
    run_id = parts[0].data["run_id"]
    assert parts[-1].data == {"run_id": run_id, "status": "success"}
    chunks = [
        p.data[0] for p in parts if p.event == "messages" and p.data[0]["type"] == "AIMessageChunk"
    ]
    assert len(chunks) > 1  # the answer came word by word
    assert "".join(c["content"] for c in chunks) == "The sum is 5."
    assert {p.data[1]["run_id"] for p in parts if p.event == "messages"} == {run_id}
    tool = [p.data[0] for p in parts if p.event == "messages" and p.data[0]["type"] == "tool"]
    assert [t["content"] for t in tool] == ["5"]
    updates = [p.data for p in parts if p.event == "updates"]
    assert [next(iter(u)) for u in updates] == ["agent", "tools", "agent"]
    values = [p.data for p in parts if p.event == "values"]
    assert [m["type"] for m in values[-1]["messages"]] == ["human", "ai", "tool", "ai"]
    assert last_text(values[-1]) == "The sum is 5."
    assert chunks[0]["id"] == values[-1]["messages"][-1]["id"]  # chunks merge into it
    # only journaled steps carry an id (token deltas and lifecycle events have none, so the
    # client keeps the last step's id for them: SSE's last event id); every id it holds is
    # found again, in the same order, in the run read back from the journal
    ids = [p.id for p in parts if p.event not in ("metadata", "end")]
    seqs = [tuple(int(x) for x in i.split(".")) for i in ids]
    assert all(ids) and seqs == sorted(seqs)
    again = [p async for p in client.runs.join_stream(tid, run_id, stream_mode=["values"])]
    assert {p.id for p in again if p.event == "values"} <= set(ids)
    replayed = [
        p.id
        async for p in client.runs.join_stream(
            tid, run_id, stream_mode=["messages-tuple", "values", "updates"], last_event_id=ids[0]
        )
    ]
    assert set(ids[1:]) <= set(replayed)
    state = await client.threads.get_state(tid)
    assert state["values"] == values[-1] and state["next"] == []


async def test_wait_returns_the_final_values_and_the_thread_keeps_them(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.wait(tid, "calc", input=human("hello"))
    assert last_text(first) == "echo: hello"
    second = await client.runs.wait(tid, "calc", input=human("add 40 2"))
    assert last_text(second) == "The sum is 42."
    assert [m["content"] for m in second["messages"] if m["type"] == "human"] == [
        "hello",
        "add 40 2",
    ]
    history = await client.threads.get_history(tid)
    assert len(history) == 2 and last_text(history[0]["values"]) == "The sum is 42."
    assert last_text(history[1]["values"]) == "echo: hello"


async def test_background_run_join_get_and_list(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "calc", input=human("add 1 1"))
    assert run["status"] in ("pending", "running", "success")
    joined = await client.runs.join(tid, run["run_id"])
    assert last_text(joined) == "The sum is 2."
    got = await client.runs.get(tid, run["run_id"])
    assert got["status"] == "success" and got["assistant_id"] == "calc"
    listed = await client.runs.list(tid)
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, "run_nope")


async def test_an_approval_interrupts_the_run_and_approving_resumes_it(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            tid, "ops", input=human("ship it"), stream_mode=["values", "updates"]
        )
    ]
    interrupt = [p.data["__interrupt__"] for p in parts if "__interrupt__" in (p.data or {})]
    assert len(interrupt) == 2  # values and updates both end with it
    call = interrupt[0][0]["value"]
    assert call["tool_name"] == "deploy" and call["arguments"] == {"target": "prod"}
    assert (await client.threads.get(tid))["status"] == "interrupted"
    async with httpx.AsyncClient(base_url=server.url) as http:
        pending = (await http.get(f"/threads/{tid}/approvals")).json()
        assert [p["tool_call_id"] for p in pending] == [call["tool_call_id"]]
        r = await http.post(
            f"/threads/{tid}/approvals/{call['tool_call_id']}", json={"decision": "approve"}
        )
        assert r.status_code == 202 and r.json()["status"] == "resumed"
        resumed = r.json()["run"]
        assert (await http.get(f"/threads/{tid}/approvals")).json() == []
    final = await client.runs.join(tid, resumed["run_id"])
    assert last_text(final) == "done: deployed prod"
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_rejecting_with_a_reason_and_resuming_by_command(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.wait(tid, "ops", input=human("ship it"))
    call_id = first["__interrupt__"][0]["id"]
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(
            f"/threads/{tid}/approvals/{call_id}",
            json={"decision": "reject", "reason": "not on a Friday"},
        )
    final = await client.runs.join(tid, r.json()["run"]["run_id"])
    tool = [m for m in final["messages"] if m["type"] == "tool"]
    assert "not on a Friday" in tool[-1]["content"] and tool[-1]["status"] == "error"
    # LangGraph's own way: a run with command={"resume": ...}
    again = await client.runs.wait(tid, "ops", input=human("ship it again"))
    assert "__interrupt__" in again
    resumed = await client.runs.wait(tid, "ops", command={"resume": "approve"})
    assert last_text(resumed) == "done: deployed prod"


async def test_bad_input_gets_a_json_error(server: Server) -> None:
    client = get_client(url=server.url)
    tid = (await client.threads.create())["thread_id"]
    async with httpx.AsyncClient(base_url=server.url) as http:

        async def error(method: str, path: str, status: int, **kw: Any) -> dict[str, Any]:
            r = await http.request(method, path, **kw)
            assert r.status_code == status, r.text
            body: dict[str, Any] = r.json()["error"]
            assert body["type"] and body["message"]
            return body

        bad = await error(
            "POST",
            f"/threads/{tid}/runs/wait",
            422,
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert bad["type"] == "InvalidRequest"
        run = {"assistant_id": "calc", "input": human("hi")}
        assert (
            "nobody"
            in (
                await error(
                    "POST", f"/threads/{tid}/runs", 404, json={**run, "assistant_id": "nobody"}
                )
            )["message"]
        )
        await error("POST", "/threads/no-such-thread/runs/wait", 404, json=run)
        await error("GET", f"/threads/{tid}/runs/run_nope", 404)
        await error("GET", f"/threads/{tid}/runs/run_nope/stream", 404)
        await error("POST", f"/threads/{tid}/runs", 422, json={**run, "stream_mode": "telepathy"})
        await error("POST", f"/threads/{tid}/runs", 422, json={"assistant_id": "calc"})
        no_human = {"assistant_id": "calc", "input": {"messages": [{"role": "ai", "content": "x"}]}}
        await error("POST", f"/threads/{tid}/runs", 422, json=no_human)
        await error(
            "POST", f"/threads/{tid}/approvals/call_nope", 404, json={"decision": "approve"}
        )
        await error("POST", f"/threads/{tid}/approvals/call_nope", 422, json={"decision": "maybe"})
        await error("GET", "/errors/err_20250101_000000_abcdef", 404)
        done = await http.post(f"/threads/{tid}/runs/wait", json=run)
        run_id = done.headers["content-location"].rsplit("/", 1)[-1]
        for stale in ("garbage", "999.0"):
            await error(
                "GET", f"/threads/{tid}/runs/{run_id}/stream", 422, headers={"Last-Event-ID": stale}
            )
        # a run on a thread that does not exist yet, created on the fly when asked
        r = await http.post(
            "/threads/fresh-thread/runs/wait", json={**run, "if_not_exists": "create"}
        )
        assert r.status_code == 200 and last_text(r.json()) == "echo: hi"
