"""An acknowledged A2A task whose message had a file survives a SIGKILL of ``loom serve`` with
the file still attached: a real server on SQLite (the default store, which keeps media) is
killed after the acknowledgements and before the runs end, started again on the same file, and
each task's model is given the very bytes it was sent (the model reports their SHA-256).

Both ways a run is carried on are covered: the task whose message was committed before the
kill goes on from the journal (its media read back from the store's blobs), and the task that
was acknowledged but still queued behind the first on the same context (nothing of it
committed) runs with its message from its run's record, which names its media (stored at the
acknowledgement) by reference. So does a follow-up message on a task still open, which is not
the task's first message."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.interop.a2a_agents import png
from tests.server.conftest import Server, start_server, stop_server

from loom.events import EventType
from loom.store import SQLiteStore

pytest.importorskip("a2a")

AGENTS = """
import asyncio
import hashlib
from pathlib import Path
from loom import Agent, ModelResponse, ToolCall, tool
from loom.server import AgentRegistry
from loom.testing import FunctionModel


@tool
def ship() -> str:
    "Ship the release (needs approval)."
    return "shipped"


async def held(messages, tools):
    if messages[-1].role == "user" and messages[-1].content.startswith("ship"):
        return ModelResponse(tool_calls=[ToolCall(name="ship", arguments={})])
    if messages[-1].role == "tool":  # the answer after the approved call waits for the test
        Path("called-shipped").touch()
        while Path("hold").exists():
            await asyncio.sleep(0.02)
        return "done: " + messages[-1].content
    last = [m for m in messages if m.role == "user"][-1]
    Path("called-" + last.content.split()[-1]).touch()  # the test waits for the model call
    while Path("hold").exists():
        await asyncio.sleep(0.02)
    seen = [
        f"{p.name} {p.media_type} {hashlib.sha256(p.data).hexdigest()}"
        for p in last.parts
        if p.data is not None
    ]
    return "done: " + last.content + "; " + "; ".join(seen)


