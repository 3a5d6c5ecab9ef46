"""An acknowledged A2A task whose message had a file survives a SIGKILL of ``loom serve`` with
the file still attached: a real server on SQLite (the default store, which keeps media) is
killed after the acknowledgements and before the runs end, started again on the same file, and
each task's model is given the very bytes it was sent (the model reports their SHA-256).

Both ways a run is carried on are covered: the task whose message was committed before the
kill goes on from the journal (its media read back from the store's blobs), and the task that
was acknowledged but still queued behind the first on the same context (nothing of it
committed) runs with its message rebuilt from the task's stored history."""

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
from loom import Agent
from loom.server import AgentRegistry
from loom.testing import FunctionModel


async def held(messages, tools):
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


registry = AgentRegistry([Agent(name="held", instructions="Wait.", model=FunctionModel(held))])
"""

REST = "/agents/held/a2a/rest/message:send"
RPC = "/agents/held/a2a"
V1 = {"A2A-Version": "1.0"}


def start(tmp: Path, db: Path) -> Server:
    return start_server(tmp, app="media_agents:registry", source=AGENTS, db=db)


def _send(text: str, photo: bytes, context_id: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": f"m-{text}-{time.monotonic_ns()}",
        "role": "ROLE_USER",
        "parts": [
            {"text": text},
            {
                "raw": base64.b64encode(photo).decode(),
                "mediaType": "image/png",
                "filename": "p.png",
            },
        ],
    }
    if context_id:
        message["contextId"] = context_id
    return {"message": message, "configuration": {"returnImmediately": True}}


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
    try:  # between the two servers: the first message is committed, its image stored once
        events = await store.load_events(context_id)
        assert [e.content for e in events if e.type == EventType.USER_MESSAGE] == ["look at one"]
        refs = [ref for ref, _, _ in await store.session_blobs(context_id)]
        assert refs == ["sha256:" + hashlib.sha256(first_photo).hexdigest()]
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
