"""Runs that take a while, over the LangGraph-compatible API: multitask strategies, cancel,
rejoining a stream after the client drops, and replay from the journal after a restart.

These need an agent slower than the shared fixture's, so this module starts its own
``loom serve`` process (same machinery as ``conftest.start_server``) serving a ``slow`` agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError

SLOW_AGENTS = '''
import asyncio
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def tick(n: int) -> str:
    """Count one tick."""
    return f"tick {n}"


async def slow(messages, tools):
    await asyncio.sleep(0.08)
    since = max(i for i, m in enumerate(messages) if m.role == "user")
    ticks = sum(1 for m in messages[since:] if m.role == "tool")
    if ticks < 5:
        return ModelResponse(tool_calls=[ToolCall(name="tick", arguments={"n": ticks})])
    return f"finished {messages[since].content} after five ticks"


registry = AgentRegistry([
    Agent(name="slow", instructions="Tick.", model=FunctionModel(slow), tools=[tick]),
])
'''


def start_slow_server(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="slow_agents:registry", source=SLOW_AGENTS, db=db)


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("slow")
    srv = start_slow_server(tmp, tmp / "slow.db")
    yield srv
    stop_server(srv)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def last_text(values: dict[str, Any]) -> str:
    return str(values["messages"][-1]["content"])


async def test_reject_refuses_a_second_run_with_409_and_enqueue_queues_it(
    slow_server: Server,
) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(tid, "slow", input=ask("one"))
    with pytest.raises(ConflictError):
        await client.runs.create(tid, "slow", input=ask("two"), multitask_strategy="reject")
    async with httpx.AsyncClient(base_url=slow_server.url) as http:
        r = await http.post(
            f"/threads/{tid}/runs",
            json={"assistant_id": "slow", "input": ask("two"), "multitask_strategy": "reject"},
        )
        assert r.status_code == 409 and r.json()["error"]["type"] == "SessionBusy"
    assert (await client.threads.get(tid))["status"] == "busy"
    second = await client.runs.create(tid, "slow", input=ask("two"), multitask_strategy="enqueue")
    assert second["status"] == "pending"
    done = await client.runs.join(tid, second["run_id"])
    assert (await client.runs.get(tid, first["run_id"]))["status"] == "success"
    humans = [m["content"] for m in done["messages"] if m["type"] == "human"]
    assert humans == ["one", "two"] and last_text(done) == "finished two after five ticks"


async def test_interrupt_stops_the_running_run_for_the_new_one(slow_server: Server) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(tid, "slow", input=ask("one"))
    await asyncio.sleep(0.2)
    second = await client.runs.wait(tid, "slow", input=ask("two"), multitask_strategy="interrupt")
    assert last_text(second) == "finished two after five ticks"
    old = await client.runs.get(tid, first["run_id"])
    assert old["status"] == "interrupted" and old["stop_reason"] == "cancelled"


async def test_cancel_stops_a_background_run(slow_server: Server) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "slow", input=ask("one"))
    await asyncio.sleep(0.15)
    await client.runs.cancel(tid, run["run_id"], wait=True)
    got = await client.runs.get(tid, run["run_id"])
    assert got["status"] == "interrupted" and got["stop_reason"] == "cancelled"
    state = await client.threads.get_state(tid)
    assert "finished" not in last_text(state["values"])
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_rejoin_after_the_client_drops_gets_the_rest_without_gap_or_duplicate(
    slow_server: Server,
) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    modes = ["values", "updates", "events"]
    seen = []
    stream = client.runs.stream(tid, "slow", input=ask("one"), stream_mode=modes)
    async for part in stream:
        seen.append(part)
        if len(seen) == 3:
            break
    await stream.aclose()  # the client goes away mid-run
    run_id = seen[0].data["run_id"]
    assert (await client.runs.get(tid, run_id))["status"] == "running"  # it kept running
    rest = [
        p
        async for p in client.runs.join_stream(
            tid, run_id, stream_mode=modes, last_event_id=seen[-1].id
        )
    ]
    assert rest[-1].event == "end" and rest[-1].data["status"] == "success"
    whole = [p async for p in client.runs.join_stream(tid, run_id, stream_mode=modes)]
    ids = [p.id for p in seen[1:]] + [p.id for p in rest[:-1]]
    assert ids == [p.id for p in whole[1:-1]]  # no gap, no duplicate, same order
    assert [p.data for p in seen[1:] + rest] == [p.data for p in whole[1:]]
    assert last_text([p.data for p in rest if p.event == "values"][-1]).startswith("finished")


async def test_a_restarted_server_replays_a_run_from_the_journal(
    tmp_path: Path, slow_server: Server
) -> None:
    db = tmp_path / "replay.db"
    srv = start_slow_server(tmp_path, db)
    try:
        client = get_client(url=srv.url)
        tid = (await client.threads.create())["thread_id"]
        modes = ["values", "updates", "events"]
        live = [
            p async for p in client.runs.stream(tid, "slow", input=ask("one"), stream_mode=modes)
        ]
    finally:
        stop_server(srv)
    srv = start_slow_server(tmp_path, db)
    try:
        client = get_client(url=srv.url)
        run_id = live[0].data["run_id"]
        assert (await client.runs.get(tid, run_id))["status"] == "success"
        assert [r["run_id"] for r in await client.runs.list(tid)] == [run_id]
        replay = [p async for p in client.runs.join_stream(tid, run_id, stream_mode=modes)]
        journaled = [
            p for p in live[1:] if not (p.event == "events" and p.data["type"] == "llm_delta")
        ]
        assert len(journaled) < len(live) - 1  # token deltas are never journaled
        assert [(p.id, p.data) for p in replay[1:]] == [(p.id, p.data) for p in journaled]
        half = len(journaled) // 2
        tail = [
            p
            async for p in client.runs.join_stream(
                tid, run_id, stream_mode=modes, last_event_id=journaled[half].id
            )
        ]
        assert [p.id for p in tail] == [p.id for p in journaled[half + 1 :]]
    finally:
        stop_server(srv)


async def test_on_disconnect_cancel_stops_the_run_when_the_client_goes(
    slow_server: Server,
) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    stream = client.runs.stream(tid, "slow", input=ask("one"), on_disconnect="cancel")
    first = await anext(stream)
    await stream.aclose()
    run_id = first.data["run_id"]
    for _ in range(100):
        run = await client.runs.get(tid, run_id)
        if run["status"] != "running" and run["status"] != "pending":
            break
        await asyncio.sleep(0.02)
    assert run["status"] == "interrupted" and run["stop_reason"] == "cancelled"


async def test_join_stream_without_stream_mode_uses_the_runs_own_modes(
    slow_server: Server,
) -> None:
    """``runs.join_stream(thread, run)`` as docs/server.md's crash recipe writes it: the SDK
    sends an empty ``stream_mode=``; the run's own modes are streamed (once 422)."""
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "slow", input=ask("one"), stream_mode=["updates"])
    parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
    assert parts[-1].event == "end" and parts[-1].data["status"] == "success"
    assert {p.event for p in parts} == {"metadata", "updates", "end"}