registry = AgentRegistry([
    Agent(
        name="held",
        instructions="Wait.",
        model=FunctionModel(held),
        tools=[ship],
        permissions={"ask": ["ship"]},
    )
])
"""

REST = "/agents/held/a2a/rest/message:send"
RPC = "/agents/held/a2a"
V1 = {"A2A-Version": "1.0"}


def start(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="media_agents:registry", source=AGENTS, db=db)


def _send(
    text: str, photo: bytes | None, context_id: str = "", task_id: str = "", *, wait: bool = False
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": text}]
    if photo is not None:
        raw = base64.b64encode(photo).decode()
        parts.append({"raw": raw, "mediaType": "image/png", "filename": "p.png"})
    message: dict[str, Any] = {
        "messageId": f"m-{text}-{time.monotonic_ns()}",
        "role": "ROLE_USER",
        "parts": parts,
    }
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    return {"message": message, "configuration": {"returnImmediately": not wait}}


async def _task(http: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
    task: dict[str, Any] = (await http.post(RPC, json=body, headers=V1)).json()["result"]
    return task


async def _until(what: str, check: Any, limit: float = 30) -> None:
    """Wait (polling: the condition is in another process) until ``check()`` holds."""
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_an_acknowledged_a2a_task_with_a_file_survives_a_kill_9(tmp_path: Path) -> None:
    (tmp_path / "hold").touch()
    db = tmp_path / "media.db"
    first_photo, queued_photo = png(5, 4), png(7, 3)
    first = start(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            r = await http.post(REST, json=_send("look at one", first_photo), headers=V1)
            acked = r.json()["task"]
            assert "carries the run on" in acked["metadata"]["loomDurability"], acked
            task_id, context_id = acked["id"], acked["contextId"]

            async def called() -> bool:
                return (tmp_path / "called-one").exists()

            await _until("the first task's model call", called)  # its message is committed
            # a second task on the same context: acknowledged, queued behind the first
            r = await http.post(
                REST, json=_send("look at two", queued_photo, context_id), headers=V1
            )
            queued = r.json()["task"]
            assert queued["contextId"] == context_id and queued["id"] != task_id, queued
            assert "carries the run on" in queued["metadata"]["loomDurability"], queued
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    assert not (tmp_path / "called-two").exists()  # nothing of the queued run had started
    store = SQLiteStore(str(db))
    try:  # between the two servers: the first message is committed; both images are stored
        # (the queued one with its run's record, named by reference), each once
        events = await store.load_events(context_id)
        assert [e.content for e in events if e.type == EventType.USER_MESSAGE] == ["look at one"]
        refs = [ref for ref, _, _ in await store.session_blobs(context_id)]
        assert refs == [
            "sha256:" + hashlib.sha256(first_photo).hexdigest(),
            "sha256:" + hashlib.sha256(queued_photo).hexdigest(),
        ]
    finally:
        await store.close()
    (tmp_path / "hold").unlink()

    second = start(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            answers = {}
            for tid in (task_id, queued["id"]):

                async def completed(tid: str = tid) -> bool:
                    task = await _task(http, tid)
                    answers[tid] = task
                    return bool(task["status"]["state"] == "TASK_STATE_COMPLETED")

                await _until(f"task {tid} completed", completed)
    finally:
        stop_server(second)
    for tid, text, photo in (
        (task_id, "look at one", first_photo),
        (queued["id"], "look at two", queued_photo),
    ):
        got = answers[tid]["artifacts"][-1]["parts"][0]["text"]
        assert got == f"done: {text}; p.png image/png {hashlib.sha256(photo).hexdigest()}", got
    store = SQLiteStore(str(db))
    try:  # each message committed once, each run finished once, both images stored
        events = await store.load_events(context_id)
        asked = [e.content for e in events if e.type == EventType.USER_MESSAGE]
        assert asked == ["look at one", "look at two"], asked  # carried on in the order taken
        finished = [e.stop_reason for e in events if e.type == EventType.AGENT_FINISH]
        assert finished.count("completed") == 2, finished
        refs = {ref for ref, _, _ in await store.session_blobs(context_id)}
        assert refs == {
            "sha256:" + hashlib.sha256(first_photo).hexdigest(),
            "sha256:" + hashlib.sha256(queued_photo).hexdigest(),
        }
    finally:
        await store.close()


async def test_a_follow_up_with_a_file_on_an_open_task_survives_a_kill_9(tmp_path: Path) -> None:
    """A follow-up message with a file, sent without blocking on a task still open
    (``input-required``, its approval given over another surface), queued behind a run of its
    context when the server is killed: after the restart the follow-up runs with its own text
    and file, not the task's first message."""
    (tmp_path / "hold").touch()
    db = tmp_path / "follow.db"
    photo = png(6, 6)
    first = start(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            r = await http.post(REST, json=_send("ship it", None, wait=True), headers=V1)
            task = r.json()["task"]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
            task_id, context_id = task["id"], task["contextId"]
            # approved over the LangGraph API: its run holds the context (and the A2A task
            # stays input-required: the decision came from elsewhere)
            body = {"assistant_id": "held", "command": {"resume": "approve"}}
            r = await http.post(f"/threads/{context_id}/runs", json=body)
            assert r.status_code == 200, r.text

            async def shipped() -> bool:
                return (tmp_path / "called-shipped").exists()

            await _until("the approved call ran", shipped)
            follow_up = _send("look at three", photo, context_id, task_id)
            r = await http.post(REST, json=follow_up, headers=V1)
            assert r.status_code == 200, r.text
            status = (await _task(http, task_id))["status"]
            assert status["state"] == "TASK_STATE_WORKING", status  # taken, not yet run
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    assert not (tmp_path / "called-three").exists()  # queued: nothing of it had started
    (tmp_path / "hold").unlink()

    second = start(tmp_path, db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            got: dict[str, Any] = {}

            async def completed() -> bool:
                got.update(await _task(http, task_id))
                state = got["status"]["state"]
                # the task's first message run again would stop on its approval once more
                assert "pendingApprovals" not in str(got["status"]), got["status"]
                return bool(state == "TASK_STATE_COMPLETED")

            await _until("the follow-up's task completed", completed)
    finally:
        stop_server(second)
    answer = got["artifacts"][-1]["parts"][0]["text"]
    assert answer == f"done: look at three; p.png image/png {hashlib.sha256(photo).hexdigest()}"
    store = SQLiteStore(str(db))
    try:
        events = await store.load_events(context_id)
        asked = [e.content for e in events if e.type == EventType.USER_MESSAGE]
        assert asked == ["ship it", "look at three"], asked
    finally:
        await store.close()
