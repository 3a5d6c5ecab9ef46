"""Cron monitors (missed, timeout, health, subscribers) and background jobs' retry policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.schedule.conftest import Rig

from loom.errors import JobFailed, MonitorNotFound, ScheduleError
from loom.schedule import Job, JobRunner, Monitor, MonitorChange, Schedule
from loom.schedule.jobs import builtin_jobs, job_schedule


async def test_external_monitor_missed_within_one_detector_period(rig: Rig) -> None:
    changes: list[MonitorChange] = []
    rig.monitors.subscribe(changes.append)
    await rig.monitors.add(Monitor(id="backup", interval=3600, margin=300))
    first = (await rig.monitors.get("backup")).next_expected_at
    assert first is not None
    await rig.monitors.checkin("backup", "ok")
    assert (await rig.monitors.get("backup")).health == "ok"
    expected = (await rig.monitors.get("backup")).next_expected_at
    assert expected is not None
    rig.clock.now = expected + 299  # inside the margin: nothing
    assert await rig.monitors.detect() == []
    rig.clock.now = expected + 300 + 60  # one detector period (60 s) past expected + margin
    [missed] = await rig.monitors.detect()
    assert (missed.status, missed.source, missed.expected_at) == ("missed", "system", expected)
    assert await rig.monitors.detect() == []  # written once
    assert (await rig.monitors.get("backup")).health == "missed"
    assert [(c.before, c.after) for c in changes] == [("new", "ok"), ("ok", "missed")]
    await rig.monitors.checkin("backup", "error")
    assert (await rig.monitors.get("backup")).health == "failing"


async def test_timeout_checkin_cancels_the_schedules_run(rig: Rig) -> None:
    await rig.schedules.add(Schedule(agent="slow", message="w", interval=600, id="long"))
    await rig.monitors.add(Monitor(id="long-mon", schedule_id="long", max_runtime=120))
    rig.clock.advance(601)
    await rig.scheduler.poll()
    await rig.gate.wait_started(1)
    state = await rig.monitors.get("long-mon")
    assert state.in_progress_since == rig.clock.now  # the scheduler checked in
    rig.clock.advance(119)
    assert await rig.monitors.detect() == []
    rig.clock.advance(60)  # past max_runtime, within one detector period
    [timeout] = await rig.monitors.detect()
    assert timeout.status == "timeout"
    assert (await rig.monitors.get("long-mon")).health == "timed_out"
    await rig.scheduler.poll()  # the run's owner stops it
    await rig.scheduler.drain()
    [run] = await rig.runs("long")
    assert run.status == "cancelled"


async def test_a_late_ok_past_max_runtime_is_a_timeout(rig: Rig) -> None:
    """The detector did not pass in time: an ``ok`` that arrives after max_runtime still
    leaves the monitor timed out; one within it is ok."""
    await rig.monitors.add(Monitor(id="job", cron="0 * * * *", max_runtime=120))
    await rig.monitors.checkin("job", "in_progress")
    rig.clock.advance(100)
    await rig.monitors.checkin("job", "ok")
    assert (await rig.monitors.get("job")).health == "ok"
    await rig.monitors.checkin("job", "in_progress")
    rig.clock.advance(121)
    late = await rig.monitors.checkin("job", "ok")
    assert late.status == "ok" and late.health == "timed_out"
    assert (await rig.monitors.get("job")).health == "timed_out"


async def test_bad_monitor_input(rig: Rig) -> None:
    with pytest.raises(MonitorNotFound, match="nope"):
        await rig.monitors.checkin("nope", "ok")
    await rig.monitors.add(Monitor(id="m", cron="0 * * * *"))
    with pytest.raises(ScheduleError) as err:
        await rig.monitors.checkin("m", "fine")
    assert err.value.field == "status"
    with pytest.raises(ScheduleError) as err:
        await rig.monitors.add(Monitor(id="x", schedule_id="ghost"))
    assert err.value.field == "schedule_id"
    with pytest.raises(ScheduleError) as err:
        await rig.monitors.add(Monitor(id="y", cron="0 * * * *", timezone="Nowhere/Land"))
    assert err.value.field == "timezone"


async def test_job_retry_backs_off_exponentially_then_gives_up() -> None:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("db away")

    runner = JobRunner({}, attempts=3, base_delay=5, sleep=sleep)
    out = await runner.call(Job("flaky", 60, flaky))
    assert (calls, slept, out.attempts) == (3, [5, 10], 3)
    assert out.error == "ConnectionError: db away"

    calls = 0

    async def twice() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise JobFailed("busy", retryable=True)
        return "ok"

    slept.clear()
    out = await runner.call(Job("twice", 60, twice))
    assert (out.error, out.attempts, slept) == (None, 3, [5, 10])

    async def fatal() -> None:
        raise JobFailed("bad config", retryable=False)

    slept.clear()
    out = await runner.call(Job("fatal", 60, fatal))
    assert (out.attempts, slept, out.error) == (1, [], "fatal: bad config")


async def test_cleanup_job_runs_on_its_tick_and_is_recorded(rig: Rig) -> None:
    from datetime import UTC, datetime

    from loom.store.base import StoredError

    old = datetime.fromtimestamp(rig.clock.now - 40 * 86400, UTC)
    await rig.store.save_error(StoredError("", "s", "tool", {"e": "boom"}, "boom", timestamp=old))
    jobs = {j.name: j for j in builtin_jobs(rig.store, rig.schedules, rig.monitors)}
    for job in jobs.values():
        await rig.schedules.ensure(job_schedule(job))
        await rig.schedules.ensure(job_schedule(job))  # at every start: no duplicate
    rig.scheduler.jobs = JobRunner(jobs)
    rig.clock.advance(1800)
    await rig.scheduler.poll()
    await rig.scheduler.drain()
    [run] = await rig.schedules.schedule_runs("job:cleanup")
    assert (run.status, run.attempts) == ("finished", 1)
    assert await rig.store.list_errors(limit=0) == []
    detector = await rig.schedules.schedule_runs("job:monitors", limit=0)
    # every minute for 30 minutes: one run (misfire run_once), the 29 late ticks recorded missed
    assert sorted(r.status for r in detector) == ["finished"] + ["missed"] * 29
    assert [s.schedule.id for s in await rig.schedules.list_schedules()] == []  # jobs hidden
    assert len(await rig.schedules.list_schedules(jobs=True)) == len(jobs)


async def test_the_sessions_job_keeps_a_source_while_its_forks_live(rig: Rig) -> None:
    """A session other sessions were forked from is not deleted (they share its rows); the
    job deletes the rest and goes on instead of failing."""
    from loom.messages import Message
    from loom.schedule.jobs import MaintenanceSettings

    await rig.store.append("source", messages=[Message.user("a"), Message.user("b")])
    await rig.store.append("alone", messages=[Message.user("c")])
    await rig.store.fork("source", "fork", 1, 0, messages=[], events=[])
    await rig.store.append("source", messages=[Message.user("d")])  # listed first: newest
    everything = MaintenanceSettings(session_ttl=-(10**9))  # every session is old
    jobs = {j.name: j for j in builtin_jobs(rig.store, rig.schedules, rig.monitors, everything)}
    assert (await jobs["sessions"].run())["sessions"] == 2  # the fork and the lone one
    assert [i.id for i in await rig.store.list_sessions(limit=0)] == ["source"]
    assert (await jobs["sessions"].run())["sessions"] == 1  # its fork is gone now
    assert [i.id for i in await rig.store.list_sessions(limit=0)] == []


async def test_the_sessions_job_removes_a_deleted_sessions_sandbox_snapshots(
    rig: Rig, tmp_path: Path
) -> None:
    """A session the TTL deletes takes its workspace snapshots with it (beside the store file,
    where a runtime on this store keeps them); a kept session keeps its own."""
    from loom.messages import Message
    from loom.sandbox.snapshots import WorkspaceSnapshots
    from loom.schedule.jobs import MaintenanceSettings

    await rig.store.append("source", messages=[Message.user("a")])
    await rig.store.append("alone", messages=[Message.user("b")])
    await rig.store.fork("source", "fork", 1, 0, messages=[], events=[])
    await rig.store.append("source", messages=[Message.user("c")])  # listed first: newest
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("private")
    snaps = WorkspaceSnapshots(Path(rig.store.path + ".sandboxes") / "snapshots")
    for sid in ("source", "alone"):
        snaps.take(sid, workspace)
    everything = MaintenanceSettings(session_ttl=-(10**9))
    jobs = {j.name: j for j in builtin_jobs(rig.store, rig.schedules, rig.monitors, everything)}
    assert (await jobs["sessions"].run())["sessions"] == 2  # "alone" and the fork
    assert snaps.records("alone") == []
    assert len(snaps.records("source")) == 1  # kept while its fork lived: so are its files


async def test_the_items_job_purges_expired_items_by_the_schedulers_clock(rig: Rig) -> None:
    """Expired memory items are deleted by the ``items`` job at the time its clock says (an
    injected clock: no waiting for the ttl to run out)."""
    brief = await rig.store.put_item(("m",), "brief", {"text": "gone soon"}, ttl=60)
    await rig.store.put_item(("m",), "kept", {"text": "stays"})
    assert brief.expires_at is not None
    jobs = {j.name: j for j in builtin_jobs(rig.store, rig.schedules, rig.monitors)}
    assert jobs["items"].every == 3600
    rig.clock.now = brief.expires_at.timestamp() - 1  # not yet expired by the job's clock
    assert await jobs["items"].run() == {"items": 0}
    rig.clock.now = brief.expires_at.timestamp() + 1
    assert await jobs["items"].run() == {"items": 1}
    import sqlite3

    with sqlite3.connect(rig.store.path) as raw:  # the row itself is gone, not only hidden
        assert raw.execute("SELECT count(*) FROM items").fetchone()[0] == 1


async def test_the_items_job_embeds_items_whose_embedding_failed(tmp_path: Path) -> None:
    """A put while the embedder is down keeps the item for keywords only; the ``items`` job
    embeds it once the embedder is back (and reports 0 while it is still down)."""
    from loom.embedding import HashEmbedder
    from loom.schedule.monitors import MonitorStore
    from loom.schedule.storage import ScheduleStore
    from loom.store import SQLiteStore

    embedder = HashEmbedder(32)
    store = SQLiteStore(tmp_path / "v.db", embedder=embedder)
    try:
        embedder.down = True
        await store.put_item(("m",), "k", {"text": "apples and pears"})
        jobs = {j.name: j for j in builtin_jobs(store, ScheduleStore(store), MonitorStore(store))}
        assert await jobs["items"].run() == {"items": 0, "embedded": 0}
        assert [i.key for i in await store.search_items(("m",), query="apples")] == ["k"]
        embedder.down = False
        report = await jobs["items"].run()
        assert report["embedded"] == 1
        found = await store.search_items(("m",), query="apples", mode="semantic")
        assert [i.key for i in found] == ["k"]
    finally:
        await store.close()
