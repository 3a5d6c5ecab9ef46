"""The poller: misfire and overlap policies, crashes between claim and start, many pollers."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.schedule.conftest import Rig, at

from loom.schedule import Schedule, ScheduleStore
from loom.store import SQLiteStore

HERE = Path(__file__).parent
SRC = str(HERE.parents[1] / "src")


async def settle(rig: Rig) -> None:
    """Poll and wait until nothing of this process is claimed, queued or running."""
    for _ in range(50):
        await rig.scheduler.poll()
        await rig.scheduler.drain()
        left = await rig.schedules.schedule_runs(status=("claimed", "queued", "running"))
        if not left:
            return
    raise AssertionError(f"runs left: {left}")


async def test_on_time_tick_fires_once_and_runs_the_agent(rig: Rig) -> None:
    state = await rig.schedules.add(
        Schedule(agent="echo", message="hi", cron="*/10 * * * *", id="ten")
    )
    assert state.next_fire_at == at("2025-01-06T08:10:00")
    assert (await rig.scheduler.poll()).claimed == 0  # not due yet
    rig.clock.now = at("2025-01-06T08:10:05")
    report = await rig.scheduler.poll()
    assert report.claimed == report.started == 1
    assert (await rig.scheduler.poll()).claimed == 0  # the same tick again: nothing
    await rig.scheduler.drain()
    [run] = await rig.runs("ten")
    assert (run.status, run.tick) == ("finished", at("2025-01-06T08:10:00"))
    records = await rig.store.list_runs(run.session_id)
    assert {r.run_id for r in records} == {run.run_id}
    assert (await rig.schedules.get("ten")).next_fire_at == at("2025-01-06T08:20:00")


@pytest.mark.parametrize(
    ("misfire", "catch_up", "fired"),
    [("skip", 1, []), ("run_once", 1, ["10:10"]), ("catch_up", 3, ["09:50", "10:00", "10:10"])],
)
async def test_misfire_policies_after_two_hours_down(
    rig: Rig, misfire: str, catch_up: int, fired: list[str]
) -> None:
    await rig.schedules.add(
        Schedule(
            agent="echo",
            message="hi",
            cron="*/10 * * * *",
            id="s",
            misfire=misfire,
            catch_up=catch_up,
        )
    )  # type: ignore[arg-type]
    rig.clock.now = at("2025-01-06T10:15:00")  # down from 08:00: ticks 08:10 … 10:10 are late
    await settle(rig)
    runs = await rig.runs("s")
    assert len(runs) == 13  # every tick has exactly one row
    ran = [r for r in runs if r.status == "finished"]
    assert [time.strftime("%H:%M", time.gmtime(r.tick)) for r in ran] == fired
    assert all(r.status == "missed" for r in runs if r not in ran)
    assert (await rig.schedules.get("s")).next_fire_at == at("2025-01-06T10:20:00")
    if len(ran) > 1:  # catch-up runs go one after another, oldest first
        assert all(a.finished_at <= b.started_at for a, b in itertools.pairwise(ran))  # type: ignore[operator]


async def two_ticks_with_a_slow_run(rig: Rig, overlap: str) -> list[str]:
    await rig.schedules.add(
        Schedule(agent="slow", message="work", interval=60, id="o", overlap=overlap)
    )  # type: ignore[arg-type]
    rig.clock.advance(61)
    await rig.scheduler.poll()
    await rig.gate.wait_started(1)
    rig.clock.advance(60)
    await rig.scheduler.poll()
    return [r.status for r in await rig.runs("o")]


async def test_overlap_skip(rig: Rig) -> None:
    assert await two_ticks_with_a_slow_run(rig, "skip") == ["running", "skipped"]
    rig.gate.release.set()
    await settle(rig)
    assert [r.status for r in await rig.runs("o")] == ["finished", "skipped"]


async def test_overlap_queue(rig: Rig) -> None:
    assert await two_ticks_with_a_slow_run(rig, "queue") == ["running", "queued"]
    rig.gate.release.set()
    await settle(rig)
    first, second = await rig.runs("o")
    assert (first.status, second.status) == ("finished", "finished")
    assert first.finished_at <= second.started_at  # type: ignore[operator]


async def test_overlap_cancel(rig: Rig) -> None:
    statuses = await two_ticks_with_a_slow_run(rig, "cancel")
    assert statuses == ["cancelling", "claimed"]
    await rig.scheduler.drain()  # the first run's task was cancelled
    await rig.scheduler.poll()  # the second starts now that the first ended
    await rig.gate.wait_started(2)
    rig.gate.release.set()
    await settle(rig)
    assert [r.status for r in await rig.runs("o")] == ["cancelled", "finished"]


def poller(store: str, *args: float, fault: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(HERE)]))
    env.pop("LOOM_SCHEDULE_FAULT", None)
    if fault:
        env["LOOM_SCHEDULE_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, str(HERE / "poller.py"), store, *(repr(a) for a in args)], env=env
    )


@pytest.mark.parametrize("fault", ["after_claim", "after_start"])
async def test_crash_between_claim_and_start_loses_and_doubles_nothing(
    tmp_path: Path, fault: str
) -> None:
    db = tmp_path / "loom.db"
    store = SQLiteStore(db)
    t0 = at("2025-01-06T08:00:00")
    schedules = ScheduleStore(store, clock=lambda: t0)
    await schedules.add(Schedule(agent="echo", message="hi", interval=60, id="c"))
    await store.close()
    crashed = poller(str(db), t0 + 61, fault=fault)
    assert crashed.wait(60) == 17  # died at the fault point
    store = SQLiteStore(db)
    schedules = ScheduleStore(store)
    [run] = await schedules.schedule_runs("c")
    assert run.status == ("claimed" if fault == "after_claim" else "running")
    assert poller(str(db), t0 + 62).wait(60) == 0  # a restart finishes the tick
    [run] = await schedules.schedule_runs("c")
    assert run.status == "finished" and run.tick == t0 + 60
    assert {r.run_id for r in await store.list_runs(run.session_id)} == {run.run_id}
    await store.close()


async def test_two_sqlite_processes_fire_each_of_100_ticks_once(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    store = SQLiteStore(db)
    t0 = at("2025-01-06T08:00:00")
    schedules = ScheduleStore(store, clock=lambda: t0)
    await schedules.add(
        Schedule(
            agent="echo",
            message="hi",
            interval=60,
            id="m",
            session="per_run",
            misfire="catch_up",
            catch_up=1000,
            overlap="queue",
        )
    )
    wall0, speed, until = time.time() + 0.5, 1500.0, t0 + 100 * 60 + 1
    procs = [poller(str(db), t0, wall0, speed, until) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    runs = await schedules.schedule_runs("m", limit=0)
    assert sorted(r.tick for r in runs) == [t0 + 60 * i for i in range(1, 101)]
    assert {r.status for r in runs} == {"finished"}
    for r in runs:  # and each tick's session holds exactly that one run
        assert {x.run_id for x in await store.list_runs(r.session_id)} == {r.run_id}
    assert len({r.owner for r in runs}) == 2  # both processes fired some
    await store.close()


async def test_three_postgres_pollers_fire_each_of_100_ticks_once(pg_schema_dsn: str) -> None:
    from loom.store.postgres import PostgresStore

    store = PostgresStore(pg_schema_dsn)
    t0 = at("2025-01-06T08:00:00")
    schedules = ScheduleStore(store, clock=lambda: t0)
    for sid in ("p1",):
        await schedules.add(
            Schedule(
                agent="echo",
                message="hi",
                interval=60,
                id=sid,
                session="per_run",
                misfire="catch_up",
                catch_up=1000,
                overlap="queue",
            )
        )
    wall0, speed, until = time.time() + 1.0, 3000.0, t0 + 100 * 60 + 1
    procs = [poller(pg_schema_dsn, t0, wall0, speed, until) for _ in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    for sid in ("p1",):
        runs = await schedules.schedule_runs(sid, limit=0)
        assert sorted(r.tick for r in runs) == [t0 + 60 * i for i in range(1, 101)]
        assert {r.status for r in runs} == {"finished"}
        for r in runs:
            assert {x.run_id for x in await store.list_runs(r.session_id)} == {r.run_id}
    await store.close()


async def test_a_schedule_naming_an_agent_this_process_lacks_is_paused_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Every tick would fail the same way: the first failed run pauses the schedule and the log
    says why once (no traceback), instead of a failure per tick for ever."""
    from loom.schedule import RuntimeLauncher, Scheduler

    await rig.schedules.add(Schedule(agent="echo", message="hi", interval=60, id="orphan"))
    lacking = Scheduler(
        rig.schedules, RuntimeLauncher(rig.runtime, {}), clock=rig.clock, owner="lacking"
    )
    try:
        for _ in range(3):
            rig.clock.advance(61)
            await lacking.poll()
            await lacking.drain()
    finally:
        await lacking.aclose()
    [run] = await rig.runs("orphan")
    assert run.status == "failed" and "no agent named 'echo'" in (run.error or "")
    assert (await rig.schedules.get("orphan")).schedule.enabled is False
    paused = [r for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused) == 1 and paused[0].exc_info is None
    assert "loom schedule resume orphan" in paused[0].getMessage()


async def test_overlap_queue_backlog_is_bounded(rig: Rig) -> None:
    """A run that hangs: at most QUEUE_LIMIT ticks wait behind it, later ones are skipped."""
    from loom.schedule.scheduler import QUEUE_LIMIT

    await rig.schedules.add(
        Schedule(agent="slow", message="work", interval=60, id="q", overlap="queue")
    )  # type: ignore[arg-type]
    rig.clock.advance(61)
    await rig.scheduler.poll()
    await rig.gate.wait_started(1)
    for _ in range(QUEUE_LIMIT + 3):
        rig.clock.advance(60)
        await rig.scheduler.poll()
    statuses = [r.status for r in await rig.runs("q")]
    assert statuses.count("running") == 1
    assert statuses.count("queued") == QUEUE_LIMIT
    assert statuses.count("skipped") == 3
