"""Independent clients against a real ``loom serve``: the ``openai-agents`` SDK using a Loom
agent as its model, the npm ``@langchain/langgraph-sdk`` client (through ``node``), and the
Python ``langgraph-sdk``'s thread streaming (SSE and WebSocket), ``threads.count`` and
assistants."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server

JS_DIR = Path(__file__).parent / "js"


async def test_openai_agents_sdk_runs_a_loom_agent_as_its_model(server: Server) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed")
    model = OpenAIChatCompletionsModel(model="calc", openai_client=client)
    agent = Agent(name="front", instructions="Answer briefly.", model=model)

    result = await Runner.run(agent, "add 2 3")
    # The Loom agent ran its own `add` tool server-side; the SDK sees only its answer.
    assert result.final_output == "The sum is 5."

    streamed = Runner.run_streamed(agent, "add 40 2")
    kinds = {event.type async for event in streamed.stream_events()}
    assert streamed.final_output == "The sum is 42."
    assert "raw_response_event" in kinds
    await client.close()


def test_langgraph_js_sdk_streams_a_run(server: Server) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("`node` is not installed: the npm @langchain/langgraph-sdk test needs Node.js")
    if not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        pytest.fail(f"the npm client is not installed: run `npm ci --prefix {JS_DIR}`")
    done = subprocess.run(
        [node, str(JS_DIR / "stream_run.mjs"), server.url, "calc", "add 2 3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=JS_DIR,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["assistants"] == ["calc", "ops"]
    assert out["run_status"] == "success"
    assert out["events"][0] == "metadata" and out["events"][-1] == "end"
    assert {"values", "messages", "updates"} <= set(out["events"])
    assert out["answer"] == "The sum is 5."
    assert out["message_types"] == ["human", "ai", "tool", "ai"]
    assert out["deltas"] == "The sum is 5."  # token deltas, joined
    assert out["state_messages"] == 4
    # The thread the JS client made is an ordinary Loom thread: read it over plain HTTP.
    thread = httpx.get(f"{server.url}/threads/{out['thread_id']}").json()
    assert thread["metadata"]["client"] == "langgraph-sdk-js"
    assert thread["values"]["messages"][-1]["content"] == "The sum is 5."


def test_langgraph_js_sdk_thread_stream_runs_a_turn(server: Server) -> None:
    """The npm client's ``client.threads.stream(...)``: the same commands and events."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("`node` is not installed: the npm @langchain/langgraph-sdk test needs Node.js")
    if not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        pytest.fail(f"the npm client is not installed: run `npm ci --prefix {JS_DIR}`")
    done = subprocess.run(
        [node, str(JS_DIR / "thread_stream.mjs"), server.url, "calc", "add 2 3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=JS_DIR,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["messages"] == ["add 2 3", "", "5", "The sum is 5."]
    assert uuid.UUID(out["run_id"]) and out["count"] >= 1
    thread = httpx.get(f"{server.url}/threads/{out['thread_id']}").json()
    assert thread["values"]["messages"][-1]["content"] == "The sum is 5."


# -- langgraph-sdk (Python): its thread streaming, threads.count, assistants ----------------------
def _lg(server: Server) -> Any:
    langgraph_sdk = pytest.importorskip("langgraph_sdk")
    return langgraph_sdk.get_client(url=server.url)


async def _until_end(events: Any) -> list[tuple[str, str | None]]:
    """The (method, data.event) of a subscription's events up to the run's end (or park)."""
    seen: list[tuple[str, str | None]] = []
    async for ev in events:
        seen.append((ev["method"], ev["params"]["data"].get("event")))
        if ev["method"] == "lifecycle" and seen[-1][1] in ("completed", "failed", "interrupted"):
            return seen
    return seen


@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_langgraph_sdk_thread_stream_runs_a_turn(server: Server, transport: str) -> None:
    """``client.threads.stream(...)``: commands to ``POST /threads/{id}/commands``, the
    thread's events over SSE or a WebSocket, the final state from ``thread.output``."""
    client = _lg(server)
    async with client.threads.stream(assistant_id="calc", transport=transport) as thread:
        started = await thread.run.start(
            input={"messages": [{"role": "user", "content": "add 2 3"}]}
        )
        assert uuid.UUID(started["run_id"])  # the protocols type run ids as UUIDs
        every = ["values", "updates", "messages", "tools", "lifecycle", "input", "checkpoints"]
        seen = await _until_end(thread.subscribe([*every, "tasks", "custom"]))
        output = await thread.output
    assert seen[0] == ("lifecycle", "started") and seen[-1] == ("lifecycle", "completed")
    tools = [e for m, e in seen if m == "tools"]
    assert tools == ["tool-started", "tool-finished"]
    messages = [e for m, e in seen if m == "messages"]
    assert messages.count("message-start") == 2 and messages[-1] == "message-finish"
    assert ("values", None) in seen
    assert [m["content"] for m in output["messages"]] == ["add 2 3", "", "5", "The sum is 5."]
    # the thread the stream minted is an ordinary thread
    state = await client.threads.get_state(thread.thread_id)
    assert state["values"]["messages"][-1]["content"] == "The sum is 5."


async def test_langgraph_sdk_thread_stream_parks_and_resumes(server: Server) -> None:
    """A call that needs approval is an ``input.requested`` event; ``run.respond`` decides it
    and the resumed run's end is the stream's output."""
    client = _lg(server)
    async with client.threads.stream(assistant_id="ops") as thread:
        await thread.run.start(input={"messages": [{"role": "user", "content": "deploy"}]})
        parked: list[dict[str, Any]] = []
        async for ev in thread.subscribe(["input", "lifecycle"]):
            if ev["method"] == "input.requested":
                parked.append(ev["params"]["data"])
            if ev["method"] == "lifecycle" and ev["params"]["data"]["event"] == "interrupted":
                break
        assert len(parked) == 1 and parked[0]["value"]["tool_name"] == "deploy"
        async with httpx.AsyncClient(base_url=server.url) as http:  # the SDK's own command
            command = {
                "id": 99,
                "method": "input.respond",
                "params": {
                    "interrupt_id": parked[0]["interrupt_id"],
                    "namespace": [],
                    "response": True,
                },
            }
            answer = (await http.post(f"/threads/{thread.thread_id}/commands", json=command)).json()
        assert answer["type"] == "success" and answer["id"] == 99 and answer["result"]["run_id"]
        output = await thread.output
    assert output["messages"][-1]["content"] == "done: deployed prod"


async def test_thread_commands_answer_in_the_protocols_envelope(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        unknown = await http.post(
            f"/threads/{tid}/commands", json={"id": 1, "method": "state.fork", "params": {}}
        )
        assert unknown.json() == {
            "type": "error",
            "id": 1,
            "error": "not_supported",
            "message": unknown.json()["message"],
        }
        got = await http.post(f"/threads/{tid}/commands", json={"id": 2, "method": "state.get"})
        assert got.json() == {"type": "success", "id": 2, "result": {"values": {"messages": []}}}
        # the old place of server-query answers says where they went
        old = await http.post(f"/threads/{tid}/commands", json={"answer": "x"})
        assert (
            old.status_code == 422 and "POST /threads/{id}/answer" in old.json()["error"]["message"]
        )


async def test_langgraph_sdk_counts_threads(server: Server) -> None:
    client = _lg(server)
    mark = {"suite": str(uuid.uuid4())}
    for _ in range(2):
        await client.threads.create(metadata=mark)
    assert await client.threads.count(metadata=mark) == 2
    assert await client.threads.count(metadata=mark, status="idle") == 2
    assert await client.threads.count(metadata=mark, status="busy") == 0
    assert await client.threads.count() >= 2


async def test_assistants_report_when_they_were_defined(server: Server) -> None:
    client = _lg(server)
    found = {a["assistant_id"]: a for a in await client.assistants.search()}
    one = await client.assistants.get("calc")
    created = datetime.fromisoformat(one["created_at"])
    assert one["created_at"] == found["calc"]["created_at"]  # the same every time it is read
    assert datetime(2020, 1, 1, tzinfo=UTC) < created <= datetime.now(UTC)


async def test_a_thread_made_before_its_first_run_lists_its_agent(server: Server) -> None:
    """``POST /threads`` makes a session with no agent yet; its first run names it."""
    from loom.store import SQLiteStore

    client = _lg(server)
    thread = await client.threads.create()
    await client.runs.wait(
        thread["thread_id"], "calc", input={"messages": [{"role": "user", "content": "hi"}]}
    )
    store = SQLiteStore(server.db)
    try:
        listed = {s.id: s.agent_name for s in await store.list_sessions(limit=0)}
    finally:
        await store.close()
    assert listed[thread["thread_id"]] == "calc"
