"""A served run close to the floor (issue 26), on a real ``loom serve`` subprocess (SQLite):

- the server's memory along one long thread stays flat: after 500 turns its RSS is within
  1.2x of what it was after 10 (each finished run used to keep a stream buffer with the whole
  transcript in every ``values`` frame: 95 -> 470 MB over 500 turns);
- a rejoin (``GET .../runs/{id}/stream`` with ``Last-Event-ID``) from any event id the client
  received, after the server was killed (SIGKILL) and started again, replays exactly the frames
  with ids the client received after that id (same ids, same events, same data), in every
  stream mode: what a finished run's buffer held and what the journal replays agree.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

STEPS_AGENTS = '''
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(k):
    def answer(messages, tools):
        i = 0  # tool results since the run's user message
        for message in reversed(messages):
            if message.role == "user":
                break
            i += message.role == "tool"
        if i < k:
            return ModelResponse(tool_calls=[ToolCall(id=f"c{i}", name="add",
                                                      arguments={"a": i, "b": 1})])
        return ModelResponse(text=f"done after {k} calls")

    return FunctionModel(answer, record=False)


registry = AgentRegistry([
    Agent(name=f"k{k}", model=model(k), tools=[add], max_iterations=20) for k in (1, 3)
])
'''

ALL_MODES = ["values", "updates", "messages-tuple", "messages", "events"]
RUN = {"input": {"messages": [{"role": "user", "content": "go"}]}}


def _start(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="steps_agents:registry", source=STEPS_AGENTS, db=db)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _sse(text: str) -> list[tuple[str | None, str, Any]]:
    """(id or None, event, data) of each SSE event (an event without an id line has None)."""
    out: list[tuple[str | None, str, Any]] = []
    ev, eid, data = "", None, ""
    for line in [*text.splitlines(), ""]:
        if line.startswith("event: "):
            ev = line[7:]
        elif line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and ev:
            out.append((eid, ev, json.loads(data)))
            ev, eid, data = "", None, ""
    return out


def test_the_500th_turn_of_a_thread_costs_the_server_no_more_memory_than_the_10th(
    tmp_path: Path,
) -> None:
    server = _start(tmp_path, tmp_path / "long.db")
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            thread = http.post("/threads", json={}).json()["thread_id"]
            rss: dict[int, int] = {}
            for turn in range(1, 501):
                done = http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "k1", **RUN})
                assert done.status_code == 200, done.text
                if turn in (10, 500):
                    rss[turn] = _rss_kib(server.process.pid)
            assert len(done.json()["messages"]) == 2000  # four messages a turn, all answered
    finally:
        stop_server(server)
    assert rss[500] <= 1.2 * rss[10], f"RSS after turn 10: {rss[10]} KiB, after 500: {rss[500]}"


def test_a_rejoin_from_any_received_event_id_after_kill_9_replays_the_same_frames(
    tmp_path: Path,
) -> None:
    _rejoin_after_kill_9(tmp_path, ["values", "updates", "messages", "events"])


@pytest.mark.xfail(
    strict=True,
    reason="a replay cannot know the final answer's text came as token deltas (never "
    "journaled): live, messages-tuple sends the deltas and no full message; replayed, it sends "
    "the full message with an id the live stream never used (FrameMaker, LlmComplete)",
)
def test_a_rejoin_after_kill_9_replays_the_same_messages_tuple_frames(tmp_path: Path) -> None:
    _rejoin_after_kill_9(tmp_path, ["messages-tuple"])


def _rejoin_after_kill_9(tmp_path: Path, single_modes: list[str]) -> None:
    """Stream three 3-step runs on one thread in every mode, kill the server (SIGKILL), start
    it again, and rejoin each run from every event id received, in all modes or one of
    ``single_modes`` (a seeded choice): the frames with ids after that id are the ones
    received."""
    db = tmp_path / "rejoin.db"
    first = _start(tmp_path, db)
    streamed: list[tuple[str, list[tuple[str | None, str, Any]]]] = []
    try:
        with httpx.Client(base_url=first.url, timeout=30) as http:
            thread = http.post("/threads", json={}).json()["thread_id"]
            for _ in range(3):  # later runs start from a longer transcript
                body = {"assistant_id": "k3", "stream_mode": ALL_MODES, **RUN}
                r = http.post(f"/threads/{thread}/runs/stream", json=body)
                assert r.status_code == 200, r.text
                streamed.append((thread, _sse(r.text)))
            # the newest runs' buffers are still held here: rejoin them before the kill too
            thread, frames = streamed[-1]
            run_id = frames[0][2]["run_id"]
            ids = [eid for eid, _, _ in frames if eid]
            path = f"/threads/{thread}/runs/{run_id}/stream"
            held = http.get(
                path, params={"stream_mode": ALL_MODES}, headers={"Last-Event-ID": ids[0]}
            )
            assert held.status_code == 200
    finally:
        first.process.send_signal(signal.SIGKILL)  # no shutdown, nothing flushed
        first.process.wait(timeout=10)

    def with_ids(frames: list[tuple[str | None, str, Any]]) -> list[tuple[str | None, str, Any]]:
        return [f for f in frames if f[0] is not None or f[1] == "end"]

    after_first = next(i for i, f in enumerate(frames) if f[0] == ids[0]) + 1
    assert with_ids(_sse(held.text)) == with_ids(frames[after_first:])

    second = _start(tmp_path, db)
    pick = random.Random(
        26
    )  # the stream modes of each rejoin: a seeded choice, the same every time
    try:
        with httpx.Client(base_url=second.url, timeout=30) as http:
            for thread, frames in streamed:
                run_id = frames[0][2]["run_id"]
                path = f"/threads/{thread}/runs/{run_id}/stream"
                positions = [i for i, (eid, _, _) in enumerate(frames) if eid]
                assert len(positions) >= 10
                for at in positions:  # every event id the client received
                    modes = pick.choice([ALL_MODES, *([m] for m in single_modes)])
                    eid = frames[at][0]
                    r = http.get(
                        path, params={"stream_mode": modes}, headers={"Last-Event-ID": eid}
                    )
                    assert r.status_code == 200, (eid, modes, r.text)
                    names = {"metadata", "end", *_names(modes)}
                    want = [f for f in with_ids(frames[at + 1 :]) if f[1] in names]
                    if modes == ALL_MODES and "messages-tuple" not in single_modes:
                        # every mode: the messages-tuple difference the xfail test shows
                        want = [f for f in want if f[1] != "messages"]
                        got = [f for f in with_ids(_sse(r.text)) if f[1] != "messages"]
                        assert got == want, (eid, modes)
                        continue
                    assert with_ids(_sse(r.text)) == want, (eid, modes)
    finally:
        stop_server(second)


def _names(modes: list[str]) -> set[str]:
    """The SSE event names of ``modes``' frames."""
    names = {
        "values": {"values"},
        "updates": {"updates"},
        "messages-tuple": {"messages"},
        "messages": {"messages/partial", "messages/complete"},
        "events": {"events"},
    }
    return set().union(*(names[m] for m in modes))


def test_an_idle_connection_outlives_the_clients_keep_alive_so_the_client_closes_it(
    server: Server,
) -> None:
    """``httpx`` (and uvicorn's default) keep an idle connection 5 s. With the server's
    keep-alive also 5 s, a client could send on a connection the server was closing at that
    instant and see a reset (``httpx.ReadError``, issue 24's throughput runs): the server must
    keep an idle connection open longer than that, so the client closes it first. The wait is
    the point of the test: an idle connection is one nothing happens on."""
    import http.client
    import time

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert first.status == 200 and not first.will_close
        first.read()
        sock = conn.sock
        time.sleep((httpx.Limits().keepalive_expiry or 5.0) + 0.5)
        conn.request("GET", "/healthz")  # on the same connection: still open
        assert conn.sock is sock
        # RemoteDisconnected here: the server had closed the idle connection
        assert conn.getresponse().status == 200
    finally:
        conn.close()
