"""Queued runs on real `loom worker` processes: a run, a cross-process abort, a crash loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loom.events import AgentFinish, EventType
from loom.store.postgres import PostgresStore
from loom.workers import abort_run, enqueue_run, ensure_schema, job_state, make_app

pytestmark = pytest.mark.anyio


async def wait_status(app: Any, job_id: int, want: set[str], within: float) -> str:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while True:
        status = (await app.job_manager.get_job_status_async(job_id)).value
        if status in want:
            return str(status)
        if loop.time() > end:
            raise AssertionError(f"job {job_id} is {status!r} after {within} s, not {want}")
        await asyncio.sleep(0.2)


async def test_a_queued_run_runs_on_a_worker(fleet: Any) -> None:
    await ensure_schema(fleet.dsn)
    fleet.start()
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    async with app.open_async():
        job = await enqueue_run(app, "fleet", "s1", "hello")
        assert await wait_status(app, job, {"succeeded", "failed"}, 30) == "succeeded"
    record = await job_state(store, job)
    assert record is not None and record["status"] == "finished"
    assert record["stop_reason"] == "completed" and record["runs"] == [f"run_j{job}a1"]
    msgs = await store.load_messages("s1")
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert sorted(e[0] for e in fleet.effects() if e[1] == "end") == [
        "at_most_once",
        "idempotent",
        "pure",
    ]
    await store.close()


async def test_abort_from_another_process_cancels_the_turn(fleet: Any) -> None:
    await ensure_schema(fleet.dsn)
    fleet.start()
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    async with app.open_async():
        job = await enqueue_run(app, "fleet", "s-abort", "slow please")
        for _ in range(150):  # the tool is running on the worker
            if any(e[:2] == ["slow", "begin"] for e in fleet.effects()):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the slow tool never started")
        assert await abort_run(app, job)
        assert await wait_status(app, job, {"aborted", "failed", "succeeded"}, 20) == "aborted"
    events = await store.load_events("s-abort")
    finish = [e for e in events if isinstance(e, AgentFinish)]
    assert len(finish) == 1 and finish[0].stop_reason == "cancelled"
    assert finish[0].error == f"aborted through the queue (job {job})"
    results = [e for e in events if e.type in (EventType.TOOL_RESULT, EventType.TOOL_ERROR)]
    assert len(results) == 1 and "interrupt" in str(results[0].data).lower()
    assert not any(e[:2] == ["slow", "end"] for e in fleet.effects())
    assert await store.open_tool_calls("s-abort") == []
    record = await job_state(store, job)
    assert record is not None and record["stop_reason"] == "cancelled"
    await store.close()


async def test_a_crash_loop_stops_after_max_attempts(fleet: Any) -> None:
    fleet.options["max-attempts"] = 2
    await ensure_schema(fleet.dsn)
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    async with app.open_async():
        job = await enqueue_run(app, "fleet", "s-crash", "crash now")
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        status = "todo"
        while loop.time() < end:  # keep one worker alive: each dies on the job
            if not fleet.alive():
                fleet.start()
            status = (await app.job_manager.get_job_status_async(job)).value
            if status in ("failed", "succeeded"):
                break
            await asyncio.sleep(0.3)
        assert status == "failed"
    crashes = [e for e in fleet.effects() if e[0] == "crash"]
    assert len(crashes) == 2  # the first run and one recovery re-run, then no more
    record = await job_state(store, job)
    assert record is not None and record["status"] == "failed"
    assert "max_attempts=2" in record["error"]
    await store.close()
