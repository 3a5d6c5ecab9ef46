"""A queued run on a real `loom worker` acts for its owner (issue #29): the owner the job names
(``enqueue_run(owner=...)``, what a schedule's ``QueueLauncher`` passes), else the session's
recorded owner (what a server writes when a key makes the thread)."""

from __future__ import annotations

from typing import Any

import pytest

from loom.engine.run_inputs import SESSION_OWNER_NAMESPACE
from loom.store.postgres import PostgresStore
from loom.workers import enqueue_run, ensure_schema, job_state, make_app

pytestmark = pytest.mark.anyio


async def test_a_queued_run_saves_memories_for_its_owner(fleet: Any) -> None:
    from tests.workers.test_workers import wait_status

    await ensure_schema(fleet.dsn)
    store = PostgresStore(fleet.dsn)
    await store.put_value(SESSION_OWNER_NAMESPACE, "thread-b", "bob")  # a server's claim
    fleet.start()
    app = make_app(fleet.dsn)
    async with app.open_async():
        named = await enqueue_run(app, "keeper", "thread-a", "alice has a cat", owner="alice")
        recorded = await enqueue_run(app, "keeper", "thread-b", "bob has a dog")
        for job in (named, recorded):
            assert await wait_status(app, job, {"succeeded", "failed"}, 30) == "succeeded"
            record = await job_state(store, job)
            assert record is not None and record["stop_reason"] == "completed", record
    found = await store.search_items(("memories",))
    assert sorted((i.namespace, i.owner, i.value["text"]) for i in found) == [
        (("memories", "alice"), "alice", "alice has a cat"),
        (("memories", "bob"), "bob", "bob has a dog"),
    ]
    await store.close()
