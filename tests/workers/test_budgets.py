"""Two real `loom worker` processes on one PostgreSQL share a daily budget (issue #31): 50
queued runs against a limit of 10 runs' worth of tokens stop at the limit, never past it."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest

from loom.budgets import ledger_for
from loom.store.postgres import PostgresStore
from loom.workers import enqueue_run, ensure_schema, job_state, make_app

pytestmark = [pytest.mark.anyio]

RUNS, PER_RUN, LIMIT = 50, 200, 2000  # tokens: each run uses 200; the day allows 10 runs


async def test_two_workers_share_a_daily_budget(fleet: Any) -> None:
    fleet.env["LOOM_BUDGETS"] = json.dumps(
        [{"scope": "global", "window": "day", "max_tokens": LIMIT}]
    )
    await ensure_schema(fleet.dsn)
    for _ in range(2):
        fleet.start(
            *("-m", "loom", "worker", "--store", fleet.dsn, "--app", "budget_app:agents"),
            *("--concurrency", "5", "--lease-ttl", "5", "--heartbeat", "0.5"),
        )
    app = make_app(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    async with app.open_async():
        jobs = [await enqueue_run(app, "spender", f"b{i}", "spend") for i in range(RUNS)]
        loop = asyncio.get_running_loop()
        end = loop.time() + 120
        pending = set(jobs)
        while pending and loop.time() < end:
            await asyncio.sleep(0.25)
            for job in list(pending):
                status = (await app.job_manager.get_job_status_async(job)).value
                if status in ("succeeded", "failed", "aborted", "cancelled"):
                    pending.discard(job)
        assert not pending, [fleet.log(p)[-2000:] for p in fleet.procs]
    stops: collections.Counter[str] = collections.Counter()
    for job in jobs:
        record = await job_state(store, job)
        assert record is not None, job
        stops[record["stop_reason"]] += 1
        if record["stop_reason"] == "budget":
            assert "global budget" in record["error"] and "2000 tokens" in record["error"]
    (row,) = await ledger_for(store).spend()
    await store.close()
    # never past the limit; every completed run counted exactly once; reservations all settled
    assert row.spent_tokens <= LIMIT
    assert row.spent_tokens == PER_RUN * stops["completed"]
    assert row.reserved_tokens == 0
    # at the limit, give or take the calls in flight when it was reached (one per slot)
    assert stops["completed"] >= LIMIT // PER_RUN - 2, stops
    assert stops["budget"] == RUNS - stops["completed"], stops
    assert len(fleet.alive()) == 2  # neither worker died on the way
    print(f"{RUNS} runs on 2 workers: {dict(stops)}, {row.spent_tokens} of {LIMIT} tokens")
