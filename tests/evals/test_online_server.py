"""Online evaluation on a real ``loom serve``: ``LOOM_EVAL_ONLINE`` names the settings file,
the server's scheduler runs the ``evaluate`` job, and a run made over HTTP gets its score in
the store's ``loom.evals.online`` records (read from the test process, as any tool would)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.server.conftest import Server, start_server, stop_server

from loom.evals.online import ONLINE_NS

pytestmark = pytest.mark.timeout(120)

SETTINGS = """\
online:
  sample: 1.0
  every: 0.5
  evaluators:
    - {stop_reason: completed}
    - {model_calls: {max: 5}}
    - {not_called: deploy}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("online-server")
    settings = tmp / "online.yaml"
    settings.write_text(SETTINGS)
    srv = start_server(tmp, env={"LOOM_EVAL_ONLINE": str(settings), "LOOM_SCHEDULE_POLL": "0.1"})
    yield srv
    stop_server(srv)


async def _records(db: Path) -> list[dict[str, Any]]:
    from loom.store import SQLiteStore

    store = SQLiteStore(db)
    try:
        out = []
        for key in await store.list_keys(ONLINE_NS):
            value = await store.get_value(ONLINE_NS, key)
            if isinstance(value, dict):
                out.append(value)
        return out
    finally:
        await store.close()


def test_a_served_run_is_scored_by_the_servers_evaluate_job(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        thread = http.post("/threads", json={}).json()["thread_id"]
        body = {
            "agent_id": "calc",
            "thread_id": thread,
            "messages": [{"role": "user", "content": "add 2 3"}],
        }
        waited = http.post("/runs/wait", json=body)
        assert waited.status_code == 200, waited.text
    deadline = time.monotonic() + 60
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:  # another process's job: poll its output, bounded
        found = [r for r in asyncio.run(_records(server.db)) if r["session_id"] == thread]
        if found:
            break
        time.sleep(0.2)
    assert len(found) == 1, found
    record = found[0]
    assert record["status"] == "scored" and record["passed"] is True and record["score"] == 1.0
    assert [c["name"] for c in record["checks"]] == ["stop_reason", "model_calls", "not_called"]
    # the console's session page shows it
    page = httpx.get(f"{server.url}/console/sessions/{thread}", timeout=30)
    assert page.status_code == 200
    assert 'id="online-evals"' in page.text and "scored" in page.text
