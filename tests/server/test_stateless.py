"""Stateless runs (``POST /runs...``) and the open Agent Protocol's aliases, against a real
``loom serve`` process: ``langgraph-sdk`` with no thread, and plain HTTP in the Agent
Protocol 0.1.6 shapes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from tests.server.conftest import Server

pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def test_sdk_stateless_stream_runs_on_a_fresh_thread_that_is_then_deleted(
    server: Server,
) -> None:
    client = get_client(url=server.url)
    parts = [
        p
        async for p in client.runs.stream(
            None, "calc", input=human("add 4 and 5"), stream_mode=["values", "events"]
        )
    ]
    kinds = [p.event for p in parts]
    assert kinds[0] == "metadata" and kinds[-1] == "end"
    run_id = parts[0].data["run_id"]
    final = [p.data for p in parts if p.event == "values"][-1]
    assert final["messages"][-1]["content"] == "The sum is 9."
    thread_id = final["messages"][0]["id"].split(":")[0]
    events = [p.data["type"] for p in parts if p.event == "events"]
    assert events[0] == "agent_start" and events[-1] == "agent_finish"
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get(f"/threads/{thread_id}")).status_code == 404  # deleted
        run = (await http.get(f"/runs/{run_id}")).json()  # still held by the server
        assert run["status"] == "success" and run["thread_id"] == thread_id


async def test_sdk_stateless_wait_and_keep(server: Server) -> None:
    client = get_client(url=server.url)
    values = await client.runs.wait(None, "calc", input=human("add 1 and 2"))
    assert isinstance(values, dict) and values["messages"][-1]["content"] == "The sum is 3."
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post(
            "/runs/wait",
            json={"assistant_id": "calc", "input": human("hello"), "on_completion": "keep"},
        )
        assert r.status_code == 200 and r.json()["messages"][-1]["content"] == "echo: hello"
        thread_id = r.json()["messages"][0]["id"].split(":")[0]
        kept = await http.get(f"/threads/{thread_id}")
        assert kept.status_code == 200 and len(kept.json()["values"]["messages"]) == 2


async def test_stateless_run_that_parks_on_approval_keeps_its_thread(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/runs/wait", json={"assistant_id": "ops", "input": human("ship")})
        assert r.status_code == 200
        interrupts = r.json()["__interrupt__"]
        approve_with = interrupts[0]["value"]["approve_with"]
        path = approve_with.removeprefix("POST ")
        decided = await http.post(path, json={"decision": "approve"})
        assert decided.status_code == 202 and decided.json()["status"] == "resumed"
        run = decided.json()["run"]
        joined = await http.get(f"/threads/{run['thread_id']}/runs/{run['run_id']}/join")
        assert joined.json()["messages"][-1]["content"] == "done: deployed prod"


async def test_agent_protocol_agents_and_runs(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        agents = (await http.post("/agents/search", json={})).json()
        assert [a["agent_id"] for a in agents] == ["calc", "ops"]
        assert agents[0]["capabilities"] == {"ap.io.messages": True, "ap.io.streaming": True}
        assert (await http.get("/agents/calc")).json()["name"] == "calc"
        assert (await http.get("/agents/nobody")).status_code == 404
        schemas = (await http.get("/agents/calc/schemas")).json()
        assert schemas["agent_id"] == "calc" and "input_schema" in schemas

        # a run on a thread, named in the body; input as Agent Protocol messages
        thread_id = (await http.post("/threads", json={})).json()["thread_id"]
        body = {
            "agent_id": "calc",
            "thread_id": thread_id,
            "messages": [{"role": "user", "content": "add 2 and 2"}],
        }
        r = await http.post("/runs/wait", json=body)
        assert r.status_code == 200
        out = r.json()
        assert out["run"]["status"] == "success" and out["run"]["thread_id"] == thread_id
        assert out["messages"][0] == {
            "role": "user",
            "content": "add 2 and 2",
            "id": f"{thread_id}:0",
            "metadata": {},
        }
        assert out["messages"][-1]["role"] == "assistant"
        assert out["values"]["messages"][-1]["content"] == "The sum is 4."

        # background run, then wait / stream / get / search / delete by run id
        started = (
            await http.post(
                "/runs", json={**body, "messages": [{"role": "user", "content": "add 3 and 3"}]}
            )
        ).json()
        run_id = started["run_id"]
        waited = (await http.get(f"/runs/{run_id}/wait")).json()
        assert waited["values"]["messages"][-1]["content"] == "The sum is 6."
        async with http.stream("GET", f"/runs/{run_id}/stream") as s:
            text = "".join([chunk async for chunk in s.aiter_text()])
        assert "event: end" in text and "The sum is 6." in text
        assert (await http.get(f"/runs/{run_id}")).json()["status"] == "success"
        found = (await http.post("/runs/search", json={"thread_id": thread_id})).json()
        assert found[0]["run_id"] == run_id and len(found) == 2
        assert (await http.post(f"/runs/{run_id}/cancel")).status_code == 204
        assert (await http.delete(f"/runs/{run_id}")).status_code == 204
        assert (await http.get(f"/runs/{run_id}")).status_code == 404
        # the thread path still finds it (replayed from the journal)
        again = await http.get(f"/threads/{thread_id}/runs/{run_id}")
        assert again.status_code == 200 and again.json()["status"] == "success"


async def test_stateless_bad_input(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/runs/wait", json={"input": human("hi")})  # two agents: which?
        assert r.status_code == 422 and "calc, ops" in r.json()["error"]["message"]
        r = await http.post("/runs", json={"assistant_id": "nobody", "input": human("hi")})
        assert r.status_code == 404
        r = await http.post(
            "/runs", json={"agent_id": "calc", "thread_id": "missing", "input": human("hi")}
        )
        assert r.status_code == 404
        r = await http.post("/runs", json={"assistant_id": "calc"})
        assert r.status_code == 422
        assert (await http.get("/runs/run_unknown/wait")).status_code == 404
