"""Where webhooks attach: ``MonitorStore.subscribe`` (this process's changes) and
``MonitorStore.follow`` (every process's check-ins, tailed from the table)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.schedule.conftest import Clock, at

from loom.schedule import Monitor, MonitorChange, MonitorStore
from loom.store import SQLiteStore


async def test_subscribers_get_each_change_and_one_failing_does_not_stop_the_others(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "loom.db")
    monitors = MonitorStore(store, clock=Clock(at("2025-01-06T08:00:00")))
    got: list[dict[str, Any]] = []

    def broken(change: MonitorChange) -> None:
        raise RuntimeError("the webhook endpoint is down")

    async def deliver(change: MonitorChange) -> None:
        got.append(json.loads(json.dumps(change.to_dict())))  # a webhook body: plain JSON

    monitors.subscribe(broken)
    stop = monitors.subscribe(deliver)
    await monitors.add(Monitor(id="m", interval=60))
    await monitors.checkin("m", "ok")
    await monitors.checkin("m", "error")
    stop()
    await monitors.checkin("m", "ok")  # unsubscribed: not delivered
    assert [(g["before"], g["after"], g["checkin"]["status"]) for g in got] == [
        ("new", "ok", "ok"),
        ("ok", "failing", "error"),
    ]
    assert got[0]["monitor_id"] == "m" and got[0]["checkin"]["source"] == "client"
    await store.close()


async def test_follow_sees_other_processes_checkins_and_resumes_after_an_id(
    tmp_path: Path,
) -> None:
    clock = Clock(at("2025-01-06T08:00:00"))
    writer = MonitorStore(SQLiteStore(tmp_path / "loom.db"), clock=clock)  # "another process"
    reader = MonitorStore(SQLiteStore(tmp_path / "loom.db"), clock=clock)
    await writer.add(Monitor(id="a", interval=60, margin=10))
    await writer.checkin("a", "ok")
    clock.advance(60 + 10 + 1)
    [missed] = await writer.detect()  # the detector, elsewhere
    stop, caught_up = asyncio.Event(), asyncio.Event()
    seen: list[MonitorChange] = []

    async def consume(after: int) -> None:
        async for change in reader.follow(after=after, every=0.01, stop=stop):
            seen.append(change)
            if len(seen) == 2:
                caught_up.set()
            if len(seen) == 3:
                stop.set()

    task = asyncio.create_task(consume(0))
    await asyncio.wait_for(caught_up.wait(), 5)
    await writer.checkin("a", "error")  # recorded while the reader follows
    await asyncio.wait_for(task, 5)
    assert [(c.before, c.after, c.checkin.source) for c in seen] == [
        ("new", "ok", "client"),
        ("ok", "missed", "system"),
        ("missed", "failing", "client"),
    ]
    assert seen[1].checkin.id == missed.id
    stop.clear()
    resumed: list[MonitorChange] = []
    async for change in reader.follow(after=seen[1].checkin.id, every=0.01, stop=stop):
        resumed.append(change)
        stop.set()
    assert [(c.before, c.after) for c in resumed] == [("missed", "failing")]  # from the table


def test_the_server_has_one_monitor_store_to_subscribe_to(tmp_path: Path) -> None:
    from loom.server.schedule_api import monitors_of

    state: Any = SimpleNamespace(extra={}, runtime=SimpleNamespace(store=SQLiteStore(":memory:")))
    assert monitors_of(state) is monitors_of(state)  # a subscriber added at startup stays