async def test_a_rejoin_after_a_restart_keeps_the_runs_stream_modes(
    tmp_path: Path, slow_server: Server
) -> None:
    db = tmp_path / "modes.db"
    srv = start_slow_server(tmp_path, db)
    try:
        client = get_client(url=srv.url)
        tid = (await client.threads.create())["thread_id"]
        run = await client.runs.create(tid, "slow", input=ask("one"), stream_mode=["updates"])
        await client.runs.join(tid, run["run_id"])
    finally:
        stop_server(srv)
    srv = start_slow_server(tmp_path, db)
    try:
        client = get_client(url=srv.url)
        got = await client.runs.get(tid, run["run_id"])
        assert got["status"] == "success" and got["kwargs"]["stream_mode"] == ["updates"]
        parts = [p async for p in client.runs.join_stream(tid, run["run_id"])]
        assert {p.event for p in parts} == {"metadata", "updates", "end"}  # not values
        assert len([p for p in parts if p.event == "updates"]) == 11  # 5 ticks: 5 x 2 + answer
    finally:
        stop_server(srv)


async def test_a_malformed_last_event_id_is_a_typed_422_that_says_what_an_id_is(
    slow_server: Server,
) -> None:
    client = get_client(url=slow_server.url)
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(tid, "slow", input=ask("one"))
    async with httpx.AsyncClient(base_url=slow_server.url) as http:
        for path in (
            f"/threads/{tid}/runs/{run['run_id']}/stream",
            f"/runs/{run['run_id']}/stream",
        ):
            for bad in ("garbage", "1.x", "-3", "9" * 80):
                r = await http.get(path, headers={"Last-Event-ID": bad})
                assert r.status_code == 422, (path, bad, r.text)
                error = r.json()["error"]
                assert error["type"] == "InputError"
                assert "'<sequence>.<slot>'" in error["message"]
                assert "invalid literal" not in error["message"]  # no Python message


async def test_any_server_of_a_fleet_answers_for_a_run_another_one_took(
    tmp_path: Path, slow_server: Server
) -> None:
    """Two servers on one store: a run one of them took is found by its id alone on the other
    (``GET /runs/{id}``, the Agent Protocol's path), from the stored run record."""
    db = tmp_path / "fleet.db"
    one = start_slow_server(tmp_path, db)
    other = start_slow_server(tmp_path, db)
    try:
        client = get_client(url=one.url)
        tid = (await client.threads.create())["thread_id"]
        run = await client.runs.create(tid, "slow", input=ask("one"), stream_mode=["updates"])
        async with httpx.AsyncClient(base_url=other.url) as http:
            seen = (await http.get(f"/runs/{run['run_id']}")).json()
            assert seen["thread_id"] == tid and seen["status"] in ("pending", "running")
            await client.runs.join(tid, run["run_id"])
            done = (await http.get(f"/runs/{run['run_id']}")).json()
            assert done["status"] == "success" and done["kwargs"]["stream_mode"] == ["updates"]
    finally:
        stop_server(one)
        stop_server(other)
