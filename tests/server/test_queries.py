"""Seed 003's server queries over the run API: the run pauses with an interrupt, the client
answers with ``POST /threads/{id}/answer``, and the turn goes on."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def query_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("queries"), app="server_agents:query_registry")
    yield srv
    stop_server(srv)


async def test_a_query_interrupts_the_run_and_the_answer_continues_it(query_server: Server) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=query_server.url)
    thread = await client.threads.create()
    tid = thread["thread_id"]
    values = await client.runs.wait(
        tid, "reader", input={"messages": [{"role": "user", "content": "what does main do?"}]}
    )
    assert isinstance(values, dict)
    interrupt = values["__interrupt__"][0]["value"]
    assert interrupt["type"] == "server_query" and interrupt["data"] == {"path": "src/main.rs"}
    async with httpx.AsyncClient(base_url=query_server.url) as http:
        listed = (await http.get(f"/threads/{tid}/queries")).json()
        assert [q["query_id"] for q in listed] == [interrupt["query_id"]]
        r = await http.post(f"/threads/{tid}/answer", json={"answer": "fn main() {}"})
        assert r.status_code == 202, r.text
        run_id = r.json()["run"]["run_id"]
        await http.get(f"/threads/{tid}/runs/{run_id}/join")
        assert (await http.get(f"/threads/{tid}/queries")).json() == []
        state = (await http.get(f"/threads/{tid}/state")).json()
    contents = [m["content"] for m in state["values"]["messages"]]
    assert contents[-1] == "The file begins with: fn main() {}"


async def test_answering_without_a_query_is_a_json_error(query_server: Server) -> None:
    async with httpx.AsyncClient(base_url=query_server.url) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        r = await http.post(f"/threads/{tid}/answer", json={"answer": "x"})
        assert r.status_code == 422 and "no server query" in r.json()["error"]["message"]
        r = await http.post(f"/threads/{tid}/answer", content=b"{not json")
        assert r.status_code == 422 and r.json()["error"]["type"]
        assert (await http.post("/threads/nope/answer", json={"answer": "x"})).status_code == 404
