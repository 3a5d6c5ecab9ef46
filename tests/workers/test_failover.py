"""Failover fenced by the lease token: a stalled worker's job is retried at once elsewhere; when
the stalled worker wakes up its writes are refused and its outcome is dropped, nothing doubles."""

from __future__ import annotations

import asyncio
import collections
import signal
from typing import Any

import pytest

from loom.events import AgentFinish, EventType
from loom.store.postgres import PostgresStore
from loom.workers import enqueue_run, ensure_schema, job_state, make_app

pytestmark = pytest.mark.anyio


async def until(check: Any, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"{what}: not after {within} s")
        await asyncio.sleep(0.1)


async def test_a_stalled_worker_is_fenced_off_and_its_job_finishes_once(fleet: Any) -> None:
    # a lease this long would hold the retry back for a minute: only the takeover lets it go on
    fleet.options["lease-ttl"] = 60
    await ensure_schema(fleet.dsn)
    a = fleet.start()
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    first, second = "", ""

    def began(effect: str) -> Any:
        async def check() -> bool:
            return any(e[:2] == [effect, "begin"] for e in fleet.effects())

        return check

    async with app.open_async():
        job = await enqueue_run(app, "fleet", "s-stop", "hold, gate")
        first, second = f"run_j{job}a1", f"run_j{job}a2"
        status = lambda: app.job_manager.get_job_status_async(job)  # noqa: E731
        await until(began("hold"), 30, "the hold tool started")
        a.send_signal(signal.SIGSTOP)  # alive but silent: no heartbeat, no lease renewal
        fleet.start()
        await until(began("gate"), 30, "the retry went on to the gate tool on another worker")
        record = await job_state(store, job)
        assert record is not None and record["runs"] == [first, second], record

        a.send_signal(signal.SIGCONT)  # the stalled worker wakes while the retry still runs

        async def a_gave_up() -> bool:
            return (await status()).value != "doing" or "was retried on another" in fleet.log(a)

        await until(a_gave_up, 30, "the resumed worker ended its stale attempt")
        assert (await status()).value == "doing"  # its outcome did not overwrite the retry's
        assert await job_state(store, job) == record  # nor did it touch the job's record
        log = fleet.log(a)
        assert "LeaseLost" in log and first in log  # it tried to write; the fence refused it
        assert a.poll() is None  # the worker itself goes on

        (fleet.dir / "gate").touch()

        async def done() -> bool:
            return (await status()).value in ("succeeded", "failed", "aborted")

        await until(done, 30, "the retry finished")
        assert (await status()).value == "succeeded"
    record = await job_state(store, job)
    assert record is not None and (record["status"], record["run_id"]) == ("finished", second)
    assert record["runs"] == [first, second] and record["stop_reason"] == "completed"

    events = await store.load_events("s-stop")
    runs = [e.run_id for e in events]
    assert runs.index(second) > max(i for i, r in enumerate(runs) if r == first)
    finishes = [e for e in events if isinstance(e, AgentFinish)]
    assert [(f.run_id, f.stop_reason) for f in finishes] == [(second, "completed")]
    assert [e.data["content"] for e in events if e.type == EventType.USER_MESSAGE] == ["hold, gate"]
    msgs = await store.load_messages("s-stop")
    calls = {c.id: c.name for m in msgs if m.role == "assistant" for c in m.tool_calls}
    answered = collections.Counter(m.tool_call_id for m in msgs if m.role == "tool")
    assert sorted(calls.values()) == ["gate", "hold"] and set(answered.values()) == {1}
    assert set(answered) == set(calls)
    held = next(m for m in msgs if m.role == "tool" and calls[m.tool_call_id or ""] == "hold")
    assert "interrupt" in held.content.lower()  # at_most_once: the retry did not run it again
    effects = [e[:2] for e in fleet.effects()]
    assert effects.count(["hold", "begin"]) == 1 and effects.count(["gate", "end"]) == 1
    assert await store.open_tool_calls("s-stop") == []
    await store.close()
