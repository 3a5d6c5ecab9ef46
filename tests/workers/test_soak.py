"""Soak (issue 14's size): 3 worker processes, 200 queued runs over 50 sessions, tools of every
effect class, a random worker SIGKILLed at every twelfth of the runs done (and every 1.5-3 s)
and replaced. At the end every run
finished exactly once, no session ever had two runs at once (from the journal), no
at_most_once call ran twice, and every tool call has a result."""

from __future__ import annotations

import asyncio
import collections
import random
import signal
from typing import Any

import pytest

from loom.events import AgentFinish, EventType
from loom.store.postgres import PostgresStore
from loom.workers import enqueue_run, ensure_schema, job_state, make_app

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SESSIONS, RUNS, WORKERS = 50, 200, 3
KILL_FOR = 100  # seconds of killing; then the fleet drains what is left


async def test_soak_kill_9_workers(fleet: Any) -> None:
    fleet.env["LOOM_FLEET_FAST"] = "1"  # the model and tools answer at once: runs, not waits
    fleet.options["concurrency"] = 4
    await ensure_schema(fleet.dsn)
    for _ in range(WORKERS):
        fleet.start()
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    rng = random.Random(14)
    kills = 0
    async with app.open_async():
        jobs: dict[int, tuple[str, str]] = {}
        for i in range(RUNS):
            sid, msg = f"soak-{i % SESSIONS}", f"message {i}"
            jobs[await enqueue_run(app, "fleet", sid, msg)] = (sid, msg)
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + 170
        pending = set(jobs)
        next_kill = start + 1.5
        # kills are also tied to progress, not only to the clock: on a quiet machine the fleet
        # finishes the 200 runs in a few seconds, before more than a timed kill or two
        at_done = [RUNS * k // 12 for k in range(1, 11)]  # a kill every twelfth of the runs
        while pending and loop.time() < end:
            await asyncio.sleep(0.25)
            for job in list(pending):
                status = (await app.job_manager.get_job_status_async(job)).value
                if status in ("succeeded", "failed", "aborted", "cancelled"):
                    pending.discard(job)
            due = bool(at_done) and RUNS - len(pending) >= at_done[0]
            if due:
                at_done.pop(0)
            if due or (loop.time() >= next_kill and loop.time() < start + KILL_FOR):
                alive = fleet.alive()
                if alive:
                    rng.choice(alive).send_signal(signal.SIGKILL)
                    kills += 1
                fleet.start()
                next_kill = loop.time() + rng.uniform(1.5, 3.0)
            while len(fleet.alive()) < WORKERS:
                fleet.start()
        took = loop.time() - start
        assert not pending, f"{len(pending)} jobs not done after {took:.0f} s"
        statuses = collections.Counter(
            [(await app.job_manager.get_job_status_async(j)).value for j in jobs]
        )
    assert statuses == {"succeeded": RUNS}, statuses
    assert kills >= 10, kills

    retried = 0
    for job, (sid, _msg) in jobs.items():
        record = await job_state(store, job)
        assert record is not None and record["status"] == "finished", (job, record)
        assert record["stop_reason"] == "completed", (job, record)
        retried += len(record["runs"]) > 1
        finishes = [
            e
            for r in record["runs"]
            for e in await store.load_events(sid, r)
            if isinstance(e, AgentFinish)
        ]
        assert len(finishes) == 1, (job, record)  # finished exactly once
    assert retried >= 1, "no run was ever retried: the kills missed everything"

    for s in range(SESSIONS):
        sid = f"soak-{s}"
        events = await store.load_events(sid)
        # each message entered the transcript once: a retry never re-sent it
        sent = collections.Counter(
            e.data["content"] for e in events if e.type == EventType.USER_MESSAGE
        )
        assert sorted(sent) == sorted(m for sid2, m in jobs.values() if sid2 == sid)
        assert set(sent.values()) == {1}, sent
        # no two runs at once: once another run wrote, an earlier run never wrote again
        order: list[str] = []
        for e in events:
            if not order or order[-1] != e.run_id:
                assert e.run_id not in order, f"{sid}: run {e.run_id} interleaved with another"
                order.append(e.run_id)
        # every tool call has exactly one result
        msgs = await store.load_messages(sid)
        calls = [c.id for m in msgs if m.role == "assistant" for c in m.tool_calls]
        answered = collections.Counter(m.tool_call_id for m in msgs if m.role == "tool")
        assert len(calls) == len(set(calls)) and all(answered[c] == 1 for c in calls)
        assert set(answered) == set(calls)
        assert await store.open_tool_calls(sid) == []

    effects = fleet.effects()
    once = collections.Counter(
        key for effect, phase, key, _ in effects if effect == "at_most_once" and phase == "begin"
    )
    assert once and max(once.values()) == 1, [k for k, n in once.items() if n > 1]
    print(
        f"soak: {took:.0f} s, {kills} kills, {retried} of {RUNS} runs retried, "
        f"{sum(1 for e in effects if e[1] == 'begin')} tool starts"
    )
    await store.close()
