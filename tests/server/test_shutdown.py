"""SIGTERM drains a real ``loom serve``: no new runs, running turns finish or are cancelled with
a recorded reason, streams end with a final event, the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")


def _events(lines: Any) -> Any:
    """(event, data) pairs of an SSE response."""
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event is not None:
            yield event, json.loads(line.split(":", 1)[1])
            event = None


def _stream_then_sigterm(srv: Server, seconds: float) -> tuple[list[tuple[str, Any]], str]:
    run = {
        "assistant_id": "slow",
        "if_not_exists": "create",
        "stream_mode": ["values"],
        "input": {"messages": [{"role": "user", "content": f"sleep {seconds}"}]},
    }
    seen: list[tuple[str, Any]] = []
    with httpx.stream("POST", f"{srv.url}/threads/drain/runs/stream", json=run, timeout=30) as r:
        events = _events(r.iter_lines())
        for ev in events:
            seen.append(ev)
            if ev[0] == "values":  # the turn has started: its human message is in
                break
        srv.process.send_signal(signal.SIGTERM)
        for _ in range(40):  # the signal is handled asynchronously
            ready = httpx.get(f"{srv.url}/readyz")
            if ready.status_code == 503:
                break
            time.sleep(0.05)
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        again = httpx.post(f"{srv.url}/threads/other/runs/wait", json=run)
        assert again.status_code == 503
        assert again.json()["error"]["type"] == "ShuttingDown"
        assert httpx.get(f"{srv.url}/threads/drain").status_code == 200  # reads still work
        seen.extend(events)
    return seen, r.headers["content-location"].rsplit("/", 1)[1]


def _finish(db: Path, thread: str, run_id: str) -> Any:
    from loom.events import AgentFinish
    from loom.store.sqlite import SQLiteStore

    async def read() -> Any:
        store = SQLiteStore(str(db))
        try:
            events = await store.load_events(thread, run_id)
        finally:
            await store.close()
        return next(e for e in events if isinstance(e, AgentFinish))

    return asyncio.run(read())


def test_sigterm_cancels_what_outlives_the_grace(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--grace", "0.5", app="server_agents:slow_registry")
    seen, run_id = _stream_then_sigterm(srv, 30)
    assert srv.process.wait(timeout=15) == 0
    assert seen[-1] == ("end", {"run_id": run_id, "status": "interrupted"})
    finish = _finish(srv.db, "drain", run_id)
    assert finish.stop_reason == "cancelled" and finish.error == "server shutting down"


def test_sigterm_lets_a_short_turn_finish(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--grace", "10", app="server_agents:slow_registry")
    seen, run_id = _stream_then_sigterm(srv, 1)
    assert srv.process.wait(timeout=15) == 0
    assert seen[-1] == ("end", {"run_id": run_id, "status": "success"})
    assert seen[-2][1]["messages"][-1]["content"] == "slept 1"
    assert _finish(srv.db, "drain", run_id).stop_reason == "completed"
