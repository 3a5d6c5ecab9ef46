"""Kill -9 a real ``loom serve`` mid-run, start it again on the same SQLite store: the client's
rejoin gets the rest of the journaled events, and the next turn on the thread recovers the dead
run under Loom's effect classes (a ``pure`` call runs again, an ``at_most_once`` call gets an
``interrupted`` result)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

pytest.importorskip("langgraph_sdk")
from langgraph_sdk import get_client

CRASHY_AGENTS = '''
import asyncio
from pathlib import Path
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


async def _hold() -> None:
    while Path("hold").exists():  # the test removes it before the restart
        await asyncio.sleep(0.02)


@tool(effect="pure")
async def hold_pure() -> str:
    """Wait, then answer (safe to run again)."""
    await _hold()
    return "pure done"


@tool
async def hold_once() -> str:
    """Wait, then answer (at most once: never run again after a crash)."""
    await _hold()
    return "once done"


def crashy(messages, tools):
    last = messages[-1]
    if last.role == "user" and last.content == "go":
        return ModelResponse(tool_calls=[ToolCall(name="hold_pure", arguments={}),
                                         ToolCall(name="hold_once", arguments={})])
    if last.role == "tool":
        return "after the tools"
    return f"echo: {last.content}"


registry = AgentRegistry([
    Agent(name="crashy", instructions="Hold.", model=FunctionModel(crashy),
          tools=[hold_pure, hold_once]),
])
'''


def start(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="crashy_agents:registry", source=CRASHY_AGENTS, db=db)


def sse(lines: list[str]) -> list[tuple[str, str, Any]]:
    """(id, event, data) of each SSE event in ``lines``."""
    out, ev, eid, data = [], "", "", ""
    for line in lines:
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and ev:
            out.append((eid, ev, json.loads(data)))
            ev, eid, data = "", "", ""
    return out


async def test_kill_9_mid_run_then_rejoin_and_recover(tmp_path: Path) -> None:
    (tmp_path / "hold").touch()
    db = tmp_path / "crash.db"
    first = start(tmp_path, db)
    body = {
        "assistant_id": "crashy",
        "input": {"messages": [{"role": "user", "content": "go"}]},
        "stream_mode": ["events", "values"],
    }
    seen: list[str] = []
    try:
        async with (
            httpx.AsyncClient(base_url=first.url, timeout=10) as http,
        ):
            thread_id = (await http.post("/threads", json={})).json()["thread_id"]
            async with http.stream("POST", f"/threads/{thread_id}/runs/stream", json=body) as r:
                async for line in r.aiter_lines():
                    seen.append(line)
                    if '"type": "tool_execution_start"' in line and "hold_once" in line:
                        break  # both calls are in the ledger as started; the tools hold
        events = sse([*seen, ""])
        run_id = events[0][2]["run_id"]
        await asyncio.sleep(0.2)  # let the tools start running
    finally:
        first.process.send_signal(signal.SIGKILL)  # no shutdown, no end record
        first.process.wait(timeout=10)
    (tmp_path / "hold").unlink()

    second = start(tmp_path, db)
    try:
        client = get_client(url=second.url)
        # the client saw up to the run's first values; it rejoins from there
        last_seen = next(eid for eid, ev, _ in events if ev == "values")
        rest = [
            p
            async for p in client.runs.join_stream(
                thread_id, run_id, last_event_id=last_seen, stream_mode=["events", "values"]
            )
        ]
        assert rest[-1].event == "end" and rest[-1].data["status"] == "interrupted"
        # every journaled event after the one the client saw, none twice, none before it
        at = [eid for eid, _, _ in events].index(last_seen)
        after = [e for _, ev, e in events[at + 1 :] if ev == "events"]
        got = [p.data for p in rest if p.event == "events"]
        assert [e["sequence"] for e in got] == sorted({e["sequence"] for e in got})
        assert [e for e in after if e["type"] != "llm_delta"] == got
        assert got[-1]["type"] == "tool_execution_start"  # where the process died

        async with httpx.AsyncClient(base_url=second.url) as http:
            dead = (await http.get(f"/threads/{thread_id}/runs/{run_id}")).json()
            assert dead["status"] == "interrupted"

        # the next turn closes the dead run: pure runs again, at_most_once is interrupted
        parts = [
            p
            async for p in client.runs.stream(
                thread_id,
                "crashy",
                input={"messages": [{"role": "user", "content": "again"}]},
                stream_mode="events",
            )
        ]
        types = [p.data["type"] for p in parts if p.event == "events"]
        assert "run_recovered" in types and types[-1] == "agent_finish"
        results = {
            p.data["data"]["tool_name"]: p.data["data"]
            for p in parts
            if p.event == "events" and p.data["type"] in ("tool_result", "tool_error")
        }
        assert results["hold_pure"]["success"] and results["hold_pure"]["content"] == "pure done"
        assert not results["hold_once"]["success"]
        assert results["hold_once"]["error_code"] == "interrupted"
        state = await client.threads.get_state(thread_id)
        kinds = [(m["type"], m["content"]) for m in state["values"]["messages"]]
        assert kinds[0] == ("human", "go") and kinds[-2:] == [
            ("human", "again"),
            ("ai", "echo: again"),
        ]
        assert ("tool", "pure done") in kinds
        runs = await client.runs.list(thread_id)
        assert {r["run_id"]: r["status"] for r in runs}[run_id] == "interrupted"
    finally:
        stop_server(second)
