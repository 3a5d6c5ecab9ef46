"""The cron and monitor endpoints on a real ``loom serve``, through langgraph-sdk's client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("langgraph_sdk")

from tests.server.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("sched"), env={"LOOM_SCHEDULE_POLL": "0.1"})
    yield srv
    stop_server(srv)


async def test_langgraph_sdk_crons_round_trip(server: Server) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=server.url)
    cron = await client.crons.create(
        "calc",
        schedule="0 9 * * 1-5",
        timezone="Europe/Berlin",
        input={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert cron["schedule"] == "0 9 * * 1-5" and cron["enabled"] is True
    assert cron["next_run_date"] is not None and cron["thread_id"] is None
    on_thread = await client.crons.create_for_thread(
        "t-1",
        "calc",
        schedule="*/5 * * * *",
        input={"messages": [{"role": "user", "content": "2 3"}]},
    )
    assert on_thread["thread_id"] == "t-1"
    found = await client.crons.search(assistant_id="calc", thread_id="t-1")
    assert [c["cron_id"] for c in found] == [on_thread["cron_id"]]
    updated = await client.crons.update(cron["cron_id"], enabled=False)
    assert updated["enabled"] is False and updated["next_run_date"] is None
    await client.crons.delete(cron["cron_id"])
    await client.crons.delete(on_thread["cron_id"])
    assert await client.crons.search() == []


def test_bad_cron_input_is_422_naming_the_field(server: Server) -> None:
    for body, field in [
        ({"assistant_id": "calc", "schedule": "every day", "input": "x"}, "cron"),
        (
            {
                "assistant_id": "calc",
                "schedule": "0 9 * * *",
                "input": "x",
                "timezone": "Moon/Base",
            },
            "timezone",
        ),
    ]:
        r = httpx.post(f"{server.url}/runs/crons", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"].startswith(f"{field}:")
    r = httpx.post(
        f"{server.url}/runs/crons", json={"assistant_id": "ghost", "schedule": "* * * * *"}
    )
    assert r.status_code == 404 and "ghost" in r.text
    r = httpx.request("PATCH", f"{server.url}/runs/crons/nope", json={"enabled": False})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/monitors/nope/checkins", json={"status": "ok"})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]


def test_numbers_out_of_range_are_422_not_500(server: Server) -> None:
    # found by schemathesis: a limit past 64 bits reached SQLite and failed with OverflowError
    huge = 15896965166188016495279345555541590016
    for path, body in [
        ("/runs/crons/search", {"limit": huge}),
        ("/runs/crons/search", {"offset": huge}),
        ("/runs/crons/count", {"limit": -1}),
        ("/monitors", {"id": "m", "interval": 1e300}),
        ("/monitors", {"id": "m", "margin": -5}),
    ]:
        r = httpx.post(f"{server.url}{path}", json=body)
        assert r.status_code == 422, (path, body, r.text)
    r = httpx.get(f"{server.url}/runs/crons/nope/runs", params={"limit": huge})
    assert r.status_code == 422, r.text
    r = httpx.get(f"{server.url}/monitors/events", params={"after": huge})
    assert r.status_code == 422, r.text


def test_monitor_checkins_stream_as_sse(server: Server) -> None:
    r = httpx.post(f"{server.url}/monitors", json={"id": "nightly", "cron": "0 3 * * *"})
    assert r.status_code == 200, r.text
    assert r.json()["health"] == "new"
    for status in ("in_progress", "ok", "error"):
        assert (
            httpx.post(
                f"{server.url}/monitors/nightly/checkins", json={"status": status}
            ).status_code
            == 200
        )
    assert httpx.get(f"{server.url}/monitors/nightly").json()["health"] == "failing"
    seen = []
    with httpx.stream("GET", f"{server.url}/monitors/events", timeout=10) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:])["status"])
            if len(seen) == 3:
                break
    assert seen == ["in_progress", "ok", "error"]


def test_the_server_fires_a_schedule(server: Server) -> None:
    # an interval schedule through the Python API on the server's own store file
    from loom.schedule import Schedule, ScheduleStore
    from loom.store import SQLiteStore

    async def add_and_wait() -> list[str]:
        store = SQLiteStore(server.db)
        schedules = ScheduleStore(store)
        await schedules.add(Schedule(agent="calc", message="2 3", interval=0.5, id="fast"))
        for _ in range(200):
            runs = await schedules.schedule_runs("fast")
            if any(r.status == "finished" for r in runs):
                break
            await asyncio.sleep(0.05)
        await schedules.remove("fast")
        msgs = await store.load_messages(next(r.session_id for r in runs if r.status == "finished"))
        await store.close()
        return [m.content for m in msgs]

    assert asyncio.run(add_and_wait())[-1] == "The sum is 5."
