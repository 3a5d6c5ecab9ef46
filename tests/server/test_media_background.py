"""A background run's media survive a kill -9 before its turn started (issue 27): the server
stored them when it acknowledged the run, its run record names them, and the restarted server
carries the run on with them. Runs where SQLiteStore keeps media (``BlobStore``)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from tests.server.conftest import start_server, stop_server
from tests.server.test_media_surfaces import PNG_B64, PNG_SHA

from loom.store.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(
    not hasattr(SQLiteStore, "put_blobs"),
    reason="SQLiteStore does not keep media (BlobStore) on this branch yet",
)

HELD_AGENTS = r"""
import asyncio
import hashlib
from pathlib import Path

from loom import Agent
from loom.server import AgentRegistry
from loom.testing import FunctionModel


async def looker(messages, tools):
    last = messages[-1]
    if last.content == "hold":
        while Path("hold").exists():  # the test removes it before the restart
            await asyncio.sleep(0.02)
        return "held"
    seen = [f"{p.kind} {p.media_type} {hashlib.sha256(p.data).hexdigest()}" for p in last.parts]
    return f"text={last.content!r} parts=" + "; ".join(seen)


registry = AgentRegistry([Agent(name="looker", model=FunctionModel(looker))])
"""


async def test_a_queued_background_run_keeps_its_image_across_a_kill_9(tmp_path: Path) -> None:
    (tmp_path / "hold").touch()
    db = tmp_path / "media.db"
    first = start_server(tmp_path, app="held_agents:registry", source=HELD_AGENTS, db=db)
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            hold = {
                "assistant_id": "looker",
                "input": {"messages": [{"role": "user", "content": "hold"}]},
            }
            assert (await http.post(f"/threads/{tid}/runs", json=hold)).status_code == 200
            content = [
                {"type": "text", "text": "look"},
                {"type": "image", "base64": PNG_B64, "mime_type": "image/png"},
            ]
            body = {
                "assistant_id": "looker",
                "multitask_strategy": "enqueue",
                "input": {"messages": [{"role": "user", "content": content}]},
            }
            # it waits behind the held run: its message is not committed when the server dies
            queued = (await http.post(f"/threads/{tid}/runs", json=body)).json()
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    (tmp_path / "hold").unlink()
    second = start_server(tmp_path, app="held_agents:registry", source=HELD_AGENTS, db=db)
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            joined = await http.get(f"/threads/{tid}/runs/{queued['run_id']}/join")
            said = joined.json()["messages"][-1]["content"]
            assert said == f"text='look' parts=image image/png {PNG_SHA}"
    finally:
        stop_server(second)
