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


# -- acknowledged means durable; announced means stored -----------------------------------------
HELD_AGENTS = """
import asyncio
from pathlib import Path
from loom import Agent
from loom.server import AgentRegistry
from loom.testing import FunctionModel


async def held(messages, tools):
    while Path("hold").exists():  # every model call waits until the test removes the file
        await asyncio.sleep(0.02)
    return "done: " + [m for m in messages if m.role == "user"][-1].content


registry = AgentRegistry([Agent(name="held", instructions="Wait.", model=FunctionModel(held))])
"""


def start_held(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="held_agents:registry", source=HELD_AGENTS, db=db)


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def test_every_acknowledged_background_run_survives_a_kill_9_right_after_its_ack(
    tmp_path: Path,
) -> None:
    """Background runs of every surface that takes them (LangGraph's ``POST
    /threads/{id}/runs`` and stateless ``POST /runs``, the Agent Protocol's ``POST /runs``),
    killed with SIGKILL 0 ms after an acknowledgement: after the restart each acknowledged run
    exists and ends once, its message committed exactly once."""
    from loom.events import EventType
    from loom.store import SQLiteStore

    (tmp_path / "hold").touch()
    db = tmp_path / "acked.db"
    first = start_held(tmp_path, db)
    acked: list[tuple[str, str, str]] = []  # (thread, run, message)
    surfaces: set[str] = set()
    killed = asyncio.Event()
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            threads = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(4)]
            shared = threads[0]  # two runs queue on it, in the order they were taken

            def requests() -> list[tuple[str, str, dict[str, Any], str]]:
                out = []
                for i, tid in enumerate([shared, *threads]):
                    body = {"assistant_id": "held", "input": ask(f"lg {i}")}
                    out.append(("langgraph", f"/threads/{tid}/runs", body, f"lg {i}"))
                for i in range(3):
                    body = {
                        "assistant_id": "held",
                        "input": ask(f"stateless {i}"),
                        "on_completion": "keep",
                    }
                    out.append(("stateless", "/runs", body, f"stateless {i}"))
                for i in range(3):
                    tid = (threads[1:] * 2)[i]
                    body = {
                        "agent_id": "held",
                        "thread_id": tid,
                        "messages": [{"role": "user", "content": f"ap {i}"}],
                    }
                    out.append(("agent-protocol", "/runs", body, f"ap {i}"))
                return out

            async def send(surface: str, path: str, body: dict[str, Any], text: str) -> None:
                try:
                    r = await http.post(path, json=body)
                except httpx.HTTPError:
                    return  # never acknowledged
                if killed.is_set() or r.status_code != 200:
                    return
                run = r.json()
                assert "carries the run on" in r.headers["loom-run-durability"]
                acked.append((run["thread_id"], run["run_id"], text))
                surfaces.add(surface)
                if surfaces == {"langgraph", "stateless", "agent-protocol"}:
                    killed.set()  # 0 ms after this acknowledgement: no await in between
                    first.process.send_signal(signal.SIGKILL)

            await asyncio.gather(*(send(*req) for req in requests()))
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    assert killed.is_set() and len(acked) >= 3
    (tmp_path / "hold").unlink()

    second = start_held(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            for tid, run_id, text in acked:
                run = (await http.get(f"/threads/{tid}/runs/{run_id}")).json()
                assert run.get("status") in ("pending", "running", "success"), (text, run)
                joined = (await http.get(f"/threads/{tid}/runs/{run_id}/join")).json()
                assert joined["messages"][-1]["content"].startswith("done:"), (text, joined)
                again = (await http.get(f"/runs/{run_id}")).json()
                assert again["status"] == "success" and again["thread_id"] == tid
    finally:
        stop_server(second)
    store = SQLiteStore(str(db))
    try:
        for tid, run_id, text in acked:
            events = await store.load_events(tid)
            asked = [e for e in events if e.type == EventType.USER_MESSAGE and e.content == text]
            assert len(asked) == 1, (text, [e.run_id for e in asked])
            mine = {e.run_id for e in events if e.run_id.startswith(run_id)}
            assert asked[0].run_id in mine
            finished = [e for e in events if e.type == EventType.AGENT_FINISH and e.run_id in mine]
            assert [e.stop_reason for e in finished] == ["completed"], text
            assert any(
                e.type == EventType.LLM_COMPLETE and e.answer == f"done: {text}" for e in events
            )
        runs_on_shared = [r for t, r, _ in acked if t == acked[0][0]]
        assert len(runs_on_shared) >= 1
    finally:
        await store.close()


REJOIN_AGENTS = '''
import asyncio
from pathlib import Path
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool(effect="pure")
def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


async def noting(messages, tools):
    if messages[-1].role == "user":
        return ModelResponse(tool_calls=[ToolCall(name="note", arguments={"text": "it"})])
    while Path("hold").exists():  # the second model call waits until the test removes the file
        await asyncio.sleep(0.02)
    return "done after the note"


registry = AgentRegistry([
    Agent(name="noting", instructions="Note.", model=FunctionModel(noting), tools=[note]),
])
'''

ALL_MODES = ["values", "updates", "messages-tuple", "messages", "events", "custom", "debug"]


def _waiting_for_the_model(events: list[tuple[str, str, Any]]) -> bool:
    """The run announced its second model call (and waits in it)."""
    return any(
        ev == "events" and e["type"] == "llm_start" and e["iteration"] == 2 for _, ev, e in events
    )


async def _read_until_waiting(response: httpx.Response) -> list[tuple[str, str, Any]]:
    lines: list[str] = []
    async for line in response.aiter_lines():
        lines.append(line)
        if line == "" and _waiting_for_the_model(sse(lines)):
            break
    return sse(lines)


async def test_a_rejoin_after_kill_9_works_from_every_event_id_received_in_every_mode(
    tmp_path: Path,
) -> None:
    """A streamed run, a background run and a Weave stream, each killed (SIGKILL) while the
    model is called: after the restart a rejoin from every event id the client received, in
    every stream mode, is served (never 422 "past the end of the run"); the background run is
    carried on to its end."""
    (tmp_path / "hold").touch()
    db = tmp_path / "rejoin.db"
    first = start_server(tmp_path, app="rejoin_agents:registry", source=REJOIN_AGENTS, db=db)
    body = {"assistant_id": "noting", "input": ask("go"), "stream_mode": ALL_MODES}
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            streamed = (await http.post("/threads", json={})).json()["thread_id"]
            async with http.stream("POST", f"/threads/{streamed}/runs/stream", json=body) as r:
                seen_streamed = await _read_until_waiting(r)
            background = (await http.post("/threads", json={})).json()["thread_id"]
            created = (await http.post(f"/threads/{background}/runs", json=body)).json()
            path = f"/threads/{background}/runs/{created['run_id']}/stream"
            async with http.stream("GET", path, params={"stream_mode": ALL_MODES}) as r:
                seen_background = await _read_until_waiting(r)
            weave = {"agent": "noting", "message": "go", "session_id": "weave-rejoin"}
            weave_lines: list[str] = []
            async with http.stream("POST", "/v1/weave:stream", json=weave) as r:
                async for line in r.aiter_lines():
                    weave_lines.append(line)
                    got = sse(weave_lines)
                    ended = [i for i, (_, ev, _) in enumerate(got) if ev == "tool_end"]
                    if ended and any(
                        ev == "stage" and d["to"] == "calling_llm" for _, ev, d in got[ended[0] :]
                    ):
                        break
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    (tmp_path / "hold").unlink()
    seen_weave = sse(weave_lines)

    second = start_server(tmp_path, app="rejoin_agents:registry", source=REJOIN_AGENTS, db=db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            for thread_id, seen, status in (
                (streamed, seen_streamed, "interrupted"),  # its client was there: not re-run
                (background, seen_background, "success"),  # acknowledged: carried on
            ):
                run_id = seen[0][2]["run_id"]
                path = f"/threads/{thread_id}/runs/{run_id}/stream"
                ids = [eid for eid, _, _ in seen if eid]
                assert len(ids) >= 5
                for eid in ids:
                    for modes in (ALL_MODES, *([m] for m in ALL_MODES)):
                        r = await http.get(
                            path, params={"stream_mode": modes}, headers={"Last-Event-ID": eid}
                        )
                        assert r.status_code == 200, (eid, modes, r.text)
                        rest = sse([*r.text.splitlines(), ""])
                        assert rest[-1][1] == "end" and rest[-1][2]["status"] == status
                        assert {ev for _, ev, _ in rest} <= {"end", "error", *_events_of(modes)}
                        at = ids.index(eid)
                        got = [i for i, _, _ in rest if i]
                        assert not set(got) & set(ids[: at + 1])  # nothing it had, again
                if status == "success":  # its answer came after the restart
                    r = await http.get(
                        path, params={"stream_mode": "values"}, headers={"Last-Event-ID": ids[-1]}
                    )
                    done = [d for _, ev, d in sse([*r.text.splitlines(), ""]) if ev == "values"]
                    assert done[-1]["messages"][-1]["content"] == "done after the note"
            weave_ids = [eid for eid, _, _ in seen_weave if eid]
            assert len(weave_ids) >= 3
            again = {"agent": "noting", "message": "again", "session_id": "weave-rejoin"}
            assert (await http.post("/v1/weave", json=again)).status_code == 200  # events to read
            for eid in weave_ids:
                async with http.stream(
                    "GET", "/v1/sessions/weave-rejoin/events", headers={"Last-Event-ID": eid}
                ) as r:
                    assert r.status_code == 200, (eid, await r.aread())
                    async for line in r.aiter_lines():
                        assert not line.startswith("event: error"), line
                        if line.startswith("data: "):
                            break
    finally:
        stop_server(second)


def _events_of(modes: list[str]) -> set[str]:
    """The SSE event names the frames of ``modes`` use."""
    names = {
        "values": {"values"},
        "updates": {"updates"},
        "messages-tuple": {"messages"},
        "messages": {"messages/partial", "messages/complete", "messages/metadata"},
        "events": {"events"},
    }
    return {"metadata"} | set().union(*(names.get(m, set()) for m in modes))


async def test_a_background_run_a_graceful_shutdown_cancelled_is_carried_on_at_the_next_start(
    tmp_path: Path,
) -> None:
    """SIGTERM with ``--grace 0`` cancels the running background run (``server shutting
    down``); the next start carries it on from the journal: its message is not sent again and
    it ends ``completed`` once."""
    from loom.events import EventType
    from loom.store import SQLiteStore

    (tmp_path / "hold").touch()
    db = tmp_path / "drained.db"
    first = start_server(
        tmp_path, "--grace", "0", app="held_agents:registry", source=HELD_AGENTS, db=db
    )
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            body = {"assistant_id": "held", "input": ask("drained"), "stream_mode": "events"}
            run = (await http.post(f"/threads/{tid}/runs", json=body)).json()
            path = f"/threads/{tid}/runs/{run['run_id']}/stream"
            async with http.stream("GET", path) as r:
                async for line in r.aiter_lines():
                    if '"type": "llm_start"' in line:
                        break  # the model is being called (and waits)
    finally:
        first.process.send_signal(signal.SIGTERM)
        first.process.wait(timeout=30)
    (tmp_path / "hold").unlink()
    second = start_held(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            joined = (await http.get(f"/threads/{tid}/runs/{run['run_id']}/join")).json()
            assert joined["messages"][-1]["content"] == "done: drained"
    finally:
        stop_server(second)
    store = SQLiteStore(str(db))
    try:
        events = await store.load_events(tid)
        assert [e.type for e in events].count(EventType.USER_MESSAGE) == 1
        ends = [(e.stop_reason, e.error) for e in events if e.type == EventType.AGENT_FINISH]
        assert ends == [("cancelled", "server shutting down"), ("completed", None)]
    finally:
        await store.close()
