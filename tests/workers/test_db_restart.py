"""A PostgreSQL restart: `loom worker` rides it out (bounded retries, logged) and takes runs
again; a server with --queue answers 503 with Retry-After meanwhile, then accepts again."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from loom.workers import enqueue_run, ensure_schema, make_app

from .conftest import Cluster, Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def wait_for(predicate: Any, within: float, what: str) -> None:
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {within} s")
        await asyncio.sleep(0.1)


async def run_one(dsn: str, session: str, within: float = 30) -> str:
    app = make_app(dsn)
    async with app.open_async():
        job = await enqueue_run(app, "fleet", session, "hello")
        end = asyncio.get_running_loop().time() + within
        while True:
            status = (await app.job_manager.get_job_status_async(job)).value
            if status in ("succeeded", "failed") or asyncio.get_running_loop().time() > end:
                return str(status)
            await asyncio.sleep(0.2)


async def test_a_worker_rides_out_database_restarts(cluster: Cluster, tmp_path: Path) -> None:
    await ensure_schema(cluster.dsn)
    fleet = Fleet(cluster.dsn, tmp_path, grace=2)
    try:
        worker = fleet.start()
        await wait_for(lambda: "loom worker started" in fleet.log(worker), 30, "the start-up line")
        assert await run_one(cluster.dsn, "before") == "succeeded"

        def outages() -> int:
            return fleet.log(worker).count("database unreachable")

        def more_than(seen: int) -> Any:
            return lambda: outages() > seen

        for n in range(3):
            seen = outages()
            cluster.restart()
            await wait_for(more_than(seen), 30, "the worker noticing the restart")
            assert worker.poll() is None, fleet.log(worker)
            assert await run_one(cluster.dsn, f"after-{n}") == "succeeded", fleet.log(worker)
        seen = outages()
        cluster.stop()  # down for longer than a blip: still waiting, still alive
        await wait_for(more_than(seen), 30, "the worker noticing the stop")
        assert worker.poll() is None, fleet.log(worker)
        cluster.start()
        assert await run_one(cluster.dsn, "after-stop") == "succeeded", fleet.log(worker)
        log = fleet.log(worker)
        assert log.count("database unreachable") >= 4 and "reachable again" in log, log
        worker.send_signal(signal.SIGTERM)  # a stop asked for is a clean exit
        assert worker.wait(30) == 0, fleet.log(worker)
        assert "loom worker stopped" in fleet.log(worker)
        print(fleet.log(worker))
    finally:
        fleet.stop()


async def test_a_worker_whose_database_stays_away_exits_non_zero(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Giving up is a failure exit (``Restart=on-failure`` brings the worker back), never 0."""
    await ensure_schema(cluster.dsn)
    fleet = Fleet(cluster.dsn, tmp_path, **{"db-wait": 2})
    try:
        worker = fleet.start()
        await wait_for(lambda: "loom worker started" in fleet.log(worker), 30, "the start-up line")
        cluster.stop()
        try:
            await wait_for(lambda: worker.poll() is not None, 120, "the worker giving up")
        finally:
            cluster.start()
        assert worker.returncode == 2, fleet.log(worker)
        assert "stayed unreachable for 2 s" in fleet.log(worker)
    finally:
        fleet.stop()


def test_a_server_answers_503_while_its_database_restarts(cluster: Cluster, tmp_path: Path) -> None:
    import httpx
    from tests.server.conftest import start_server, stop_server

    url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    server = start_server(tmp_path, "--queue", store=url)
    run = {"assistant_id": "calc", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            thread = http.post("/threads", json={}).json()["thread_id"]
            cluster.stop()
            try:
                for path, body in [(f"/threads/{thread}/runs", run), ("/threads", {})]:
                    r = http.post(path, json=body)
                    assert r.status_code == 503, (path, r.status_code, r.text)
                    assert r.headers["retry-after"].isdigit()
                    assert r.json()["error"]["type"] == "Unavailable"
            finally:
                cluster.start()
            # back up: a client that retries as told gets through once the pool has reconnected
            # (a request may still meet a connection the restart broke: that one is a 503 too)
            for _ in range(40):
                r = http.post(f"/threads/{thread}/runs", json=run)
                if r.status_code != 503:
                    break
                assert r.headers["retry-after"].isdigit()
                time.sleep(0.5)
            assert r.status_code == 200, r.text
    finally:
        stop_server(server)
